"""Policy exceptions an admin owns: config entries ``exceptions:`` naming one object, one policy, a
reason, an owner and an expiry (like a Kyverno PolicyException, kept in dra-guard's config).

Where they live and why: in dra-guard's config (the chart's ConfigMap in dra-guard's namespace),
which only cluster admins may write (the RBAC guard's namespace-powers check covers ConfigMaps
there, docs/threat-model.md); no custom resource a namespace owner could create.

What may be excepted (EXCEPTABLE) and why nothing else:
- rbac, check rbac-write, on a ClusterRoleBinding or RoleBinding: pinned to its roleRef, the
  subjects and the resources (DRA resources and powers) the admin reviewed, so whoever may write
  that binding cannot widen it (other subjects, another role, more resources) under the exception.
  Never roles: a role's rules reach every binding of it. Never guard-own-rbac (dra-guard's own
  RBAC) nor cache-not-synced.
- probes, every check, on a DaemonSet: the probe is not added (a driver without a gRPC health
  endpoint); that grants nobody anything.
- never eviction: an exception would let anyone allowed to evict pods (kubectl drain, autoscalers)
  take the driver off a node whose claims still need it, the failure the guard exists for.
Names are exact: a pattern would also cover objects created later by whoever may name them.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Final

from webhook.config.declare import key
from webhook.config.subjects import SubjectSet

#: policy -> the kinds its exceptions may name, and the checks they may skip (None: every check)
EXCEPTABLE: Final[dict[str, tuple[tuple[str, ...], frozenset[str] | None]]] = {
    "rbac": (("ClusterRoleBinding", "RoleBinding"), frozenset({"rbac-write"})),
    "probes": (("DaemonSet",), None),
}
#: an exception expires at most this many days after the config is loaded: each one gets reviewed
MAX_DAYS: Final = 366
NAMESPACED_KINDS: Final = ("RoleBinding", "DaemonSet")


@dataclasses.dataclass(frozen=True)
class PolicyException:
    """One exception: findings of `policy` on object `kind` `namespace`/`name` (and, for rbac, of
    that roleRef, those subjects, those resources) are not enforced until `expires` (aware UTC
    datetime); audits report them as skip, and as findings (exception-expired) once it expired."""

    policy: str = dataclasses.field(
        metadata=key(
            "policy",
            required=True,
            choices=("rbac", "probes", "eviction"),
            help="the policy whose findings are excepted: rbac or probes (eviction is refused: never excepted)",
        )
    )
    kind: str = dataclasses.field(
        metadata=key(
            "kind",
            required=True,
            choices=("ClusterRoleBinding", "RoleBinding", "DaemonSet"),
            help="the object's kind: ClusterRoleBinding or RoleBinding (rbac), DaemonSet (probes)",
        )
    )
    name: str = dataclasses.field(metadata=key("name", required=True, min_length=1, help="the object's exact name (no patterns)"))
    reason: str = dataclasses.field(
        metadata=key("reason", required=True, min_length=1, help="why it is excepted (shown in warnings and reports)")
    )
    owner: str = dataclasses.field(
        metadata=key("owner", required=True, min_length=1, help="who answers for it (a person or team)")
    )
    expires: datetime.datetime = dataclasses.field(
        metadata=key(
            "expires",
            required=True,
            help=f"when it stops applying: an RFC 3339 date-time with a time zone, at most {MAX_DAYS} days ahead",
        )
    )
    namespace: str = dataclasses.field(
        default="",
        metadata=key("namespace", help="the object's namespace (RoleBinding, DaemonSet; none for a ClusterRoleBinding)"),
    )
    role_ref: str = dataclasses.field(
        default="", metadata=key("roleRef", help="rbac: the name of the role the binding refers to (required)")
    )
    subjects: SubjectSet = dataclasses.field(
        default=SubjectSet(),
        metadata=key("subjects", help="rbac: the exact subjects the binding may give them to (required; no wildcards)"),
    )
    resources: frozenset[str] = dataclasses.field(
        default=frozenset(),
        metadata=key(
            "resources",
            help="rbac: the DRA resources and escalation powers it may grant, as findings name them "
            "(e.g. resourceslices; required)",
        ),
    )

    @property
    def ref(self) -> str:
        """How messages name it: "<policy> <kind> <namespace>/<name>"."""
        return f"{self.policy} {self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"

    def live(self, now: datetime.datetime) -> bool:
        """Whether it still applies at `now` (an aware datetime)."""
        return now < self.expires


def parse_expiry(value: object) -> datetime.datetime:
    """An RFC 3339 date-time (a string, or the datetime YAML makes of an unquoted one) as an aware
    UTC datetime. Raises ValueError saying what is wrong (no time zone, a date alone, not a time)."""
    if isinstance(value, datetime.datetime):
        when = value
    elif isinstance(value, datetime.date):
        raise ValueError(f"{value.isoformat()} is a date; give a date-time such as {value.isoformat()}T00:00:00Z")
    elif isinstance(value, str):
        text = value.strip()
        if len(text) == 10:  # fromisoformat takes a date alone as its midnight, in no time zone
            raise ValueError(f"{text} is a date; give a date-time such as {text}T00:00:00Z")
        try:
            when = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"{value!r} is not an RFC 3339 date-time (e.g. 2026-12-31T00:00:00Z)") from None
    else:
        raise ValueError(f"expected an RFC 3339 date-time string, got {type(value).__name__}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"{when.isoformat()} has no time zone; end it with Z or +hh:mm")
    return when.astimezone(datetime.UTC)
