"""The one list of dra-guard's admission policies.

Each entry says what a policy is called (config key ``policies.<name>``, metric label), where the
apiserver sends its AdmissionReviews (the chart's webhook ``path``), whether it mutates, what it
answers when it fails internally (``failureMode``; the default is declared with the config keys),
and how it reviews a request and audits existing objects. The server's routes, `dra-guard audit`,
the CLI help and (pinned by tests) the chart's webhook paths and alert rules follow from it.

Adding a policy: a module in webhook/policies with ``admit`` (and ``audit_objects``), an entry
here, its config dataclass and keys (webhook/config), its webhook in the chart
(templates/webhooks.yaml, values), README and docs/policies/. docs/architecture.md has the list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, cast

from webhook.config import DEFAULT_FAILURE_MODES, Config, FailureMode
from webhook.model.facts import Facts
from webhook.policies import eviction, probes, rbac
from webhook.policies.decision import Decision, Finding, Tally

#: the source page: "Good practices for Dynamic Resource Allocation as a Cluster Admin"
PAGE = "https://kubernetes.io/docs/concepts/cluster-administration/dra/"
#: its section on monitoring and tuning (the control-plane audit checks)
MONITORING = PAGE + "#monitor-and-tune-components-for-higher-load-especially-in-high-scale-environments"

#: request dict (AdmissionReview.request) + Facts + Config -> Decision (enforce mode's answer)
Review = Callable[[Mapping[str, Any], Facts, Config], Decision]
#: Facts + Config + objects by kind -> Findings about objects that already exist
Audit = Callable[[Facts, Config, Mapping[str, list[dict[str, Any]]]], Iterable[Finding]]


#: request dict + the final Decision (after any shared record) + Facts -> Tally (its own metrics)
class Account(Protocol):
    """What a policy's final answer adds to its own metrics: (the request, the final Decision, the
    Facts it was judged on, mode: the policy's mode) -> Tally, which webhook.admission counts."""

    def __call__(self, request: Mapping[str, Any], decision: Decision, facts: Facts, *, mode: str) -> Tally: ...


@dataclasses.dataclass(frozen=True)
class Policy:
    """One admission policy.

    name: config key under ``policies`` and the ``policy`` metric label.
    path: the URL path of its webhook (POST, an AdmissionReview).
    mutating: registered in the MutatingWebhookConfiguration (else Validating).
    title: one line for --help and docs.
    source: the section of the source page the policy enforces (a URL).
    review: the decision on one request. audit: findings about existing objects, or None.
    account: what the final answer (once Decision.record is settled) adds to the policy's own metrics, or None.
    first: served first: its own lane of the server's threads (server.threads of them), which no
    other policy's reviews can take, a short queue in it, and a review not judged in time (overload, deadline,
    limits) is answered 429 TooManyRequests "retry" whatever its failureMode, never an allow by
    timeout. The eviction guard: drains retry on 429, and its failurePolicy Ignore would turn a
    timeout into an eviction.
    """

    name: str
    path: str
    mutating: bool
    title: str
    source: str
    review: Review
    audit: Audit | None = None
    first: bool = False
    account: Account | None = None

    @property
    def failure_mode(self) -> FailureMode:
        """What an internal error answers by default (config ``policies.<name>.failureMode``)."""
        return cast(FailureMode, DEFAULT_FAILURE_MODES[self.name])


POLICIES: tuple[Policy, ...] = (
    Policy(
        name="rbac",
        path="/validate/rbac",
        mutating=False,
        review=rbac.admit,
        audit=rbac.audit_objects,
        title="RBAC guard: only admins and DRA drivers get write on DeviceClasses and ResourceSlices",
        source=PAGE + "#separate-permissions-to-dra-related-apis",
    ),
    Policy(
        name="probes",
        path="/mutate/daemonsets",
        mutating=True,
        review=probes.admit,
        audit=probes.audit_objects,
        title="driver liveness probes: a gRPC livenessProbe for DRA driver DaemonSets that lack one",
        source=PAGE + "#confirm-your-dra-driver-exposes-a-liveness-probe-and-utilize-it",
    ),
    Policy(
        name="eviction",
        path="/validate/evictions",
        mutating=False,
        review=eviction.admit,
        audit=eviction.audit_objects,
        first=True,
        account=eviction.account,
        title="drain order: 429 for evicting a DRA driver pod whose claims are still reserved on its node",
        source=PAGE + "#when-draining-a-node-drain-the-dra-driver-as-late-as-possible",
    ),
)


def source_of(policy: str) -> str:
    """The source page's section for a policy name; the monitoring section for the audit-only
    "controlplane" checks; the page itself for anything else."""
    for entry in POLICIES:
        if entry.name == policy:
            return entry.source
    return MONITORING if policy == "controlplane" else PAGE


def by_name(name: str) -> Policy:
    """The policy called `name`; raises KeyError for an unknown name."""
    for policy in POLICIES:
        if policy.name == name:
            return policy
    raise KeyError(name)
