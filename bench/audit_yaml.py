"""`dra-guard audit -f` on a large manifest, against the bare YAML parse of the same file (issue 18).

A generated multi-document manifest of about `--megabytes` MB (ClusterRoles, ClusterRoleBindings,
DRA driver DaemonSets and ConfigMaps, in the shapes of tests/builders.py) is parsed with libyaml's
yaml.CSafeLoader alone (the floor), then audited in-process as `dra-guard audit -f FILE -o json`
does (read, judge, render). The ratio audit / floor is the result (target: <= 1.5): machines differ
in speed, the ratio much less. Best of `--repeat` runs each.

    python -m bench audit-yaml --megabytes 5 --repeat 3 [--out bench/results/unreleased/audit-yaml.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time
from typing import Any

import yaml

from bench.common import machine
from tests.builders import binding, cluster_role, driver_daemonset, rule, subject
from webhook import audit
from webhook.config import from_mapping


def objects(count: int) -> list[dict[str, Any]]:
    """`count` groups of a ClusterRole, its ClusterRoleBinding, a driver DaemonSet and a ConfigMap."""
    out: list[dict[str, Any]] = []
    for i in range(count):
        verbs = ["create"] if i % 10 == 0 else ["get", "list"]
        out.append(
            cluster_role(
                f"role-{i}",
                [
                    rule(["resourceslices" if i % 10 == 0 else "resourceclaims"], verbs),
                    rule(["pods", "configmaps"], ["get", "list", "watch"], groups=[""]),
                ],
                labels={"team": f"t{i % 50}"},
            )
        )
        out.append(
            binding(
                f"binding-{i}",
                f"role-{i}",
                [subject("Group", f"team-{i % 50}"), subject("ServiceAccount", f"sa-{i}", f"ns-{i % 20}")],
            )
        )
        out.append(driver_daemonset(name=f"driver-{i}", namespace=f"ns-{i % 20}"))
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"cm-{i}", "namespace": f"ns-{i % 20}"},
                "data": {"settings.yaml": "key: value\n" * 20},
            }
        )
    return out


def manifest(megabytes: float) -> str:
    """A YAML stream of about `megabytes` MB."""
    one = yaml.safe_dump_all(objects(10))
    groups = max(1, int(megabytes * 1e6 / len(one) * 10))
    return yaml.safe_dump_all(objects(groups))


def best(fn: Any, repeat: int) -> float:
    """Seconds of the fastest of `repeat` calls of fn()."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def measure(megabytes: float, repeat: int) -> dict[str, Any]:
    """{bytes, objects, parse_seconds, audit_seconds, ratio, loader} for one generated file."""
    text = manifest(megabytes)
    config = from_mapping(None)
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "big.yaml"
        path.write_text(text)
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        parse = best(lambda: list(yaml.load_all(path.read_text(), Loader=loader)), repeat)

        def full() -> None:
            read = audit.read([str(path)])
            result = audit.audit(read.objects, config)
            audit.render_json(result.findings, read.sources, judged=result.judged)

        whole = best(full, repeat)
        count = len(audit.read([str(path)]).objects)
    return {
        "bytes": len(text),
        "objects": count,
        "loader": loader.__name__,
        "parse_seconds": round(parse, 3),
        "audit_seconds": round(whole, 3),
        "ratio": round(whole / parse, 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Print (and with --out, write) the measurement as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench audit-yaml", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    result = {**measure(args.megabytes, args.repeat), "machine": machine()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
