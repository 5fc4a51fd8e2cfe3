{{/* Names: every object is prefixed with the release name, e.g. asya-webhook. */}}
{{- define "asya.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- define "asya.webhook.name" -}}{{ include "asya.fullname" . }}-webhook{{- end -}}
{{- define "asya.provisioner.name" -}}{{ include "asya.fullname" . }}-provisioner{{- end -}}
{{- define "asya.gateway.name" -}}{{ include "asya.fullname" . }}-gateway{{- end -}}
{{- define "asya.webhook.tlsSecret" -}}{{ include "asya.fullname" . }}-webhook-tls{{- end -}}
{{- define "asya.webhook.mutating" -}}{{ include "asya.fullname" . }}-webhook{{- end -}}
{{- define "asya.webhook.validating" -}}{{ include "asya.fullname" . }}-webhook{{- end -}}
{{- define "asya.configMap" -}}asya-config{{- end -}}

{{- define "asya.labels" -}}
app.kubernetes.io/name: asya
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "asya.selector" -}}
app.kubernetes.io/name: asya
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference: a string is used as is; {repository, tag} goes under
     global.imageRegistry (unless the repository has a "/") with its tag, else global.imageTag,
     else the chart's appVersion. */}}
{{- define "asya.image" -}}
{{- if kindIs "string" .image -}}
{{- .image -}}
{{- else -}}
{{- $g := .root.Values.global | default dict -}}
{{- $tag := .image.tag | default $g.imageTag | default .root.Chart.AppVersion -}}
{{- $repo := .image.repository -}}
{{- if and $g.imageRegistry (not (contains "/" $repo)) -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" $g.imageRegistry) $repo -}}
{{- end -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}
{{- end -}}

{{/* Drops empty strings and nulls from a map, recursively, so optional settings left "" in
     values do not reach the config (the config parser rejects an empty endpoint, say). */}}
{{- define "asya.compact" -}}
{{- $out := dict -}}
{{- range $k, $v := . -}}
{{- if kindIs "map" $v -}}
{{- $inner := include "asya.compact" $v | fromJson -}}
{{- if $inner }}{{ $_ := set $out $k $inner }}{{ end -}}
{{- else if and (not (kindIs "invalid" $v)) (not (and (kindIs "string" $v) (eq $v ""))) -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- $out | toJson -}}
{{- end -}}

{{/* The enabled transport names, sorted. */}}
{{- define "asya.enabledTransports" -}}
{{- $names := list -}}
{{- range $name, $t := .Values.transports -}}
{{- /* Missing `enabled` means on, as in ClusterConfig. */ -}}
{{- if ne $t.enabled false }}{{ $names = append $names $name }}{{ end -}}
{{- end -}}
{{- $names | sortAlpha | toJson -}}
{{- end -}}

{{- define "asya.defaultTransport" -}}
{{- $enabled := include "asya.enabledTransports" . | fromJsonArray -}}
{{- if not $enabled -}}
{{- fail "transports: no transport is enabled; set transports.rabbitmq.enabled=true or transports.sqs.enabled=true" -}}
{{- end -}}
{{- if .Values.defaultTransport -}}
{{- if not (has .Values.defaultTransport $enabled) -}}
{{- fail (printf "defaultTransport: %q is not an enabled transport (enabled: %s); enable transports.%s or change defaultTransport" .Values.defaultTransport (join ", " $enabled) .Values.defaultTransport) -}}
{{- end -}}
{{- .Values.defaultTransport -}}
{{- else if has "rabbitmq" $enabled -}}rabbitmq
{{- else -}}{{ first $enabled }}
{{- end -}}
{{- end -}}

{{/* The cluster configuration (asya_api::config::ClusterConfig). */}}
{{/* Namespaces the webhook configurations exclude, as JSON: kube-system, the release namespace
     and webhook.excludeNamespaces. One list for the webhook's namespaceSelector and the
     provisioner's excludedNamespaces, so the two cannot disagree. */}}
{{- define "asya.excludedNamespaces" -}}
{{- concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces | uniq | toJson -}}
{{- end -}}

{{/* The sources allowed to reach the webhook's admission port, as a JSON list of CIDRs:
     webhook.apiServerCIDRs when set; else, with webhook.apiServerCIDRsLookup, the API
     server's addresses from the `kubernetes` EndpointSlices (or Endpoints) in `default` at
     install or upgrade (/32, /128), leaving out loopback ones (an API server advertising
     127.0.0.1 calls pods from another address); else, or when the lookup finds nothing
     (`helm template`, a client-side dry run), empty: any source, as before. One list for
     the NetworkPolicy and the webhook's --allowed-source-cidrs, so the two agree. */}}
{{- define "asya.webhook.apiServerCIDRs" -}}
{{- $w := .Values.webhook -}}
{{- $cidrs := list -}}
{{- if $w.apiServerCIDRs -}}
{{- $cidrs = $w.apiServerCIDRs -}}
{{- else if $w.apiServerCIDRsLookup -}}
{{- $ips := list -}}
{{- $slices := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "" | default dict -}}
{{- range (get $slices "items" | default list) -}}
{{- $labels := (get (.metadata | default dict) "labels") | default dict -}}
{{- if eq (get $labels "kubernetes.io/service-name" | toString) "kubernetes" -}}
{{- range (.endpoints | default list) -}}
{{- range (.addresses | default list) -}}{{- $ips = append $ips (toString .) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $ips -}}
{{- $ep := lookup "v1" "Endpoints" "default" "kubernetes" | default dict -}}
{{- range (get $ep "subsets" | default list) -}}
{{- range (.addresses | default list) -}}{{- $ips = append $ips (toString .ip) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- range ($ips | uniq) -}}
{{- if not (or (hasPrefix "127." .) (eq . "::1")) -}}
{{- $cidrs = append $cidrs (printf "%s/%s" . (ternary "128" "32" (contains ":" .))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $cidrs -}}
{{- end -}}

{{- define "asya.clusterConfig" -}}
{{- $transports := dict -}}
{{- range $name, $t := .Values.transports -}}
{{- $_ := set $transports $name (dict "enabled" (ne $t.enabled false) "type" $t.type "config" (include "asya.compact" ($t.config | default dict) | fromJson)) -}}
{{- end -}}
{{- $cfg := dict "defaultTransport" (include "asya.defaultTransport" .) "transports" $transports -}}
{{- $sidecar := include "asya.compact" .Values.sidecar | fromJson -}}
{{- $_ := set $sidecar "image" (include "asya.image" (dict "root" . "image" .Values.sidecar.image)) -}}
{{- $_ := set $cfg "sidecar" $sidecar -}}
{{- $stateProxy := dict "image" (include "asya.image" (dict "root" . "image" .Values.stateProxy.image)) -}}
{{- with .Values.stateProxy.redis }}{{ $_ := set $stateProxy "redis" . }}{{ end -}}
{{- if .Values.stateProxy.allowStaticCredentials }}{{ $_ := set $stateProxy "allowStaticCredentials" true }}{{ end -}}
{{- $_ := set $cfg "stateProxy" $stateProxy -}}
{{- $_ := set $cfg "policy" .Values.policy -}}
{{- $_ := set $cfg "endQueueRetention" (.Values.endQueueRetention | default "168h") -}}
{{- if eq (.Values.wake | default dict).enabled false }}{{ $_ := set $cfg "wake" (dict "enabled" false) }}{{ end -}}
{{- $_ := set $cfg "flavorLimits" .Values.flavorLimits -}}
{{- $_ := set $cfg "excludedNamespaces" (include "asya.excludedNamespaces" . | fromJsonArray) -}}
{{- if .Values.actorServiceAccount.roleArn -}}
{{- $_ := set $cfg "serviceAccount" (dict "actorRoleArn" .Values.actorServiceAccount.roleArn) -}}
{{- end -}}
{{- if .Values.gateway.enabled -}}
{{- $gw := dict "url" (printf "http://%s.%s.svc:%v" (include "asya.gateway.name" .) .Release.Namespace .Values.gateway.port) -}}
{{- if include "asya.gatewayReportTokens" . -}}
{{- with .Values.gateway.auth.sidecarTokenSecretRef }}{{ $_ := set $gw "tokenSecretRef" (dict "name" .name "key" .key) }}{{ end -}}
{{- with .Values.gateway.auth.reportKeySecretRef }}{{ $_ := set $gw "reportKeySecretRef" (dict "name" .name "key" .key) }}{{ end -}}
{{- end -}}
{{- $_ := set $cfg "gateway" $gw -}}
{{- end -}}
{{- with .Values.tracing -}}{{- if .enabled -}}
{{- $tracing := dict "enabled" true "otlpEndpoint" .otlpEndpoint "samplingRatio" .samplingRatio "resourceAttributes" (.resourceAttributes | default dict) -}}
{{- with .queryUrl }}{{ $_ := set $tracing "queryUrl" . }}{{ end -}}
{{- $_ := set $cfg "tracing" $tracing -}}
{{- end -}}{{- end -}}
{{- if .Values.monitoring.annotations.enabled -}}
{{- $_ := set $cfg "monitoring" (dict "annotations" true) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Fails the install when a Prometheus Operator object is on but its CRD is not served:
     the API server would refuse the object with a less helpful message. */}}
{{- define "asya.requireMonitoringCRD" -}}
{{- if not (.root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind)) -}}
{{- fail (printf "%s is true but the cluster does not serve monitoring.coreos.com/v1 %s: install the Prometheus Operator's CRDs first, or set %s=false (docs/observability.md)" .value .kind .value) -}}
{{- end -}}
{{- end -}}

{{/* prometheus.io annotations of a chart pod serving metrics on `port` (monitoring.annotations). */}}
{{- define "asya.prometheusAnnotations" -}}
{{- if .root.Values.monitoring.annotations.enabled }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{- end -}}

{{/* The credential Secrets the cluster configuration names (in the release namespace), sorted. */}}
{{- define "asya.credentialSecrets" -}}
{{- $names := list -}}
{{- range $name, $t := .Values.transports -}}
{{- if ne $t.enabled false -}}
{{- with ($t.config | default dict).passwordSecretRef }}{{ $names = append $names .name }}{{ end -}}
{{- with ($t.config | default dict).credentialsSecretRef }}{{ $names = append $names .name }}{{ end -}}
{{- end -}}
{{- end -}}
{{- with .Values.stateProxy.redis }}{{ $names = append $names .adminPasswordSecretRef.name }}{{ end -}}
{{- $names | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* The Secrets the provisioner writes into actor namespaces: RabbitMQ's password secret
     under its own name; SQS's static keys (under their own name and asya-transport-<t>) only
     with shareStaticCredentials (asya_api::naming). KEDA's RabbitMQ credential lives in KEDA's
     namespace (keda.namespace). */}}
{{- define "asya.actorSecrets" -}}
{{- $names := list -}}
{{- range $name, $t := .Values.transports -}}
{{- $c := $t.config | default dict -}}
{{- if ne $t.enabled false -}}
{{- if eq $t.type "rabbitmq" -}}
{{- with $c.passwordSecretRef }}{{ $names = append $names .name }}{{ end -}}
{{- else if and $c.shareStaticCredentials $c.credentialsSecretRef -}}
{{- $names = concat $names (list $c.credentialsSecretRef.name (printf "asya-transport-%s" $name)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* Each namespace's own broker identity (docs/DESIGN.md §9). */ -}}
{{- range $name, $t := .Values.transports -}}
{{- if and (ne $t.enabled false) (eq $t.type "rabbitmq") -}}
{{- $names = append $names (printf "asya-broker-%s" $name) -}}
{{- end -}}
{{- end -}}
{{- /* Each namespace's own Redis user, for state proxies on the platform's Redis. */ -}}
{{- if .Values.stateProxy.redis }}{{ $names = append $names "asya-state-redis" }}{{ end -}}
{{- $names | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* A PodDisruptionBudget for a component (dict root, component, name, values: the component's
     values with replicas and podDisruptionBudget). Only with replicas > 1: on one replica a
     budget either blocks every node drain (minAvailable 1) or protects nothing. With more,
     minAvailable must stay below replicas, or drains hang. */}}
{{- define "asya.podDisruptionBudget" -}}
{{- $v := .values -}}
{{- $pdb := $v.podDisruptionBudget -}}
{{- if and $pdb.enabled (gt (int $v.replicas) 1) -}}
{{- if and (not (kindIs "string" $pdb.minAvailable)) (ge (int $pdb.minAvailable) (int $v.replicas)) -}}
{{- fail (printf "%s.podDisruptionBudget.minAvailable (%d) must be below %s.replicas (%d): otherwise no %s pod may ever be evicted and node drains hang; raise %s.replicas or set %s.podDisruptionBudget.enabled=false" .component (int $pdb.minAvailable) .component (int $v.replicas) .component .component .component) -}}
{{- end }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "asya.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  minAvailable: {{ $pdb.minAvailable }}
  selector:
    matchLabels:
      {{- include "asya.selector" (dict "root" .root "component" .component) | nindent 6 }}
{{- end -}}
{{- end -}}
{{/* The enabled RabbitMQ transports, sorted: each has a ClusterTriggerAuthentication
     asya-<t> and its Secret asya-keda-<t> in KEDA's namespace (crate keda_identity). */}}
{{- define "asya.rabbitmqTransports" -}}
{{- $names := list -}}
{{- range $name, $t := .Values.transports -}}
{{- if and (ne $t.enabled false) (eq $t.type "rabbitmq") }}{{ $names = append $names $name }}{{ end -}}
{{- end -}}
{{- $names | sortAlpha | toJson -}}
{{- end -}}

{{/* A JSON list of prefix+name for each of names: (dict "prefix" P "names" LIST). */}}
{{- define "asya.prefixed" -}}
{{- $out := list -}}
{{- range .names }}{{ $out = append $out (printf "%s%s" $.prefix .) }}{{ end -}}
{{- $out | toJson -}}
{{- end -}}

{{/* Secrets of older layouts the provisioner removes from actor namespaces (read first to
     check the managed-by label, then deleted): KEDA's per-namespace RabbitMQ credential
     asya-transport-<rabbitmq transport>, and for each SQS transport whose keys are not shared
     the copies asya-transport-<t> and credentialsSecretRef.name; never a name the provisioner
     writes for another transport (asya.actorSecrets). Sorted. */}}
{{- define "asya.legacySecrets" -}}
{{- $names := list -}}
{{- range $name, $t := .Values.transports -}}
{{- $c := $t.config | default dict -}}
{{- if ne $t.enabled false -}}
{{- if eq $t.type "rabbitmq" -}}
{{- $names = append $names (printf "asya-transport-%s" $name) -}}
{{- else if not $c.shareStaticCredentials -}}
{{- $names = append $names (printf "asya-transport-%s" $name) -}}
{{- with $c.credentialsSecretRef }}{{ $names = append $names .name }}{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $written := include "asya.actorSecrets" . | fromJsonArray -}}
{{- $out := list -}}
{{- range ($names | uniq | sortAlpha) }}{{ if not (has . $written) }}{{ $out = append $out . }}{{ end }}{{ end -}}
{{- $out | toJson -}}
{{- end -}}

{{/* "true" when the provisioner issues each actor namespace's gateway report token (the
gateway is on, with auth, a report key and sidecarTokenSecretRef): docs/DESIGN.md §9. Without
a report key no report is accepted, so the sidecars get no token to start with. */}}
{{/* "true" when the gateway checks report tokens against the namespaces' uids (a watch of
     Namespaces, with its ClusterRole): the gateway on with auth, a report key, and
     gateway.auth.namespaceUids kube. */}}
{{- define "asya.gatewayWatchesNamespaces" -}}
{{- $g := .Values.gateway -}}
{{- $rk := $g.auth.reportKeySecretRef | default dict -}}
{{- if and $g.enabled (not $g.auth.disabled) $rk.name (eq ($g.auth.namespaceUids | default "kube") "kube") -}}true{{- end -}}
{{- end -}}

{{/* The gateway offers compiled flows as tools: a watch of their entry AsyncActors. */}}
{{- define "asya.gatewayWatchesFlows" -}}
{{- $g := .Values.gateway -}}
{{- if and $g.enabled (eq ($g.flows | default "off") "kube") -}}true{{- end -}}
{{- end -}}

{{/* The gateway talks to the API server (an API token in its pod, egress to the server). */}}
{{- define "asya.gatewayUsesKube" -}}
{{- if or (include "asya.gatewayWatchesNamespaces" .) (include "asya.gatewayWatchesFlows" .) -}}true{{- end -}}
{{- end -}}

{{- define "asya.gatewayReportTokens" -}}
{{- $g := .Values.gateway -}}
{{- $rk := $g.auth.reportKeySecretRef | default dict -}}
{{- $st := $g.auth.sidecarTokenSecretRef | default dict -}}
{{- if and $g.enabled (not $g.auth.disabled) $rk.name $st.name -}}true{{- end -}}
{{- end -}}

{{/* The standard OTEL_* variables of a control-plane part (`service`: its service name) when
     tracing.enabled: the same set the webhook gives injected sidecars
     (api/src/telemetry.rs TracingConfig::sidecar_env), values percent-encoded. */}}
{{- define "asya.otelEnv" -}}
{{- $t := .root.Values.tracing -}}
{{- if $t.enabled -}}
{{- $attrs := list (printf "k8s.namespace.name=%s" .root.Release.Namespace) -}}
{{- range $k, $v := ($t.resourceAttributes | default dict) -}}
{{- $attrs = append $attrs (printf "%s=%s" $k (urlquery (toString $v) | replace "+" "%20")) -}}
{{- end }}
- {name: OTEL_SDK_DISABLED, value: "false"}
- {name: OTEL_SERVICE_NAME, value: {{ .service | quote }}}
- {name: OTEL_RESOURCE_ATTRIBUTES, value: {{ join "," $attrs | quote }}}
- {name: OTEL_TRACES_EXPORTER, value: otlp}
- {name: OTEL_EXPORTER_OTLP_ENDPOINT, value: {{ $t.otlpEndpoint | quote }}}
- {name: OTEL_EXPORTER_OTLP_PROTOCOL, value: http/json}
- {name: OTEL_TRACES_SAMPLER, value: parentbased_traceidratio}
- {name: OTEL_TRACES_SAMPLER_ARG, value: {{ $t.samplingRatio | toString | quote }}}
- {name: OTEL_PROPAGATORS, value: tracecontext}
{{- end -}}
{{- end -}}

{{/*
A component's tolerations: its values' list, then how long its pods stay bound to a node that
stopped answering (node.kubernetes.io/unreachable and not-ready, NoExecute) when
nodeLossTolerationSeconds is set: Kubernetes' default is 300 s (DefaultTolerationSeconds),
this component's replacement starts elsewhere after the node's grace period plus this.
A toleration of those keys in the list wins (the generated one is left out).
*/}}
{{- define "asya.tolerations" -}}
{{- $list := .list | default list -}}
{{- $keys := list -}}
{{- range $list }}{{ $keys = append $keys (.key | default "") }}{{ end -}}
{{- if .seconds -}}
{{- range $k := list "node.kubernetes.io/unreachable" "node.kubernetes.io/not-ready" -}}
{{- if not (has $k $keys) -}}
{{- $list = append $list (dict "key" $k "operator" "Exists" "effect" "NoExecute" "tolerationSeconds" ($.seconds | int)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $list }}{{ toYaml $list }}{{ end -}}
{{- end -}}
