"""HTTP/1.1 for the event-loop front: requests read with httptools (llhttp, Node.js's parser, the
one uvicorn uses), answers written as bytes (a status line, headers, the body).

A RequestReader is fed a connection's bytes as they come (RequestReader.feed) and keeps the whole
requests in order (RequestReader.requests); the first request it refuses is kept after them
(RequestReader.error), so that pipelined requests before it are answered first. Limits (bytes;
why: docs/reliability.md "Settings"), each a ProtocolError:
  MAX_TARGET_BYTES    request target (414), checked as its bytes come
  MAX_HEADERS         header fields (431), as they come
  MAX_HEAD_BYTES      a head over it (431), counted while it is incomplete
  max_body            Content-Length over server.maxRequestBytes (413, from the head)
  Transfer-Encoding   chunked alone: 411 (the kube-apiserver always sends a Content-Length:
                      tests/e2e/test_webhook_request_framing.py); any other coding: 501
  malformed framing   400 (llhttp's reason): no CRLF, obsolete line folding, two Content-Length
                      fields, a Content-Length that is not digits, whitespace before a colon, a
                      control character in a header; no Host (HTTP/1.1) or two Hosts: 400
  unknown method      501; an HTTP version other than 1.0 and 1.1: 505 (0.9: 400)
An Upgrade (or CONNECT) request is answered as any other, without a body of its own (a body is
refused, 400), and the connection is closed after it: llhttp reads nothing after it.
"""

from __future__ import annotations

import collections
import dataclasses
import json

import httptools

MAX_TARGET_BYTES = 8190  # a longer request target is answered 414 (gunicorn's limit_request_line)
MAX_HEADERS = 100  # more header fields are answered 431 (gunicorn's limit_request_fields)
MAX_HEAD_BYTES = 64 * 1024  # a longer request head is answered 431 before it is complete

NO_BODY_STATUSES = frozenset({204, 304})  # and 1xx: RFC 9112 6.3, no Content-Length


class ProtocolError(Exception):
    """A request the front refuses before the app: status, reason, detail for the JSON body."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail


def error_bytes(status: int, reason: str, detail: str) -> bytes:
    """A whole HTTP/1.1 answer with {"error": "<reason>: <detail>"} that closes the connection."""
    body = json.dumps({"error": f"{reason}: {detail}"}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1") + body


def answer_bytes(status: int, reason: bytes, headers: list[tuple[bytes, bytes]], body: bytes, *, head: bool) -> bytes:
    """A whole HTTP/1.1 answer: `headers` as given (with any Connection header the caller chose)
    but the framing, which is ours: Content-Length is the body's length (for a HEAD request the
    app's Content-Length, the length of the GET's body, as RFC 9110 9.3.2 allows, and no body), no
    Transfer-Encoding; 1xx, 204 and 304 have neither."""
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
    length = str(len(body)).encode()
    for name, value in headers:
        lower = name.lower()
        if lower == b"content-length":
            if head:
                length = value
            continue
        if lower != b"transfer-encoding":
            lines.append(b"%s: %s\r\n" % (name, value))
    framed = status >= 200 and status not in NO_BODY_STATUSES
    if framed:
        lines.append(b"Content-Length: %s\r\n" % length)
    lines.append(b"\r\n")
    if framed and not head:
        lines.append(body)
    return b"".join(lines)


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A whole request: method and target as sent, http_version b"1.0" or b"1.1", headers with
    lower-case names in their order, keep_alive: the connection may carry another request after
    this one's answer (HTTP/1.1 without Connection: close, and no Upgrade)."""

    method: bytes
    target: bytes
    http_version: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    keep_alive: bool


class _Refused(Exception):
    """Raised in a parser callback to stop llhttp; the ProtocolError is RequestReader._refused."""


class RequestReader:
    """One connection's requests: feed() its bytes; whole requests in `requests` (oldest first),
    the refusal that ends the connection in `error` (after them), `in_message` while a request is
    begun but not whole, `ended` once llhttp reads nothing more (an Upgrade). max_body: bytes
    (server.maxRequestBytes)."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self.requests: collections.deque[Request] = collections.deque()
        self.error: ProtocolError | None = None
        self.in_message = False
        self.ended = False
        self._parser = httptools.HttpRequestParser(self)
        self._refused: ProtocolError | None = None
        self._head_done = False
        self._head_bytes = 0
        self._target = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        # what the checks of a head need, kept as its fields come (one pass: the front's CPU per review)
        self._fields_bytes = 0
        self._hosts = 0
        self._length = b"0"
        self._codings: list[bytes] = []
        self._version = "1.1"

    def feed(self, data: bytes) -> None:
        """Parse `data`; nothing after a refusal or an Upgrade is read."""
        if self.error is not None or self.ended:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.ended = True  # its request is whole (on_message_complete) and closes the connection
        except httptools.HttpParserInvalidMethodError:
            self.error = self._refused or ProtocolError(501, "Not Implemented", "unknown request method")
        except httptools.HttpParserError as exc:
            self.error = self._refused or ProtocolError(400, "Bad Request", str(exc) or "malformed request")
        else:
            if self.in_message and not self._head_done:
                # every byte of a read that leaves the head incomplete is counted (a request
                # pipelined behind the end of another in the same read counts that end too)
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    self.error = ProtocolError(
                        431, "Request Header Fields Too Large", f"request head over {MAX_HEAD_BYTES} bytes"
                    )

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        self._refused = ProtocolError(status, reason, detail)
        raise _Refused

    # ------------------------------------------------------------------ httptools' callbacks
    def on_message_begin(self) -> None:
        self.in_message = True
        self._head_done = False
        self._head_bytes = 0
        self._target = b""
        self._headers = []
        self._body = []
        self._fields_bytes = 0
        self._hosts = 0
        self._length = b"0"
        self._codings = []

    def on_url(self, part: bytes) -> None:
        self._target += part
        if len(self._target) > MAX_TARGET_BYTES:
            self._refuse(414, "URI Too Long", f"request target over {MAX_TARGET_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self._headers.append((name, value))
        self._fields_bytes += len(name) + len(value) + 4
        if name == b"host":
            self._hosts += 1
        elif name == b"content-length":
            self._length = value  # digits (llhttp's check), one field (a second is llhttp's 400)
        elif name == b"transfer-encoding":
            self._codings += [c.strip().lower() for c in value.split(b",")]
        if len(self._headers) > MAX_HEADERS:
            self._refuse(431, "Request Header Fields Too Large", f"more than {MAX_HEADERS} header fields")

    def on_headers_complete(self) -> None:
        self._head_done = True
        if len(self._target) + self._fields_bytes > MAX_HEAD_BYTES:  # came in one read
            self._refuse(431, "Request Header Fields Too Large", f"request head over {MAX_HEAD_BYTES} bytes")
        version = self._version = self._parser.get_http_version()
        if version == "0.9":
            self._refuse(400, "Bad Request", "no HTTP version in the request line")
        if version not in ("1.0", "1.1"):
            self._refuse(505, "HTTP Version Not Supported", f"HTTP/{version}: only HTTP/1.1 and HTTP/1.0 are served")
        if self._hosts > 1 or (self._hosts == 0 and version == "1.1"):
            self._refuse(400, "Bad Request", "an HTTP/1.1 request needs one Host header field")
        if self._codings == [b"chunked"]:
            self._refuse(411, "Length Required", "send the body with a Content-Length (no Transfer-Encoding)")
        if self._codings:
            self._refuse(501, "Not Implemented", "only Transfer-Encoding: chunked is known (and refused: send a Content-Length)")
        length = int(self._length)
        if length > self.max_body:
            self._refuse(413, "Content Too Large", f"body is larger than server.maxRequestBytes ({self.max_body} bytes)")
        if length and self._parser.should_upgrade():
            self._refuse(400, "Bad Request", "a request with Upgrade (not offered here) and a body")

    def on_body(self, part: bytes) -> None:
        self._body.append(part)

    def on_message_complete(self) -> None:
        self.in_message = False
        keep_alive = self._version == "1.1" and self._parser.should_keep_alive()
        self.requests.append(
            Request(
                method=self._parser.get_method(),
                target=self._target,
                http_version=b"1.1" if self._version == "1.1" else b"1.0",
                headers=self._headers,
                body=b"".join(self._body),
                keep_alive=keep_alive and not self._parser.should_upgrade(),
            )
        )
        self._body = []  # its parts are not kept while the request is answered (up to maxRequestBytes)
