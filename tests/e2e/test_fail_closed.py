"""Failure modes held by the apiserver: with the chart's rendered webhooks, a declared driver's
eviction is refused while dra-guard is hung or gone, and no other eviction waits on dra-guard.

The scenario (bench/eviction_burst.py): a node with one DRA device pool, the declared driver's
DaemonSet pod on it, a consumer whose claim the real scheduler allocated and reserved there.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from bench import eviction_burst as burst
from tests.e2e.guard import EVICTION_REFUSED, Guard
from tests.e2e.kube import apply_objects, audit_findings, evict, wait_for
from tests.scrape import metric, scrape

#: how long the acceptance watches a hung or gone dra-guard
WATCH_SECONDS = 30


@pytest.fixture(scope="module")
def scenario(control_plane, tmp_path_factory):
    cp = control_plane
    guard = Guard(cp, tmp_path_factory.mktemp("dra-guard-fail-closed"))
    try:
        namespaces = burst.prepare(cp, guard, 50, wait=lambda what, fn, t: wait_for(what, fn, timeout=t))
        yield guard, namespaces
    finally:
        guard.stop()
        for ns in namespaces if "namespaces" in locals() else ():
            cp.kubectl("admin", "delete", "pods", "-n", ns, "--all", "--grace-period=0", "--force", "--wait=false", check=False)
        cp.kubectl(
            "admin", "delete", "pods", "-n", burst.WORK, "--all", "--grace-period=0", "--force", "--wait=false", check=False
        )
        cp.kubectl("admin", "delete", "daemonset", "-n", burst.DRIVER_NAMESPACE, burst.DRIVER_DS, "--wait=false", check=False)


def refused_by_dra_guard(cp, pod) -> bool:
    """dra-guard's own 429 for the driver pod (its claim is still reserved)."""
    r = evict(cp, *pod)
    message = r.json().get("message", "") if r.headers.get("Content-Type", "").startswith("application/json") else ""
    return r.status_code == 429 and message.startswith(EVICTION_REFUSED) and "is still needed on node" in message


def plain_pod(cp, namespace: str, name: str) -> tuple[str, str]:
    burst.create_pods(cp.session("admin"), cp.url, [(namespace, name)])
    return namespace, name


def watch(cp, driver_pod, *, label: str) -> None:
    """For WATCH_SECONDS: the driver pod's eviction is never 2xx, and plain pods (another namespace
    and the driver's own namespace) are evicted (201) within 2 s each."""
    deadline = time.monotonic() + WATCH_SECONDS
    answers, plain = [], []
    i = 0
    while time.monotonic() < deadline:
        r = evict(cp, *driver_pod)
        answers.append((r.status_code, r.text[:200]))
        assert r.status_code not in (200, 201), f"{label}: the driver pod was evicted: {r.text}"
        for ns in ("burst-00", burst.DRIVER_NAMESPACE):
            pod = plain_pod(cp, ns, f"plain-{label}-{i}")
            started = time.monotonic()
            status = evict(cp, *pod, grace=0).status_code
            plain.append((ns, status, time.monotonic() - started))
        i += 1
        time.sleep(0.5)
    assert len(answers) >= 5, answers
    # the apiserver refused it on its own: the webhook could not be called (failurePolicy Fail)
    assert all("driver-evictions.dra-guard.io" in text for _, text in answers), answers
    assert all(status in (200, 201) and seconds < 2 for _, status, seconds in plain), plain


def test_a_declared_driver_stays_while_dra_guard_is_hung_or_gone_and_nothing_else_waits(control_plane, scenario):
    cp = control_plane
    guard, _ = scenario
    (driver_pod,) = wait_for("the driver pod", lambda: burst.driver_pods(cp))
    wait_for("dra-guard to refuse the driver eviction", lambda: refused_by_dra_guard(cp, driver_pod))

    # hung: every process of dra-guard stopped (the apiserver's connection stays open, no answer)
    os.killpg(guard.proc.proc.pid, signal.SIGSTOP)
    try:
        watch(cp, driver_pod, label="hung")
    finally:
        os.killpg(guard.proc.proc.pid, signal.SIGCONT)

    # gone: no process listens any more (the webhook configuration stays)
    guard.stop_server()
    watch(cp, driver_pod, label="gone")

    # back: dra-guard's own answer again, and the claim still holds the driver
    guard.start(mode="enforce")
    wait_for("dra-guard to refuse the driver eviction again", lambda: refused_by_dra_guard(cp, driver_pod))


def test_a_burst_of_1500_evictions_over_50_namespaces_never_evicts_the_held_driver(control_plane, scenario):
    """1,500 evictions at once (32 concurrent clients) over 50 namespaces, the driver's included,
    with the driver pod's eviction in the same burst: it is refused, every other pod is evicted,
    and dra-guard is asked about nothing but the driver's pod (the others never wait on it). The
    time against the same burst without dra-guard is measured here and in bench (bench/RESULTS.md)."""
    cp = control_plane
    guard, namespaces = scenario
    assert len(namespaces) == 50 and burst.DRIVER_NAMESPACE in namespaces
    wait_for("dra-guard to refuse the driver eviction", lambda: refused_by_dra_guard(cp, burst.driver_pods(cp)[0]))
    reviewed = guard_reviews(guard)
    result = burst.run(cp, guard, driver_pods=lambda: burst.driver_pods(cp), namespaces=namespaces, evictions=1500)
    print(f"eviction burst: {result}")
    assert result["driver_evicted"] == 0 and result["driver_statuses"] == [429], result
    assert result["others_failed"] == 0, result
    assert burst.reserved_claims(cp)
    # one eviction review: the driver's (each of the 1,500 others went through without dra-guard)
    assert guard_reviews(guard) - reviewed == 1


def guard_reviews(guard) -> float:
    return metric(scrape(guard.proc), "dra_guard_admission_requests_total", policy="eviction", default=0.0)


def test_a_driver_missing_from_drivers_declared_is_named_with_the_value_to_set(control_plane, scenario):
    """A DaemonSet dra-guard recognises as a driver but nobody declared: a log line and the gauge
    dra_guard_undeclared_drivers from the server's caches, a finding of `audit --cluster`, each with
    the --set-json value that declares every driver; gone again once the DaemonSet is."""
    import json

    from tests.builders import driver_daemonset

    cp = control_plane
    guard, _ = scenario
    ds = driver_daemonset(name="undeclared-driver", namespace="burst-01")
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"dra-guard.test/no-such-node": "x"}  # recognised, no pods
    apply_objects(cp, ds)
    series = 'dra_guard_undeclared_drivers{daemonset="undeclared-driver",daemonset_namespace="burst-01"} 1.0'
    # the value lists the declared driver first, then every undeclared one (other modules' drivers too)
    declared = """--set-json 'config.drivers.declared=[{"namespace":"burst-driver","name":"burst-driver"},"""
    this = '{"namespace":"burst-01","name":"undeclared-driver"}'
    try:
        wait_for("the gauge", lambda: series in guard.proc.session().get(guard.url + "/metrics", timeout=5).text, timeout=20)
        logged = [json.loads(line) for line in guard.proc.log_file.read_text().splitlines() if '"undeclared DRA driver"' in line]
        assert any(
            e.get("daemonset") == "undeclared-driver" and e["helm"].startswith(declared) and this in e["helm"] for e in logged
        ), logged
        found = [
            f for f in audit_findings(cp, "--config", str(guard.workdir / "config.yaml")) if f["check"] == "undeclared-driver"
        ]
        assert ("burst-01", "undeclared-driver") in {(f["namespace"], f["name"]) for f in found}
        assert ("burst-driver", "burst-driver") not in {(f["namespace"], f["name"]) for f in found}
        assert all(declared in f["message"] and this in f["message"] for f in found)
    finally:
        cp.kubectl("admin", "delete", "daemonset", "-n", "burst-01", "undeclared-driver", "--ignore-not-found")
    wait_for(
        "the gauge to drop the DaemonSet",
        lambda: 'daemonset="undeclared-driver"' not in guard.proc.session().get(guard.url + "/metrics", timeout=5).text,
        timeout=20,
    )


def test_a_stopped_driver_pods_final_delete_does_not_wait_on_a_dra_guard_that_is_down(control_plane, tmp_path):
    """eviction.guardDeletes (on by default) sends DELETE of declared driver pods to the
    fail-closed webhook. With nothing answering there: a first DELETE of the DaemonSet's pod is
    refused, but the final DELETE of a pod already Terminating (the kubelet's; here the same
    request as a force delete) and the DELETE of a pod in a terminal phase (the DaemonSet
    controller replacing a failed pod, the pod garbage collector) go through without calling
    dra-guard: a stopped pod is never kept by an outage."""
    import json as json_

    import certs
    from tests.e2e.guard import webhook_configurations
    from tests.serve import free_port

    cp = control_plane
    ns, ds = "dg-final-delete", "final-driver"
    ca = certs.generate_ca()
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem())
    closed = f"https://127.0.0.1:{free_port()}/"  # dra-guard down: nothing listens here
    docs = webhook_configurations(url=closed, ca_file=tmp_path / "ca.crt", declared=((ns, ds),))
    [config] = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    config["metadata"]["name"] = "e2e-final-delete"
    config["webhooks"] = [w for w in config["webhooks"] if w["name"] == "driver-evictions.dra-guard.io"]
    assert config["webhooks"] and config["webhooks"][0]["failurePolicy"] == "Fail"
    cp.kubectl("admin", "create", "namespace", ns)
    # a DaemonSet that places no pod (no node matches), and pods it owns, bound to a node without kubelet
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": ds, "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": ds}},
            "template": {
                "metadata": {"labels": {"app": ds}},
                "spec": {
                    "nodeSelector": {"e2e": "no-such-node"},
                    "containers": [{"name": "c", "image": "registry.example/d:v1"}],
                },
            },
        },
    }
    cp.kubectl("admin", "apply", "-f", "-", input=json_.dumps(daemonset))
    uid = json_.loads(cp.kubectl("admin", "get", "daemonset", "-n", ns, ds, "-o", "json").stdout)["metadata"]["uid"]
    owner = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds, "uid": uid, "controller": True}]
    terminating, failed = f"{ds}-abcde", f"{ds}-fghij"
    mine = json_.dumps({"metadata": {"ownerReferences": owner, "labels": {"app": ds}}})
    # Terminating before the webhook is in force (a pod cannot get a deletionTimestamp otherwise)
    burst.create_pods(cp.session("admin"), cp.url, [(ns, terminating)])
    cp.kubectl("admin", "patch", "pod", "-n", ns, terminating, "--type=merge", "-p", '{"metadata":{"finalizers":["e2e/hold"]}}')
    cp.kubectl("admin", "delete", "pod", "-n", ns, terminating, "--wait=false")
    cp.kubectl("admin", "patch", "pod", "-n", ns, terminating, "--type=merge", "-p", mine)
    cp.kubectl("admin", "apply", "-f", "-", input=json_.dumps(config))
    # the DaemonSet's own pod, running: its controller would delete it (no node matches) but for the webhook
    burst.create_pods(cp.session("admin"), cp.url, [(ns, failed)])
    cp.kubectl("admin", "patch", "pod", "-n", ns, failed, "--type=merge", "-p", mine)
    try:
        # the webhook is in force: a plain DELETE (dry run) of the DaemonSet's running pod is refused (nothing answers)
        last = []

        def refused():
            r = cp.kubectl("admin", "delete", "pod", "-n", ns, failed, "--dry-run=server", check=False)
            last[:] = [r.stderr]
            return r if r.returncode and "driver-evictions.dra-guard.io" in r.stderr else None

        try:
            first = wait_for("the webhook refuses a DELETE of the driver pod", refused, timeout=30)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {last}") from None
        assert "failed calling webhook" in first.stderr, first.stderr
        pod = json_.loads(cp.kubectl("admin", "get", "pod", "-n", ns, failed, "-o", "json").stdout)
        assert not pod["metadata"].get("deletionTimestamp"), "the DaemonSet controller's DELETE waits on dra-guard too"
        # in a terminal phase, its DELETE is not sent: the DaemonSet controller removes it now
        status = {"status": {"phase": "Failed"}}
        cp.kubectl("admin", "patch", "pod", "-n", ns, failed, "--subresource=status", "--type=merge", "-p", json_.dumps(status))
        # the final DELETE of a Terminating pod: not sent to dra-guard, so not refused by its outage
        cp.kubectl("admin", "patch", "pod", "-n", ns, terminating, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
        final = cp.kubectl(
            "admin", "delete", "pod", "-n", ns, terminating, "--grace-period=0", "--force", "--wait=false", check=False
        )
        assert final.returncode == 0, final.stderr
        for pod in (terminating, failed):
            wait_for(f"{pod} gone", lambda pod=pod: cp.kubectl("admin", "get", "pod", "-n", ns, pod, check=False).returncode != 0)
    finally:
        cp.kubectl("admin", "delete", "validatingwebhookconfiguration", "e2e-final-delete", check=False)
        cp.kubectl("admin", "delete", "namespace", ns, "--wait=false", check=False)
