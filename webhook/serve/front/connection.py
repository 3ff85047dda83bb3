"""One connection of the event-loop front: an asyncio Protocol fed by the TLS transport, and one
coroutine (serve) that takes the requests read from its bytes (webhook.serve.front.http1:
httptools), has the app answer them in a thread one at a time, in order, and writes the answers.
A slow, silent or trickling client costs this coroutine, never a thread.

Limits (seconds unless said; why: docs/reliability.md "Settings"):
  REQUEST_READ_LIMIT  from a request's first byte to its last (trickling clients): 408
  KEEPALIVE           a connection waits this long for its next request, then is closed
  CLIENT_SOCKET_TIMEOUT  a client that does not read its answer for this long is cut off
  the request limits and framing refusals: webhook.serve.front.http1 (414, 431, 413, 411, 501,
                      505, 400)
Every protocol error is answered with a JSON body {"error": "..."} and the connection is closed
(after the answers to the requests pipelined before it). HTTP/1.0 requests, Connection: close and
Upgrade requests close the connection after their answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any, cast

from webhook import metrics
from webhook.serve.front import wsgi
from webhook.serve.front.capacity import State
from webhook.serve.front.http1 import MAX_HEAD_BYTES, ProtocolError, Request, RequestReader, answer_bytes, error_bytes
from webhook.serve.front.kernel import holds_a_request, waited_in_kernel
from webhook.serve.front.shared import Front, ReviewGate

log = logging.getLogger("dra_guard.server")

CLIENT_SOCKET_TIMEOUT = 2.0  # seconds a client may stall a handshake or the reading of its answer
REQUEST_READ_LIMIT = 5.0  # seconds from the first byte of a request to its last (trickling clients)
KEEPALIVE = 75.0  # seconds a kept-alive connection waits for its next request
INCOMPLETE_SMALL = 64 * 1024  # bytes of an incomplete request any connection may keep
INCOMPLETE_BUDGET_SHARE = 4  # incomplete requests above INCOMPLETE_SMALL: this many maxRequestBytes in all


def _time_out(waiter: asyncio.Future[None]) -> None:
    """The limit of a wait (Connection._wait) passed."""
    if not waiter.done():
        waiter.set_exception(TimeoutError())


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
        self._reader = RequestReader(front.max_request_bytes)
        # what serve() waits for (bytes of a request, or the transport writable again): a plain
        # future of the loop, set by the Protocol callbacks (wake); cheaper per request than an
        # asyncio.Event and asyncio.timeout, which a review pays on every turn of its connection
        self._waiter: asyncio.Future[None] | None = None
        self._writable = True
        self._lost = False
        self._eof = False
        self._wrote = False  # the current request's answer was written: no error answer after it
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
        self._reader.feed(data)
        self._wake()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._socket is not None:
            self._socket.close()  # our duplicate only
            self._socket = None
        self._lost = True
        self.closing = True
        self._writable = True
        self._wake()
        self.front.table.release(self)

    def resume(self) -> None:
        """Read again (ConnectionTable.resume_paused), unless the connection is being answered."""
        if self.transport is not None and self.state is not State.BUSY:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        self._wake()

    def _wake(self) -> None:
        """Wake serve() if it waits (_wait)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, until: float) -> None:
        """Wait for _wake(), at most until `until` (time.monotonic(), seconds): TimeoutError then."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_at(loop.time() + (until - time.monotonic()), _time_out, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    # ------------------------------------------------------------------ capacity.Held
    def close_now(self) -> None:
        """Close at once: reclaimed at the connection limit, or given up on."""
        self.closing = True
        if self.transport is not None:
            self.transport.abort()
        elif self.handshake is not None:
            self.handshake.cancel()

    def request_waiting(self) -> bool:
        """Whether a request's bytes wait in the socket's receive buffer unread (FIONREAD; False
        before the TLS handshake is done: the listener judges those connections by their own socket)."""
        return self._socket is not None and holds_a_request(self._socket)

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
                self._wrote = False
                request = await self._next_request()
                if request is None:
                    break
                answered = await self._answer(request)
                if not answered or not request.keep_alive:
                    break
                self.pending = 0
                self._enter(State.IDLE)
                if self.transport is not None:
                    self.transport.resume_reading()
                reader = self._reader
                if reader.requests or reader.in_message or reader.error is not None:  # a pipelined request already here
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

    async def _next_request(self) -> Request | None:
        """The next whole request (its head and body) read from the connection's bytes, waiting
        for them: KEEPALIVE s before a request's first byte, then until REQUEST_READ_LIMIT s after
        it (TimeoutError). None when the client closed (or an Upgrade ended the reading); the
        reader's refusal (ProtocolError) once the requests before it are taken."""
        reader = self._reader
        while True:
            if reader.requests:
                request = reader.requests.popleft()
                if self.front.table.paused:  # its bytes no longer count as incomplete
                    self.front.table.resume_paused()
                return request
            if reader.error is not None:
                raise reader.error
            if self._lost or self._eof or reader.ended:
                return None
            if self.state is State.READING and self._started is not None:
                await self._wait(self._started + REQUEST_READ_LIMIT)
            else:
                try:
                    await self._wait(time.monotonic() + KEEPALIVE)
                except TimeoutError:
                    return None

    async def _answer(self, request: Request) -> bool:
        """Have the app answer `request` in its lane's executor and write the answer; False when
        the request was dropped (it waited past server.dropAfterSeconds) or the client is gone."""
        assert self._started is not None and self.transport is not None
        self._enter(State.BUSY)
        self.transport.pause_reading()  # a pipelined request waits in the kernel meanwhile
        path = request.target.partition(b"?")[0].decode("latin-1")  # the admission paths need no unquoting
        lane, gate = self.front.route(path)
        if request.method != b"POST":
            gate = None  # not an admission review: the app answers it (405)
        answer = self._refused(gate, lane, request.body) if gate is not None else None
        if answer is None:
            env = wsgi.environ(
                request, server=self.server, client=self.client, arrival=self._started, multiprocess=self.front.multiprocess
            )
            deadline = self._started + (gate.budget if gate is not None else self.front.drop_after)
            answer = await self._judged(lane, env, request.body, gate, deadline)
        if answer is None or self._lost:
            return False
        headers = [(k, v) for k, v in answer.headers if k.lower() != b"connection"]
        if self.front.closing or not request.keep_alive:
            headers.append((b"Connection", b"close"))
        data = answer_bytes(answer.status, answer.reason, headers, answer.body, head=request.method == b"HEAD")
        self._wrote = True
        self.transport.write(data)
        if not self._writable:
            try:
                until = time.monotonic() + CLIENT_SOCKET_TIMEOUT
                while not self._writable:
                    await self._wait(until)
            except TimeoutError:
                metrics.CLIENT_TIMEOUTS.inc()
                log.warning("client timed out, connection closed: answer not read within %g s", CLIENT_SOCKET_TIMEOUT)
                self.close_now()
                return False
        return not self._lost

    async def _judged(
        self, lane: str, env: dict[str, Any], body: bytes, gate: ReviewGate | None, deadline: float
    ) -> wsgi.Answer | None:
        """The app's answer to the request of `env`, called once in `lane`'s executor; for an
        admission review still being judged at its `deadline` (arrival + gate.budget,
        time.monotonic()), the gate's overload answer then (eviction 429, else the failure mode):
        the judgment runs on in its thread, which cannot be interrupted, and its answer is dropped
        (wsgi.ANSWERED). A body the overload answer cannot be made from without the app (not as the
        kube-apiserver writes it) waits for the app.

        The thread hands its answer back with one call_soon_threadsafe onto a plain future of the
        loop, and the deadline is one timer of the loop: run_in_executor, asyncio.shield and
        asyncio.timeout_at cost several callbacks and futures more per review."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[wsgi.Answer | None] = loop.create_future()
        front, submitted = self.front, time.monotonic()

        def done(answer: wsgi.Answer | None, error: BaseException | None) -> None:  # on the loop
            # the lane's thread is busy until the app is done, even when the front answered first
            front.finished(lane, submitted, deadline)
            if answered.done():
                return
            if error is not None:
                answered.set_exception(error)
            else:
                answered.set_result(answer)

        def call() -> None:  # in the lane's thread
            try:
                answer = wsgi.call(front.app, env, drop_after=front.drop_after)
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, raised in serve()
                loop.call_soon_threadsafe(done, None, exc)
            else:
                loop.call_soon_threadsafe(done, answer, None)

        def at_deadline() -> None:  # on the loop
            if answered.done() or gate is None or self._started is None:
                return
            data = gate.answer_bytes(body, gate.at_deadline, arrival=self._started, judging=True)
            if data is not None:
                env[wsgi.ANSWERED] = True
                answered.set_result(_json_answer(data))

        front.submitted(lane)
        front.executors[lane].submit(call)
        timer = loop.call_at(loop.time() + (deadline - time.monotonic()), at_deadline) if gate is not None else None
        try:
            return await answered
        finally:
            if timer is not None:
                timer.cancel()

    def _refused(self, gate: ReviewGate, lane: str, body: bytes) -> wsgi.Answer | None:
        """The gate's overload answer, made here on the loop before any work of the app, for an
        admission review it refuses on arrival (Front.refusal); None: the app answers."""
        if self._started is None:
            return None
        refusal = self.front.refusal(lane, gate, self._started, time.monotonic())
        if refusal is None:
            return None
        data = gate.answer_bytes(body, refusal, arrival=self._started)
        return _json_answer(data) if data is not None else None

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        """Answer a protocol error (JSON) and close the connection (the answer is flushed first)."""
        if self.transport is None or self._lost:
            return
        if not self._wrote:
            self.transport.write(error_bytes(status, reason, detail))
        self.transport.close()
