"""What dra-guard knows about a cluster: tolerant readers of object dicts, RBAC grants, subjects
and selectors, DRA driver recognition, claim facts, the two indexes (RbacIndex, ClaimIndex) and
`Facts`, the one interface the policies read, whether it is fed by watches (webhook.kube) or by
files and lists (build_facts). Imports nothing above it: no policy, no Kubernetes client.
"""
