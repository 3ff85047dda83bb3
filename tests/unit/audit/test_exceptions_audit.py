"""`dra-guard audit -f` (the installed CLI, a process of its own) with exceptions in the config:
skip under a live exception, an exception-expired finding and the refusal again once it expired,
and the exit codes that follow."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys

import pytest
import yaml

from tests.builders import binding, cluster_role, driver_daemonset, rbac_exception, rule, subject

NOW = datetime.datetime.now(datetime.UTC)
OBJECTS = [
    cluster_role("slice-writer", [rule(["resourceslices"], ["create", "update"])]),
    binding("team-gpu", "slice-writer", [subject("Group", "team-a")]),
]


def entry(days: float) -> dict[str, object]:
    return rbac_exception(expires=(NOW + datetime.timedelta(days=days)).isoformat())


def audit(tmp_path, *args, exceptions=None):
    (tmp_path / "rbac.yaml").write_text(yaml.safe_dump_all(OBJECTS))
    cmd = [sys.executable, "-m", "webhook.cli", "audit", "-f", str(tmp_path / "rbac.yaml"), *args]
    if exceptions is not None:
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({"exceptions": exceptions}))
        cmd += ["--config", str(tmp_path / "config.yaml")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_refused_without_the_exception(tmp_path):
    done = audit(tmp_path, "-o", "json")
    assert done.returncode == 1
    assert [f["check"] for f in json.loads(done.stdout)["findings"]] == ["rbac-write"]


def test_a_live_exception_makes_it_skip_and_exit_0(tmp_path):
    done = audit(tmp_path, "-o", "json", exceptions=[entry(30)])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    (finding,) = result["findings"]
    assert finding["check"] == "rbac-write" and finding["enforced"] is False
    assert (
        finding["exception"]["owner"] == "team-gpu"
        and finding["exception"]["reason"] == "vendor tool republishes slices until driver 2.1"
    )
    assert result["summary"]["results"]["skip"] == 1 and result["summary"]["results"]["refuse"] == 0


def test_the_policyreport_says_skip_with_the_exception(tmp_path):
    done = audit(tmp_path, "-o", "policyreport", exceptions=[entry(30)])
    assert done.returncode == 0, done.stderr
    (report,) = [r for r in yaml.safe_load_all(done.stdout) if r["kind"] == "ClusterPolicyReport"]
    (result,) = [r for r in report["results"] if r["policy"] == "rbac"]
    assert result["result"] == "skip" and report["summary"]["skip"] == 1 and report["summary"]["fail"] == 0
    props = result["properties"]
    assert props["exceptionOwner"] == "team-gpu" and props["exceptionRef"] == "rbac ClusterRoleBinding team-gpu"
    assert props["exceptionExpires"].endswith("Z")


def test_an_expired_exception_is_a_finding_and_the_refusal_is_back(tmp_path):
    done = audit(tmp_path, "-o", "json", exceptions=[entry(-1)])
    assert done.returncode == 1
    findings = json.loads(done.stdout)["findings"]
    assert [(f["check"], f["enforced"]) for f in findings] == [("rbac-write", True), ("exception-expired", False)]
    assert "expired at" in findings[0]["message"] and "owner team-gpu" in findings[1]["message"]
    assert "exception rbac ClusterRoleBinding team-gpu (owner team-gpu) expired at" in done.stderr
    # the same time as the finding writes it (Z), not Python's +00:00
    assert "+00:00" not in done.stderr and re.search(r"expired at \d{4}-\d\d-\d\dT[\d:.]+Z; what it covers", done.stderr)
    table = audit(tmp_path, exceptions=[entry(-1)])
    assert table.returncode == 1 and "exception-expired" in table.stdout


def test_a_bad_exception_is_exit_2_naming_the_key(tmp_path):
    bad = {**entry(30), "expires": "soon"}
    done = audit(tmp_path, exceptions=[bad])
    assert done.returncode == 2 and "exceptions[0].expires" in done.stderr and "Traceback" not in done.stderr


def test_a_probes_exception_skips_the_missing_probe(tmp_path):
    (tmp_path / "ds.yaml").write_text(yaml.safe_dump(driver_daemonset()))
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "exceptions": [
                    {
                        "policy": "probes",
                        "kind": "DaemonSet",
                        "namespace": "gpu",
                        "name": "gpu-driver",
                        "reason": "no health endpoint",
                        "owner": "team-gpu",
                        "expires": (NOW + datetime.timedelta(days=3)).isoformat(),
                    }
                ]
            }
        )
    )
    base = [sys.executable, "-m", "webhook.cli", "audit", "-f", str(tmp_path / "ds.yaml"), "-o", "json"]
    assert subprocess.run(base, capture_output=True, text=True, timeout=60).returncode == 1
    done = subprocess.run([*base, "--config", str(tmp_path / "config.yaml")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    probes = [f for f in json.loads(done.stdout)["findings"] if f["policy"] == "probes"]
    assert probes and all(f["exception"]["ref"] == "probes DaemonSet gpu/gpu-driver" and not f["patch"] for f in probes)


def test_config_validate_names_an_expired_exception(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"exceptions": [entry(-2)]}))
    done = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "config", "validate", str(tmp_path / "config.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "exception rbac ClusterRoleBinding team-gpu (owner team-gpu) expired at" in done.stderr


def test_the_table_says_the_result_and_where_the_object_is(tmp_path):
    """RESULT reads skip for a finding an exception skips (MODE alone said enforce), refuse without
    it; LOCATION is the file and line of the object, what an admin with a large repository needs."""
    skipped = audit(tmp_path, exceptions=[entry(30)])
    refused = audit(tmp_path)
    for done, result in ((skipped, "skip"), (refused, "refuse")):
        header, row = done.stdout.splitlines()[:2]
        assert header.split() == ["RESULT", "POLICY", "CHECK", "MODE", "KIND", "NAMESPACE", "NAME", "LOCATION"], header
        cells = row.split()
        assert cells[0] == result and cells[6] == "team-gpu", row
        path, line = cells[7].rsplit(":", 1)
        assert path == str(tmp_path / "rbac.yaml")
        assert (tmp_path / "rbac.yaml").read_text().splitlines()[int(line) - 1].startswith(("apiVersion", "kind")), line


def test_suggest_exception_prints_entries_that_skip_exactly_these_findings(tmp_path):
    """The entries are filled from the findings (roleRef, subjects, resources) and the flags; put
    into the config they make the same audit skip every finding (exit 0)."""
    done = audit(tmp_path, "--suggest-exception", "--owner", "team-gpu", "--reason", "vendor tool", "--expires", "10d")
    assert done.returncode == 1, done.stderr  # the exit code stays the audit's
    values = yaml.safe_load(done.stdout)
    (entry,) = values["config"]["exceptions"]
    assert entry["roleRef"] == "slice-writer" and entry["subjects"] == {"groups": ["team-a"]}, entry
    assert entry["resources"] == ["resourceslices"] and entry["owner"] == "team-gpu" and entry["reason"] == "vendor tool"
    expires = datetime.datetime.fromisoformat(entry["expires"].replace("Z", "+00:00"))
    assert datetime.timedelta(days=9) < expires - NOW < datetime.timedelta(days=11), entry
    again = audit(tmp_path, "-o", "json", exceptions=values["config"]["exceptions"])
    assert again.returncode == 0, again.stderr
    assert [f["check"] for f in json.loads(again.stdout)["findings"] if "exception" not in f] == []


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--reason", "r"], "--suggest-exception needs --owner"),
        (["--owner", "o", "--reason", "r", "--expires", "400d"], "at most 366 days ahead"),
        (["--owner", "o", "--reason", "r", "--expires", "2027-01-01"], "no time zone"),
        (["--owner", "o", "--reason", "r", "-o", "json"], "drop --suggest-values and -o/--output"),
    ],
)
def test_suggest_exception_usage_errors_are_one_line_exit_2(tmp_path, flags, says):
    done = audit(tmp_path, "--suggest-exception", *flags)
    assert done.returncode == 2 and says in done.stderr and not done.stdout, done.stderr
