"""ClusterError, and the one translation of Kubernetes API and network failures into it.

Importable without loading the `kubernetes` package (the CLI's error handling imports it at start):
the exception types are imported only when a failure is translated.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


class ClusterError(RuntimeError):
    """The Kubernetes API could not be configured or reached, or refused a request; the message says
    why in one line. transient: the same request may succeed in a moment (the server unreachable,
    closing connections, not answering in time, 429 or 5xx: an apiserver restarting or
    overloaded), as opposed to credentials, RBAC, TLS verification or a resource not served."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def cause(exc: BaseException, *, timeout_seconds: float | None = None, details: bool = False) -> str:
    """Why an API request failed, in one line without the exception chain:

    "403 Forbidden (User "bob" cannot list ...)", "401 Unauthorized (...)" and "<status> <reason>
    (<the server's message>)" for an HTTP answer; "connection refused", "TLS verification failed
    (<what OpenSSL said>)", "no answer within <timeout_seconds> s", "cannot resolve <host>" for the
    network; "<type>: <text>" for anything else. timeout_seconds: the request's timeout, named in
    the timeout's text when given. details: also the messages of the Status's details.causes that
    its message does not contain (an eviction refused by a PodDisruptionBudget names the budget only
    there: "429 Too Many Requests (Cannot evict pod as it would violate the pod's disruption budget:
    The disruption budget keep-one needs 1 healthy pods and has 1 currently)").
    """
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import NewConnectionError, ProtocolError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    if isinstance(exc, ApiException):
        return _http_cause(exc, details=details)
    chain = list(_chain(exc))

    def first(*types: type[BaseException]) -> BaseException | None:
        # the whole chain for each kind in turn: urllib3's NewConnectionError is a timeout class too
        return next((link for link in chain if isinstance(link, types)), None)

    if isinstance(found := first(ssl.SSLCertVerificationError), ssl.SSLCertVerificationError):
        return f"TLS verification failed ({found.verify_message or found.reason})"
    if isinstance(found := first(ssl.SSLError), ssl.SSLError):
        return f"TLS error ({found.reason or found})"
    if first(ConnectionRefusedError):
        return "connection refused"
    if isinstance(found := first(socket.gaierror), socket.gaierror):
        return f"cannot resolve the server's host name ({found.strerror})"
    if found := first(ProtocolError, ConnectionError):
        return f"connection closed by the server ({_strip(found)})"
    if first(TimeoutError, Urllib3Timeout):
        return f"no answer within {timeout_seconds:g} s" if timeout_seconds else "no answer in time"
    if found := first(NewConnectionError):
        return _strip(found)
    if found := first(json.JSONDecodeError):
        return f"the answer is not JSON, is this a Kubernetes API server? ({found})"
    return f"{type(exc).__name__}: {exc}"


def api_failure(action: str, server: str, exc: BaseException, *, timeout_seconds: float | None = None) -> ClusterError:
    """ClusterError("cannot <action> from <server>: <cause>"), e.g. action "list clusterroles",
    server "https://127.0.0.1:6443" (see cause())."""
    where = f" from {server}" if server else ""
    return ClusterError(f"cannot {action}{where}: {cause(exc, timeout_seconds=timeout_seconds)}", transient=transient(exc))


def transient(exc: BaseException) -> bool:
    """Whether an API request that raised `exc` may succeed if sent again in a moment: an HTTP
    429 or 5xx answer, or a network failure other than TLS verification (refused, reset, closed,
    timed out, a host name not resolved yet)."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        status = getattr(exc, "status", None) or 0
        return status == 429 or status >= 500
    chain = list(_chain(exc))
    if any(isinstance(link, ssl.SSLCertVerificationError) for link in chain):
        return False
    return any(isinstance(link, (OSError, HTTPError)) for link in chain)


def until_reachable(attempt: Callable[[], T], *, seconds: float, note: Callable[[str], None]) -> T:
    """attempt() until it returns, while it raises a transient ClusterError and `seconds` have not
    passed since the first try (waits of 1, 2, 4, ... s, at most 10 s, never past the end); each
    failure told to note() in one line. Raises the last ClusterError when the time is up, and any
    other exception (a permanent ClusterError included) at once. seconds 0: one attempt."""
    end = time.monotonic() + seconds
    wait = 1.0
    while True:
        try:
            return attempt()
        except ClusterError as exc:
            left = end - time.monotonic()
            if not exc.transient or left <= 0:
                raise
            pause = min(wait, left, 10.0)
            note(f"{exc}; trying again in {pause:.0f} s (for {left:.0f} s more: cluster.startupWaitSeconds)")
            time.sleep(pause)
            wait *= 2


@contextlib.contextmanager
def calling(server: str, action: str, *, timeout_seconds: float | None = None) -> Iterator[None]:
    """A block of API requests: a ClusterError leaves as it is, any other exception as
    api_failure(action, server, exc) (chained)."""
    try:
        yield
    except ClusterError:
        raise
    except Exception as exc:
        raise api_failure(action, server, exc, timeout_seconds=timeout_seconds) from exc


def _http_cause(exc: BaseException, *, details: bool = False) -> str:
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None) or ""
    if not status:  # raised by the client itself (a missing parameter), not an answer
        return f"{reason or exc}".strip()
    message = _status_message(getattr(exc, "body", None))
    extra = [c for c in _status_causes(getattr(exc, "body", None)) if c not in message] if details else []
    if extra:
        message = f"{message.rstrip('.')}: {'; '.join(extra)}" if message else "; ".join(extra)
    if status == 403 and " is forbidden: " in message:
        message = message.split(" is forbidden: ", 1)[1]  # the resource is named by the action already
    if status == 401:
        message = "the credentials were not accepted"
    if not message or message == reason:
        return f"{status} {reason}".strip()
    return f"{status} {reason} ({message})".replace("  ", " ")


def _status_message(body: object) -> str:
    """The `message` of a metav1.Status body (bytes or text), on one line; "" when there is none."""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if not isinstance(body, str) or not body.strip():
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return " ".join(body.split())[:300]
    message = status.get("message") if isinstance(status, dict) else None
    return " ".join(str(message).split()) if message else ""


def _status_causes(body: object) -> list[str]:
    """The messages of a metav1.Status body's details.causes (each on one line); [] when none."""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        status = json.loads(body) if isinstance(body, str) else None
    except ValueError:
        return []
    details = status.get("details") if isinstance(status, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    if not isinstance(causes, list):
        return []
    return [" ".join(str(c["message"]).split()) for c in causes if isinstance(c, dict) and c.get("message")]


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """exc, then what it wraps: urllib3's `reason`, then __cause__ / __context__ (each once)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        link = todo.pop(0)
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        todo += [e for e in (getattr(link, "reason", None), link.__cause__, link.__context__) if isinstance(e, BaseException)]


def _strip(exc: BaseException) -> str:
    """An exception's text without urllib3's "<connection object>: " prefix."""
    text = str(exc)
    return text.split(": ", 1)[1] if text.startswith(("<", "HTTPSConnection", "HTTPConnection")) and ": " in text else text
