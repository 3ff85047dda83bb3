"""The only code that talks to the Kubernetes API (the only importer of `kubernetes`): the client
and its metered calls (client), paged lists (pages), informers (informer), the watch-fed cluster
state that implements webhook.model.facts.Facts (state), the one-shot reads of audit and
drain-plan (lists), the certificate port of certs.ports (certapi), holding a Lease (leases), the PolicyReport writer
(reports) and the chart's hook actions (hooks).
"""
