"""The event-loop front: the only code that knows sockets and HTTP/1.1.

FrontWorker is a gunicorn worker on its documented extension point, gunicorn.workers.base.Worker
(init_process, run, notify, handle_exit: the surface uvicorn's worker builds on). One asyncio loop
(uvloop's) per worker accepts, does the TLS handshakes, reads requests with httptools and writes answers; the Flask
app (WSGI) runs in threads, one executor per lane (LANES: the eviction guard's paths, the other
admission paths, and the rest: probes and metrics, never queued behind reviews), so policy code
never runs on the loop and a slow client costs a coroutine, not a thread. The front judges
nothing: whether an admission review may still be judged, and its answer when not, it asks the
ReviewGate of the review's path it was given (webhook.serve.lanes.Gate, wired by the composition
root); it imports no review logic (an import contract).

  listeners.py   accept loops, one SSLContext per listener, handshake timeout, kernel-wait drop
  connection.py  one coroutine per connection: timeouts, keep-alive, pipelining, JSON protocol errors
  http1.py       HTTP/1.1: requests read with httptools (llhttp), limits and refusals, answers as bytes
  capacity.py    connection cap and reclaim order over the front's own connection objects
  shared.py      what the connections share (Front): lanes, their queue and pace, the review gates
  wsgi.py        whole request -> PEP 3333 environ -> the app in its lane's executor
  kernel.py      what Linux's TCP_INFO tells of a connection's wait and a listener's queue

On SIGTERM (drain): /readyz fails at once (DRAINING), requests are served for
server.shutdownDelaySeconds more, then the listeners close, idle connections are closed, answers
in flight complete (with Connection: close) and the worker exits once none is left or after
gunicorn's graceful_timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import uvloop
from gunicorn.workers.base import Worker

from webhook import metrics
from webhook.serve.draining import DRAINING, run_exit_hooks
from webhook.serve.front.capacity import KEEPALIVE_CONNECTIONS, ConnectionTable, State
from webhook.serve.front.listeners import Listeners
from webhook.serve.front.shared import Front, ReviewGate

log = logging.getLogger("dra_guard.server")

HEARTBEAT = 1.0  # seconds between notify() calls (gunicorn restarts a worker silent for `timeout`)
SERVICE_THREADS = 2  # threads of the lane of /readyz, /healthz, /metrics: each answer takes about 1 ms

#: the lanes, each its own executor: the eviction guard's paths, the other admission paths, the rest
LANES = ("first", "reviews", "service")

__all__ = ["KEEPALIVE_CONNECTIONS", "FrontSettings", "FrontWorker", "ReviewGate"]


@dataclasses.dataclass(frozen=True)
class FrontSettings:
    """What the composition root (webhook.serve.server) gives the front, before the fork.

    context_for: listener port -> the SSLContext for a connection accepted there now (called per
    connection, in the worker: certificates are reloaded without a restart). gates: admission path ->
    what decides whether its review may still be judged and answers it if not (ReviewGate:
    webhook.serve.lanes.Gate). threads: the threads of each admission lane (server.threads): the
    eviction guard's and the other admission paths'. max_connections: the cap per worker. probe_port:
    server.probePort (0: none), whose connections are never refused for overload. Times in
    seconds, sizes in bytes."""

    context_for: Callable[[int], ssl.SSLContext]
    gates: Mapping[str, ReviewGate]
    threads: int
    max_connections: int
    max_request_bytes: int
    drop_after_seconds: float
    shutdown_delay_seconds: float
    graceful_timeout_seconds: float
    probe_port: int = 0


def make_front(app: Any, s: FrontSettings, *, multiprocess: bool) -> Front:
    """The Front of one worker serving the WSGI `app` with settings `s`: an executor per lane of
    LANES (the eviction guard's paths, the other admission paths, the rest), the connection table
    and the admission rule, before any listener starts (FrontWorker; tests run it in-process)."""
    lane_threads = {"first": s.threads, "reviews": s.threads, "service": SERVICE_THREADS}
    executors = {
        name: concurrent.futures.ThreadPoolExecutor(max_workers=lane_threads[name], thread_name_prefix=f"front-{name}")
        for name in LANES
    }

    return Front(
        app=app,
        table=ConnectionTable(s.max_connections),
        executors=executors,
        lane_threads=lane_threads,
        gates=s.gates,
        max_request_bytes=s.max_request_bytes,
        drop_after=s.drop_after_seconds,
        multiprocess=multiprocess,
    )


class FrontWorker(Worker):
    """A gunicorn worker running the front's asyncio loop. `settings` is set on a subclass made
    by the composition root (gunicorn takes a worker class, not an instance)."""

    settings: ClassVar[FrontSettings]

    def run(self) -> None:
        # uvloop's loop: the same asyncio API, its TLS layer and transports in Cython
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self._serve())

    def handle_exit(self, sig: int, frame: Any) -> None:
        """SIGTERM: drain (module docstring); called in the loop's thread between its callbacks."""
        if DRAINING.is_set():
            return
        DRAINING.set()
        log.info("SIGTERM: readiness off, draining", extra={"delaySeconds": self.settings.shutdown_delay_seconds})
        loop = getattr(self, "_loop", None)
        if loop is not None:
            loop.call_soon_threadsafe(self._drain_later)

    def _drain_later(self) -> None:
        asyncio.get_running_loop().call_later(self.settings.shutdown_delay_seconds, self._stopping.set)

    async def _serve(self) -> None:
        s = self.settings
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        front = make_front(self.wsgi, s, multiprocess=self.cfg.workers > 1)
        executors, table = front.executors, front.table
        # the loop's own sockets: duplicates of gunicorn's listeners (closed on drain, gunicorn's stay)
        sockets = [socket.socket(fileno=os.dup(listener.fileno())) for listener in self.sockets]
        listeners = Listeners(front, sockets, s.context_for, s.probe_port)
        metrics.ACCEPT_QUEUE.set_function(listeners.waiting)
        listeners.start()
        if DRAINING.is_set():  # SIGTERM came before the loop ran
            self._drain_later()
        try:
            while self.alive and not self._stopping.is_set():
                self.notify()
                if self.ppid != os.getppid():
                    log.info("gunicorn's master is gone: stopping")
                    break
                try:
                    async with asyncio.timeout(HEARTBEAT):
                        await self._stopping.wait()
                except TimeoutError:
                    pass
            # drain: no new connection or request; idle ones closed; requests being read or
            # judged are answered (with Connection: close)
            listeners.stop()
            front.closing = True
            deadline = self._loop.time() + s.graceful_timeout_seconds
            while len(table) and self._loop.time() < deadline:
                for conn in table:
                    if conn.state in (State.HANDSHAKE, State.NEW, State.IDLE) and not conn.closing:
                        conn.close_now()
                self.notify()
                await asyncio.sleep(0.05)
        finally:
            for executor in executors.values():
                executor.shutdown(wait=False, cancel_futures=True)
            run_exit_hooks()
