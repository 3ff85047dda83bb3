"""Informer: a paged LIST followed by a WATCH from the list's resourceVersion, into callbacks.

``kubernetes.watch.Watch`` streams the events; the informer relists when the watch expires (HTTP
410 "resource version too old") and backs off on errors.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from webhook import metrics
from webhook.kube.client import ClusterError, count
from webhook.kube.errors import calling
from webhook.kube.pages import Pages

log = logging.getLogger("dra_guard.cluster")

WATCH_TIMEOUT_SECONDS = 300  # server-side watch timeout; the informer re-watches from the last resourceVersion


def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_TRIM = _malloc_trim()


def settle_page() -> None:
    """After each page of a list: collect the young garbage (generations 0 and 1: what the page's
    decoding and the reviews served meanwhile left, cycles included) and move every object alive
    now out of the cyclic garbage collector's view (gc.freeze).

    A relist builds fresh tables of up to millions of small objects beside the old ones; unfrozen,
    they make the collector's full collections walk them all with the GIL held, stalling every
    review for up to ~100 ms at a time during a relist (bench/RESULTS.md, "Findings the code rests on"). Frozen objects are still freed by reference counting (cache entries
    hold no reference cycles); only cyclic garbage that is younger than the last collection and
    still uncollected is frozen with them, and gen 0/1 are collected first so none is.
    """
    gc.collect(1)
    gc.freeze()


def watch_collector_pauses() -> None:
    """Time every collection of the cyclic garbage collector into dra_guard_gc_pause_seconds
    {generation}, and log a warning for one over 0.1 s (each stalls every thread of the worker).
    Call once per process (the serving worker); later calls add nothing."""
    if _on_gc in gc.callbacks:
        return
    gc.callbacks.append(_on_gc)


_GC_STARTED = [0.0]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _GC_STARTED[0] = time.perf_counter()
        return
    seconds = time.perf_counter() - _GC_STARTED[0]
    metrics.GC_PAUSES.labels(generation=str(info.get("generation"))).observe(seconds)
    if seconds > 0.1:
        log.warning(
            "a garbage collection paused the worker",
            extra={"generation": info.get("generation"), "seconds": round(seconds, 3), "collected": info.get("collected")},
        )


def release_free_memory() -> None:
    """After a list: settle_page(), then give the heap freed by the list back to the system (glibc
    malloc_trim(0)).

    The caches of a large cluster are millions of small dicts, tuples and sets; each full
    collection walks them all with the GIL held, stalling every review for up to ~0.8 s at the
    envelope (p99 786 ms at 500/s). A list reads megabyte-sized JSON pages and keeps
    compact entries; glibc keeps the freed pages (malloc_trim is a no-op where libc has none; called
    through ctypes, it runs without the GIL).
    """
    settle_page()
    if _TRIM is not None:
        _TRIM(0)


#: one relist of a large cache at a time in a process. A relist builds its fresh tables beside the
#: old ones (no review waits on it), so every cache relisting at once (every watch breaks when the
#: apiserver restarts) would hold every large cache twice (417 -> 600 MiB at the envelope). The
#: first lists at start-up run together (there is nothing old to hold beside them), and so do the
#: relists of caches that held fewer than SERIAL_RELIST_OBJECTS objects: a handful of Roles must not
#: stay out of sync while 100,000 Pods relist (seen: 48 s).
RELIST_SLOT = threading.Lock()
SERIAL_RELIST_OBJECTS = 10_000


class Informer:
    """List-then-watch one resource into callbacks, in a daemon thread.

    list_func: a kubernetes client list function (e.g. RbacAuthorizationV1Api.list_cluster_role).
    on_replace(objects): called with every object (plain dicts) after each (re)list.
    on_event(type, object): called for each ADDED / MODIFIED / DELETED watch event (plain dict).
    """

    def __init__(
        self,
        *,
        name: str,
        list_func: Callable[..., Any],
        on_replace: Callable[[Iterable[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        timeout_seconds: float,
    ) -> None:
        self.name = name
        self._list = list_func
        self._on_replace = on_replace
        self._on_event = on_event
        self._timeout = timeout_seconds
        self._stop = threading.Event()
        self._watch: kubernetes.watch.Watch | None = None
        self.synced = threading.Event()
        self.last_sync = 0.0  # time.monotonic() of the last successful list or watch event
        self.listed = False  # a list has been read to its end once (later lists are relists)
        self.objects = 0  # objects in the last complete list
        self.thread = threading.Thread(target=self._run, name=f"informer-{name}", daemon=True)

    def start(self) -> None:
        """Start the list/watch thread."""
        self.thread.start()

    def check(self, server: str) -> None:
        """One LIST of at most one object, bounded by the informer's timeout_seconds: whether this
        cache can start (reachable, credentials accepted, list allowed). Raises ClusterError
        ("cannot list <name> from <server>: <cause>")."""
        count("list", self.name)
        with calling(server, f"list {self.name}", timeout_seconds=self._timeout):
            self._list(limit=1, _preload_content=False, _request_timeout=self._timeout)

    def stop(self) -> None:
        """Stop watching (returns at once; the thread ends at the next event or timeout)."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                large = self.listed and self.objects >= SERIAL_RELIST_OBJECTS
                with RELIST_SLOT if large else contextlib.nullcontext():
                    started = time.monotonic()
                    pages = Pages(self._list, resource=self.name, timeout_seconds=max(self._timeout, 10), after_page=settle_page)
                    self._on_replace(pages)  # consumes the pages as they come
                    release_free_memory()
                if pages.resource_version is None:
                    raise ClusterError(f"cache {self.name}: the list was not read to its end")
                rv = pages.resource_version
                self.listed, self.objects = True, pages.count
                self.last_sync = time.monotonic()
                seconds = self.last_sync - started
                metrics.CACHE_LIST_SECONDS.labels(cache=self.name).set(seconds)
                # logged before readiness can turn on: whoever sees /readyz 200 finds every line
                log.info("cache synced", extra={"cache": self.name, "objects": pages.count, "seconds": round(seconds, 3)})
                self.synced.set()
                metrics.CACHE_SYNCED.labels(cache=self.name).set(1)
                backoff = 0.5
                self._watch_from(rv)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch expired, relisting", extra={"cache": self.name})
                    continue
                self._failed(f"API error {exc.status} {exc.reason}")
            except Exception as exc:  # network errors come in many urllib3 types
                self._failed(f"{type(exc).__name__}: {exc}")
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, 5.0)

    def _failed(self, why: str) -> None:
        metrics.CACHE_SYNCED.labels(cache=self.name).set(0)
        metrics.KUBE_API_ERRORS.labels(resource=self.name).inc()
        self.synced.clear()
        log.warning("cache lost its watch, will relist: %s", why, extra={"cache": self.name})

    def age(self) -> float:
        """Seconds since the cache last heard from the apiserver (list, watch start, event or bookmark)."""
        return time.monotonic() - self.last_sync if self.last_sync else float("inf")

    def _watch_from(self, rv: str) -> None:
        while not self._stop.is_set():
            # return_type given and deserialize=False: events stay plain dicts (no model objects)
            self._watch = kubernetes.watch.Watch(return_type="object")
            count("watch", self.name)
            self.last_sync = time.monotonic()
            try:
                for event in self._watch.stream(
                    self._list,
                    resource_version=rv,
                    timeout_seconds=WATCH_TIMEOUT_SECONDS,
                    allow_watch_bookmarks=True,
                    deserialize=False,
                    _request_timeout=WATCH_TIMEOUT_SECONDS + 30,
                ):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        raise ApiException(status=int(obj.get("code") or 500), reason=str(obj.get("message")))
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._on_event(kind, obj)
                    self.last_sync = time.monotonic()
                    if self._stop.is_set():
                        return
            except KeyError as exc:
                # kubernetes.watch with deserialize=False reads event["raw_object"] on ERROR events
                # (a 410 "too old resource version", usually): relist
                raise ApiException(status=410, reason="watch error event") from exc
