"""HTTP for served backends: JSON POSTs with retries and backoff, a request timeout, counters and an optional
on-disk response cache. Kept apart from the OpenAI wire format (openai.py) so a fault is handled in one place.

Retried `retries` times, with exponential backoff (0.5 s doubling, at most 30 s, or the server's Retry-After):
429, 5xx, 408 and refused / dropped connections in a run (an outage). Not retried as outages:
  - a connection refused when the backend opens (nothing listens at base_url): one quick retry, then one line;
  - a reply not in within `timeout` from a server that took the request: the server is slow, not down. It is asked
    once more only where the server drops a request its client abandoned (`resend_timeout`, the dialect's: vLLM
    aborts it, llama-cpp-python computes it to the end), then the run stops in one line advising a larger timeout;
  - 401 / 403 (the key), 404 (the model or route), other 4xx (the request), and a 500 from a server whose 500s are
    the request's fault (`refuses_500`: llama-cpp-python answers a validation error so): one line with the
    server's own reason and the fix (`explain`, the backend's, recognises a prompt over the server's window).
Once one request has failed for good the others are not sent again. The headers (the key's) are the backend's;
this module knows no wire format.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from ..errors import PosbiasError
from ..runs import write_json_atomic
from .base import RunStopped

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


def served_error(problem: str, fix: str, resumes: bool) -> PosbiasError:
    """A served run's error; `resumes`: whether its fix leaves the rows as they are (a transport key, the server
    itself), so a run folder's rows are kept (rerun with `resume`), or changes them (rerun with `overwrite`): the
    sweep's hint says which (eval/sweep.py, with_resume_hint)."""
    e = PosbiasError(problem, fix)
    e.fix_resumes = resumes
    return e


class Http:
    def __init__(self, base_url: str, headers: dict, api_key_env: str, timeout: float, retries: int, cache: str | None):
        import requests

        self.requests = requests
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.headers = {"Content-Type": "application/json", **headers}
        self.timeout, self.retries = timeout, retries
        self.refuses_500 = False  # set by the backend once it knows the server (backends/dialects.py)
        self.resend_timeout = True  # a request whose reply timed out is sent once more (the server dropped it)
        self.hint = "check the model spec's options against what this server supports"  # a refusal's fix
        self.explain: Callable[[int, str], PosbiasError | None] | None = None  # the backend's reading of a refusal
        # the backend's reading of a reply's token counts ({"prompt_tokens": n, "completion_tokens": m}; None: uncounted)
        self.usage: Callable[[dict], dict] = lambda reply: {}
        self.cache = Path(cache).expanduser() if cache else None
        self._local = threading.local()
        self._lock = threading.Lock()
        self.stopped = threading.Event()  # a request failed for good: the run stops, nothing more is sent (run clears it)
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

    def get(self, route: str, opening: bool = False) -> dict:
        """opening: the backend's first request (a refused connection there is a wrong URL or no server)."""
        return self._send("GET", route, None, opening=opening)

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
        self.count(replies=1, **{k: int(v or 0) for k, v in self.usage(reply).items()})
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, reply)
        return reply

    def _send(self, verb: str, route: str, body: dict | None, base: str | None = None, opening: bool = False) -> dict:
        url = f"{base or self.base_url}{route}"
        last, timeouts, refused = "", 0, False
        for attempt in range(self.retries + 1):
            if self.stopped.is_set():  # another request failed for good: its error is the run's
                raise RunStopped(f"{url}: not sent, the run stopped", "see the first error")
            if attempt:
                self.count(retries=1)
            self.count(requests=1)
            wait = min(30.0, 0.5 * 2 ** attempt)
            try:
                r = self._session().request(verb, url, json=body, headers=self.headers, timeout=self.timeout)
            except self.requests.ReadTimeout:  # connected and sent: the server is computing, or too busy to answer
                timeouts += 1
                if timeouts > int(self.resend_timeout):
                    raise self._fail(self._timed_out(url, attempt + 1)) from None
                last, wait = f"no reply within {self.timeout:g} s", 0.0  # asked again at once
            except self.requests.ConnectionError as e:  # a connect timeout included
                why = _unreachable(e)
                if opening and why and (refused or attempt == self.retries):  # at most one quick retry
                    raise self._fail(self._nothing_listens(why)) from None
                refused = refused or bool(why)
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
                    raise self._fail(self._refusal(r, url))
            if attempt < self.retries:
                time.sleep(wait)
        tries = f"{self.retries + 1} {'try' if self.retries == 0 else 'tries'}"
        more = f"retries={max(12, 2 * self.retries)}"
        raise self._fail(served_error(f"{url}: {last}, {tries}", f"check that the server at {self.base_url} is up and "
                                      f"reachable (or give it more tries with {more} in the model spec)", True))

    def _fail(self, e: PosbiasError) -> PosbiasError:
        self.stopped.set()
        return e

    def _timed_out(self, url: str, tries: int) -> PosbiasError:
        longer = f"timeout={max(120, round(4 * self.timeout))}"
        return served_error(f"{url}: no reply within {self.timeout:g} s ({tries} {'try' if tries == 1 else 'tries'}) from "
                            "a server that took the request: it is slower than the timeout allows",
                            f"give it more time with {longer} in the model spec", True)

    def _nothing_listens(self, why: str) -> PosbiasError:
        return PosbiasError(f"nothing listens at {self.base_url} ({why})", "start the server there (vLLM listens once its "
                            "engine has started, a minute or two), or fix base_url=... in the model spec")

    def _refusal(self, r, url: str) -> PosbiasError:
        msg = _message(r)
        if r.status_code in (401, 403):
            return served_error(f"{url} refused the API key (HTTP {r.status_code}: {msg})", f"set ${self.api_key_env} "
                                "to a valid key (or name another variable with api_key_env=... in the model spec)", True)
        if r.status_code == 404:
            return served_error(f"{url}: HTTP 404 ({msg})", "check base_url=... (it ends in /v1) and model=... (the served "
                                "name) in the model spec", False)
        known = self.explain(r.status_code, msg) if self.explain is not None else None
        return known or served_error(f"{url} rejected the request (HTTP {r.status_code}: {msg})", self.hint, False)


def _unreachable(e: BaseException) -> str | None:
    """Why nothing can answer at the address, where a requests ConnectionError says so along its causes: a refused
    connection (no server on that port) or a host name that does not resolve; None: another fault (a drop)."""
    seen, stack = set(), [e]
    while stack:
        c = stack.pop()
        if c is None or id(c) in seen:
            continue
        if isinstance(c, ConnectionRefusedError):
            return "connection refused"
        if isinstance(c, socket.gaierror):
            return "unknown host"
        seen.add(id(c))
        stack += [getattr(c, "reason", None), c.__cause__, c.__context__, *(a for a in c.args if isinstance(a, BaseException))]
    return None


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
