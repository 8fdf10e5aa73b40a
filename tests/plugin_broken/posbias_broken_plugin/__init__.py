"""A plugin that registers a taken name: posbias names it in one warning and leaves it out."""

from posbias import register_method
from posbias.methods.scaling import UniformScaling


@register_method
class NotPI(UniformScaling):
    """Another method named "pi"."""

    name = "pi"
