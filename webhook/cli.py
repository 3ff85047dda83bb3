"""The `dra-guard` command: serve | audit | drain-plan | certs.

Exit codes: 0 success (audit: no finding), 1 audit found something enforce mode would refuse,
2 usage, configuration or input errors (the message names the file, line or config key).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import textwrap

from webhook.config import ConfigError, load_config

EXAMPLES = textwrap.dedent("""\
    examples:
      dra-guard audit -f examples/                      check manifests offline (exit 1 if something would be refused or patched)
      dra-guard audit -f team-rbac.yaml --cluster       check files against the live cluster's roles
      dra-guard serve --self-signed /tmp/dra-guard      run locally over TLS with a development CA
      dra-guard serve --config /etc/dra-guard/config.yaml \\
          --tls-cert-file tls.crt --tls-key-file tls.key
      dra-guard drain-plan node-a                       which pods must leave node-a before its DRA drivers
      dra-guard certs generate --service dra-guard --namespace dra-guard --out ./tls

    The config file (--config) is YAML; see README.md "Configuration" for every key.
    Modes: enforce refuses, warn allows with a kubectl warning, audit allows and only records.
    """)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-guard",
        description="Admission webhook enforcing the Kubernetes good practices for Dynamic Resource "
                    "Allocation (DRA) as a cluster admin.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the admission webhook server (gunicorn over TLS)",
                           description="Serve /validate/rbac, /mutate/daemonsets, /validate/evictions, /healthz, "
                                       "/readyz and /metrics over HTTPS (and /validate/noop, a no-op review for "
                                       "benchmarks, never registered by the chart). Each gunicorn worker (server.workers) "
                                       "holds at most server.threads + 250 connections; more wait "
                                       "in the kernel's backlog.",
                           epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--config", metavar="FILE", help="YAML config file (default: built-in defaults)")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=None, help="HTTPS port (default: server.port from config, 8443)")
    serve.add_argument("--tls-cert-file", metavar="FILE", help="serving certificate (PEM)")
    serve.add_argument("--tls-key-file", metavar="FILE", help="serving certificate's private key (PEM)")
    serve.add_argument("--self-signed", metavar="DIR",
                       help="development: create (or reuse) a CA and a certificate for localhost, 127.0.0.1 and ::1 in DIR")
    serve.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster config, else ~/.kube/config)")
    serve.add_argument("--no-cluster", action="store_true",
                       help="do not use the Kubernetes API: caches stay empty, policies see an empty cluster")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    audit = sub.add_parser("audit", help="run the policies over manifests and/or the live cluster",
                           description="Report what dra-guard would refuse or patch; with --cluster also the control plane's DRA tuning "
                                       "(kube-controller-manager QPS/Burst, served resource.k8s.io versions, old kubelets) "
                                       "and the driver pods a drain would have to leave last. Exit 0 when clean (advisory "
                                       "findings alone do not fail), 1 when enforce mode would refuse or patch "
                                       "something, 2 on usage or input errors.",
                           epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    audit.add_argument("-f", "--filename", dest="paths", action="append", default=[], metavar="PATH",
                       help="file or folder of YAML/JSON manifests (repeatable; multi-document files and List kinds)")
    audit.add_argument("--cluster", action="store_true", help="include the live cluster's objects")
    audit.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for --cluster")
    audit.add_argument("--qps", type=float, default=10.0, help="--cluster: API requests per second at most (default: %(default)s)")
    audit.add_argument("--burst", type=int, default=20, help="--cluster: requests allowed in a burst (default: %(default)s)")
    audit.add_argument("--config", metavar="FILE",
                       help="the same YAML config file `serve` reads (default: a DraGuardConfiguration found among "
                            "the manifests, else the built-in defaults)")
    audit.add_argument("-o", "--output", choices=["table", "json", "policyreport"], default="table",
                       help="table (default), json (an array of findings), or policyreport (wgpolicyk8s.io/v1alpha2 "
                            "ClusterPolicyReport/PolicyReports as YAML)")

    drain = sub.add_parser("drain-plan", help="what a drain of NODE must wait for (DRA drivers last)",
                           description="List NODE's DRA driver pods and, for each, the ResourceClaims still "
                                       "allocated to its driver there and the pods holding them: the order a drain "
                                       "must take. Exit 0 when every driver pod can be evicted now, 1 when some "
                                       "must wait, 2 on errors.")
    drain.add_argument("node", metavar="NODE")
    drain.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, else ~/.kube/config)")
    drain.add_argument("--config", metavar="FILE", help="the YAML config file `serve` reads (driver detection)")
    drain.add_argument("-o", "--output", choices=["text", "json"], default="text")

    certs_p = sub.add_parser("certs", help="certificate helpers")
    certs_sub = certs_p.add_subparsers(dest="certs_command", metavar="ACTION")
    gen = certs_sub.add_parser("generate", help="write a CA and a serving certificate for a Service")
    gen.add_argument("--service", required=True, help="the webhook Service name")
    gen.add_argument("--namespace", required=True, help="the Service's namespace")
    gen.add_argument("--out", required=True, metavar="DIR", help="folder for ca.crt, ca.key, tls.crt, tls.key")
    gen.add_argument("--dns", action="append", default=[], metavar="NAME", help="extra DNS SAN (repeatable)")
    gen.add_argument("--ip", action="append", default=[], metavar="IP", help="extra IP SAN (repeatable)")
    gen.add_argument("--force", action="store_true", help="replace a CA already in --out (breaks caBundles that trust it)")
    insp = certs_sub.add_parser(
        "inspect", help="show a serving certificate's names and expiry, and whether the cluster's caBundles trust it",
        description="Print subject, SANs, validity and issuer of a serving certificate (--cert-file, or the one "
                    "dra-guard serves at --url), and with --cluster whether every webhook of dra-guard's "
                    "Validating/MutatingWebhookConfiguration (names from --config) has a caBundle that verifies it. "
                    "Exit 0 when all is well, 1 when a caBundle does not match or the certificate is due for renewal, "
                    "2 on errors.")
    insp.add_argument("--cert-file", metavar="FILE", help="PEM serving certificate")
    insp.add_argument("--url", metavar="HOST:PORT", help="fetch the certificate a running server presents instead")
    insp.add_argument("--config", metavar="FILE", help="the config file (webhook configuration names, renewal share)")
    insp.add_argument("--cluster", action="store_true", help="compare with the caBundles in the cluster")
    insp.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for --cluster")
    return parser


def _fail(message: str) -> int:
    print(f"dra-guard: error: {message}", file=sys.stderr)
    return 2


def _serve(args: argparse.Namespace) -> int:
    import certs
    from webhook import cluster, server

    config = load_config(args.config)
    for line in config.ignored:
        print(f"dra-guard: warning: {line}", file=sys.stderr)
    if args.self_signed:
        if config.certificates.mode == "self":
            return _fail("--self-signed and certificates.mode self exclude each other (self mode keeps its CA in a Secret)")
        if args.tls_cert_file or args.tls_key_file:
            return _fail("--self-signed and --tls-cert-file/--tls-key-file exclude each other")
        directory = pathlib.Path(args.self_signed)
        ca = certs.ensure_self_signed(directory, dns_names=["localhost"], ip_addresses=["127.0.0.1", "::1"])
        print(f"dra-guard: development CA: {ca} (give it as caBundle / --cacert)", file=sys.stderr, flush=True)
        cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    elif config.certificates.mode == "self":
        if args.tls_cert_file or args.tls_key_file:
            return _fail("certificates.mode is self: dra-guard manages the certificate files itself; drop --tls-cert-file/--tls-key-file")
        if args.no_cluster:
            return _fail("certificates.mode self keeps the certificates in a Secret and needs the Kubernetes API; drop --no-cluster")
        config = server.resolve_namespace(config)
        reconciler = server.self_managed_reconciler(config, args.kubeconfig, identity=server.identity(args.port or config.server.port))
        reconciler.reconcile()  # the serving files exist before gunicorn starts
        cert_file, key_file = reconciler.dir / "tls.crt", reconciler.dir / "tls.key"
    elif args.tls_cert_file and args.tls_key_file:
        cert_file, key_file = pathlib.Path(args.tls_cert_file), pathlib.Path(args.tls_key_file)
        ok, why = server.certificate_status(cert_file, key_file)
        if not ok:
            return _fail(why)
    else:
        return _fail("TLS is required: give --tls-cert-file and --tls-key-file (certificates.mode files or cert-manager), "
                     "set certificates.mode: self in --config, or use --self-signed DIR for development")
    if not args.no_cluster:
        cluster.api_client(args.kubeconfig, timeout_seconds=config.cluster.request_timeout_seconds)  # fail fast
    server.run(server.ServeOptions(
        config=config, host=args.host, port=args.port or config.server.port, cert_file=cert_file, key_file=key_file,
        kubeconfig=args.kubeconfig, no_cluster=args.no_cluster, log_level=args.log_level))
    return 0


def _audit(args: argparse.Namespace) -> int:
    from webhook import audit, cluster

    if not args.paths and not args.cluster:
        return _fail("audit needs -f PATH (files or folders of manifests) and/or --cluster")
    try:
        objects = audit.load_manifests(args.paths)
        config = load_config(args.config) if args.config else audit.config_from(objects)
    except audit.InputError as exc:
        return _fail(str(exc))
    for line in config.ignored:
        print(f"dra-guard: warning: {line}", file=sys.stderr)
    found = [o for o in objects if o.get("kind") == "DraGuardConfiguration"]
    source = args.config or ("the DraGuardConfiguration among the manifests" if found else "the built-in defaults")
    print(f"dra-guard: config: {source}", file=sys.stderr)
    served = None
    if args.cluster:
        client = cluster.api_client(args.kubeconfig, timeout_seconds=config.cluster.request_timeout_seconds)
        limiter = cluster.RateLimiter(qps=args.qps, burst=args.burst)
        served = cluster.served_resource_versions(client)
        objects = audit.merge(objects, cluster.list_audit_objects(client, served_versions=served, limiter=limiter))
    findings = audit.run(objects, config, served_versions=served)
    render = {"json": audit.render_json, "policyreport": audit.render_policyreport}.get(args.output, audit.render_table)
    sys.stdout.write(render(findings))
    return audit.exit_code(findings)


def _drain_plan(args: argparse.Namespace) -> int:
    from webhook import cluster, drainplan

    config = load_config(args.config)
    client = cluster.api_client(args.kubeconfig, timeout_seconds=config.cluster.request_timeout_seconds)
    index = drainplan.build_index(cluster.list_drain_objects(client, args.node), config)
    result = drainplan.plan(index, args.node)
    sys.stdout.write(drainplan.render_json(result) if args.output == "json" else drainplan.render_text(result))
    return 0 if result["ready"] else 1


def _certs(args: argparse.Namespace) -> int:
    import certs

    if args.certs_command == "inspect":
        return _certs_inspect(args)
    if args.certs_command != "generate":
        return _fail("certs needs an action: generate or inspect")
    if (pathlib.Path(args.out) / "ca.crt").exists() and not args.force:
        return _fail(f"{args.out}/ca.crt exists: a new CA would break every caBundle that trusts it; pass --force to replace it")
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
    from webhook import cluster

    config = load_config(args.config)
    if bool(args.cert_file) == bool(args.url):
        return _fail("certs inspect needs exactly one of --cert-file FILE or --url HOST:PORT")
    if args.cert_file:
        try:
            cert = x509.load_pem_x509_certificate(pathlib.Path(args.cert_file).read_bytes())
        except (OSError, ValueError) as exc:
            return _fail(f"{args.cert_file}: not a readable PEM certificate ({exc})")
    else:
        host, _, port = args.url.rpartition(":")
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # we only read what it presents
        try:
            with socket.create_connection((host, int(port)), timeout=5) as sock, ctx.wrap_socket(sock) as tls:
                cert = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))
        except (OSError, ValueError) as exc:
            return _fail(f"cannot fetch the certificate from {args.url}: {exc}")
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
        api = cluster.KubeCertApi(cluster.api_client(args.kubeconfig, timeout_seconds=5), namespace="")
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `dra-guard` console script; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from webhook.cluster import ClusterError

    try:
        return {"serve": _serve, "audit": _audit, "drain-plan": _drain_plan, "certs": _certs}[args.command](args)
    except (ConfigError, ClusterError) as exc:
        return _fail(str(exc))
    except ValueError as exc:  # certs.CertificateError and bad --ip values
        return _fail(str(exc))


if __name__ == "__main__":
    sys.exit(main())
