"""Shared fixtures: tiny random models built from configs, a character tokenizer, SmolLM2."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# `make test` runs the suite in pytest-xdist workers (two on two cores, docs/development.md): each computes on its
# share of the cores, so two workers do not oversubscribe them; a plain `pytest` run keeps two threads
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # this process's name as an xdist worker (gw0, ...), else None
THREADS = max(1, 2 // WORKERS)
torch.set_num_threads(THREADS)
torch.manual_seed(0)

PLUGIN = Path(__file__).parent / "plugin"


def install_plugin(folder: Path) -> Path:
    """A plugin package (a folder with its pyproject.toml) installed by pip into a cache folder of its own, as a
    third party's package is installed; -> that folder (put it on sys.path or PYTHONPATH). Built once per content."""
    files = [folder / "pyproject.toml", *sorted(folder.glob("*/*.py"))]
    digest = hashlib.sha256(b"".join(f.name.encode() + f.read_bytes() for f in files)).hexdigest()[:12]
    target = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "posbias" / "test-plugins" / digest
    if not (target / ".installed").exists():
        import importlib.util

        isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]  # else from PyPI
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation,
                        "--target", str(target), str(folder)], check=True)
        (target / ".installed").touch()
    return target


# the example plugin (tests/plugin: a task, a method of each kind, a backend, a model name, an engine, a dialect) is
# installed before posbias is imported, so `import posbias` loads it through its entry point and every registry-driven
# test runs its registrations
sys.path.insert(0, str(install_plugin(PLUGIN)))

from tiny import CHAT_TEMPLATE, char_tokenizer, save_tiny_llama, tiny_loaded, tiny_model  # noqa: E402,F401 (tests import them from here)

ARCHS = ("llama", "qwen2", "mistral", "gpt2")
ROPE_ARCHS = ("llama", "qwen2", "mistral")


def position_sensitive(model, q_scale=None):
    """Random init gives near-uniform attention, where RoPE barely matters; sharpen q.k (and v) so it does.

    q_scale: optional per-layer tensors of per-head extra q factors (heads then differ in sharpness)."""
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            q = layer.self_attn.q_proj.weight
            extra = 1.0 if q_scale is None else q_scale[i].repeat_interleave(q.shape[0] // len(q_scale[i]))[:, None]
            q.mul_(4.0 * extra)
            layer.self_attn.k_proj.weight.mul_(4.0)
            layer.self_attn.v_proj.weight.mul_(2.0)
    return model


def same_weights_with_rope(model, **rope):
    """The same weights under a different config.rope_parameters."""
    cfg = model.config.__class__.from_dict({**model.config.to_dict(), "rope_parameters": rope})
    other = type(model)(cfg).eval()
    other.load_state_dict(model.state_dict())
    return other


def random_seqs(lengths, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (n,), generator=g).tolist() for n in lengths]


def dies_after(monkeypatch, owner, name: str, calls: int):
    """Make owner.name raise KeyboardInterrupt (as a kill would) on call number `calls`; return the restorer."""
    real, seen = getattr(owner, name), {"n": 0}

    def dying(*a, **k):
        seen["n"] += 1
        if seen["n"] == calls:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(owner, name, dying)
    return lambda: monkeypatch.setattr(owner, name, real)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The sharpened tiny Llama saved as a plain HF directory, one per test module (`--model DIR`)."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def loaded(model_dir):
    """`model_dir` loaded in float32 on the CPU."""
    from posbias.models.load import load_model

    return load_model(str(model_dir), "fp32", "cpu")


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests on one thread (tiny tensors), restoring the count afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def smollm2():
    """The real default model, loaded once per test session in the default dtype (auto: bf16 on a CPU with native
    bf16, fp32 on one without, where bf16 would run 5x slower); the session's first real test prints the choice."""
    from posbias.models.load import load_model

    return load_model("smollm2-135m", "auto", "cpu")


@pytest.fixture
def one_load(smollm2, monkeypatch):
    """Every load of the default model in the default dtype on the CPU (`posbias.load_model`, and the in-process
    backend's load behind run_sweep and the CLI; dtype auto, or what auto takes here) returns the session's copy:
    documentation examples run as written, loading once."""
    import posbias
    import posbias.backends.hf as hf

    real = hf.load_model

    def load(name="smollm2-135m", dtype="auto", device="cpu", progress=True, device_map=None):
        if (name, device, device_map) == ("smollm2-135m", "cpu", None) and dtype in ("auto", smollm2.info["dtype"]):
            return smollm2
        return real(name, dtype, device, progress, device_map)

    monkeypatch.setattr(hf, "load_model", load)
    monkeypatch.setattr(posbias, "load_model", load)


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    yield


os.environ.setdefault("MPLBACKEND", "Agg")


# Benchmark data (docs/data.md): a test reads a data set from posbias's lookup order (--data-dir / POSBIAS_DATA, the
# user cache, a development checkout's ../shared/data). Where a set is absent, a test that needs it is skipped with one
# reason naming `posbias data fetch NAME`, so a stranger's clone passes its own tests; under CI=true (our CI always
# has ../shared beside the checkout) a missing set fails the test instead, naming the files. A test says what it needs
# with `@pytest.mark.data("nq", ...)` or `need_data(...)`; one that reaches a task whose data is missing without
# saying so (a registry-driven suite) is handled the same way, by the DataMissing it raises (`_data_missing`).
IN_CI = os.environ.get("CI", "").lower() == "true"


def missing_data(*names: str) -> list[str]:
    import posbias.data

    return [n for n in names if posbias.data.locate(n) is None]


def _no_data(names) -> None:
    import posbias.data

    files = ", ".join(f.name for n in names for f in posbias.data.DATASETS[n].files)
    if IN_CI:
        pytest.fail(f"data set(s) {', '.join(names)} missing under CI=true ({files}): CI checks out ../shared beside "
                    "the project", pytrace=False)
    pytest.skip(f"needs data set {', '.join(names)}: posbias data fetch {' '.join(names)}")


def need_data(*names: str) -> None:
    """Skip (fail under CI=true) unless every named data set is in the lookup order."""
    missing = missing_data(*names)
    if missing:
        _no_data(missing)


def task_data(spec: str, **options) -> tuple[str, ...]:
    """The data sets a task spec reads (its registry entry's declaration)."""
    from posbias.tasks import TASKS, split_task

    name, opts = split_task(spec, options)
    entry = TASKS.get(name.partition(":")[0])
    return entry.data_sets(opts) if entry else ()


def skip_if_data_refused(text: str) -> None:
    """A command's output that refused for missing data (`data set NAME is not here`): skipped as above."""
    import re

    found = re.search(r"data set (\S+) is not here", text or "")
    if found:
        _no_data([found[1]])


def _data_missing(excinfo) -> None:
    from posbias.data import DataMissing

    if excinfo is not None and isinstance(excinfo.value, DataMissing):
        _no_data([excinfo.value.dataset])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    marker = item.get_closest_marker("data")
    if marker is not None:
        need_data(*marker.args)
    try:
        return (yield)
    except BaseException:
        _data_missing(pytest.ExceptionInfo.from_current())
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except BaseException:
        _data_missing(pytest.ExceptionInfo.from_current())
        raise


# The served-backend tests (test_served.py) need a real vLLM server, whose start takes about a minute on these CPUs
# (eager mode, see served.server_cmd): it is launched (export included) as soon as collection shows those tests will
# run, so it starts while earlier modules run; the `vllm_server` fixture waits for it and stops it at the end of the
# session. Under pytest-xdist every worker collects every test, so there a server is launched by the first test that
# asks for it, in the one worker that runs all of that server's tests (`pytest_xdist_make_scheduler`).
_SERVER: dict = {}
_LLAMA: dict = {}  # the same for llama.cpp's server (tests/llamacpp.py; the `llama_server` fixture)


# Tiny-model tests that took 10 s or more each (most start posbias in subprocesses, kill and resume, or train):
# `slow`, so `make test-fast` leaves them to `make test`. Listed here, not decorated, to keep the test files as they are.
SLOW = (
    "test_faults.py::test_two_concurrent_sweeps_into_one_folder_and_sigint",
    "test_statistics.py::test_full_grid",
    "test_scoring.py::test_batch_size_1_and_8_give_identical_results",
    "test_scoring.py::test_teacher_forced_agrees_with_generate",
    "test_synth.py::test_tiny_training_beats_chance",
    "test_sweep.py::test_cli_kill_and_resume",
    "test_sweep.py::test_resume_after_interruption_gives_the_same_sweep",
    "test_shifting.py::test_shifting_rows_per_example_and_placement_and_resume",
    "test_scaleout.py::test_every_rank_returns_every_row_in_the_one_process_order",
    "test_scaleout.py::test_two_process_",
    "test_scaleout.py::test_resume_under_two_processes_after_a_one_process_kill",
    "test_attention.py::test_resume_after_a_kill_gives_identical_numbers",
    "test_attention.py::test_pipeline_rows_and_summary",
    "test_methods.py::test_cli_bad_input_names_the_fix",
    "test_data.py::test_a_test_that_needs_absent_data_is_skipped_naming_the_fetch_command_and_fails_under_ci",
)


# POSBIAS_TEST_TIMELINE=FILE: each test's worker, start and end (wall seconds since the epoch) and the worker's CPU
# seconds, one line each, appended to FILE (benchmarks/test_timeline.py reads it: where the workers idle and what runs last).
TIMELINE = os.environ.get("POSBIAS_TEST_TIMELINE")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not TIMELINE:
        return (yield)
    import time

    start, cpu = time.time(), time.process_time()
    try:
        return (yield)
    finally:
        with open(TIMELINE, "a") as f:  # the worker's own CPU seconds too (not its children's, not a server's)
            f.write(f"{WORKER or 'main'}\t{start:.3f}\t{time.time():.3f}\t{item.nodeid}\t"
                    f"{time.process_time() - cpu:.3f}\n")


def pytest_collection_modifyitems(config, items):
    """The markers `make test-fast` deselects, set from what a test uses, so a new test cannot forget them: the
    real model (the `smollm2` fixture), the browser (`chromium`), the vLLM server (tests/test_served.py and every
    test that uses the `vllm_server` fixture); and `slow` on the tests listed in SLOW. Under xdist the work units go
    to the scheduler: each server's tests in one, and the tests of a module that share a module-scoped fixture of
    that module in one (`work_unit`)."""
    units = []
    for item in items:
        if item.nodeid.removeprefix("tests/").startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        used = set(getattr(item, "fixturenames", ()))
        if "smollm2" in used:
            item.add_marker(pytest.mark.real)
        if "chromium" in used:
            item.add_marker(pytest.mark.browser)
        unit = work_unit(item, used)
        if unit and unit.startswith("servers"):
            item.add_marker(pytest.mark.served)
            item.add_marker(pytest.mark.real)
        if unit:
            units.append(unit + "\t" + item.nodeid)
    if WORKER and UNITS in os.environ:  # for the scheduler (below)
        tmp = Path(os.environ[UNITS] + f".{WORKER}")
        tmp.write_text("\n".join(units))
        tmp.replace(os.environ[UNITS])


def work_unit(item, used: set[str]) -> str | None:
    """The xdist work unit a test must share with others, None for a test any worker may take alone: each server's
    tests form one unit (one worker, beside its one server); the tests of a module that use a module-scoped fixture
    defined in that module form one (built once, in one worker: the report's run folders, the two-process jobs, a
    fixture per architecture; shared test by test, each worker built it again, and a parametrised one as often as
    its parameters alternated there). The conftest's module fixtures (a tiny model saved, 1 s) do not group."""
    if item.module.__name__ == "test_served" or used & {"vllm_server", "llama_server"}:
        return "servers: " + ("llama" if "llama_server" in used else "vllm")
    module = item.nodeid.split("::")[0]
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(d.scope == "module" and d.baseid == module for ds in defs.values() for d in ds):
        return "module: " + module
    return None


UNITS = "POSBIAS_TEST_UNITS"  # a file: the work units of the tests that share one (`work_unit`), by the workers


def pytest_configure(config):
    """Under xdist, the controller names the file its workers write the shared work units to."""
    if getattr(config.option, "numprocesses", None) and not WORKER and UNITS not in os.environ:
        import tempfile

        os.environ[UNITS] = str(Path(tempfile.mkdtemp(prefix="posbias-xdist-")) / "units.txt")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, present or not
def pytest_xdist_make_scheduler(config, log):
    """xdist's load scheduling over the work units `work_unit` names (the tests that use vLLM's server, those that use
    llama.cpp's, a module's tests that share its module fixture), the largest first: each runs in one worker, while
    the workers share the other tests test by test. (xdist's own `--dist loadgroup` reads `xdist_group` marks by
    rewriting `item._nodeid`, which pytest 9.2's node ids no longer read: it groups nothing there.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitsTogether(LoadScopeScheduling):
        units: dict[str, str] | None = None  # a grouped test's id -> its unit
        ordered = False  # the work queue put in order (at the first assignment)

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:  # first called once every worker has collected (and written the file)
                f = Path(os.environ[UNITS])
                pairs = [line.split("\t", 1) for line in f.read_text().splitlines()] if f.is_file() else []
                self.units = {nodeid: unit for unit, nodeid in pairs}
            return self.units.get(nodeid, nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first assignment: the servers' units first (the longest
                # chains of work), then the other shared units by size, then the single tests in collection order
                rank = lambda unit: (not unit.startswith("servers"), -len(self.workqueue[unit]))  # noqa: E731
                units = sorted(self.workqueue, key=rank)  # stable: single tests keep their order
                self.workqueue = type(self.workqueue)((u, self.workqueue[u]) for u in units)
                self.ordered = True
            super()._assign_work_unit(node)

    return UnitsTogether(config, log)


def _one_launch(name: str) -> None:
    """Under xdist, refuse a second launch of a server in the session (its tests were split over workers: two
    servers would share the cores, and the scheduler above has failed)."""
    if WORKER and UNITS in os.environ:
        try:
            Path(f"{os.environ[UNITS]}.{name}").open("x").close()
        except FileExistsError:
            pytest.fail(f"a second {name} server in this session: the tests that use it ran in two xdist workers")


def _launch_vllm() -> None:
    import tempfile

    from served import launch

    _one_launch("vllm")
    root = Path(tempfile.mkdtemp(prefix="posbias-served-"))
    proc, url = launch(root / "smollm2", root / "vllm.log", export=True, eager=True)
    _SERVER.update(proc=proc, url=url, root=root)


def _launch_llama() -> None:
    import tempfile

    from llamacpp import launch

    _one_launch("llama")
    root = Path(tempfile.mkdtemp(prefix="posbias-llama-"))
    proc, url = launch(root / "llama.log")
    _LLAMA.update(proc=proc, url=url, root=root)


def pytest_collection_finish(session):
    if WORKER:
        return  # launched on first use, by the worker that runs that server's tests
    from llamacpp import llama_missing
    from served import vllm_missing

    if vllm_missing() is None and any(item.get_closest_marker("served") for item in session.items):
        _launch_vllm()
    if llama_missing() is None and any("llama_server" in getattr(i, "fixturenames", ()) for i in session.items):
        _launch_llama()


def pytest_sessionfinish(session):
    from served import stop

    for server in (_SERVER, _LLAMA):
        if server:
            stop(server["proc"])


@pytest.fixture(scope="session")
def vllm_server():
    """{url, dir, root} of the session's vLLM server (launched at collection, or here under xdist), once it answers."""
    from served import ready, vllm_missing

    if not _SERVER and WORKER and vllm_missing() is None:
        _launch_vllm()
    if not _SERVER:
        pytest.skip("the vLLM server was not launched (no vLLM environment)")
    ready(_SERVER["proc"], _SERVER["url"], _SERVER["root"] / "vllm.log")
    return {"url": _SERVER["url"], "dir": str(_SERVER["root"] / "smollm2"), "root": _SERVER["root"]}


@pytest.fixture(scope="session")
def llama_server():
    """{url, root} of the session's llama.cpp server (launched at collection, or here under xdist), once it answers."""
    from llamacpp import llama_missing
    from served import ready

    if not _LLAMA and WORKER and llama_missing() is None:
        _launch_llama()
    if not _LLAMA:
        pytest.skip("the llama.cpp server was not launched (no llama.cpp environment: make llama-env)")
    ready(_LLAMA["proc"], _LLAMA["url"], _LLAMA["root"] / "llama.log", timeout=300)
    return {"url": _LLAMA["url"], "root": _LLAMA["root"]}


def method_examples(tmp_path, layers: int = 4) -> dict[str, str]:
    """An example spec of every registered method (and of Ms-PoE's per-query-head mode, `mspoe-query`) that runs on
    the tiny models of `layers` layers (4 query heads of 16 dimensions): the factors and MoICE routers it reads are
    written into tmp_path. The method conformance suite and the conformance matrix (test_conformance.py) take their
    methods from here; a method not listed here runs as its class's `example` spec or its bare name."""
    import json

    from posbias.models.moice import PAPER_BASES, Routers

    factors = tmp_path / "factors.json"
    factors.write_text(json.dumps({"factors": [1.0, 1.5, 2.0, 1.5, 1.0, 1.5][:layers]}))
    routers = tmp_path / "moice"  # seeded (untrained) routers: MoICE's plumbing does not depend on their values
    routers.mkdir(exist_ok=True)
    Routers(layers, 4, 16, PAPER_BASES, top_k=3, seed=0).save(routers / "routers.safetensors")
    from posbias import METHODS

    listed = {"none": "none", "pi": "pi:1.5", "layers": "layers:" + ",".join(["1", "2"] * layers)[: 2 * layers - 1],
            "lpes": f"lpes:{factors}", "mspoe": "mspoe:1.2-1.8", "mspoe-query": "mspoe:1.2-1.8:query",
            "buckets": "buckets:10000,30000", "moice": f"moice:{routers}", "calib": "calib:prompt",
            "hidden": "hidden:5:-1:1-2", "swap": "swap", "aswap": "aswap", "pride": "pride:1", "reorder": "reorder:oracle:first",
            "attnsort": "attnsort", "curve": f"curve:{_policy(tmp_path)}", "ensemble": "ensemble:3", "pine": "pine"}
    # a method registered elsewhere (the example plugin's) runs under the spec its class declares, else its name
    return {**listed, **{n: cls.example or n for n, cls in METHODS.items() if n not in listed}}


def _policy(tmp_path) -> str:
    """A slot policy (posbias/policy.py) for the tiny Llama on the default kv-lookup, best slot last."""
    import json

    from posbias import get_task

    task = get_task("kv-lookup").config()
    n = task["n_slots"]
    f = tmp_path / "policy.json"
    f.write_text(json.dumps({"posbias_policy": 1, "model": "tiny-llama", "task": task, "n_slots": n,
                             "ranking": list(range(n))[::-1], "measured": {"run": "tests"}}))
    return str(f)


def prime_calibration(active, seqs: list[list[int]], end=None) -> None:
    """Attention calibration acts on the items of the prompts it is told about (Scorer.score calls set_rows): give it
    three items per sequence (its thirds) and seeded weights; other methods need nothing. end: the prompt-end column
    of each sequence in the batch layout (None: the last column, as generation's prefill)."""
    from posbias.methods.calibration import _CalibActive
    from posbias.methods.pine import _PineActive
    from posbias.models.pine_plan import PREFIX, SUFFIX

    if isinstance(active, _PineActive):  # PINE: the thirds between a 3-token prefix and a 3-token suffix as documents
        active.handle.prompts = {tuple(s): [PREFIX] * 3 + [min(3 * i // (len(s) - 6), 2) for i in range(len(s) - 6)]
                                 + [SUFFIX] * 3 for s in seqs}
        return
    if not isinstance(active, _CalibActive):
        return
    spans = [[min(3 * i // len(s), 2) for i in range(len(s))] for s in seqs]
    weights = [torch.randn(3, generator=torch.Generator().manual_seed(len(s))) * 2 for s in seqs]  # one per sequence
    active.st.set(spans, torch.softmax(torch.stack(weights), -1), end)


def pytest_terminal_summary(terminalreporter):
    """The CPU kind beside the suite's timings (the guide: every figure names its CPU), on the controller only."""
    if WORKER:
        return
    from posbias.measure import choose_dtype, cpu_kind

    terminalreporter.write_line(f"cpu: {cpu_kind().describe()} | dtype auto -> {choose_dtype('auto', 'cpu')[0]} | "
                                f"{os.cpu_count()} cores")
