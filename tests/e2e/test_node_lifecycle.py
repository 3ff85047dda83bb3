"""The real node starts, runs a pod with a prepared claim, and leaves
nothing on the host after stop() — nor after its Python process is SIGKILLed and
``python -m tests.e2e.node down`` runs. One node per machine: a second lock holder waits."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.e2e import binaries, testdriver
from tests.e2e import node as nodemod
from tests.e2e.cluster import ControlPlane
from tests.e2e.kube import get_json, wait_for

REPO = pathlib.Path(__file__).resolve().parents[2]


def host_traces():
    """What a running node puts on the host (so the leftover checks below are not vacuous)."""
    return {
        "mounts": nodemod._mounts_under(nodemod.MOUNT_ROOTS),
        "cgroups": nodemod._kubepods_cgroups(),
        "bridge": pathlib.Path(f"/sys/class/net/{nodemod.BRIDGE}").exists(),
        "sysctls": nodemod.read_sysctls(),
    }


def test_node_runs_a_claim_and_stop_leaves_nothing(tmp_path):
    bins = binaries.node_binaries()
    with ControlPlane(
        tmp_path / "cp", controllers=True, bin_dir=binaries.build_control_plane(), tools_dir=binaries.client_tools_dir()
    ) as cp:
        node = nodemod.Node(cp, tmp_path / "node", bins=bins)
        started = time.monotonic()
        node.start()
        try:
            print(f"node Ready in {time.monotonic() - started:.1f} s")
            with pytest.raises(nodemod.NodeError, match="another real node"):
                with nodemod.machine_lock(1):
                    pass
            testdriver.apply(cp, testdriver.driver_objects(cp))
            testdriver.apply(cp, testdriver.consumer_objects("consumer"))
            wait_for(
                "the consumer Running",
                lambda: (get_json(cp, "pod", "-n", "work", "consumer") or {}).get("status", {}).get("phase") == "Running",
                timeout=90,
            )
            assert "pause: DRA_GUARD_TEST_DEVICE=dev-" in node.container_log("work", "consumer", "app")  # the CDI edit
            traces = host_traces()
            assert traces["mounts"] and traces["cgroups"] and traces["bridge"]
            assert traces["sysctls"] != node.sysctls_before  # the kubelet changed them (kernel.panic=10, ...)
        finally:
            node.stop()  # with the pods still running
    assert node.left_after_stop == []


def test_down_cleans_up_after_a_killed_run(tmp_path):
    """SIGKILL the Python process that runs the node (no atexit, no stop()): shims, containers,
    mounts, cgroups and the bridge outlive it; `python -m tests.e2e.node down` removes them all."""
    script = tmp_path / "run_node.py"
    script.write_text(
        textwrap.dedent(f"""
        import pathlib, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from tests.e2e import testdriver
        from tests.e2e.cluster import ControlPlane
        from tests.e2e.kube import get_json, wait_for
        from tests.e2e.node import Node
        cp = ControlPlane(pathlib.Path({str(tmp_path / "cp")!r}), controllers=True).start()
        node = Node(cp, pathlib.Path({str(tmp_path / "node")!r})).start()
        testdriver.apply(cp, [{{"apiVersion": "v1", "kind": "Namespace", "metadata": {{"name": "work"}}}},
                              {{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "victim", "namespace": "work"}},
                               "spec": {{"containers": [{{"name": "app", "image": testdriver.APP_IMAGE,
                                                        "imagePullPolicy": "Never"}}]}}}}])
        wait_for("victim Running", lambda: (get_json(cp, "pod", "-n", "work", "victim") or {{}}).get(
            "status", {{}}).get("phase") == "Running", timeout=90)
        print("running", flush=True)
        time.sleep(600)
    """)
    )
    before = nodemod.read_sysctls()
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.strip() == "running", "the node in the child process did not run its pod"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        time.sleep(2)
        left = nodemod.leftovers(before)
        assert any(x.startswith("mount ") for x in left) and any(x.startswith("cgroup ") for x in left), left
    finally:
        if proc.poll() is None:
            proc.kill()
    down = subprocess.run([sys.executable, "-m", "tests.e2e.node", "down"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "clean" in down.stdout
    assert nodemod.leftovers(before) == []
    check = subprocess.run([sys.executable, "-m", "tests.e2e.node", "check"], cwd=REPO, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
