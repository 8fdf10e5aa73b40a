"""Slot policies applied in other frameworks' RAG pipelines (docs/rag.md): the retriever's best item into the slot where
the model reads best (a policy from `posbias policy export RUN`, posbias/policy.py), its second into the second best.

- `posbias.integrations.langchain.PolicyReorder`: a LangChain document transformer;
- `posbias.integrations.llama_index.PolicyNodePostprocessor`: a LlamaIndex node postprocessor.

Each module imports its framework when it is imported (install posbias[rag]); this package imports nothing.
"""
