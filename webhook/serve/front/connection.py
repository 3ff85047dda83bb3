"""One connection of the event-loop front: an asyncio Protocol fed by the TLS transport, and one
coroutine (serve) that reads requests with h11, has the app answer them in a thread, and writes
the answers. A slow, silent or trickling client costs this coroutine, never a thread.

Limits (seconds unless said; why: docs/reliability.md "Settings"):
  REQUEST_READ_LIMIT  from a request's first byte to its last (trickling clients): 408
  KEEPALIVE           a connection waits this long for its next request, then is closed
  CLIENT_SOCKET_TIMEOUT  a client that does not read its answer for this long is cut off
  MAX_TARGET_BYTES    request target (414); MAX_HEADERS header fields (431); a head over
                      MAX_HEAD_BYTES (431); a body over server.maxRequestBytes (413, before it
                      is read); Transfer-Encoding chunked (411: the kube-apiserver always sends
                      Content-Length, tests/e2e/test_webhook_request_framing.py); any other
                      transfer coding (501, h11's answer); malformed framing (400, h11's)
Every protocol error is answered with a JSON body {"error": "..."} and the connection is closed.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import os
import socket
import time
from typing import Any, cast

import h11

from webhook import metrics
from webhook.serve.front import wsgi
from webhook.serve.front.capacity import State
from webhook.serve.front.kernel import waited_in_kernel
from webhook.serve.front.shared import Front, Shedding
from webhook.serve.lanes import ANSWERED

log = logging.getLogger("dra_guard.server")

CLIENT_SOCKET_TIMEOUT = 2.0  # seconds a client may stall a handshake or the reading of its answer
REQUEST_READ_LIMIT = 5.0  # seconds from the first byte of a request to its last (trickling clients)
KEEPALIVE = 75.0  # seconds a kept-alive connection waits for its next request
MAX_TARGET_BYTES = 8190  # a longer request target is answered 414 (gunicorn's limit_request_line)
MAX_HEADERS = 100  # more header fields are answered 431 (gunicorn's limit_request_fields)
MAX_HEAD_BYTES = 64 * 1024  # a longer request head is answered 431 before it is complete
INCOMPLETE_SMALL = 64 * 1024  # bytes of an incomplete request any connection may keep
INCOMPLETE_BUDGET_SHARE = 4  # incomplete requests above INCOMPLETE_SMALL: this many maxRequestBytes in all


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


def _json_answer(data: bytes) -> wsgi.Answer:
    """A 200 answer with the JSON body `data` (an AdmissionReview)."""
    return wsgi.Answer(200, b"OK", [(b"Content-Type", b"application/json"), (b"Content-Length", str(len(data)).encode())], data)


class Connection(asyncio.Protocol):
    """One client connection (webhook.serve.front.capacity.Held). Made at accept, before the TLS
    handshake; connection_made runs once the handshake is done."""

    def __init__(self, front: Front, *, server: tuple[str, int]) -> None:
        self.front = front
        self.server = server
        self.state = State.HANDSHAKE
        self.since = time.monotonic()
        self.closing = False
        self.pending = 0
        self.handshake: asyncio.Task[Any] | None = None  # set by the listener: cancelled to reclaim
        self.transport: asyncio.Transport | None = None
        self.client: tuple[str, int] | None = None
        self._parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._data = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost = False
        self._started: float | None = None  # time.monotonic() of the current request's first byte
        self._socket: Any = None
        self._serving: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TLS transport is not an instance of asyncio.Transport, but has its methods
        self.transport = cast(asyncio.Transport, transport)
        self.client = transport.get_extra_info("peername")
        # a socket object of our own for TCP_INFO, made once: uvloop's transport gives a pseudo-socket
        # that builds a new socket object for every getsockopt (a few % of the worker's CPU per review)
        pseudo = transport.get_extra_info("socket")
        self._socket = socket.socket(fileno=os.dup(pseudo.fileno())) if pseudo is not None else None
        metrics.TLS_HANDSHAKES.inc()
        self._enter(State.NEW)
        self._serving = asyncio.get_running_loop().create_task(self.serve())  # kept: the loop holds tasks weakly

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if self.state in (State.NEW, State.IDLE):
            # its bytes may have waited in the kernel while the loop was busy (TCP_INFO): the
            # review's clock starts when they arrived, not when the loop read them
            self._started = now - (waited_in_kernel(self._socket) if self._socket is not None else 0.0)
            self._enter(State.READING)
        if self.state is State.READING:
            self.since = now
            self.pending += len(data)
        if self.transport is not None and (
            self.pending > self.front.max_request_bytes + 2 * MAX_HEAD_BYTES
            or (
                self.pending > INCOMPLETE_SMALL
                and self.front.table.incomplete_bytes() > INCOMPLETE_BUDGET_SHARE * self.front.max_request_bytes
            )
        ):
            # more than one request can hold, or the worker's budget for incomplete requests is
            # spent: read on once it is answered, or once others are (TCP flow control holds the
            # client meanwhile; REQUEST_READ_LIMIT still runs)
            self.transport.pause_reading()
            self.front.table.paused.add(self)
        self._parser.receive_data(data)
        self._data.set()

    def eof_received(self) -> bool | None:
        self._parser.receive_data(b"")
        self._data.set()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._socket is not None:
            self._socket.close()  # our duplicate only
            self._socket = None
        self._lost = True
        self.closing = True
        self._data.set()
        self._writable.set()
        self.front.table.release(self)

    def resume(self) -> None:
        """Read again (ConnectionTable.resume_paused), unless the connection is being answered."""
        if self.transport is not None and self.state is not State.BUSY:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # ------------------------------------------------------------------ capacity.Held
    def close_now(self) -> None:
        """Close at once: reclaimed at the connection limit, or given up on."""
        self.closing = True
        if self.transport is not None:
            self.transport.abort()
        elif self.handshake is not None:
            self.handshake.cancel()

    def hello(self) -> None:
        """Its ClientHello arrived (the listener, before the TLS handshake): a client that talks."""
        self._enter(State.HELLO)

    def _enter(self, state: State) -> None:
        self.state = state
        self.since = time.monotonic()

    # ------------------------------------------------------------------ the requests
    async def serve(self) -> None:
        """Answer requests until the client closes, a limit is passed or the worker drains."""
        try:
            while not self.closing and not self.front.closing:
                request = await self._next_request()
                if request is None:
                    break
                answered = await self._answer(*request)
                if not answered or self._parser.our_state is not h11.DONE or self._parser.their_state is not h11.DONE:
                    break
                self._parser.start_next_cycle()
                self.pending = 0
                self._enter(State.IDLE)
                if self.transport is not None:
                    self.transport.resume_reading()
                if self._parser.trailing_data[0]:  # a pipelined request already here
                    self._started = time.monotonic()
                    self._enter(State.READING)
        except ProtocolError as exc:
            self._refuse(exc.status, exc.reason, exc.detail)
            return
        except TimeoutError:
            metrics.CLIENT_TIMEOUTS.inc()
            log.warning("client timed out, connection closed: request not received within %g s", REQUEST_READ_LIMIT)
            self._refuse(408, "Request Timeout", f"request not received within {REQUEST_READ_LIMIT:g} s")
            return
        except Exception:
            log.exception("error serving a connection")
            self._refuse(500, "Internal Server Error", "see the dra-guard logs")
            return
        if self.transport is not None and not self._lost:
            self.transport.close()

    async def _event(self) -> Any:
        """h11's next event, waiting for bytes: KEEPALIVE s before a request's first byte, then
        until REQUEST_READ_LIMIT s after it (TimeoutError). h11.PAUSED never comes here."""
        while True:
            try:
                event = self._parser.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint  # 400; 431 for a head too long; 501 for a transfer coding
                raise ProtocolError(status, http.HTTPStatus(status).phrase, str(exc) or "malformed request") from None
            if event is not h11.NEED_DATA:
                return event
            if self._lost:
                return h11.ConnectionClosed()
            self._data.clear()
            if self.state is State.READING and self._started is not None:
                async with asyncio.timeout_at(self._started + REQUEST_READ_LIMIT):
                    await self._data.wait()
            else:
                try:
                    async with asyncio.timeout(KEEPALIVE):
                        await self._data.wait()
                except TimeoutError:
                    return h11.ConnectionClosed()

    async def _next_request(self) -> tuple[h11.Request, bytes] | None:
        """The next whole request (its head and body), or None when the client closed."""
        event = await self._event()
        if isinstance(event, h11.ConnectionClosed):
            return None
        if not isinstance(event, h11.Request):
            raise ProtocolError(400, "Bad Request", f"unexpected {type(event).__name__}")
        if len(event.target) > MAX_TARGET_BYTES:
            raise ProtocolError(414, "URI Too Long", f"request target over {MAX_TARGET_BYTES} bytes")
        if len(event.headers) > MAX_HEADERS:
            raise ProtocolError(431, "Request Header Fields Too Large", f"more than {MAX_HEADERS} header fields")
        if sum(len(name) + len(value) + 4 for name, value in event.headers) > MAX_HEAD_BYTES:  # came in one read
            raise ProtocolError(431, "Request Header Fields Too Large", f"request head over {MAX_HEAD_BYTES} bytes")
        names = {name for name, _ in event.headers}
        if b"transfer-encoding" in names:
            raise ProtocolError(411, "Length Required", "send the body with a Content-Length (no Transfer-Encoding)")
        length = int(dict(event.headers).get(b"content-length", b"0"))
        if length > self.front.max_request_bytes:
            raise ProtocolError(
                413, "Content Too Large", f"body is larger than server.maxRequestBytes ({self.front.max_request_bytes} bytes)"
            )
        body: list[bytes] = []
        while True:
            part = await self._event()
            if isinstance(part, h11.Data):
                body.append(part.data)
            elif isinstance(part, h11.EndOfMessage):
                self.front.table.resume_paused()  # its bytes no longer count as incomplete
                return event, b"".join(body)
            else:  # the client closed in the middle of its body
                return None

    async def _answer(self, request: h11.Request, body: bytes) -> bool:
        """Have the app answer `request` in its lane's executor and write the answer; False when
        the request was dropped (it waited past server.dropAfterSeconds) or the client is gone."""
        assert self._started is not None and self.transport is not None
        self._enter(State.BUSY)
        self.transport.pause_reading()  # a pipelined request waits in the kernel meanwhile
        path = request.target.partition(b"?")[0].decode("latin-1")  # the admission paths need no unquoting
        lane = self.front.lane_of(path)
        answer = self._shed(path, lane, body) if request.method == b"POST" else None
        if answer is None:
            env = wsgi.environ(
                request, body, server=self.server, client=self.client, arrival=self._started, multiprocess=self.front.multiprocess
            )
            shedder = self.front.shedders.get(path)
            deadline = self._started + (shedder.budget if shedder is not None else self.front.drop_after)
            self.front.submitted(lane)
            submitted = time.monotonic()
            judging = asyncio.get_running_loop().run_in_executor(
                self.front.executors[lane], lambda: wsgi.call(self.front.app, env, drop_after=self.front.drop_after)
            )
            # the lane's thread is busy until the app is done, even when the front answered first
            judging.add_done_callback(lambda _: self.front.finished(lane, submitted, deadline))
            answer = await self._by_deadline(judging, env, body, shedder)
        if answer is None or self._lost:
            return False
        headers = [(k, v) for k, v in answer.headers if k.lower() != b"connection"]
        if self.front.closing:
            headers.append((b"Connection", b"close"))
        data = self._parser.send(h11.Response(status_code=answer.status, headers=headers, reason=answer.reason))
        if request.method != b"HEAD":
            data += self._parser.send(h11.Data(data=answer.body))
        data += self._parser.send(h11.EndOfMessage())
        self.transport.write(data)
        if not self._writable.is_set():
            try:
                async with asyncio.timeout(CLIENT_SOCKET_TIMEOUT):
                    await self._writable.wait()
            except TimeoutError:
                metrics.CLIENT_TIMEOUTS.inc()
                log.warning("client timed out, connection closed: answer not read within %g s", CLIENT_SOCKET_TIMEOUT)
                self.close_now()
                return False
        return not self._lost

    async def _by_deadline(
        self, judging: asyncio.Future[wsgi.Answer | None], env: dict[str, Any], body: bytes, shedder: Shedding | None
    ) -> wsgi.Answer | None:
        """The app's answer; for an admission review still being judged at its deadline (arrival +
        shedder.budget), the overload answer then (eviction 429, else the failure mode): the
        judgment runs on in its thread, which cannot be interrupted, and its answer is dropped
        (webhook.serve.lanes.ANSWERED). A body the overload answer cannot be made from without the
        app (not as the kube-apiserver writes it) waits for the app."""
        if shedder is None or self._started is None:
            return await judging
        try:
            async with asyncio.timeout_at(self._started + shedder.budget):
                return await asyncio.shield(judging)
        except TimeoutError:
            why = f"not judged within {shedder.budget_key}"
            data = shedder.answer(body, arrival=self._started, cause="deadline", why=why, judging=True)
            if data is None:
                return await judging
            env[ANSWERED] = True
            return _json_answer(data)

    def _shed(self, path: str, lane: str, body: bytes) -> wsgi.Answer | None:
        """The overload answer, made here on the loop before any work of the app, for an admission
        review the front's admission rule refuses (Front.shed_cause); None: the app answers."""
        shedder = self.front.shedders.get(path)
        if shedder is None or self._started is None:
            return None
        shed = self.front.shed_cause(lane, shedder, self._started, time.monotonic())
        if shed is None:
            return None
        cause, why = shed
        data = shedder.answer(body, arrival=self._started, cause=cause, why=why)
        return _json_answer(data) if data is not None else None

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        """Answer a protocol error (JSON) and close the connection (the answer is flushed first)."""
        if self.transport is None or self._lost:
            return
        if self._parser.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            self.transport.write(error_bytes(status, reason, detail))
        self.transport.close()
