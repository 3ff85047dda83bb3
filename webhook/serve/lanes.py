"""Capacity and deadlines of the admission reviews in one worker: every review answered within
its budget, evictions first, overload shed fast.

The event-loop front (webhook.serve.front) hands each request to the app in `server.threads`
threads of its lane's executor. Here:

* a Lane per class of policy bounds how many of that class's reviews hold a thread at once:
  the eviction guard (the registry's Policy.first) may use every thread; RBAC and DaemonSet
  reviews together at most threads - server.reservedThreads. However heavy or many they are, a
  thread is always left for an eviction, which no timeout may turn into an allow (its webhook is
  failurePolicy Ignore).
* a review that finds its lane full waits at most ENTER_WAIT seconds for a slot, then is answered
  at once with the overload answer (webhook.admission.overload_answer: eviction 429 retry, else the
  policy's failure mode), rather than queueing past the apiserver's timeout.
* each review is judged in the thread the front gave it (the front's executor of its lane) and
  answered by server.reviewDeadlineSeconds after its arrival in the worker (arrived(): the WSGI
  environ key ARRIVAL, set by the event-loop front, webhook.serve.front.wsgi): a judgment whose turn
  comes after its deadline is not run; one still running at its deadline is answered by the front
  with the overload answer (webhook.serve.front.connection), and its own answer, once it ends, is
  dropped (ANSWERED). A started judgment cannot be interrupted in Python; server.limits keep it
  short. Judging in the front's thread costs no second thread hop per review (a hand-off between
  threads costs ~70 us of CPU on a 2-core VM: bench/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from webhook import admission, metrics
from webhook.admission import NotJudged
from webhook.config import Config
from webhook.config.types import PolicyConfig
from webhook.policies.decision import Decision
from webhook.policies.registry import POLICIES

#: seconds a review waits for a slot of its lane before it is answered "overloaded"
ENTER_WAIT = 0.1

#: the WSGI environ key with time.monotonic() (seconds, a float) of the request's arrival in the worker:
#: its first byte, or its wait in the kernel before it counted. Set by webhook.serve.front.wsgi.environ.
ARRIVAL = "dra_guard.arrival"
#: the WSGI environ key the front sets (to True) once it has answered the request itself, at its
#: deadline, while the app was still judging it: the app's answer is dropped, and its age was
#: observed with the front's answer (dra_guard_review_age_seconds)
ANSWERED = "dra_guard.answered"


def arrived(environ: Mapping[str, Any]) -> float:
    """time.monotonic() when the request of this WSGI environ arrived: environ[ARRIVAL], else now
    (no server set it: the app called directly, as in unit tests)."""
    value = environ.get(ARRIVAL)
    return float(value) if value is not None else time.monotonic()


class Lane:
    """At most `slots` reviews of one class in flight in the threads that judge them.

    enter(deadline) / leave() bracket a review's whole time in a server thread (reading, judging,
    answering); judge() runs the policy with the deadline.
    """

    def __init__(self, name: str, slots: int) -> None:
        self.name = name
        self.slots = slots
        self._free = threading.BoundedSemaphore(slots)

    def enter(self, deadline: float) -> bool:
        """Take a slot, waiting at most ENTER_WAIT seconds (and never past `deadline`); False if none."""
        return self._free.acquire(timeout=max(0.0, min(ENTER_WAIT, deadline - time.monotonic())))

    def leave(self) -> None:
        """Give the slot back."""
        self._free.release()

    def judge(
        self,
        evaluate: Callable[[Mapping[str, Any]], Decision],
        request: Mapping[str, Any],
        deadline: float,
        *,
        deadline_key: str = "server.reviewDeadlineSeconds",
    ) -> Decision:
        """evaluate(request) in the calling thread, by `deadline` (time.monotonic()). Raises NotJudged
        (cause "deadline") without evaluating when the deadline has passed already, and when the
        judgment ended after it: the front answered the review at its deadline (the overload answer),
        so this decision is not the one sent. deadline_key: the config key that set the deadline,
        named in the message."""
        if time.monotonic() >= deadline:
            raise NotJudged("its deadline passed before it was judged", cause="deadline")
        decision = evaluate(request)
        if time.monotonic() >= deadline:
            raise NotJudged(f"not judged within {deadline_key}", cause="deadline")
        return decision


def others_slots(threads: int, reserved: int) -> int:
    """Slots of the lane of the policies that are not first: threads - reserved, at least 1 (the
    event-loop front sizes its executor for those paths by the same rule)."""
    return max(1, threads - reserved)


def lanes_for(threads: int, reserved: int, first: set[str], policies: list[str]) -> dict[str, Lane]:
    """policy name -> its Lane: the `first` policies share one of `threads` slots, the others one
    of others_slots(threads, reserved)."""
    priority = Lane("first", threads)
    others = Lane("others", others_slots(threads, reserved))
    return {name: priority if name in first else others for name in policies}


@dataclasses.dataclass(frozen=True)
class Shedder:
    """The overload answer of one admission path, built from the body's head without the app: the
    event-loop front answers it on its loop for a review that can no longer be judged in time
    (older than `budget` seconds, or expected to wait past it), so overload costs a regex and a few
    hundred bytes of JSON per review, not a thread, the app and a parse.

    budget: the policy's review deadline (seconds since arrival); budget_key: the config key that
    set it, named in the answer's message."""

    policy: str
    settings: PolicyConfig
    first: bool
    budget: float
    budget_key: str

    def answer(self, body: bytes, *, arrival: float, cause: str, why: str, judging: bool = False) -> bytes | None:
        """The overload AdmissionReview (JSON bytes) for `body`, counted (dra_guard_reviews_not_judged_total,
        dra_guard_review_age_seconds); None when the body does not start as the kube-apiserver writes an
        AdmissionReview (admission.peek_review): the app then answers it (a 400, or this same answer).
        judging: the review is still being judged in its thread, which counts it not judged when its
        judgment ends (Lane.judge): only its age is observed here."""
        review = admission.peek_review(body)
        if review is None:
            return None
        answer = admission.overload_answer(
            review, policy=self.policy, settings=self.settings, first=self.first, cause=cause, why=why, counted=not judging
        )
        metrics.REVIEW_AGE.labels(policy=self.policy).observe(time.monotonic() - arrival)
        return json.dumps(answer).encode()


def shedders(config: Config) -> dict[str, Shedder]:
    """URL path -> the Shedder of its policy, for every policy of the registry."""
    out = {}
    for p in POLICIES:
        settings = config.policy(p.name)
        out[p.path] = Shedder(
            policy=p.name,
            settings=settings,
            first=p.first,
            budget=settings.review_deadline_seconds or config.server.review_deadline_seconds,
            budget_key=settings.deadline_key(p.name),
        )
    return out
