"""End-to-end tests: every test in this folder is marked ``e2e`` (``pytest -m "not e2e"`` skips them).

The session fixture `control_plane` (one real control plane per test session) lives in
tests/conftest.py, shared with tests/chart.
"""

from __future__ import annotations

import pathlib

import pytest
import yaml

from tests.e2e.kube import wait_for

HERE = pathlib.Path(__file__).resolve().parent


#: the fixtures below that start a real node (kubelet + containerd, one per machine)
REAL_NODE_FIXTURES = ("real_node", "real_node_in_cluster")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the items collected from this folder with ``e2e``; refuse (a usage error naming them)
    the tests that use a real node from a module not named ``test_node_*.py``: tests/run's xdist
    workers run those modules, and only those, one after another in one worker (tests/workers.py),
    and a node module run beside another would wait for the machine's node lock.

    The hook sees every item of the session, not only this folder's, hence the path check.
    """
    from tests.workers import REAL_NODE_MODULES, is_real_node_module

    misplaced = []
    for item in items:
        if HERE == item.path.parent or HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)
        uses_node = any(name in getattr(item, "fixturenames", ()) for name in REAL_NODE_FIXTURES)
        if uses_node and not is_real_node_module(item.nodeid.split("::", 1)[0]):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError(f"tests that run a real node belong in tests/e2e/{REAL_NODE_MODULES}: {', '.join(misplaced)}")


@pytest.fixture(scope="module")
def start_guard(control_plane, tmp_path_factory):
    """The one way a module starts dra-guard on the session's control plane: a function
    ``start_guard(namespaces=(), register=True, **options) -> Guard`` that creates the namespaces
    (if missing), starts a real `dra-guard serve` (tests/e2e/guard.py; `options` are Guard.start's:
    mode, extra_config, driver_service_accounts, declared, ...), waits for /readyz and, with
    register, applies the chart's webhook configurations and waits until the apiserver calls it.
    Every Guard it started is unregistered and stopped after the module (last started first; a
    module that cleans up after its guard calls Guard.stop() itself first: stop is idempotent)."""
    from tests.e2e.guard import Guard

    started: list[Guard] = []

    def start(*, namespaces: tuple[str, ...] = (), register: bool = True, **options) -> Guard:
        for namespace in namespaces:
            control_plane.kubectl("admin", "create", "namespace", namespace, check=False)
        g = Guard(control_plane, tmp_path_factory.mktemp("dra-guard"))
        started.append(g)
        g.start(**options)
        if register:
            g.register()
        return g

    try:
        yield start
    finally:
        for g in reversed(started):
            g.stop()


@pytest.fixture(scope="module")
def guard(start_guard):
    """A dra-guard server in enforce mode registered through the chart's webhook configurations,
    one per test module (a module overrides it with its own start_guard(...) options)."""
    return start_guard(mode="enforce")


#: the chart's report CRDs: PolicyReport (wgpolicyk8s.io) and OpenReports (openreports.io)
REPORT_CRDS = (
    HERE.parents[1] / "charts" / "dra-guard" / "files" / "policyreport-crds.yaml",
    HERE.parents[1] / "charts" / "dra-guard" / "files" / "openreports-crds.yaml",
)


@pytest.fixture(scope="session")
def report_crds_established(control_plane):
    """The chart's two report CRDs (REPORT_CRDS) applied to the session's control plane and
    Established, once per session; left installed, as nothing deletes them. Returns the ControlPlane.

    Established early in a whole run (test_cluster_audit.py asks for it first), the garbage
    collector of kube-controller-manager has discovered both report APIs (a resync every 30 s)
    long before test_report_owner.py waits for it to delete reports."""
    files = [arg for crd in REPORT_CRDS for arg in ("-f", str(crd))]
    control_plane.kubectl("admin", "apply", *files)
    control_plane.kubectl("admin", "wait", "--for=condition=Established", "--timeout=30s", *files)
    # Established is not served yet: for a moment after it the apiserver answers a list of the new
    # kinds 429 "storage is (re)initializing", which fails the first audit of a test (retried an
    # interval later). Wait until every kind lists.
    plurals = [
        f"{doc['spec']['names']['plural']}.{doc['spec']['group']}"
        for crd in REPORT_CRDS
        for doc in yaml.safe_load_all(crd.read_text())
        if doc and doc.get("kind") == "CustomResourceDefinition"
    ]
    wait_for(
        "the report CRDs' kinds to list",
        lambda: all(control_plane.kubectl("admin", "get", p, "-A", check=False).returncode == 0 for p in plurals),
        timeout=60,
    )
    return control_plane


@pytest.fixture(scope="session")
def dra_guard_image():
    """The dra-guard image built from the Dockerfile (tests/e2e/image.py: an `image.Image` with its
    OCI archive), built once per source hash and cached. A host that cannot build it (not root, not
    Linux, a missing Debian package that apt-get could not install) fails the test, never skips."""
    from tests.e2e import image

    try:
        return image.build()
    except image.ImageError as exc:
        pytest.fail(f"cannot build the dra-guard image: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A real OCI registry (Debian's docker-registry, tests/e2e/registry.py) on a free loopback port,
    plain HTTP, storage in a temporary folder; one per test module, stopped after it. A host
    without the package (not installable here) fails the test, never skips."""
    from tests.e2e.registry import Registry, RegistryError

    reg = Registry(tmp_path_factory.mktemp("registry"))
    try:
        reg.start()
    except RegistryError as exc:
        pytest.fail(f"the registry did not start: {exc}", pytrace=False)
    try:
        yield reg
    finally:
        reg.stop()


class RealNode:
    """What the `real_node` fixture yields: `cp` (a ControlPlane of the node's own, controllers on)
    and `node` (a started tests.e2e.node.Node joined to it)."""

    def __init__(self, cp, node) -> None:
        self.cp = cp
        self.node = node


@pytest.fixture(scope="module")
def real_node(tmp_path_factory, request):
    """A real node (kubelet + containerd, tests/e2e/node.py) joined to a control plane of its own,
    one per test module; stopped after the module, and the module then fails (teardown error) if
    anything of the node is left on the host (mounts, kubepods cgroups, bridge, sysctls, folders).
    A module with ``REAL_NODE_AUDIT_LOG = True`` gets the control plane's audit log
    (ControlPlane(audit_log=True): `cp.audit_events()`).

    Never skips: without root/Linux, the Debian packages or the binaries, the test fails and says
    what is missing (see README "Run the tests").
    """
    yield from _real_node(tmp_path_factory, audit_log=bool(getattr(request.module, "REAL_NODE_AUDIT_LOG", False)))


@pytest.fixture(scope="module")
def real_node_in_cluster(tmp_path_factory):
    """`real_node` whose control plane lets pods call the apiserver and webhooks be reached through
    their Service (ControlPlane(in_cluster=True)): for the chart installed for real."""
    yield from _real_node(tmp_path_factory, in_cluster=True)


def _real_node(tmp_path_factory, **cp_options):
    from tests.e2e import binaries
    from tests.e2e.cluster import ControlPlane, ControlPlaneError
    from tests.e2e.node import Node, NodeError

    try:
        bins = binaries.node_binaries()
        cp_bins, tools = binaries.build_control_plane(), binaries.client_tools_dir()
    except binaries.BinariesError as exc:
        pytest.fail(f"cannot provide the real node's binaries: {exc}", pytrace=False)
    cp = ControlPlane(
        tmp_path_factory.mktemp("node-control-plane"), controllers=True, bin_dir=cp_bins, tools_dir=tools, **cp_options
    )
    try:
        cp.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the node's control plane did not start: {exc}", pytrace=False)
    node = Node(cp, tmp_path_factory.mktemp("node"), bins=bins)
    try:
        node.start()
    except NodeError as exc:
        cp.stop()
        pytest.fail(f"the real node did not start (files in {node.workdir}): {exc}", pytrace=False)
    try:
        yield RealNode(cp, node)
    finally:
        node.stop()
        cp.stop()
    assert not node.left_after_stop, f"the node left these on the host: {node.left_after_stop}"
