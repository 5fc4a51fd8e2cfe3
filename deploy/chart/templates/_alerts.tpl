{{/* The default alert set (docs/observability.md#alerts): the `groups` of the chart's
     PrometheusRule. tests/monitoring renders it into a plain rules file for `promtool test
     rules` (tests/monitoring/alerts_test.yaml), so what is tested is what the chart ships.
     Prometheus' own templates ({{ $labels.x }}) are written as Helm string literals. */}}
{{- define "asya.alertGroups" -}}
{{- $r := .Values.monitoring.prometheusRule -}}
{{- $t := $r.thresholds -}}
{{- $rb := trimSuffix "/" $r.runbookBaseURL -}}
{{- $actor := `{{ $labels.namespace }}/{{ $labels.actor }}` -}}
{{- $value := `{{ $value | humanize }}` -}}
groups:
  - name: asya-actors
    rules:
      - alert: AsyaActorFailureRatioHigh
        expr: |
          (
            sum by (namespace, actor) (rate(asya_actor_messages_processed_total{status=~"failed|poison|malformed"}[{{ $t.failureRatioWindow }}]))
            /
            sum by (namespace, actor) (rate(asya_actor_messages_processed_total[{{ $t.failureRatioWindow }}]))
          ) > {{ $t.failureRatio }}
        for: {{ $t.failureRatioFor }}
        labels:
          severity: warning
        annotations:
          summary: "Actor {{ $actor }} sends {{ `{{ $value | humanizePercentage }}` }} of its messages to x-sump"
          runbook_url: {{ $rb }}#asyaactorfailureratiohigh
      - alert: AsyaActorStuck
        # From the provisioner's gauges, so it fires while the actor has no pod at all.
        expr: |
          max by (namespace, actor) (asya_provisioner_actor_messages_queued) > 0
          unless on (namespace, actor)
          sum by (namespace, actor) (increase(asya_actor_messages_processed_total[{{ $t.stuckFor }}])) > 0
        for: {{ $t.stuckFor }}
        labels:
          severity: critical
        annotations:
          summary: "Actor {{ $actor }} has {{ $value }} messages queued and processed none for {{ $t.stuckFor }}"
          runbook_url: {{ $rb }}#asyaactorstuck
      - alert: AsyaActorTimeouts
        expr: |
          sum by (namespace, actor) (increase(asya_actor_timeouts_total[{{ $t.timeoutsFor }}])) > 0
        labels:
          severity: warning
        annotations:
          summary: "Actor {{ $actor }}: handler calls ran past actorTimeout in the last {{ $t.timeoutsFor }}"
          runbook_url: {{ $rb }}#asyaactortimeouts
      - alert: AsyaActorRuntimeCrashing
        expr: |
          sum by (namespace, actor) (increase(asya_actor_runtime_errors_total{error_type=~"RuntimeCrashed|RuntimeUnreachable"}[{{ $t.timeoutsFor }}])) > 0
        labels:
          severity: warning
        annotations:
          summary: "Actor {{ $actor }}: the runtime died or was unreachable during calls in the last {{ $t.timeoutsFor }}"
          runbook_url: {{ $rb }}#asyaactorruntimecrashing
      - alert: AsyaBrokerDisconnected
        expr: |
          max by (namespace, actor, pod) (asya_actor_transport_up) == 0
        for: {{ $t.brokerDisconnectedFor }}
        labels:
          severity: critical
        annotations:
          summary: "Sidecar {{ `{{ $labels.pod }}` }} of actor {{ $actor }} is not connected to its broker"
          runbook_url: {{ $rb }}#asyabrokerdisconnected
      - alert: AsyaPoisonOrMalformedMessages
        expr: |
          sum by (namespace, actor, reason) (increase(asya_actor_messages_failed_total{reason=~"poison|not_json|not_envelope|current_out_of_range|wrong_actor|empty_id"}[10m])) > 0
        for: {{ $t.poisonFor }}
        labels:
          severity: warning
        annotations:
          summary: "Actor {{ $actor }} sent {{ `{{ $labels.reason }}` }} messages to x-sump in the last 10m"
          runbook_url: {{ $rb }}#asyapoisonormalformedmessages
  - name: asya-control-plane
    rules:
      - alert: AsyaProvisionerDown
        expr: absent(asya_provisioner_build_info)
        for: {{ $t.provisionerDownFor }}
        labels:
          severity: critical
        annotations:
          summary: "No queue provisioner has been scraped for {{ $t.provisionerDownFor }}: no queues, workloads or status for new or changed actors"
          runbook_url: {{ $rb }}#asyaprovisionerdown
      - alert: AsyaProvisionerNoLeader
        expr: sum(asya_provisioner_leader) == 0
        for: {{ $t.provisionerDownFor }}
        labels:
          severity: critical
        annotations:
          summary: "Queue provisioners run but none holds the leader lease"
          runbook_url: {{ $rb }}#asyaprovisionernoleader
      - alert: AsyaReconcileErrors
        expr: |
          sum(rate(controller_runtime_reconcile_errors_total{controller="asyncactor"}[10m])) > 0
        for: {{ $t.reconcileErrorsFor }}
        labels:
          severity: warning
        annotations:
          summary: "AsyncActor reconciles have kept failing for {{ $t.reconcileErrorsFor }}"
          runbook_url: {{ $rb }}#asyareconcileerrors
      - alert: AsyaWebhookDown
        # With failurePolicy Fail, no actor pod can be created while it is down.
        expr: absent(asya_webhook_build_info)
        for: {{ $t.webhookDownFor }}
        labels:
          severity: critical
        annotations:
          summary: "No admission webhook has been scraped for {{ $t.webhookDownFor }}: actor pods cannot be created"
          runbook_url: {{ $rb }}#asyawebhookdown
      - alert: AsyaWebhookCertificateExpiring
        expr: |
          min(asya_webhook_certificate_expiry_seconds) < {{ mul $t.certificateExpiryDays 86400 }}
        for: 10m
        labels:
          severity: warning
        annotations:
          summary: "The webhook's serving certificate expires in {{ `{{ $value | humanizeDuration }}` }}"
          runbook_url: {{ $rb }}#asyawebhookcertificateexpiring
{{- end -}}
