"""Exceptions an admin owns, through a real kube-apiserver and the real kubectl: a binding the RBAC
guard refuses is admitted (with a warning naming the exception) while its exception is live, stays
pinned to the subjects it names, and is refused again once the exception has expired, without a
restart; `dra-guard audit --cluster` reports it as skip meanwhile."""

from __future__ import annotations

import datetime
import json
import time

import yaml

from tests.e2e.guard import DENIED
from tests.e2e.kube import audit_findings
from tests.e2e.test_rbac_guard import apply, binding_yaml, exists, role_yaml
from tests.scrape import metric, scrape

ROLE, BINDING = "e2e-exc-slice-writer", "e2e-exc-team-a"
#: how long the exception lives: long enough for dra-guard to restart and answer three reviews
LIFETIME_SECONDS = 40


def exception_config(expires: datetime.datetime) -> str:
    return yaml.safe_dump(
        {
            "exceptions": [
                {
                    "policy": "rbac",
                    "kind": "ClusterRoleBinding",
                    "name": BINDING,
                    "roleRef": ROLE,
                    "subjects": {"groups": ["team-a"]},
                    "resources": ["resourceslices"],
                    "reason": "e2e: vendor tool republishes slices",
                    "owner": "team-e2e",
                    "expires": expires.isoformat(),
                }
            ]
        }
    )


def test_a_binding_refused_without_an_exception_is_admitted_with_one_until_it_expires(control_plane, guard, tmp_path):
    cp = control_plane
    assert apply(cp, "admin", role_yaml(ROLE, ["resourceslices"], ["create", "patch"])).returncode == 0
    cp.kubectl("admin", "delete", "clusterrolebinding", BINDING, "--ignore-not-found")
    try:
        refused = apply(cp, "alice", binding_yaml(BINDING, ROLE, "team-a"))
        assert refused.returncode != 0 and DENIED in refused.stderr
        assert not exists(cp, "clusterrolebinding", BINDING)

        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=LIFETIME_SECONDS)
        config = exception_config(expires)
        guard.start(mode="enforce", extra_config=config)
        guard.wait_called()
        admitted = apply(cp, "alice", binding_yaml(BINDING, ROLE, "team-a"))
        assert admitted.returncode == 0, admitted.stderr
        assert (
            "Warning: dra-guard: allowed by exception rbac ClusterRoleBinding e2e-exc-team-a (owner team-e2e, expires"
        ) in admitted.stderr
        assert exists(cp, "clusterrolebinding", BINDING)
        assert metric(scrape(guard.proc), "dra_guard_exceptions", state="active", default=0.0) == 1

        # the exception names Group team-a: the same binding giving the role to team-b is refused
        widened = json.loads(binding_yaml(BINDING, ROLE, "team-a"))
        widened["subjects"].append({"kind": "Group", "name": "team-b", "apiGroup": "rbac.authorization.k8s.io"})
        wider = apply(cp, "alice", json.dumps(widened))
        assert wider.returncode != 0 and DENIED in wider.stderr and "Group team-b" in wider.stderr

        (tmp_path / "config.yaml").write_text(config)
        mine = [f for f in audit_findings(cp, "--config", str(tmp_path / "config.yaml")) if f["name"] == BINDING]
        assert [(f["check"], f["exception"]["owner"]) for f in mine] == [("rbac-write", "team-e2e")], mine

        cp.kubectl("admin", "delete", "clusterrolebinding", BINDING)
        time.sleep(max(0.0, (expires - datetime.datetime.now(datetime.UTC)).total_seconds()) + 1)
        again = apply(cp, "alice", binding_yaml(BINDING, ROLE, "team-a"))
        assert again.returncode != 0 and DENIED in again.stderr and "expired at" in again.stderr
        assert not exists(cp, "clusterrolebinding", BINDING)
        assert metric(scrape(guard.proc), "dra_guard_exceptions", state="expired", default=0.0) == 1
        assert metric(scrape(guard.proc), "dra_guard_admission_excepted_total", policy="rbac", state="expired", default=0.0) >= 1
    finally:
        cp.kubectl("admin", "delete", "clusterrolebinding", BINDING, "--ignore-not-found")
        guard.start(mode="enforce")
        guard.wait_called()
