"""The `dra-guard serve` process: the composition root (server: the engine chosen by
server.engine), the Flask app factory (app: routes from webhook.policies.registry, /healthz,
/readyz, /metrics), the two engines (front: the event-loop front on gunicorn's public worker API;
worker and sockets: the gthread adapter, the one module that touches gunicorn's internals), the
lanes the reviews are judged in, and the in-server periodic audit (periodic: Lease, schedule and
gauges in the worker; audit_child: the audit itself, in a process of its own).
"""
