"""posbias's example plugin: each file below is one registration, in the shape a third party writes it."""

from . import (  # noqa: F401 (they register)
    backend,
    dialect,
    engine,
    method_decide,
    method_model,
    method_read,
    method_rearrange,
    model,
    task,
)
