"""A scoring engine: greedy generation under another name (a subclass of the built-in, registered in one line)."""

from posbias.measure import register_engine
from posbias.scoring.engines import Generate


@register_engine
class PluginGenerate(Generate):
    name = "generate-plugin"
