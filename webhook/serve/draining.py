"""Whether this worker is draining (SIGTERM): /readyz fails while requests are still served
(webhook.serve.app Readiness). Set by the worker (webhook.serve.front.FrontWorker.handle_exit)."""

from __future__ import annotations

import threading

DRAINING = threading.Event()
