"""`posbias data fetch` against a real HTTP server on 127.0.0.1 (the standard library's) serving files in the original
repositories' layout (BASE/OWNER/REPO/COMMIT/PATH, GitHub's raw layout), with the registry's base URL pointed at it:
fetch, byte identity with the copy the documented figures came from, a second fetch that downloads nothing, a cut
connection, a corrupted download, 404, no network, a proxy that refuses, a kill mid-download, a damaged file rebuilt,
and a task run on the fetched copy.

What the server serves: the originals themselves where $POSBIAS_TEST_ORIGINALS names a mirror of them (docs/data.md
says how one was made and checked), else stand-ins made from this machine's copy: the verbatim files are the originals
byte for byte (kv, the licence), and for each built file a source that the builder maps onto the copy (the copy's
records, with the records the builder drops put back: the fork's 100 other questions and its cut last line, the oracle's
100 held-back questions, MuSiQue's other hops, unanswerable and repeated records). Stand-ins have their own hashes, so
the registry's source pins are replaced by theirs; the pins of the files a task reads are never touched.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

import posbias.data as data
from conftest import need_data, tiny_loaded
from posbias import PosbiasError, SweepConfig, run_sweep
from posbias.data import build, registry
from posbias.data.lookup import sha256

SETS = sorted(data.DATASETS)
HERE = {name: data.locate(name) for name in SETS}


# --- the mirror ------------------------------------------------------------------------------------------------------

def _gz(records: list[dict], tail: bytes = b"") -> bytes:
    return gzip.compress(b"".join(build.jsonl(records)) + tail, mtime=0)


def _filler(record: dict, i: int) -> dict:
    return {**record, "question": f"stand-in question {i}"}


def _stand_ins(nq: Path) -> dict[str, bytes]:
    """{source path: bytes} whose builders give this machine's copy back (module docstring)."""
    nq20 = build.gz_records(nq / "nq/nq-open-20docs-gold_at_0.jsonl.gz")
    oracle = build.gz_records(nq / "nq/nq-open-oracle.jsonl.gz")
    fork = [{**r, "model_answer": "x"} for r in nq20] + [_filler(nq20[0], i) for i in range(100)]
    held = [_filler(oracle[0], i) for i in build.HELD_BACK]
    musique = build.gz_records(HERE["musique"] / "musique/musique_2hop_answerable.jsonl.gz")
    by_source: dict[str, list[dict]] = {}
    for r in musique:
        by_source.setdefault(r["_source"].partition(":")[2], []).append(
            {k: v for k, v in r.items() if not k.startswith("_")})
    first = musique[0]
    extra = [{**first, "id": "3hop1__1_2_3"}, {**first, "id": "2hop__9_9", "answerable": False},
             {k: v for k, v in first.items() if not k.startswith("_")}]  # another hop count, unanswerable, a repeat
    out = {registry.FORK_GOLD0.path: _gz(fork, b'{"question": "cut sho'),
           registry.ORACLE.path: _gz(oracle[:build.NQ_QUESTIONS] + held + oracle[build.NQ_QUESTIONS:])}
    for source, _ in registry.MUSIQUE:
        out[source.path] = json.dumps(by_source[source.path] + extra).encode()
    return out


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> tuple[Path, dict]:
    """(the mirror's folder, {(repo, path): Source} the stand-ins' pins to use instead of the registry's)."""
    originals = os.environ.get("POSBIAS_TEST_ORIGINALS")
    if originals:
        return Path(originals), {}
    need_data(*SETS)
    root = tmp_path_factory.mktemp("mirror")
    stand_ins = _stand_ins(HERE["nq"])
    pins = {}
    for ds in data.DATASETS.values():
        for f in ds.files:
            for s in f.sources:
                if f.build is None:  # verbatim: this machine's copy is the original
                    body = (HERE[ds.name] / f.name).read_bytes()
                else:
                    body = stand_ins[s.path]
                    pins[(s.repo, s.path)] = replace(s, sha256=hashlib.sha256(body).hexdigest(), size=len(body))
                path = root / s.repo / s.commit / s.path
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body)
    return root, pins


@pytest.fixture
def pinned(mirror, monkeypatch):
    """The registry with the stand-ins' source pins (none with real originals)."""
    _, pins = mirror
    for name, ds in list(data.DATASETS.items()):
        files = tuple(replace(f, sources=tuple(pins.get((s.repo, s.path), s) for s in f.sources)) for f in ds.files)
        monkeypatch.setitem(data.DATASETS, name, replace(ds, files=files))
    if pins:  # the MuSiQue builder reads its sources' names from MUSIQUE
        monkeypatch.setattr(registry, "MUSIQUE", tuple((pins.get((s.repo, s.path), s), split)
                                                      for s, split in registry.MUSIQUE))


class Server:
    """A real HTTP server on 127.0.0.1 over the mirror, with faults to inject once per path and a request log."""

    def __init__(self, root: Path):
        self.root, self.requests, self.faults, self.stalled = root, [], {}, threading.Event()
        self.release = threading.Event()
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(server.root), **kw)

            def log_message(self, *a):
                pass

            def do_GET(self):
                server.requests.append(self.path)
                fault = next((server.faults.pop(k) for k in list(server.faults) if self.path.endswith(k)), None)
                if fault is None:
                    return super().do_GET()
                body = (server.root / self.path.lstrip("/")).read_bytes()
                if fault == "corrupt":
                    body = body[:100] + bytes([body[100] ^ 1]) + body[101:]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                half = body[: len(body) // 2] if fault in ("cut", "stall") else body
                self.wfile.write(half)
                self.wfile.flush()
                if fault == "stall":  # hold the connection until the test has killed the client
                    server.stalled.set()
                    server.release.wait(30)
                self.close_connection = True

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(mirror, pinned, monkeypatch):
    s = Server(mirror[0])
    monkeypatch.setenv("POSBIAS_DATA_URL", s.url)
    yield s
    s.close()


def _leftovers(folder: Path) -> list[str]:
    """Files under `folder` that are not a data file's or a kept source's name: temporaries, partial files."""
    names = {f.name for ds in data.DATASETS.values() for f in ds.files}
    keys = {s.key for ds in data.DATASETS.values() for f in ds.files for s in f.sources if f.build}
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and str(p.relative_to(folder)) not in names | keys)


# --- the tests ---------------------------------------------------------------------------------------------------------

def test_fetch_gives_the_pinned_copy_and_a_second_fetch_downloads_nothing(server, tmp_path):
    states = data.fetch(["all"], tmp_path, retries=0, show_progress=False)
    assert {s.status for s in states} <= {"built", "downloaded"} and len(states) == sum(
        len(ds.files) for ds in data.DATASETS.values())
    for name in SETS:
        for f in data.DATASETS[name].files:
            assert (tmp_path / f.name).read_bytes() == (HERE[name] / f.name).read_bytes(), f.name
    assert _leftovers(tmp_path) == []
    asked = len(server.requests)
    again = data.fetch(["all"], tmp_path, retries=0, show_progress=False)
    assert {s.status for s in again} == {"present"} and len(server.requests) == asked


def test_a_cut_connection_keeps_nothing_and_the_next_fetch_completes(server, tmp_path):
    server.faults["kv-retrieval-75_keys.jsonl.gz"] = "cut"
    with pytest.raises(PosbiasError, match=r"the download of http://127\.0\.0\.1:\d+/nelson-liu/.*75_keys\.jsonl\.gz "
                                           r"was cut short .*nothing partial was kept -- run `posbias data fetch kv-uuid`"):
        data.fetch(["kv-uuid"], tmp_path, retries=0, show_progress=False)
    assert not (tmp_path / "kv").exists() or _leftovers(tmp_path) == [] and not list((tmp_path / "kv").iterdir())
    assert data.locate("kv-uuid", tmp_path) is None
    assert {s.status for s in data.fetch(["kv-uuid"], tmp_path, retries=0, show_progress=False)} == {"downloaded"}
    server.faults["nq-open-oracle.jsonl.gz"] = "cut"  # a retry within one fetch starts the download again
    states = data.fetch(["nq"], tmp_path, retries=1, show_progress=False)
    assert {s.status for s in states} <= {"built", "downloaded"} and _leftovers(tmp_path) == []


def test_a_corrupted_download_is_refused_and_not_kept(server, tmp_path):
    server.faults["kv-retrieval-140_keys.jsonl.gz"] = "corrupt"
    with pytest.raises(PosbiasError, match=r"140_keys\.jsonl\.gz sent a file whose SHA-256 is [0-9a-f]{12}\.\.\., not the "
                                           r"pinned 66d54aae7e38\.\.\. .*nothing was kept -- run `posbias data fetch"):
        data.fetch(["kv-uuid"], tmp_path, retries=0, show_progress=False)
    assert not (tmp_path / "kv" / "kv-retrieval-140_keys.jsonl.gz").exists() and _leftovers(tmp_path) == []
    data.fetch(["kv-uuid"], tmp_path, retries=0, show_progress=False)
    assert [s.status for s in data.verify(["kv-uuid"], tmp_path)] == ["ok", "ok"]


def test_a_404_names_the_url_and_the_mirror_setting(server, tmp_path, monkeypatch):
    monkeypatch.setenv("POSBIAS_DATA_URL", server.url + "/elsewhere")
    with pytest.raises(PosbiasError) as e:
        data.fetch(["musique"], tmp_path, retries=0, show_progress=False)
    assert str(e.value).startswith(f"{server.url}/elsewhere/AdelWang/MIGRES/") and "answered HTTP 404" in str(e.value)
    assert "POSBIAS_DATA_URL" in e.value.fix and "\n" not in str(e.value)
    assert data.locate("musique", tmp_path) is None and _leftovers(tmp_path) == []


def test_no_network_and_a_refusing_proxy_each_end_in_one_line(pinned, tmp_path, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on: the connection is refused, as with no network
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(PosbiasError, match=r"cannot reach http://127\.0\.0\.1:\d+/nelson-liu/.* \(\[Errno 111\] Connection "
                                           r"refused\) -- connect to the network"):
        data.fetch(["kv-uuid"], tmp_path, base=closed, retries=0, show_progress=False)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTP_PROXY", closed)
    with pytest.raises(PosbiasError, match=r"the proxy refused http://example\.org/nelson-liu/.* -- check HTTPS_PROXY"):
        data.fetch(["kv-uuid"], tmp_path, base="http://example.org", retries=0, show_progress=False)
    assert _leftovers(tmp_path) == [] and data.locate("kv-uuid", tmp_path) is None


def test_a_damaged_built_file_is_rebuilt_from_its_kept_sources_without_the_network(server, tmp_path):
    data.fetch(["nq"], tmp_path, retries=0, show_progress=False)
    path = tmp_path / "nq" / "nq-open-oracle.jsonl.gz"
    raw = bytearray(path.read_bytes())
    raw[-20] ^= 0x10
    path.write_bytes(bytes(raw))
    assert {s.file: s.status for s in data.verify(["nq"], tmp_path)}["nq/nq-open-oracle.jsonl.gz"] == "mismatch"
    asked = len(server.requests)
    states = {s.file: s.status for s in data.fetch(["nq"], tmp_path, retries=0, show_progress=False)}
    assert states["nq/nq-open-oracle.jsonl.gz"] == "built" and len(server.requests) == asked
    assert sha256(path) == next(f.sha256 for f in data.DATASETS["nq"].files if f.name == "nq/nq-open-oracle.jsonl.gz")


def test_a_fetch_killed_mid_download_leaves_nothing_and_the_next_one_completes(server, tmp_path):
    server.faults["kv-retrieval-140_keys.jsonl.gz"] = "stall"
    env = {**os.environ, "POSBIAS_DATA_URL": server.url, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "posbias.cli", "data", "fetch", "kv-uuid", "--data-dir", str(tmp_path),
                             "--retries", "0", "--quiet"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert server.stalled.wait(60), proc.communicate(timeout=5)
        time.sleep(0.3)  # the half it was sent reaches its temporary file
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        server.release.set()
    assert data.locate("kv-uuid", tmp_path) is None
    assert not (tmp_path / "kv" / "kv-retrieval-140_keys.jsonl.gz").exists()
    states = data.fetch(["kv-uuid"], tmp_path, retries=0, show_progress=False)
    assert [s.status for s in states] == ["present", "downloaded"] and _leftovers(tmp_path) == []


def test_a_task_on_the_fetched_copy_scores_the_rows_it_scores_on_this_machine_s_copy(server, tmp_path):
    data.fetch(["nq"], tmp_path / "data", retries=0, show_progress=False)
    loaded = tiny_loaded(max_pos=8192)
    runs = {}
    for where, folder in (("fetched", str(tmp_path / "data")), ("here", str(HERE["nq"]))):
        cfg = SweepConfig(task="nq", positions=[0, 9], n=1, data_dir=folder)
        runs[where] = run_sweep(cfg, tmp_path / where, loaded=loaded, progress=False)
    assert runs["fetched"].rows == runs["here"].rows
    assert [i["sha256"] for i in runs["fetched"].record["inputs"]] == [i["sha256"] for i in runs["here"].record["inputs"]]
