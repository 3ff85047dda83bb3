"""The `dra-guard serve` process: the composition root (server: gunicorn's settings), the Flask
app factory (app: routes from webhook.policies.registry, /healthz, /readyz, /metrics), the
event-loop front that serves the connections (front: a worker on gunicorn's public worker API), the
gates that decide whether a review may still be judged and answer it when not (lanes), and the
in-server periodic audit (periodic: Lease, schedule and
gauges in the worker; audit_child: the audit itself, in a process of its own).
"""
