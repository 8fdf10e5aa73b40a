"""LlamaIndex: `PolicyNodePostprocessor(policy)` places retrieved nodes by a measured slot policy.

    engine = index.as_query_engine(similarity_top_k=10,
                                   node_postprocessors=[PolicyNodePostprocessor("runs/kv10/policy.json")])

The nodes are sorted by score, highest first (nodes without a score after the scored ones, in the retriever's order),
then the r-th goes into the r-th best-read slot (posbias.policy.apply_ranking). Another number of nodes than the
policy's slot count is refused unless `resample=True`, which maps the curve to them by relative depth
(posbias.policy.resampled_ranking; docs/rag.md says what that assumes).
"""

from __future__ import annotations

from typing import Any, List, Optional

from ..errors import PosbiasError
from ..policy import apply_ranking, as_policy, ranking_for

try:
    from llama_index.core.bridge.pydantic import Field, field_validator
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import NodeWithScore, QueryBundle
except ImportError as e:  # the framework is not installed
    raise PosbiasError(f"posbias.integrations.llama_index needs llama-index-core ({e})",
                       "install posbias[rag] (pip install 'posbias[rag]')") from None


class PolicyNodePostprocessor(BaseNodePostprocessor):
    """Nodes by score (best first) -> the order the policy places them in, slot 0 first.

    policy: a policy file (`posbias policy export RUN`), a finished sweep folder or its sweep.json, or a policy dict
    (a path is read with read_policy when the postprocessor is built).
    resample: with a number of nodes other than the policy's slot count, map the curve to them by relative depth
    (default: refuse, in one line).
    """

    policy: dict = Field(description="the slot policy (posbias.policy), read from a path or given as a dict")
    resample: bool = Field(default=False, description="map the curve to another number of nodes by relative depth")

    def __init__(self, policy: Any, **kwargs: Any):
        super().__init__(policy=policy, **kwargs)

    @field_validator("policy", mode="before")
    @classmethod
    def _read(cls, value: Any) -> dict:
        return as_policy(value)

    @classmethod
    def class_name(cls) -> str:
        return "PolicyNodePostprocessor"

    def _postprocess_nodes(self, nodes: List[NodeWithScore],
                           query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        """The nodes sorted by score (stable; unscored ones after, in their order), then placed by the policy."""
        best_first = sorted(nodes, key=lambda n: (n.score is None, -(n.score or 0.0)))
        return apply_ranking(best_first, ranking_for(self.policy, len(best_first), self.resample, "nodes"))
