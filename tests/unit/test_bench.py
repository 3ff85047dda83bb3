"""The pure parts of bench/ (no cluster, no vegeta): answer checks, audit counting, reports, the subcommands.

The statistics are tests/unit/test_bench_stats.py."""

from __future__ import annotations

import json
import os
import sys

import pytest

from bench import common, endpoints, fill, main


def test_target_renders_vegeta_http_format(tmp_path):
    t = common.Target(
        url="https://127.0.0.1:1/validate/rbac",
        body=tmp_path / "b.json",
        headers={"Content-Type": "application/json", "Authorization": "Bearer x"},
    )
    assert t.render() == (
        f"POST https://127.0.0.1:1/validate/rbac\nContent-Type: application/json\n"
        f"Authorization: Bearer x\n@{tmp_path / 'b.json'}\n"
    )


def _answer(review, allowed):
    return json.dumps({"response": {"uid": review["request"]["uid"], "allowed": allowed}}).encode()


def test_check_answers_matches_by_uid_and_counts_wrong_ones():
    reviews = endpoints.rbac_bodies(fill.Scale(roles=10, nodes=4, claims=8))
    assert [allowed for _, allowed in reviews] == [True, False, True, True]
    right = [_answer(r, allowed) for r, allowed in reviews]
    result = common.Attack(
        rate=1,
        seconds=1,
        latencies_ms=[1] * 6,
        codes=[200] * 6,
        errors=[],
        bodies=[*reversed(right), _answer(reviews[1][0], True), b"<html>"],
    )
    checked = endpoints.check_answers(result, reviews)
    assert checked["checked"] == 6 and checked["wrong"] == 2


def test_floor_bodies_are_the_same_reviews_all_allowed():
    reviews = endpoints.eviction_bodies(fill.Scale(roles=10, nodes=4, claims=8))
    floor = endpoints.as_floor(reviews)
    assert [b for b, _ in floor] == [b for b, _ in reviews] and all(a for _, a in floor)


def test_eviction_bodies_name_a_held_driver_pod_and_a_free_one_when_nodes_outnumber_claims():
    scale = fill.Scale(roles=10, nodes=100, claims=50)
    held, ordinary, other = endpoints.eviction_bodies(scale)
    node_of_held = int(held[0]["request"]["name"].rsplit("-", 1)[1])
    assert not held[1] and node_of_held < scale.claims  # claim i sits on node i % nodes
    assert ordinary[1] and other[1] and int(other[0]["request"]["name"].rsplit("-", 1)[1]) >= scale.claims


def test_claim_status_allocates_on_the_claims_node_and_reserves_its_consumer():
    status = fill.claim_status(1234, 1000)["status"]
    assert status["allocation"]["devices"]["results"][0]["pool"] == fill.node_name(234)
    assert status["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [fill.node_name(234)]
    assert status["reservedFor"][0]["name"] == "consumer-01234"


def test_api_requests_counts_each_request_once_from_its_time():
    events = [
        {"auditID": "a", "verb": "list", "requestReceivedTimestamp": "2026-11-30T10:00:00.000001Z"},
        {"auditID": "b", "verb": "watch", "stage": "ResponseStarted", "requestReceivedTimestamp": "2026-11-30T10:00:05.000000Z"},
        {"auditID": "b", "verb": "watch", "stage": "ResponseComplete", "requestReceivedTimestamp": "2026-11-30T10:00:05.000000Z"},
        {"auditID": "c", "verb": "list", "requestReceivedTimestamp": "2026-11-30T10:00:06.000000Z"},
    ]
    for event in events:
        event["objectRef"] = {"resource": "pods"}
    events.append(
        {
            "auditID": "d",
            "verb": "get",
            "objectRef": {"resource": "leases"},
            "requestReceivedTimestamp": "2026-11-30T10:00:07.000000Z",
        }
    )
    counts = endpoints.api_requests(events, "2026-11-30T10:00:01.000000Z")
    assert counts == {"watch pods": 1, "list pods": 1, "get leases": 1}
    assert endpoints.per_review_requests(counts) == 1  # the list; not the watch, not the periodic audit's Lease


def test_sync_seconds_reads_the_servers_cache_synced_lines():
    log = "\n".join(
        [
            '{"msg": "cache synced", "cache": "pods", "objects": 10, "seconds": 0.5}',
            "not json",
            '{"msg": "cache synced", "cache": "pods", "objects": 12, "seconds": 0.25}',
            '{"msg": "worker ready to serve"}',
        ]
    )
    assert endpoints.sync_seconds(log) == {"pods": {"objects": 12, "seconds": 0.25}}


@pytest.mark.parametrize(
    "rate, run, ok",
    [
        (1000, {"success": 1.0, "p99": 9.9, "throughput": 999.0}, True),
        (1000, {"success": 1.0, "p99": 10.1, "throughput": 999.0}, False),
        (1000, {"success": 0.999, "p99": 2.0, "throughput": 999.0}, False),
        (1000, {"success": 1.0, "p99": 2.0, "throughput": 900.0}, False),
    ],
)
def test_a_throughput_step_passes_only_with_every_answer_in_time(rate, run, ok):
    assert endpoints.passes(run, rate) is ok


def _run(p50, p99, cpu=0.5):
    return {"p50": p50, "p99": p99, "p99.9": p99 * 2, "cpu_s_per_1000": cpu, "success": 1.0}


def test_report_gives_medians_ratios_and_marks_missed_targets():
    def endpoint(p50, p99):
        return {
            "rates": {"500": _run(p50, p99), "1000": _run(p50, p99 * 2)},
            "floor": {"500": _run(1.0, 2.0), "1000": _run(1.0, 3.0)},
            "answers": {"checked": 10, "wrong": 0},
            "max": {"max_rps": 1500},
            "peak_rss_mib_steady": 100,
        }

    repeat = {
        "rbac": endpoint(1.1, 2.0),
        "daemonsets": endpoint(1.5, 4.0),
        "evictions": endpoint(1.2, 2.0),
        "noop": {"max": {"max_rps": 2000}},
    }
    results = {
        "started": "now",
        "command": "bench/run",
        "repeats": 2,
        "machine": {"cpu": "x", "cpus": 2, "memory_gib": 24, "kernel": "6", "python": "3.11"},
        "endpoints_part": {
            "scale": {"roles": 5, "bindings": 5, "resource_slices": 1, "claims": 2, "driver_pods": 1},
            "ready_seconds": 1.5,
            "cache_sync": {"pods": {"objects": 3, "seconds": 0.1}},
            "endpoints": [repeat, repeat],
            "api_requests_during_load": {},
            "server": {"peak_rss_mib": 160, "rss_mib": 110},
            "apiserver": {
                "rate": 50,
                "seconds": 15,
                "runs": [
                    {"variant": v, "repeat": 0, "p50": p50, "p99": p50 * 2}
                    for v, p50 in (("none", 3.0), ("vap", 3.2), ("noop-webhook", 3.8), ("dra-guard", 4.0))
                ],
            },
        },
    }
    text = main.report(results)
    assert "| rbac | 1000 | 1.10 | 4.00 |" in text
    assert "| 1.10 |" in text  # p50 / floor
    assert "| rbac: p99 <= 5 ms at 1000/s | 4.00 ms | met |" in text
    assert "| daemonsets: p99 <= 5 ms at 1000/s | 8.00 ms | **missed** |" in text
    assert "| daemonsets: policy cost <= 25% over the floor (p50 at 1000/s) | +50% | **missed** |" in text
    assert "| dra-guard adds <= 2 ms median to a create | +1.00 ms | met |" in text
    assert "| dra-guard's added latency within 2x the VAP's | +1.00 vs +0.20 ms | **missed** |" in text
    assert "| peak RSS <= 150 MiB per worker (through the fixed rates) | 100 MiB | met |" in text
    assert "| peak RSS <= 150 MiB per worker (after overload) | 160 MiB | **missed** |" in text


def test_command_line_rejects_unknown_parts():
    with pytest.raises(SystemExit):
        main.parse_args(["--only", "endpoints,everything"])
    quick = main.parse_args(["--quick"])
    assert quick.repeats == 1 and quick.no_search and quick.scale.claims < 10_000


def test_compare_report_gives_each_version_its_cpu_ratio_to_the_first_the_rss_rows_and_the_tails():
    from bench import compare

    def cell(cpu, p50, p99, lo, hi):
        return {"cpu_s_per_1000": {"median": cpu}, "p50": {"median": p50}, "p99": {"median": p99, "min": lo, "max": hi}}

    tail = {"slow": 40, "slow_seconds": 3, "seconds": 20, "slow_in_worst_100ms": 0.75, "gc_over_5ms": 1}
    tail.update(worker_cpu_s=12.5, vegeta_cpu_s=3.1, load_average_before=1.2, load_average_after=2.5)
    result = {
        "versions": ["before1", "before2", "after"],
        "refs": {"before1": "abc", "before2": "def", "after": "working tree"},
        "rounds": 3,
        "seconds": 20,
        "rate": 500,
        "summary": {
            "rbac": {
                "before1": cell(0.64, 0.62, 1.4, 1.2, 1.6),
                "before2": cell(0.80, 0.70, 2.0, 1.9, 2.2),
                "after": cell(0.58, 0.59, 1.3, 1.1, 9.5),
            }
        },
        "runs": [
            {"endpoint": "rbac", "version": "after", "round": 2, "p99": 9.5, "tail": tail},
            {"endpoint": "rbac", "version": "after", "round": 1, "p99": 1.1, "tail": tail},
        ],
        "rss_mib": {name: {"ready": 135.6, "after the runs": 137.1} for name in ("before1", "before2", "after")},
    }
    text = compare.report(result)
    assert "| rbac | before1 | 0.640 | 1.00 | 0.62 | 1.40 | 1.20-1.60 |" in text
    assert "| rbac | after | 0.580 | 0.91 | 0.59 | 1.30 | 1.10-9.50 |" in text
    assert "| after | 135.6 | 137.1 |" in text
    # only the run over 5 ms is explained, with what was measured during it
    assert "| rbac | after | 2 | 9.5 | 40 | 3 (20) | 75% | 1 | 12.5 / 3.1 | 1.2-2.5 |" in text
    assert "| rbac | after | 1 |" not in text


def test_compare_measures_every_policy_endpoint_and_the_noop_floor_with_the_rbac_bodies_all_allowed():
    from bench import compare, endpoints, fill

    scale = fill.Scale(roles=30, nodes=5, claims=10)
    found = compare.paths(scale)
    assert list(found) == [*endpoints.ENDPOINTS, "/validate/noop"]
    assert {compare.ENDPOINTS[p] for p in found} == {"rbac", "daemonsets", "evictions", "noop"}
    rbac = endpoints.bodies(scale)["/validate/rbac"]
    assert [b["request"]["object"] for b, _ in found["/validate/noop"]] == [b["request"]["object"] for b, _ in rbac]
    assert all(allowed for _, allowed in found["/validate/noop"])


def test_tail_evidence_tells_a_stall_from_a_spread_tail():
    from bench.endpoints import tail_evidence

    stall = [1.0] * 1000 + [30.0] * 20 + [1.0] * 980  # 20 slow ones sent within 40 ms, at 500/s
    spread = [30.0 if i % 100 == 0 else 1.0 for i in range(2000)]
    one, other = tail_evidence(stall, 500), tail_evidence(spread, 500)
    assert one["slow"] == other["slow"] == 20
    assert one["slow_seconds"] == 1 and one["slow_in_worst_100ms"] == 1.0
    assert other["slow_seconds"] == 4 and other["slow_in_worst_100ms"] == 0.05


def test_throughput_search_steps_up_bisects_and_forgives_one_stall(monkeypatch):
    calls = []

    def fake_run_rate(server, path, reviews, *, rate, seconds, workdir):
        calls.append(rate)
        stall = len(calls) == 1  # the very first run hits a stall
        ok = rate <= 1200 and not stall
        return {"p99": 2.0 if ok else 50.0, "success": 1.0, "throughput": rate}

    monkeypatch.setattr(endpoints, "run_rate", fake_run_rate)
    monkeypatch.setattr(endpoints.time, "sleep", lambda s: None)
    found = endpoints.max_throughput(None, "/validate/rbac", [], workdir=None, seconds=1)
    assert calls[:2] == [500, 500]  # the stall is retried, not taken as the capacity
    assert found["max_rps"] == 1100  # 1000 good, 1500 bad; bisected twice on the 50/s grid: 1250 bad, 1100 good
    assert found["p99_at_max"] == 2.0


def test_every_endpoints_function_main_calls_exists():
    """main.py reaches bench.endpoints by attribute; a lost function shows only minutes into a run."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(main))
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "endpoints"
    }
    assert {"measure_protected_role", "profile"} <= used
    assert [name for name in sorted(used) if not hasattr(endpoints, name)] == []


def test_protected_role_body_is_a_clusterrole_granting_resourceslice_write_and_allowed():
    from webhook.config import RbacConfig
    from webhook.model import rbac as rbac_model

    [(review, allowed)] = endpoints.protected_role_bodies()
    role = review["request"]["object"]
    assert review["request"]["kind"]["kind"] == "ClusterRole" and allowed
    assert rbac_model.protected_grants(role["rules"], RbacConfig(), role=role["metadata"]["name"])


def test_cpu_used_sums_processes_by_name_and_keeps_the_machine_figures():
    before = {
        -1: ("machine idle", 100.0),
        -2: ("machine steal", 1.0),
        -3: ("ended children of the bench (vegeta)", 0.0),
        10: ("python", 5.0),
        11: ("python", 1.0),
        12: ("kube-apiserver", 3.0),
        13: ("gone", 9.0),
    }
    after = {
        -1: ("machine idle", 130.0),
        -2: ("machine steal", 1.5),
        -3: ("ended children of the bench (vegeta)", 4.0),
        10: ("python", 9.0),
        11: ("python", 2.0),
        12: ("kube-apiserver", 10.0),
        14: ("new", 2.0),
    }
    used = common.cpu_used(before, after, {10: "dra-guard worker"}, top=2)
    # pid 13 ended and 14 started inside the window: neither is counted; 11 is the third largest
    assert used == {
        "kube-apiserver": 7.0,
        "dra-guard worker": 4.0,
        "machine idle": 30.0,
        "machine steal": 0.5,
        "ended children of the bench (vegeta)": 4.0,
    }


def test_cpu_snapshot_and_context_switches_read_this_process():
    import os
    import time

    snap = common.cpu_snapshot()
    assert snap[os.getpid()][1] > 0  # this test's own CPU seconds so far
    assert {-1, -2, -3} <= set(snap)
    switches = common.context_switches(os.getpid())
    time.sleep(0.01)  # a voluntary switch
    assert common.context_switches(os.getpid()) > switches


def test_envelope_splits_a_round_robin_attack_by_label_and_finds_log_lines(tmp_path):
    from bench import envelope

    run = common.Attack(rate=10, seconds=1, latencies_ms=[1.0, 10.0, 2.0, 20.0, 3.0, 30.0], codes=[200] * 6, errors=[], bodies=[])
    split = envelope.by_label(run, ["a", "floor a"])
    assert split["a"]["max"] == 3.0 and split["floor a"]["max"] == 30.0
    log = tmp_path / "log"
    log.write_text('not json\n{"msg": "periodic audit started", "auditPid": 7}\n{"msg": "periodic audit done", "seconds": 2}\n')
    assert envelope.wait_for_line(log, "periodic audit done", timeout=0)["seconds"] == 2
    assert envelope.wait_for_line(log, "periodic audit started", offset=log.stat().st_size, timeout=0) is None


def test_kernel_tcp_counters_reads_the_tcpext_rows():
    text = (
        "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPSynRetrans\n"
        "TcpExt: 0 116158 116160 86185\n"
        "IpExt: InNoRoutes\nIpExt: 0\n"
    )
    assert common.kernel_tcp_counters(text) == {"ListenOverflows": 116158, "ListenDrops": 116160, "TCPSynRetrans": 86185}
    assert common.kernel_tcp_counters("IpExt: InNoRoutes\nIpExt: 0\n") == {}
    live = common.kernel_tcp_counters()  # this machine's own file (Linux): every counter, none negative
    assert set(live) == {"ListenOverflows", "ListenDrops", "TCPSynRetrans"} and min(live.values()) >= 0


def test_recovery_sets_server_engine_only_for_an_older_checkout(tmp_path):
    """bench.recovery --servers: `.` is this checkout with its own config (it has no server.engine);
    DIR another checkout as it is; ENGINE@DIR an older checkout run with server.engine ENGINE."""
    import pathlib

    from bench import recovery

    assert recovery.server_of(".") == (None, None)
    assert recovery.server_of(str(tmp_path)) == (None, tmp_path)
    assert recovery.server_of(f"gthread@{tmp_path}") == ("gthread", pathlib.Path(tmp_path))
    with pytest.raises(ValueError, match="needs a DIR"):
        recovery.server_of("asyncio@")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning to one CPU of several needs 2 CPUs")
def test_pin_restricts_every_thread_of_a_process_and_its_children():
    """bench.recovery --pin: the server's master, its worker and every thread of each, those
    started before the pin and after it, run on the CPUs given."""
    import subprocess
    import sys

    script = (
        "import os, subprocess, sys, threading, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.readline()\n"  # pinned by now
        "late = []\n"
        "threading.Thread(target=lambda: late.append(os.sched_getaffinity(0)), daemon=True).start()\n"
        "time.sleep(0.2)\n"
        "print(sorted(late[0]), flush=True)\n"
        "child.kill()\n"
    )
    cpu = min(os.sched_getaffinity(0))
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        child = int(proc.stdout.readline())
        pinned = common.pin(proc.pid, {cpu})
        assert set(pinned) == {proc.pid, child}
        for pid in pinned:
            tasks = os.listdir(f"/proc/{pid}/task")
            assert {t: os.sched_getaffinity(int(t)) for t in tasks} == {t: {cpu} for t in tasks}
        assert len(os.listdir(f"/proc/{proc.pid}/task")) >= 2  # the thread started before the pin
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == f"[{cpu}]"  # a thread started after it inherits it
    finally:
        proc.kill()
        proc.wait()


def test_an_attack_knows_how_far_vegeta_sent_behind_its_schedule():
    """A load generator short of CPU sends late: bench.recovery reports it beside the goodput."""
    on_time = common.Attack(
        rate=100, seconds=1, latencies_ms=[1.0] * 3, codes=[200] * 3, errors=[], bodies=[], sent_s=[0.0, 0.0101, 0.02]
    )
    assert on_time.behind_schedule_s() == pytest.approx(0.0001)
    late = common.Attack(
        rate=100, seconds=1, latencies_ms=[1.0] * 3, codes=[200] * 3, errors=[], bodies=[], sent_s=[0.0, 0.5, 0.02]
    )
    assert late.behind_schedule_s() == pytest.approx(0.49)
    assert common.Attack(rate=100, seconds=1, latencies_ms=[], codes=[], errors=[], bodies=[]).behind_schedule_s() == 0.0


def test_every_subcommand_runs_its_modules_main_with_the_rest_of_the_command_line(monkeypatch, capsys):
    """`python -m bench NAME ARGS...` is `bench.<module>.main(ARGS)`: each subcommand's --help is its
    module's own parser, under the subcommand's name."""
    from bench import __main__ as cli

    for name, (module, _) in cli.SUBCOMMANDS.items():
        monkeypatch.setattr(sys, "argv", ["bench/__main__.py", name, "--help"])
        with pytest.raises(SystemExit) as exit_:
            cli.main()
        assert exit_.value.code == 0, name
        out = capsys.readouterr().out
        assert out.startswith("usage: python -m bench"), (name, out[:80])
        assert f"python -m bench {name}" in out or f"python -m {module}" in out, (name, out[:80])


def test_the_subcommand_list_and_an_unknown_subcommand(capsys):
    from bench import __main__ as cli

    assert cli.main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in cli.SUBCOMMANDS)
    assert cli.main(["handshake"]) == 2  # deleted: its finding is in bench/RESULTS.md
    assert "unknown subcommand 'handshake'" in capsys.readouterr().err
    assert cli.main([]) == 2


def test_a_metrics_scrape_reset_like_the_fronts_overload_answer_is_tried_again(tmp_path):
    """The front resets new connections to the webhook port while overloaded and for 1 s after:
    bench's /metrics reads after a load run retry a reset (and only for retry_for seconds)."""
    import socket
    import struct
    import threading

    import requests

    listener = socket.create_server(("127.0.0.1", 0))
    port, accepted = listener.getsockname()[1], []

    def serve(resets: int) -> None:
        for _ in range(resets + 1):
            try:
                conn, _ = listener.accept()
            except OSError:  # the listener closed: the client gave up first
                return
            accepted.append(conn)
            if len(accepted) <= resets:  # accepted and reset, as the front's refuse_queued does
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                continue
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nup 1.0\n")
            conn.close()

    thread = threading.Thread(target=serve, args=(2,), daemon=True)
    thread.start()
    assert common.scrape_metrics(f"http://127.0.0.1:{port}", tmp_path / "ca.pem") == "up 1.0\n"
    assert len(accepted) == 3
    thread.join(5)

    accepted.clear()
    thread = threading.Thread(target=serve, args=(1,), daemon=True)
    thread.start()
    with pytest.raises(requests.ConnectionError):
        common.scrape_metrics(f"http://127.0.0.1:{port}", tmp_path / "ca.pem", retry_for=0)
    listener.close()
    thread.join(5)
