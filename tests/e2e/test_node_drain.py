"""Drain order and driver upgrades with a real kubelet and driver.

A real node (tests/e2e/node.py) runs the test DRA driver (tests/dradriver) and consumer pods whose
ResourceClaims the driver really prepares (a CDI spec file per claim, testdriver.cdi_file) and
unprepares (the file removed, a "dradriver: unprepared claim" log line). The node is tainted
``ToBeDeletedByClusterAutoscaler:NoSchedule`` as the Cluster Autoscaler does before it drains a
node for scale-down: the DaemonSet controller then does not put an evicted driver pod back.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.e2e import objects, testdriver
from tests.e2e.guard import EVICTION_REFUSED, Guard
from tests.e2e.kube import evict, get_json, wait_for
from webhook.model.drain import AUTOSCALER_ANNOTATIONS, HOLDER, STATE

#: the control plane keeps an audit log (tests/e2e/conftest.py real_node): what a drain wrote, read
REAL_NODE_AUDIT_LOG = True
TAINT = "ToBeDeletedByClusterAutoscaler=1700000000:NoSchedule"
GUARD_REFUSAL = EVICTION_REFUSED
#: the startupProbe dra-guard adds to the driver, probed every second: with the default 10 s, each new
#: driver pod (every surge, every restore) would wait ~10 s for its first passing probe, i.e. for Ready.
#: 1 s x 120 is a 2-minute budget, ample for the test driver. The probes themselves are proven in
#: test_node_probes.py; here they only decide when a driver pod is Ready.
PROBES = "probes: {startupProbe: {periodSeconds: 1, failureThreshold: 120}}\n"
#: surge-pair trials on the real node: the race is rare per trial (with the guard removed, both
#: pods left in one trial of 20 in the runs recorded in docs/reliability.md), so fewer trials would
#: pass without the guard; with the 1 s startupProbe period 20 take about a minute
SURGE_PAIR_TRIALS = 20


@pytest.fixture(scope="module")
def driver(real_node):
    """The driver DaemonSet (surge-capable update strategy), running and publishing its ResourceSlice."""
    cp = real_node.cp
    testdriver.apply(
        cp,
        testdriver.driver_objects(cp, strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}),
    )
    wait_for("the driver's ResourceSlice", lambda: (get_json(cp, "resourceslices") or {}).get("items"), timeout=90)
    return cp


@pytest.fixture()
def clean_node(real_node, driver):
    """Each test starts with a Ready driver, no consumer and no taint, and leaves it so."""
    cp = real_node.cp
    restore(cp)
    yield
    restore(cp)


def restore(cp):
    cp.kubectl("admin", "taint", "node", real_node_name(cp), "ToBeDeletedByClusterAutoscaler-", check=False)
    cp.kubectl("admin", "uncordon", real_node_name(cp), check=False)
    cp.kubectl("admin", "delete", "pods", "-n", "work", "--all", "--wait=false", check=False)
    wait_for("consumers gone", lambda: not (get_json(cp, "pods", "-n", "work") or {"items": []})["items"], timeout=90)
    wait_for("a Ready driver", lambda: any(testdriver.ready(p) for p in testdriver.driver_pods(cp)), timeout=90)


def real_node_name(cp):
    return cp.kubectl("admin", "get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout


@pytest.fixture(scope="module")
def guard(real_node, driver, tmp_path_factory):
    g = Guard(real_node.cp, tmp_path_factory.mktemp("dra-guard-drain"))
    g.start(
        mode="enforce",
        extra_config=PROBES,
        driver_service_accounts=(f"{testdriver.NAMESPACE}:{testdriver.SERVICE_ACCOUNT}",),
        declared=((testdriver.NAMESPACE, testdriver.NAME),),
    )
    g.register()
    try:
        yield g
    finally:
        g.stop()


def start_consumer(cp, name, labels=None):
    """Create consumer pod `name` (its own claim from a template; `labels` on the pod); return its
    claim's name and UID once the pod runs and the driver has written the claim's CDI spec."""
    objs = testdriver.consumer_objects(name)
    if labels:
        objs[2]["metadata"]["labels"] = labels
    testdriver.apply(cp, objs)
    pod = wait_for(
        f"{name} Running",
        lambda: (lambda p: p if p and p["status"].get("phase") == "Running" else None)(get_json(cp, "pod", "-n", "work", name)),
        timeout=90,
    )
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    uid = get_json(cp, "resourceclaim", "-n", "work", claim_name)["metadata"]["uid"]
    assert testdriver.cdi_file(uid).exists(), "the driver did not prepare the claim"
    return claim_name, uid


def driver_log(node):
    return node.container_log(testdriver.NAMESPACE, f"{testdriver.NAME}-*", "plugin")


def test_without_dra_guard_evicting_the_driver_strands_the_consumer(real_node, clean_node):
    cp, node = real_node.cp, real_node.node
    claim, uid = start_consumer(cp, "stranded")
    driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    cp.kubectl("admin", "taint", "node", node.name, TAINT)

    assert evict(cp, testdriver.NAMESPACE, driver_pod).status_code == 201  # nothing stops it
    wait_for("the driver pod gone", lambda: not testdriver.driver_pods(cp, include_terminating=True), timeout=60)
    log_offset = len(node.kubelet_log_text())
    evicted_at = time.monotonic()
    assert evict(cp, "work", "stranded").status_code == 201
    # the kubelet stops the consumer after its grace period (5 s), then fails to unprepare its claim
    not_registered = f"DRA driver {testdriver.DRIVER} is not registered"
    wait_for("the kubelet to fail unpreparing", lambda: not_registered in node.kubelet_log_text()[log_offset:], timeout=60)
    time.sleep(max(0.0, evicted_at + 10 - time.monotonic()))  # and still there at 2x the grace period
    pod = get_json(cp, "pod", "-n", "work", "stranded")
    assert pod is not None and pod["metadata"].get("deletionTimestamp"), "the consumer should be stuck Terminating"
    assert testdriver.cdi_file(uid).exists(), "nobody could unprepare the claim"

    # only the driver's return frees it (taint removed: the DaemonSet controller starts it again)
    cp.kubectl("admin", "taint", "node", node.name, "ToBeDeletedByClusterAutoscaler-")
    wait_for("the stranded consumer gone", lambda: get_json(cp, "pod", "-n", "work", "stranded") is None, timeout=90)
    wait_for("the claim unprepared", lambda: not testdriver.cdi_file(uid).exists(), timeout=30)
    assert f"dradriver: unprepared claim work/{claim} uid={uid}" in driver_log(node)


def test_with_dra_guard_the_consumer_goes_first_and_then_the_driver(real_node, clean_node, guard):
    cp, node = real_node.cp, real_node.node
    claim, uid = start_consumer(cp, "consumer")
    driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    cp.kubectl("admin", "taint", "node", node.name, TAINT)
    log_offset = len(node.kubelet_log_text())

    answers = []

    def refused():
        r = evict(cp, testdriver.NAMESPACE, driver_pod)
        answers.append((r.status_code, r.text[:300]))
        assert r.status_code != 201, f"the driver was evicted with a claim prepared: {answers}"
        return (
            [r] if r.status_code == 429 and r.json().get("message", "").startswith(GUARD_REFUSAL) else None
        )  # a 429 Response is falsy

    try:
        resp = wait_for("dra-guard to refuse the driver's eviction", refused, timeout=60)[0]
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; answers {answers[-3:]}; dra-guard log:\n{guard.proc.log()[-3000:]}") from None
    assert f"work/{claim}" in resp.json()["message"]
    assert testdriver.ready(get_json(cp, "pod", "-n", testdriver.NAMESPACE, driver_pod))

    assert evict(cp, "work", "consumer").status_code == 201
    wait_for("the consumer gone", lambda: get_json(cp, "pod", "-n", "work", "consumer") is None, timeout=60)
    assert not testdriver.cdi_file(uid).exists()
    assert f"dradriver: unprepared claim work/{claim} uid={uid} cdi={testdriver.cdi_file(uid)} removed=true" in driver_log(node)

    r = wait_for(
        "the driver's eviction allowed",
        lambda: (lambda r: [r] if r.status_code == 201 else None)(evict(cp, testdriver.NAMESPACE, driver_pod)),
        timeout=60,
    )[0]
    assert r.status_code == 201
    wait_for("the driver pod gone", lambda: not testdriver.driver_pods(cp, include_terminating=True), timeout=60)
    assert "is not registered" not in node.kubelet_log_text()[log_offset:]


def test_a_consumer_whose_claim_is_deleted_under_it_keeps_the_driver_until_the_kubelet_unprepared(real_node, clean_node, guard):
    """A namespace admin removes the finalizer of a running consumer's claim and deletes it: the
    claim objects say nothing is prepared, the node still holds the devices. The driver stays
    (429 naming the vanished claim) until the consumer is gone and the kubelet has unprepared it."""
    cp, node = real_node.cp, real_node.node
    claim, uid = start_consumer(cp, "orphaned")
    driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    cp.kubectl("admin", "taint", "node", node.name, TAINT)
    cp.kubectl("admin", "patch", "resourceclaim", "-n", "work", claim, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    cp.kubectl("admin", "delete", "resourceclaim", "-n", "work", claim, "--wait=false")
    wait_for("the claim gone", lambda: get_json(cp, "resourceclaim", "-n", "work", claim) is None, timeout=30)
    assert testdriver.cdi_file(uid).exists(), "still prepared on the node"

    answers = []

    def names_the_claim():
        r = evict(cp, testdriver.NAMESPACE, driver_pod)
        answers.append((r.status_code, r.text[:400]))
        assert r.status_code != 201, f"the driver was evicted with a claim prepared: {answers[-3:]}"
        return r.status_code == 429 and f"work/{claim} (missing or not allocated" in r.json().get("message", "")

    try:
        wait_for("dra-guard to refuse naming the deleted claim", names_the_claim, timeout=60)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; answers {answers[-3:]}") from None

    assert evict(cp, "work", "orphaned").status_code == 201
    wait_for("the consumer gone", lambda: get_json(cp, "pod", "-n", "work", "orphaned") is None, timeout=60)
    assert not testdriver.cdi_file(uid).exists()
    assert f"dradriver: unprepared claim work/{claim} uid={uid}" in driver_log(node)
    wait_for(
        "the driver's eviction allowed",
        lambda: evict(cp, testdriver.NAMESPACE, driver_pod).status_code == 201,
        timeout=60,
    )


def test_drain_loop_that_evicts_daemonset_pods_empties_the_node_in_order(real_node, clean_node, guard):
    """Like node-maintenance tools and autoscalers: evict every pod on the node, DaemonSet pods
    included, retry each 429 every second, in the order listed (the driver first)."""
    cp, node = real_node.cp, real_node.node
    claims = [start_consumer(cp, name) for name in ("consumer-a", "consumer-b")]
    cp.kubectl("admin", "cordon", node.name)
    cp.kubectl("admin", "taint", "node", node.name, TAINT)
    log_offset = len(node.kubelet_log_text())

    def on_node():
        pods = (get_json(cp, "pods", "-A", "--field-selector", f"spec.nodeName={node.name}") or {"items": []})["items"]
        return sorted(
            ((p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods), key=lambda k: k[0] != testdriver.NAMESPACE
        )

    evicted, refused, seen_log = {}, 0, ""
    deadline = time.monotonic() + 120
    while (pods := on_node()) and time.monotonic() < deadline:
        seen_log = driver_log(node) or seen_log  # the kubelet deletes a pod's log files with the pod
        for ns, name in pods:
            if (ns, name) in evicted:
                continue
            r = evict(cp, ns, name)
            if r.status_code == 201:
                evicted[(ns, name)] = time.monotonic()
            else:
                assert r.status_code == 429, r.text
                refused += 1
        time.sleep(1)
    assert not on_node(), f"pods left on the node (stuck?): {on_node()}"
    driver_evicted = [t for (ns, _), t in evicted.items() if ns == testdriver.NAMESPACE]
    consumers_evicted = [t for (ns, _), t in evicted.items() if ns == "work"]
    assert len(driver_evicted) == 1 and len(consumers_evicted) == 2
    assert refused >= 1 and driver_evicted[0] > max(consumers_evicted), "the driver must leave last"
    for claim, uid in claims:
        assert not testdriver.cdi_file(uid).exists()
        assert f"dradriver: unprepared claim work/{claim} uid={uid}" in seen_log
    assert "is not registered" not in node.kubelet_log_text()[log_offset:]


def test_evict_everything_loop_while_dra_guard_is_down_leaves_the_driver_until_it_is_back(real_node, clean_node, guard):
    """Custom drain logic that evicts every pod of the node in a loop, while dra-guard is down (its
    webhook configuration in place): the apiserver itself refuses the declared driver's eviction
    (failurePolicy Fail), the consumers go and their claims are unprepared by the driver, which
    stays until dra-guard is back and sees the claims released."""
    cp, node = real_node.cp, real_node.node
    claims = [start_consumer(cp, name) for name in ("consumer-a", "consumer-b")]
    cp.kubectl("admin", "cordon", node.name)
    cp.kubectl("admin", "taint", "node", node.name, TAINT)  # no new driver pod once the old one is gone
    guard.stop_server()
    restarted = False
    try:

        def on_node():
            pods = (get_json(cp, "pods", "-A", "--field-selector", f"spec.nodeName={node.name}") or {"items": []})["items"]
            return sorted(
                ((p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods), key=lambda k: k[0] != testdriver.NAMESPACE
            )

        evicted, refused_down, seen_log, gone_at = {}, 0, "", None
        deadline = time.monotonic() + 180
        while (pods := on_node()) and time.monotonic() < deadline:
            seen_log = driver_log(node) or seen_log
            consumers_left = [p for p in pods if p[0] == "work"]
            if not consumers_left and gone_at is None:
                gone_at = time.monotonic()
            if not restarted and gone_at is not None and time.monotonic() - gone_at > 5:
                # the consumers have been gone 5 s and their claims released: the driver is still here,
                # refused by the apiserver alone all that time; now bring dra-guard back
                assert all(ns == testdriver.NAMESPACE for ns, _ in pods), pods
                assert refused_down >= 3
                guard.start(
                    mode="enforce",
                    extra_config=PROBES,
                    driver_service_accounts=(f"{testdriver.NAMESPACE}:{testdriver.SERVICE_ACCOUNT}",),
                )
                restarted = True
            for ns, name in pods:
                if (ns, name) in evicted:
                    continue
                r = evict(cp, ns, name)
                if r.status_code == 201:
                    assert ns != testdriver.NAMESPACE or restarted, f"driver evicted while dra-guard was down: {r.text}"
                    evicted[(ns, name)] = time.monotonic()
                elif not restarted:
                    assert ns == testdriver.NAMESPACE and r.status_code == 500, r.text
                    assert 'failed calling webhook "driver-evictions.dra-guard.io"' in r.json()["message"], r.text
                    refused_down += 1
                else:
                    assert r.status_code == 429, r.text
            time.sleep(1)
        assert not on_node(), f"pods left on the node (stuck?): {on_node()}"
        assert restarted
        driver_evicted = [t for (ns, _), t in evicted.items() if ns == testdriver.NAMESPACE]
        consumers_evicted = [t for (ns, _), t in evicted.items() if ns == "work"]
        assert len(driver_evicted) == 1 and len(consumers_evicted) == 2
        assert driver_evicted[0] > max(consumers_evicted)
        for claim, uid in claims:
            assert not testdriver.cdi_file(uid).exists()
            assert f"dradriver: unprepared claim work/{claim} uid={uid}" in seen_log
    finally:
        if not restarted:
            guard.start(
                mode="enforce",
                extra_config=PROBES,
                driver_service_accounts=(f"{testdriver.NAMESPACE}:{testdriver.SERVICE_ACCOUNT}",),
            )


def test_surge_rollout_of_the_driver_keeps_claims_served(real_node, clean_node, guard):
    """The source page's seamless upgrade: maxSurge 1 / maxUnavailable 0 and the kubelet's
    rolling-update registration (two instances of the driver registered at once)."""
    cp, node = real_node.cp, real_node.node
    claim_a, uid_a = start_consumer(cp, "before-rollout")
    old = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    log_offset = len(node.kubelet_log_text())
    cp.kubectl(
        "admin",
        "patch",
        "daemonset",
        "-n",
        testdriver.NAMESPACE,
        testdriver.NAME,
        "--type=merge",
        "-p",
        '{"spec":{"template":{"metadata":{"annotations":{"e2e/rollout":"2"}}}}}',
    )
    both = wait_for(
        "old and new driver pods running side by side",
        lambda: (lambda ps: ps if len(ps) == 2 and all(p["status"].get("phase") == "Running" for p in ps) else None)(
            testdriver.driver_pods(cp, include_terminating=True)
        ),
        timeout=60,
        interval=0.1,
    )
    new = next(p["metadata"]["name"] for p in both if p["metadata"]["name"] != old)
    claim_b, uid_b = start_consumer(cp, "during-rollout")  # prepared while the rollout runs
    try:
        wait_for(
            "the old driver pod gone",
            lambda: old not in [p["metadata"]["name"] for p in testdriver.driver_pods(cp, include_terminating=True)],
            timeout=90,
        )
    except TimeoutError as exc:
        raise AssertionError(
            f"{exc}: {cp.kubectl('admin', 'get', 'pods', '-A', '-o', 'wide').stdout}\n"
            f"{cp.kubectl('admin', 'describe', 'pod', '-n', testdriver.NAMESPACE, old).stdout[-1500:]}\n"
            f"{node.container_log(testdriver.NAMESPACE, old, 'plugin')[-1500:]}"
        ) from None
    assert testdriver.cdi_file(uid_a).exists() and testdriver.cdi_file(uid_b).exists()
    for name in ("before-rollout", "during-rollout"):
        cp.kubectl("admin", "delete", "pod", "-n", "work", name, "--wait=false")
    wait_for("both consumers gone", lambda: not (get_json(cp, "pods", "-n", "work") or {"items": []})["items"], timeout=60)
    assert not testdriver.cdi_file(uid_a).exists() and not testdriver.cdi_file(uid_b).exists()
    new_log = node.container_log(testdriver.NAMESPACE, new, "plugin")
    assert f"dradriver: unprepared claim work/{claim_a} uid={uid_a}" in new_log  # prepared by the old instance
    assert "is not registered" not in node.kubelet_log_text()[log_offset:]


def surge_pair_trial(cp, ds: list[str], trial: int) -> list[int]:
    """Wait for two Ready driver pods (starting a surge with a new template when one is left) that
    dra-guard sees as peers, send both evictions at the same moment and return their HTTP codes
    once the evicted one is gone."""
    import concurrent.futures

    def both_ready():
        pods = testdriver.driver_pods(cp)
        if len(pods) == 1 and testdriver.ready(pods[0]):  # start a surge: a new template
            cp.kubectl(
                "admin",
                "patch",
                *ds,
                "--type=merge",
                "-p",
                json.dumps({"spec": {"template": {"metadata": {"annotations": {"e2e/pair": str(trial)}}}}}),
            )
        ready = [p for p in pods if testdriver.ready(p)]
        return ready if len(ready) == 2 else None

    pair = [p["metadata"]["name"] for p in wait_for("two Ready driver pods", both_ready, timeout=120, interval=0.5)]

    def seen_as_peers():  # a dry run of one eviction is allowed (a dry run leaves no record)
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pair[0], "namespace": testdriver.NAMESPACE}}
        return (
            cp.session("admin")
            .post(f"{cp.url}/api/v1/namespaces/{testdriver.NAMESPACE}/pods/{pair[0]}/eviction?dryRun=All", json=body, timeout=10)
            .status_code
            == 201
        )

    wait_for("dra-guard to see the Ready peer", seen_as_peers, timeout=30)
    barrier = threading.Barrier(2)

    def send(name):
        barrier.wait()
        return evict(cp, testdriver.NAMESPACE, name).status_code

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        codes = list(pool.map(send, pair))
    evicted = {name for name, code in zip(pair, codes, strict=True) if code == 201}
    if len(evicted) <= 1:
        wait_for(
            "the evicted pod gone",
            lambda: not evicted & {p["metadata"]["name"] for p in testdriver.driver_pods(cp, include_terminating=True)},
            timeout=90,
        )
    return codes


def test_two_evictions_of_a_surge_pair_sent_together_never_both_leave_while_a_claim_is_held(real_node, clean_node, guard):
    """A surge rollout held open (minReadySeconds 3600: the DaemonSet controller keeps the old pod
    while the new one is Ready), a consumer's claim prepared on the node; SURGE_PAIR_TRIALS (20)
    times, both driver pods' evictions sent at the same moment: never both 201 (cluster-autoscaler
    evicts a node's DaemonSet pods together), on the real kubelet's surge pair (two registered
    instances, Ready set by real probes)."""
    cp = real_node.cp
    start_consumer(cp, "held")
    ds = ["daemonset", "-n", testdriver.NAMESPACE, testdriver.NAME]
    cp.kubectl("admin", "patch", *ds, "--type=merge", "-p", '{"spec":{"minReadySeconds":3600}}')
    outcomes = []
    try:
        for trial in range(SURGE_PAIR_TRIALS):
            codes = surge_pair_trial(cp, ds, trial)
            outcomes.append(codes)
            assert codes.count(201) <= 1, f"trial {trial}: both driver pods evicted while a claim is held: {outcomes}"
        # the peer rule still lets one go (3 of 4, as in test_replicas.py)
        assert sum(codes.count(201) == 1 for codes in outcomes) >= SURGE_PAIR_TRIALS * 3 // 4, outcomes
    finally:
        cp.kubectl("admin", "patch", *ds, "--type=merge", "-p", '{"spec":{"minReadySeconds":0}}')


def test_dra_guard_drain_evict_drivers_takes_the_consumers_first_and_the_driver_last(real_node, clean_node, guard, tmp_path):
    """`dra-guard drain NODE --evict-drivers` on the real node: a Deployment with a claim template,
    a bare pod with a named claim and a pod without claims leave first and the driver unprepares
    their claims; then the driver pod goes (tainted only now, so its DaemonSet does not put it back)
    and the kubelet removes its ResourceSlice. dra-guard's webhook never had to refuse the driver
    (the drain never asked early), no claim was unprepared after the driver's eviction, and the
    kubelet never missed the driver. `dra-guard uncordon` brings the driver back."""
    import subprocess
    import sys

    from webhook.model.drain import claim_names

    cp, node = real_node.cp, real_node.node
    template = testdriver.consumer_objects("deployed")[1]
    named_claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "named", "namespace": "work"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": testdriver.DEVICE_CLASS}}]}},
    }
    bare = testdriver.consumer_objects("bare")[2]
    bare["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "named"}]
    plain = testdriver.consumer_objects("plain")[2]
    del plain["spec"]["resourceClaims"], plain["spec"]["containers"][0]["resources"]
    pod_template = testdriver.consumer_objects("deployed")[2]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "deployed", "namespace": "work"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "deployed"}},
            "template": {"metadata": {"labels": {"app": "deployed"}}, "spec": pod_template["spec"]},
        },
    }
    testdriver.apply(cp, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "work"}}, template, named_claim])
    testdriver.apply(cp, [bare, plain, deployment])
    try:
        running = wait_for(
            "three consumers Running",
            lambda: (lambda ps: ps if len(ps) == 3 and all(p["status"].get("phase") == "Running" for p in ps) else None)(
                (get_json(cp, "pods", "-n", "work") or {"items": []})["items"]
            ),
            timeout=90,
        )
        uids = [get_json(cp, "resourceclaim", "-n", "work", name)["metadata"]["uid"] for p in running for name in claim_names(p)]
        assert len(uids) == 2 and all(testdriver.cdi_file(u).exists() for u in uids)
        driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
        log_offset = len(node.kubelet_log_text())
        seen_log = [""]
        stop = threading.Event()

        def keep_log():  # the kubelet deletes a pod's log files with the pod
            while not stop.is_set():
                seen_log[0] = driver_log(node) or seen_log[0]
                time.sleep(0.2)

        watcher = threading.Thread(target=keep_log, daemon=True)
        watcher.start()
        try:
            out = subprocess.run(
                [sys.executable, "-m", "webhook.cli", "drain", node.name, "--evict-drivers", "--timeout", "120s", "-o", "json"]
                + ["--kubeconfig", str(cp.kubeconfig("admin"))],
                capture_output=True,
                text=True,
                timeout=180,
            )
            wait_for("the driver pod gone", lambda: not testdriver.driver_pods(cp, include_terminating=True), timeout=60)
            time.sleep(0.5)
        finally:
            stop.set()
            watcher.join()
        assert out.returncode == 0, out.stdout + out.stderr
        events = [json.loads(line) for line in out.stdout.splitlines()]
        evicted = [e["pod"] for e in events if e["event"] == "evict"]
        assert evicted[-1] == f"{testdriver.NAMESPACE}/{driver_pod}", evicted
        assert {p["metadata"]["name"] for p in running} == {k.split("/")[1] for k in evicted[:-1]}
        assert not [e for e in events if e["event"] == "refused"], "dra-guard (or a PDB) refused an eviction"
        lines = seen_log[0].splitlines()
        stopping = next(i for i, line in enumerate(lines) if "dradriver: stopping" in line)
        assert not [line for line in lines[stopping:] if "unprepared claim" in line], "unprepared after the driver's eviction"
        for uid in uids:
            assert not testdriver.cdi_file(uid).exists()
            assert any("dradriver: unprepared claim" in line and f"uid={uid}" in line for line in lines[:stopping]), uid
        assert "is not registered" not in node.kubelet_log_text()[log_offset:]
        time.sleep(2)
        assert not testdriver.driver_pods(cp, include_terminating=True), "the DaemonSet put the driver back"
        wait_for(
            "the kubelet to remove the driver's ResourceSlice",
            lambda: (
                not (get_json(cp, "resourceslices", "--field-selector", f"spec.nodeName={node.name}") or {"items": [1]})["items"]
            ),
            timeout=60,
        )
    finally:
        cp.kubectl("admin", "delete", "deployment", "-n", "work", "deployed", "--wait=false", check=False)
        cp.kubectl("admin", "delete", "resourceclaim", "-n", "work", "named", "--wait=false", check=False)
        subprocess.run(
            [sys.executable, "-m", "webhook.cli", "uncordon", node.name, "--kubeconfig", str(cp.kubeconfig("admin"))],
            capture_output=True,
            timeout=60,
        )


# ------------------------------------------------------------------ `dra-guard drain` scenarios
#
# Each runs `dra-guard drain` against the real node with the module's driver and dra-guard, and
# checks what the issue's acceptance asks of every scenario: the exit code, that no claim's
# "unprepared claim" line in the driver's log comes after the evicted driver pod's "stopping" line
# (its SIGTERM), and that the kubelet never logged "DRA driver ... is not registered". Timeouts are
# short (the drain's 1 s rounds) and the driver's unprepare delay a few seconds, to keep the set fast.

NOT_REGISTERED = f"DRA driver {testdriver.DRIVER} is not registered"


def cri_time(stamp: str) -> float:
    """Seconds since the epoch of a CRI log line's RFC 3339 timestamp (nanoseconds, trailing zeros cut)."""
    import datetime
    import re

    m = re.fullmatch(r"([0-9T:-]+)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", stamp)
    assert m, stamp
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.datetime.fromisoformat(m.group(1) + zone).timestamp() + float("0." + (m.group(2) or "0"))


class DriverLogs:
    """Every driver pod's log, kept while the scenario runs (the kubelet deletes a pod's log files
    with the pod): `lines()` gives (time, pod name, message) of all of them, oldest first."""

    def __init__(self) -> None:
        from tests.e2e.node import POD_LOGS

        self.root = POD_LOGS
        self.texts: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DriverLogs:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._read()

    def _read(self) -> None:
        for pod_dir in self.root.glob(f"{testdriver.NAMESPACE}_{testdriver.NAME}-*"):
            parts = []
            try:
                # a pod's folder may go between the two globs (the kubelet removing a deleted pod's
                # logs), and Path.glob raises FileNotFoundError then: that would end this thread
                # and lose every later line
                logs = sorted((pod_dir / "plugin").glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else 0)
            except OSError:
                continue
            for log in logs:
                try:
                    parts.append(log.read_text(errors="replace"))
                except OSError:
                    continue
            if "".join(parts):
                self.texts[pod_dir.name] = "".join(parts)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._read()
            except OSError:
                pass  # a log folder removed while read: the next round reads what is left
            self._stop.wait(0.2)

    def lines(self) -> list[tuple[float, str, str]]:
        self._read()
        out = []
        for pod_dir, text in self.texts.items():
            pod = pod_dir.split("_")[1]
            for line in text.splitlines():
                stamp, _, rest = line.partition(" ")
                content = rest.split(" ", 2)[-1]  # after the stream and the CRI tag
                at = content.find("dradriver:")  # after the driver's own date and time
                out.append((cri_time(stamp), pod, content[at:] if at >= 0 else content))
        return sorted(out)

    def text(self) -> str:
        return "\n".join(f"{pod}: {msg}" for _, pod, msg in self.lines())


class DrainRun:
    """`dra-guard drain NODE ARGS -o json --kubeconfig USER` (admin by default) started in the
    background; `events` fills as it prints, each with ``_at``: when the test read it (seconds since
    the epoch, as the CRI log's times); `kubelet_offset_at_driver_eviction`: the kubelet log's
    length when the drain said it evicted a driver pod."""

    def __init__(self, real_node, *args: str, user: str = "admin") -> None:
        import subprocess
        import sys

        self.node = real_node.node
        argv = [sys.executable, "-m", "webhook.cli", "drain", self.node.name, *args, "-o", "json"]
        argv += ["--kubeconfig", str(real_node.cp.kubeconfig(user))]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.events: list[dict] = []
        self.kubelet_offset_at_driver_eviction: int | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if not line.strip():
                continue
            event = {**json.loads(line), "_at": time.time()}
            if event["event"] == "evict" and event["pod"].startswith(f"{testdriver.NAMESPACE}/"):
                if self.kubelet_offset_at_driver_eviction is None:
                    self.kubelet_offset_at_driver_eviction = len(self.node.kubelet_log_text())
            self.events.append(event)

    def wait_event(self, what: str, pred, timeout: float = 60):
        return wait_for(what, lambda: next((e for e in list(self.events) if pred(e)), None), timeout=timeout, interval=0.2)

    def finish(self, timeout: float = 120) -> int | None:
        """The drain's exit code; None when it had to be killed after `timeout` seconds."""
        import subprocess

        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        self._reader.join(timeout=10)
        return self.proc.returncode

    def kill(self) -> None:
        import os
        import signal

        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join(timeout=10)

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr else ""

    def messages(self) -> list[str]:
        return [e["message"] for e in self.events]

    def evicted(self) -> list[str]:
        return [e["pod"] for e in self.events if e["event"] == "evict"]

    def stopped(self) -> str:
        return "\n".join(
            e["message"] + "".join(f"\n  - {r}" for r in e.get("reasons") or []) for e in self.events if e["event"] == "stopped"
        )


def drain(real_node, *args: str, timeout: float = 120, user: str = "admin") -> DrainRun:
    run = DrainRun(real_node, *args, user=user)
    run.finish(timeout)
    return run


def assert_driver_last(runs: list[DrainRun], logs: DriverLogs, node, kubelet_offset: int, uids=(), *, not_registered_from=None):
    """The acceptance's checks on a scenario's drain runs: no "unprepared claim" line of the driver
    after the SIGTERM ("stopping") of a driver pod the drains evicted; each claim uid in `uids`
    unprepared before; the kubelet never logged NOT_REGISTERED since `kubelet_offset` (or, when
    given, since `not_registered_from`)."""
    lines = logs.lines()
    evicted = {pod.split("/")[1] for run in runs for pod in run.evicted() if pod.startswith(f"{testdriver.NAMESPACE}/")}
    stops = [t for t, pod, msg in lines if pod in evicted and msg.startswith("dradriver: stopping")]
    assert not evicted or stops, f"evicted driver pods {evicted} never logged stopping:\n{logs.text()[-3000:]}"
    first_stop = min(stops, default=float("inf"))
    late = [f"{pod}: {msg}" for t, pod, msg in lines if "unprepared claim" in msg and t > first_stop]
    assert not late, f"unprepared after the driver pod's eviction: {late}"
    for uid in uids:
        assert any("unprepared claim" in msg and f"uid={uid}" in msg for t, _, msg in lines if t < first_stop), (
            f"claim {uid} never unprepared before the driver left:\n{logs.text()[-3000:]}"
        )
        assert not testdriver.cdi_file(uid).exists()
    since = kubelet_offset if not_registered_from is None else not_registered_from
    assert NOT_REGISTERED not in node.kubelet_log_text()[since:], "the kubelet missed the driver"


@pytest.fixture()
def drain_scene(real_node, clean_node, guard):
    """A scenario of `dra-guard drain` on the real node: the driver's fault files removed, PDBs
    deleted and `dra-guard uncordon` run after it (before clean_node's own restore)."""
    import subprocess
    import sys

    cp = real_node.cp
    ds = ["daemonset", "-n", testdriver.NAMESPACE, testdriver.NAME]
    if not get_json(cp, *ds)["spec"]["template"]["spec"]["containers"][0].get("startupProbe"):
        # made before dra-guard was registered: an update lets dra-guard add its probes, whose
        # startupProbe keeps a restarted driver not Ready while testdriver.UNHEALTHY_FILE exists
        patch = {"spec": {"template": {"metadata": {"annotations": {"e2e/probes": "dra-guard"}}}}}
        cp.kubectl("admin", "patch", *ds, "--type=merge", "-p", json.dumps(patch))
        assert get_json(cp, *ds)["spec"]["template"]["spec"]["containers"][0].get("startupProbe"), "dra-guard added no probe"
        wait_for(
            "one Ready driver pod with dra-guard's probes",
            lambda: (
                (pods := testdriver.driver_pods(cp, include_terminating=True))
                and len(pods) == 1
                and testdriver.ready(pods[0])
                and pods[0]["spec"]["containers"][0].get("startupProbe")
            ),
            timeout=90,
        )
    yield real_node
    for f in (testdriver.UNPREPARE_FAIL_FILE, testdriver.UNPREPARE_DELAY_FILE, testdriver.UNHEALTHY_FILE):
        f.unlink(missing_ok=True)
    cp.kubectl("admin", "delete", "pdb", "-n", "work", "--all", "--wait=false", check=False)
    subprocess.run(
        [sys.executable, "-m", "webhook.cli", "uncordon", real_node.node.name, "--kubeconfig", str(cp.kubeconfig("admin"))],
        capture_output=True,
        timeout=60,
    )


def test_drain_stopped_by_a_pdb_names_it_keeps_the_driver_and_a_rerun_after_relaxing_it_finishes(drain_scene):
    """A PDB (minAvailable 1) over the only consumer: `drain --evict-drivers` stops at its timeout
    (exit 1) naming the PDB and the pod, nothing deleted, the driver still there; with the PDB
    relaxed (minAvailable 0; a bare pod cannot have maxUnavailable) a rerun without
    --evict-drivers exits 0 "safe to power off": the consumer gone and unprepared, the driver kept."""
    cp, node = drain_scene.cp, drain_scene.node
    claim, uid = start_consumer(cp, "guarded", {"app": "guarded"})
    testdriver.apply(
        cp,
        [
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "keep-one", "namespace": "work"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
            }
        ],
    )
    wait_for(
        "the PDB counted",
        lambda: ((get_json(cp, "pdb", "-n", "work", "keep-one") or {}).get("status") or {}).get("currentHealthy") == 1,
        timeout=30,
    )
    driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    offset = len(node.kubelet_log_text())
    with DriverLogs() as logs:
        first = drain(drain_scene, "--evict-drivers", "--timeout", "6s")
        assert first.proc.returncode == 1, first.messages() + [first.stderr()]
        stopped = first.stopped()
        assert "timed out" in stopped and "work/guarded" in stopped and "keep-one" in stopped, stopped
        pod = get_json(cp, "pod", "-n", "work", "guarded")
        assert pod and not pod["metadata"].get("deletionTimestamp"), "a PDB-protected pod was deleted"
        assert [p["metadata"]["name"] for p in testdriver.driver_pods(cp, include_terminating=True)] == [driver_pod]
        assert testdriver.cdi_file(uid).exists()

        cp.kubectl(
            "admin",
            "patch",
            "pdb",
            "-n",
            "work",
            "keep-one",
            "--type=merge",
            "-p",
            '{"spec":{"minAvailable":0}}',
        )
        wait_for(
            "the PDB relaxed",
            lambda: ((get_json(cp, "pdb", "-n", "work", "keep-one") or {}).get("status") or {}).get("disruptionsAllowed") == 1,
            timeout=30,
        )
        second = drain(drain_scene, "--timeout", "60s")  # without --evict-drivers: the driver stays
        assert second.proc.returncode == 0, second.messages() + [second.stderr()]
        assert second.evicted() == ["work/guarded"], second.evicted()
        assert "safe to power off" in second.messages()[-1], second.messages()
        assert get_json(cp, "pod", "-n", "work", "guarded") is None
        assert [p["metadata"]["name"] for p in testdriver.driver_pods(cp, include_terminating=True)] == [driver_pod]
    assert_driver_last([first, second], logs, node, offset, [uid])


def test_drain_with_an_unprepare_that_keeps_failing_stops_naming_pod_claim_and_driver_and_a_rerun_finishes(drain_scene):
    """The driver's unprepare fails (testdriver.UNPREPARE_FAIL_FILE): the evicted consumer stays
    Terminating, the drain stops at its timeout (exit 1) naming the pod, its claim and the driver,
    and the driver stays; the failure removed, a rerun exits 0 with the driver evicted last."""
    cp, node = drain_scene.cp, drain_scene.node
    claim, uid = start_consumer(cp, "stuck")
    driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    offset = len(node.kubelet_log_text())
    testdriver.UNPREPARE_FAIL_FILE.touch()
    with DriverLogs() as logs:
        first = drain(drain_scene, "--evict-drivers", "--timeout", "12s")
        assert first.proc.returncode == 1, first.messages() + [first.stderr()]
        stopped = first.stopped()
        assert f"pod work/stuck is Terminating: not unprepared yet claim work/{claim} of driver {testdriver.DRIVER}" in stopped, (
            stopped
        )
        assert f"dradriver: unprepare of claim work/{claim} uid={uid} failed" in logs.text(), "the kubelet never asked"
        assert [p["metadata"]["name"] for p in testdriver.driver_pods(cp, include_terminating=True)] == [driver_pod]
        assert testdriver.cdi_file(uid).exists()

        testdriver.UNPREPARE_FAIL_FILE.unlink()
        second = drain(drain_scene, "--evict-drivers", "--timeout", "60s")
        assert second.proc.returncode == 0, second.messages() + [second.stderr()]
        assert second.evicted() == [f"{testdriver.NAMESPACE}/{driver_pod}"], second.evicted()
        wait_for("the driver pod gone", lambda: not testdriver.driver_pods(cp, include_terminating=True), timeout=30)
    assert_driver_last([first, second], logs, node, offset, [uid])


def force_delete_mid_unprepare(drain_scene, name: str, logs: DriverLogs, *args: str, user: str = "admin") -> DrainRun:
    """Start `dra-guard drain ARGS` as `user` and force-delete consumer `name` while the driver
    unprepares its claim (the caller has written testdriver.UNPREPARE_DELAY_FILE): pod and
    reservation vanish before the node has unprepared. Returns the finished run."""
    run = DrainRun(drain_scene, *args, user=user)
    try:
        wait_for("the driver unpreparing", lambda: "unprepare of 1 claim(s) sleeping" in logs.text(), timeout=30, interval=0.1)
        drain_scene.cp.kubectl("admin", "delete", "pod", "-n", "work", name, "--grace-period=0", "--force")
    except BaseException:
        run.kill()
        raise
    run.finish(60)
    return run


def audit_time(event: dict) -> float:
    """Seconds since the epoch of an audit event's requestReceivedTimestamp (RFC 3339, microseconds)."""
    import datetime

    return datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()


def unprepared_at(logs: DriverLogs, uid: str) -> float:
    """When the driver logged that it unprepared claim `uid` (CRI log time)."""
    return next(t for t, _, msg in logs.lines() if "unprepared claim" in msg and f"uid={uid}" in msg)


def test_drain_keeps_the_driver_until_the_kubelets_gauge_says_a_force_deleted_consumers_claim_is_unprepared(drain_scene):
    """The consumer is force-deleted while the driver unprepares its claim (a 4 s unprepare delay).
    The drain sees the pod leave without a terminal phase and, allowed `get nodes/proxy` (admin),
    reads the real kubelet's dra_resource_claims_in_use through the apiserver's node proxy: it
    waits while the gauge says 1 for the driver, confirms at 0, and only then evicts the driver. The
    safety period is set to 1 s, so a drain that took it instead of the gauge would evict the
    driver mid-unprepare (no "unprepared claim" line before its "stopping"; the kubelet missing it)."""
    cp, node = drain_scene.cp, drain_scene.node
    claim, uid = start_consumer(cp, "forced")
    driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    offset = len(node.kubelet_log_text())
    testdriver.UNPREPARE_DELAY_FILE.write_text("4s")
    gauge = f"the kubelet's dra_resource_claims_in_use{{driver_name={testdriver.DRIVER}}} is"
    with DriverLogs() as logs:
        run = force_delete_mid_unprepare(
            drain_scene, "forced", logs, "--evict-drivers", "--timeout", "60s", "--unconfirmed-wait", "1"
        )
        assert run.proc.returncode == 0, run.messages() + [run.stderr()]
        kinds = [e["event"] for e in run.events]
        unconfirmed, confirmed = kinds.index("unconfirmed"), kinds.index("confirmed")
        driver_evicted = next(i for i, e in enumerate(run.events) if e["event"] == "evict" and e["pod"].endswith(driver_pod))
        assert unconfirmed < confirmed < driver_evicted, kinds
        reasons = [r for e in run.events[unconfirmed:confirmed] for r in [e["message"], *(e.get("reasons") or [])]]
        assert any(f"driver {testdriver.DRIVER}: {gauge} 1" in r for r in reasons), reasons  # it waited on the gauge
        assert run.events[confirmed]["message"] == f"driver {testdriver.DRIVER}: {gauge} 0", run.events[confirmed]
        assert not [m for m in run.messages() if "safety period" in m or "not readable" in m], run.messages()
        assert run.events[confirmed]["_at"] > unprepared_at(logs, uid), "confirmed before the driver unprepared"
        wait_for("the driver pod gone", lambda: not testdriver.driver_pods(cp, include_terminating=True), timeout=30)
    assert_driver_last([run], logs, node, offset, [uid])


#: what a drain needs (webhook.kube.nodedrain.REQUIRED), Events and the RBAC reads, but not nodes/proxy
DRAINER_RULES = objects.DRAIN_USER_RULES


@pytest.fixture()
def drainer(real_node):
    """User "bob" bound to a ClusterRole of DRAINER_RULES (removed after the test): a drain user
    without nodes/proxy, whose requests are its own in the audit log."""
    cp = real_node.cp
    bind_user(cp, "e2e-drainer", "bob", DRAINER_RULES)
    yield "bob"
    cp.kubectl("admin", "delete", "clusterrolebinding,clusterrole", "e2e-drainer", check=False)


def bind_user(cp, name: str, user: str, rules: list[dict]) -> None:
    """ClusterRole `name` of `rules` and a ClusterRoleBinding `name` of it to User `user`."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    testdriver.apply(cp, [role, binding])


def test_preflight_on_the_real_node_exits_2_naming_what_is_missing_before_anything_changes(real_node, clean_node):
    """The preflight (SelfSubjectAccessReviews) before any write: a node that does not exist, and a
    user (alice) with every permission the drain needs but `patch nodes` (exit 2, one line naming the verb,
    the node neither cordoned nor marked as held)."""
    import subprocess
    import sys

    cp, node = real_node.cp, real_node.node
    out = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "drain", "no-such-node-e2e", "--kubeconfig", str(cp.kubeconfig("admin"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.strip().splitlines() == [f"dra-guard: error: node no-such-node-e2e not found in {cp.url}"]

    rules = [dict(r, verbs=["get"]) if r["resources"] == ["nodes"] else r for r in DRAINER_RULES]
    bind_user(cp, "e2e-no-patch", "alice", rules)
    try:
        assert cp.kubectl("alice", "auth", "can-i", "patch", "nodes", check=False).stdout.strip() == "no"
        assert (
            cp.kubectl("alice", "auth", "can-i", "create", "pods", "--subresource=eviction", check=False).stdout.strip() == "yes"
        )
        run = drain(real_node, "--timeout", "30s", user="alice", timeout=60)
        assert run.proc.returncode == 2, run.messages()
        err = run.stderr().strip().splitlines()
        assert len(err) == 1 and "missing permission to patch nodes" in err[0], err
        after = get_json(cp, "node", node.name)
        assert not after["spec"].get("unschedulable")
        assert not {HOLDER, STATE} & set(after["metadata"].get("annotations") or {})
    finally:
        cp.kubectl("admin", "delete", "clusterrolebinding,clusterrole", "e2e-no-patch", check=False)


def test_a_drain_user_without_nodes_proxy_takes_the_safety_period_and_says_so(drain_scene, drainer):
    """The same force delete mid-unprepare, drained by a user (bob) with every permission the drain
    needs but not `get nodes/proxy`: the drain cannot read the kubelet's gauge, says so ("no
    permission to get nodes/proxy"), waits the safety period (--unconfirmed-wait 8 s, longer than
    the 4 s unprepare) after the consumer left, and only then says done; the driver stays."""
    cp, node = drain_scene.cp, drain_scene.node
    claim, uid = start_consumer(cp, "forced")
    driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    offset = len(node.kubelet_log_text())
    testdriver.UNPREPARE_DELAY_FILE.write_text("4s")
    assert cp.kubectl(drainer, "auth", "can-i", "get", "nodes", "--subresource=proxy", check=False).stdout.strip() == "no"
    with DriverLogs() as logs:
        run = force_delete_mid_unprepare(drain_scene, "forced", logs, "--timeout", "60s", "--unconfirmed-wait", "8", user=drainer)
        assert run.proc.returncode == 0, run.messages() + [run.stderr()]
        kinds = [e["event"] for e in run.events]
        unconfirmed, confirmed, done = kinds.index("unconfirmed"), kinds.index("confirmed"), kinds.index("done")
        assert unconfirmed < confirmed < done, kinds
        said = (
            f"driver {testdriver.DRIVER}: the kubelet's gauge is not readable (no permission to get nodes/proxy): "
            "waited the safety period of 8 s"
        )
        assert run.events[confirmed]["message"] == said, run.events[confirmed]
        assert not [m for m in run.messages() if "dra_resource_claims_in_use{" in m], run.messages()
        assert run.events[done]["_at"] > unprepared_at(logs, uid), "done before the driver unprepared"
        assert "safe to power off" in run.events[done]["message"]
    assert [p["metadata"]["name"] for p in testdriver.driver_pods(cp, include_terminating=True)] == [driver_pod]
    assert_driver_last([run], logs, node, offset, [uid])


def kill_driver_process() -> int:
    """SIGKILL the test driver's process on this host (a crash: the kubelet restarts the container
    in the same pod); its pid. A crash, not a pod deletion: dra-guard refuses deleting a driver pod
    whose claims are held, as it refuses its eviction."""
    import os
    import pathlib
    import signal

    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0] == b"/dradriver" and f"--driver-name={testdriver.DRIVER}".encode() in argv:
            os.kill(int(entry.name), signal.SIGKILL)
            return int(entry.name)
    raise AssertionError("no driver process found")


def test_drain_reports_a_driver_killed_mid_drain_waits_for_it_and_finishes_when_it_is_back(drain_scene):
    """The consumer's unprepare keeps failing; the driver's process is then killed and comes back
    not Ready (testdriver.UNHEALTHY_FILE fails its startupProbe): the drain says "driver D on N
    unavailable while 1 claim(s) are prepared" and waits, evicting nothing; with both faults gone
    the kubelet unprepares through the restarted driver and the drain evicts it last. The kubelet
    may miss the driver while the test has it killed, never after the drain evicted it."""
    cp, node = drain_scene.cp, drain_scene.node
    claim, uid = start_consumer(cp, "orphan")
    driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    offset = len(node.kubelet_log_text())
    testdriver.UNPREPARE_FAIL_FILE.touch()
    with DriverLogs() as logs:
        run = DrainRun(drain_scene, "--evict-drivers", "--timeout", "90s")
        try:
            wait_for("the unprepare failing", lambda: f"unprepare of claim work/{claim}" in logs.text(), timeout=30)
            testdriver.UNHEALTHY_FILE.touch()
            kill_driver_process()
            try:
                run.wait_event(
                    "the drain to report the driver unavailable",
                    lambda e: any(
                        f"driver {testdriver.DRIVER} on {node.name} unavailable while 1 claim(s) are prepared" in r
                        for r in [e["message"], *(e.get("reasons") or [])]
                    ),
                    timeout=60,
                )
            except TimeoutError as exc:
                pod = get_json(cp, "pod", "-n", testdriver.NAMESPACE, driver_pod) or {}
                raise AssertionError(
                    f"{exc}: {run.messages()}\nstatus: {json.dumps(pod.get('status'))[:3000]}\n"
                    f"probes: {[(k, v) for k, v in pod['spec']['containers'][0].items() if 'robe' in k]}"
                ) from None
            wait_for(
                "the driver restarted",
                lambda: testdriver.restarts(get_json(cp, "pod", "-n", testdriver.NAMESPACE, driver_pod)) >= 1,
                timeout=60,
            )
            assert run.evicted() == ["work/orphan"], run.evicted()
            testdriver.UNHEALTHY_FILE.unlink()
            testdriver.UNPREPARE_FAIL_FILE.unlink()
        except BaseException:
            run.kill()
            raise
        rc = run.finish(90)
        assert rc == 0, run.messages() + [run.stderr()]
        assert run.evicted() == ["work/orphan", f"{testdriver.NAMESPACE}/{driver_pod}"], run.evicted()
        wait_for("the driver pod gone", lambda: not testdriver.driver_pods(cp, include_terminating=True), timeout=30)
    assert run.kubelet_offset_at_driver_eviction is not None
    assert_driver_last([run], logs, node, offset, [uid], not_registered_from=run.kubelet_offset_at_driver_eviction)


def test_drain_one_at_a_time_killed_and_rerun_continues_and_uncordon_keeps_an_earlier_cordon(drain_scene):
    """The node cordoned before; a drain waits for a consumer whose unprepare fails: a second drain
    exits 1 naming the first (holder annotation), `uncordon` refuses (exit 1) while it runs; the
    first is killed (SIGKILL) mid-drain; with the failure removed a rerun takes the node over and
    exits 0 (driver last); `uncordon` then leaves the node cordoned, as it was before."""
    cp, node = drain_scene.cp, drain_scene.node
    claim, uid = start_consumer(cp, "slow")
    cp.kubectl("admin", "cordon", node.name)
    offset = len(node.kubelet_log_text())
    testdriver.UNPREPARE_FAIL_FILE.touch()
    with DriverLogs() as logs:
        first = DrainRun(drain_scene, "--evict-drivers", "--timeout", "120s")
        try:
            first.wait_event("the first drain's eviction", lambda e: e["event"] == "evict", timeout=30)
            holder = get_json(cp, "node", node.name)["metadata"]["annotations"][HOLDER]
            assert holder.endswith(f"/{first.proc.pid}"), holder
            second = drain(drain_scene, "--evict-drivers", "--timeout", "5s", timeout=30)
            assert second.proc.returncode == 1 and f"being drained by {holder}" in second.stopped(), second.messages()
            assert uncordon(drain_scene).returncode == 1
            annotations = get_json(cp, "node", node.name)["metadata"]["annotations"]
            assert set(AUTOSCALER_ANNOTATIONS) <= set(annotations), annotations
        finally:
            first.kill()
        testdriver.UNPREPARE_FAIL_FILE.unlink()
        rerun = drain(drain_scene, "--evict-drivers", "--timeout", "60s")
        assert rerun.proc.returncode == 0, rerun.messages() + [rerun.stderr()]
        assert any(f"taking the node over from {holder}" in m for m in rerun.messages()), rerun.messages()
        assert [e for e in rerun.events if e["event"] == "evict"][-1]["pod"].startswith(f"{testdriver.NAMESPACE}/")
        wait_for("the driver pod gone", lambda: not testdriver.driver_pods(cp, include_terminating=True), timeout=30)
    assert_driver_last([first, second, rerun], logs, node, offset, [uid])
    out = uncordon(drain_scene)
    assert out.returncode == 0 and "left cordoned (it was before the drain)" in out.stdout, out.stdout + out.stderr
    after = get_json(cp, "node", node.name)
    assert after["spec"].get("unschedulable") is True
    assert not {HOLDER, *AUTOSCALER_ANNOTATIONS} & set(after["metadata"].get("annotations") or {})


def uncordon(real_node):
    import subprocess
    import sys

    argv = [
        sys.executable,
        "-m",
        "webhook.cli",
        "uncordon",
        real_node.node.name,
        "--kubeconfig",
        str(real_node.cp.kubeconfig("admin")),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_drain_dry_runs_change_nothing_and_the_server_one_reports_dra_guards_refusal_of_the_driver(drain_scene, drainer):
    """--dry-run=client (run by the drainer user) prints the plan (cordon, the consumer, the release
    wait, the driver last) and writes nothing: the control plane's audit log holds reads of that
    user only, no create/update/patch/delete (an eviction is a create). --dry-run=server sends the
    cordon and the evictions with dryRun=All: the consumer's is accepted, the driver's refused by
    dra-guard's real webhook (its claim is held), and nothing changes either."""
    cp, node = drain_scene.cp, drain_scene.node
    claim, uid = start_consumer(cp, "planned")
    driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    offset = len(node.kubelet_log_text())
    with DriverLogs() as logs:
        started = time.time()
        client = drain(drain_scene, "--evict-drivers", "--dry-run=client", timeout=60, user=drainer)
        assert client.proc.returncode == 0, client.messages() + [client.stderr()]
        text = "\n".join(client.messages())
        assert "would cordon the node" in text and "would evict work/planned" in text, text
        assert f"would wait until driver {testdriver.DRIVER} is not needed (work/{claim} -> work/planned" in text, text
        assert f"then evict {testdriver.NAMESPACE}/{driver_pod}" in text, text
        # a ResponseComplete event may land just after its answer: once a later request of the same
        # user (kubectl's) is in the log, the drain's are too
        cp.kubectl(drainer, "get", "node", node.name, "-o", "name")
        mine = wait_for(
            "the drainer's kubectl request in the audit log",
            lambda: (ev := cp.audit_events(drainer)) and any("kubectl" in e.get("userAgent", "") for e in ev) and ev,
            timeout=10,
        )
        mine = [e for e in mine if "kubectl" not in e.get("userAgent", "") and audit_time(e) >= started]
        assert len(mine) >= 4, [(e["verb"], e["requestURI"]) for e in mine]  # node, pods, claim, slices, ...
        # a SelfSubjectAccessReview is a create that stores nothing (the RBAC reads ask first)
        writes = [
            e
            for e in mine
            if e["verb"] not in ("get", "list", "watch") and e["objectRef"]["resource"] != "selfsubjectaccessreviews"
        ]
        assert not writes, [(e["verb"], e["requestURI"]) for e in writes]

        server = drain(drain_scene, "--evict-drivers", "--dry-run=server", timeout=60)
        assert server.proc.returncode == 0, server.messages() + [server.stderr()]
        text = "\n".join(server.messages())
        assert "cordon accepted (dry run)" in text and "eviction of pod work/planned accepted (dry run)" in text, text
        assert f"eviction of driver pod {testdriver.NAMESPACE}/{driver_pod} refused now (429): " in text, text
        assert GUARD_REFUSAL in text and f"work/{claim}" in text, text
    n = get_json(cp, "node", node.name)
    assert not n["spec"].get("unschedulable") and not n["spec"].get("taints")
    assert not {HOLDER, STATE} & set(n["metadata"].get("annotations") or {})
    pod = get_json(cp, "pod", "-n", "work", "planned")
    assert pod and not pod["metadata"].get("deletionTimestamp") and testdriver.cdi_file(uid).exists()
    assert [p["metadata"]["name"] for p in testdriver.driver_pods(cp, include_terminating=True)] == [driver_pod]
    assert_driver_last([client, server], logs, node, offset)


def test_drain_of_a_node_sharing_a_claim_with_a_simulated_second_node_finishes_when_its_own_pod_is_gone(drain_scene):
    """Devices reachable from two nodes: a ResourceSlice of the test driver with a nodeSelector (a
    rack label on the real node and on a second, simulated node the test plays kubelet for), one
    claim on it allocated by the real scheduler and reserved by a pod on each node. `drain
    --evict-drivers` of the real node exits 0 once its own pod is gone and the real kubelet had the
    driver unprepare the claim there, while the pod on the other node keeps the claim reserved
    ("unreserved everywhere" would never come); the driver goes last."""
    from tests.e2e.cluster import fake_node
    from tests.e2e.fakekubelet import NO_KUBELET, FakeKubelet

    cp, node = drain_scene.cp, drain_scene.node
    other, rack = f"{node.name}-simulated", {"e2e.dra-guard.test/rack": "r1"}
    # the simulated node keeps the driver's DaemonSet away (its pods would only be played there)
    simulated = fake_node(other, labels=rack)
    simulated["spec"] = {"taints": [{"key": "e2e.dra-guard.test/simulated", "value": "true", "effect": "NoSchedule"}]}
    cp.session("admin").post(f"{cp.url}/api/v1/nodes", json=simulated, timeout=10).raise_for_status()
    cp.kubectl("admin", "label", "node", node.name, "e2e.dra-guard.test/rack=r1", "--overwrite")
    shared_slice = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "e2e-rack-r1"},
        "spec": {
            "driver": testdriver.DRIVER,
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": k, "operator": "In", "values": [v]} for k, v in rack.items()]}
                ]
            },
            "pool": {"name": "rack-r1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "fabric-0", "attributes": {"kind": {"string": "fabric"}}}],
        },
    }
    selector = f'device.attributes["{testdriver.DRIVER}"].kind == "fabric"'
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "fabric", "namespace": "work"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "fabric",
                        "exactly": {"deviceClassName": testdriver.DEVICE_CLASS, "selectors": [{"cel": {"expression": selector}}]},
                    }
                ]
            }
        },
    }

    def user(name, on, tolerations=()):
        pod = testdriver.consumer_objects(name)[2]
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "fabric"}]
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": on}
        if tolerations:
            pod["spec"]["tolerations"] = list(tolerations)
        return pod

    driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    offset = len(node.kubelet_log_text())
    try:
        with FakeKubelet(cp, other), DriverLogs() as logs:
            testdriver.apply(cp, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "work"}}, shared_slice, claim])
            away = [*NO_KUBELET, {"key": "e2e.dra-guard.test/simulated", "operator": "Exists"}]
            testdriver.apply(cp, [user("here", node.name), user("there", other, away)])
            reserved = wait_for(
                "both pods reserving the claim, the one here Running",
                lambda: (
                    (c := get_json(cp, "resourceclaim", "-n", "work", "fabric"))
                    and len((c.get("status") or {}).get("reservedFor") or []) == 2
                    and (get_json(cp, "pod", "-n", "work", "here") or {}).get("status", {}).get("phase") == "Running"
                    and c
                ),
                timeout=60,
            )
            uid = reserved["metadata"]["uid"]
            assert testdriver.cdi_file(uid).exists(), "the real node did not prepare the shared claim"
            run = drain(drain_scene, "--evict-drivers", "--timeout", "60s")
            assert run.proc.returncode == 0, run.messages() + [run.stderr()]
            assert run.evicted() == ["work/here", f"{testdriver.NAMESPACE}/{driver_pod}"], run.evicted()
            after = get_json(cp, "resourceclaim", "-n", "work", "fabric")["status"]["reservedFor"]
            assert [r["name"] for r in after] == ["there"], after
            wait_for("the driver pod gone", lambda: not testdriver.driver_pods(cp, include_terminating=True), timeout=30)
        assert_driver_last([run], logs, node, offset, [uid])
    finally:
        cp.kubectl("admin", "delete", "pod", "-n", "work", "there", "--grace-period=0", "--force", check=False)
        cp.kubectl("admin", "delete", "resourceclaim", "-n", "work", "fabric", "--wait=false", check=False)
        cp.kubectl("admin", "delete", "resourceslice", "e2e-rack-r1", check=False)
        cp.kubectl("admin", "delete", "node", other, check=False)
        cp.kubectl("admin", "label", "node", node.name, "e2e.dra-guard.test/rack-", check=False)


#: the taint the node lifecycle controller mirrors a cordon with (removed by it, a moment after an uncordon)
CORDON_TAINT = "node.kubernetes.io/unschedulable"


def test_drain_evicts_a_daemonset_consumer_after_the_pods_keeps_it_away_and_uncordon_removes_only_its_own(drain_scene):
    """A monitoring agent: a DaemonSet that is not a driver, whose pod holds a claim of the test
    driver, beside an ordinary consumer. `drain --evict-drivers`: the ordinary pod first, then the
    DaemonSet taint and the agent, then the driver taint and the driver; the DaemonSet controller
    does not put the agent (nor the driver) back; exit 0, both claims unprepared before the driver's
    SIGTERM, the kubelet never missed the driver. `dra-guard uncordon` then removes the drain's two
    taints and its cordon and keeps a taint the node had before."""
    cp, node = drain_scene.cp, drain_scene.node
    keep = "e2e.dra-guard.test/keep"
    cp.kubectl("admin", "taint", "node", node.name, f"{keep}=yes:PreferNoSchedule")
    objs = testdriver.consumer_objects("agent")
    agent_ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "work"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}}, "spec": objs[2]["spec"]},
        },
    }
    try:
        _, ordinary_uid = start_consumer(cp, "ordinary")
        testdriver.apply(cp, [objs[1], agent_ds])
        agent = wait_for(
            "the agent Running",
            lambda: next(
                (
                    p
                    for p in (get_json(cp, "pods", "-n", "work", "-l", "app=agent") or {"items": []})["items"]
                    if p["status"].get("phase") == "Running"
                ),
                None,
            ),
            timeout=90,
        )
        agent_claim = agent["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        agent_uid = get_json(cp, "resourceclaim", "-n", "work", agent_claim)["metadata"]["uid"]
        assert testdriver.cdi_file(agent_uid).exists()
        driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
        offset = len(node.kubelet_log_text())
        with DriverLogs() as logs:
            run = drain(drain_scene, "--evict-drivers", "--timeout", "90s")
            assert run.proc.returncode == 0, run.messages() + [run.stderr()]
            order = [(e["event"], e.get("pod", e["message"])) for e in run.events if e["event"] in ("evict", "taint")]
            assert order == [
                ("evict", "work/ordinary"),
                ("taint", "tainted drain.dra-guard.io/daemonsets=draining:NoSchedule"),
                ("evict", f"work/{agent['metadata']['name']}"),
                ("taint", "tainted drain.dra-guard.io/drivers=draining:NoSchedule"),
                ("evict", f"{testdriver.NAMESPACE}/{driver_pod}"),
            ], order
            wait_for("the driver pod gone", lambda: not testdriver.driver_pods(cp, include_terminating=True), timeout=30)
            time.sleep(2)  # the DaemonSet controller had its chance to put the agent or the driver back
            assert not (get_json(cp, "pods", "-n", "work") or {"items": []})["items"], "a pod came back"
            assert not testdriver.driver_pods(cp, include_terminating=True), "the driver came back"
        assert_driver_last([run], logs, node, offset, [ordinary_uid, agent_uid])
        # (the node lifecycle controller's node.kubernetes.io/unschedulable follows the cordon: not the drain's)
        drained = get_json(cp, "node", node.name)["spec"]
        assert drained.get("unschedulable") is True
        assert sorted(t["key"] for t in drained.get("taints") or [] if t["key"] != CORDON_TAINT) == [
            "drain.dra-guard.io/daemonsets",
            "drain.dra-guard.io/drivers",
            keep,
        ], drained

        out = uncordon(drain_scene)
        assert out.returncode == 0, out.stdout + out.stderr
        after = get_json(cp, "node", node.name)
        assert not after["spec"].get("unschedulable")
        assert [t["key"] for t in after["spec"].get("taints") or [] if t["key"] != CORDON_TAINT] == [keep], after["spec"]
        assert not {STATE, HOLDER, *AUTOSCALER_ANNOTATIONS} & set(after["metadata"].get("annotations") or {})
        wait_for(
            "the DaemonSet to put the agent back",
            lambda: (get_json(cp, "pods", "-n", "work", "-l", "app=agent") or {"items": []})["items"],
            timeout=30,
        )
    finally:
        cp.kubectl("admin", "delete", "daemonset", "-n", "work", "agent", "--wait=false", check=False)
        cp.kubectl("admin", "delete", "resourceclaimtemplate", "-n", "work", "agent", "--wait=false", check=False)
        cp.kubectl("admin", "taint", "node", node.name, f"{keep}-", check=False)


def test_drain_with_dra_guard_down_in_the_release_phase_keeps_its_order_and_says_why_the_driver_waits(drain_scene, guard):
    """dra-guard's server is stopped (its webhook configuration in place, the eviction webhook's
    failurePolicy Fail as the chart sets it) while the drain waits for the consumer's claim to be
    unprepared (a 6 s unprepare delay). The drain does not lean on the webhook's 429: it asks for
    the driver's eviction only after the driver unprepared; the apiserver then refuses it (500,
    "failed calling webhook"), which `kubectl drain` would give up on; the drain says so, retries,
    and evicts the driver once dra-guard is back: exit 0, the driver last."""
    cp, node = drain_scene.cp, drain_scene.node
    _, uid = start_consumer(cp, "held")
    driver_pod = testdriver.driver_pods(cp)[0]["metadata"]["name"]
    offset = len(node.kubelet_log_text())
    testdriver.UNPREPARE_DELAY_FILE.write_text("6s")
    restarted = False
    try:
        with DriverLogs() as logs:
            run = DrainRun(drain_scene, "--evict-drivers", "--timeout", "120s")
            try:
                run.wait_event("the consumer's eviction", lambda e: e["event"] == "evict", timeout=30)
                guard.stop_server()
                refused = run.wait_event(
                    "the driver's eviction refused while dra-guard is down",
                    lambda e: e["event"] == "refused" and e["pod"].endswith(driver_pod),
                    timeout=60,
                )
                assert refused["status"] == 500, refused
                assert 'failed calling webhook "driver-evictions.dra-guard.io"' in refused["message"], refused
                assert refused["message"].endswith("; retrying"), refused
                first_try = refused["_at"]
                assert first_try > unprepared_at(logs, uid), "the drain asked for the driver before its claim was unprepared"
                time.sleep(2)  # it keeps waiting: the driver stays while dra-guard is down
                assert [p["metadata"]["name"] for p in testdriver.driver_pods(cp, include_terminating=True)] == [driver_pod]
                guard.start(
                    mode="enforce",
                    extra_config=PROBES,
                    driver_service_accounts=(f"{testdriver.NAMESPACE}:{testdriver.SERVICE_ACCOUNT}",),
                )
                restarted = True
            except BaseException:
                run.kill()
                raise
            rc = run.finish(90)
            assert rc == 0, run.messages() + [run.stderr()]
            assert run.evicted() == ["work/held", f"{testdriver.NAMESPACE}/{driver_pod}"], run.evicted()
            # the retried phase puts its taint on once and says so once (no line, no Event each round)
            assert [e["message"] for e in run.events if e["event"] == "taint"] == [
                "tainted drain.dra-guard.io/drivers=draining:NoSchedule"
            ], run.messages()
            waiting = [r for e in run.events if e["event"] == "waiting" for r in e.get("reasons") or []]
            assert any(r.startswith(f"eviction of pod {testdriver.NAMESPACE}/{driver_pod} refused: ") for r in waiting), waiting
            wait_for("the driver pod gone", lambda: not testdriver.driver_pods(cp, include_terminating=True), timeout=30)
        assert_driver_last([run], logs, node, offset, [uid])
    finally:
        if not restarted:
            guard.start(
                mode="enforce",
                extra_config=PROBES,
                driver_service_accounts=(f"{testdriver.NAMESPACE}:{testdriver.SERVICE_ACCOUNT}",),
            )
