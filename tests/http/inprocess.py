"""The real event-loop front (uvloop, TLS, the lanes' executors, webhook.serve.front.make_front)
serving a WSGI app in this process, its loop in a thread: for tests that replace a policy with a
stand-in (tests/http/conftest.py: `held`) to put the server in a state at will, whatever the
machine's speed (every review held in its judgment, a judgment past its deadline)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import socket
import ssl
import threading
from collections.abc import Iterator

import uvloop

from certs import ensure_self_signed
from webhook.config import Config
from webhook.serve import front
from webhook.serve.front.listeners import Listeners
from webhook.serve.server import front_settings


@dataclasses.dataclass
class InProcessFront:
    """Where the in-process front listens (what tests.http.clients.connect reads)."""

    port: int
    ca_file: pathlib.Path


@contextlib.contextmanager
def serving(app: object, config: Config, folder: pathlib.Path) -> Iterator[InProcessFront]:
    """The front serving the WSGI `app` on 127.0.0.1 over TLS, its loop in a thread of this process."""
    ca_file = ensure_self_signed(folder, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    settings = front_settings(config, lambda port: context, graceful_timeout=1.0)
    listener = socket.create_server(("127.0.0.1", 0))
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[front.Front, Listeners]:
        served = front.make_front(app, settings, multiprocess=False)
        listeners = Listeners(served, [listener], settings.context_for)
        listeners.start()
        return served, listeners

    served, listeners = asyncio.run_coroutine_threadsafe(start(), loop).result(5)
    try:
        yield InProcessFront(port=listener.getsockname()[1], ca_file=ca_file)
    finally:

        async def stop() -> None:
            listeners.stop()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(5)
        for executor in served.executors.values():
            executor.shutdown(wait=False, cancel_futures=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
