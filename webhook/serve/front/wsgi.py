"""A whole request -> a PEP 3333 environ -> the Flask app, called in a thread (never on the loop).

The environ carries the request's arrival time (ARRIVAL, time.monotonic() of its first byte) for
the app's deadlines (webhook.serve.lanes.arrived), and ANSWERED once the front has answered it
itself. A request that has already waited longer than
server.dropAfterSeconds when its thread takes it up is dropped unjudged: its apiserver has given
up on it, and serving it would only delay the ones still waited for.
"""

from __future__ import annotations

import dataclasses
import io
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from webhook import metrics
from webhook.serve.front.http1 import Request

#: the WSGI environ key with time.monotonic() (seconds, a float) of the request's arrival in the
#: worker: its first byte, or its wait in the kernel before it counted (set by environ())
ARRIVAL = "dra_guard.arrival"
#: the WSGI environ key the front sets (to True) once it has answered the request itself, at its
#: deadline, while the app was still judging it: the app's answer is dropped, and its age was
#: observed with the front's answer (dra_guard_review_age_seconds)
ANSWERED = "dra_guard.answered"

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the app answered: status code, reason, headers (bytes pairs) and the whole body."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


def environ(
    request: Request,
    *,
    server: tuple[str, int],
    client: tuple[str, int] | None,
    arrival: float,
    multiprocess: bool,
) -> dict[str, Any]:
    """The PEP 3333 environ of `request` (as webhook.serve.front.http1 read it, with its whole body). server: the
    listener's (host, port): SERVER_PORT tells the app which listener the request came to."""
    path, _, query = request.target.partition(b"?")
    env: dict[str, Any] = {
        "REQUEST_METHOD": request.method.decode("ascii"),
        "SCRIPT_NAME": "",
        "PATH_INFO": urllib.parse.unquote_to_bytes(path).decode("latin-1"),
        "QUERY_STRING": query.decode("latin-1"),
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": "HTTP/" + request.http_version.decode("ascii"),
        "REMOTE_ADDR": client[0] if client else "",
        "REMOTE_PORT": str(client[1]) if client else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "https",
        "wsgi.input": io.BytesIO(request.body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": multiprocess,
        "wsgi.run_once": False,
        ARRIVAL: arrival,
    }
    for raw_name, raw_value in request.headers:  # lower-case names (http1.RequestReader)
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        if name == "content-type":
            env["CONTENT_TYPE"] = value
        elif name == "content-length":
            env["CONTENT_LENGTH"] = value
        else:
            key = "HTTP_" + name.upper().replace("-", "_")
            env[key] = f"{env[key]},{value}" if key in env else value
    return env


def call(app: WsgiApp, env: dict[str, Any], *, drop_after: float) -> Answer | None:
    """Run `app` on `env` (in a worker thread) and collect its whole answer; None when the request
    waited past `drop_after` seconds since env[ARRIVAL] (dra_guard_requests_dropped_total)."""
    if time.monotonic() - env[ARRIVAL] > drop_after:
        metrics.DROPPED_REQUESTS.inc()
        return None
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        if exc_info and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [status, headers]
        return written.append

    written: list[bytes] = []
    result = app(env, start_response)
    try:
        written.extend(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    status, headers = started
    code, _, reason = status.partition(" ")
    return Answer(
        int(code), reason.encode("latin-1"), [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers], b"".join(written)
    )
