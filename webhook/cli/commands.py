"""What each `dra-guard` subcommand does, over the layers below the CLI; each returns the exit code."""
from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from webhook.cli import terminal
from webhook.config import load_config

if TYPE_CHECKING:
    from webhook.audit.load import Manifests
    from webhook.audit.run import Audit
    from webhook.config import Config


def say(kind: str, message: str) -> None:
    """Print "dra-guard: KIND: MESSAGE" on stderr, each line of `message` on a line of its own
    (wrapped to the width of a terminal; as-is in pipes and files)."""
    for line in message.split("\n"):
        print(terminal.for_stream(f"dra-guard: {kind}: {line}", sys.stderr), file=sys.stderr)


def fail(message: str) -> int:
    """Print the error `message` (one line each if it has several, e.g. a ConfigError's) and return 2."""
    say("error", message)
    return 2


def _serve(args: argparse.Namespace) -> int:
    import certs
    from webhook.serve import server

    config = load_config(args.config)
    for line in config.ignored:
        print(f"dra-guard: warning: {line}", file=sys.stderr)
    if args.self_signed:
        if config.certificates.mode == "self":
            return fail("--self-signed and certificates.mode self exclude each other (self mode keeps its CA in a Secret)")
        if args.tls_cert_file or args.tls_key_file:
            return fail("--self-signed and --tls-cert-file/--tls-key-file exclude each other")
        directory = pathlib.Path(args.self_signed)
        ca = certs.ensure_self_signed(directory, dns_names=["localhost"], ip_addresses=["127.0.0.1", "::1"])
        print(f"dra-guard: development CA: {ca} (give it as caBundle / --cacert)", file=sys.stderr, flush=True)
        cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    elif config.certificates.mode == "self":
        if args.tls_cert_file or args.tls_key_file:
            return fail("certificates.mode is self: dra-guard manages the certificate files itself; drop --tls-cert-file/--tls-key-file")
        if args.no_cluster:
            return fail("certificates.mode self keeps the certificates in a Secret and needs the Kubernetes API; drop --no-cluster")
        config = server.resolve_namespace(config)
        reconciler = server.self_managed_reconciler(config, args.kubeconfig, identity=server.identity(args.port or config.server.port))
        reconciler.reconcile()  # the serving files exist before gunicorn starts
        cert_file, key_file = reconciler.dir / "tls.crt", reconciler.dir / "tls.key"
    elif args.tls_cert_file and args.tls_key_file:
        cert_file, key_file = pathlib.Path(args.tls_cert_file), pathlib.Path(args.tls_key_file)
        ok, why = server.certificate_status(cert_file, key_file)
        if not ok:
            return fail(why)
    else:
        return fail("TLS is required: give --tls-cert-file and --tls-key-file (certificates.mode files or cert-manager), "
                     "set certificates.mode: self in --config, or use --self-signed DIR for development")
    if not args.no_cluster:
        # an API the caches cannot read is an error now, not a server that never becomes ready
        server.check_cluster(config, args.kubeconfig)
    server.run(server.ServeOptions(
        config=config, host=args.host, port=args.port or config.server.port, cert_file=cert_file, key_file=key_file,
        kubeconfig=args.kubeconfig, no_cluster=args.no_cluster, log_level=args.log_level))
    return 0


def _audit(args: argparse.Namespace) -> int:
    from webhook import audit

    if not args.paths and not args.cluster:
        return fail("audit needs -f PATH (files, folders or - for stdin) and/or --cluster")
    if args.suggest_values and args.output != "table":
        return fail("--suggest-values prints Helm values (YAML); drop -o/--output")

    # on a terminal a progress display (after a few seconds), in pipes a line every 2 s while reading
    on_terminal = not args.quiet and terminal.is_terminal(sys.stderr)
    first = ("reading " + ", ".join("standard input" if path == "-" else path for path in args.paths) if args.paths
             else "reading the cluster's objects")
    display = terminal.Progress(sys.stderr, terminal.progress_delay(), first) if on_terminal else terminal.NoProgress()
    with display:
        outcome = _judge(args, display)
    if isinstance(outcome, int):
        return outcome
    manifests, config, result = outcome
    findings, sources, problems = result.findings, manifests.sources, manifests.problems
    # with problems every format says the audit is incomplete: a clean-looking stdout next to exit 2
    # would be read by whatever only parses stdout
    renderers = {
        "table": lambda: terminal.for_stream(audit.render_table(findings, problems), sys.stdout),
        "json": lambda: audit.render_json(findings, sources, judged=result.judged, problems=problems),
        "yaml": lambda: audit.render_yaml(findings, sources, judged=result.judged, problems=problems),
        "sarif": lambda: audit.render_sarif(findings, sources, problems=problems),
        "junit": lambda: audit.render_junit(findings, sources, problems=problems),
        "policyreport": lambda: audit.render_policyreport(findings, judged=result.judged, problems=problems),
    }
    sys.stdout.write(audit.suggest_values([f for f, _ in findings], config) if args.suggest_values
                     else renderers[args.output]())
    if manifests.problems:
        say("error", f"{len(manifests.problems)} input problem(s); the findings above cover what could be read")
        return 2
    return audit.exit_code(findings)


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

    def progress(line: str) -> None:
        if isinstance(display, terminal.Progress):
            display.step(line)
        else:
            print(f"dra-guard: {line}", file=sys.stderr, flush=True)

    manifests = audit.read(args.paths, progress=None if args.quiet else progress,
                           progress_seconds=0 if isinstance(display, terminal.Progress) else 2.0)
    for note in manifests.notes:
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
            installed = lists.installed_config(client, namespace=args.release_namespace,
                                               timeout_seconds=args.request_timeout)
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
    if args.cluster:
        display.step("reading the cluster's objects")
        client = client or api_client(args.kubeconfig, timeout_seconds=args.request_timeout, context=args.context)
        limiter = RateLimiter(qps=args.qps, burst=args.burst)
        served = served_resource_versions(client, timeout_seconds=args.request_timeout)
        if args.scope == "files" and not objects:
            return fail("--scope files needs -f PATH: it reports only what the files change")
        # RBAC, Pods and ResourceClaims go straight into the indexes, page by page (issue 19: memory)
        facts = StaticFacts(config)
        live = lists.stream_audit_cluster(client, facts, served_versions=served, limiter=limiter,
                                          timeout_seconds=args.request_timeout)
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


def _config(args: argparse.Namespace) -> int:
    """`dra-guard config validate FILE | schema`."""
    import json

    from webhook.config.schema import config_schema

    if args.config_command == "schema":
        print(json.dumps(config_schema(chart=args.chart), indent=2))
        return 0
    if args.config_command == "validate":
        config = load_config(args.file)
        for line in config.ignored:
            print(f"dra-guard: warning: {line}", file=sys.stderr)
        modes = ", ".join(f"{name} {config.policy(name).mode}" for name in sorted(config.policies))
        print(f"{args.file}: valid DraGuardConfiguration (policies: {modes})")
        return 0
    return fail("config needs an action: validate FILE or schema")


def _completion(args: argparse.Namespace) -> int:
    """`dra-guard completion bash|zsh|fish`: the shell code that completes dra-guard (argcomplete)."""
    from argcomplete.shell_integration import shellcode

    sys.stdout.write(shellcode(["dra-guard"], shell=args.shell))
    return 0


def _drain_plan(args: argparse.Namespace) -> int:
    from webhook import drainplan
    from webhook.kube import lists
    from webhook.kube.client import api_client

    config = load_config(args.config)
    client = api_client(args.kubeconfig, timeout_seconds=args.request_timeout, context=args.context)
    index = drainplan.build_index(lists.list_drain_objects(client, args.node, timeout_seconds=args.request_timeout),
                                  config)
    result = drainplan.plan(index, args.node)
    sys.stdout.write(drainplan.render_json(result) if args.output == "json"
                     else terminal.for_stream(drainplan.render_text(result), sys.stdout))
    return 0 if result["ready"] else 1


def _certs(args: argparse.Namespace) -> int:
    import certs

    if args.certs_command == "inspect":
        return _certs_inspect(args)
    if args.certs_command != "generate":
        return fail("certs needs an action: generate or inspect")
    if (pathlib.Path(args.out) / "ca.crt").exists() and not args.force:
        return fail(f"{args.out}/ca.crt exists: a new CA would break every caBundle that trusts it; pass --force to replace it")
    ca = certs.generate_ca()
    serving = certs.generate_serving(ca, dns_names=[*certs.service_dns_names(args.service, args.namespace), *args.dns],
                                     ip_addresses=args.ip)
    certs.write_bundle(pathlib.Path(args.out), ca=ca, serving=serving)
    print(f"wrote ca.crt, ca.key, tls.crt, tls.key to {args.out}")
    return 0


def _certs_inspect(args: argparse.Namespace) -> int:
    import socket
    import ssl

    from cryptography import x509

    import certs
    from webhook.kube.certapi import KubeCertApi
    from webhook.kube.client import api_client

    config = load_config(args.config)
    if bool(args.cert_file) == bool(args.url):
        return fail("certs inspect needs exactly one of --cert-file FILE or --url HOST:PORT")
    if args.cert_file:
        try:
            cert = x509.load_pem_x509_certificate(pathlib.Path(args.cert_file).read_bytes())
        except (OSError, ValueError) as exc:
            return fail(f"{args.cert_file}: not a readable PEM certificate ({exc})")
    else:
        host, _, port = args.url.rpartition(":")
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # we only read what it presents
        try:
            with socket.create_connection((host, int(port)), timeout=5) as sock, ctx.wrap_socket(sock) as tls:
                der = tls.getpeercert(binary_form=True)
                if der is None:
                    return fail(f"{args.url} presented no certificate")
                cert = x509.load_der_x509_certificate(der)
        except (OSError, ValueError) as exc:
            return fail(f"cannot fetch the certificate from {args.url}: {exc}")
    dns, ips = certs.sans_of(cert)
    due = certs.needs_renewal(cert, share=config.certificates.renew_after_share)
    print(f"subject:    {cert.subject.rfc4514_string()}")
    print(f"issuer:     {cert.issuer.rfc4514_string()}")
    print(f"DNS names:  {', '.join(sorted(dns)) or '(none)'}")
    print(f"IPs:        {', '.join(sorted(ips)) or '(none)'}")
    print(f"valid:      {cert.not_valid_before_utc.isoformat()} .. {cert.not_valid_after_utc.isoformat()}")
    print(f"renewal:    {'DUE (inside the renewal window)' if due else 'not due'}")
    problems = int(due)
    if args.cluster:
        api = KubeCertApi(api_client(args.kubeconfig, timeout_seconds=5, context=args.context), namespace="")
        for kind, name in (("validating", config.certificates.validating_webhook),
                           ("mutating", config.certificates.mutating_webhook)):
            bundles = api.webhook_ca_bundles(kind, name)
            if bundles is None:
                print(f"{kind} webhook configuration {name}: NOT FOUND")
                problems += 1
                continue
            for i, raw in enumerate(bundles):
                try:
                    cas = x509.load_pem_x509_certificates(raw) if raw else []
                except ValueError:
                    cas = []
                ok = any(certs.issued_by(cert, ca) for ca in cas)
                problems += not ok
                print(f"{kind} {name} webhook #{i}: caBundle {'trusts' if ok else 'DOES NOT trust'} this certificate")
    return 1 if problems else 0




def _hook(args: argparse.Namespace) -> int:
    """`dra-guard hook pre-delete | test`: the Helm chart's hooks (webhook.kube.hooks)."""
    from webhook.kube import hooks
    from webhook.kube.client import api_client

    if args.hook_command == "pre-delete":
        if not args.webhook_configuration:
            return fail("hook pre-delete needs --webhook-configuration NAME (or $WEBHOOK_CONFIGURATION)")
        client = api_client(args.kubeconfig, timeout_seconds=10)
        return 0 if hooks.delete_webhook_configurations(client, args.webhook_configuration,
                                                        retry_seconds=args.retry_seconds) else 1
    if args.hook_command == "test":
        missing = [flag for flag, value in (("--slice-writer-role", args.slice_writer_role),
                                            ("--binding-name", args.binding_name)) if not value]
        if missing:
            return fail(f"hook test needs {' and '.join(missing)} (or their environment variables)")
        client = api_client(args.kubeconfig, timeout_seconds=30)
        status, text, warnings = hooks.dry_run_binding(
            client, hooks.refused_binding(args.binding_name, args.slice_writer_role, args.test_group))
        passed, why = hooks.judge_test(args.rbac_mode, args.failure_policy, status, text, warnings)
        print(("PASS: " if passed else "FAIL: ") + why, flush=True)
        return 0 if passed else 1
    return fail("hook needs an action: pre-delete or test")


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": _serve, "audit": _audit, "drain-plan": _drain_plan, "certs": _certs, "hook": _hook,
    "config": _config, "completion": _completion}
