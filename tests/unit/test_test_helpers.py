"""The test helpers' own behaviour: a helper that hands out a wrong port makes other tests flaky."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import pytest

from tests import scrape, serve

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_free_port_is_below_the_ephemeral_range_and_never_repeats():
    low, _ = serve._ephemeral_range()
    ports = [serve.free_port() for _ in range(50)]
    assert len(set(ports)) == 50  # the old bind(0) helper could return the same port twice
    assert all(1024 <= port < low for port in ports), ports  # outgoing connections never take them
    for port in ports[:5]:  # and each is bindable (nothing listens there)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_port_in_an_xdist_worker_stays_in_the_workers_own_slice(monkeypatch):
    low, _ = serve._ephemeral_range()
    first, end = (10000, min(low, 30000)) if low > 11000 else (1024, low)
    middle = first + (end - first) // 2
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert all(first <= serve.free_port() < middle for _ in range(30))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert all(middle <= serve.free_port() < end for _ in range(30))


def test_free_port_skips_a_port_in_use(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with socket.socket() as probe:  # a port free right now
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        choices = iter([busy, free])
        monkeypatch.setattr(serve.random, "randrange", lambda a, b: next(choices))
        monkeypatch.setattr(serve, "_HANDED_OUT", set())
        assert serve.free_port() == free


def test_ephemeral_range_reads_the_kernel_file_and_falls_back(tmp_path):
    path = tmp_path / "range"
    path.write_text("40000\t50000\n")
    assert serve._ephemeral_range(str(path)) == (40000, 50000)
    assert serve._ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)


EXPOSITION = """\
# HELP x_total Things.
# TYPE x_total counter
x_total{policy="rbac",mode="audit"} 2.0
x_total{policy="rbac",mode="enforce"} 3.0
x_total{policy="eviction",mode="enforce"} 5.0
# HELP y_seconds Waits.
# TYPE y_seconds histogram
y_seconds_bucket{le="0.5",policy="eviction"} 4.0
y_seconds_bucket{le="+Inf",policy="eviction"} 6.0
y_seconds_count{policy="eviction"} 6.0
y_seconds_sum{policy="eviction"} 1.5
"""


def test_metric_sums_the_samples_whose_labels_include_the_given_ones():
    assert scrape.metric(EXPOSITION, "x_total") == 10  # every series, like PromQL's sum()
    assert scrape.metric(EXPOSITION, "x_total", policy="rbac") == 5
    assert scrape.metric(EXPOSITION, 'x_total{mode="enforce",policy="rbac"}') == 3  # label order does not matter
    assert scrape.metric(EXPOSITION, 'y_seconds_bucket{le="0.5"}', policy="eviction") == 4  # both ways of naming labels
    assert scrape.metric(EXPOSITION, "y_seconds_count") == 6  # a sample name, not the family's


def test_metric_fails_on_a_missing_sample_unless_given_a_default():
    assert scrape.metric(EXPOSITION, "x_total", policy="probes", default=0.0) == 0
    with pytest.raises(AssertionError, match="no sample x_total"):
        scrape.metric(EXPOSITION, "x_total", policy="probes")
    with pytest.raises(AssertionError, match="no sample x"):
        scrape.metric(EXPOSITION, "x")  # the family's name is not a sample's


RECORDING_TEST = """\
import os


def record(name):
    with open({record!r}, "a") as out:
        out.write(f"{{os.environ.get('PYTEST_XDIST_WORKER', 'main')}} {{__name__}} {{name}}\\n")


def test_1():
    record("1")


def test_2():
    record("2")


def test_3():
    record("3")
"""


def run_pytest(folder, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest in `folder` (its own rootdir) with this repository importable, as tests/run runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:cov", "-p", "no:hypothesispytest", "-q", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_xdist_workers_run_each_module_whole_and_the_real_node_modules_together_first(tmp_path):
    """tests/run's two workers (tests/workers.py): a module's tests in one worker (its module
    fixtures start once), and the real-node modules (test_node_*.py) all in one worker before
    anything else there (one node per machine: two workers would wait for each other's node)."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401\n"
    )
    record = tmp_path / "ran.txt"
    modules = ["test_a", "test_node_probes", "test_b", "test_c", "test_node_drain", "test_d", "test_e"]
    for name in modules:
        (tmp_path / f"{name}.py").write_text(RECORDING_TEST.format(record=str(record)))
    result = run_pytest(tmp_path, "-n", "2")
    assert result.returncode == 0 and "21 passed" in result.stdout, result.stdout + result.stderr
    ran = [line.split() for line in record.read_text().splitlines()]
    assert len(ran) == 21 and {worker for worker, _, _ in ran} == {"gw0", "gw1"}, ran  # both workers had work
    workers_of = {name: {worker for worker, module, _ in ran if module == name} for name in modules}
    assert all(len(workers) == 1 for workers in workers_of.values()), workers_of
    node_worker = workers_of["test_node_probes"]
    assert workers_of["test_node_drain"] == node_worker, workers_of
    on_node_worker = [module for worker, module, _ in ran if worker in node_worker]
    assert set(on_node_worker[:6]) == {"test_node_probes", "test_node_drain"}, on_node_worker


def test_a_real_node_test_outside_the_node_modules_is_refused(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "import pytest\n"
        "from tests.e2e.conftest import pytest_collection_modifyitems  # noqa: F401\n\n\n"
        "@pytest.fixture\ndef real_node():\n    return None\n"
    )
    (tmp_path / "test_drain_somewhere.py").write_text("def test_on_a_node(real_node):\n    pass\n")
    (tmp_path / "test_node_elsewhere.py").write_text("def test_on_a_node(real_node):\n    pass\n")
    result = run_pytest(tmp_path)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert (
        "tests that run a real node belong in tests/e2e/test_node_*.py: test_drain_somewhere.py::test_on_a_node" in result.stderr
    )
    assert "test_node_elsewhere" not in result.stderr  # a node module may use it
