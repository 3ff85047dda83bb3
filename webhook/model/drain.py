"""The order of `dra-guard drain NODE` (pure): which of a node's pods leave in which phase, and
what the drain still waits for or cannot get past.

Source: "Good practices for DRA as a Cluster Admin", "Draining nodes: drain the DRA driver last"
(custom drain logic should check for allocated and reserved ResourceClaims before it terminates
the driver), and what the kubelet does (../shared/docs/dra-facts.md "Draining a node"): it
unprepares a claim once the last pod on the node using it has stopped, holds the pod's terminal
phase until then, and only then deletes the pod; a force delete skips that on the API side.

Phases, in order (`next_step`):

1. ``pods``: every pod that is not a DaemonSet's, not a static (mirror) pod and selected by
   ``--pod-selector`` is evicted; the phase lasts until they are gone or finished.
2. ``daemonset-consumers``: pods of a DaemonSet that is not a DRA driver and that use
   ResourceClaims (a monitoring agent with a claim), evicted with `DAEMONSET_TAINT` on the node
   first, so that their DaemonSet does not put them back. One that tolerates the taint would come
   back: the drain names it and does not evict it.
3. ``release``: no driver of the node is still needed there, by the rule the eviction policy uses
   (webhook.model.attribution.need / ClaimIndex.holds: pods on this node in a claim's
   ``reservedFor`` that have not finished, Terminating ones included, and consumers that are not
   pods; never "the claim is unreserved everywhere", which never happens for devices reachable from
   several nodes while a pod elsewhere uses them). A hold by a pod this drain does not evict is
   named as blocking. A departure the API cannot vouch for (a pod gone without a terminal phase:
   force-deleted) must be confirmed (`confirm`).
4. ``drivers`` (``--evict-drivers`` only): `DRIVER_TAINT` on the node, put there only now (earlier,
   a driver pod that died mid-drain could not come back to unprepare), then the driver pods.

Other DaemonSet pods stay, as with ``kubectl drain --ignore-daemonsets``; finished pods are left alone.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.model import attribution
from webhook.model.claim_index import ClaimIndex
from webhook.model.claims import Hold
from webhook.model.readers import annotations_of, as_list, as_map, as_str

#: the annotation naming the drain that holds the node ("<user>@<host>/<pid>"); one drain per node
HOLDER = "drain.dra-guard.io/holder"
#: when the holder last renewed HOLDER (RFC 3339); a holder silent for LOCK_SECONDS is taken over
RENEWED = "drain.dra-guard.io/renewed"
#: what the drain changed on the node, JSON {"unschedulableBefore": bool, "taints": [keys added]}:
#: what `dra-guard uncordon` restores (and nothing else)
STATE = "drain.dra-guard.io/state"
#: set while a drain runs (added only when absent, removed after): cluster-autoscaler does not
#: scale the node down, Karpenter does not disrupt it, so neither races the drain
AUTOSCALER_ANNOTATIONS = {
    "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
    "karpenter.sh/do-not-disrupt": "true",
}
#: keeps evicted DaemonSet consumers from coming back (DaemonSet pods tolerate cordoning)
DAEMONSET_TAINT = {"key": "drain.dra-guard.io/daemonsets", "value": "draining", "effect": "NoSchedule"}
#: keeps evicted driver pods from coming back; put on only once their claims are released
DRIVER_TAINT = {"key": "drain.dra-guard.io/drivers", "value": "draining", "effect": "NoSchedule"}
#: seconds a holder may go without renewing before another drain takes the node over
LOCK_SECONDS = 30
#: the default seconds to wait, without the kubelet's gauge, after a departure the API cannot vouch
#: for: the kubelet's pod worker unprepares at once, its reconcile loop at the latest every 60 s
SAFETY_SECONDS = 90.0

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

#: roles of pods this drain never evicts, and why (for messages)
UNEVICTED = {"static": "a static pod", "unselected": "not selected by --pod-selector", "daemonset": "a DaemonSet pod"}

PHASES = ("pods", "daemonset-consumers", "release", "drivers", "done")


@dataclasses.dataclass(frozen=True)
class PodEntry:
    """A pod of the node as the drain sees it.

    role: "pod" (evicted in phase 1), "daemonset-consumer" (phase 2), "driver" (phase 4),
    "daemonset" (stays), "static" (a mirror pod: cannot be evicted), "unselected" (not selected by
    --pod-selector: stays). tolerates: whether it tolerates the taint of its phase (it would come back).
    """

    namespace: str
    name: str
    uid: str
    role: str
    terminating: bool
    finished: bool
    claims: bool
    tolerates: bool = False

    @property
    def key(self) -> str:
        """ "namespace/name"."""
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class DriverState:
    """A DRA driver on the node: its name, the driver pods serving it there ("namespace/name"),
    whether one of them is running, Ready and not Terminating, and the claims still held there."""

    name: str
    pods: tuple[str, ...]
    available: bool
    holds: tuple[Hold, ...]


@dataclasses.dataclass(frozen=True)
class Step:
    """What the drain does next.

    phase: one of PHASES. taint: the taint (dict key/value/effect) to put on the node before
    evicting `evict` ("namespace/name", pods not yet Terminating). waiting: why it waits (each a
    line). blocked: what waiting cannot clear (a pod this drain does not evict holds a claim; a
    DaemonSet tolerates the taint); the drain stops at its timeout naming them. drivers: the
    drivers of the node. done: nothing left to do.
    """

    phase: str
    evict: tuple[str, ...] = ()
    taint: Mapping[str, str] | None = None
    waiting: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    drivers: tuple[DriverState, ...] = ()
    done: bool = False


def owner_kind(pod: Mapping[str, Any]) -> str:
    """The kind of the pod's controller ownerReference ("" when none)."""
    owners = map(as_map, as_list(as_map(pod.get("metadata")).get("ownerReferences")))
    return next((as_str(o.get("kind")) for o in owners if o.get("controller")), "")


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The names of the ResourceClaims a core/v1 Pod dict uses: spec.resourceClaims[].resourceClaimName,
    status.resourceClaimStatuses[].resourceClaimName (claims made from templates) and
    status.extendedResourceClaimStatus.resourceClaimName (a DRA extended resource's claim)."""
    spec, status = as_map(pod.get("spec")), as_map(pod.get("status"))
    names = [as_str(c.get("resourceClaimName")) for c in map(as_map, as_list(spec.get("resourceClaims")))]
    names += [as_str(c.get("resourceClaimName")) for c in map(as_map, as_list(status.get("resourceClaimStatuses")))]
    names.append(as_str(as_map(status.get("extendedResourceClaimStatus")).get("resourceClaimName")))
    return list(dict.fromkeys(n for n in names if n))


def uses_claims(pod: Mapping[str, Any]) -> bool:
    """Whether the pod uses ResourceClaims (lists one, or was given one for an extended resource)."""
    spec = as_map(pod.get("spec"))
    return bool(as_list(spec.get("resourceClaims"))) or bool(claim_names(pod))


def tolerates(tolerations: Iterable[Any], taint: Mapping[str, str]) -> bool:
    """Whether core/v1 tolerations (dicts) tolerate `taint` (the scheduler's and the DaemonSet
    controller's rule: an empty key with Exists matches every key; an empty effect every effect;
    Exists ignores the value, Equal (the default) compares it)."""
    for t in map(as_map, tolerations):
        key, op, effect = as_str(t.get("key")), as_str(t.get("operator")) or "Equal", as_str(t.get("effect"))
        if effect and effect != taint["effect"]:
            continue
        if not key and op == "Exists":
            return True
        if key == taint["key"] and (op == "Exists" or as_str(t.get("value")) == taint.get("value", "")):
            return True
    return False


def classify(pods: Iterable[Mapping[str, Any]], index: ClaimIndex, *, selected: frozenset[str] | None = None) -> list[PodEntry]:
    """The node's core/v1 Pod dicts as PodEntry, sorted by namespace/name. index: the ClaimIndex of
    what was read (it says which DaemonSets are DRA drivers). selected: "namespace/name" of the pods
    --pod-selector selects (None: all)."""
    out = []
    for pod in pods:
        meta, spec = as_map(pod.get("metadata")), as_map(pod.get("spec"))
        namespace, name = as_str(meta.get("namespace")), as_str(meta.get("name"))
        claims = uses_claims(pod)
        kind = owner_kind(pod)
        taint: Mapping[str, str] | None = None
        if MIRROR_ANNOTATION in annotations_of(pod):
            role = "static"
        elif kind == "DaemonSet" and index.driver_of_pod(namespace, name) is not None:
            role, taint = "driver", DRIVER_TAINT
        elif kind == "DaemonSet":
            role, taint = ("daemonset-consumer", DAEMONSET_TAINT) if claims else ("daemonset", None)
        elif selected is not None and f"{namespace}/{name}" not in selected:
            role = "unselected"
        else:
            role = "pod"
        out.append(
            PodEntry(
                namespace=namespace,
                name=name,
                uid=as_str(meta.get("uid")),
                role=role,
                terminating=bool(meta.get("deletionTimestamp")),
                finished=as_str(as_map(pod.get("status")).get("phase")) in ("Succeeded", "Failed"),
                claims=claims,
                tolerates=taint is not None and tolerates(as_list(spec.get("tolerations")), taint),
            )
        )
    return sorted(out, key=lambda e: (e.namespace, e.name))


def driver_states(index: ClaimIndex, node: str) -> list[DriverState]:
    """Every DRA driver of `node` (named by its driver pods there, its ResourceSlices or the claims
    allocated there) with the claims that still need it there: the eviction policy's rule
    (attribution.need for each driver pod; ClaimIndex.holds for a driver no pod there serves)."""
    pods: dict[str, list[str]] = {}
    available: dict[str, bool] = {}
    holds: dict[str, dict[str, Hold]] = {}
    for pod, driver in index.driver_pods_on(node):
        need = attribution.need(index, pod, driver)
        up = pod.ready and not pod.terminating and not pod.finished
        for name, _ in need.names:
            pods.setdefault(name, []).append(f"{pod.namespace}/{pod.name}")
            available[name] = available.get(name, False) or up
        for name, hold in need.holds:
            holds.setdefault(name, {})[hold.claim] = hold
    for name in index.slices.drivers_on(node) | index.claim_drivers_on(node):
        if name not in pods:
            pods[name], available[name] = [], False
            for hold in index.holds(name, node):
                holds.setdefault(name, {})[hold.claim] = hold
    return [
        DriverState(name=n, pods=tuple(pods[n]), available=available[n], holds=tuple(holds.get(n, {}).values()))
        for n in sorted(pods)
    ]


def next_step(
    entries: list[PodEntry],
    drivers: list[DriverState],
    *,
    evict_drivers: bool,
    unconfirmed: Mapping[str, str] | None = None,
) -> Step:
    """The next Step of the drain (the phases in the module docstring).

    entries: classify(); drivers: driver_states(); unconfirmed: driver name -> why a departure of
    one of its consumers is not confirmed yet (confirm()); evict_drivers: --evict-drivers.
    """
    live = [e for e in entries if not e.finished]
    held: dict[str, list[str]] = {}  # pod -> "claim C of driver D" it still holds
    for d in drivers:
        for hold in d.holds:
            for holder in hold.pods:
                held.setdefault(holder.removesuffix(" (Terminating)"), []).append(f"claim {hold.claim} of driver {d.name}")
    for phase, role in (("pods", "pod"), ("daemonset-consumers", "daemonset-consumer")):
        pods = [e for e in live if e.role == role]
        if pods:
            tolerating = tuple(
                f"pod {e.key} of a DaemonSet that tolerates taint {DAEMONSET_TAINT['key']}: evicted, it would come back"
                for e in pods
                if e.tolerates and not e.terminating
            )
            return Step(
                phase=phase,
                taint=DAEMONSET_TAINT if role == "daemonset-consumer" else None,
                evict=tuple(e.key for e in pods if not e.terminating and not e.tolerates),
                waiting=tuple(
                    f"pod {e.key} is Terminating" + (f": not unprepared yet {', '.join(held[e.key])}" if e.key in held else "")
                    for e in pods
                    if e.terminating
                ),
                blocked=tolerating,
                drivers=tuple(drivers),
            )
    by_key = {e.key: e for e in entries}
    waiting: list[str] = []
    blocked: list[str] = []
    for d in drivers:
        for hold in d.holds:
            for holder in hold.pods:
                key = holder.removesuffix(" (Terminating)")
                entry = by_key.get(key)
                reason = f"driver {d.name} is needed: claim {hold.claim} is held by {holder}"
                if entry is not None and entry.role in UNEVICTED and not entry.terminating:
                    blocked.append(f"{reason}, which this drain does not evict ({UNEVICTED[entry.role]})")
                elif entry is None and key.endswith(")"):
                    blocked.append(f"{reason}, a consumer that is not a pod: release it yourself")
                else:
                    waiting.append(reason)
        if d.holds and not d.available:
            waiting.append(f"driver {d.name} unavailable while {len(d.holds)} claim(s) are prepared (it must unprepare them)")
    for name, why in sorted((unconfirmed or {}).items()):
        waiting.append(f"driver {name}: {why}")
    if waiting or blocked:
        return Step(phase="release", waiting=tuple(waiting), blocked=tuple(blocked), drivers=tuple(drivers))
    if evict_drivers:
        pods = [e for e in live if e.role == "driver"]
        if pods:
            return Step(
                phase="drivers",
                taint=DRIVER_TAINT,
                evict=tuple(e.key for e in pods if not e.terminating and not e.tolerates),
                waiting=tuple(f"driver pod {e.key} is Terminating" for e in pods if e.terminating),
                blocked=tuple(
                    f"driver pod {e.key}: its DaemonSet tolerates taint {DRIVER_TAINT['key']}: evicted, it would come back"
                    for e in pods
                    if e.tolerates and not e.terminating
                ),
                drivers=tuple(drivers),
            )
    return Step(phase="done", drivers=tuple(drivers), done=True)


def drivers_by_pod(claims: Iterable[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
    """Pod uid -> the drivers of the allocated ResourceClaims (dicts) that reserve it."""
    out: dict[str, set[str]] = {}
    for claim in claims:
        status = as_map(claim.get("status"))
        results = as_list(as_map(as_map(status.get("allocation")).get("devices")).get("results"))
        names = {as_str(r.get("driver")) for r in map(as_map, results)} - {""}
        for ref in map(as_map, as_list(status.get("reservedFor"))):
            if ref.get("resource") == "pods" and as_str(ref.get("uid")):
                out.setdefault(as_str(ref.get("uid")), set()).update(names)
    return {uid: frozenset(n) for uid, n in out.items()}


def left_unseen(last_seen: Mapping[str, Any]) -> bool:
    """Whether a pod whose last seen state (a core/v1 Pod dict: a watch's DELETED object) is
    `last_seen` left without the kubelet's word that its claims were unprepared: the kubelet deletes
    a pod only after writing its terminal phase, which it holds back until unprepare succeeded, so a
    pod deleted while not Succeeded/Failed was force-deleted (or deleted by someone else at once)."""
    return as_str(as_map(last_seen.get("status")).get("phase")) not in ("Succeeded", "Failed")


def confirm(
    driver: str, *, since: float, now: float, gauge: Mapping[str, float] | None, gauge_error: str, safety_seconds: float
) -> tuple[bool, str]:
    """Whether driver `driver` has unprepared what consumers that left without the kubelet's word
    (left_unseen) held, and how that was decided: (confirmed, how).

    gauge: the node's dra_resource_claims_in_use by driver (webhook.kube.nodeapi.parse_claims_in_use), None when it could
    not be read (gauge_error says why): then `safety_seconds` must have passed since `since`
    (monotonic seconds, the last such departure while the driver was available)."""
    if gauge is not None:
        n = gauge.get(driver, 0.0)
        how = f"the kubelet's dra_resource_claims_in_use{{driver_name={driver}}} is {n:g}"
        return n == 0, how
    left = safety_seconds - (now - since)
    how = f"the kubelet's gauge is not readable ({gauge_error}): waiting the safety period of {safety_seconds:g} s"
    return left <= 0, how if left > 0 else how.replace("waiting", "waited")


def read_state(node: Mapping[str, Any]) -> dict[str, Any]:
    """The STATE annotation of a core/v1 Node dict ({} when absent or unreadable)."""
    raw = as_str(annotations_of(node).get(STATE))
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def has_taint(node: Mapping[str, Any], taint: Mapping[str, str]) -> bool:
    """Whether the Node dict carries a taint with `taint`'s key and effect."""
    taints = map(as_map, as_list(as_map(node.get("spec")).get("taints")))
    return any(t.get("key") == taint["key"] and t.get("effect") == taint["effect"] for t in taints)


def holder_verdict(node: Mapping[str, Any], me: str, *, now: float, alive: bool) -> str:
    """What HOLDER on a Node dict means for drain `me` ("<user>@<host>/<pid>"): "free" (none, or
    ours), "stale" (its holder did not renew for LOCK_SECONDS, or `alive` is False: the holder ran
    on this host and its process is gone), or "held". now: seconds since the epoch."""
    import datetime

    annotations = annotations_of(node)
    holder = as_str(annotations.get(HOLDER))
    if not holder or holder == me:
        return "free"
    if not alive:
        return "stale"
    try:
        renewed = datetime.datetime.fromisoformat(as_str(annotations.get(RENEWED)).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "stale"
    return "stale" if now - renewed > LOCK_SECONDS else "held"
