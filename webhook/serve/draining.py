"""Whether this worker is draining (SIGTERM): /readyz fails while requests are still served
(webhook.serve.app Readiness). Set by the worker (webhook.serve.front.FrontWorker.handle_exit).

What must happen before the worker's process ends (giving up the periodic audit's Lease) is
registered with at_exit() and run by the worker once it has drained (run_exit_hooks): a daemon
thread cannot do it, the process may end before the thread runs again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

DRAINING = threading.Event()
_EXIT_HOOKS: list[Callable[[], None]] = []

log = logging.getLogger("dra_guard.server")


def at_exit(hook: Callable[[], None]) -> None:
    """Run `hook` (no arguments, quick, its own errors handled) when the worker has drained."""
    _EXIT_HOOKS.append(hook)


def run_exit_hooks() -> None:
    """Run the hooks of at_exit() once each, in order; one that raises is logged and the rest run."""
    while _EXIT_HOOKS:
        hook = _EXIT_HOOKS.pop(0)
        try:
            hook()
        except Exception:
            log.exception("exit hook failed", extra={"hook": getattr(hook, "__qualname__", repr(hook))})
