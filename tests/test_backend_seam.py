"""The backend seam: a new backend is one file (tests/backend_example.py) and one registration line, and then runs
every served protocol through the pipelines unchanged; the registry refuses what is not a backend; specs split
what makes rows comparable (identity) from how requests travel (transport keys)."""

from __future__ import annotations

import json

import pytest

from posbias import PosbiasError
from posbias.backends import BACKENDS, register_backend
from posbias.measure import parse_spec

pytestmark = pytest.mark.usefixtures("one_thread")

KV = {"facts": 4, "digits": 3}


@pytest.fixture()
def local_backend():
    from backend_example import LocalServed

    register_backend(LocalServed)  # the one line a new backend needs
    yield LocalServed
    BACKENDS.remove(LocalServed.name)


@pytest.mark.parametrize("engine, route", [("teacher-forced", "generate"), ("teacher-forced", "prompt_logprobs"),
                                           ("generate", "generate")])
def test_a_new_backend_is_one_file_and_one_line(local_backend, model_dir, loaded, engine, route):
    from posbias import SweepConfig, run_sweep

    cfg = dict(task_options=KV, positions="0,2,3", n=4, engine=engine)
    served = run_sweep(SweepConfig(model=f"local:{model_dir},teacher_forcing={route}", **cfg), progress=False)
    local = run_sweep(SweepConfig(model=str(model_dir), **cfg), loaded=loaded, progress=False)
    key = lambda r: (r["example_id"], json.dumps(r["position"]))  # noqa: E731
    assert {key(r): r["correct"] for r in served.rows} == {key(r): r["correct"] for r in local.rows}
    assert served.record["model"]["backend"] == "local" and served.record["config"]["decoding"]["rule"] == "greedy"


def test_the_new_backend_scores_an_order_task_and_lists_itself(local_backend, model_dir, loaded):
    from typer.testing import CliRunner

    from posbias import SweepConfig, run_sweep
    from posbias.cli import app

    cfg = dict(task="mc-kv", task_options={"facts": 3, "digits": 3}, n=2)
    exact = run_sweep(SweepConfig(model=f"local:{model_dir},teacher_forcing=prompt_logprobs", **cfg), progress=False)
    listed = run_sweep(SweepConfig(model=f"local:{model_dir}", **cfg), progress=False)  # the first token's top 20
    local = run_sweep(SweepConfig(model=str(model_dir), **cfg), loaded=loaded, progress=False)
    assert [r["choice"] for r in exact.rows] == [r["choice"] for r in local.rows]
    # a random model spreads its mass: a label below the top 20 is not listed (choice -1 when none is)
    pairs = [(a["choice"], b["choice"]) for a, b in zip(listed.rows, local.rows)]
    assert all(a in (b, -1) for a, b in pairs) and sum(a == b for a, b in pairs) >= len(pairs) // 2
    assert "local" in CliRunner().invoke(app, ["backends"]).output


def test_registry_refuses_what_is_not_a_backend_or_a_second_name():
    with pytest.raises(PosbiasError, match="takes a Backend subclass"):
        register_backend(dict)

    class Twin(BACKENDS["openai"]):
        name = "openai"

    with pytest.raises(PosbiasError, match="'openai' is already registered"):
        register_backend(Twin)


def test_identity_leaves_out_transport_keys_and_labels_are_short():
    a = parse_spec("openai:model=m,base_url=http://h:1/v1,tokenizer=d,timeout=5,concurrency=2,retries=1,batch=4,cache=/c")
    b = parse_spec("openai:model=m,base_url=http://h:1/v1,tokenizer=d")
    assert a.identity == b.identity == "openai:m,base_url=http://h:1/v1,tokenizer=d" and a.label == "openai:m"
    assert parse_spec("smollm2-135m").identity == "smollm2-135m" and parse_spec("hf:runs/x").identity == "hf:runs/x"
    assert parse_spec("vllm:/models/qwen/").label == "vllm:qwen"


def test_a_served_prefix_is_refused_where_the_model_must_be_in_process():
    """load_model (the in-process commands) refuses any NAME:... spec without claiming it is served: models/ sits
    below backends/ and cannot tell a registered backend from an unknown one."""
    from posbias import load_model

    for spec in ("openai:model=m,base_url=http://127.0.0.1:9/v1", "nosuch:model=x"):
        with pytest.raises(PosbiasError, match="is a backend spec .* loads its model in process") as e:
            load_model(spec)
        assert "served" not in str(e.value) and "posbias sweep, compare and grid" in str(e.value)


def test_an_unknown_backend_is_refused_as_such_naming_the_backends(local_backend, tmp_path, monkeypatch):
    with pytest.raises(PosbiasError, match="unknown backend 'nosuch' in model spec 'nosuch:model=x'") as e:
        parse_spec("nosuch:model=x")
    assert all(name in str(e.value) for name in BACKENDS) and "`posbias backends`" in str(e.value)
    assert parse_spec(f"local:{tmp_path}").backend == "local"  # a registered one opens
    (tmp_path / "mine:v2").mkdir()  # an existing folder whose name holds a colon is a model in process
    monkeypatch.chdir(tmp_path)
    assert parse_spec("mine:v2").args == {"model": "mine:v2"} and parse_spec("mine:v2").backend == "hf"


def test_the_grid_opens_its_model_through_the_same_seam(local_backend, model_dir, loaded):
    from posbias import GridConfig, run_grid

    cfg = dict(task="kv-lookup", sizes="3,4", depths="0,100", n=2, task_options={"digits": 3})
    served = run_grid(GridConfig(model=f"local:{model_dir}", **cfg), progress=False)
    local = run_grid(GridConfig(model=str(model_dir), **cfg), loaded=loaded, progress=False)
    assert [c["accuracy"] for c in served.cells] == [c["accuracy"] for c in local.cells]
    assert served.record["model"]["backend"] == "local"
