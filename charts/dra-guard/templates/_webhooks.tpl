{{/*
The webhooks of the two configurations, one list each, shared by templates/webhooks.yaml (the
objects) and, in self mode, the ConfigMap's webhooks.json (what dra-guard restores when someone
changes the live configurations: certs/webhookspec.py). Call with the root context.
*/}}
{{- define "dra-guard.validatingWebhooks" -}}
{{- $w := .Values.webhooks }}
{{- if $w.rbac.enabled }}
# Policy rbac: RBAC objects that would give anyone but admins and DRA drivers write access to
# DeviceClasses or ResourceSlices.
- name: rbac.dra-guard.io
  admissionReviewVersions: [v1]
  sideEffects: None
  matchPolicy: Equivalent
  # Fail: a grant let through cannot be taken back; scope is narrow and the break-glass is
  # deleting this configuration (webhook configurations are never sent to webhooks).
  failurePolicy: {{ $w.rbac.failurePolicy }}
  # dra-guard answers from its caches; a hung replica costs at most this many seconds
  timeoutSeconds: {{ $w.rbac.timeoutSeconds }}
  {{- include "dra-guard.clientConfig" (dict "root" . "path" "/validate/rbac") | nindent 2 }}
  rules:
    - apiGroups: [rbac.authorization.k8s.io]
      apiVersions: ["*"]
      operations: [CREATE, UPDATE]
      resources: [clusterroles, clusterrolebindings, roles, rolebindings]
      scope: "*"
  # Roles and RoleBindings are reviewed in every namespace but webhooks.excludedNamespaces, kube-system
  # and dra-guard's own included: a RoleBinding there can let a user act as a ServiceAccount that
  # holds DRA write, or rewrite dra-guard (issue 16). The chart's own Role/RoleBinding are created
  # before the webhook configuration on install and are written by a cluster admin on upgrade.
  {{- with $w.excludedNamespaces }}
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: NotIn
        values: {{ . | uniq | toJson }}
  {{- end }}
  # The control plane's own writers are left out by user name (ClusterRoles and ClusterRoleBindings
  # are cluster-scoped, where a namespaceSelector does nothing): the apiserver's bootstrap roles,
  # the controller manager and the ClusterRole aggregation controller. Any other kube-system
  # ServiceAccount is reviewed: acting as one must not be a way around dra-guard.
  matchConditions:
    - name: not-control-plane
      expression: >-
        !(request.userInfo.username in ['system:apiserver', 'system:kube-controller-manager',
        'system:serviceaccount:kube-system:clusterrole-aggregation-controller'])
    # The admins of config.rbac.adminSubjects (the list dra-guard itself trusts) are never sent:
    # dra-guard would allow their grants anyway, and the chart's own ClusterRoles must install,
    # upgrade and roll back while dra-guard is down (the usual reason to upgrade it). A grant an
    # admin makes is still reported by the periodic audit and `dra-guard audit --cluster`.
    - name: not-admin
      expression: >-
        {{- include "dra-guard.notAdminExpression" . | nindent 8 }}
{{- end }}
{{- if $w.eviction.enabled }}
# Policy eviction: a DRA driver pod leaves a node last (refused with 429 while its claims are
# still prepared there; drains retry).
- name: evictions.dra-guard.io
  admissionReviewVersions: [v1]
  sideEffects: None
  matchPolicy: Equivalent
  # Ignore: a dead webhook must never wedge every drain in the cluster; while dra-guard runs
  # with stale caches it answers 429 (retry) itself.
  failurePolicy: {{ $w.eviction.failurePolicy }}
  timeoutSeconds: {{ $w.eviction.timeoutSeconds }}
  {{- include "dra-guard.clientConfig" (dict "root" . "path" "/validate/evictions") | nindent 2 }}
  rules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE]
      resources: [pods/eviction]
      scope: Namespaced
    {{- if .Values.config.eviction.guardDeletes }}
    # config.eviction.guardDeletes: DELETE of driver pods too (the DaemonSet controller is exempt)
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [DELETE]
      resources: [pods]
      scope: Namespaced
    {{- end }}
  # kube-system too (some drivers install there); only dra-guard's own namespace stays out
  {{- include "dra-guard.driverNamespaceSelector" . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "dra-guard.mutatingWebhooks" -}}
{{- $w := .Values.webhooks }}
{{- if $w.probes.enabled }}
# Policy probes: a gRPC liveness probe for DRA driver DaemonSets that lack one.
- name: probes.dra-guard.io
  admissionReviewVersions: [v1]
  sideEffects: None
  matchPolicy: Equivalent
  # Ignore: a missing probe is not worth blocking a driver rollout; `dra-guard audit` and the
  # findings metric are the backstop.
  failurePolicy: {{ $w.probes.failurePolicy }}
  # the patch only adds probes and never depends on another mutation
  reinvocationPolicy: Never
  timeoutSeconds: {{ $w.probes.timeoutSeconds }}
  {{- include "dra-guard.clientConfig" (dict "root" . "path" "/mutate/daemonsets") | nindent 2 }}
  rules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [daemonsets]
      scope: Namespaced
  # kube-system too (some drivers install there); only dra-guard's own namespace stays out
  {{- include "dra-guard.driverNamespaceSelector" . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The ConfigMap's webhooks.json: {"validating": [...], "mutating": [...]} without caBundle. */}}
{{- define "dra-guard.desiredWebhooks" -}}
{{- $v := include "dra-guard.validatingWebhooks" . | fromYamlArray }}
{{- $m := include "dra-guard.mutatingWebhooks" . | fromYamlArray }}
{{- dict "validating" $v "mutating" $m | toJson }}
{{- end }}
