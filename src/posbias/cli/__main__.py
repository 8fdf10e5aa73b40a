"""`python -m posbias.cli ...` (and `accelerate launch -m posbias.cli ...`)."""

from . import main

main()
