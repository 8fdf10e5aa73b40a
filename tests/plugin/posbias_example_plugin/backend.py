"""A backend: transformers in process under another name (a subclass of the built-in, registered in one line)."""

from posbias.measure import register_backend
from posbias.backends.hf import HFBackend


@register_backend
class PluginHF(HFBackend):
    name = "hf-plugin"
    description = "transformers in process (the example plugin's backend: the hf backend under another name)"
