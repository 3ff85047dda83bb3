"""`dra-guard drain NODE`'s order (webhook.model.drain, pure): which pod leaves in which phase, what
the drain waits for, what blocks it; the per-node rule is the eviction policy's (attribution.need)."""

from __future__ import annotations

import datetime
import json

import pytest

from tests.builders import claim, driver_daemonset, pod
from webhook.config import from_mapping
from webhook.model import drain
from webhook.model.facts import build_facts

CONFIG = from_mapping(None)
DRIVER = "gpu.example.com"


def ready(p):
    p["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return p


def driver_pod(name="gpu-driver-a", node="node-a", **kw):
    return ready(pod(name, node, namespace="gpu", ds="gpu-driver", **kw))


def ds_pod(name, node="node-a", *, claims=True, tolerations=None, ds="agent"):
    p = pod(name, node, namespace="monitoring", ds=ds)
    if claims:
        p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    if tolerations is not None:
        p["spec"]["tolerations"] = tolerations
    return p


def step_for(objects, *, node="node-a", evict_drivers=False, selected=None, unconfirmed=None):
    objects = [driver_daemonset(name="gpu-driver", namespace="gpu"), *objects]
    index = build_facts(objects, CONFIG).claims
    pods = [o for o in objects if o["kind"] == "Pod" and o["spec"].get("nodeName") == node]
    entries = drain.classify(pods, index, selected=selected)
    return drain.next_step(entries, drain.driver_states(index, node), evict_drivers=evict_drivers, unconfirmed=unconfirmed)


AGENT = ds_pod("agent-a")
PLAIN_DS = ds_pod("logs-a", claims=False, ds="logs")
STATIC = pod("etcd-node-a", "node-a", namespace="kube-system", claims=())
STATIC["metadata"]["annotations"] = {drain.MIRROR_ANNOTATION: "x"}

CASES = [
    # (id, objects, options, phase, evict, waiting contains, blocked contains)
    (
        "ordinary pods first, the consumer and the plain pod together",
        [driver_pod(), pod("consumer", "node-a"), pod("web", "node-a", claims=()), claim("consumer")],
        {},
        "pods",
        ("work/consumer", "work/web"),
        (),
        (),
    ),
    (
        "a Terminating consumer is waited for, not evicted again",
        [driver_pod(), pod("consumer", "node-a", terminating=True), claim("consumer")],
        {},
        "pods",
        (),
        ("pod work/consumer is Terminating: not unprepared yet claim work/consumer of driver gpu.example.com",),
        (),
    ),
    (
        "DaemonSet consumers after the other pods, with the DaemonSet taint",
        [driver_pod(), AGENT, PLAIN_DS, claim("agent-a", namespace="monitoring", reserved=("agent-a",))],
        {},
        "daemonset-consumers",
        ("monitoring/agent-a",),
        (),
        (),
    ),
    (
        "a DaemonSet consumer tolerating every taint is named, not evicted",
        [driver_pod(), ds_pod("agent-a", tolerations=[{"operator": "Exists"}])],
        {},
        "daemonset-consumers",
        (),
        (),
        ("tolerates taint drain.dra-guard.io/daemonsets",),
    ),
    (
        "a Terminating holder keeps the driver needed (the eviction policy's rule)",
        [driver_pod(), claim("consumer"), pod("consumer", "node-a", terminating=True, phase="Running")],
        {"selected": frozenset()},
        "release",
        (),
        ("driver gpu.example.com is needed: claim work/consumer is held by work/consumer (Terminating)",),
        (),
    ),
    (
        "a pod the selector leaves out that holds a claim blocks",
        [driver_pod(), pod("consumer", "node-a"), claim("consumer")],
        {"selected": frozenset()},
        "release",
        (),
        (),
        ("which this drain does not evict (not selected by --pod-selector)",),
    ),
    (
        "a static pod holding a claim blocks",
        [
            driver_pod(),
            {**STATIC, "spec": {**STATIC["spec"], "resourceClaims": [{"name": "g", "resourceClaimName": "s"}]}},
            claim("s", namespace="kube-system", reserved=("etcd-node-a",)),
        ],
        {},
        "release",
        (),
        (),
        ("(a static pod)",),
    ),
    (
        "a consumer that is not a pod is named as blocking",
        [driver_pod(), claim("train", reserved=(), consumers=(("scheduling.k8s.io", "podgroups", "train"),))],
        {},
        "release",
        (),
        (),
        ("a consumer that is not a pod",),
    ),
    (
        "devices reachable from two nodes: the pod on the other node does not hold this node's driver",
        [driver_pod(), pod("other", "node-b"), claim("shared", node=None, reserved=("other",))],
        {},
        "done",
        (),
        (),
        (),
    ),
    (
        "a node-local claim whose reserving pod is unknown is assumed here (waited for)",
        [driver_pod(), claim("ghost", reserved=("gone",))],
        {},
        "release",
        (),
        ("claim work/ghost is held by work/gone",),
        (),
    ),
    (
        "an unconfirmed departure is waited for",
        [driver_pod()],
        {"unconfirmed": {DRIVER: "the kubelet's dra_resource_claims_in_use{driver_name=gpu.example.com} is 1"}},
        "release",
        (),
        ("driver gpu.example.com: the kubelet's dra_resource_claims_in_use",),
        (),
    ),
    (
        "without --evict-drivers the drivers stay and the drain is done",
        [driver_pod(), PLAIN_DS, pod("done-job", "node-a", phase="Succeeded")],
        {},
        "done",
        (),
        (),
        (),
    ),
    (
        "with --evict-drivers the driver pods go last, with the driver taint",
        [driver_pod(), PLAIN_DS],
        {"evict_drivers": True},
        "drivers",
        ("gpu/gpu-driver-a",),
        (),
        (),
    ),
    (
        "the driver pod is not evicted while a consumer is Terminating",
        [driver_pod(), claim("consumer"), pod("consumer", "node-a", phase="Running", terminating=True)],
        {"evict_drivers": True},
        "pods",
        (),
        ("pod work/consumer is Terminating",),
        (),
    ),
    (
        "a driver that is gone while a claim is prepared is reported and waited for",
        [claim("consumer"), pod("consumer", "node-a", terminating=True, claims=("consumer",))],
        {"evict_drivers": True, "selected": frozenset()},
        "release",
        (),
        ("driver gpu.example.com unavailable while 1 claim(s) are prepared",),
        (),
    ),
]


@pytest.mark.parametrize("objects, options, phase, evict, waiting, blocked", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_next_step(objects, options, phase, evict, waiting, blocked):
    step = step_for(objects, **options)
    assert step.phase == phase, step
    assert step.evict == evict, step
    for text in waiting:
        assert any(text in w for w in step.waiting), (text, step.waiting)
    for text in blocked:
        assert any(text in b for b in step.blocked), (text, step.blocked)
    assert step.done == (phase == "done")
    assert step.taint == {"daemonset-consumers": drain.DAEMONSET_TAINT, "drivers": drain.DRIVER_TAINT}.get(phase)


@pytest.mark.parametrize(
    "tolerations, taint, expected",
    [
        ([], drain.DRIVER_TAINT, False),
        ([{"operator": "Exists"}], drain.DRIVER_TAINT, True),
        ([{"operator": "Exists", "effect": "NoExecute"}], drain.DRIVER_TAINT, False),
        ([{"key": "drain.dra-guard.io/drivers", "operator": "Exists"}], drain.DRIVER_TAINT, True),
        ([{"key": "drain.dra-guard.io/drivers", "value": "other"}], drain.DRIVER_TAINT, False),
        ([{"key": "drain.dra-guard.io/drivers", "value": "draining", "effect": "NoSchedule"}], drain.DRIVER_TAINT, True),
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}], drain.DAEMONSET_TAINT, False),
    ],
)
def test_tolerates(tolerations, taint, expected):
    assert drain.tolerates(tolerations, taint) is expected


@pytest.mark.parametrize(
    "phase, unseen",
    [("Succeeded", False), ("Failed", False), ("Running", True), ("Pending", True), ("", True)],
)
def test_a_pod_deleted_before_its_terminal_phase_left_unseen(phase, unseen):
    assert drain.left_unseen({"status": {"phase": phase}}) is unseen


@pytest.mark.parametrize(
    "gauge, since, now, confirmed, says",
    [
        ({"gpu.example.com": 1.0}, 0.0, 1000.0, False, "dra_resource_claims_in_use{driver_name=gpu.example.com} is 1"),
        ({"gpu.example.com": 0.0}, 0.0, 0.0, True, "is 0"),
        ({}, 0.0, 0.0, True, "is 0"),
        (None, 100.0, 150.0, False, "waiting the safety period of 90 s"),
        (None, 100.0, 190.0, True, "waited the safety period of 90 s"),
    ],
)
def test_confirm_reads_the_gauge_else_waits_the_safety_period(gauge, since, now, confirmed, says):
    ok, how = drain.confirm(DRIVER, since=since, now=now, gauge=gauge, gauge_error="403 Forbidden", safety_seconds=90.0)
    assert ok is confirmed and says in how
    assert ("not readable (403 Forbidden)" in how) == (gauge is None)


T0 = datetime.datetime(2026, 12, 5, 3, 0, tzinfo=datetime.UTC).timestamp()


def node(annotations=None):
    return {"metadata": {"name": "node-a", "annotations": annotations or {}}}


@pytest.mark.parametrize(
    "annotations, alive, now, verdict",
    [
        ({}, True, 0.0, "free"),
        ({drain.HOLDER: "me"}, True, 0.0, "free"),
        ({drain.HOLDER: "them", drain.RENEWED: "2026-12-05T03:00:00Z"}, True, T0 + 10, "held"),
        ({drain.HOLDER: "them", drain.RENEWED: "2026-12-05T03:00:00Z"}, True, T0 + 31, "stale"),
        ({drain.HOLDER: "them", drain.RENEWED: "2026-12-05T03:00:00Z"}, False, T0 + 1, "stale"),
        ({drain.HOLDER: "them", drain.RENEWED: "garbage"}, True, 0.0, "stale"),
    ],
)
def test_holder_verdict(annotations, alive, now, verdict):
    assert drain.holder_verdict(node(annotations), "me", now=now, alive=alive) == verdict


def test_state_round_trip_and_unreadable():
    state = {"unschedulableBefore": True, "taints": [], "annotations": []}
    assert drain.read_state(node({drain.STATE: json.dumps(state)})) == state
    assert drain.read_state(node({drain.STATE: "{not json"})) == {}


def test_drivers_by_pod_and_claim_names():
    c = claim("consumer")
    assert drain.drivers_by_pod([c]) == {"uid-work-consumer": frozenset({DRIVER})}
    p = pod("x", "node-a", extended="ext")
    p["status"]["resourceClaimStatuses"] = [{"name": "g", "resourceClaimName": "x-g-abcde"}]
    assert drain.claim_names(p) == ["x-g-abcde", "ext"]
