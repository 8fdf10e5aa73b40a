"""Bad input through the CLI, table-driven, every command (docs/reliability.md).

For every case: exit status 2, exactly one line on stderr (`posbias: error: <problem> -- <fix>`)
naming what to do, no file in a new output folder, and a finished result in an existing folder
byte-for-byte intact. The CLI runs in-process (`posbias.cli.main`), on a tiny saved model.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import socket
import sys
from pathlib import Path

import pytest

import hints
from conftest import save_tiny_llama, skip_if_data_refused
from posbias import SweepConfig, run_compare, run_sweep
from posbias.cli import main
from posbias.distill import DistillConfig, run_distill
from posbias.lpes import run_gain

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--n", "2", "--dtype", "fp32", "--quiet"]
KV = ["--facts", "4", "--digits", "3"]  # put before a case's own options (the last occurrence of an option wins)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A tiny model, finished sweep / comparison / distillation folders, broken data files."""
    root = tmp_path_factory.mktemp("bad-input")
    model = str(save_tiny_llama(root / "model"))
    cfg = SweepConfig(model=model, task_options={"facts": 4, "digits": 3}, positions="0,3", n=2, dtype="fp32")
    run_sweep(cfg, root / "sweep", progress=False)
    run_compare(cfg, ["none", "pi:1.5"], root / "compare", progress=False)
    run_distill(DistillConfig(model=model, task_options={"facts": 4, "digits": 3}, n=1, k=2, correct_only=False,
                              dtype="fp32", max_steps=1, save_steps=1), root / "distill", progress=False)
    (root / "afile").write_text("not a folder")
    run_gain([root / "compare"], root / "gain")
    _corrupt_states(root, model, cfg)
    _policies(root, model, cfg)
    data = root / "data"
    data.mkdir()
    good = {"question": "q", "answers": ["a"], "documents": ["x", "y"], "gold": 0}
    rows = {"ok": [good], "answers5": [good, {**good, "answers": 5}], "docstr": [good, {**good, "documents": "abc"}],
            "goldfloat": [good, {**good, "gold": 1.9}], "noquestion": [{k: v for k, v in good.items() if k != "question"}]}
    for name, recs in rows.items():
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    order = {"one": {"question": "q", "answers": ["a"]}, "dup": {"question": "q", "options": ["a", "b", "a"], "gold": 0},
             "gold": {"question": "q", "options": ["a", "b"], "gold": 2},
             "clash": {"question": "q", "options": ["a", "b"], "gold": 0, "labels": ["A", "A"]}}
    for name, rec in order.items():
        (data / f"order-{name}.jsonl").write_text(json.dumps(rec) + "\n")
    _judge_templates(data)
    (data / "hop1.jsonl").write_text(json.dumps({**good, "gold": [1]}) + "\n")
    (data / "same.jsonl").write_text(json.dumps({**good, "documents": ["x", "x", "x"]}) + "\n")
    (data / "dupgold.jsonl").write_text(json.dumps({**good, "documents": ["x", "y", "x"]}) + "\n")
    _needles(data)
    (data / "latin1.jsonl").write_bytes(json.dumps(good).replace('"q"', '"caf\u00e9"', 1).encode("latin-1") + b"\n")
    (data / "plain.jsonl.gz").write_text(json.dumps(good) + "\n")
    blob = gzip.compress(("\n".join(json.dumps(good) for _ in range(200)) + "\n").encode())
    (data / "cut.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    (root / "factors-overlap.json").write_text(json.dumps({"factors": [1.1, 1.2], "search_split": {
        "task": "kv-lookup", "seed": 0, "skip": 0, "n": 50}}))
    for name, info, split in (("hidden-other", {"name": "other-model", "hidden_size": 64, "n_layers": 2}, None),
                              ("hidden-overlap", {"name": model, "hidden_size": 64, "n_layers": 2},
                               {"task": "kv-lookup", "seed": 0, "skip": 0, "n": 50})):
        (root / name).mkdir()
        (root / name / "hidden.json").write_text(json.dumps({"channel": 3, "scale": 0.0, "layers": [1], "model_info": info,
                                                             "fitted_on": split}))
    return {"ROOT": str(root), "MODEL": model, "DATA": str(data)}


def _judge_templates(data: Path) -> None:
    """Judge files and templates (tasks/judge_template.py), good and bad, and a file that repeats an id."""
    pair = {"question": "q", "answers": ["a", "b"], "preferred": 0}
    (data / "judge.jsonl").write_text("".join(json.dumps({**pair, "id": f"j{i}"}) + "\n" for i in range(2)))
    (data / "judge-ctx.jsonl").write_text(json.dumps({**pair, "context": "a reference"}) + "\n")
    texts = {"plain.txt": "{question} {answer_a} {answer_b}", "kv.txt": "{context} {question} {answer_a} {answer_b}",
             "unknown.txt": "{question} {answer_a} {answer_b} {verdict}", "noanswer.txt": "{question} {answer_a}",
             "brace.txt": "{question} {answer_a} {answer_b} {", "system.json": json.dumps(
                 {"prompt": "{question} {answer_a} {answer_b}", "system": "Be fair."}),
             "samelabels.json": json.dumps({"prompt": "{question} {answer_a} {answer_b}", "labels": ["x", "x"]})}
    for name, text in texts.items():
        (data / f"tpl-{name}").write_text(text)
    (data / "order-dupid.jsonl").write_text("".join(json.dumps({"id": i, "question": "q", "options": ["a", "b"], "gold": 0})
                                                    + "\n" for i in ("q1", "q2", "q1")))


def _policies(root: Path, model: str, cfg: SweepConfig) -> None:
    """A slot policy of the tiny model (posbias/policy.py), and copies with a field of the wrong type."""
    from posbias import get_task

    task = get_task(cfg.task, **cfg.task_options).config()
    ok = {"posbias_policy": 1, "model": model, "task": task, "n_slots": 4, "ranking": [0, 3, 1, 2],
          "slots": [{"slot": s, "accuracy": 0.5, "ci": [0.2, 0.8], "n": 2} for s in range(4)], "measured": {"run": "x"}}
    test = {"name": "Cochran's Q, within-example permutation", "statistic": 1.0, "p": 0.4, "n": 2, "permutations": 99}
    for name, change in (("ok", {}), ("rfloat", {"ranking": [0.0, 3.0, 1.0, 2.0]}), ("rstr", {"ranking": ["0", "3", "1", "2"]}),
                         ("task", {"task": "kv-lookup"}), ("measured", {"measured": "x"}),
                         ("ptest", {"curve": {"position_test": {**test, "p": "high"}}}),
                         ("psep", {"curve": {"position_test": test, "separable": True}})):
        (root / f"policy-{name}.json").write_text(json.dumps({**ok, **change}))


def _corrupt_states(root: Path, model: str, cfg: SweepConfig) -> None:
    """Started runs whose state files a crash or a disk error spoiled."""
    import shutil

    from posbias.lpes import GAConfig, SearchConfig, run_search
    from posbias.synth import one_run_config
    from posbias.synth.experiments import one_run_path

    shutil.copytree(root / "sweep", root / "bad-marker")
    (root / "bad-marker" / "run.json").write_text('{"kind": "swe')
    shutil.copytree(root / "sweep", root / "bad-result")
    (root / "bad-result" / "sweep.json").write_text('{"per_position": [')
    shutil.copytree(root / "sweep", root / "locked")  # a live writer: this test's parent process holds the lock
    (root / "locked" / ".lock").write_text(f"{os.getppid()} {socket.gethostname()}")
    shutil.copytree(root / "sweep", root / "bad-rows")
    (root / "bad-rows" / "sweep.json").unlink()  # a run killed before its end ...
    with (root / "bad-rows" / "examples.jsonl").open("a") as f:  # ... whose row log holds a foreign row
        f.write('{"foo": 1}\n')
    ga = GAConfig(pop_size=4, n_parents=2, n_crossover=1, n_mutation=1, generations=1, n_points=2, y_min=1.0, y_max=1.5,
                  y_step=0.25, y_init=1.25, my=0.25, mx=1)
    run_search(SearchConfig(model=model, task_options={"facts": 4, "digits": 3}, n=2, dtype="fp32", ga=ga),
               root / "bad-state", progress=False)
    (root / "bad-state" / "search.state.json").write_text('{"search": {"kind": "genetic"}}')
    synth = one_run_config(iters=5, eval_seqs=20, data={"n_classes": 64, "n_labels": 8, "burstiness": 2, "n_items": 4,
                                                        "dim": 16})
    (root / "bad-ckpt").mkdir()
    one_run_path(root / "bad-ckpt", synth).with_suffix(".ckpt").write_bytes(b"PK\x03\x04 cut short")


def _needles(data: Path) -> None:
    """niah needle files (tasks/haystack.py): one good line, then lines a user could get wrong; a QA file with a number."""
    sf = {"id": "sf", "needle": "The best thing to do in San Francisco is eat a sandwich.",
          "question": "What is the best thing to do in San Francisco?", "answers": ["eat a sandwich"]}
    for name, bad in (("one", None), ("answers5", {"answers": 5}), ("int", {"answers": [5521]}), ("empty", {"needle": ""})):
        (data / f"needle-{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [sf, bad and {**sf, **bad, "id": "x"}]
                                                            if r))
    (data / "qa-int.jsonl").write_text(json.dumps({"question": "q", "answers": [5521], "documents": ["x", "y"], "gold": 0})
                                       + "\n")


SYNTH_TINY = ["--iters", "5", "--eval-seqs", "20", "--classes", "64", "--labels", "8", "--burstiness", "2", "--items", "4",
              "--dim", "16", "--quiet"]

# (command args with {MODEL} {OUT} {DATA} {ROOT}, the folder OUT names, a text the error must contain)
CASES = [
    # sweep
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "nope"], "new", "unknown task 'nope'"),
    # served models (backends/): refused before any server is contacted, or one line when it cannot be reached
    (["sweep", "--model", "openai:model=m,base_url=http://127.0.0.1:9/v1,tokenizer={MODEL}", *TINY, "--method", "pi:1.1"],
     "new", "method 'pi:1.1' changes the model in process, but backend 'openai' serves the model as it is"),
    (["compare", "--models", "{MODEL},openai:model=m,tokenizer={MODEL}", *TINY, "--methods", "none,pi:1.1"], "new",
     "backend 'openai' serves the model as it is"),
    (["sweep", "--model", "openai:model=m,prompts=chat", *TINY, "--engine", "teacher-forced"], "new",
     "teacher forcing on chat messages scores order tasks only"),
    (["sweep", "--model", "openai:model=m,prompts=tokens", *TINY], "new", "prompts=tokens needs the served model's tokenizer"),
    (["sweep", "--model", "openai:model=m,colour=red", *TINY], "new", "backend 'openai' takes no 'colour'"),
    (["sweep", "--model", "openai:m,notapair", *TINY], "new", "'notapair' in model spec"),
    (["sweep", "--model", "openai:model=m,base_url=http://127.0.0.1:9/v1,tokenizer={MODEL}", *TINY], "new",
     "nothing listens at http://127.0.0.1:9/v1 (connection refused)"),
    # every pipeline that changes or reads the weights opens its model through backends.open_model: a served model
    # is refused by the backend's declared capabilities, naming what the pipeline needs
    (["lpes", "search", "--model", "openai:model=m,tokenizer={MODEL}", "--n", "2", "--quiet"], "new",
     "the LPES search changes or reads the model's weights in process, and backend 'openai' serves the model as it is"),
    (["hidden", "search", "--model", "openai:model=m,tokenizer={MODEL}", "--quiet"], "new",
     "the hidden-channel search changes or reads the model's weights in process, and backend 'openai' serves"),
    (["moice", "train", "--model", "openai:model=m,tokenizer={MODEL}", "--quiet"], "new",
     "MoICE router training changes or reads the model's weights in process, and backend 'openai' serves"),
    (["analyze", "prior", "--model", "openai:model=m,tokenizer={MODEL}", "--quiet"], "new",
     "the positional prior changes or reads the model's weights in process, and backend 'openai' serves"),
    (["analyze", "attention", "--model", "openai:model=m,tokenizer={MODEL}", "--quiet"], "new",
     "the attention analysis changes or reads the model's weights in process, and backend 'openai' serves"),
    # an unknown backend is refused as such, on every command that takes a model spec (backends/spec.py)
    (["sweep", "--model", "nosuch:model=x", *TINY], "new", "unknown backend 'nosuch' in model spec 'nosuch:model=x'"),
    (["compare", "--models", "{MODEL},nosuch:model=x", *TINY], "new", "unknown backend 'nosuch'"),
    (["grid", "--model", "nosuch:model=x", *TINY, "--sizes", "4", "--depths", "0%"], "new", "unknown backend 'nosuch'"),
    # sigmoid depths that round onto one 0.1% slot: the count refused, naming the counts that work (eval/longctx.py)
    (["grid", "--model", "{MODEL}", *TINY, "--task", "niah", "--lengths", "600", "--depths", "sigmoid:86"], "new",
     "--depths sigmoid:86 gives 84 distinct depths, not 86"),
    (["lpes", "search", "--model", "nosuch:model=x", *TINY], "new", "unknown backend 'nosuch'"),
    (["show", "--model", "nosuch:model=x"], "new", "unknown backend 'nosuch'"),
    # show's own hints, followed, are placements show takes (several: each prompt in turn)
    (["show", "--model", "{MODEL}", *KV, "--position", "0:1"], "new", "are pairs of slots (two hops)"),
    (["show", "--model", "{MODEL}", *KV, "--position", ""], "new", "--position is empty"),
    (["show", "--model", "{MODEL}", *KV, "--task", "kv-2hop", "--position", ""], "new", "--position is empty"),
    (["show", "--model", "{MODEL}", *KV, "--task", "kv-2hop", "--position", "0,1"], "new", "bad pair '0' in --position"),
    (["show", "--model", "{MODEL}", *KV, "--task", "kv-2hop", "--pairs", "0:1"], "new",
     "--pairs is kv-uuid's count of key-value pairs, and task kv-2hop takes none; placements (a two-hop task's too) "
     "are --position -- use --position 0:1 and drop --pairs"),
    (["show", "--model", "{MODEL}", *KV, "--position", "9"], "new", "position 9 is out of range"),
    (["show", "--model", "{MODEL}", *KV, "--example", "-1"], "new", "there is no example -1"),
    (["show", "--model", "{MODEL}", "--task", "kv-uuid", "--skip", "600"], "new", "there is no example 0"),
    (["show", "--model", "{MODEL}", "--task", "kv-uuid", "--skip", "600", "--example", "700"], "new", "no example 700"),
    # slot policies (posbias/policy.py) read by curve:POLICY: every field the code reads, checked before the model loads
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "curve:{ROOT}/policy-ok.json:bogus"], "new",
     "unknown relevance signal 'bogus' for curve"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "curve:{ROOT}/policy-rfloat.json"], "new",
     "policy-rfloat.json: 'ranking' must be a list of slots (whole numbers)"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "curve:{ROOT}/policy-rstr.json"], "new",
     "policy-rstr.json: 'ranking' must be a list of slots (whole numbers)"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "curve:{ROOT}/policy-task.json"], "new",
     "policy-task.json: 'task' must be an object"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "curve:{ROOT}/policy-measured.json"], "new",
     "policy-measured.json: 'measured' must be an object"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "curve:{ROOT}/policy-ptest.json"], "new",
     "policy-ptest.json: 'curve.position_test.p' must be a p-value"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "curve:{ROOT}/policy-psep.json"], "new",
     "policy-psep.json: 'curve.separable' must be false (position_test.p 0.4 >= 0.05)"),
    # order ensembles (methods/ensemble.py): more orders than the items have (4 facts: 4 shifts, 24 permutations)
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "ensemble:5"], "new",
     "ensemble:5:shift asks for 5 orders, and kv-lookup's 4 items have only 4 distinct shifts -- write ensemble:4:shift"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,ensemble:25:perm"], "new",
     "have only 24 distinct orders -- write ensemble:24:perm or fewer orders"),
    (["sweep", "--model", "{MODEL}", *TINY, "--positions", "0,12"], "new", "position 12 is out of range"),
    (["sweep", "--model", "{MODEL}", *TINY, "--positions", "0,x"], "new", "bad position 'x' in --positions"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "nq", "--data-dir", "/nonexistent"], "new",
     "data set nq is not here (looked in --data-dir /nonexistent) -- get it with `posbias data fetch nq`"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:/nonexistent.jsonl"], "new", "does not exist"),
    (["sweep", "--model", "/nonexistent/model.gguf", *TINY], "new", "does not exist"),
    (["sweep", "--model", "no-such-model-xyz", *TINY], "new", "unknown model 'no-such-model-xyz'"),
    (["sweep", "--model", "{MODEL}", *TINY, "--facts", "300"], "new", "context window is 2048"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "warp:2"], "new", "unknown method 'warp:2'"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "layers:1,2,3"], "new", "3 RoPE scaling factors for a 2-layer"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "pi:inf"], "new", "finite positive"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "mspoe:2-1"], "new", "0 < min <= max"),
    # key=value specs (posbias/specs.py): an unknown key, a value of the wrong type, a missing key, a malformed pair,
    # an option given both in the spec and as a flag
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "pi:colour=red"], "new",
     "method spec 'pi:colour=red' has no key 'colour' -- use its keys: factor, source"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "mspoe:min_ratio=low"], "new",
     "'min_ratio' in method spec 'mspoe:min_ratio=low' takes a number, got 'low' -- write min_ratio=1.5"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "mspoe:1.2,max_ratio=1.8"], "new", "'1.2' in method spec"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,mspoe:min_ratio=1.2,max_ratio=x"], "new",
     "'max_ratio' in method spec 'mspoe:min_ratio=1.2,max_ratio=x' takes a number"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "kv-lookup:colour=red"], "new",
     "task spec 'kv-lookup:colour=red' has no key 'colour' -- use its keys: facts, digits"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "kv-lookup:facts=ten"], "new",
     "'facts' in task spec 'kv-lookup:facts=ten' takes a whole number, got 'ten'"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:answers=first"], "new",
     "task spec 'jsonl:answers=first' needs 'path' -- add path=VALUE"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "kv-lookup:4,digits=3"], "new",
     "'4' in task spec 'kv-lookup:4,digits=3' is not key=value"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "kv-lookup:facts=4,digits=3", "--facts", "5"], "new",
     "task option facts is 4 in the task spec 'kv-lookup:facts=4,digits=3' and --facts 5 -- give it once: drop --facts"),
    (["sweep", "--model", "{MODEL}", *TINY, "--engine", "fast"], "new", "use --engine teacher-forced or generate"),
    (["sweep", "--model", "{MODEL}", *TINY, "--max-new-tokens", "-1"], "new", "--max-new-tokens must be at least 1"),
    (["sweep", "--model", "{MODEL}", *TINY, "--n", "0"], "new", "--n must be at least 1"),
    (["sweep", "--model", "{MODEL}", *TINY, "--dtype", "fp16"], "new", "unknown dtype 'fp16'"),
    (["sweep", "--model", "{MODEL}", *TINY, "--device", "tpu"], "new", "unknown device 'tpu'"),
    (["sweep", "--model", "{MODEL}", *TINY, "--chat", "maybe"], "new", "unknown --chat 'maybe'"),
    (["sweep", "--model", "{MODEL}", *TINY, "--facts", "1"], "new", "use --facts 2 or more"),
    (["sweep", "--model", "{MODEL}", *TINY, "--docs", "10"], "new", "does not take --docs"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "nq", "--docs", "15"], "new", "use --docs 10 or --docs 20"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "kv-uuid", "--n", "501"], "new", "has 500 examples"),
    (["sweep", "--model", "{MODEL}", *TINY, "--resume"], "new", "nothing to resume"),
    (["sweep", "--model", "{MODEL}", *TINY, "--resume", "--overwrite"], "new", "contradict"),
    (["sweep", "--model", "{MODEL}", *TINY], "afile", "is a file"),
    (["sweep", "--model", "{MODEL}", *TINY, "--out", "{ROOT}/afile/sub"], "new", "is a file"),
    (["sweep", "--model", "{MODEL}", *TINY, "--positions", "0,3"], "sweep", "already holds a sweep -- pass --resume"),
    (["sweep", "--model", "{MODEL}", *TINY, "--positions", "0,3", "--resume", "--seed", "1"], "sweep",
     "different configuration (config.seed"),
    (["sweep", "--model", "{MODEL}", *TINY], "compare", "holds a comparison, not a sweep"),
    (["sweep", "--model", "{MODEL}", *TINY, "--positions", "0,3", "--resume"], "bad-marker", "is not a readable run marker"),
    (["sweep", "--model", "{MODEL}", *TINY, "--positions", "0,3", "--resume"], "bad-rows", "is not a row this pipeline wrote"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/latin1.jsonl"], "new", "not UTF-8"),
    # order tasks: one candidate, the same option twice, a gold index out of range, two options with one label
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "judge:{DATA}/order-one.jsonl"], "new", "list of exactly 2 strings"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "mc:{DATA}/order-dup.jsonl"], "new", "lists 'a' twice"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "mc:{DATA}/order-gold.jsonl"], "new", "gold=2 but there are 2"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "mc:{DATA}/order-clash.jsonl"], "new", "'labels' lists 'A' twice"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "judge-kv", "--options", "11"], "new", "cannot be labelled"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "mc:{DATA}/order-dupid.jsonl"], "new",
     "order-dupid.jsonl:3: id 'q1' is also the id of line 1"),
    # judge templates (tasks/judge_template.py): refused before the model loads, naming the file
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "judge:{DATA}/judge.jsonl", "--judge-template",
      "{DATA}/tpl-unknown.txt"], "new", "tpl-unknown.txt: unknown placeholder {verdict}"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "judge:{DATA}/judge.jsonl", "--judge-template",
      "{DATA}/tpl-noanswer.txt"], "new", "has no {answer_b}"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "judge:{DATA}/judge.jsonl", "--judge-template",
      "{DATA}/tpl-brace.txt"], "new", "Single '{' encountered"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "judge:{DATA}/judge.jsonl", "--judge-template",
      "{DATA}/tpl-system.json"], "new", "unknown key 'system'"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "judge:{DATA}/judge.jsonl", "--judge-template",
      "{DATA}/tpl-samelabels.json"], "new", "could not be told apart"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "judge:{DATA}/judge.jsonl", "--judge-template",
      "{DATA}/tpl-nosuch.txt"], "new", "tpl-nosuch.txt' does not exist"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "judge:{DATA}/judge.jsonl", "--judge-template",
      "{DATA}/tpl-plain.txt", "--ask", "correct"], "new", "--ask correct picks a built-in judge question"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "judge:{DATA}/judge-ctx.jsonl", "--judge-template",
      "{DATA}/tpl-plain.txt"], "new", "judge-ctx.jsonl:1 (id line1) gives a 'context'"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "judge-kv", "--options", "3", "--judge-template",
      "{DATA}/tpl-kv.txt"], "new", "has no {answer_c}"),
    (["sweep", "--model", "{MODEL}", *TINY, "--method", "swap"], "new", "kv-lookup is not one"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/answers5.jsonl"], "new", ":2: 'answers' must be"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/docstr.jsonl"], "new", ":2: 'documents' must be a list"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/goldfloat.jsonl"], "new", ":2: 'gold' must be an integer"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/noquestion.jsonl"], "new", "missing or bad field 'question'"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/plain.jsonl.gz"], "new", "not a complete gzip file"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/cut.jsonl.gz"], "new", "not a complete gzip file"),
    (["sweep", "--model", "{MODEL}", *TINY, "--n", "abc"], "new", "Invalid value for '--n'"),
    # niah needle files (tasks/haystack.py) and a QA file whose answer is a number
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "niah", "--needle", "{DATA}/needle-answers5.jsonl"], "new",
     'needle-answers5.jsonl:2 (id x): "answers" must be a list of non-empty strings, got 5'),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "niah", "--needle", "{DATA}/needle-int.jsonl"], "new",
     'got [5521] -- write answers as strings, e.g. "answers": ["5521"]'),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/qa-int.jsonl"], "new",
     'got [5521] -- write answers as strings, e.g. "answers": ["5521"]'),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "niah", "--needle", "{DATA}/needle-empty.jsonl"], "new",
     'needle-empty.jsonl:2 (id x): the line\'s "needle" is empty'),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "niah", "--needle", "{DATA}/needle-one.jsonl"], "new",
     "has 1 examples but 2 were asked for"),
    (["grid", "--model", "{MODEL}", *TINY, "--task", "niah", "--needle", "{DATA}/needle-one.jsonl", "--lengths", "600"],
     "new", "or repeat lines in"),
    (["sweep", "--model", "{MODEL}", *TINY, "--n", "1", "--task", "niah", "--needle", "{DATA}/needle-one.jsonl", "--engine",
      "teacher-forced"], "new", "the needle has no answer prefix, so teacher forcing would score"),
    (["grid", "--model", "{MODEL}", *TINY, "--n", "1", "--task", "niah", "--needle", "{DATA}/needle-one.jsonl", "--engine",
      "teacher-forced", "--lengths", "600"], "new", "give an answer prefix with --answer-prefix TEXT"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "kv-2hop", "--positions", "0:12"], "new", "pair 0:12 is out of range"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "kv-2hop", "--positions", "3:3"], "new", "both hops in slot 3"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "kv-2hop", "--positions", "0,1"], "new", "bad pair '0'"),
    # --pairs is kv-uuid's pair count only: the placements it once also named (two-hop tasks) are --positions
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "kv-2hop", "--pairs", "connected,reversed"], "new",
     "--pairs is kv-uuid's count of key-value pairs, and task kv-2hop takes none; placements (a two-hop task's too) "
     "are --positions -- use --positions connected,reversed and drop --pairs"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/hop1.jsonl"], "new", "two different document indices"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "kv-uuid", "--pairs", "abc"], "new",
     "'pairs' in task kv-uuid takes a whole number, got 'abc'"),
    (["distill", "r2", "--model", "{MODEL}", *TINY, "--anchor", "5"], "new", "bad --anchor '5'"),
    (["distill", "r2", "--model", "{MODEL}", *TINY, "--method", "seqkd"], "new", "unknown --method 'seqkd' for r2"),
    (["sweep", "--model", "{MODEL}", *TINY, "--nope"], "new", "No such option: --nope"),
    (["frob"], "new", "No such command 'frob'"),
    # hints that must be commands, meanings not guessed, inputs that make a sweep meaningless
    (["sweep", "--model", "{MODEL}", *TINY, "--positions", ""], "new", "--positions is empty"),
    (["sweep", "--model", "{MODEL}", *TINY, "--positions", "0:1"], "new", "are pairs of slots (two hops)"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "kv-2hop", "--facts", "2", "--positions", "disconnected"], "new",
     "the disconnected placements need at least 3 slots"),
    (["sweep", "--model", "{MODEL}", *TINY, "--engine", "teacher-forced", "--max-new-tokens", "3"], "new",
     "--engine teacher-forced generates nothing"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}"], "new", "is a folder"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/same.jsonl"], "new", "all 3 documents are the same"),
    (["sweep", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/dupgold.jsonl"], "new",
     "the gold document 0 appears again as document 2"),
    (["sweep", "--model", "{MODEL}", *TINY, "--positions", "0,3"], "locked", "is being written by another posbias process"),
    (["sweep", "--model", "{MODEL}", *TINY, "--out", "/proc/posbias-out"], "new", "cannot be written"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,bogus"], "new", "unknown method 'bogus'"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--task", "jsonl:{DATA}/ok.jsonl", "--skip", "5"], "new",
     "use --skip 0 with --n 1"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--positions", "0.2,0.3,0.5"], "new", "bad list of integers"),
    (["lpes", "gain", "{ROOT}/compare", "{ROOT}/compare"], "new", "is listed twice"),
    (["lpes", "gain", "{ROOT}/compare"], "gain", "already holds a length-gain -- pass --overwrite"),
    (["moice", "train", "--model", "{MODEL}", *TINY, "--bases", "abc"], "new", "bad list of numbers 'abc' for --bases"),
    (["distill", "r2", "--model", "{MODEL}", *TINY, "--task", "kv-lookup"], "new", "use posbias distill r1"),
    (["report", "{ROOT}/bad-marker"], "new", "is not a readable run marker"),
    (["report", "{ROOT}/bad-result"], "new", "is not a readable sweep result"),
    (["report", "{ROOT}/sweep", "--out", "/proc/report.html"], "new", "cannot be written"),
    (["analyze", "shifting", "--model", "{MODEL}", *TINY, *KV, "--positions", "0"], "new", "names only the anchor placement"),
    # compare
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,none"], "new", "listed twice"),
    (["compare", *TINY, "--methods", "none", "--models", "{MODEL},{MODEL}"], "new", "--models must list distinct models"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,pi:1.5", "--positions", "0,3"], "compare",
     "already holds a comparison"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,lpes:/nonexistent/factors.json"], "new", "no factors file"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,lpes:{ROOT}/factors-overlap.json"], "new",
     "report on held-out examples, e.g. --skip 50"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,layers:1,2,3"], "new", "3 RoPE scaling factors"),
    # lpes search
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--weights", "0.5,0.5"], "new", "expected 3 numbers for --weights"),
    (["lpes", "gain", "{ROOT}/sweep"], "new", "holds a sweep, not a comparison"),
    (["lpes", "gain", "{ROOT}/compare", "--out", "{ROOT}/compare"], "compare", "holds a comparison, not a length-gain"),
    (["moice", "train", "--model", "{MODEL}", *TINY, "--top-k", "9"], "new", "--top-k must be between 1 and the number of bases (7), got 9 -- pass --top-k 7"),
    (["moice", "train", "--model", "{MODEL}", *TINY, "--bases", "0.5,2"], "new", "must be RoPE bases > 1"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,moice:{ROOT}/sweep"], "new",
     "holds a sweep, not a MoICE training"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--weights", "0.5,0.5,0.5"], "new", "--weights must be three"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--y-init", "3"], "new", "--y-init 3.0 outside"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--preset", "huge"], "new", "unknown preset 'huge'"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--space", "grid"], "new", "unknown search --space 'grid'"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--parents", "10"], "new", "--parents + --crossovers + --mutations"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--positions", "0,1"], "new", "expected 3 integers for --positions"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--points", "2", "--positions", "0,1,9"], "new", "three slots in 0..3"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--points", "4"], "new", "fewer control points (--points)"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--task", "kv-uuid", "--skip", "600"], "new", "use --skip 498 or less"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, "--points", "2", "--generations", "1", "--pop-size", "4", "--parents",
      "2", "--crossovers", "1", "--mutations", "1", "--y-max", "1.5", "--y-step", "0.25", "--y-init", "1.25", "--my", "0.25",
      "--mx", "1", "--resume"], "bad-state", "is not a search state this configuration can resume"),
    # positional hidden-channel scaling: the method, then `hidden search`
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,hidden:64:0"], "new", "hidden channel 64 is out of range"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,hidden:3:0:1-5"], "new", "do not fit a 2-layer"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,hidden:{ROOT}/hidden-other"], "new",
     "was found on other-model"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,hidden:{ROOT}/hidden-overlap"], "new",
     "report on held-out examples, e.g. --skip 50"),
    (["compare", "--model", "{MODEL}", *TINY, "--methods", "none,hidden:{ROOT}/sweep"], "new",
     "holds a sweep, not a hidden-channel search"),
    (["hidden", "search", "--model", "{MODEL}", *TINY, "--scales", "1"], "new", "--scales must be finite factors other than 1"),
    (["hidden", "search", "--model", "{MODEL}", *TINY, "--positions", "0,9"], "new", "--positions must be slots in 0..3"),
    (["hidden", "search", "--model", "{MODEL}", *TINY, "--preset", "huge"], "new", "unknown preset 'huge'"),
    # distill r1
    (["distill", "r1", "--model", "{MODEL}", *TINY, "--k", "20"], "new", "use --k between 1 and 3"),
    (["distill", "r1", "--model", "{MODEL}", *TINY, "--method", "dpo"], "new", "unknown --method 'dpo'"),
    (["distill", "r1", "--model", "{MODEL}", *TINY, "--anchor", "9"], "new", "--anchor 9: position 9 is out of range"),
    (["distill", "r1", "--model", "{MODEL}", *TINY, "--anchor", "auto:/nonexistent"], "new", "no sweep result"),
    (["distill", "r1", "--model", "{MODEL}", *TINY, "--k", "2", "--preset", "fast"], "new", "unknown preset 'fast'"),
    (["distill", "r1", "--model", "{MODEL}", *TINY, "--k", "2", "--lr", "-1"], "new", "--lr must be positive"),
    (["distill", "r1", "--model", "{MODEL}", *TINY, "--k", "2", "--n", "1", "--keep-all", "--max-steps", "1",
      "--save-steps", "1", "--resume", "--lam", "0.5"], "distill", "different configuration"),
    (["distill", "r1", "--model", "{MODEL}", *TINY, "--k", "2", "--n", "1", "--keep-all", "--max-steps", "1",
      "--save-steps", "1"], "distill", "already holds a distillation"),
    # theory
    (["theory", "--n", "0"], "new", "needs --n >= 1"),
    (["theory", "--no-real", "--tokens", "2"], "new", "use --tokens 4 or more"),
    (["theory", "--no-real"], "sweep", "holds a sweep, not a theory run"),
    # analyses
    (["analyze", "shifting", "--model", "{MODEL}", *TINY, *KV, "--top", "0"], "new", "--top must be at least 1"),
    (["analyze", "shifting", "--model", "{MODEL}", *TINY, *KV, "--resume"], "new", "nothing to resume"),
    (["analyze", "shifting", "--model", "{MODEL}", *TINY, *KV, "--method", "pi:0"], "new", "finite positive"),
    (["analyze", "shifting", "--model", "{MODEL}", *TINY, *KV], "sweep", "holds a sweep, not a shifting analysis"),
    # synth
    (["synth", "depth", "--pes", "alibi", "--quiet"], "new", "unknown positional encoding 'alibi'"),
    (["synth", "sinks", "--masks", "windowX", "--quiet"], "new", "bad mask 'windowX'"),
    (["synth", "depth", "--residual", "maybe", "--quiet"], "new", "--residual takes on,off values"),
    (["synth", "depth", "--workers", "0", "--quiet"], "new", "--workers must be >= 1"),
    (["synth", "depth", "--group", "0", "--quiet"], "new", "--group must be >= 1"),
    (["synth", "bias", "--device", "tpu", "--quiet"], "new", "unknown device 'tpu'"),
    (["synth", "bias", "--biases", "sideways", "--quiet"], "new", "unknown data bias 'sideways'"),
    (["synth", "train", "--items", "5", "--quiet"], "new", "multiple of the burstiness"),
    (["synth", "train", "--pe", "alibi", "--quiet"], "new", "unknown positional encoding"),
    (["synth", "train", "--iters", "5", "--quiet"], "afile", "is a file"),
    (["synth", "train", *SYNTH_TINY], "bad-ckpt", "is unreadable"),
]


# commands whose hints are rerun up to the model load (the others' hints are parsed, not run: they would run for real)
RERUN = ("sweep", "compare", "lpes", "distill", "moice", "analyze", "grid", "show")


# what needs the model: checked after it loads (docs/reliability.md); every other case is refused before
NEED_MODEL = {"context window is 2048", "3 RoPE scaling factors for a 2-layer", "3 RoPE scaling factors",
              "fewer control points (--points)", "different configuration (config.seed",
              # the hidden channel's range, its layers and its model are known once the model is loaded
              "hidden channel 64 is out of range", "do not fit a 2-layer", "was found on other-model"}


def _count_model_loads(monkeypatch) -> list:
    from transformers import AutoModelForCausalLM

    calls, real = [], AutoModelForCausalLM.from_pretrained

    def counted(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counted)
    return calls


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()} if folder.is_dir() else {}


def _out(env: dict, kind: str, tmp_path: Path) -> Path:
    return tmp_path / "out" if kind == "new" else Path(env["ROOT"]) / kind


def test_there_are_forty_cases_across_every_command():
    commands = {c[0][0] if c[0][0] not in ("lpes", "distill", "synth", "moice", "hidden") else " ".join(c[0][:2]) for c in CASES}
    assert len(CASES) >= 40
    assert {"sweep", "compare", "lpes search", "lpes gain", "moice train", "distill r1", "theory", "synth depth",
            "synth train"} <= commands


@pytest.mark.parametrize("args, where, message", CASES, ids=[f"{i}-{' '.join(c[0][:2])}" for i, c in enumerate(CASES)])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(env, tmp_path, monkeypatch, capsys, args, where, message):
    out = _out(env, where, tmp_path)
    before = _snapshot(out) if out.is_dir() else None
    argv = [a.format(**env, OUT=out) for a in args]
    head = 2 if argv[0] in ("lpes", "distill", "synth", "moice", "hidden") else 1
    if argv[0] in ("sweep", "compare", "lpes", "distill", "moice", "hidden") and "--task" not in argv and argv[1] != "gain":
        argv = argv[:head] + KV + argv[head:]  # kv-lookup, sized for the tiny model
    if "--out" not in argv and args[0] not in ("frob", "show"):  # show prints, and writes nothing
        argv += ["--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["posbias", *argv])
    loads = _count_model_loads(monkeypatch)
    with pytest.raises(SystemExit) as e:
        main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    if "data set" not in message:
        skip_if_data_refused(" ".join(err))
    assert e.value.code == 2, err
    assert not loads or message in NEED_MODEL, f"refused only after the model loaded: {err}"
    assert len(err) == 1 and err[0].startswith("posbias: error: ") and " -- " in err[0], err
    assert message in err[0], err[0]
    if before is None:
        assert not out.exists() or not any(p.is_file() for p in out.rglob("*")), list(out.rglob("*"))
    else:
        assert _snapshot(out) == before  # a finished result is never touched by a refused command
    served = any(a.startswith("openai:") or ",openai:" in a for a in argv)
    scratch = tmp_path / "hints"
    scratch.mkdir()
    hints.check(argv, err[0], out, scratch, rerun=argv[0] in RERUN and not served)


ANNOUNCED = [  # refused by the command's config, which the "loading ..." line (printed without --quiet) comes after
    (["sweep", "--prefix-attention", "fast"], "unknown prefix_attention 'fast'"),
    (["grid", "--sizes", "4", "--depths", "0%", "--fill", "10%"], "--fill and --threshold are for lengths in tokens"),
    (["lpes", "search", "--space", "grid"], "unknown search --space 'grid'"),
]


@pytest.mark.parametrize("args, message", ANNOUNCED, ids=[" ".join(a[:2]) for a, _ in ANNOUNCED])
def test_a_refused_config_prints_no_loading_line(env, tmp_path, monkeypatch, capsys, args, message):
    head = 2 if args[0] == "lpes" else 1
    argv = args[:head] + ["--model", env["MODEL"], "--n", "2", "--dtype", "fp32"] + args[head:] + ["--out", str(tmp_path / "o")]
    monkeypatch.setattr(sys, "argv", ["posbias", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and message in err[0], err


# ----------------------------------------------------------------------------- output places, before the model loads

WRITERS = [
    ["sweep", "--model", "{MODEL}", *TINY, *KV], ["compare", "--model", "{MODEL}", *TINY, *KV, "--methods", "none,pi:1.5"],
    ["grid", "--model", "{MODEL}", *TINY, "--sizes", "4", "--depths", "0%"], ["theory", "--no-real"],
    ["synth", "depth", "--quiet"], ["synth", "bias", "--quiet"], ["synth", "sinks", "--quiet"], ["synth", "train", *SYNTH_TINY],
    ["lpes", "search", "--model", "{MODEL}", *TINY, *KV], ["lpes", "gain", "{ROOT}/compare"],
    ["distill", "r1", "--model", "{MODEL}", *TINY, *KV, "--k", "2"], ["distill", "r2", "--model", "{MODEL}", *TINY],
    ["moice", "train", "--model", "{MODEL}", *TINY, *KV], ["analyze", "shifting", "--model", "{MODEL}", *TINY, *KV],
    ["analyze", "attention", "--model", "{MODEL}", *TINY, *KV], ["report", "{ROOT}/sweep"],
]
UNWRITABLE = "/proc/posbias-test/out"  # the kernel's folder: no permission bit says so, even for root


def _stop_model_load(*a, **k):
    raise RuntimeError(hints.SENTINEL)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
@pytest.mark.parametrize("args", WRITERS, ids=[" ".join(a[:2]) for a in WRITERS])
def test_an_unwritable_out_fails_in_one_line_before_the_model_loads(env, monkeypatch, capsys, args):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", _stop_model_load)
    out = UNWRITABLE + (".html" if args[0] == "report" else "")
    monkeypatch.setattr(sys, "argv", ["posbias", *[a.format(**env) for a in args], "--out", out])
    with pytest.raises(SystemExit) as e:
        main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1, err
    assert f"--out {out} cannot be written" in err[0] and hints.SENTINEL not in err[0], err[0]


def test_export_checks_its_folder_before_the_model_loads(env, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", _stop_model_load)
    monkeypatch.setattr(sys, "argv", ["posbias", "export", env["MODEL"], UNWRITABLE])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "cannot be written" in err and hints.SENTINEL not in err, err


# ----------------------------------------------------------------------------- the hint check itself

# hints earlier versions gave for cases above (the same command, the old fix): each must fail the check
OLD_HINTS = [
    (["lpes", "search", "--model", "{MODEL}", *TINY, *KV, "--task", "jsonl:{DATA}/ok.jsonl", "--skip", "5"], "new",
     "task jsonl has 1 examples but 7 were asked for -- use --n 0 or fewer"),
    (["moice", "train", "--model", "{MODEL}", *TINY, *KV, "--bases", "abc"], "new",
     "bad number list 'abc' for bases -- write comma-separated numbers, e.g. 0.2,0.3,0.5"),
    (["moice", "train", "--model", "{MODEL}", *TINY, *KV, "--bases", "abc"], "new", "bad bases -- e.g. --bases 0.2,0.3,0.5"),
    (["lpes", "search", "--model", "{MODEL}", *TINY, *KV, "--positions", "0,1"], "new",
     "expected 3 numbers for positions -- e.g. --positions 0.2,0.3,0.5"),
    (["distill", "r2", "--model", "{MODEL}", *TINY, "--task", "kv-lookup"], "new",
     "kv-lookup is distilled by r1, not r2 -- use --stage r1 (posbias distill r1)"),
    (["report", "{ROOT}/bad-result"], "new", "sweep.json is not a readable sweep result -- pass --overwrite to start again"),
    (["lpes", "gain", "{ROOT}/compare"], "gain", "already holds a length-gain -- pass --resume to continue it or "
                                                  "--overwrite to start again"),
    (["sweep", "--model", "{MODEL}", *TINY, *KV, "--positions", "0,3"], "locked",
     "already holds a sweep -- pass --resume to continue it or --overwrite to start again"),
    (["sweep", "--model", "{MODEL}", *TINY, *KV, "--task", "kv-2hop", "--facts", "2", "--pairs", "disconnected"], "new",
     "the disconnected placements need 3 slots -- use --positions connected"),
    (["analyze", "shifting", "--model", "{MODEL}", *TINY, *KV], "sweep", "holds a sweep -- served models work with --sweep"),
]


@pytest.mark.parametrize("args, where, old", OLD_HINTS, ids=[f"{i}-{' '.join(c[0][:2])}" for i, c in enumerate(OLD_HINTS)])
def test_the_hint_check_refuses_the_hints_earlier_versions_gave(env, tmp_path, args, where, old):
    out = _out(env, where, tmp_path)
    argv = [a.format(**env) for a in args] + ["--out", str(out)]
    (tmp_path / "hints").mkdir()
    with pytest.raises(AssertionError):
        hints.check(argv, f"posbias: error: {old}", out, tmp_path / "hints", rerun=argv[0] in RERUN)
