"""The periodic audit's own process: a real `python -m webhook.serve.audit_child` is
started; its failures come back as one clear AuditChildError, and one that hangs is killed at its
deadline. (Its successful run, against the real apiserver: tests/e2e/test_cluster_audit.py.)"""

from __future__ import annotations

import os
import socket
import time

import pytest

from webhook.config import from_mapping
from webhook.serve.audit_child import AuditChildError, AuditRequest, run_in_child

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:%d", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def kubeconfig(tmp_path, port: int) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG % port)
    return str(path)


def children() -> set[int]:
    """Pids of this process's live (not zombie) children."""
    found = set()
    for stat in os.listdir("/proc"):
        if stat.isdigit():
            try:
                fields = open(f"/proc/{stat}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                found.add(int(stat))
    return found


def test_an_api_error_in_the_audit_process_comes_back_as_its_reason(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    request = AuditRequest(config=from_mapping({}), kubeconfig=kubeconfig(tmp_path, port), request_timeout_seconds=2)
    with pytest.raises(AuditChildError, match="the audit process failed: .*(refused|Max retries)"):
        run_in_child(request, timeout_seconds=60)


def test_an_unreadable_kubeconfig_is_named(tmp_path):
    request = AuditRequest(config=from_mapping({}), kubeconfig=str(tmp_path / "missing"), request_timeout_seconds=2)
    with pytest.raises(AuditChildError, match="cannot load Kubernetes client configuration .*missing"):
        run_in_child(request, timeout_seconds=60)


def test_an_audit_process_that_hangs_is_killed_at_its_deadline(tmp_path):
    with socket.socket() as server:  # accepts TCP (the kernel's backlog) but never answers TLS
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        request = AuditRequest(
            config=from_mapping({}), kubeconfig=kubeconfig(tmp_path, server.getsockname()[1]), request_timeout_seconds=120
        )
        before = children()
        started = time.monotonic()
        with pytest.raises(AuditChildError, match="did not finish within 3 s and was killed"):
            run_in_child(request, timeout_seconds=3)
        assert 3 <= time.monotonic() - started < 15
        assert children() == before  # nothing left running
