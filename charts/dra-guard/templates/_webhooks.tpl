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
  # deleting this configuration (webhook configurations are never sent to webhooks). Ignore while
  # the policy runs in audit mode (it never refuses, so it must not block when dra-guard is down).
  failurePolicy: {{ include "dra-guard.failurePolicy" (dict "root" . "policy" "rbac" "failurePolicy" $w.rbac.failurePolicy) }}
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
  # holds DRA write, or rewrite dra-guard (docs/threat-model.md, paths 2 to 4). The chart's own
  # Role/RoleBinding are created before the webhook configuration on install and are written by a
  # cluster admin on upgrade.
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
    # The admins of config.rbac.adminSubjects and extraAdminSubjects (the lists dra-guard itself
    # trusts) are never sent:
    # dra-guard would allow their grants anyway, and the chart's own ClusterRoles must install,
    # upgrade and roll back while dra-guard is down (the usual reason to upgrade it). A grant an
    # admin makes is still reported by the periodic audit and `dra-guard audit --cluster`.
    - name: not-admin
      expression: >-
        {{- include "dra-guard.notAdminExpression" . | nindent 8 }}
# Policy rbac, DRA admin access: only admins label a Namespace resource.kubernetes.io/admin-access
# (its ResourceClaims may then use any device, in use or not).
- name: namespaces.dra-guard.io
  admissionReviewVersions: [v1]
  sideEffects: None
  matchPolicy: Equivalent
  # Fail, like the RBAC webhook: a label let through gives admin access at once. Only a non-admin's
  # change that sets the label to "true" is sent (matchConditions), so a dra-guard outage blocks
  # nothing else about Namespaces.
  failurePolicy: {{ include "dra-guard.failurePolicy" (dict "root" . "policy" "rbac" "failurePolicy" $w.rbac.failurePolicy) }}
  timeoutSeconds: {{ $w.rbac.timeoutSeconds }}
  {{- include "dra-guard.clientConfig" (dict "root" . "path" "/validate/rbac") | nindent 2 }}
  rules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      # the apiserver keeps label changes made through status and finalize updates too
      resources: [namespaces, namespaces/status, namespaces/finalize]
      scope: Cluster
  matchConditions:
    - name: sets-admin-access
      expression: >-
        has(object.metadata.labels) && 'resource.kubernetes.io/admin-access' in object.metadata.labels
        && object.metadata.labels['resource.kubernetes.io/admin-access'] == 'true'
        && (request.operation == 'CREATE' || !has(oldObject.metadata.labels)
        || !('resource.kubernetes.io/admin-access' in oldObject.metadata.labels)
        || oldObject.metadata.labels['resource.kubernetes.io/admin-access'] != 'true')
    - name: not-admin
      expression: >-
        {{- include "dra-guard.notAdminExpression" . | nindent 8 }}
{{- end }}
{{- $declared := .Values.config.drivers.declared | default list }}
{{- if and $w.eviction.enabled $declared }}
# Policy eviction, fail-closed scope: a declared DRA driver's pod leaves a node last (refused with
# 429 while its claims are still prepared there; drains retry).
- name: driver-evictions.dra-guard.io
  admissionReviewVersions: [v1]
  sideEffects: None
  matchPolicy: Equivalent
  # Fail: only the pods of config.drivers.declared are sent here (namespaceSelector and
  # matchConditions below), so while dra-guard is slow, hung or down the apiserver refuses their
  # evictions and DELETEs (drains retry; a DaemonSet rolling update waits) and every other eviction
  # or DELETE never waits on dra-guard. Break-glass: remove the driver from
  # config.drivers.declared, or delete this configuration.
  failurePolicy: {{ include "dra-guard.failurePolicy" (dict "root" . "policy" "eviction" "failurePolicy" $w.eviction.failurePolicy) }}
  timeoutSeconds: {{ $w.eviction.timeoutSeconds }}
  {{- include "dra-guard.clientConfig" (dict "root" . "path" "/validate/evictions") | nindent 2 }}
  {{- include "dra-guard.evictionRules" (dict "deletes" .Values.config.eviction.guardDeletes) | nindent 2 }}
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values: {{ include "dra-guard.declaredNamespaces" . }}
  matchConditions:
    - name: declared-driver-pod
      expression: >-
        {{ include "dra-guard.declaredDriverPods" . }}
    {{- if .Values.config.eviction.guardDeletes }}
    # A pod already Terminating or in a terminal phase: its leaving was decided before (the
    # kubelet's final DELETE, the pod garbage collector, the DaemonSet controller replacing a
    # failed pod), and none of them may wait on (or be refused by) a dra-guard that is down.
    - name: not-already-stopped
      expression: >-
        !(request.operation == 'DELETE' && (has(oldObject.metadata.deletionTimestamp)
        || (has(oldObject.status) && has(oldObject.status.phase) && oldObject.status.phase in ['Succeeded', 'Failed'])))
    # the garbage collector deleting the pods of a deleted DaemonSet (the driver's uninstall)
    - name: not-garbage-collector
      expression: >-
        !(request.operation == 'DELETE' && request.userInfo.username in {{ .Values.config.eviction.garbageCollectorUsers | toJson }})
    {{- end }}
{{- end }}
{{- if and $w.eviction.enabled $w.eviction.bestEffort.enabled }}
# Policy eviction, best effort: evictions of every other pod, so a driver dra-guard recognises but
# config.drivers.declared does not list is held while dra-guard answers.
- name: evictions.dra-guard.io
  admissionReviewVersions: [v1]
  sideEffects: None
  matchPolicy: Equivalent
  # Ignore, and a short timeout: every eviction in the cluster passes here, and none may wait
  # long on, or be refused by, a dra-guard that is slow or down.
  failurePolicy: Ignore
  timeoutSeconds: {{ $w.eviction.bestEffort.timeoutSeconds }}
  {{- include "dra-guard.clientConfig" (dict "root" . "path" "/validate/evictions") | nindent 2 }}
  {{- include "dra-guard.evictionRules" (dict "deletes" false) | nindent 2 }}
  # kube-system too (some drivers install there); only dra-guard's own namespace stays out
  {{- include "dra-guard.driverNamespaceSelector" . | nindent 2 }}
  {{- if $declared }}
  matchConditions:
    # the declared drivers' pods go to driver-evictions.dra-guard.io only
    - name: not-declared-driver-pod
      expression: >-
        !({{ include "dra-guard.declaredDriverPods" . }})
  {{- end }}
{{- end }}
{{- end }}

{{- define "dra-guard.evictionRules" -}}
rules:
  - apiGroups: [""]
    apiVersions: [v1]
    operations: [CREATE]
    resources: [pods/eviction]
    scope: Namespaced
  {{- if .deletes }}
  # config.eviction.guardDeletes: DELETE of the declared drivers' pods too (deletecollection
  # included: the apiserver reviews each pod it deletes); the best-effort webhook never gets DELETE
  - apiGroups: [""]
    apiVersions: [v1]
    operations: [DELETE]
    resources: [pods]
    scope: Namespaced
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
  failurePolicy: {{ include "dra-guard.failurePolicy" (dict "root" . "policy" "probes" "failurePolicy" $w.probes.failurePolicy) }}
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
