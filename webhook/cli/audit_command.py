"""`dra-guard audit`: read manifests and/or the live cluster, judge them with the policies, render
the findings; returns the exit code (webhook.cli: 0 clean, 1 would refuse or patch, 2 errors)."""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import TYPE_CHECKING

from webhook.cli import terminal
from webhook.cli.terminal import fail, say
from webhook.config import load_config

if TYPE_CHECKING:
    from webhook.audit.load import Manifests
    from webhook.audit.run import Audit
    from webhook.config import Config


def run(args: argparse.Namespace) -> int:
    from webhook import audit

    if not args.paths and not args.cluster:
        return fail("audit needs -f PATH (files, folders or - for stdin) and/or --cluster")
    if args.suggest_values and args.output != "table":
        return fail("--suggest-values prints Helm values (YAML); drop -o/--output")
    if args.suggest_exception:
        if args.suggest_values or args.output != "table":
            return fail("--suggest-exception prints config entries (YAML); drop --suggest-values and -o/--output")
        missing = [flag for flag, value in (("--owner", args.owner), ("--reason", args.reason)) if not value]
        if missing:
            return fail(f"--suggest-exception needs {' and '.join(missing)}: every exception names who answers for it and why")
        try:
            expires = _expiry(args.expires, datetime.datetime.now(datetime.UTC))
        except ValueError as exc:
            return fail(f"--expires {args.expires}: {exc}")

    # on a terminal a progress display (after a few seconds), in pipes a line every 2 s while reading
    on_terminal = not args.quiet and terminal.is_terminal(sys.stderr)
    first = (
        "reading " + ", ".join("standard input" if path == "-" else path for path in args.paths)
        if args.paths
        else "reading the cluster's objects"
    )
    display = terminal.Progress(sys.stderr, terminal.progress_delay(), first) if on_terminal else terminal.NoProgress()
    with display:
        outcome = _judge(args, display)
    if isinstance(outcome, int):
        return outcome
    manifests, config, result = outcome
    findings, sources, problems = result.findings, manifests.sources, manifests.problems
    skipped = f", {len(manifests.notes)} document(s) skipped" if manifests.notes else ""
    if not args.cluster and not manifests.objects and not problems:
        # an empty stdin, or a folder of unrendered Helm templates, has nothing to judge:
        # "No findings" would read as clean
        if not args.allow_empty:
            return fail(
                f"nothing to judge: no Kubernetes object in the input{skipped}; render Helm charts first "
                "(helm template CHART | dra-guard audit -f -), or pass --allow-empty where an empty input is fine"
            )
        say("note", f"nothing to judge: no Kubernetes object in the input{skipped}; --allow-empty: exit 0")
    else:
        bindings = len(result.judged.get("rbac", ()))
        drivers = len(result.judged.get("probes", ()))
        source = f"{len(manifests.objects)} object(s) of the files{skipped}" + (" and the cluster's" if args.cluster else "")
        say("audit", f"judged {source}: {bindings} ClusterRoleBinding(s), {drivers} DRA driver DaemonSet(s) among them")
    # with problems every format says the audit is incomplete: a clean-looking stdout next to exit 2
    # would be read by whatever only parses stdout
    renderers = {
        "table": lambda: terminal.for_stream(audit.render_table(findings, problems, sources), sys.stdout),
        "json": lambda: audit.render_json(findings, sources, judged=result.judged, problems=problems),
        "yaml": lambda: audit.render_yaml(findings, sources, judged=result.judged, problems=problems),
        "sarif": lambda: audit.render_sarif(findings, sources, problems=problems),
        "junit": lambda: audit.render_junit(findings, sources, problems=problems),
        "policyreport": lambda: audit.render_reports(
            findings, refs=result.refs, judged=result.judged, problems=problems, api=audit.WGPOLICY
        ),
        "openreports": lambda: audit.render_reports(
            findings, refs=result.refs, judged=result.judged, problems=problems, api=audit.OPENREPORTS
        ),
    }
    if args.suggest_exception:
        text = audit.suggest_exceptions([f for f, _ in findings], owner=args.owner, reason=args.reason, expires=expires)
    elif args.suggest_values:
        text = audit.suggest_values([f for f, _ in findings if not f.skipped], config)
    else:
        text = renderers[args.output]()
    sys.stdout.write(text)
    if manifests.problems:
        say("error", f"{len(manifests.problems)} input problem(s); the findings above cover what could be read")
        return 2
    return audit.exit_code(findings)


def _expiry(text: str, now: datetime.datetime) -> datetime.datetime:
    """--expires as an aware datetime: "Nd" days from `now`, or an RFC 3339 date-time with a time
    zone; at most webhook.config.exceptions.MAX_DAYS ahead and in the future. Raises ValueError."""
    from webhook.config.exceptions import MAX_DAYS

    if text.endswith("d") and text[:-1].isdigit():
        when = now + datetime.timedelta(days=int(text[:-1]))
    else:
        try:
            when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("give a number of days (30d) or an RFC 3339 date-time such as 2027-03-31T00:00:00Z") from None
        if when.tzinfo is None:
            raise ValueError("no time zone; end it with Z or +hh:mm")
    if not now < when <= now + datetime.timedelta(days=MAX_DAYS):
        raise ValueError(f"must be in the future and at most {MAX_DAYS} days ahead")
    return when.replace(microsecond=0)


#: notes of one reason listed one per line up to this many; more are one line with a count
NOTES_LISTED = 3


def _grouped(notes: list[str]) -> list[str]:
    """The input notes ("WHERE: skipped: WHY") as printed: one line each while few share a reason;
    NOTES_LISTED or more with the same WHY become one line with their count and the first of them
    (a chart's templates folder is a dozen identical notes otherwise)."""
    by_why: dict[str, list[str]] = {}
    for note in notes:
        where, sep, why = note.partition(": skipped: ")
        by_why.setdefault(why if sep else note, []).append(where if sep else note)
    out = []
    for why, wheres in by_why.items():
        if len(wheres) <= NOTES_LISTED or why in wheres:
            out += [f"{where}: skipped: {why}" if where != why else why for where in wheres]
        else:
            first = ", ".join(wheres[:NOTES_LISTED])
            out.append(f"{len(wheres)} documents skipped: {why} ({first} and {len(wheres) - NOTES_LISTED} more)")
    return out


def _judge(args: argparse.Namespace, display: terminal.Progress | terminal.NoProgress) -> int | tuple[Manifests, Config, Audit]:
    """Read the manifests, choose the config, read the cluster and judge: (Manifests, Config,
    webhook.audit.Audit), or an exit code when it cannot go on. `display` is told each step."""
    import yaml

    from webhook import audit
    from webhook.config import from_mapping
    from webhook.kube import lists
    from webhook.kube.client import api_client, served_resource_versions
    from webhook.kube.pages import RateLimiter
    from webhook.model.facts import StaticFacts, add_objects
    from webhook.policies.exceptions import stamp

    def progress(line: str) -> None:
        if isinstance(display, terminal.Progress):
            display.step(line)
        else:
            print(f"dra-guard: {line}", file=sys.stderr, flush=True)

    manifests = audit.read(
        args.paths,
        progress=None if args.quiet else progress,
        progress_seconds=0 if isinstance(display, terminal.Progress) else 2.0,
    )
    for note in _grouped(manifests.notes):
        say("note", note)
    for problem in manifests.problems:
        say("error", problem)
    objects = manifests.objects
    client = None
    found = [o for o in objects if o.get("kind") == "DraGuardConfiguration"]
    try:
        if args.config:
            config, source = load_config(args.config), args.config
        elif found:
            config, source = audit.config_from(objects), "the DraGuardConfiguration among the manifests"
        elif args.cluster and not args.no_installed_config:
            client = api_client(args.kubeconfig, timeout_seconds=args.request_timeout, context=args.context)
            installed = lists.installed_config(client, namespace=args.release_namespace, timeout_seconds=args.request_timeout)
            if installed is None and args.release_namespace:
                # a mistyped namespace must not turn into the built-in defaults (other verdicts)
                elsewhere = lists.installed_config(client, timeout_seconds=args.request_timeout)
                there = f"; one is installed in {elsewhere[1].split()[1].split('/')[0]}" if elsewhere else ""
                return fail(
                    f"no dra-guard release in namespace {args.release_namespace!r} (--release-namespace){there}; "
                    "pass the release's namespace, --config FILE or --no-installed-config"
                )
            if installed is None:
                config, source = from_mapping(None), "the built-in defaults (no dra-guard release found in the cluster)"
            else:
                config, source = from_mapping(yaml.safe_load(installed[0])), f"{installed[1]} (the installed release)"
        else:
            config, source = from_mapping(None), "the built-in defaults"
    except audit.InputError as exc:
        return fail(str(exc))
    for line in config.ignored:
        say("warning", line)
    say("config", source)
    now = datetime.datetime.now(datetime.UTC)
    for e in config.exceptions:
        if not e.live(now):
            say(
                "warning",
                f"exception {e.ref} (owner {e.owner}) expired at {stamp(e.expires)}; what it covers is reported again",
            )
    if args.cluster:
        display.step("reading the cluster's objects")
        client = client or api_client(args.kubeconfig, timeout_seconds=args.request_timeout, context=args.context)
        limiter = RateLimiter(qps=args.qps, burst=args.burst)
        served = served_resource_versions(client, timeout_seconds=args.request_timeout)
        if args.scope == "files" and not objects:
            return fail("--scope files needs -f PATH: it reports only what the files change")
        # RBAC, Pods and ResourceClaims go straight into the indexes, page by page (memory)
        facts = StaticFacts(config)
        live = lists.stream_audit_cluster(
            client, facts, served_versions=served, limiter=limiter, timeout_seconds=args.request_timeout
        )
        baseline = audit.audit(live, config, served_versions=served, online=True, facts=facts) if args.scope == "files" else None
        add_objects(facts, objects)  # the files' objects replace the live ones of the same key
        display.step(f"judging {len(objects)} object(s) of the files with the cluster's")
        result = audit.audit(audit.merge(objects, live), config, served_versions=served, online=True, facts=facts)
        if baseline is not None:
            result = audit.only_files(result, baseline, {audit.load.object_key(o) for o in objects})
    else:
        display.step(f"judging {len(objects)} object(s)")
        result = audit.audit(objects, config)
    return manifests, config, result
