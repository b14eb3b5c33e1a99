{{/* The image every container runs. */}}
{{- define "probe-agent.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* Labels Helm adds to every object (kustomize's manifests carry their own labels besides these). */}}
{{- define "probe-agent.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* true when the objects API servers before 1.30 refuse must be left out (components/before-1.30). */}}
{{- define "probe-agent.before130" -}}
{{- if eq (toString .Values.before130) "auto" -}}
{{- semverCompare "<1.30-0" .Capabilities.KubeVersion.Version -}}
{{- else -}}
{{- .Values.before130 -}}
{{- end -}}
{{- end }}

{{/* Refuses values that would render something broken. */}}
{{- define "probe-agent.validate" -}}
{{- if not (has .Values.mode (list "" "shim" "gates")) -}}
{{- fail (printf "mode %q is not available: use \"\" (the agent alone), \"shim\" or \"gates\"" .Values.mode) -}}
{{- end -}}
{{- if and (eq .Values.mode "gates") (eq (include "probe-agent.before130" .) "true") -}}
{{- fail "mode: gates needs Kubernetes >= 1.30 (its pod-status policy reads the pod-bound token's node name)" -}}
{{- end -}}
{{- if not (has .Values.runtime (list "" "containerd" "crio")) -}}
{{- fail (printf "runtime %q: use containerd, crio or \"\"" .Values.runtime) -}}
{{- end -}}
{{- if and .Values.webhook.enabled (not (has .Values.mode (list "shim" "gates"))) -}}
{{- fail "webhook.enabled needs mode: shim or gates (rewritten pods run only on nodes whose kubelet uses the shim, or where the agent writes their gate)" -}}
{{- end -}}
{{- if and .Values.gatesLease.enabled (not (and (eq .Values.mode "gates") .Values.webhook.enabled)) -}}
{{- fail "gatesLease.enabled needs mode: gates and webhook.enabled (the controller runs in the webhook Deployment)" -}}
{{- end -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.apiServerCIDRs) -}}
{{- fail "webhook.apiServerCIDRs is required: the addresses the API server's connections come from (docs/deploy.md, \"The webhook's NetworkPolicy\")" -}}
{{- end -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager) (not .Values.webhook.caBundle) -}}
{{- fail "webhook.caBundle is required without cert-manager: the CA of the probe-agent-webhook-tls Secret" -}}
{{- end -}}
{{- if not (has .Values.webhook.failurePolicy (list "Ignore" "Fail")) -}}
{{- fail "webhook.failurePolicy: Ignore or Fail" -}}
{{- end -}}
{{- range .Values.webhook.namespaces -}}
{{- if has . (list "kube-system" $.Release.Namespace) -}}
{{- fail (printf "webhook.namespaces may not list %s: a rewritten webhook or system pod would depend on itself" .) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.closeHole.enabled (not .Values.closeHole.podCIDRs) -}}
{{- fail "closeHole.podCIDRs is required: the cluster's pod CIDRs" -}}
{{- end -}}
{{- if and .Values.podMonitor.enabled .Values.serviceMonitor.enabled -}}
{{- fail "podMonitor and serviceMonitor: enable one, or every series is scraped twice" -}}
{{- end -}}
{{- end }}

{{/* The close-hole sidecar's settings: close-hole.env (the component's file), then the values. */}}
{{- define "probe-agent.closeHoleEnv" -}}
{{- $env := dict -}}
{{- range .Files.Lines "files/close-hole.env" -}}
{{- $line := trim . -}}
{{- if and $line (not (hasPrefix "#" $line)) -}}
{{- $kv := splitn "=" 2 $line -}}
{{- $_ := set $env $kv._0 ($kv._1 | default "") -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := .Values.closeHole.env -}}
{{- if not (hasKey $env $k) -}}
{{- fail (printf "closeHole.env: %s is not a close-hole setting (files/close-hole.env lists them)" $k) -}}
{{- end -}}
{{- $_ := set $env $k (toString $v) -}}
{{- end -}}
{{- $_ := set $env "CLOSE_HOLE_POD_CIDRS" (join "," .Values.closeHole.podCIDRs) -}}
{{- toYaml $env -}}
{{- end }}

{{/* A webhook entry's clientConfig: (list $ path). */}}
{{- define "probe-agent.webhookClient" -}}
{{- $root := index . 0 -}}
service:
  name: probe-agent-webhook
  namespace: {{ $root.Release.Namespace }}
  path: {{ index . 1 }}
  port: 443
{{- if not $root.Values.webhook.certManager }}
caBundle: {{ $root.Values.webhook.caBundle }}
{{- end }}
{{- end }}

{{/* The agent's two scrape endpoints: /metrics, and the shim's counters it relays at /metrics/shim
(told apart by a metrics_path label, which the alert rules read). The node name is the instance. */}}
{{- define "probe-agent.scrapeEndpoints" -}}
- port: metrics
  path: /metrics
  interval: 30s
  relabelings:
    - sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: instance
    - sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: node
- port: metrics
  path: /metrics/shim
  interval: 30s
  relabelings:
    - sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: instance
    - sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: node
    - sourceLabels: [__metrics_path__]
      targetLabel: metrics_path
{{- end }}
