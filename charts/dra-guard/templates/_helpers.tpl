{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "dra-guard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of every object: the release name when it already contains the chart name, so
`helm install dra-guard` gives objects named "dra-guard" (the names docs/operations/break-glass.md uses).
*/}}
{{- define "dra-guard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dra-guard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dra-guard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-guard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end }}

{{/* The webhook pods: what the Service, the PDB and the spreading select (hook pods carry another component). */}}
{{- define "dra-guard.podSelectorLabels" -}}
{{ include "dra-guard.selectorLabels" . }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "dra-guard.labels" -}}
helm.sh/chart: {{ include "dra-guard.chart" . }}
{{ include "dra-guard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dra-guard
{{- end }}

{{- define "dra-guard.image" -}}
{{- if not .Values.image.repository -}}
{{- fail "image.repository is empty: build dra-guard's image from the repository's Dockerfile, push it where your nodes pull from and set it, e.g. --set image.repository=REGISTRY/dra-guard (docs/install.md)" -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* Names of the objects dra-guard and its configuration refer to. */}}
{{- define "dra-guard.tlsSecretName" -}}
{{- if eq .Values.certificates.mode "files" -}}
{{ .Values.certificates.files.secretName }}
{{- else if eq .Values.certificates.mode "cert-manager" -}}
{{ include "dra-guard.fullname" . }}-serving-cert
{{- else -}}
{{ include "dra-guard.fullname" . }}-tls
{{- end -}}
{{- end }}
{{- define "dra-guard.leaseName" -}}{{ include "dra-guard.fullname" . }}-certs{{- end }}
{{- /* self mode: the emptyDir is mounted at certMount (Kubernetes makes every emptyDir mode 0777) and
dra-guard writes into certDir, a 0700 subfolder it creates: it refuses a group/world-writable folder. */}}
{{- define "dra-guard.certMount" -}}/run/dra-guard{{- end }}
{{- define "dra-guard.certDir" -}}/run/dra-guard/certs{{- end }}
{{- define "dra-guard.tlsDir" -}}/etc/dra-guard/tls{{- end }}
{{- define "dra-guard.clientCADir" -}}/etc/dra-guard/client-ca{{- end }}
{{- /* the container port the kubelet's probes use: the probe port when clients need certificates */}}
{{- define "dra-guard.probePortName" -}}{{ if .Values.clientAuth.caConfigMap }}probes{{ else }}https{{ end }}{{- end }}

{{/* The policy's mode: its own, else the global config.mode. */}}
{{- define "dra-guard.policyMode" -}}
{{- $p := index (.root.Values.config.policies | default dict) .policy | default dict -}}
{{- $p.mode | default .root.Values.config.mode | default "enforce" -}}
{{- end }}

{{/*
A webhook's failurePolicy: Ignore while its policy runs in audit mode (audit records and never
refuses, so a dra-guard that is not yet Ready, or whose image cannot be pulled, must not block
anything either); the webhook's own failurePolicy in enforce and warn. Call with (dict "root" $
"policy" NAME "failurePolicy" VALUE).
*/}}
{{- define "dra-guard.failurePolicy" -}}
{{- if eq (include "dra-guard.policyMode" .) "audit" }}Ignore{{ else }}{{ .failurePolicy }}{{ end -}}
{{- end }}

{{/*
The CEL condition true for a pod of a declared driver (config.drivers.declared).
An eviction (CREATE of pods/eviction) carries only the pod's namespace and name: the name must
start as the DaemonSet controller's generateName "<DaemonSet>-" does after the apiserver cuts a
generated name's prefix to 58 characters (names.SimpleNameGenerator), so a DaemonSet named with
58 or more characters is matched too. A DELETE (one pod, or each pod of a deletecollection,
which has no request name) carries the pod as oldObject: its controller ownerReference names the
DaemonSet exactly. The values schema holds namespaces and names to Kubernetes name syntax, so
nothing else reaches the expression.
*/}}
{{- define "dra-guard.declaredDriverPods" -}}
{{- $evictions := list }}
{{- $deletes := list }}
{{- range .Values.config.drivers.declared }}
{{- $evictions = append $evictions (printf "(request.namespace == '%s' && request.name.startsWith('%s'))" .namespace (printf "%s-" .name | trunc 58)) }}
{{- $deletes = append $deletes (printf "(request.namespace == '%s' && oldObject.metadata.ownerReferences.exists(o, o.kind == 'DaemonSet' && o.name == '%s'))" .namespace .name) }}
{{- end }}
{{- if .Values.config.eviction.guardDeletes -}}
request.operation == 'DELETE' ? (has(oldObject.metadata.ownerReferences) && ({{ join " || " $deletes }})) : ({{ join " || " $evictions }})
{{- else -}}
{{ join " || " $evictions }}
{{- end }}
{{- end }}

{{/* The namespaces of config.drivers.declared, without repeats; fails on dra-guard's own. */}}
{{- define "dra-guard.declaredNamespaces" -}}
{{- $spaces := list }}
{{- range $i, $d := .Values.config.drivers.declared }}
{{- if eq $d.namespace $.Release.Namespace }}
{{- fail (printf "config.drivers.declared[%d].namespace: %s is dra-guard's own namespace, which is never sent to dra-guard; install the driver in a namespace of its own" $i $d.namespace) }}
{{- end }}
{{- if has $d.namespace $.Values.webhooks.excludedNamespaces }}
{{- fail (printf "config.drivers.declared[%d].namespace: %s is in webhooks.excludedNamespaces, which are never sent to dra-guard" $i $d.namespace) }}
{{- end }}
{{- $spaces = append $spaces $d.namespace }}
{{- end }}
{{- $spaces | uniq | toJson }}
{{- end }}

{{/*
The dra-guard configuration file (the format webhook/config/ declares): config values verbatim, plus the
certificates section naming the objects this chart creates.
*/}}
{{- define "dra-guard.config" -}}
apiVersion: dra-guard.io/v1alpha1
kind: DraGuardConfiguration
{{- $config := deepCopy .Values.config }}
{{- /* The review deadlines and server.dropAfterSeconds follow the webhooks' timeoutSeconds unless
config sets them: each policy's reviews answered 0.5 s before its own webhook's timeout (an eviction
past its timeout is let through by failurePolicy Ignore; an RBAC webhook of 10 s gets 9.5 s), the
server's deadline 0.5 s before the shortest (a policy's own is set only where it differs from that),
requests older than the longest dropped. An explicit
config.server.reviewDeadlineSeconds applies to every policy that does not set its own. */}}
{{- $shortest := 30 }}{{- $longest := 0 }}{{- $policies := dict }}
{{- $explicit := hasKey ($config.server | default dict) "reviewDeadlineSeconds" }}
{{- range $p := list "rbac" "probes" "eviction" }}
{{- $w := index $.Values.webhooks $p }}
{{- if $w.enabled }}
{{- if lt (int $w.timeoutSeconds) $shortest }}{{ $shortest = int $w.timeoutSeconds }}{{ end }}
{{- if gt (int $w.timeoutSeconds) $longest }}{{ $longest = int $w.timeoutSeconds }}{{ end }}
{{- end }}
{{- end }}
{{- range $p := list "rbac" "probes" "eviction" }}
{{- $w := index $.Values.webhooks $p }}
{{- if and $w.enabled (not $explicit) (ne (int $w.timeoutSeconds) $shortest) }}
{{- $_ := set $policies $p (dict "reviewDeadlineSeconds" (subf (int $w.timeoutSeconds) 0.5)) }}
{{- end }}
{{- end }}
{{- if $longest }}
{{- $derived := dict "reviewDeadlineSeconds" (subf $shortest 0.5) "dropAfterSeconds" $longest }}
{{- $config = mergeOverwrite (dict "server" $derived "policies" $policies) $config }}
{{- end }}
{{- /* The reports' owner: this release's ClusterRole, which helm uninstall deletes; the garbage
collector then deletes the reports (docs/operations/uninstall.md). Set here, never in values: only an object
of this release goes with it. */}}
{{- $config = mergeOverwrite $config (dict "audit" (dict "reportOwnerClusterRole" (include "dra-guard.fullname" .))) }}
{{- if .Values.clientAuth.caConfigMap }}
{{- $server := dict "clientCAFile" (printf "%s/ca.crt" (include "dra-guard.clientCADir" .)) "probePort" .Values.clientAuth.probePort }}
{{- $config = mergeOverwrite $config (dict "server" $server) }}
{{- end }}
{{ toYaml $config }}
certificates:
  mode: {{ .Values.certificates.mode }}
  namespace: {{ .Release.Namespace | quote }}
  service: {{ include "dra-guard.fullname" . | quote }}
  {{- with .Values.certificates.extraDnsNames }}
  extraDnsNames: {{ toYaml . | nindent 4 }}
  {{- end }}
  secretName: {{ include "dra-guard.tlsSecretName" . | quote }}
  leaseName: {{ include "dra-guard.leaseName" . | quote }}
  validatingWebhookConfiguration: {{ include "dra-guard.fullname" . | quote }}
  mutatingWebhookConfiguration: {{ include "dra-guard.fullname" . | quote }}
  {{- if eq .Values.certificates.mode "self" }}
  webhooksConfigMap: {{ include "dra-guard.fullname" . | quote }}
  {{- end }}
  dir: {{ include "dra-guard.certDir" . | quote }}
  caValidityDays: {{ .Values.certificates.caValidityDays }}
  leafValidityDays: {{ .Values.certificates.leafValidityDays }}
  renewAfterShare: {{ .Values.certificates.renewAfterShare }}
  checkIntervalSeconds: {{ .Values.certificates.checkIntervalSeconds }}
  reloadIntervalSeconds: {{ .Values.certificates.reloadIntervalSeconds }}
{{- end }}

{{/* clientConfig of one webhook: the development url, else the Service. Call with (dict "root" $ "path" "/validate/rbac"). */}}
{{- define "dra-guard.clientConfig" -}}
clientConfig:
  {{- if .root.Values.webhooks.url }}
  url: {{ printf "%s%s" (trimSuffix "/" .root.Values.webhooks.url) .path | quote }}
  {{- else }}
  service:
    name: {{ include "dra-guard.fullname" .root }}
    namespace: {{ .root.Release.Namespace | quote }}
    path: {{ .path | quote }}
    port: 443
  {{- end }}
  {{- with .root.Values.webhooks.caBundle }}
  caBundle: {{ . }}
  {{- end }}
{{- end }}

{{/* Namespaces never sent to dra-guard: its own (it must be able to restart itself), kube-system
(the cluster's own start-up), and webhooks.excludedNamespaces. */}}
{{/* Driver webhooks (probes, eviction): DRA drivers install in kube-system too (the DRA CPU and
network drivers do), so only dra-guard's own namespace and webhooks.excludedNamespaces stay out. */}}
{{- define "dra-guard.driverNamespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ concat (list .Release.Namespace) .Values.webhooks.excludedNamespaces | uniq | toJson }}
{{- end }}

{{- define "dra-guard.namespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ concat (list .Release.Namespace "kube-system") .Values.webhooks.excludedNamespaces | uniq | toJson }}
{{- end }}

{{/* The restricted container securityContext (Pod Security Standard "restricted"). */}}
{{- define "dra-guard.containerSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: [ALL]
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/* hostNetwork (values.yaml): the node's network namespace, cluster DNS still first */}}
{{- define "dra-guard.hostNetwork" -}}
{{- if .Values.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- end }}

{{/* extraEnv (values.yaml): EnvVar objects appended to every container's env */}}
{{- define "dra-guard.extraEnv" -}}
{{- with .Values.extraEnv }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{- define "dra-guard.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/*
The CEL condition of the RBAC webhook that leaves the admins out: false (not sent to dra-guard) for
a request by a user, group or ServiceAccount of config.rbac.adminSubjects or extraAdminSubjects, the
same lists dra-guard itself trusts (its loader adds the extra list to adminSubjects too, so a --set
of the extra list keeps the defaults). A ServiceAccount is "ns:name", "ns/name" or
"system:serviceaccount:ns:name" (name may be *), as webhook/config/subjects.py accepts. Identities that stand for many (system:authenticated, system:unauthenticated,
system:serviceaccounts[:ns], system:anonymous) are never admins, as in webhook/config
(NEVER_PRIVILEGED_*). Lists are rendered with toJson: JSON strings are CEL string literals.
*/}}
{{- define "dra-guard.notAdminExpression" -}}
{{- $admins := .Values.config.rbac.adminSubjects | default dict -}}
{{- $extra := .Values.config.rbac.extraAdminSubjects | default dict -}}
{{- $groups := list -}}
{{- range concat ($admins.groups | default list) ($extra.groups | default list) -}}
{{- if not (or (has . (list "system:authenticated" "system:unauthenticated" "system:serviceaccounts")) (hasPrefix "system:serviceaccounts:" .)) -}}
{{- $groups = append $groups . -}}
{{- end -}}
{{- end -}}
{{- $users := list -}}
{{- range concat ($admins.users | default list) ($extra.users | default list) -}}
{{- if ne . "system:anonymous" -}}
{{- $users = append $users . -}}
{{- end -}}
{{- end -}}
{{- $prefixes := list -}}
{{- range concat ($admins.serviceAccounts | default list) ($extra.serviceAccounts | default list) -}}
{{- $entry := . -}}
{{- if and (hasPrefix "system:serviceaccount:" $entry) (eq (len (splitList ":" $entry)) 4) -}}
{{- $entry = trimPrefix "system:serviceaccount:" $entry -}}
{{- end -}}
{{- $parts := splitList ":" (replace "/" ":" $entry) -}}
{{- if eq (index $parts 1) "*" -}}
{{- $prefixes = append $prefixes (printf "system:serviceaccount:%s:" (index $parts 0)) -}}
{{- else -}}
{{- $users = append $users (printf "system:serviceaccount:%s:%s" (index $parts 0) (index $parts 1)) -}}
{{- end -}}
{{- end -}}
{{- $groups = $groups | uniq -}}
{{- $users = $users | uniq -}}
{{- $prefixes = $prefixes | uniq -}}
!(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in {{ $groups | toJson }}))
&& !(request.userInfo.username in {{ $users | toJson }})
&& !({{ $prefixes | toJson }}.exists(p, request.userInfo.username.startsWith(p)))
{{- end }}
