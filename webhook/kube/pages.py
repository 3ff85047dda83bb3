"""One-shot paged LISTs with a client-side rate limit (client-go's QPS/Burst): what the informers
stream into their indexes and what `audit --cluster` and `drain-plan` read."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from webhook.kube.client import count
from webhook.kube.errors import calling

LIST_PAGE_SIZE = 500


class RateLimiter:
    """A token bucket for client-side API rate limits: `qps` requests per second, `burst` at once
    (like client-go's QPS/Burst). wait() blocks until a request may go."""

    def __init__(self, *, qps: float, burst: int) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps, self.burst = qps, burst
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def wait(self) -> None:
        """Take one token, sleeping until one is available."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            delay = 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.qps
            self._tokens -= 1
        if delay:
            time.sleep(delay)


class Pages:
    """A LIST of one resource in pages of LIST_PAGE_SIZE, iterated item by item: only the current
    page's raw objects are in memory, so a consumer that keeps a compact form of each object (the
    informers' indexes) never holds the whole list (peak RSS at start-up).

    Iterate once; afterwards `resource_version` is the list's resourceVersion and `count` the
    number of items. Each page is counted in dra_guard_kube_api_requests_total; API errors
    propagate as they come (the informers need a 410 as such).

    `deadline` (a time.monotonic() value) bounds the whole list, not just each page: every page
    waits at most until then, and when it has passed before the next page is asked for, the
    iteration ends early with `truncated` True and `resource_version` None.

    `after_page`: called (no arguments) when the consumer has taken every item of a page, before
    the next page is asked for (the informers settle the garbage collector there:
    webhook.kube.informer.settle_page).
    """

    def __init__(
        self,
        list_func: Callable[..., Any],
        *,
        resource: str,
        timeout_seconds: float,
        limiter: RateLimiter | None = None,
        deadline: float | None = None,
        after_page: Callable[[], None] | None = None,
    ) -> None:
        self._list = list_func
        self._after_page = after_page
        self.resource = resource
        self.timeout_seconds = timeout_seconds
        self.limiter = limiter
        self.deadline = deadline
        self.resource_version: str | None = None  # set when the last page has been read
        self.count = 0
        self.truncated = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        cont: str | None = None
        while True:
            if self.limiter is not None:
                self.limiter.wait()
            timeout = self.timeout_seconds
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0 and cont:
                    self.truncated = True
                    return
                timeout = min(timeout, max(left, 0.001))
            count("list", self.resource)
            kwargs: dict[str, Any] = {"limit": LIST_PAGE_SIZE, "_preload_content": False, "_request_timeout": timeout}
            if cont:
                kwargs["_continue"] = cont
            page = json.loads(self._list(**kwargs).data)
            meta = page.get("metadata") or {}
            items = page.get("items") or []
            del page
            self.count += len(items)
            yield from items
            del items  # this page's raw objects go before the next page is read
            if self._after_page is not None:
                self._after_page()
            cont = meta.get("continue")
            if not cont:
                self.resource_version = str(meta.get("resourceVersion", ""))
                return


def list_pages(
    list_func: Callable[..., Any], *, resource: str, timeout_seconds: float, limiter: RateLimiter | None = None
) -> tuple[list[dict[str, Any]], str]:
    """LIST one resource in pages of LIST_PAGE_SIZE: (every item as a plain dict, the list's
    resourceVersion). See Pages for a consumer that should not hold them all."""
    pages = Pages(list_func, resource=resource, timeout_seconds=timeout_seconds, limiter=limiter)
    items = list(pages)
    return items, pages.resource_version or ""


def list_all(
    list_func: Callable[..., Any],
    *,
    resource: str,
    kind: str,
    timeout_seconds: float = 30.0,
    limiter: RateLimiter | None = None,
    view: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    server: str = "",
) -> list[dict[str, Any]]:
    """Every object of one resource as plain dicts with `kind` set (list items carry none), for
    audits: the pages with a client-side rate limit. view: applied to each object as its page
    arrives (None drops it), so only what it keeps is held (e.g. webhook.model.slim.audit_view).
    Raises ClusterError on API errors, naming `server` (the client's URL: client.server_of)."""
    items: list[dict[str, Any]] = []
    with listing(resource, server, timeout_seconds=timeout_seconds):
        for item in Pages(list_func, resource=resource, timeout_seconds=timeout_seconds, limiter=limiter):
            item.setdefault("kind", kind)
            kept = item if view is None else view(item)
            if kept is not None:
                items.append(kept)
    return items


@contextlib.contextmanager
def listing(resource: str, server: str = "", *, timeout_seconds: float | None = None) -> Iterator[None]:
    """A block that lists `resource` from `server`: any failure in it leaves as ClusterError
    ("cannot list <resource> from <server>: <cause>", webhook.kube.errors.calling)."""
    with calling(server, f"list {resource}", timeout_seconds=timeout_seconds):
        yield
