"""The `dra-guard serve` process: the composition root (server), the Flask app factory (app:
routes from webhook.policies.registry, /healthz, /readyz, /metrics), the one module that touches
gunicorn's internals (worker), and the in-server periodic audit (periodic: Lease, schedule and
gauges in the worker; audit_child: the audit itself, in a process of its own).
"""
