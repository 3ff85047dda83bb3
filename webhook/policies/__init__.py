"""Decisions only: an AdmissionReview request + Facts + config in, a Decision out. No Flask, no
Kubernetes client, no I/O.

Each policy module exposes ``review(request, ...) -> Decision`` over the ``request`` member of an
AdmissionReview (admission.k8s.io/v1 or v1beta1, the same shape), and the audit functions used by
``dra-guard audit``; webhook.policies.registry lists them (name, path, mutating, failure mode,
review, audit), and routes, audit wiring, CLI help and the chart's webhook paths follow from it.
The decision says what *enforce* mode would answer; applying the configured mode (enforce / warn
/ audit) is the job of webhook.admission.
"""

from __future__ import annotations

from webhook.policies.decision import ALLOW, Decision, Finding

__all__ = ["ALLOW", "Decision", "Finding"]
