"""Attention Buckets' base list by task: plain `buckets` resolves (Method.for_task) to the original RAG list on
tasks whose items are documents and to the ToolBench list on the others, and sweeps / compare / grid record the
resolved list; `buckets:rag`, `buckets:tool` and explicit bases pass through. Tiny Llama, char tokenizer."""

import json

import pytest

from posbias import GridConfig, SweepConfig, get_task, run_compare, run_grid, run_sweep
from posbias.errors import PosbiasError
from posbias.methods import get_method
from posbias.models.buckets import RAG_BASES, TOOLBENCH_BASES

pytestmark = pytest.mark.usefixtures("one_thread")

RAG = {"name": "buckets", "list": "rag", "reference_bases": list(RAG_BASES), "reference_theta": 10000.0}
TOOL = {"name": "buckets", "list": "tool", "reference_bases": list(TOOLBENCH_BASES), "reference_theta": 10000.0}


def _docs_file(tmp_path, hops: bool = False):
    """An nq-shaped jsonl file (or, hops=True, a two-hop one): 4 questions over 3 short documents."""
    p = tmp_path / ("hops.jsonl" if hops else "docs.jsonl")
    recs = [{"id": f"q{i}", "question": f"who is {i}?", "answers": [f"A{i}"], "gold": [0, 1] if hops else 0,
             "documents": [f"A{i} is here.", "Noise one.", "Noise two."]} for i in range(4)]
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return f"jsonl:{p}"


def test_for_task_picks_the_list_by_the_kind_of_items(tmp_path):
    docs, hops = get_task(_docs_file(tmp_path)), get_task(_docs_file(tmp_path, hops=True))
    for task, want in [(docs, RAG), (hops, RAG), (get_task("kv-lookup"), TOOL), (get_task("kv-2hop"), TOOL)]:
        resolved = get_method("buckets").for_task(task)
        assert resolved.config() == want and resolved.key == "buckets"  # the entry keeps its spec
        assert resolved.for_task(get_task("kv-lookup")) is resolved  # resolved once, then fixed
    for spec, want in [("buckets:rag", RAG), ("buckets:tool", TOOL)]:
        assert get_method(spec).for_task(docs).config() == want == get_method(spec).for_task(get_task("kv-lookup")).config()
    explicit = get_method("buckets:10000,30000")
    assert explicit.for_task(docs) is explicit and explicit.config() == {"name": "buckets", "bases": [10000.0, 30000.0]}
    assert get_method("buckets:rag").label == "buckets:rag" and get_method(get_method("buckets:tool").label).bases == "tool"
    with pytest.raises(PosbiasError, match="bad bucket bases"):
        get_method("buckets:wiki")


def _cfg(model_dir, task, **kw):
    base = dict(model=str(model_dir), task=task, n=2, dtype="fp32", max_batch=8, engine="teacher-forced")
    return SweepConfig(**{**base, **kw})


def test_sweep_records_the_resolved_list_and_runs_it(model_dir, loaded, tmp_path):
    docs = _docs_file(tmp_path)
    res = run_sweep(_cfg(model_dir, docs, method="buckets"), tmp_path / "d", loaded=loaded, progress=False)
    assert res.record["method"] == RAG
    assert json.loads((tmp_path / "d" / "sweep.json").read_text())["method"] == RAG
    assert json.loads((tmp_path / "d" / "run.json").read_text())["fingerprint"]["method"] == RAG
    rag = run_sweep(_cfg(model_dir, docs, method="buckets:rag"), None, loaded=loaded, progress=False)
    tool = run_sweep(_cfg(model_dir, docs, method="buckets:tool"), None, loaded=loaded, progress=False)
    lp = lambda r: [x["logprob"] for x in r.rows]  # noqa: E731
    assert lp(res) == lp(rag) and lp(res) != lp(tool)  # plain buckets ran the RAG list
    kv = run_sweep(_cfg(model_dir, "kv-lookup", task_options={"facts": 4, "digits": 3}, positions="0,3",
                        method="buckets"), tmp_path / "k", loaded=loaded, progress=False)
    assert kv.record["method"] == TOOL


def test_compare_records_each_entry_resolved(model_dir, loaded, tmp_path):
    methods = ["none", "buckets", "buckets:tool", "buckets:10000,30000"]
    rec = run_compare(_cfg(model_dir, _docs_file(tmp_path)), methods, tmp_path / "c", loaded=loaded, progress=False).record
    got = {m["method"]: m["method_config"] for m in rec["methods"]}
    assert got["buckets"] == RAG and got["buckets:tool"] == TOOL
    assert got["buckets:10000,30000"] == {"name": "buckets", "bases": [10000.0, 30000.0]}
    assert "by task" not in (tmp_path / "c" / "buckets" / "run.json").read_text()


def test_grid_records_the_resolved_list(model_dir, loaded, tmp_path):
    cfg = GridConfig(model=str(model_dir), task="kv-lookup", task_options={"digits": 3}, sizes="3,4", depths="0%,100%",
                     n=2, dtype="fp32", method="buckets")
    rec = run_grid(cfg, tmp_path / "g", loaded=loaded, progress=False).record
    assert rec["method"] == TOOL
    assert json.loads((tmp_path / "g" / "size-3" / "sweep.json").read_text())["method"] == TOOL
