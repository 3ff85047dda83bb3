"""The argument parser of `dra-guard`: every subcommand, flag, help text and examples.

Built on webhook.cli.suggest.Parser: mistyped commands and flags get "did you mean", and each
subcommand reports its own errors with its own usage.
build_parser calls one builder per subcommand (_add_<name>); the subcommands that talk to the
Kubernetes API as a user would take its flags from one parent parser (connection_flags).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import textwrap
from typing import TYPE_CHECKING

from webhook.cli.suggest import Parser
from webhook.policies.registry import POLICIES
from webhook.version import version

if TYPE_CHECKING:
    from typing import TypeAlias

    #: what ArgumentParser.add_subparsers returns; each builder below adds its subcommand to it
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

EXAMPLES = textwrap.dedent("""\
    examples:
      dra-guard audit -f examples/                      check manifests offline (exit 1 if something would be refused or patched)
      dra-guard audit -f team-rbac.yaml --cluster       check files against the live cluster's roles
      dra-guard audit --cluster --suggest-values        the Helm values that clear the driver findings
      dra-guard serve --self-signed /tmp/dra-guard      run locally over TLS with a development CA
      dra-guard serve --config /etc/dra-guard/config.yaml \\
          --tls-cert-file tls.crt --tls-key-file tls.key
      dra-guard drain-plan node-a                       which pods must leave node-a before its DRA drivers
      dra-guard drain node-a --evict-drivers            drain node-a in that order, its DRA drivers last
      dra-guard certs generate --service dra-guard --namespace dra-guard --out ./tls

    The config file (--config) is YAML; see docs/configuration.md for every key.
    Modes: enforce refuses, warn allows with a kubectl warning, audit allows and only records.
    """)


DRAIN_EXAMPLES = textwrap.dedent("""\
    examples:
      dra-guard drain-plan node-a                 the order: which pods leave first, then the driver pods
      dra-guard drain-plan node-a -o json         the same as JSON ({"ready", "driverPods", "evictFirst"})
      dra-guard drain node-a --evict-drivers      does the drain in this order (`dra-guard drain --help`)
    """)

DRAIN_RUN_EXAMPLES = textwrap.dedent("""\
    examples:
      dra-guard drain node-a                        consumers out, wait until the DRA drivers have released
                                                    every claim on node-a (safe to power off); drivers stay
      dra-guard drain node-a --evict-drivers --timeout 10m
                                                    ... then the driver pods too, last (node removal)
      dra-guard drain node-a --dry-run=client       the plan, nothing written
      dra-guard drain node-a --dry-run=server       cordon and evictions sent as dry runs: what PDBs and
                                                    webhooks would refuse
      dra-guard drain node-a -o json                one JSON event a line (for scripts, pre-drain hooks)
      dra-guard uncordon node-a                     undo what the drain changed (a node cordoned before stays so)

    Exit 0 done, 1 stopped before done (the timeout, a PodDisruptionBudget, a holder that does not
    leave: each named with its reason; another drain of the node running), 2 usage and API errors,
    a node that does not exist, and a missing permission (checked before anything changes).
    Run it again after 1 (or after killing it): it continues where the node is.

    RBAC the drain's user needs (each checked before anything changes; a missing one is exit 2
    naming it): get, patch nodes; list, watch, get pods; create pods/eviction; get resourceclaims,
    list resourceslices (resource.k8s.io); get daemonsets (apps). Optional: get nodes/proxy, to
    read the kubelet's dra_resource_claims_in_use gauge, which confirms that a force-deleted
    consumer's driver has unprepared (without it the drain waits --unconfirmed-wait instead);
    create events (Events on the Node, namespace default); list clusterroles, clusterrolebindings
    (which ServiceAccounts write ResourceSlices: driver detection). More: docs/operations/draining.md
    """)

SERVE_EXAMPLES = textwrap.dedent("""\
    examples:
      dra-guard serve --self-signed /tmp/dra-guard      run locally over TLS with a development CA
      dra-guard serve --self-signed /tmp/dra-guard --no-cluster --log-level debug
                                                        no Kubernetes API (empty caches), every log line
      dra-guard serve --config /etc/dra-guard/config.yaml \\
          --tls-cert-file tls.crt --tls-key-file tls.key
      dra-guard serve --config config.yaml              with certificates.mode: self in config.yaml

    The config file (--config) is YAML; see docs/configuration.md for every key, and check it
    first with `dra-guard config validate FILE` (every error at once).
    Modes: enforce refuses, warn allows with a kubectl warning, audit allows and only records.
    """)

AUDIT_EXAMPLES = textwrap.dedent("""\
    examples:
      dra-guard audit -f examples/                      check manifests offline (exit 1 if something would be refused or patched)
      helm template CHART | dra-guard audit -f -        check rendered templates from standard input
      dra-guard audit -f team-rbac.yaml --cluster       check files against the live cluster's roles
      dra-guard audit -f pr/ --cluster --scope files    only what the files change (a pull-request check)
      dra-guard audit --cluster --suggest-values        the Helm values that clear the driver findings
      dra-guard audit -f manifests/ -o sarif > dra-guard.sarif
                                                        SARIF 2.1.0 for code-scanning UIs

    On a terminal, long messages are wrapped to its width, and a progress bar shows on stderr
    when reading and judging take more than DRA_GUARD_PROGRESS_DELAY seconds (default 2); in
    pipes and files the output is unwrapped and there is no bar.
    """)

CONFIG_EXAMPLES = textwrap.dedent("""\
    examples:
      dra-guard config validate config.yaml             every error at once, each naming its key (exit 2)
      dra-guard config schema > dra-guard.schema.json   the file's JSON schema, for editors
      dra-guard config schema --chart                   the chart's values.schema.json subtree (config:)
    """)

CERTS_GENERATE_EXAMPLES = textwrap.dedent("""\
    examples:
      dra-guard certs generate --service dra-guard --namespace dra-guard --out ./tls
      dra-guard certs generate --service dra-guard --namespace dra-guard --out ./tls --ip 127.0.0.1 --force
    """)

CERTS_INSPECT_EXAMPLES = textwrap.dedent("""\
    examples:
      dra-guard certs inspect --cert-file ./tls/tls.crt --cluster   do the webhooks' caBundles trust it?
      dra-guard certs inspect --url 127.0.0.1:8443                  what a running dra-guard serves
    """)

HOOK_EXAMPLES = textwrap.dedent("""\
    examples (the chart's hook pods set the environment variables instead):
      dra-guard hook pre-delete --webhook-configuration dra-guard
      dra-guard hook test --rbac-mode enforce --slice-writer-role dra-guard-test-slice-writer \\
          --binding-name dra-guard-test
    """)

COMPLETION_EXAMPLES = textwrap.dedent("""\
    examples:
      source <(dra-guard completion bash)               in ~/.bashrc
      dra-guard completion zsh > "${fpath[1]}/_dra-guard"
      dra-guard completion fish > ~/.config/fish/completions/dra-guard.fish
    """)

POLICY_LIST = (
    "policies (config key policies.<name>):\n" + "".join(f"  {p.name:<9} {p.path:<20} {p.title}\n" for p in POLICIES) + "\n"
)


def positive_seconds(text: str) -> float:
    """A number of seconds > 0 (argparse type); argparse reports a bad one as a usage error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {text!r}")
    return value


def duration(text: str) -> float:
    """A duration in seconds >= 0 (argparse type), kubectl's spelling: "90", "90s", "10m", "1h",
    "1m30s"; 0 means no limit."""
    import re

    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 10m, 1h)")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def connection_flags() -> argparse.ArgumentParser:
    """The flags of every subcommand that talks to the Kubernetes API as a user would (audit, drain-plan,
    drain, uncordon, cleanup), given to each as a parent parser (argparse `parents=`) so their --help
    says the same. (serve, certs inspect and the chart's hooks declare their own: they take only some of
    these flags, or other defaults.)"""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("Kubernetes API")
    group.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig (default: $KUBECONFIG, else in-cluster, else ~/.kube/config)"
    )
    group.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")
    group.add_argument(
        "--request-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="seconds each API request may take (default: %(default)g)",
    )
    return parent


def build_parser(prog: str = "dra-guard") -> argparse.ArgumentParser:
    """The `dra-guard` parser (argparse), subcommands included; `prog` is the name usage lines and
    errors give it ("kubectl dra-guard" when run as the kubectl plugin)."""
    parser = Parser(
        prog=prog,
        description="Admission webhook enforcing the Kubernetes good practices for Dynamic Resource "
        "Allocation (DRA) as a cluster admin.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dra-guard {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    connection = connection_flags()
    _add_serve(sub)
    _add_audit(sub, connection)
    _add_drain_plan(sub, connection)
    _add_drain(sub, connection)
    _add_uncordon(sub, connection)
    _add_certs(sub)
    _add_hook(sub)
    _add_config(sub)
    _add_cleanup(sub, connection)
    _add_completion(sub)
    if prog != "dra-guard":
        _examples_as(parser, prog)
    return parser


def _examples_as(parser: argparse.ArgumentParser, prog: str) -> None:
    """Spell the examples and command names of `parser`'s texts (and its subcommands') as `prog`:
    a kubectl plugin installed by krew has no `dra-guard` on PATH, so `kubectl dra-guard drain
    --help` shows `kubectl dra-guard drain node-a`. An example's comment column moves right by
    the longer name, its continuation lines with it."""
    # the command where it starts a line, follows a pipe or a process substitution, or is quoted
    command = re.compile(r"(^ +|\| |<\(|`)dra-guard ")
    shift = " " * (len(prog) - len("dra-guard"))
    lines = []
    for line in (parser.epilog or "").split("\n"):
        spelled = command.sub(rf"\1{prog} ", line)
        if spelled == line and len(line) - len(line.lstrip(" ")) >= 20:
            spelled = shift + line  # the continuation of an example's comment
        lines.append(spelled)
    parser.epilog = "\n".join(lines) if parser.epilog is not None else None
    if parser.description:
        parser.description = command.sub(rf"\1{prog} ", parser.description)
    for child in getattr(parser, "commands", {}).values():
        _examples_as(child, prog)


def _add_serve(sub: Subcommands) -> None:
    """`dra-guard serve`: the webhook server."""
    serve = sub.add_parser(
        "serve",
        help="run the admission webhook server (gunicorn over TLS)",
        description=f"Serve {', '.join(p.path for p in POLICIES)}, /healthz, "
        "/readyz and /metrics over HTTPS (and /validate/noop, a no-op review for "
        "benchmarks, never registered by the chart). Each gunicorn worker (server.workers) "
        "serves its connections from one event loop (a slow client holds no thread; chunked "
        "requests get 411) and judges reviews in server.threads threads; it holds at most "
        "server.threads + 250 connections, more wait in the kernel's backlog. With a cluster, a DRA driver pod leaving on the strength "
        "of its Ready peer while claims need its driver is allowed only once this replica "
        "owns a shared record, a Lease dra-guard-leaving-<digest> in certificates.namespace "
        "(else $POD_NAMESPACE, else dra-guard): replicas let one pod of a surge pair go at a time.",
        epilog=POLICY_LIST + SERVE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--config", metavar="FILE", help="YAML config file (default: built-in defaults)")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=None, help="HTTPS port (default: server.port from config, 8443)")
    serve.add_argument("--tls-cert-file", metavar="FILE", help="serving certificate (PEM)")
    serve.add_argument("--tls-key-file", metavar="FILE", help="serving certificate's private key (PEM)")
    serve.add_argument(
        "--self-signed",
        metavar="DIR",
        help="development: create (or reuse) a CA and a certificate for localhost, 127.0.0.1 and ::1 in DIR",
    )
    serve.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster config, else ~/.kube/config)")
    serve.add_argument(
        "--no-cluster",
        action="store_true",
        help="do not use the Kubernetes API: caches stay empty, policies see an empty cluster, no shared record is written",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe JSON log lines written to stderr, gunicorn's included (default: %(default)s)",
    )


def _add_audit(sub: Subcommands, connection: argparse.ArgumentParser) -> None:
    """`dra-guard audit`: the policies over manifests and/or the live cluster."""
    audit = sub.add_parser(
        "audit",
        parents=[connection],
        help="run the policies over manifests and/or the live cluster",
        description="Report what dra-guard would refuse or patch; with --cluster also the control plane's DRA tuning "
        "(kube-controller-manager QPS/Burst, served resource.k8s.io versions, old kubelets) "
        "and the driver pods a drain would have to leave last. Exit 0 when clean (advisory "
        "findings alone do not fail), 1 when enforce mode would refuse or patch "
        "something, 2 on usage or input errors and when the Kubernetes API cannot be reached or refuses. "
        "A finding a live exception of the config covers (key exceptions) is reported as skip and "
        "does not fail; an expired one is reported (check exception-expired) and skips nothing.",
        epilog=AUDIT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.add_argument(
        "-f",
        "--filename",
        dest="paths",
        action="append",
        default=[],
        metavar="PATH",
        help="file or folder of YAML/JSON manifests, or - for standard input (repeatable; multi-document "
        "files and List kinds; documents without kind and unrendered Helm templates are skipped "
        "with a note)",
    )
    audit.add_argument(
        "--cluster",
        action="store_true",
        help="include the live cluster's objects, and judge the files against them (the Kubernetes API flags "
        "below apply only with it)",
    )
    audit.add_argument(
        "--scope",
        choices=["all", "files"],
        default="all",
        help="with --cluster and -f: all (default) reports everything; files reports only the findings "
        "about the files' objects or that the files introduce (a pull-request check)",
    )
    audit.add_argument(
        "--qps", type=float, default=10.0, help="--cluster: API requests per second at most (default: %(default)s)"
    )
    audit.add_argument("--burst", type=int, default=20, help="--cluster: requests allowed in a burst (default: %(default)s)")
    audit.add_argument(
        "--config",
        metavar="FILE",
        help="the YAML config file `serve` reads (default: a DraGuardConfiguration among the manifests, "
        "else with --cluster the installed release's ConfigMap, else the built-in defaults; the "
        "one used is named on stderr)",
    )
    audit.add_argument(
        "--release-namespace",
        metavar="NS",
        help="--cluster: the namespace of the dra-guard release whose configuration to use (default: the only one installed)",
    )
    audit.add_argument(
        "--no-installed-config",
        action="store_true",
        help="--cluster: use the built-in defaults instead of the installed release's configuration",
    )
    _add_audit_output_flags(audit)


def _add_audit_output_flags(audit: argparse.ArgumentParser) -> None:
    """What `dra-guard audit` prints: -o, -q, the suggestions (--suggest-exception, --suggest-values) and
    --allow-empty."""
    audit.add_argument(
        "-o",
        "--output",
        choices=["table", "json", "yaml", "sarif", "junit", "policyreport", "openreports"],
        default="table",
        help="table (default; columns RESULT: refuse/patch/advisory/skip, POLICY, CHECK, MODE, the object, "
        "LOCATION: file:line), json or yaml (an AuditResult: apiVersion dra-guard.io/v1alpha1, summary, findings), sarif (SARIF 2.1.0 for code-scanning "
        "UIs), junit (JUnit XML for CI test reports), policyreport (wgpolicyk8s.io/v1alpha2 "
        "ClusterPolicyReport/PolicyReports as YAML), openreports (openreports.io/v1alpha1 "
        "ClusterReport/Reports as YAML); in both, a result names an object (apiVersion, uid) only "
        "when it was read, and a message over 1024 characters is cut at a word with the whole "
        "text in properties.message",
    )
    audit.add_argument(
        "-q", "--quiet", action="store_true", help="no progress on stderr (neither the lines in pipes nor the bar on a terminal)"
    )
    audit.add_argument(
        "--suggest-exception",
        action="store_true",
        help="instead of the report, print config.exceptions entries (Helm values YAML) that skip the "
        "findings an exception may cover (rbac-write on bindings, probes on DaemonSets), filled from "
        "the findings (roleRef, subjects, resources) and from --owner, --reason and --expires; "
        "review each before you apply it (the exit code stays the audit's)",
    )
    audit.add_argument("--owner", help="--suggest-exception: who answers for the exceptions (a person or team)")
    audit.add_argument("--reason", help="--suggest-exception: why they are excepted (shown in warnings and reports)")
    audit.add_argument(
        "--expires",
        default="30d",
        metavar="DAYSd|DATE",
        help="--suggest-exception: when they stop applying: a number of days from now (30d, the default) or an "
        "RFC 3339 date-time with a time zone; at most 366 days ahead",
    )
    audit.add_argument(
        "--allow-empty",
        action="store_true",
        help="exit 0 when the input holds no Kubernetes object; without it that is exit 2, so that an "
        "empty stdin or a folder of unrendered Helm templates never reads as clean",
    )
    audit.add_argument(
        "--suggest-values",
        action="store_true",
        help="instead of the report, print the Helm values (YAML under config:) that clear the driver "
        "findings: refused ResourceSlice writers to rbac.extraDriverSubjects, undeclared drivers "
        "to drivers.declared (the exit code stays the audit's)",
    )


def _add_drain_plan(sub: Subcommands, connection: argparse.ArgumentParser) -> None:
    """`dra-guard drain-plan NODE`: what a drain must wait for."""
    drain = sub.add_parser(
        "drain-plan",
        parents=[connection],
        help="what a drain of NODE must wait for (DRA drivers last)",
        description="List NODE's DRA driver pods and, for each, its drivers (and how each name "
        "was learned: the DaemonSet's spec, label, a selector, or the node's "
        "ResourceSlices when the spec names none), the ResourceClaims still "
        "allocated to them there and the pods holding them: the order a drain "
        "must take (the source page: drain the DRA driver as late as possible). "
        "A driver pod with another Ready pod of its DaemonSet on the node "
        "(surge rollout) can go. Exit 0 when every driver pod can be evicted now, 1 "
        "when some must wait, 2 on errors (a node that does not exist, an API that cannot be reached or "
        "refuses: one line naming the server and the cause).",
        epilog=DRAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    drain.add_argument("node", metavar="NODE", help="the node's name, as in `kubectl get nodes`")
    drain.add_argument("--config", metavar="FILE", help="the YAML config file `serve` reads (driver detection)")
    drain.add_argument(
        "-o",
        "--output",
        choices=["text", "json"],
        default="text",
        help="text (default; wrapped to the width of a terminal) or json",
    )


def _add_drain(sub: Subcommands, connection: argparse.ArgumentParser) -> None:
    """`dra-guard drain NODE`: the drain in the order DRA needs."""
    run = sub.add_parser(
        "drain",
        parents=[connection],
        help="drain NODE in the order DRA needs: consumers, then (with --evict-drivers) the drivers last",
        description="Cordon NODE, evict its pods through the eviction API (PodDisruptionBudgets and "
        "admission webhooks asked; a pod is never deleted), then the pods of DaemonSets that use "
        "ResourceClaims (a NoSchedule taint keeps them from coming back), then wait until no DRA "
        "driver of the node is still needed there (no pod of the node left in a claim's reservedFor, "
        "Terminating ones included: the rule of dra-guard's drain-order guard) and, for a consumer "
        "that left without the kubelet's word (force-deleted), until the kubelet's "
        "dra_resource_claims_in_use gauge says so (nodes/proxy) or --unconfirmed-wait has passed. With "
        "--evict-drivers the driver pods go last, a NoSchedule taint put on only then. Without it the "
        "drivers stay and done means the node is safe to power off. Other DaemonSet pods stay. One "
        "drain per node at a time (annotation drain.dra-guard.io/holder); while it runs the node has "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled and karpenter.sh/do-not-disrupt.",
        epilog=DRAIN_RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("node", metavar="NODE", help="the node's name, as in `kubectl get nodes`")
    run.add_argument(
        "--timeout",
        type=duration,
        default=0.0,
        metavar="DURATION",
        help="stop (exit 1, naming what blocks) after this long: 90, 90s, 10m, 1h (default 0: no limit)",
    )
    run.add_argument(
        "--grace-period",
        type=int,
        default=-1,
        metavar="SECONDS",
        help="seconds each evicted pod gets to terminate (default -1: the pod's own)",
    )
    run.add_argument(
        "--dry-run",
        choices=["none", "client", "server"],
        default="none",
        help="client: print the plan, write nothing; server: send the cordon and evictions as dry "
        "runs and report what would be refused (default: none)",
    )
    run.add_argument("--pod-selector", metavar="SELECTOR", help="evict only the pods this label selector selects")
    run.add_argument(
        "--evict-drivers", action="store_true", help="evict the DRA driver pods too, last, once their claims are released"
    )
    run.add_argument(
        "--unconfirmed-wait",
        type=positive_seconds,
        default=90.0,
        metavar="SECONDS",
        help="after a consumer left without the kubelet's word (force-deleted) and the kubelet's "
        "gauge cannot be read: wait this long for its driver to unprepare (default: %(default)g)",
    )
    run.add_argument("--config", metavar="FILE", help="the YAML config file `serve` reads (driver detection)")
    run.add_argument(
        "-o",
        "--output",
        choices=["text", "json"],
        default="text",
        help="text (default: a line per step; on a terminal a status line) or json (an event a line)",
    )


def _add_uncordon(sub: Subcommands, connection: argparse.ArgumentParser) -> None:
    """`dra-guard uncordon NODE`: undo a drain's changes."""
    unc = sub.add_parser(
        "uncordon",
        parents=[connection],
        help="undo what a drain of NODE changed",
        description="Remove the taints and annotations the drains of NODE added and uncordon it, "
        "unless it was cordoned before the first drain (as recorded in the annotation "
        "drain.dra-guard.io/state). Exit 0 done (nothing recorded included), 1 while a drain of "
        "the node runs, 2 on errors (one line naming the server and the cause). Needs get and patch "
        "on nodes.",
    )
    unc.add_argument("node", metavar="NODE", help="the node's name")
    unc.add_argument("-o", "--output", choices=["text", "json"], default="text", help="text (default) or json")


def _add_certs(sub: Subcommands) -> None:
    """`dra-guard certs generate | inspect`."""
    certs_p = sub.add_parser(
        "certs",
        help="certificate helpers",
        description="Write a CA and a serving certificate (generate), or check one (inspect).",
        epilog=CERTS_GENERATE_EXAMPLES + CERTS_INSPECT_EXAMPLES.replace("examples:\n", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    certs_sub = certs_p.add_subparsers(dest="certs_command", metavar="ACTION")
    gen = certs_sub.add_parser(
        "generate",
        help="write a CA and a serving certificate for a Service",
        description="Write ca.crt, ca.key, tls.crt and tls.key to --out: a new CA and a serving "
        "certificate for the Service's DNS names (SERVICE, SERVICE.NAMESPACE, "
        "SERVICE.NAMESPACE.svc, SERVICE.NAMESPACE.svc.cluster.local), plus --dns/--ip.",
        epilog=CERTS_GENERATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument("--service", required=True, help="the webhook Service name")
    gen.add_argument("--namespace", required=True, help="the Service's namespace")
    gen.add_argument("--out", required=True, metavar="DIR", help="folder for ca.crt, ca.key, tls.crt, tls.key")
    gen.add_argument("--dns", action="append", default=[], metavar="NAME", help="extra DNS SAN (repeatable)")
    gen.add_argument("--ip", action="append", default=[], metavar="IP", help="extra IP SAN (repeatable)")
    gen.add_argument("--force", action="store_true", help="replace a CA already in --out (breaks caBundles that trust it)")
    insp = certs_sub.add_parser(
        "inspect",
        help="show a serving certificate's names and expiry, and whether the cluster's caBundles trust it",
        description="Print subject, SANs, validity and issuer of a serving certificate (--cert-file, or the one "
        "dra-guard serves at --url), and with --cluster whether every webhook of dra-guard's "
        "Validating/MutatingWebhookConfiguration (names from --config) has a caBundle that verifies it. "
        "Exit 0 when all is well, 1 when a caBundle does not match or the certificate is due for renewal, "
        "2 on errors.",
        epilog=CERTS_INSPECT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    insp.add_argument("--cert-file", metavar="FILE", help="PEM serving certificate")
    insp.add_argument("--url", metavar="HOST:PORT", help="fetch the certificate a running server presents instead")
    insp.add_argument("--config", metavar="FILE", help="the config file (webhook configuration names, renewal share)")
    insp.add_argument("--cluster", action="store_true", help="compare with the caBundles in the cluster")
    insp.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for --cluster")
    insp.add_argument("--context", metavar="NAME", help="kubeconfig context for --cluster")


def _add_hook(sub: Subcommands) -> None:
    """`dra-guard hook pre-delete | test`: what the chart's hook pods run."""
    hook = sub.add_parser(
        "hook",
        help="the Helm chart's hooks (pre-delete, helm test), run in dra-guard's image",
        description="What the chart's hook pods run. Each flag defaults to the environment "
        "variable named in its help, which the chart sets.",
        epilog=HOOK_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    hook_sub = hook.add_subparsers(dest="hook_command", metavar="ACTION")
    _add_hook_pre_delete(hook_sub)
    _add_hook_test(hook_sub)


def _add_hook_pre_delete(hook_sub: Subcommands) -> None:
    """`dra-guard hook pre-delete`: the chart's pre-delete hook."""
    pre = hook_sub.add_parser(
        "pre-delete",
        help="delete dra-guard's webhook configurations before the rest of the release goes, then its reports",
        description="Delete the ValidatingWebhookConfiguration and MutatingWebhookConfiguration NAME (already "
        "absent counts as done), so an uninstall never leaves a fail-closed webhook pointing at "
        "nothing. Exit 0 when both are gone; 2 with one line naming the server and the cause "
        "when the caller may not delete them (401/403) or other API and network errors last past "
        "--retry-seconds. With --delete-reports, then dra-guard's reports (as `dra-guard cleanup`); a "
        "failure there is printed and leaves the exit code alone.",
    )
    pre.add_argument(
        "--webhook-configuration",
        metavar="NAME",
        default=os.environ.get("WEBHOOK_CONFIGURATION", ""),
        help="name of both configurations ($WEBHOOK_CONFIGURATION)",
    )
    pre.add_argument("--retry-seconds", type=float, default=60.0, help="retry transient errors this long (default: 60)")
    pre.add_argument(
        "--delete-reports",
        action="store_true",
        default=os.environ.get("DELETE_REPORTS", "") == "true",
        help="then delete dra-guard's reports, as the cleanup command does ($DELETE_REPORTS=true); a failure "
        "there is printed and does not change the exit code",
    )
    pre.add_argument(
        "--request-timeout",
        type=positive_seconds,
        default=10.0,
        metavar="SECONDS",
        help="seconds each API request may take (default: 10)",
    )
    pre.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster config)")


def _add_hook_test(hook_sub: Subcommands) -> None:
    """`dra-guard hook test`: the chart's `helm test`."""
    test = hook_sub.add_parser(
        "test",
        help="helm test: a dry-run ClusterRoleBinding the RBAC guard must refuse (enforce) or warn about",
        description="Create, as a server-side dry run (nothing is stored), a ClusterRoleBinding that gives a "
        "made-up group a ClusterRole with write on resourceslices. enforce: passes only if "
        "rbac.dra-guard.io denied it; warn: only if it was allowed with a dra-guard warning; audit: if "
        "the apiserver got an answer. 'failed calling webhook' always fails. Exit 0 passed, 1 failed, 2 when "
        "the apiserver cannot be reached or refuses the hook itself (one line naming the server and "
        "the cause: the test then says nothing about dra-guard).",
    )
    test.add_argument(
        "--rbac-mode",
        choices=["enforce", "warn", "audit"],
        default=os.environ.get("RBAC_MODE", "enforce"),
        help="the rbac policy's mode ($RBAC_MODE, default enforce)",
    )
    test.add_argument(
        "--failure-policy",
        default=os.environ.get("FAILURE_POLICY", "Fail"),
        help="the RBAC webhook's failurePolicy ($FAILURE_POLICY, default Fail)",
    )
    test.add_argument(
        "--slice-writer-role",
        default=os.environ.get("SLICE_WRITER_ROLE", ""),
        help="a ClusterRole with write on resourceslices ($SLICE_WRITER_ROLE)",
    )
    test.add_argument(
        "--test-group",
        default=os.environ.get("TEST_GROUP", "dra-guard-helm-test:made-up-group"),
        help="the made-up group to bind ($TEST_GROUP)",
    )
    test.add_argument(
        "--binding-name",
        default=os.environ.get("BINDING_NAME", ""),
        help="name of the dry-run ClusterRoleBinding ($BINDING_NAME)",
    )
    test.add_argument(
        "--request-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="seconds the dry run may take (default: 30)",
    )
    test.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster config)")


def _add_config(sub: Subcommands) -> None:
    """`dra-guard config validate | schema`."""
    cfg = sub.add_parser(
        "config",
        help="check a config file, or print its JSON schema",
        description="`config validate FILE` checks a dra-guard config file as `serve` would load it "
        "(exit 0 valid, 2 with the offending key named); `config schema` prints the "
        "file's JSON schema (generated from the declared keys).",
        epilog=CONFIG_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="ACTION")
    validate = cfg_sub.add_parser(
        "validate",
        help="check a config file (exit 0 valid, 2 invalid)",
        description="Check FILE as `serve` would load it. Every error is reported at once, "
        "one line each, naming the file and the key (an unknown key with the "
        "closest known one); exit 0 valid, 2 invalid.",
        epilog=CONFIG_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    validate.add_argument("file", metavar="FILE", help="the YAML config file")
    schema = cfg_sub.add_parser(
        "schema",
        help="print the config file's JSON schema",
        description="Print the config file's JSON schema (draft-07), generated from the declared keys.",
        epilog=CONFIG_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    schema.add_argument("--chart", action="store_true", help="the subtree of the chart's values.schema.json (config:)")


def _add_cleanup(sub: Subcommands, connection: argparse.ArgumentParser) -> None:
    """`dra-guard cleanup`: delete the reports dra-guard wrote."""
    clean = sub.add_parser(
        "cleanup",
        parents=[connection],
        help="delete the reports dra-guard wrote (PolicyReports, openreports.io Reports)",
        description="Delete every report dra-guard wrote (label app.kubernetes.io/managed-by=dra-guard): "
        "wgpolicyk8s.io ClusterPolicyReports and PolicyReports and openreports.io ClusterReports and "
        "Reports, of each report API the cluster serves; one line per report, then a count. The "
        "chart's reports name its ClusterRole as their owner and the garbage collector deletes them "
        "on `helm uninstall`; run this for those without an owner (written outside the chart, or "
        "left by `helm uninstall --cascade orphan`). The chart's pre-delete hook runs the same code "
        "when preDelete.enabled. Exit 0 done (nothing to delete included), 2 when the API cannot be "
        "reached or refuses (one line naming the server and the cause).",
    )
    clean.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")


def _add_completion(sub: Subcommands) -> None:
    """`dra-guard completion SHELL`."""
    comp = sub.add_parser(
        "completion",
        help="print shell completion code (bash, zsh, fish)",
        description="Print the code that makes your shell complete dra-guard's commands and flags.",
        epilog=COMPLETION_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    comp.add_argument("shell", choices=["bash", "zsh", "fish"], help="your shell")
