"""May this review still be judged, and what is answered if not: the one place that decides it for
the admission reviews of a worker, and builds that answer (the overload answer).

The event-loop front (webhook.serve.front) judges nothing: it hands each review once to the
executor of its lane (the eviction guard's paths, the other admission paths: server.threads
threads each, so however heavy or many RBAC and DaemonSet reviews are, they never hold a thread an
eviction waits for) and asks the Gate of the review's path, through the front's ReviewGate
protocol (webhook.serve.front.shared), what to do. A Gate per admission path decides:

* on the loop, before any thread is given: refusal(arrival, now, wait, queued, threads). A review
  is taken when what is queued before it should be done before its deadline, and for the
  eviction guard (the registry's Policy.first) only while its lane holds fewer than
  SHORT_QUEUE_PER_THREAD reviews per thread; otherwise it gets the overload answer at once
  (answer(): the body's head only, a few hundred bytes of JSON, no thread, no parse).
* at the deadline (arrival + budget), while its judgment still runs in its thread: the front
  answers it then with answer(..., AT_DEADLINE cause) and marks the WSGI environ ANSWERED; the
  judgment cannot be interrupted in Python (server.limits keep it short) and its answer is dropped.
* in the thread, as the app takes it up (webhook.serve.app.PolicyRoute): the same refusal with
  nothing queued (its deadline passed while it waited for the thread: the overload answer, not
  judged), then judge(), which raises NotJudged when the judgment ended past the deadline.

The overload answer is the policy's failure mode for a review not judged (webhook.admission.
not_judged: eviction 429 retry, else the failureMode; warn and audit allow). One large review is
judged at a time per worker (LargeSlot). The thread hand-off is a fifth to a quarter of a cheap
review's CPU (bench/RESULTS.md, "Where a review's CPU goes"): a review is judged in the thread the
front gave it, never handed on.
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
from webhook.serve.front.wsgi import ARRIVAL

#: reviews queued or running per thread of the eviction lane past which an eviction gets the
#: overload answer at once (429, the drain retries): a short queue turns the client's connections
#: over in milliseconds, so under a sustained overload it dials less (bench/RESULTS.md: 8 per
#: thread let the apiserver-shaped client reach the connection limit and answers came late; 4
#: held the gate)
SHORT_QUEUE_PER_THREAD = 4
#: seconds a large review waits for the worker's large slot before the overload answer
ENTER_WAIT = 0.1

#: (cause, why) of an overload answer: cause is the label of dra_guard_reviews_not_judged_total
#: (deadline, overload), why the reason given in the answer's message and the log
Refusal = tuple[str, str]


def arrived(environ: Mapping[str, Any]) -> float:
    """time.monotonic() when the request of this WSGI environ arrived: environ[ARRIVAL], else now
    (no server set it: the app called directly, as in unit tests)."""
    value = environ.get(ARRIVAL)
    return float(value) if value is not None else time.monotonic()


@dataclasses.dataclass(frozen=True)
class Gate:
    """The deadline and the overload answer of one admission path (module docstring).

    budget: seconds from a review's arrival to its deadline (the policy's reviewDeadlineSeconds,
    else server.reviewDeadlineSeconds); budget_key: the config key that set it, named in the
    answers' messages. first: the registry's Policy.first (the eviction guard)."""

    policy: str
    settings: PolicyConfig
    first: bool
    budget: float
    budget_key: str

    @property
    def at_deadline(self) -> Refusal:
        """The refusal of a review still being judged at its deadline."""
        return ("deadline", f"not judged within {self.budget_key}")

    def refusal(self, *, arrival: float, now: float, wait: float = 0.0, queued: int = 0, threads: int = 1) -> Refusal | None:
        """Whether a review that arrived at `arrival` may still be judged at `now` (time.monotonic()):
        None when it may; else why not. wait: seconds the reviews before it are expected to take
        before its turn; queued: reviews queued or judged in its lane, of `threads` threads."""
        left = self.budget - (now - arrival)
        if left <= 0:
            return ("deadline", f"overloaded: it waited in the queue past {self.budget_key}")
        if wait >= left:
            return ("overload", f"overloaded: the {queued} reviews before it take about {wait:.2f} s, past {self.budget_key}")
        if self.first and queued >= SHORT_QUEUE_PER_THREAD * threads:
            return ("overload", f"overloaded: {queued} reviews wait for the server's threads")
        return None

    def answer(self, head: Mapping[str, Any], refusal: Refusal, *, counted: bool = True) -> dict[str, Any]:
        """The overload AdmissionReview (a dict) for a review whose apiVersion and request.uid are in
        `head` (admission.peek_review or parse_review), counted in dra_guard_reviews_not_judged_total
        unless `counted` is False (the judgment still running counts it when it ends: judge())."""
        cause, why = refusal
        return admission.overload_answer(
            head, policy=self.policy, settings=self.settings, first=self.first, cause=cause, why=why, counted=counted
        )

    def answer_bytes(self, body: bytes, refusal: Refusal, *, arrival: float, judging: bool = False) -> bytes | None:
        """answer() as JSON bytes, from the body's head without the app (on the front's loop), its
        age observed (dra_guard_review_age_seconds); None when the body does not start as the
        kube-apiserver writes an AdmissionReview (admission.peek_review): the app answers it then.
        judging: the review is still being judged in its thread (not counted here: judge())."""
        head = admission.peek_review(body)
        if head is None:
            return None
        data = json.dumps(self.answer(head, refusal, counted=not judging)).encode()
        metrics.REVIEW_AGE.labels(policy=self.policy).observe(time.monotonic() - arrival)
        return data

    def judge(self, evaluate: Callable[[Mapping[str, Any]], Decision], request: Mapping[str, Any], arrival: float) -> Decision:
        """evaluate(request) in the calling thread. Raises NotJudged (cause "deadline") without
        evaluating when the deadline has passed already (reading and parsing the body took it), and
        when the judgment ended past it: the front answered the review then, and this decision is
        not the one sent."""
        cause, why = self.at_deadline
        if time.monotonic() - arrival >= self.budget:
            raise NotJudged(why, cause=cause)
        decision = evaluate(request)
        if time.monotonic() - arrival >= self.budget:
            raise NotJudged(why, cause=cause)
        return decision


def gates(config: Config) -> dict[str, Gate]:
    """URL path -> the Gate of its policy, for every policy of the registry."""
    out = {}
    for p in POLICIES:
        settings = config.policy(p.name)
        out[p.path] = Gate(
            policy=p.name,
            settings=settings,
            first=p.first,
            budget=settings.review_deadline_seconds or config.server.review_deadline_seconds,
            budget_key=settings.deadline_key(p.name),
        )
    return out


class LargeSlot:
    """The worker's one slot for a large review: a body of ~3-byte JSON values ({},{},..) decodes
    to ~30x its size, and 8 bodies of 8 MiB at once took a worker past 1 GiB (an OOM kill lets
    every eviction in flight through). Held while one is read and judged; small reviews,
    evictions among them, never wait for it."""

    REFUSAL: Refusal = ("overload", "overloaded: another large review is being judged")

    def __init__(self) -> None:
        self._free = threading.BoundedSemaphore(1)

    def enter(self, deadline: float) -> bool:
        """Take the slot, waiting at most ENTER_WAIT seconds (never past `deadline`, time.monotonic());
        False if it stayed taken."""
        return self._free.acquire(timeout=max(0.0, min(ENTER_WAIT, deadline - time.monotonic())))

    def leave(self) -> None:
        """Give the slot back."""
        self._free.release()
