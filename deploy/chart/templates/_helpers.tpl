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
{{- define "asya.clusterConfig" -}}
{{- $transports := dict -}}
{{- range $name, $t := .Values.transports -}}
{{- $_ := set $transports $name (dict "enabled" (ne $t.enabled false) "type" $t.type "config" (include "asya.compact" ($t.config | default dict) | fromJson)) -}}
{{- end -}}
{{- $cfg := dict "defaultTransport" (include "asya.defaultTransport" .) "transports" $transports -}}
{{- $sidecar := include "asya.compact" .Values.sidecar | fromJson -}}
{{- $_ := set $sidecar "image" (include "asya.image" (dict "root" . "image" .Values.sidecar.image)) -}}
{{- $_ := set $cfg "sidecar" $sidecar -}}
{{- $_ := set $cfg "policy" .Values.policy -}}
{{- $_ := set $cfg "endQueueRetention" (.Values.endQueueRetention | default "168h") -}}
{{- if .Values.actorServiceAccount.roleArn -}}
{{- $_ := set $cfg "serviceAccount" (dict "actorRoleArn" .Values.actorServiceAccount.roleArn) -}}
{{- end -}}
{{- if .Values.gateway.enabled -}}
{{- $gw := dict "url" (printf "http://%s.%s.svc:%v" (include "asya.gateway.name" .) .Release.Namespace .Values.gateway.port) -}}
{{- with .Values.gateway.auth.sidecarTokenSecretRef -}}
{{- if .name }}{{ $_ := set $gw "tokenSecretRef" (dict "name" .name "key" .key) }}{{ end -}}
{{- end -}}
{{- $_ := set $cfg "gateway" $gw -}}
{{- end -}}
{{- toYaml $cfg -}}
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
{{- $names | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* The Secrets the provisioner writes into actor namespaces: the credential Secrets under
     their own names and asya-transport-<transport> for KEDA (asya_api::naming). */}}
{{- define "asya.actorSecrets" -}}
{{- $names := include "asya.credentialSecrets" . | fromJsonArray -}}
{{- range (include "asya.enabledTransports" . | fromJsonArray) -}}
{{- $names = append $names (printf "asya-transport-%s" .) -}}
{{- end -}}
{{- /* Each namespace's own broker identity (docs/DESIGN.md §9). */ -}}
{{- range $name, $t := .Values.transports -}}
{{- if and (ne $t.enabled false) (eq $t.type "rabbitmq") -}}
{{- $names = append $names (printf "asya-broker-%s" $name) -}}
{{- end -}}
{{- end -}}
{{- $names | uniq | sortAlpha | toJson -}}
{{- end -}}
