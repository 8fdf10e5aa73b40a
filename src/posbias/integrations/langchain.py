"""LangChain: `PolicyReorder(policy)` places a retriever's documents (best first) by a measured slot policy.

    reorder = PolicyReorder("runs/kv10/policy.json")      # or a finished sweep folder, or a dict from read_policy
    docs = reorder.transform_documents(retriever.invoke(question))   # k documents, the policy's slot count

The r-th document the retriever returns goes into the r-th best-read slot (posbias.policy.apply_ranking). Another
number of documents is refused unless `resample=True`, which maps the curve to them by relative depth
(posbias.policy.resampled_ranking; docs/rag.md says what that assumes).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from ..errors import PosbiasError
from ..policy import apply_ranking, as_policy, ranking_for

try:
    from langchain_core.documents import BaseDocumentTransformer, Document
except ImportError as e:  # the framework is not installed
    raise PosbiasError(f"posbias.integrations.langchain needs langchain-core ({e})",
                       "install posbias[rag] (pip install 'posbias[rag]')") from None


class PolicyReorder(BaseDocumentTransformer):
    """Documents in the retriever's order (best first) -> the order the policy places them in, slot 0 first.

    policy: a policy file (`posbias policy export RUN`), a finished sweep folder or its sweep.json, or a policy dict.
    resample: with a number of documents other than the policy's slot count, map the curve to them by relative depth
    (default: refuse, in one line).
    """

    def __init__(self, policy: str | os.PathLike | dict, resample: bool = False):
        self.policy = as_policy(policy)
        self.resample = resample

    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> list[Document]:
        """The documents placed by the policy: the r-th of `documents` into the r-th best-read slot."""
        docs = list(documents)
        return apply_ranking(docs, ranking_for(self.policy, len(docs), self.resample))

    async def atransform_documents(self, documents: Sequence[Document], **kwargs: Any) -> list[Document]:
        """As transform_documents (a reordering: nothing to wait for)."""
        return self.transform_documents(documents, **kwargs)
