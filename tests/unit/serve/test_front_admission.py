"""Admission by expected wait in the event-loop front (webhook.serve.front.shared.Front): a
review is taken into its lane only when the reviews before it should be done by its deadline.
Pure logic: the times are given, no clock is read, no server runs (tests/http/test_overload.py
has the same rule on the wire)."""

from __future__ import annotations

from webhook.serve.front.capacity import ConnectionTable, State
from webhook.serve.front.shared import OVERLOAD_HOLD, Front


def front(threads: int = 8) -> Front:
    return Front(
        app=lambda environ, start_response: [],
        table=ConnectionTable(10),
        executors={"reviews": None, "first": None},  # type: ignore[dict-item]  # never used here
        lane_threads={"reviews": threads, "first": threads},
        gates={},
        max_request_bytes=1024,
        drop_after=10.0,
        multiprocess=False,
    )


def backlog(f: Front, lane: str, reviews: int, *, every: float, start: float = 0.0, deadline: float = 1000.0) -> float:
    """`reviews` submitted at `start`, finished one every `every` s while `reviews` stay in the lane
    (others keep coming); returns the time of the last."""
    for _ in range(reviews):
        f.submitted(lane)
    now = start
    for _ in range(reviews):
        now += every
        f.finished(lane, start, deadline, now=now)
        f.submitted(lane)
    for _ in range(reviews):  # the lane empties (finished at once: no backlog by the end)
        f.queued[lane] -= 1
    return now


def test_no_wait_is_expected_while_a_thread_is_free_or_before_the_lane_was_ever_busy():
    f = front(threads=8)
    for _ in range(7):
        f.submitted("reviews")
    assert f.expected_wait("reviews") == 0.0  # the 8th finds a free thread
    for _ in range(300):
        f.submitted("reviews")
    assert f.expected_wait("reviews") == 0.0  # no pace known yet: a first burst is taken whole


def test_the_expected_wait_is_the_reviews_ahead_times_the_pace_learnt_while_they_queue():
    f = front(threads=8)
    backlog(f, "reviews", 200, every=0.01)
    assert abs(f.pace["reviews"] - 0.01) < 1e-6
    for _ in range(200):
        f.submitted("reviews")
    # 200 in the lane: 8 running, a new one waits for 193 to finish
    assert abs(f.expected_wait("reviews") - 193 * 0.01) < 1e-3
    assert f.expected_wait("first") == 0.0  # each lane has its own pace


def test_reviews_finished_without_a_backlog_or_after_their_deadline_teach_no_pace():
    f = front(threads=2)
    f.submitted("reviews")
    f.finished("reviews", 0.0, 100.0, now=5.0)  # alone in the lane: 5 s says nothing of its pace
    assert f.pace["reviews"] == 0.0
    # a backlog of reviews dropped at their deadline (each 1 ms): they are not the pace of judging
    end = backlog(f, "reviews", 50, every=0.001, start=5.0, deadline=0.0)
    assert f.pace["reviews"] == 0.0
    backlog(f, "reviews", 50, every=0.004, start=end)
    assert abs(f.pace["reviews"] - 0.004) < 1e-3


def test_the_pace_follows_a_change_of_load_within_a_burst():
    f = front(threads=8)
    end = backlog(f, "reviews", 100, every=0.001)
    for _ in range(100):
        f.submitted("reviews")
    for _ in range(30):  # the reviews became 10 times heavier
        end += 0.01
        f.finished("reviews", 0.0, 1000.0, now=end)
        f.submitted("reviews")
    assert f.pace["reviews"] > 0.009


def test_the_front_counts_as_overloaded_for_overload_hold_after_a_shed():
    f = front()
    assert not f.overloaded(now=0.0)
    f.shed_at = 10.0
    assert f.overloaded(now=10.0 + OVERLOAD_HOLD / 2)
    assert not f.overloaded(now=10.0 + OVERLOAD_HOLD)


class Held:
    """A connection of the table in a given state (webhook.serve.front.capacity.Held)."""

    def __init__(self, state: State, *, waiting: bool = False) -> None:
        self.state, self.since, self.closing, self.pending = state, 0.0, False, 0
        self.waiting = waiting  # a request's bytes in the kernel, not read yet

    def request_waiting(self) -> bool:
        return self.waiting

    def close_now(self) -> None:
        self.closing = True

    def resume(self) -> None:
        pass


def full_table(f: Front, states: list[State]) -> None:
    for state in states:
        f.table.hold(Held(state))


def test_saturated_at_the_limit_with_half_the_connections_busy_and_more_waiting_in_the_kernel():
    f = front()
    f.table.limit = 4
    full_table(f, [State.BUSY, State.BUSY, State.IDLE, State.NEW])
    assert not f.saturated(queued=0)  # nobody waits in the accept queue
    assert not f.overloaded()
    assert f.saturated(queued=1)
    assert f.overloaded()  # and it stays so for OVERLOAD_HOLD


def test_a_table_full_of_silent_or_idle_connections_is_not_saturation():
    for states in ([State.HANDSHAKE] * 4, [State.READING] * 3 + [State.BUSY], [State.IDLE] * 4):
        f = front()
        f.table.limit = 4
        full_table(f, states)
        assert not f.saturated(queued=50), states  # they are reclaimed instead (capacity module)
    f = front()
    f.table.limit = 4
    full_table(f, [State.BUSY] * 3)
    assert not f.saturated(queued=50)  # below the limit: the new one is accepted


def test_reclaim_never_closes_a_connection_whose_request_waits_unread_in_the_kernel():
    """A loop busy with a burst reads some connections late: a connection still NEW (or IDLE) to the
    front whose request is already in its receive buffer is not idle, and closing it would drop a
    review its client sent (the apiserver sends a POST once). Those without bytes go, oldest first."""
    f = front()
    f.table.limit = 4
    sent = [Held(State.NEW, waiting=True), Held(State.IDLE, waiting=True)]
    silent = [Held(State.NEW), Held(State.IDLE)]
    for conn in sent + silent:
        f.table.hold(conn)
    assert f.table.reclaim(4, now=100.0) == 2
    assert [c.closing for c in sent] == [False, False]
    assert [c.closing for c in silent] == [True, True]
