"""The gRPC probes dra-guard adds to a driver DaemonSet, executed by a real kubelet.

A real node (tests/e2e/node.py) runs the test DRA driver (tests/dradriver) from its DaemonSet;
dra-guard (a real `dra-guard serve`, tests/e2e/guard.py) adds the liveness and startup probes at
create. The evidence is the kubelet's: its prober_probe_total counters, the container's
restartCount, and the driver's own health log lines.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e import testdriver
from tests.e2e.guard import Guard
from tests.e2e.kube import get_json, wait_for

# short periods so the proofs take seconds: liveness every 2 s, restart after 2 failures in a row;
# startup budget 2 s x 30 = 60 s
PROBES = """
probes:
  periodSeconds: 2
  timeoutSeconds: 1
  failureThreshold: 2
  startupProbe: {{enabled: {startup}, periodSeconds: 2, failureThreshold: 30}}
"""
#: how long the healthy driver's liveness probes are counted: 10 runs expected at periodSeconds 2
WATCH_SECONDS = 20
#: the slow driver's health port stays closed this long: 3x what liveness alone allows (2 failures
#: 2 s apart, ~4 s), well inside the startup budget (60 s)
START_DELAY = "12s"


@pytest.fixture(scope="module")
def guarded(real_node, tmp_path_factory):
    g = Guard(real_node.cp, tmp_path_factory.mktemp("dra-guard-probes"))
    g.start(
        mode="enforce",
        extra_config=PROBES.format(startup="true"),
        driver_service_accounts=(f"{testdriver.NAMESPACE}:{testdriver.SERVICE_ACCOUNT}",),
    )
    g.register()
    try:
        yield g
    finally:
        g.stop()


def deploy(cp, args=()):
    """(Re)create the driver DaemonSet; return its only pod once it exists (dict)."""
    cp.kubectl("admin", "delete", "daemonset", "-n", testdriver.NAMESPACE, testdriver.NAME, "--ignore-not-found", "--wait=true")
    wait_for("old driver pods to go", lambda: not testdriver.driver_pods(cp, include_terminating=True), timeout=60)
    testdriver.apply(cp, testdriver.driver_objects(cp, args=tuple(args)))
    return wait_for("the driver pod", lambda: (testdriver.driver_pods(cp) or [None])[0], timeout=60)


def pod_now(cp, name):
    return get_json(cp, "pod", "-n", testdriver.NAMESPACE, name)


def test_probe_added_by_dra_guard_passes_while_healthy(real_node, guarded):
    cp = real_node.cp
    pod = deploy(cp)
    name = pod["metadata"]["name"]
    container = pod["spec"]["containers"][0]
    assert container["livenessProbe"]["grpc"] == {"port": testdriver.HEALTH_PORT, "service": "liveness"}
    assert container["livenessProbe"]["periodSeconds"] == 2
    assert container["startupProbe"]["grpc"]["port"] == testdriver.HEALTH_PORT
    wait_for("the driver pod Ready", lambda: testdriver.ready(pod_now(cp, name)), timeout=60)

    start = testdriver.kubelet_probe_counts(cp, name)
    time.sleep(WATCH_SECONDS)
    end = testdriver.kubelet_probe_counts(cp, name)
    assert testdriver.restarts(pod_now(cp, name)) == 0
    # the kubelet really ran the liveness probe about every 2 s (10 runs in 20 s; at least 7: two
    # thirds of that, room for a loaded machine's late probes), and every run passed
    assert end.get("successful", 0) - start.get("successful", 0) >= 7, (start, end)
    assert end.get("failed", 0) == start.get("failed", 0), (start, end)


def test_unhealthy_driver_is_restarted_by_the_kubelet(real_node, guarded):
    cp, node = real_node.cp, real_node.node
    pod = deploy(cp)
    name = pod["metadata"]["name"]
    wait_for("the driver pod Ready", lambda: testdriver.ready(pod_now(cp, name)), timeout=60)
    testdriver.UNHEALTHY_FILE.touch()
    try:
        wait_for("the kubelet to restart the unhealthy driver", lambda: testdriver.restarts(pod_now(cp, name)) >= 1, timeout=60)
    finally:
        testdriver.UNHEALTHY_FILE.unlink(missing_ok=True)
    assert testdriver.kubelet_probe_counts(cp, name).get("failed", 0) >= 2
    assert "dradriver: health NOT_SERVING" in node.container_log(testdriver.NAMESPACE, name, "plugin")
    events = cp.kubectl(
        "admin",
        "get",
        "events",
        "-n",
        testdriver.NAMESPACE,
        "--field-selector",
        f"involvedObject.name={name}",
        "-o",
        "jsonpath={.items[*].message}",
    ).stdout
    assert "Liveness probe failed" in events
    # healthy again after the restart: it stays up
    wait_for("the restarted driver Ready", lambda: testdriver.ready(pod_now(cp, name)), timeout=60)


def test_startup_budget_lets_a_slow_driver_start(real_node, guarded):
    cp, node = real_node.cp, real_node.node
    pod = deploy(cp, args=[f"--start-delay={START_DELAY}"])  # health port closed (liveness alone allows ~4 s)
    name = pod["metadata"]["name"]
    wait_for("the slow driver Ready", lambda: testdriver.ready(pod_now(cp, name)), timeout=90)
    assert testdriver.restarts(pod_now(cp, name)) == 0
    assert testdriver.kubelet_probe_counts(cp, name, "Startup").get("failed", 0) >= 3  # it was probed while starting
    assert f"sleeping {START_DELAY} before starting" in node.container_log(testdriver.NAMESPACE, name, "plugin")


def test_without_the_startup_probe_the_slow_driver_is_restarted(real_node, guarded):
    """The counter-proof: the same slow driver with dra-guard's startupProbe turned off is killed by
    its liveness probe before it ever serves (why the startup probe is on by default)."""
    cp = real_node.cp
    guarded.start(
        mode="enforce",
        extra_config=PROBES.format(startup="false"),
        driver_service_accounts=(f"{testdriver.NAMESPACE}:{testdriver.SERVICE_ACCOUNT}",),
    )
    guarded.wait_called()
    try:
        pod = deploy(cp, args=[f"--start-delay={START_DELAY}"])
        assert "startupProbe" not in pod["spec"]["containers"][0]
        name = pod["metadata"]["name"]
        wait_for("the kubelet to restart the slow driver", lambda: testdriver.restarts(pod_now(cp, name)) >= 1, timeout=60)
    finally:
        guarded.start(
            mode="enforce",
            extra_config=PROBES.format(startup="true"),
            driver_service_accounts=(f"{testdriver.NAMESPACE}:{testdriver.SERVICE_ACCOUNT}",),
        )
        guarded.wait_called()
