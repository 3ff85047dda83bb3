"""Evictions first: under a flood of heavy RBAC reviews, straight to dra-guard's
port and through the apiserver, the eviction of a DRA driver pod whose claim is still reserved is
answered 429 every time, for 30 s. Without evictions first, ten clients sending 7 MB reviews make
the eviction webhook time out within 3-4 s, and its failurePolicy Ignore lets the eviction through
(201).
"""

from __future__ import annotations

import json
import threading
import time

import requests

from tests.builders import cluster_role, review, rule
from tests.e2e.test_eviction import claim_reserved, driver_pod_name, evict, scenario, wait_for  # noqa: F401
from tests.scrape import metric, scrape

FLOOD_SECONDS = 30
DIRECT_CLIENTS = 6
APISERVER_CLIENTS = 2


def heavy_role(name: str, values: int) -> dict:
    return cluster_role(
        name,
        [rule(["resourceslices"], ["create"])],
        aggregation=[{"matchExpressions": [{"key": "k", "operator": "In", "values": [f"value-{i:07d}" for i in range(values)]}]}],
    )


def test_driver_eviction_is_refused_every_time_under_a_flood_of_heavy_reviews(control_plane, scenario):  # noqa: F811
    cp, guard = control_plane, scenario
    driver_pod = wait_for("the driver pod", lambda: driver_pod_name(cp))
    wait_for("the claim to be reserved", lambda: claim_reserved(cp))
    wait_for(
        "dra-guard to refuse the driver eviction",
        lambda: evict(cp, "gpu", driver_pod).status_code == 429 and "still needed" in evict(cp, "gpu", driver_pod).text,
    )

    stop = threading.Event()
    sent = {"direct": 0, "apiserver": 0}
    direct_body = json.dumps(review(heavy_role("flood-direct", 420_000))).encode()  # 7 MB, like the issue's
    # through the apiserver: a server-side dry run by alice (who holds escalate), 100,000 values (~1.8 MB)
    via_apiserver = heavy_role("flood-apiserver", 100_000)

    def direct() -> None:
        s = guard.proc.session()
        while not stop.is_set():
            try:
                s.post(guard.url + "/validate/rbac", data=direct_body, timeout=15, headers={"Content-Type": "application/json"})
                sent["direct"] += 1
            except requests.RequestException:
                pass

    def apiserver() -> None:
        s = cp.session("alice")
        url = f"{cp.url}/apis/rbac.authorization.k8s.io/v1/clusterroles?dryRun=All"
        while not stop.is_set():
            try:
                s.post(url, json=via_apiserver, timeout=15)
                sent["apiserver"] += 1
            except requests.RequestException:
                pass

    threads = [threading.Thread(target=direct, daemon=True) for _ in range(DIRECT_CLIENTS)]
    threads += [threading.Thread(target=apiserver, daemon=True) for _ in range(APISERVER_CLIENTS)]
    not_judged = metric(scrape(guard.proc), "dra_guard_reviews_not_judged_total", default=0.0)
    for t in threads:
        t.start()
    answers = []
    try:
        time.sleep(1)  # let the flood build up
        end = time.monotonic() + FLOOD_SECONDS
        while time.monotonic() < end:
            started = time.monotonic()
            r = evict(cp, "gpu", driver_pod)
            answers.append((r.status_code, round(time.monotonic() - started, 2), r.text[:200]))
            time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(20)
    print(
        f"\n{len(answers)} evictions under the flood; heavy reviews sent: {sent}; "
        f"slowest eviction answer {max(a[1] for a in answers)} s"
    )
    assert len(answers) >= 20, answers
    assert all(code == 429 for code, _, _ in answers), [a for a in answers if a[0] != 429]
    assert driver_pod_name(cp) == driver_pod  # never evicted
    # the flood was real: dra-guard received the heavy reviews, and refused them unjudged (limits, overload)
    assert sent["direct"] >= DIRECT_CLIENTS and sent["apiserver"] >= APISERVER_CLIENTS, sent
    assert metric(scrape(guard.proc), "dra_guard_reviews_not_judged_total", default=0.0) > not_judged
