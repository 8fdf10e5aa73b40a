"""Open an HTML file in headless Chromium and report what a reader would see: the images (decoded or not),
console errors and uncaught exceptions; or take a full-page screenshot.

Drives the system browser (Debian package `chromium`) over the Chrome DevTools Protocol: the browser
is started with --remote-debugging-port=0 and a throwaway profile, the port is read from the
profile's DevToolsActivePort file, and `websocket-client` (PyPI) carries the commands. Every wait has a
deadline; the browser is killed and its profile removed whatever happens.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import websocket

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--disable-background-networking", "--disable-dev-shm-usage", "--mute-audio")

# every <img>: wait for its decode, then whether it decoded and its natural size
IMAGES_JS = """Promise.all(Array.from(document.images).map(i => i.decode().then(() => true, () => false)
  .then(ok => ({ok: ok && i.naturalWidth > 0, w: i.naturalWidth, h: i.naturalHeight, alt: i.alt}))))"""


def find_chromium() -> str | None:
    """The browser binary: $CHROMIUM, else the first of CANDIDATES on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


def png_problem(data: bytes) -> str | None:
    """Why `data` is not a complete PNG (signature, every chunk's CRC, IHDR first, IEND last), None if it is.
    A browser shows a truncated PNG as a partial image without any error, so this is checked apart."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "no PNG signature"
    i, names = 8, []
    while i + 12 <= len(data):
        n = int.from_bytes(data[i:i + 4], "big")
        name, body = data[i + 4:i + 8], data[i + 8:i + 8 + n]
        if len(body) < n or i + 12 + n > len(data):
            return f"chunk {name!r} cut short"
        if zlib.crc32(name + body) != int.from_bytes(data[i + 8 + n:i + 12 + n], "big"):
            return f"bad CRC in chunk {name!r}"
        names.append(name)
        i += 12 + n
    if not names or names[0] != b"IHDR" or names[-1] != b"IEND" or i != len(data):
        return "truncated (no IEND at the end)"
    return None


def embedded_png_problems(html: str) -> list[str]:
    """Every PNG data URI in `html` that is not a complete PNG: "image k: why"."""
    uris = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]*)", html)
    out = []
    for k, b64 in enumerate(uris):
        try:
            problem = png_problem(base64.b64decode(b64, validate=True))
        except ValueError as e:
            problem = f"not base64 ({e})"
        if problem:
            out.append(f"image {k}: {problem}")
    return out


@dataclass
class Page:
    """One page over DevTools: `call` waits for a command's answer; events arriving meanwhile are kept."""

    ws: "websocket.WebSocket"
    deadline: float
    events: list[dict] = field(default_factory=list)
    next_id: int = 0

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = self._next()
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, event: str) -> dict:
        for i, e in enumerate(self.events):
            if e["method"] == event:
                return self.events.pop(i)
        while True:
            msg = self._next()
            if msg.get("method") == event:
                return msg
            if "method" in msg:
                self.events.append(msg)

    def _next(self) -> dict:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the browser did not answer in time")
        self.ws.settimeout(left)
        return json.loads(self.ws.recv())


@contextmanager
def browser_page(timeout: float = 60.0, chromium: str | None = None) -> Iterator[Page]:
    """A headless Chromium with one blank page, driven over DevTools; killed on exit."""
    binary = chromium or find_chromium()
    if not binary:
        raise FileNotFoundError("no chromium binary (apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="posbias-chromium-")
    proc = subprocess.Popen([binary, *FLAGS, "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ws = None
    try:
        deadline = time.monotonic() + timeout
        port = _devtools_port(Path(profile) / "DevToolsActivePort", proc, deadline)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            target = next(t for t in json.load(r) if t.get("type") == "page")
        ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=10, suppress_origin=True)
        yield Page(ws, deadline)
    finally:
        if ws is not None:
            ws.close()
        proc.kill()
        proc.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)


def _devtools_port(path: Path, proc: subprocess.Popen, deadline: float) -> int:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited at start (status {proc.returncode})")
        if path.is_file():
            lines = path.read_text().splitlines()
            if lines and lines[0].isdigit():
                return int(lines[0])
        time.sleep(0.1)
    raise TimeoutError("chromium did not open its DevTools port in time")


@dataclass
class PageCheck:
    images: list[dict]  # per <img>: ok (decoded, naturalWidth > 0), w, h, alt
    errors: list[str]  # console errors, uncaught exceptions, error log entries

    @property
    def broken_images(self) -> list[dict]:
        return [i for i in self.images if not i["ok"]]


def _open(page: Page, html_file: str | Path) -> None:
    for domain in ("Page", "Runtime", "Log"):
        page.call(f"{domain}.enable")
    page.call("Page.navigate", url=Path(html_file).resolve().as_uri())
    page.wait_for("Page.loadEventFired")


def _errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append("log: " + str(p["entry"].get("text")))
    return out


def check_page(html_file: str | Path, timeout: float = 60.0) -> PageCheck:
    """Open `html_file` and return its images' decode state and every error the page raised."""
    with browser_page(timeout) as page:
        _open(page, html_file)
        res = page.call("Runtime.evaluate", expression=IMAGES_JS, awaitPromise=True, returnByValue=True)
        images = res["result"]["value"]
        page.call("Runtime.evaluate", expression="0")  # flush: events queued before this answer are in page.events
        return PageCheck(images, _errors(page.events))


def screenshot(html_file: str | Path, png: str | Path, width: int = 1200, timeout: float = 60.0) -> Path:
    """A full-page PNG screenshot of `html_file` at `width` CSS pixels."""
    with browser_page(timeout) as page:
        page.call("Emulation.setDeviceMetricsOverride", width=width, height=800, deviceScaleFactor=1, mobile=False)
        _open(page, html_file)
        page.call("Runtime.evaluate", expression="Promise.all(Array.from(document.images).map(i => i.decode().catch(() => 0)))",
                  awaitPromise=True)
        height = page.call("Runtime.evaluate", expression="document.documentElement.scrollHeight",
                           returnByValue=True)["result"]["value"]
        page.call("Emulation.setDeviceMetricsOverride", width=width, height=int(height), deviceScaleFactor=1, mobile=False)
        data = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
    Path(png).write_bytes(base64.b64decode(data))
    return Path(png)
