"""What every connection of one event-loop worker shares (Front): the app, its executors (one per
lane), each lane's queue and pace, the overload answers of the admission paths, the limits; and
the facts the review gates judge by on the loop: each lane's queue and pace (the rules themselves
and the overload answer: webhook.serve.lanes.Gate, given through ReviewGate)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Protocol

from webhook.serve.front import wsgi
from webhook.serve.front.capacity import ConnectionTable

#: weight of the newest sample in a lane's pace (seconds between two of its reviews finished while
#: others waited): about the last 10 reviews count, so the pace follows a change of load within a burst
PACE_WEIGHT = 0.1
#: seconds the front counts as overloaded after it shed a review it could not judge in time: new
#: connections to the webhook port are reset without a TLS handshake meanwhile
#: (webhook.serve.front.listeners)
OVERLOAD_HOLD = 1.0


class ReviewGate(Protocol):
    """May a review of one admission path still be judged, and its overload answer if not: the
    front asks, it never decides (webhook.serve.lanes.Gate). A refusal is (cause, why)."""

    @property
    def first(self) -> bool:
        """Whether its reviews have the "first" lane (the eviction guard's), else "reviews"."""

    @property
    def budget(self) -> float: ...

    @property
    def at_deadline(self) -> tuple[str, str]: ...

    def refusal(
        self, *, arrival: float, now: float, wait: float = 0.0, queued: int = 0, threads: int = 1
    ) -> tuple[str, str] | None: ...

    def answer_bytes(self, body: bytes, refusal: tuple[str, str], *, arrival: float, judging: bool = False) -> bytes | None: ...


class Front:
    """What every connection of one worker shares: the app, its executors (lanes, by name, with
    lane_threads[name] threads each), the pace of each lane, the gate of each admission path
    (`gates`: path -> ReviewGate), the limits.

    A review of an admission path is handed to its lane's executor once, unless its gate refuses
    it on arrival (refusal(): the gate weighs what is queued before it against its deadline) or
    answers it at its deadline while it is still judged (Connection._judged); the answer is
    then the gate's overload answer, written on the loop (a few hundred bytes of JSON, no thread)."""

    def __init__(
        self,
        *,
        app: wsgi.WsgiApp,
        table: ConnectionTable,
        executors: Mapping[str, Executor],
        lane_threads: Mapping[str, int],
        gates: Mapping[str, ReviewGate],
        max_request_bytes: int,
        drop_after: float,
        multiprocess: bool,
    ) -> None:
        self.app = app
        self.table = table
        self.executors = executors
        self.threads = dict(lane_threads)  # lane -> its executor's threads
        self.queued = dict.fromkeys(executors, 0)  # reviews submitted to each lane and not finished
        self.pace = dict.fromkeys(executors, 0.0)  # seconds per review finished while others waited (moving average)
        self._finished_at = dict.fromkeys(executors, float("-inf"))
        self.gates = gates
        self.max_request_bytes = max_request_bytes
        self.drop_after = drop_after
        self.multiprocess = multiprocess
        self.closing = False  # draining: answer with Connection: close, take no new request
        self.shed_at = float("-inf")  # time.monotonic() of the last review shed, or of saturation

    def route(self, path: str) -> tuple[str, ReviewGate | None]:
        """(lane, gate) of a request for `path`: an admission path's gate and its lane ("first" for
        the eviction guard's, else "reviews"); any other path ("service": probes, metrics), no gate."""
        gate = self.gates.get(path)
        if gate is None:
            return "service", None
        return ("first" if gate.first else "reviews"), gate

    def expected_wait(self, lane: str) -> float:
        """Seconds a review submitted to `lane` now would wait before its turn: the reviews queued
        beyond the lane's threads times its pace (0.0 while the lane has a free thread, or before it
        was ever busy)."""
        return max(0, self.queued[lane] - self.threads[lane] + 1) * self.pace[lane]

    def refusal(self, lane: str, gate: ReviewGate, started: float, now: float) -> tuple[str, str] | None:
        """gate.refusal for a review of `lane` whose first byte arrived at `started`, given the
        lane's queue and pace now (time.monotonic()); a refusal counts the worker as overloaded
        from `now` (overloaded())."""
        found = gate.refusal(
            arrival=started, now=now, wait=self.expected_wait(lane), queued=self.queued[lane], threads=self.threads[lane]
        )
        if found is not None:
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
