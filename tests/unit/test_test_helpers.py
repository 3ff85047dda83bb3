"""The test helpers' own behaviour: a helper that hands out a wrong port makes other tests flaky."""

from __future__ import annotations

import socket

import pytest

from tests import scrape, serve


def test_free_port_is_below_the_ephemeral_range_and_never_repeats():
    low, _ = serve._ephemeral_range()
    ports = [serve.free_port() for _ in range(50)]
    assert len(set(ports)) == 50  # the old bind(0) helper could return the same port twice
    assert all(1024 <= port < low for port in ports), ports  # outgoing connections never take them
    for port in ports[:5]:  # and each is bindable (nothing listens there)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


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
