"""The Kubernetes API side of `dra-guard drain NODE` and `dra-guard uncordon NODE`.

webhook.kube.nodeapi makes every request of a drain, each about its node only: the Node by name,
its pods by field selector ``spec.nodeName`` (a list, then watches from its resourceVersion),
ResourceClaims by name (those its pods name; the reserving pods on other nodes by name), the
DaemonSets of its pods by name, its ResourceSlices by field selector; never the cluster's pods.
webhook.kube.nodeview reads them each round. The order and the rules are webhook.model.drain's
(pure); `drain()` runs them, `uncordon()` undoes what a drain changed.

Every write is a merge patch of the Node (taints and ``unschedulable`` with its resourceVersion,
so a concurrent change is read again rather than overwritten), an Eviction (policy/v1: PDBs and
dra-guard's own webhook are asked; a pod is never deleted), or an Event on the Node.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

from webhook.config import Config
from webhook.kube.client import RESOURCE_GROUP, ClusterError
from webhook.kube.nodeapi import EVENTS_NAMESPACE, NodeApi, holder_alive, identity, now_text, parse_claims_in_use
from webhook.kube.nodeview import DryRuns, Emit, PodTracker, Reader, uncordon
from webhook.model import drain as plan
from webhook.model.readers import annotations_of, as_list, as_map, as_str

__all__ = ["REQUIRED", "DrainOptions", "drain", "uncordon"]

#: (verb, resource, group, subresource, what for) a drain cannot do without
REQUIRED = (
    ("get", "nodes", "", "", "read the node"),
    ("patch", "nodes", "", "", "cordon, taints, annotations"),
    ("list", "pods", "", "", "the node's pods"),
    ("watch", "pods", "", "", "the node's pods"),
    ("get", "pods", "", "", "pods reserving the node's claims"),
    ("create", "pods", "", "eviction", "evict pods"),
    ("get", "resourceclaims", RESOURCE_GROUP, "", "the claims of the node's pods"),
    ("list", "resourceslices", RESOURCE_GROUP, "", "the node's drivers"),
    ("get", "daemonsets", "apps", "", "recognise DRA drivers"),
)


@dataclasses.dataclass(frozen=True)
class DrainOptions:
    """The options of `dra-guard drain` (seconds: timeout 0 = no limit; grace_period -1 = the pod's own)."""

    timeout: float = 0.0
    grace_period: int = -1
    dry_run: str = "none"  # none | client | server
    pod_selector: str = ""
    evict_drivers: bool = False
    safety_seconds: float = plan.SAFETY_SECONDS
    request_timeout: float = 30.0
    interval: float = 1.0


class Drain(DryRuns):
    """One run of `dra-guard drain NODE` (see drain())."""

    def __init__(self, api: NodeApi, config: Config, options: DrainOptions, emit: Emit) -> None:
        self.api, self.config, self.opts, self._emit = api, config, options, emit
        self.pod_selector, self.evict_drivers, self.grace_period = (
            options.pod_selector,
            options.evict_drivers,
            options.grace_period,
        )
        self.node = api.node
        self.me = identity()
        self.gauge_allowed = False
        self.gauge_error = "no permission to get nodes/proxy"
        #: whether the gauge has been read in this run (a failure after that is a moment's)
        self.gauge_seen = False
        self.events_allowed = False
        self._renewed = 0.0

    def emit(self, event: str, message: str, **data: Any) -> None:
        self._emit({"event": event, "node": self.node, "message": message, **data})

    def note(self, node: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on the Node when allowed (the drain goes on when it cannot be written)."""
        if not self.events_allowed:
            return
        try:
            self.api.event(node, reason, message, warning=warning)
        except ClusterError as exc:
            self.events_allowed = False
            self.emit("warning", f"Events on the node are not written any more: {exc}")

    # ---------------------------------------------------------------- preflight

    def preflight(self) -> None:
        """SelfSubjectAccessReviews of REQUIRED; ClusterError naming every missing permission
        before anything changes. Also learns whether nodes/proxy (the kubelet's gauge) and Events
        may be used."""
        missing = [
            f"{verb} {resource}{'/' + sub if sub else ''}{'.' + group if group else ''} ({why})"
            for verb, resource, group, sub, why in REQUIRED
            if not self.api.can_i(verb, resource, group, sub)
        ]
        if missing:
            raise ClusterError(f"cannot drain node {self.node}: missing permission to " + "; ".join(missing))
        self.gauge_allowed = self.api.can_i("get", "nodes", "", "proxy")
        # the Events go to namespace default (NodeApi.event), where a user may be allowed them alone
        self.events_allowed = self.api.can_i("create", "events", namespace=EVENTS_NAMESPACE)

    # ---------------------------------------------------------------- the node's own changes

    def acquire(self) -> str:
        """Take HOLDER for this run; "" when taken, else the holder (another drain runs)."""
        held: list[str] = []

        def take(node: dict[str, Any]) -> dict[str, Any] | None:
            holder = as_str(annotations_of(node).get(plan.HOLDER))
            verdict = plan.holder_verdict(node, self.me, now=time.time(), alive=holder_alive(holder))
            held[:] = [holder] if verdict == "held" else []
            if held:
                return None
            if verdict == "stale":
                self.emit("lock", f"taking the node over from {holder} (gone or silent for {plan.LOCK_SECONDS} s)")
            return {"metadata": {"annotations": {plan.HOLDER: self.me, plan.RENEWED: now_text()}}}

        self.api.update(take)
        self._renewed = time.monotonic()
        return held[0] if held else ""

    def renew(self) -> None:
        if time.monotonic() - self._renewed > plan.LOCK_SECONDS / 3:
            self.api.patch_node({"metadata": {"annotations": {plan.RENEWED: now_text()}}})
            self._renewed = time.monotonic()

    def cordon(self) -> dict[str, Any]:
        """Cordon the node, remembering in STATE whether it was cordoned before (the first run's
        word is kept: a rerun finds the node cordoned by the drain), and add the autoscalers'
        annotations that are absent (recorded in STATE, removed by finish())."""
        said: list[str] = []

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            state = plan.read_state(node)
            spec, annotations = as_map(node.get("spec")), annotations_of(node)
            if not state:
                state = {"unschedulableBefore": bool(spec.get("unschedulable")), "taints": [], "annotations": []}
            added = [k for k in plan.AUTOSCALER_ANNOTATIONS if k not in annotations]
            state["annotations"] = sorted(set(state.get("annotations", [])) | set(added))
            if spec.get("unschedulable") and not added and plan.STATE in annotations:
                return None
            said[:] = [
                ("cordoned" if not spec.get("unschedulable") else "was cordoned already")
                + (f"; set {', '.join(added)}" if added else "")
            ]
            return {
                "metadata": {
                    "annotations": {
                        plan.STATE: json.dumps(state, sort_keys=True),
                        **{k: plan.AUTOSCALER_ANNOTATIONS[k] for k in added},
                    }
                },
                "spec": {"unschedulable": True},
            }

        node = self.api.update(change)
        if said:
            self.emit("cordon", said[0])
            self.note(node, "DraGuardDrainStarted", f"dra-guard drain by {self.me}: {said[0]}")
        return node

    def taint(self, taint: Mapping[str, str]) -> None:
        """Put `taint` on the node (recorded in STATE for uncordon) unless it is there; said (and
        an Event written) only when this call put it there: a phase whose evictions are retried
        calls this each round."""
        added: list[bool] = []

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            added[:] = [not plan.has_taint(node, taint)]
            if not added[0]:
                return None
            state = plan.read_state(node)
            state["taints"] = sorted(set(state.get("taints", [])) | {taint["key"]})
            taints = [*as_list(as_map(node.get("spec")).get("taints")), dict(taint)]
            return {"metadata": {"annotations": {plan.STATE: json.dumps(state, sort_keys=True)}}, "spec": {"taints": taints}}

        node = self.api.update(change)
        if added and added[0]:
            self.emit("taint", f"tainted {taint['key']}={taint['value']}:{taint['effect']}")
            self.note(node, "DraGuardDrainTaint", f"taint {taint['key']}:{taint['effect']}")

    def untaint(self, taint: Mapping[str, str], why: str) -> None:
        """Take `taint` off the node (STATE keeps its key: uncordon has nothing left to remove)."""

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            taints = [t for t in map(as_map, as_list(as_map(node.get("spec")).get("taints"))) if t.get("key") != taint["key"]]
            return {"spec": {"taints": taints}} if plan.has_taint(node, taint) else None

        self.api.update(change)
        self.emit("taint", f"removed taint {taint['key']} so that its DaemonSet can put the driver back: {why}")

    def finish(self) -> None:
        """Remove the autoscalers' annotations this drain added and HOLDER (the drain is over)."""

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            annotations = annotations_of(node)
            if annotations.get(plan.HOLDER) not in (self.me, None):
                return None  # taken over: the other drain removes them
            state = plan.read_state(node)
            drop = [k for k in state.get("annotations", []) if k in annotations]
            patch: dict[str, Any] = {k: None for k in (*drop, plan.HOLDER, plan.RENEWED)}
            if state:
                state["annotations"] = []
                patch[plan.STATE] = json.dumps(state, sort_keys=True)
            return {"metadata": {"annotations": patch}}

        self.api.update(change)

    # ---------------------------------------------------------------- the run

    def run(self) -> int:
        node = self.api.get_node()
        if self.opts.dry_run == "client":
            return self.plan_only(node)
        self.preflight()
        if self.opts.dry_run == "server":
            return self.server_dry_run(node)
        holder = self.acquire()
        if holder:
            self.emit("stopped", f"node {self.node} is being drained by {holder}; not started", reasons=[f"drained by {holder}"])
            return 1
        try:
            return self.loop()
        finally:
            self.finish()

    def loop(self) -> int:
        opts = self.opts
        node = self.cordon()
        deadline = time.monotonic() + opts.timeout if opts.timeout > 0 else None
        tracker, reader = PodTracker(self.api), Reader(self.api, self.config)
        unconfirmed_since: dict[str, float] = {}
        retry: dict[str, tuple[float, float]] = {}  # pod -> (next attempt, delay)
        refusals: dict[str, str] = {}
        evicted: set[str] = set()
        phase = ""
        last_waiting: tuple[str, ...] = ()
        while True:
            self.renew()
            node = self.api.get_node()
            index, entries = self.view(node, list(tracker.pods.values()), reader)
            now = time.monotonic()
            for gone in tracker.take_departed():
                uid = as_str(as_map(gone.get("metadata")).get("uid"))
                if plan.left_unseen(gone):
                    for driver in reader.pod_drivers.get(uid, ()):
                        unconfirmed_since[driver] = now
                        key = f"{as_map(gone.get('metadata')).get('namespace')}/{as_map(gone.get('metadata')).get('name')}"
                        self.emit(
                            "unconfirmed", f"pod {key} left without the kubelet's word that driver {driver} unprepared its claims"
                        )
            drivers = plan.driver_states(index, self.node)
            for d in drivers:
                if d.name in unconfirmed_since and (d.holds or not d.available):
                    unconfirmed_since[d.name] = now  # the safety period counts while the driver can unprepare
            unconfirmed = self.confirm(unconfirmed_since, now)
            step = plan.next_step(entries, drivers, evict_drivers=opts.evict_drivers, unconfirmed=unconfirmed)
            if step.phase != phase:
                phase = step.phase
                if not step.done:
                    self.emit("phase", f"phase {phase}", phase=phase)
                    self.note(node, "DraGuardDrainPhase", f"phase {phase}")
            if step.done:
                word = "drained: its DRA drivers' claims are released" + (
                    " and the driver pods evicted" if opts.evict_drivers else "; the driver pods stay (safe to power off)"
                )
                self.emit("done", word, phase="done")
                self.note(node, "DraGuardDrainDone", word)
                return 0
            # a driver gone while its claims are prepared must be able to come back: the DaemonSet
            # taint (which a driver need not tolerate) is lifted, and DaemonSet consumers wait
            stranded = [d.name for d in drivers if d.holds and not d.available]
            if stranded and plan.has_taint(node, plan.DAEMONSET_TAINT):
                self.untaint(plan.DAEMONSET_TAINT, f"driver {', '.join(stranded)} unavailable with claims prepared")
            evict = () if stranded and step.taint is plan.DAEMONSET_TAINT else step.evict
            in_use = self.in_use(drivers) if step.phase == "drivers" and evict else ()
            evict = () if in_use else evict
            if step.taint is not None and evict and not plan.has_taint(node, step.taint):
                self.taint(step.taint)
            for key in evict:
                at, delay = retry.get(key, (0.0, 0.5))
                if at > now:
                    continue
                ns, _, name = key.partition("/")
                try:
                    status, message = self.api.evict(ns, name, grace_period=opts.grace_period, dry_run=False)
                except ClusterError as exc:
                    if not exc.transient:
                        raise
                    status, message = 0, str(exc)
                if status in (201, 404):
                    refusals.pop(key, None)
                    if key not in evicted:
                        evicted.add(key)
                        self.emit("evict", f"evicted pod {key}", pod=key, phase=phase)
                    retry[key] = (now + 5.0, 5.0)  # not Terminating yet in the next round's read: do not ask again at once
                    continue
                delay = min(delay * 2, 10.0)
                retry[key] = (now + delay, delay)
                if refusals.get(key) != message:
                    self.emit("refused", f"eviction of pod {key} refused ({status}): {message}; retrying", pod=key, status=status)
                refusals[key] = message
            for key in [k for k in refusals if k not in step.evict]:
                del refusals[key]  # gone, or no longer this phase's: its last refusal says nothing now
            absent = tuple(
                f"driver {d.name} on {self.node} unavailable while {len(d.holds)} claim(s) are prepared"
                for d in drivers
                if d.name in stranded and step.phase != "release"  # the release phase names them itself
            )
            waiting = (
                *absent,
                *in_use,
                *step.blocked,
                *step.waiting,
                *(f"eviction of pod {k} refused: {m}" for k, m in sorted(refusals.items())),
            )
            if waiting != last_waiting:
                self.emit(
                    "waiting", waiting[0] if waiting else "waiting", phase=phase, reasons=list(waiting), pods=len(step.evict)
                )
                last_waiting = waiting
            if deadline is not None and time.monotonic() > deadline:
                text = "; ".join(waiting) or f"phase {phase} not finished"
                self.emit(
                    "stopped", f"timed out after {opts.timeout:g} s in phase {phase}: {text}", phase=phase, reasons=list(waiting)
                )
                self.note(node, "DraGuardDrainStopped", f"timed out in phase {phase}: {text}", warning=True)
                return 1
            tracker.poll(opts.interval)

    def in_use(self, drivers: list[plan.DriverState]) -> tuple[str, ...]:
        """Before the driver pods go: what the kubelet's dra_resource_claims_in_use says is still in
        use by the node's drivers, when it can be read (KEP-4381's check before removing a driver;
        it also sees what the API cannot, e.g. a force delete while no drain ran). A read that
        fails for a moment after the gauge was read (read_gauge) holds the drivers this round and
        is asked again; a gauge that cannot be had (no permission, refused by the node proxy, a
        kubelet without it or not answering) is said once and the API's word is taken from then on."""
        if not self.gauge_allowed:
            return ()
        gauge, failed = self.read_gauge()
        if gauge is None:
            return (failed,) if failed else ()
        return tuple(
            f"the kubelet's dra_resource_claims_in_use{{driver_name={d.name}}} is {gauge[d.name]:g}"
            for d in drivers
            if gauge.get(d.name, 0) > 0
        )

    def read_gauge(self) -> tuple[dict[str, float] | None, str]:
        """(the node's dra_resource_claims_in_use by driver, "") or, when it cannot be read now,
        (None, why it waits) for a transient failure (ClusterError.transient) of a gauge read
        before in this run, and (None, "") otherwise, which also turns the gauge off for the rest
        of the run (gauge_allowed, gauge_error; said once). A gauge never read in this run is not
        waited for: a node whose kubelet is gone or has no address (the node proxy answers 5xx)
        would hold every drain of it; a rerun after a kubelet died mid-run starts that way."""
        try:
            gauge = parse_claims_in_use(self.api.node_metrics())
            self.gauge_seen = True
            return gauge, ""
        except ClusterError as exc:
            if exc.transient and self.gauge_seen:
                return None, f"the kubelet's dra_resource_claims_in_use is not readable now ({exc}): asking again"
            error = str(exc)
        except ValueError as exc:
            error = str(exc)
        self.gauge_allowed, self.gauge_error = False, error
        self.emit("warning", f"the kubelet's dra_resource_claims_in_use is not readable ({error}): not asked again")
        return None, ""

    def confirm(self, unconfirmed_since: dict[str, float], now: float) -> dict[str, str]:
        """Driver name -> why it is not yet confirmed that it unprepared what a force-deleted
        consumer held (webhook.model.drain.confirm); confirmed drivers leave `unconfirmed_since`.
        The gauge when it can be had; a moment's failure to read it confirms nothing this round
        (the safety period is for a drain that cannot read the gauge at all, not a way around
        a gauge that said "in use" a second ago)."""
        if not unconfirmed_since:
            return {}
        gauge = None
        if self.gauge_allowed:
            gauge, failed = self.read_gauge()
            if failed:
                return {driver: failed for driver in unconfirmed_since}
        out = {}
        for driver, since in list(unconfirmed_since.items()):
            ok, how = plan.confirm(
                driver, since=since, now=now, gauge=gauge, gauge_error=self.gauge_error, safety_seconds=self.opts.safety_seconds
            )
            if ok:
                del unconfirmed_since[driver]
                self.emit("confirmed", f"driver {driver}: {how}", driver=driver)
            else:
                out[driver] = how
        return out


def drain(api: NodeApi, config: Config, options: DrainOptions, emit: Emit) -> int:
    """Drain the node of `api` (webhook.model.drain's phases); returns 0 done, 1 stopped (another
    drain holds the node, the timeout with what blocks named). Raises ClusterError (exit 2) for a
    node that does not exist, a missing permission (before anything changes) and API failures
    that are not transient. emit() gets one dict per step: {"event", "node", "message", ...}."""
    return Drain(api, config, options, emit).run()
