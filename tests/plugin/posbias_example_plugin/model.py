"""A model name: SmolLM2-135M-Instruct under another name (registered in one line, finding the files the built-in
name finds: a plugin's own name would point at its package's folder or a cache)."""

from posbias import MODELS
from posbias.measure import register_model

register_model("smollm2-plugin", MODELS["smollm2-135m"].locate,
               "SmolLM2-135M-Instruct under another name (the example plugin's model name)")
