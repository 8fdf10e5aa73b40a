"""The one interface every training-free mitigation shares.

A Method is parsed from a spec string (`none`, `pi:1.2`, `lpes:DIR/factors.json`, `mspoe`,
`buckets`, `layers:1,1.1,...`), describes itself as JSON (it enters the sweep fingerprint, so a
resumed sweep cannot silently mix methods) and is applied to a loaded model as a reversible
context manager: inside it the model is mitigated, after it the model is exactly as before.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext

from ..models.load import Loaded


class Method(ABC):
    name: str

    @abstractmethod
    def config(self) -> dict:
        """JSON-able description (name and every parameter)."""

    @abstractmethod
    def apply(self, loaded: Loaded) -> AbstractContextManager:
        """Context manager: the model is mitigated inside, restored exactly on exit."""

    @property
    def label(self) -> str:
        return self.name


class Baseline(Method):
    """The unmodified model."""

    name = "none"

    def config(self) -> dict:
        return {"name": "none"}

    def apply(self, loaded: Loaded) -> AbstractContextManager:
        return nullcontext()
