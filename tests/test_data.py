"""The benchmark data sets (posbias/data): the lookup order, every task's declared data against what its builder reads,
the deterministic builders, and the files a sweep records (docs/data.md). Downloads: tests/test_data_fetch.py."""

from __future__ import annotations

import gzip
import io
import json
import random
import shutil
import sys
from pathlib import Path

import pytest

import posbias.data as data
from conftest import need_data, tiny_loaded
from posbias import PosbiasError, SweepConfig, get_task, run_sweep
from posbias.data.build import gzip_lines
from posbias.tasks import TASKS, check_data

HERE = {name: data.locate(name) for name in data.DATASETS}  # where this machine reads each set (None: absent)


@pytest.fixture
def stranger(tmp_path, monkeypatch):
    """A machine with no data anywhere: an empty user cache, no POSBIAS_DATA, no checkout's ../shared/data."""
    monkeypatch.setenv("POSBIAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(data.ENV, raising=False)
    monkeypatch.setattr("posbias.data.lookup.checkout_dir", lambda: None)
    return tmp_path


def _copy(name: str, into) -> None:
    """Data set `name` copied from where this machine reads it into folder `into`."""
    if HERE[name] is None:
        need_data(name)  # skips, naming the fetch command (fails under CI=true)
    src = HERE[name]
    for f in data.DATASETS[name].files:
        (into / f.name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / f.name, into / f.name)


def test_the_lookup_order(stranger, monkeypatch):
    mine, env, cache = stranger / "mine", stranger / "env", stranger / "cache" / "data"
    for folder in (mine, env, cache):
        _copy("kv-uuid", folder)
    assert data.require("kv-uuid") == cache  # nothing named: the user cache
    monkeypatch.setattr("posbias.data.lookup.checkout_dir", lambda: env)
    assert data.require("kv-uuid") == cache  # the cache before a checkout's shared data
    shutil.rmtree(cache)
    assert data.require("kv-uuid") == env  # the checkout's, when the cache lacks it
    monkeypatch.setenv(data.ENV, str(mine))
    assert data.require("kv-uuid") == mine  # $POSBIAS_DATA, and it alone
    assert data.require("kv-uuid", env) == env  # data_dir first, and it alone
    with pytest.raises(data.DataMissing, match=r"data set nq is not here \(looked in `data_dir` .*posbias data fetch nq"):
        data.require("nq", env)


def test_a_missing_data_set_names_the_fetch_command_and_every_folder_looked_in(stranger):
    with pytest.raises(data.DataMissing) as e:
        get_task("musique")
    assert e.value.dataset == "musique" and "\n" not in str(e.value)
    assert "`posbias data fetch musique`" in e.value.fix and "`data_dir=DIR`" in e.value.fix
    assert str(stranger / "cache" / "data") in e.value.problem


@pytest.mark.parametrize("name", sorted(n for n, e in TASKS.items() if e.arg is None))
def test_each_task_declares_the_data_its_builder_reads(name, stranger):
    """A task whose declaration says it reads nothing builds on a machine without data; one that declares data sets
    is refused by `check_data` (what every pipeline calls before loading a model) and by its builder alike, naming the
    first of them; with them present both pass."""
    declared = TASKS[name].data_sets({})
    if not declared:
        check_data(name)
        get_task(name)
        return
    for refuse in (lambda: check_data(name), lambda: get_task(name)):
        with pytest.raises(data.DataMissing) as e:
            refuse()
        assert e.value.dataset in declared
    for d in declared:
        _copy(d, stranger / "cache" / "data")
    check_data(name)
    assert get_task(name).inputs, "a task that reads a data set records the files it read"


@pytest.mark.parametrize("spec, sets", [
    ("niah", ("nq",)), ("niah:haystack={HAY}", ()), ("niah:haystack={HAY},needle=nq", ("nq",)),
    ("niah:context=needle,needle=kv", ()), ("kv-uuid:pairs=20", ()), ("kv-uuid:pairs=140", ("kv-uuid",)),
    ("kv-uuid:pairs=75,source=generate", ()),
])
def test_declared_data_follows_the_options(spec, sets, stranger):
    hay = stranger / "hay.txt"
    hay.write_text("The sky was grey over the harbour. " * 400)
    spec = spec.format(HAY=hay)
    name, opts = spec.partition(":")[0], dict(kv.split("=") for kv in spec.partition(":")[2].split(",") if kv)
    opts = {k: int(v) if v.isdigit() else v for k, v in opts.items()}
    assert TASKS[name].data_sets(opts) == sets
    if sets:
        with pytest.raises(data.DataMissing):
            get_task(name, **opts)
    else:
        get_task(name, **opts)  # builds with no data anywhere


def test_gzip_lines_writes_what_gzip_open_wt_writes():
    """The builders' gzip writer against CPython 3.11's own `gzip.open(path, "wt")` (lines written one by one), on
    lines around the 8 KiB hand-over: the layout the data copies were written in."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the reference is CPython 3.11's gzip and io modules (3.12 buffers GzipFile writes)")
    rng = random.Random(0)
    for trial in range(20):
        lines = [("x" * rng.choice([1, 50, 4000, 8191, 8192, 9000])
                  + json.dumps({"i": i, "r": rng.random()}) + "\n") for i in range(rng.randint(1, 40))]
        buf = io.BytesIO()
        with gzip.GzipFile(filename="f.jsonl", mode="wb", fileobj=buf, mtime=1234567890) as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8")
            for line in lines:
                text.write(line)
            text.close()
        assert gzip_lines([x.encode() for x in lines], "f.jsonl", 1234567890) == buf.getvalue(), trial


@pytest.mark.parametrize("name", sorted(data.DATASETS))
def test_where_the_data_is_read_from_it_is_the_pinned_copy(name):
    """The copy this machine reads (our CI: ../shared/data) is byte for byte the one each registry entry pins."""
    need_data(name)
    assert [s.status for s in data.verify([name])] == ["ok"] * len(data.DATASETS[name].files)


def test_verify_catches_a_flipped_byte(stranger):
    _copy("kv-uuid", stranger / "mine")
    path = stranger / "mine" / "kv" / "kv-retrieval-75_keys.jsonl.gz"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    states = {s.file: s.status for s in data.verify(["kv-uuid"], stranger / "mine")}
    assert states == {"kv/kv-retrieval-75_keys.jsonl.gz": "mismatch", "kv/kv-retrieval-140_keys.jsonl.gz": "ok"}


def test_a_sweep_records_the_data_it_read_and_a_resume_refuses_other_data(tmp_path):
    """run.json and sweep.json name each file the task read with its SHA-256; a resume on a file with other bytes under
    the same name is refused (a resume on an identical copy elsewhere is not)."""
    need_data("kv-uuid")
    mine = tmp_path / "mine"
    _copy("kv-uuid", mine)
    cfg = SweepConfig(task="kv-uuid", task_options={"pairs": 75}, positions=[0], n=1, data_dir=str(mine))
    out = tmp_path / "run"
    loaded = tiny_loaded(max_pos=8192)
    res = run_sweep(cfg, out, loaded=loaded, progress=False)
    marker = json.loads((out / "run.json").read_text())
    pinned = next(f.sha256 for f in data.DATASETS["kv-uuid"].files if f.name.endswith("75_keys.jsonl.gz"))
    assert marker["inputs"] == [{"data_set": "kv-uuid", "file": "kv/kv-retrieval-75_keys.jsonl.gz",
                                 "path": str((mine / "kv" / "kv-retrieval-75_keys.jsonl.gz").resolve()), "sha256": pinned}]
    assert res.record["inputs"] == marker["inputs"]
    run_sweep(cfg, out, loaded=loaded, progress=False, resume=True)  # the same data: resumes
    path = mine / "kv" / "kv-retrieval-75_keys.jsonl.gz"
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    path.write_bytes(gzip.compress(b"".join(lines[:-1]) + lines[0]))  # the same name, other records (still 500)
    with pytest.raises(PosbiasError, match="of other data: kv/kv-retrieval-75_keys.jsonl.gz had SHA-256"):
        run_sweep(cfg, out, loaded=loaded, progress=False, resume=True)


COMMANDS = [  # every command that reads a task, on a task whose data set is absent (a stranger's machine)
    ["sweep", "--task", "nq"], ["compare", "--methods", "none,pi:1.1", "--task", "nq"],
    ["grid", "--task", "nq", "--sizes", "10,20"], ["show", "--task", "judge-nq"], ["lpes", "search", "--task", "nq"],
    ["hidden", "search", "--task", "kv-uuid"], ["distill", "r1", "--task", "nq"], ["distill", "r2", "--task", "musique"],
    ["moice", "train", "--task", "nq"], ["analyze", "attention", "--task", "nq"], ["analyze", "shifting", "--task", "nq"],
    ["analyze", "prior", "--task", "nq"], ["sweep", "--task", "niah", "--tokens", "1000"],
    ["sweep", "--task", "mc-nq"], ["sweep", "--task", "kv-uuid", "--pairs", "140"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a[:3]) for a in COMMANDS])
def test_every_command_refuses_missing_data_before_it_loads_anything(args, stranger, monkeypatch, capsys):
    """One line naming the data set and `posbias data fetch NAME` (and --data-dir), exit 2, no "loading ..." line, no
    model or tokenizer opened, nothing written."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posbias.cli import main

    def opened(*a, **k):
        raise AssertionError("a model or tokenizer was opened before the data was checked")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", opened)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", opened)
    out = stranger / "out"
    argv = ["posbias", *args] + ([] if args[0] == "show" else ["--out", str(out)])
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        main()
    text = capsys.readouterr()
    err = [line for line in text.err.splitlines() if line.strip()]
    name = {"musique": "musique", "kv-uuid": "kv-uuid"}.get(args[args.index("--task") + 1], "nq")
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"posbias: error: data set {name} is not here (looked in the user cache ")
    assert f"-- get it with `posbias data fetch {name}`, or pass --data-dir DIR" in err[0]
    assert "loading" not in text.out + text.err and not out.exists()


def test_a_test_that_needs_absent_data_is_skipped_naming_the_fetch_command_and_fails_under_ci(tmp_path):
    """The suite itself, in a child pytest with no data anywhere: skipped with the fetch command as its reason, and
    under CI=true (our CI always has ../shared/data) failed, naming the missing files."""
    import os
    import subprocess

    test = "tests/test_data.py::test_where_the_data_is_read_from_it_is_the_pinned_copy[musique]"
    root = str(Path(__file__).resolve().parents[1])
    base = {**os.environ, data.ENV: str(tmp_path / "empty"), "PYTHONPATH": os.pathsep.join(sys.path)}
    for ci, code, says in ((None, 0, "needs data set musique: posbias data fetch musique"),
                           ("true", 1, "data set(s) musique missing under CI=true (musique/musique_2hop_answerable.jsonl.gz)")):
        env = {k: v for k, v in base.items() if k != "CI"} | ({"CI": ci} if ci else {})
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test], cwd=root,
                             env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == code and says in run.stdout, run.stdout[-2000:]


def test_docs_data_md_lists_every_pinned_hash():
    """docs/data.md's two hash blocks are the registry's: each data file, then each source under its mirror path."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    blocks = [b for b in re.findall(r"^```[a-z]*\n(.*?)^```$", text, re.S | re.M) if re.match(r"[0-9a-f]{64}  ", b)]
    files = "".join(f"{f.sha256}  {f.name}\n" for ds in data.DATASETS.values() for f in ds.files)
    sources = {f"{s.sha256}  {s.repo}/{s.commit}/{s.path}\n": None for ds in data.DATASETS.values()
               for f in ds.files for s in f.sources}
    assert blocks == [files, "".join(sources)]
