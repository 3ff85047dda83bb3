"""Drain order: refuse evicting a DRA driver pod while its claims are still prepared on the node.

Source: "Good practices for DRA as a Cluster Admin", section "Draining nodes: drain the DRA driver
last": the driver un-prepares devices (NodeUnprepareResources) when the pods that used them go
away; if the driver leaves the node first, that cleanup cannot finish, the pods stay Terminating
(kubernetes/kubernetes#129402) and their devices cannot be reused. Custom drain logic should check
for allocated and reserved ResourceClaims before terminating the driver.

Decision: the driver pod of driver D on node N (which drivers a pod serves, and the seamless-upgrade
exception: webhook.model.attribution) is still needed while a ResourceClaim has an
allocation result with ``driver == D`` on N (N from ``status.allocation.nodeSelector``, or the node of
a reserving pod for devices usable anywhere) and a ``status.reservedFor`` pod on N that has not
finished (a Terminating pod counts: it is the one waiting for the driver; a pod counts whether or
not it lists the claim), or a ``status.reservedFor`` consumer that is not a pod, which holds on
every node the allocation selects (by name, by node labels, or all). Then the eviction is
refused with HTTP 429 TooManyRequests, which kubectl drain, cluster-autoscaler and Karpenter retry
like a PodDisruptionBudget refusal. Field shapes: resource.k8s.io v1 (v1beta1/v1beta2 have the
same status shape), policy/v1 Eviction. While another Ready pod of the same DaemonSet serves the
node (a surge rollout) the eviction is allowed instead, one pod of the pair at a time: within a
replica by webhook.model.leaving's lock, across replicas by a shared record the serving replica
must own before answering (Decision.record; webhook.kube.records writes it).

The policy reads the ClaimIndex (webhook.model.claim_index), which webhook.kube fills from
watches of ResourceClaims, DaemonSets, (slimmed) Pods and Nodes' labels.

Scope: the chart sends dra-guard only the evictions and DELETEs (``eviction.guardDeletes``) of
the pods of the drivers declared in ``drivers.declared``, with failurePolicy Fail, so the drain
order holds while dra-guard is slow, hung or down (the apiserver refuses them); the DELETE of a
pod already Terminating or stopped and the garbage collector's are never sent. A driver dra-guard recognises that is not declared is
unguarded: audit_objects() reports it (check ``undeclared-driver``) with the value to set.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from webhook.config import Config, DetectionConfig, EvictionConfig
from webhook.model import attribution, drivers, rollout
from webhook.model.claim_index import ClaimIndex
from webhook.model.claims import Hold, PodInfo
from webhook.model.facts import Facts
from webhook.model.leaving import record_for
from webhook.model.readers import as_map, as_str, name_of
from webhook.policies.decision import ALLOW, Decision, Finding, Record, Tally, short

POLICY = "eviction"


# --------------------------------------------------------------------------- the decision


def describe_holds(holds: list[Hold], limit: int) -> str:
    """ "ns/claim -> pod ns/p, ..." for at most `limit` claims, then "and N more"."""
    parts = [f"{h.claim} -> pod {', '.join(h.pods)}" for h in holds[:limit]]
    more = f" and {len(holds) - limit} more" if len(holds) > limit else ""
    return "; ".join(parts) + more


def target(request: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) of the pod an eviction or DELETE review is about. A deletecollection
    reviews each pod it deletes with no request name (the apiserver's per-object validation
    carries the collection's attributes): the pod is then oldObject."""
    namespace, name = as_str(request.get("namespace")), as_str(request.get("name"))
    if not name:
        name = as_str(as_map(as_map(request.get("oldObject")).get("metadata")).get("name"))
    return namespace, name


def already_stopped(old: Mapping[str, Any]) -> bool:
    """Whether a DELETE's oldObject (a core/v1 Pod dict) is Terminating or in a terminal phase:
    its leaving was decided before (the kubelet's final DELETE, the pod garbage collector, the
    DaemonSet controller replacing a failed pod), and an outage of dra-guard must not keep it."""
    return bool(as_map(old.get("metadata")).get("deletionTimestamp")) or as_str(as_map(old.get("status")).get("phase")) in (
        "Succeeded",
        "Failed",
    )


def guarded(request: Mapping[str, Any], config: EvictionConfig) -> bool:
    """Scope: whether the drain-order guard judges this request at all: a pods/eviction CREATE,
    or, when config.guard_deletes, a pod DELETE that is neither the garbage collector's (the pods of
    a deleted owner: removing the driver is its owner's deletion) nor of a pod already Terminating
    or stopped (already_stopped)."""
    if as_str(as_map(request.get("resource")).get("resource")) != "pods":
        return False
    operation, sub = as_str(request.get("operation")), as_str(request.get("subResource"))
    if operation == "CREATE" and sub == "eviction":
        return True
    if operation != "DELETE" or sub or not config.guard_deletes:
        return False
    user = as_str(as_map(request.get("userInfo")).get("username"))
    return user not in config.garbage_collector_users and not already_stopped(as_map(request.get("oldObject")))


def review(
    request: Mapping[str, Any], *, index: ClaimIndex, config: EvictionConfig, synced: tuple[bool, str] = (True, "")
) -> Decision:
    """Judge an AdmissionReview request for CREATE of pods/eviction (policy/v1 or v1beta1 Eviction),
    or, when config.guard_deletes, DELETE of a pod (one DELETE, or each pod of a deletecollection).

    synced: (True, "") when the caches are fresh; otherwise (False, why) and every eviction gets
    429 "not ready, retry" (a drain retries; nothing is lost).
    An allow on the strength of a Ready peer while claims are held (not a dry run) carries
    Decision.record: the serving replica must own the shared record of (DaemonSet, node) before it
    answers (webhook.model.leaving); the record's findings say what to answer when it cannot.
    A DELETE by the DaemonSet controller (config.daemonset_controller_users) of a pod of an older
    template is a rolling update: allowed with a warning when a new pod will come back on the node
    (webhook.model.rollout), refused like anyone's DELETE when none will.
    """
    if not guarded(request, config):
        return ALLOW
    namespace, name = target(request)
    ok, why = synced
    if not ok:
        return not_ready(namespace, name, why)
    found = index.driver_of_pod(namespace, name)
    if found is None:
        return ALLOW
    pod, driver = found
    if not driver.protects:
        return Decision(warnings=(unprotected_warning(pod),))
    if not pod.node:
        return ALLOW
    needed = attribution.need(index, pod, driver)
    if not needed.names:
        return Decision(warnings=(unnamed_warning(pod),))
    if not needed.holds:
        return ALLOW
    still = StillNeeded.of(request, pod, needed, max_listed=config.max_listed_claims)
    if needed.peer:
        return surge(request, index, pod, still, peer_name=needed.peer)
    user = as_str(as_map(request.get("userInfo")).get("username"))
    if still.verb == "delete" and user in config.daemonset_controller_users:
        return rolling_update(index, pod, as_map(request.get("oldObject")), names=still.names, refusal=still.finding)
    return Decision(findings=(still.finding(),))


def surge(request: Mapping[str, Any], index: ClaimIndex, pod: PodInfo, still: StillNeeded, *, peer_name: str) -> Decision:
    """The rule while another pod of the driver's DaemonSet (`peer_name`) serves the node (a surge
    rollout): `pod` may go when that peer is Ready and did not itself leave a moment ago, one pod of
    the pair at a time: within this replica by index.leaving's lock (the peer found and this pod
    recorded as leaving in one step: two evictions of a pair sent together must not each leave on
    the strength of the other), across replicas by the shared record the allow carries
    (Decision.record); a dry run writes no record."""
    with index.leaving.lock:
        peer = attribution.ready_peer(index, pod, leaving=index.leaving.recent())
        if peer and request.get("dryRun") is not True:
            index.leaving.add(still.namespace, still.name)
    if not peer:
        return Decision(
            findings=(
                still.finding(
                    f" (Its Ready peer {peer_name} of the same DaemonSet was allowed to leave a "
                    f"moment ago: one pod of a surge pair goes at a time.)"
                ),
            )
        )
    warning = short(
        f"dra-guard: seamless upgrade: Ready pod {peer} of the same DaemonSet serves driver {still.names} on "
        f"{pod.node}, so {still.name} may go"
    )
    if request.get("dryRun") is True:
        return Decision(warnings=(warning,))
    conflict = still.finding(
        f" (A pod of the same DaemonSet on {pod.node} was allowed to leave a moment ago: one pod of a surge pair goes at a time.)"
    )
    record = Record(lease=record_for(pod, peer, ttl=index.leaving.ttl), conflict=conflict, failed=still.record_failed(peer))
    return Decision(warnings=(warning,), record=record)


# --------------------------------------------------------------------------- wording


def not_ready(namespace: str, name: str, why: str) -> Decision:
    """429 "retry" for an eviction judged while the caches are not ready (`why`)."""
    finding = Finding(
        policy=POLICY,
        kind="Pod",
        namespace=namespace,
        name=name,
        code=429,
        reason="TooManyRequests",
        check="cache-not-ready",
        message=f"dra-guard cannot tell yet whether pod {namespace}/{name} is a DRA driver still needed on its "
        f"node ({why}); retry the eviction shortly.",
        summary=short(f"dra-guard: caches not ready ({why}); retry"),
    )
    return Decision(findings=(finding,))


def unprotected_warning(pod: PodInfo) -> str:
    """The warning for a driver pod whose driver annotation is not trusted."""
    return short(
        f"dra-guard: pod not protected from eviction: {drivers.DRIVER_KEY} on "
        f"DaemonSet {pod.daemonset} is trusted only when its ServiceAccount may write "
        f"ResourceSlices or a drivers.selectors entry matches"
    )


def unnamed_warning(pod: PodInfo) -> str:
    """The warning for a driver pod whose driver name dra-guard cannot tell."""
    return short(
        f"dra-guard: cannot tell the driver name of DaemonSet {pod.daemonset} and no "
        f"unclaimed driver publishes ResourceSlices on {pod.node}; set the "
        f"{drivers.DRIVER_KEY} annotation"
    )


@dataclasses.dataclass(frozen=True)
class StillNeeded:
    """What the refusals of a driver pod still needed on its node say: the pod (namespace, name,
    node), its drivers with claims held there (names, comma-separated; drivers: each), how each
    name was learned, the holds, and the request's verb (evict, delete)."""

    namespace: str
    name: str
    node: str
    names: str
    drivers: tuple[str, ...]
    learned: Mapping[str, str]
    holds: tuple[Hold, ...]
    verb: str
    max_listed: int

    @classmethod
    def of(cls, request: Mapping[str, Any], pod: PodInfo, needed: attribution.Need, *, max_listed: int) -> StillNeeded:
        namespace, name = target(request)
        return cls(
            namespace=namespace,
            name=name,
            node=pod.node,
            names=",".join(needed.held_names),
            drivers=tuple(needed.held_names),
            learned={n: how for n, how in needed.names if n in needed.held_names},
            holds=tuple(dict.fromkeys(h for _, h in needed.holds)),
            verb="evict" if as_str(request.get("operation")) == "CREATE" else "delete",
            max_listed=max_listed,
        )

    @property
    def action(self) -> str:
        return "eviction" if self.verb == "evict" else "deletion"

    def finding(self, note: str = "") -> Finding:
        """The 429 driver-still-needed refusal, `note` added to its message."""
        learned_from = ""
        if any(how.startswith(("ResourceSlice", "ResourceClaim")) for how in self.learned.values()):
            learned_from = " (Driver name learned from: " + "; ".join(f"{n}: {h}" for n, h in self.learned.items()) + ".)"
        message = (
            f"dra-guard: DRA driver pod {self.namespace}/{self.name} (driver {self.names}) is still needed on node "
            f"{self.node}: {len(self.holds)} ResourceClaim(s) allocated to it there are still reserved by pods that have "
            f"not finished: {describe_holds(list(self.holds), self.max_listed)}. Drain the DRA driver last: {self.verb} "
            f"those pods first; this {self.action} can be retried once their claims are released."
        )
        return Finding(
            policy=POLICY,
            kind="Pod",
            namespace=self.namespace,
            name=self.name,
            code=429,
            reason="TooManyRequests",
            check="driver-still-needed",
            message=message + note + learned_from,
            summary=short(f"dra-guard: driver pod {self.name} still needed on {self.node} by {len(self.holds)} claim(s)"),
            details={
                "driver": self.names,
                "drivers": list(self.drivers),
                "learned": dict(self.learned),
                "node": self.node,
                "claims": [h.claim for h in self.holds],
            },
        )

    def record_failed(self, peer: str) -> Finding:
        """The 429 refusal when the shared record of this pod leaving (its Ready `peer` staying) could not be written."""
        return dataclasses.replace(
            self.finding(),
            check="leave-record-failed",
            message=(
                f"dra-guard: DRA driver pod {self.namespace}/{self.name} (driver {self.names}) may leave node {self.node} "
                f"while {len(self.holds)} ResourceClaim(s) there still need the driver only once dra-guard has recorded "
                f"it as leaving (then its Ready peer {peer} stays: one pod of a surge pair goes at a time), and the "
                f"record could not be written; retry the {self.action} shortly."
            ),
            summary=short(f"dra-guard: driver pod {self.name} may go once recorded as leaving; record failed, retry"),
        )


def rolling_update(
    index: ClaimIndex, pod: PodInfo, old: Mapping[str, Any], *, names: str, refusal: Callable[[str], Finding]
) -> Decision:
    """The DaemonSet controller's DELETE of held driver pod `pod` (`old`: the Pod dict) with no Ready
    peer on its node: allowed with a warning when it is a rolling update that puts a new pod back
    (webhook.model.rollout; the node is without the driver until the new pod registers: running
    pods keep their prepared devices, new pods wait); refused otherwise, saying why no pod comes back."""
    daemonset = index.daemonset(pod.namespace, pod.daemonset)
    node = index.nodes.node(pod.node)
    if daemonset is None or node is None:
        why = "dra-guard does not know its DaemonSet or node"
    elif not rollout.outdated(old, daemonset):
        why = "the pod is of the DaemonSet's current template, so this is no rolling update"
    else:
        why = rollout.why_not_placed(daemonset, pod.node, *node)
    if why:
        return Decision(
            findings=(
                refusal(
                    f" (The DaemonSet controller deletes it and no new pod of {pod.daemonset} will come back on {pod.node}: {why}.)"
                ),
            )
        )
    return Decision(
        warnings=(
            short(
                f"dra-guard: rolling update: {pod.node} lacks driver {names} until the new pod is up "
                f"(maxSurge 1, maxUnavailable 0 leaves no gap)"
            ),
        )
    )


def admit(request: Mapping[str, Any], facts: Facts, config: Config) -> Decision:
    """review() over the claim index, refusing with 429 while the caches are older than
    eviction.maxCacheAgeSeconds. (The registry's `review`; its `account` says what the final answer counts.)"""
    return review(request, index=facts.claims, config=config.eviction, synced=facts.fresh(config.eviction.max_cache_age_seconds))


def account(request: Mapping[str, Any], decision: Decision, facts: Facts, *, mode: str) -> Tally:
    """What the drain-order guard's final answer (after any shared record: Decision.settle) counts:
    driver pod evictions by driver and decision (dra_guard_driver_evictions_total: "refused" in
    enforce mode, "would-refuse" in warn and audit mode, where the eviction was let through,
    "allowed"), and the claims blocking a node's driver at its last such eviction
    (dra_guard_blocking_claims). mode: the eviction policy's mode."""
    evictions: list[tuple[str, str]] = []
    blocking: list[tuple[str, int]] = []
    refused = [f for f in decision.findings if f.check in ("driver-still-needed", "leave-record-failed")]
    label = "refused" if mode == "enforce" else "would-refuse"
    for f in refused:
        evictions.extend((name, label) for name in f.details["drivers"])
        blocking.append((f.details["node"], len(f.details["claims"])))
    if not decision.findings:
        found = facts.claims.driver_of_pod(*target(request))
        if found is not None:
            pod, driver = found
            evictions.extend((name, "allowed") for name in driver.names or ("unknown",))
            if pod.node:
                blocking.append((pod.node, 0))
    return Tally(driver_evictions=tuple(evictions), blocking_claims=tuple(blocking))


# --------------------------------------------------------------------------- declared drivers

#: the apiserver cuts a generateName prefix to this many characters (names.SimpleNameGenerator:
#: 63 - 5 random characters), so the pods of DaemonSet D are named (D + "-")[:58] + 5 characters
GENERATED_PREFIX_LIMIT = 58


def eviction_prefix(daemonset: str) -> str:
    """The name prefix the chart's eviction condition matches for declared DaemonSet `daemonset`:
    the DaemonSet controller's generateName "<name>-" as the apiserver cuts it."""
    return f"{daemonset}-"[:GENERATED_PREFIX_LIMIT]


def declared_findings(facts: Facts, config: Config) -> Iterator[Finding]:
    """Advisory findings for entries of drivers.declared the fail-closed webhook does not guard,
    over a whole cluster's objects (a manifest file lacks most DaemonSets): a DaemonSet that does
    not exist (``declared-driver-missing``: a stale entry, e.g. after a release was renamed: the
    driver under its new name is unguarded), and pods of a declared DaemonSet whose names do not
    start with eviction_prefix() (``declared-driver-unmatched``: their evictions never reach dra-guard)."""
    for entry in config.detection.declared:
        namespace, name = entry.namespace, entry.name
        if facts.claims.daemonset(namespace, name) is None:
            yield Finding(
                policy=POLICY,
                kind="DaemonSet",
                namespace=namespace,
                name=name,
                check="declared-driver-missing",
                enforced=False,
                message=f"drivers.declared lists DaemonSet {namespace}/{name}, which does not exist: nothing is guarded "
                f"by that entry. If the driver was renamed (a new release name), declare its DaemonSet under the new name.",
                summary=short(f"dra-guard: declared driver DaemonSet {namespace}/{name} does not exist"),
                details={"namespace": namespace, "name": name},
            )
            continue
        prefix = eviction_prefix(name)
        missed = [p.name for p in facts.claims.daemonset_pods(namespace, name) if not p.name.startswith(prefix)]
        if missed:
            yield Finding(
                policy=POLICY,
                kind="DaemonSet",
                namespace=namespace,
                name=name,
                check="declared-driver-unmatched",
                enforced=False,
                message=f"{len(missed)} pod(s) of declared driver DaemonSet {namespace}/{name} are named without the prefix "
                f"{prefix!r} the eviction webhook matches ({', '.join(missed[:5])}{' ...' if len(missed) > 5 else ''}): "
                f"their evictions are not sent to dra-guard. Pods the DaemonSet controller creates always have it; "
                f"find who created these.",
                summary=short(
                    f"dra-guard: {len(missed)} pod(s) of declared driver {namespace}/{name} escape the eviction webhook"
                ),
                details={"namespace": namespace, "name": name, "pods": missed, "prefix": prefix},
            )


# --------------------------------------------------------------------------- undeclared drivers


def declared_value(detection: DetectionConfig, extra: Iterable[tuple[str, str]]) -> str:
    """The Helm flag that declares every driver of drivers.declared plus `extra` ((namespace, name)
    pairs): ``--set-json 'config.drivers.declared=[{"namespace":...,"name":...}, ...]'``.
    (--set-json replaces the list: it repeats the drivers already declared.)"""
    pairs = list(dict.fromkeys([(d.namespace, d.name) for d in detection.declared] + list(extra)))
    value = json.dumps([{"namespace": ns, "name": name} for ns, name in pairs], separators=(",", ":"))
    return f"--set-json 'config.drivers.declared={value}'"


def undeclared_finding(namespace: str, name: str, *, value: str) -> Finding:
    """The advisory finding for an undeclared driver DaemonSet; `value` from declared_value() for
    this DaemonSet alone: a value naming every undeclared driver in every finding made an audit's
    output grow with the square of the drivers (--suggest-values gives them all at once)."""
    return Finding(
        policy=POLICY,
        kind="DaemonSet",
        namespace=namespace,
        name=name,
        check="undeclared-driver",
        enforced=False,
        message=f"DaemonSet {namespace}/{name} is a DRA driver that is not in drivers.declared: evictions of its pods "
        f"are not sent to dra-guard, so nothing keeps it on a node whose claims still need it. Declare it "
        f"(config file: drivers.declared: [{{namespace: {namespace}, name: {name}}}]; Helm: {value}; every "
        f"undeclared driver at once: dra-guard audit --suggest-values).",
        summary=short(f"dra-guard: driver DaemonSet {namespace}/{name} not in drivers.declared; its evictions are unguarded"),
        details={"namespace": namespace, "name": name, "helm": value},
    )


def audit_objects(facts: Facts, config: Config, objects: Mapping[str, list[dict[str, Any]]]) -> Iterator[Finding]:
    """An ``undeclared-driver`` finding (advisory) for every DaemonSet among `objects` that dra-guard
    recognises as a DRA driver but drivers.declared does not list. (The registry's `audit`.)"""
    found = []
    for ds in objects.get("DaemonSet", []):
        meta = as_map(ds.get("metadata"))
        found.append(
            (
                as_str(meta.get("namespace")),
                name_of(ds),
                drivers.detect(ds, config=config.detection, can_write_slices=facts.service_account_writes_slices),
            )
        )
    for namespace, name in drivers.undeclared(found, config.detection, guard_namespace=config.rbac.guard_namespace):
        yield undeclared_finding(namespace, name, value=declared_value(config.detection, [(namespace, name)]))
