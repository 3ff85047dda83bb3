"""`dra-guard drain`'s command line: kubectl's duration spelling for --timeout, and the output in a
pipe (one line per step) and as JSON (one event a line)."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from webhook.cli.drain_command import Printer
from webhook.cli.parser import build_parser, duration
from webhook.kube.nodedrain import REQUIRED


@pytest.mark.parametrize(
    "text, seconds", [("0", 0.0), ("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1h", 3600.0), ("1m30s", 90.0), ("500ms", 0.5)]
)
def test_duration(text, seconds):
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten", "10x", "5m-", "-5s"])
def test_bad_duration(text):
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)


def test_flags_in_kubectl_spelling():
    args = build_parser().parse_args(
        ["drain", "node-a", "--timeout", "2m", "--grace-period", "30", "--dry-run=server", "--pod-selector", "app=x"]
        + ["--evict-drivers", "-o", "json", "--context", "prod"]
    )
    assert (args.timeout, args.grace_period, args.dry_run, args.pod_selector) == (120.0, 30, "server", "app=x")
    assert args.evict_drivers and args.output == "json" and args.context == "prod"
    assert build_parser().parse_args(["uncordon", "node-a"]).command == "uncordon"


def test_help_names_every_permission_the_preflight_checks_and_the_optional_ones(capsys):
    """`drain --help` is where an admin learns the RBAC to grant: each verb and resource of the
    preflight (REQUIRED), and the optional nodes/proxy (the kubelet's gauge) beside the safety
    period it spares."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["drain", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    rbac = text[text.index("RBAC the drain's user needs") :]
    for verb, resource, group, sub, _ in REQUIRED:
        name = f"{resource}/{sub}" if sub else resource
        clause = next((c for c in rbac.split(";") if f" {name}" in c or c.strip().startswith(name)), "")
        assert verb in clause, (verb, name, rbac)
        assert not group or f"({group})" in rbac, group
    assert "Optional: get nodes/proxy, to read the kubelet's dra_resource_claims_in_use gauge" in rbac
    assert "--unconfirmed-wait" in rbac and "create events" in rbac


EVENTS = [
    {"event": "cordon", "node": "node-a", "message": "cordoned"},
    {"event": "waiting", "node": "node-a", "message": "pod work/a is Terminating", "reasons": ["pod work/a is Terminating"]},
    {"event": "stopped", "node": "node-a", "message": "timed out", "reasons": ["pdb keep-one", "pod work/b"]},
]


def test_text_in_a_pipe_is_one_line_per_step(capsys):
    printer = Printer("text", "node-a")
    for e in EVENTS:
        printer(e)
    assert capsys.readouterr().out.splitlines() == [
        "drain node-a: cordoned",
        "drain node-a: pod work/a is Terminating",
        "drain node-a: timed out",
        "  - pdb keep-one",
        "  - pod work/b",
    ]


def test_json_is_one_event_a_line(capsys):
    printer = Printer("json", "node-a")
    for e in EVENTS:
        printer(e)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in lines] == ["cordon", "waiting", "stopped"]
    assert all(e["node"] == "node-a" and e["time"].endswith("Z") for e in lines)


def _helps(parser, path=()):
    yield path, parser.format_help()
    for name, child in parser.commands.items():
        yield from _helps(child, (*path, name))


def test_the_kubectl_plugins_help_spells_its_examples_as_kubectl_dra_guard():
    """krew installs only kubectl-dra_guard: an example spelled `dra-guard drain ...` in `kubectl
    dra-guard drain --help` is a command its user does not have."""
    for path, text in _helps(build_parser("kubectl dra-guard")):
        for line in text.splitlines():
            assert not re.search(r"(^ +|\| |<\(|`)dra-guard ", line), (path, line)
    drain = dict(_helps(build_parser("kubectl dra-guard")))[("drain",)]
    first, continued = (line for line in drain.splitlines() if "every claim on node-a" in line or "consumers out" in line)
    assert first.startswith("  kubectl dra-guard drain node-a ")
    assert first.index("consumers out") == len(continued) - len(continued.lstrip())  # the comment column holds
    plain = dict(_helps(build_parser()))[("drain",)]
    assert "\n  dra-guard drain node-a " in plain and "kubectl dra-guard" not in plain


def test_uncordon_help_names_its_permissions(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["uncordon", "--help"])
    assert "Needs get and patch on nodes." in " ".join(capsys.readouterr().out.split())
