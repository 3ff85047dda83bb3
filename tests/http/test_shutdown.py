"""Graceful shutdown: on SIGTERM readiness goes false first, in-flight and newly routed
reviews complete, and a rolling restart of two replicas under continuous load drops nothing."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import requests

from tests.builders import binding, review, subject
from tests.serve import DraGuardProcess

pytestmark = pytest.mark.http

CONFIG = "server:\n  shutdownDelaySeconds: 2\n"


def is_ready(proc: DraGuardProcess) -> bool:
    try:
        return proc.session().get(proc.url + "/readyz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def test_sigterm_turns_readiness_off_then_drains(tmp_path):
    proc = DraGuardProcess(tmp_path, "--no-cluster", config=CONFIG)
    proc.wait("/readyz")
    s = proc.session()
    proc.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    ready = s.get(proc.url + "/readyz", timeout=2)
    assert ready.status_code == 503 and "shutting down" in ready.json()["reasons"][0]
    # still answering reviews while the endpoints catch up
    body = review(binding("b", "r", [subject("Group", "g")]))
    assert s.post(proc.url + "/validate/rbac", json=body, timeout=2).status_code == 200
    assert proc.proc.wait(20) == 0
    proc.stop()


def test_rolling_restart_under_load_drops_nothing(tmp_path):
    """Two replicas share a CA; a client routes each review to a replica whose /readyz is 200
    (as the endpoints and the apiserver do) while the replicas are restarted one after the other."""
    import certs

    tls = tmp_path / "shared"
    ca = certs.generate_ca()
    certs.write_bundle(tls, ca=ca, serving=certs.generate_serving(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"]))

    def start(name: str, port: int | None = None) -> DraGuardProcess:
        proc = DraGuardProcess(
            tmp_path / name,
            "--no-cluster",
            "--tls-cert-file",
            str(tls / "tls.crt"),
            "--tls-key-file",
            str(tls / "tls.key"),
            config=CONFIG,
            port=port,
            ca_file=tls / "ca.crt",
        )
        proc.wait("/readyz")
        return proc

    replicas = [start("a"), start("b")]
    ready = {0: True, 1: True}
    stop = threading.Event()
    errors: list[str] = []
    sent = [0]
    body = review(binding("b", "r", [subject("Group", "g")]))

    def endpoints():
        while not stop.is_set():
            for i, r in enumerate(replicas):
                ready[i] = is_ready(r)
            time.sleep(0.05)

    def load():
        sessions: dict[int, tuple[int, requests.Session]] = {}
        n = 0
        while not stop.is_set():
            live = [i for i in (0, 1) if ready[i]]
            if not live:
                time.sleep(0.02)
                continue
            i = live[n % len(live)]
            n += 1
            r = replicas[i]
            if i not in sessions or sessions[i][0] != r.port or sessions[i][1] is None:
                sessions[i] = (r.port, r.session())
            try:
                resp = sessions[i][1].post(r.url + "/validate/rbac", json=body, timeout=3)
                if resp.status_code != 200:
                    errors.append(f"HTTP {resp.status_code}")
                sent[0] += 1
            except requests.RequestException as exc:
                if ready[i]:  # a replica the endpoints still listed failed us
                    errors.append(f"{type(exc).__name__}: {exc}")
                sessions.pop(i, None)

    threads = [threading.Thread(target=endpoints), threading.Thread(target=load), threading.Thread(target=load)]
    for t in threads:
        t.start()
    try:
        time.sleep(1)
        for i in (0, 1):
            old = replicas[i]
            old.proc.send_signal(signal.SIGTERM)
            assert old.proc.wait(30) == 0
            new = start("ab"[i] + "2", port=old.port)
            replicas[i] = new
            time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for r in replicas:
            r.stop()
    assert errors == [], errors[:5]
    assert sent[0] > 100
