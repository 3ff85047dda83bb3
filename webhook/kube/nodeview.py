"""What `dra-guard drain NODE` reads each round (the node's pods by a watch, claims and owners by
name), its two dry runs, and `dra-guard uncordon NODE` (webhook.kube.nodedrain runs the drain)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from webhook.config import Config
from webhook.kube.nodeapi import NodeApi, holder_alive, identity
from webhook.model import drain as plan
from webhook.model.claim_index import ClaimIndex
from webhook.model.facts import build_facts
from webhook.model.readers import annotations_of, as_list, as_map, as_str

Emit = Callable[[dict[str, Any]], None]


class PodTracker:
    """The node's pods, kept by a list and then watches (so a pod's last state before it was
    deleted is seen: webhook.model.drain.left_unseen). `departed` collects the last state of each
    pod deleted since it was last emptied; a pod missing after a relist (a watch too old) counts as
    departed with an unknown state."""

    def __init__(self, api: NodeApi) -> None:
        self.api = api
        self.pods: dict[str, dict[str, Any]] = {}
        self.departed: list[dict[str, Any]] = []
        self._rv = ""
        self.relist()

    def relist(self) -> None:
        items, self._rv = self.api.list_pods()
        fresh = {as_str(as_map(p.get("metadata")).get("uid")): p for p in items}
        self.departed += [{"metadata": p.get("metadata"), "status": {}} for uid, p in self.pods.items() if uid not in fresh]
        self.pods = fresh

    def poll(self, seconds: float) -> None:
        """Apply the watch events of up to `seconds` seconds (at least 1)."""
        for event in self.api.watch_pods(self._rv, max(1, round(seconds))):
            kind, obj = event.get("type"), as_map(event.get("object"))
            meta = as_map(obj.get("metadata"))
            if kind == "ERROR":
                self.relist()
                return
            if meta.get("resourceVersion"):
                self._rv = as_str(meta.get("resourceVersion"))
            if kind == "BOOKMARK":
                continue
            uid = as_str(meta.get("uid"))
            if kind == "DELETED":
                self.pods.pop(uid, None)
                self.departed.append(dict(obj))
            else:
                self.pods[uid] = dict(obj)

    def take_departed(self) -> list[dict[str, Any]]:
        out, self.departed = self.departed, []
        return out


#: seconds between two reads of a claim while none of the node's pods that name it changed: 1 s,
#: doubled after each such read, at most this. A drain held for an hour by a PodDisruptionBudget
#: then asks about each claim ~720 times, not 3,600; any change of those pods (one leaving,
#: terminating, its status written) makes the claim read again in the next round, so a released
#: claim is seen at once after its pods went and at most this late otherwise.
CLAIM_REREAD_MAX_SECONDS = 5.0


class Reader:
    """What the plan reads each round besides the pods: claims by name (again once a pod naming them
    changed, else backing off to CLAIM_REREAD_MAX_SECONDS), reserving pods elsewhere and DaemonSets
    by name (both kept for the run), the node's ResourceSlices, RBAC once."""

    def __init__(self, api: NodeApi, config: Config, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.config, self.clock = api, config, clock
        self.claim_keys: set[tuple[str, str]] = set()
        #: (namespace, name) -> (the claim as last read or None, when it is due again (clock s),
        #: its current interval (s), the signature of the node's pods naming it then)
        self.claim_reads: dict[tuple[str, str], tuple[dict[str, Any] | None, float, float, tuple[tuple[str, str], ...]]] = {}
        self.elsewhere: dict[tuple[str, str], dict[str, Any] | None] = {}
        self.daemonsets: dict[tuple[str, str], dict[str, Any] | None] = {}
        self.rbac: list[dict[str, Any]] | None = None
        #: pod uid -> the drivers of claims that reserved it (kept: a departed pod's claims may be gone)
        self.pod_drivers: dict[str, frozenset[str]] = {}

    def read(self, node: Mapping[str, Any], pods: list[dict[str, Any]]) -> tuple[ClaimIndex, list[dict[str, Any]]]:
        """(the ClaimIndex of the node as read now, the claims read)."""
        if self.rbac is None:
            self.rbac = self.api.list_rbac()
        for pod in pods:
            ns = as_str(as_map(pod.get("metadata")).get("namespace"))
            self.claim_keys.update((ns, n) for n in plan.claim_names(pod))
            owner = next(
                (o for o in map(as_map, as_list(as_map(pod.get("metadata")).get("ownerReferences"))) if o.get("controller")), {}
            )
            if owner.get("kind") == "DaemonSet" and (ns, as_str(owner.get("name"))) not in self.daemonsets:
                self.daemonsets[(ns, as_str(owner.get("name")))] = self.api.get_daemonset(ns, as_str(owner.get("name")))
        claims = []
        on_node = {as_str(as_map(p.get("metadata")).get("uid")) for p in pods}
        naming: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for pod in pods:
            meta = as_map(pod.get("metadata"))
            for n in plan.claim_names(pod):
                naming.setdefault((as_str(meta.get("namespace")), n), []).append(
                    (as_str(meta.get("uid")), as_str(meta.get("resourceVersion")))
                )
        now = self.clock()
        for ns, name in sorted(self.claim_keys):
            claim = self._claim(ns, name, tuple(sorted(naming.get((ns, name), ()))), now)
            reserved = as_list(as_map((claim or {}).get("status")).get("reservedFor"))
            if claim is None or not reserved:
                self.claim_keys.discard((ns, name))  # released: nobody on this node needs it any more
                self.claim_reads.pop((ns, name), None)
                if claim is None:
                    continue
            claims.append({**claim, "kind": "ResourceClaim"})
            for ref in map(as_map, reserved):
                key = (ns, as_str(ref.get("name")))
                if ref.get("resource") == "pods" and as_str(ref.get("uid")) not in on_node and key not in self.elsewhere:
                    other = self.api.get_pod(*key)
                    # only a pod on another node is kept for the run: one of this node is in `pods`
                    on_other = other is not None and as_str(as_map(other.get("spec")).get("nodeName")) != self.api.node
                    if on_other:
                        self.elsewhere[key] = other
        self.pod_drivers.update(plan.drivers_by_pod(claims))
        objects = [
            {**node, "kind": "Node"},
            *(self.rbac or []),
            *({**d, "kind": "DaemonSet"} for d in self.daemonsets.values() if d),
            *({**p, "kind": "Pod"} for p in pods),
            *({**p, "kind": "Pod"} for p in self.elsewhere.values() if p),
            *self.api.list_slices(),
            *claims,
        ]
        return build_facts(objects, self.config).claims, claims

    def _claim(self, ns: str, name: str, signature: tuple[tuple[str, str], ...], now: float) -> dict[str, Any] | None:
        """Claim ns/name read now, or as last read while it is not due and the node's pods naming
        it (`signature`: their uids and resourceVersions) did not change."""
        last = self.claim_reads.get((ns, name))
        if last is not None and last[3] == signature and now < last[1]:
            return last[0]
        interval = 1.0 if last is None or last[3] != signature else min(last[2] * 2, CLAIM_REREAD_MAX_SECONDS)
        claim = self.api.get_claim(ns, name)
        self.claim_reads[(ns, name)] = (claim, now + interval, interval, signature)
        return claim


class DryRuns:
    """The view of the node and the dry runs, for Drain (webhook.kube.nodedrain), which sets the
    attributes below."""

    api: NodeApi
    config: Config
    node: str
    pod_selector: str
    evict_drivers: bool
    grace_period: int

    def emit(self, event: str, message: str, **data: Any) -> None:
        raise NotImplementedError

    def view(self, node: Mapping[str, Any], pods: list[dict[str, Any]], reader: Reader) -> tuple[ClaimIndex, list[plan.PodEntry]]:
        index, _ = reader.read(node, pods)
        selected = None
        if self.pod_selector:
            items, _ = self.api.list_pods(self.pod_selector)
            selected = frozenset(f"{as_map(p['metadata']).get('namespace')}/{as_map(p['metadata']).get('name')}" for p in items)
        return index, plan.classify(pods, index, selected=selected)

    def plan_only(self, node: Mapping[str, Any]) -> int:
        """--dry-run=client: print the plan from what is read; write nothing."""
        tracker_items, _ = self.api.list_pods()
        index, entries = self.view(node, tracker_items, Reader(self.api, self.config))
        cordoned = bool(as_map(node.get("spec")).get("unschedulable"))
        self.emit("plan", "would cordon the node" if not cordoned else "the node is cordoned already")
        for role, phase, what in (
            ("pod", "pods", "would evict"),
            ("daemonset-consumer", "daemonset-consumers", f"would taint {plan.DAEMONSET_TAINT['key']}, then evict"),
        ):
            pods = [e.key for e in entries if e.role == role and not e.finished]
            if pods:
                self.emit("plan", f"phase {phase}: {what} {', '.join(pods)}", phase=phase, pods=pods)
        for d in plan.driver_states(index, self.node):
            held = "; ".join(f"{h.claim} -> {', '.join(h.pods)}" for h in d.holds) or "no claim held"
            self.emit("plan", f"phase release: would wait until driver {d.name} is not needed ({held})", phase="release")
        drivers = [e.key for e in entries if e.role == "driver" and not e.finished]
        if self.evict_drivers and drivers:
            self.emit(
                "plan",
                f"phase drivers: would taint {plan.DRIVER_TAINT['key']}, then evict {', '.join(drivers)}",
                phase="drivers",
                pods=drivers,
            )
        elif drivers:
            self.emit("plan", f"driver pods stay: {', '.join(drivers)} (--evict-drivers evicts them last)")
        for e in entries:
            if e.role in ("static", "unselected", "daemonset") and not e.finished:
                self.emit("plan", f"pod {e.key} stays ({e.role})")
        return 0

    def server_dry_run(self, node: Mapping[str, Any]) -> int:
        """--dry-run=server: the cordon and every eviction sent with dryRun=All; what the
        apiserver, PodDisruptionBudgets and admission webhooks (dra-guard's) answer is reported.
        1 when an eviction of a consumer would be refused; a driver pod's refusal while claims are
        held is what the real drain waits for, and is reported only."""
        self.api.patch_node({"spec": {"unschedulable": True}}, dry_run=True)
        self.emit("cordon", "cordon accepted (dry run)")
        items, _ = self.api.list_pods()
        index, entries = self.view(node, items, Reader(self.api, self.config))
        refused = 0
        roles = ("pod", "daemonset-consumer", "driver") if self.evict_drivers else ("pod", "daemonset-consumer")
        for e in entries:
            if e.role not in roles or e.finished:
                continue
            status, message = self.api.evict(e.namespace, e.name, grace_period=self.grace_period, dry_run=True)
            if status == 201:
                self.emit("evict", f"eviction of pod {e.key} accepted (dry run)", pod=e.key)
                continue
            if e.role == "driver":
                self.emit(
                    "refused",
                    f"eviction of driver pod {e.key} refused now ({status}): {message}; the drain waits for it",
                    pod=e.key,
                )
                continue
            refused += 1
            self.emit("refused", f"eviction of pod {e.key} would be refused ({status}): {message}", pod=e.key, status=status)
        return 1 if refused else 0


def uncordon(api: NodeApi, emit: Emit) -> int:
    """Undo what drains changed on the node, as recorded in STATE: the taints they added, the
    autoscalers' annotations, and the cordon unless the node was cordoned before. 1 when a drain
    still runs (HOLDER renewed within LOCK_SECONDS by a live process), else 0."""
    said: list[str] = []
    me = identity()

    def change(node: dict[str, Any]) -> dict[str, Any] | None:
        annotations = annotations_of(node)
        holder = as_str(annotations.get(plan.HOLDER))
        if plan.holder_verdict(node, me, now=time.time(), alive=holder_alive(holder)) == "held":
            said[:] = [f"held:{holder}"]
            return None
        state = plan.read_state(node)
        if not state:
            said[:] = ["nothing to restore: no drain by dra-guard is recorded on the node"]
            return None
        keys = set(state.get("taints", []))
        taints = [t for t in map(as_map, as_list(as_map(node.get("spec")).get("taints"))) if t.get("key") not in keys]
        drop = [k for k in state.get("annotations", []) if k in annotations]
        was = bool(state.get("unschedulableBefore"))
        said[:] = [
            ("left cordoned (it was before the drain)" if was else "uncordoned")
            + (f"; removed taints {', '.join(sorted(keys))}" if keys else "")
            + (f"; removed {', '.join(drop)}" if drop else "")
        ]
        return {
            "metadata": {"annotations": {k: None for k in (*drop, plan.STATE, plan.HOLDER, plan.RENEWED)}},
            "spec": {"unschedulable": True if was else None, "taints": taints},
        }

    api.update(change)
    if said and said[0].startswith("held:"):
        emit({"event": "stopped", "node": api.node, "message": f"a drain by {said[0][5:]} still runs; not changed"})
        return 1
    emit({"event": "uncordon", "node": api.node, "message": said[0] if said else "nothing to restore"})
    return 0
