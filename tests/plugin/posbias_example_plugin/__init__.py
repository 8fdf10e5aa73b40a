"""posbias's example plugin: each file below is one registration, in the shape a third party writes it."""

from . import backend, method_decide, method_model, method_read, method_rearrange, task  # noqa: F401 (they register)
