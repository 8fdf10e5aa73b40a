"""HTTP for served backends: JSON POSTs with retries and backoff, a request timeout, counters and an optional
on-disk response cache. Kept apart from the OpenAI wire format (openai.py) so a fault is handled in one place.

Retried: 429, 5xx, timeouts and refused / dropped connections, with exponential backoff (0.5 s doubling, at most
30 s, or the server's Retry-After). Not retried: 401 / 403 (the key), 404 (the model or route), other 4xx (the
request), and a 500 from a server whose 500s are the request's fault (`refuses_500`: llama-cpp-python answers a
validation error so): each is a one-line PosbiasError with the server's own reason and the fix. The headers
(the key's) are the backend's; this module knows no wire format.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

from ..errors import PosbiasError
from ..runs import write_json_atomic

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class Http:
    def __init__(self, base_url: str, headers: dict, api_key_env: str, timeout: float, retries: int, cache: str | None):
        import requests

        self.requests = requests
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.headers = {"Content-Type": "application/json", **headers}
        self.timeout, self.retries = timeout, retries
        self.refuses_500 = False  # set by the backend once it knows the server (backends/dialects.py)
        self.hint = "check the model spec's options against what this server supports"  # a refusal's fix
        self.cache = Path(cache).expanduser() if cache else None
        self._local = threading.local()
        self._lock = threading.Lock()
        self.counts = {"requests": 0, "replies": 0, "retries": 0, "cache_hits": 0, "prompt_tokens": 0,
                       "completion_tokens": 0, "tokenize_checks": 0}

    def count(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self.counts[k] += v

    def _session(self):
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = self.requests.Session()
        return s

    def _cache_path(self, route: str, body: dict) -> Path | None:
        if self.cache is None:
            return None
        key = hashlib.sha256(json.dumps([self.base_url, route, body], sort_keys=True).encode()).hexdigest()
        return self.cache / key[:2] / f"{key}.json"

    def get(self, route: str) -> dict:
        return self._send("GET", route, None)

    def post(self, route: str, body: dict, root: bool = False) -> dict:
        """The server's JSON reply (from the cache when it holds this very request); root: a route from the
        server's root, not from base_url (a tokenize route)."""
        if root:
            return self._send("POST", route, body, self.base_url.removesuffix("/v1"))
        path = self._cache_path(route, body)
        if path is not None and path.is_file():
            self.count(cache_hits=1)
            return json.loads(path.read_text())
        reply = self._send("POST", route, body)
        usage = reply.get("usage") or {}
        self.count(replies=1, prompt_tokens=int(usage.get("prompt_tokens") or 0),
                   completion_tokens=int(usage.get("completion_tokens") or 0))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, reply)
        return reply

    def _send(self, verb: str, route: str, body: dict | None, base: str | None = None) -> dict:
        url = f"{base or self.base_url}{route}"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.count(retries=1)
            self.count(requests=1)
            wait = min(30.0, 0.5 * 2 ** attempt)
            try:
                r = self._session().request(verb, url, json=body, headers=self.headers, timeout=self.timeout)
            except self.requests.Timeout:
                last = f"no reply within {self.timeout:g} s"
            except self.requests.ConnectionError as e:
                last = f"cannot connect ({type(e).__name__})"
            else:
                if r.status_code < 400:
                    try:
                        return r.json()
                    except ValueError:
                        last = f"a reply that is not JSON (HTTP {r.status_code})"
                elif r.status_code in RETRY_STATUS and not (r.status_code == 500 and self.refuses_500):
                    last = f"HTTP {r.status_code}: {_message(r)}"
                    wait = max(wait, _retry_after(r))
                else:
                    raise self._refusal(r, url)
            if attempt < self.retries:
                time.sleep(wait)
        raise PosbiasError(f"{url}: {last}, {self.retries + 1} tries", "check that the server is up and reachable "
                           "(or raise timeout=... / retries=... in the model spec)")

    def _refusal(self, r, url: str) -> PosbiasError:
        msg = _message(r)
        if r.status_code in (401, 403):
            return PosbiasError(f"{url} refused the API key (HTTP {r.status_code}: {msg})", f"set ${self.api_key_env} to a "
                                "valid key (or name another variable with api_key_env=... in the model spec)")
        if r.status_code == 404:
            return PosbiasError(f"{url}: HTTP 404 ({msg})", "check base_url=... (it ends in /v1) and model=... (the served "
                                "name) in the model spec")
        return PosbiasError(f"{url} rejected the request (HTTP {r.status_code}: {msg})", self.hint)


def _retry_after(r) -> float:
    try:
        return min(60.0, float(r.headers.get("Retry-After", 0)))
    except ValueError:
        return 0.0


def _message(r) -> str:
    try:
        body = r.json()
        err = body.get("error", body) if isinstance(body, dict) else body
        msg = err.get("message", err) if isinstance(err, dict) else err
    except ValueError:
        msg = r.text
    return " ".join(str(msg).split())[:300]
