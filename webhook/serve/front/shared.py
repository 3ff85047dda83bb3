"""What every connection of one event-loop worker shares (Front): the app, its executors (one per
lane), each lane's queue and pace, the overload answers of the admission paths, the limits; and
the admission rule that decides, on the loop, which review is taken and which gets the overload
answer at once (the why of each rule: docs/reliability.md "Server settings", bench/RESULTS.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Protocol

from webhook.serve.front import wsgi
from webhook.serve.front.capacity import ConnectionTable

#: reviews queued or running per thread of the eviction lane past which a review gets the overload
#: answer at once (429, the drain retries): a short queue turns the client's connections over in
#: milliseconds, so under a sustained overload it dials less (bench/RESULTS.md: 8 per thread let the
#: apiserver-shaped client reach the connection limit and answers came late; 4 held the gate)
SHORT_QUEUE_PER_THREAD = 4
#: weight of the newest sample in a lane's pace (seconds between two of its reviews finished while
#: others waited): about the last 10 reviews count, so the pace follows a change of load within a burst
PACE_WEIGHT = 0.1
#: seconds the front counts as overloaded after it shed a review it could not judge in time: new
#: connections to the webhook port are reset without a TLS handshake meanwhile
#: (webhook.serve.front.listeners)
OVERLOAD_HOLD = 1.0


class Shedding(Protocol):
    """The overload answer of one admission path (webhook.serve.lanes.Shedder)."""

    @property
    def budget(self) -> float: ...

    @property
    def budget_key(self) -> str: ...

    def answer(self, body: bytes, *, arrival: float, cause: str, why: str, judging: bool = False) -> bytes | None: ...


class Front:
    """What every connection of one worker shares: the app, its executors (lanes, by name, with
    lane_threads[name] threads each), the pace of each lane, the overload answers of the admission paths,
    the limits.

    Admission: a review is taken into its lane only when the reviews queued or running before it
    should be done before its deadline (expected_wait < what is left of its review deadline), and
    in a `short_queue` lane (the eviction guard's) only while it holds fewer than
    SHORT_QUEUE_PER_THREAD reviews per thread; otherwise it gets the overload answer at once, on the
    loop (a few hundred bytes of JSON, no thread). The other admission paths take a burst whole when
    they can judge it in time, however many connections it comes on (the kube-apiserver dials one
    per review in flight: 200 RBAC objects applied at once are 200 reviews at once, and their
    answer when shed is a refusal nobody retries); evictions are refused early (429: drains retry),
    which keeps a sustained overload of them from growing the client's connections. A review taken
    that is not judged by its deadline is answered then, by the front (Connection._by_deadline),
    and dropped unjudged if its turn comes after it (webhook.serve.lanes.Lane.judge)."""

    def __init__(
        self,
        *,
        app: wsgi.WsgiApp,
        table: ConnectionTable,
        executors: Mapping[str, Executor],
        lane_of: Callable[[str], str],
        lane_threads: Mapping[str, int],
        short_queue: frozenset[str] = frozenset(),
        shedders: Mapping[str, Shedding],
        max_request_bytes: int,
        drop_after: float,
        multiprocess: bool,
    ) -> None:
        self.app = app
        self.table = table
        self.executors = executors
        self.lane_of = lane_of
        self.threads = dict(lane_threads)  # lane -> its executor's threads
        self.short_queue = short_queue  # lanes that queue at most SHORT_QUEUE_PER_THREAD reviews per thread
        self.queued = dict.fromkeys(executors, 0)  # reviews submitted to each lane and not finished
        self.pace = dict.fromkeys(executors, 0.0)  # seconds per review finished while others waited (moving average)
        self._finished_at = dict.fromkeys(executors, float("-inf"))
        self.shedders = shedders
        self.max_request_bytes = max_request_bytes
        self.drop_after = drop_after
        self.multiprocess = multiprocess
        self.closing = False  # draining: answer with Connection: close, take no new request
        self.shed_at = float("-inf")  # time.monotonic() of the last review shed, or of saturation

    def expected_wait(self, lane: str) -> float:
        """Seconds a review submitted to `lane` now would wait before its turn: the reviews queued
        beyond the lane's threads times its pace (0.0 while the lane has a free thread, or before it
        was ever busy)."""
        return max(0, self.queued[lane] - self.threads[lane] + 1) * self.pace[lane]

    def shed_cause(self, lane: str, shedder: Shedding, started: float, now: float) -> tuple[str, str] | None:
        """(cause, why) of the overload answer for a review of `lane` whose first byte arrived at
        `started` and whose deadline is shedder.budget seconds after it, when the admission rule
        above refuses it now (and the worker counts as overloaded from `now`); None: take it."""
        left = shedder.budget - (now - started)
        wait = self.expected_wait(lane)
        if left <= 0:
            found = ("deadline", f"overloaded: it waited in the queue past {shedder.budget_key}")
        elif wait >= left:
            found = (
                "overload",
                f"overloaded: the {self.queued[lane]} reviews before it take about {wait:.2f} s, past {shedder.budget_key}",
            )
        elif lane in self.short_queue and self.queued[lane] >= SHORT_QUEUE_PER_THREAD * self.threads[lane]:
            found = ("overload", f"overloaded: {self.queued[lane]} reviews wait for the server's threads")
        else:
            return None
        self.shed_at = now
        return found

    def submitted(self, lane: str) -> None:
        """A review goes to `lane`'s executor."""
        self.queued[lane] += 1

    def finished(self, lane: str, submitted: float, deadline: float, now: float | None = None) -> None:
        """A review of `lane` submitted at `submitted` with its deadline at `deadline` (both
        time.monotonic()) is done. When others were waiting for a thread meanwhile and it finished
        before its deadline (judged, not dropped: a drop takes no time and says nothing of the pace
        of judging), the time since the lane's previous review finished (or since this one was
        submitted, if later) is a sample of the lane's pace (seconds per review)."""
        now = time.monotonic() if now is None else now
        if self.queued[lane] > self.threads[lane] and now < deadline:
            sample = now - max(self._finished_at[lane], submitted)
            self.pace[lane] += PACE_WEIGHT * (sample - self.pace[lane])
        self._finished_at[lane] = now
        self.queued[lane] -= 1

    def overloaded(self, now: float | None = None) -> bool:
        """Whether the worker was saturated within OVERLOAD_HOLD s (a review shed because it could
        not be judged in time, or saturated() true): it has more than it can judge, and a new
        connection would first cost a TLS handshake."""
        now = time.monotonic() if now is None else now
        return now - self.shed_at < OVERLOAD_HOLD

    def saturated(self, queued: int) -> bool:
        """Whether the worker is overloaded, counting as saturated (from now, for OVERLOAD_HOLD s)
        when it holds as many connections as it may, at least half of them with a review queued
        or being judged (State.BUSY), while `queued` more wait in the kernel's accept queue.

        A client whose connections are all busy dials more: at twice the capacity the apiserver's
        reach the connection limit within a second, and the dials then wait in the accept queue
        and overflow it (SYNs dropped, sent again after 1 s: reviews answered after the apiserver's
        timeout) before any review's expected wait reaches its deadline. Idle, silent or trickling
        connections are reclaimed, never a sign of saturation, so a flood of them cannot make the
        worker refuse an honest client."""
        table = self.table
        if queued and len(table) >= table.limit and 2 * table.busy() >= table.limit:
            self.shed_at = time.monotonic()
        return self.overloaded()
