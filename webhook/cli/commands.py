"""What each `dra-guard` subcommand does, over the layers below the CLI; each returns the exit code."""

from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
from collections.abc import Callable

from webhook.cli import terminal
from webhook.cli.terminal import fail
from webhook.config import load_config
from webhook.kube.errors import until_reachable


def _serve(args: argparse.Namespace) -> int:
    import certs
    from webhook.serve import server

    config = load_config(args.config)
    for line in config.ignored:
        print(f"dra-guard: warning: {line}", file=sys.stderr)
    wait = config.cluster.startup_wait_seconds

    def waiting(line: str) -> None:
        print(f"dra-guard: the Kubernetes API is not usable yet: {line}", file=sys.stderr, flush=True)

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
            return fail(
                "certificates.mode is self: dra-guard manages the certificate files itself; drop --tls-cert-file/--tls-key-file"
            )
        if args.no_cluster:
            return fail(
                "certificates.mode self keeps the certificates in a Secret and needs the Kubernetes API; drop --no-cluster"
            )
        config = server.resolve_namespace(config)
        reconciler = server.self_managed_reconciler(
            config, args.kubeconfig, identity=server.identity(args.port or config.server.port)
        )
        until_reachable(reconciler.reconcile, seconds=wait, note=waiting)  # the serving files exist before gunicorn starts
        cert_file, key_file = reconciler.dir / "tls.crt", reconciler.dir / "tls.key"
    elif args.tls_cert_file and args.tls_key_file:
        cert_file, key_file = pathlib.Path(args.tls_cert_file), pathlib.Path(args.tls_key_file)
        ok, why = server.certificate_status(cert_file, key_file)
        if not ok:
            return fail(why)
    else:
        return fail(
            "TLS is required: give --tls-cert-file and --tls-key-file (certificates.mode files or cert-manager), "
            "set certificates.mode: self in --config, or use --self-signed DIR for development"
        )
    if not args.no_cluster:
        # an API the caches cannot read is an error now, not a server that never becomes ready
        until_reachable(lambda: server.check_cluster(config, args.kubeconfig), seconds=wait, note=waiting)
    server.run(
        server.ServeOptions(
            config=config,
            host=args.host,
            port=args.port or config.server.port,
            cert_file=cert_file,
            key_file=key_file,
            kubeconfig=args.kubeconfig,
            no_cluster=args.no_cluster,
            log_level=args.log_level,
        )
    )
    return 0


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
        now = datetime.datetime.now(datetime.UTC)
        for e in config.exceptions:
            if not e.live(now):
                print(
                    f"dra-guard: warning: exception {e.ref} (owner {e.owner}) expired at {e.expires.isoformat()}", file=sys.stderr
                )
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
    index = drainplan.build_index(lists.list_drain_objects(client, args.node, timeout_seconds=args.request_timeout), config)
    result = drainplan.plan(index, args.node)
    sys.stdout.write(
        drainplan.render_json(result) if args.output == "json" else terminal.for_stream(drainplan.render_text(result), sys.stdout)
    )
    return 0 if result["ready"] else 1


def _drain(args: argparse.Namespace) -> int:
    from webhook.cli import drain_command

    return drain_command.run_drain(args)


def _uncordon(args: argparse.Namespace) -> int:
    from webhook.cli import drain_command

    return drain_command.run_uncordon(args)


def _certs(args: argparse.Namespace) -> int:
    import certs

    if args.certs_command == "inspect":
        return _certs_inspect(args)
    if args.certs_command != "generate":
        return fail("certs needs an action: generate or inspect")
    if (pathlib.Path(args.out) / "ca.crt").exists() and not args.force:
        return fail(f"{args.out}/ca.crt exists: a new CA would break every caBundle that trusts it; pass --force to replace it")
    ca = certs.generate_ca()
    serving = certs.generate_serving(
        ca, dns_names=[*certs.service_dns_names(args.service, args.namespace), *args.dns], ip_addresses=args.ip
    )
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
        for kind, name in (
            ("validating", config.certificates.validating_webhook),
            ("mutating", config.certificates.mutating_webhook),
        ):
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
        client = api_client(args.kubeconfig, timeout_seconds=args.request_timeout)
        hooks.delete_webhook_configurations(
            client, args.webhook_configuration, retry_seconds=args.retry_seconds, timeout_seconds=args.request_timeout
        )
        if args.delete_reports:
            hooks.delete_reports(client, timeout_seconds=args.request_timeout)
        return 0
    if args.hook_command == "test":
        missing = [
            flag
            for flag, value in (("--slice-writer-role", args.slice_writer_role), ("--binding-name", args.binding_name))
            if not value
        ]
        if missing:
            return fail(f"hook test needs {' and '.join(missing)} (or their environment variables)")
        client = api_client(args.kubeconfig, timeout_seconds=args.request_timeout)
        status, text, warnings = hooks.dry_run_binding(
            client,
            hooks.refused_binding(args.binding_name, args.slice_writer_role, args.test_group),
            timeout_seconds=args.request_timeout,
        )
        passed, why = hooks.judge_test(args.rbac_mode, args.failure_policy, status, text, warnings)
        print(("PASS: " if passed else "FAIL: ") + why, flush=True)
        return 0 if passed else 1
    return fail("hook needs an action: pre-delete or test")


def _cleanup(args: argparse.Namespace) -> int:
    """`dra-guard cleanup [--dry-run]`: delete every report dra-guard wrote (webhook.kube.reports.delete_reports)."""
    from webhook.kube.client import api_client
    from webhook.kube.reports import delete_reports

    client = api_client(args.kubeconfig, timeout_seconds=args.request_timeout, context=args.context)
    done = delete_reports(
        client, dry_run=args.dry_run, timeout_seconds=args.request_timeout, report=lambda line: print(line, flush=True)
    )
    print(f"{len(done)} report(s) {'would be deleted (dry run)' if args.dry_run else 'deleted'}", flush=True)
    return 0


def _run_audit(args: argparse.Namespace) -> int:
    from webhook.cli import audit_command

    return audit_command.run(args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": _serve,
    "audit": _run_audit,
    "drain-plan": _drain_plan,
    "drain": _drain,
    "uncordon": _uncordon,
    "certs": _certs,
    "hook": _hook,
    "config": _config,
    "completion": _completion,
    "cleanup": _cleanup,
}
