{{/*
The labels every object carries: the same as the kustomize install's (manifests/), with no
Helm-specific labels added, so the DaemonSet's immutable selector is the same under both installs
and `holdfast status --node` finds the agent (app.kubernetes.io/name=holdfast,
app.kubernetes.io/component=agent) whichever installed it.
*/}}
{{- define "holdfast.labels" -}}
app.kubernetes.io/name: holdfast
app.kubernetes.io/component: {{ . }}
{{- end }}

{{/* The agent's image: repository@digest when a digest is set (pinned), else repository:tag. */}}
{{- define "holdfast.image" -}}
{{- if .Values.image.digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .Values.image.digest) -}}
{{- fail (printf "image.digest %q is not a digest: use sha256:<64 hex digits>, as `just image` prints it" .Values.image.digest) -}}
{{- end -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- end }}

{{/*
The Envoy network filter that runs the holdfast module, fetched over HTTPS: one per direction.
Used as YAML by the EnvoyFilter and as text by Kuma's MeshProxyPatch, which must say the same
(tests/tests/manifests.rs compares the two kustomize files value for value).
*/}}
{{- define "holdfast.envoyWasmFilter" -}}
name: envoy.filters.network.wasm
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm
  config:
    name: holdfast
    root_id: holdfast
    fail_open: true
    configuration:
      "@type": type.googleapis.com/google.protobuf.StringValue
      value: '{"direction": "{{ .direction }}"}'
    vm_config:
      vm_id: holdfast
      runtime: envoy.wasm.runtime.v8
      code:
        remote:
          http_uri:
            uri: {{ .root.Values.filter.url }}
            cluster: holdfast-filter-download
            timeout: 10s
          sha256: {{ .root.Values.filter.sha256 }}
          retry_policy:
            num_retries: 5
{{- end }}

{{/* The cluster Envoy downloads the module through (manifests/envoyfilter/envoyfilter.yaml says why each setting). */}}
{{- define "holdfast.downloadCluster" -}}
name: holdfast-filter-download
type: STRICT_DNS
dns_refresh_rate: 3600s
respect_dns_ttl: false
dns_failure_refresh_rate:
  base_interval: 5s
  max_interval: 300s
connect_timeout: 5s
dns_lookup_family: ALL
load_assignment:
  cluster_name: holdfast-filter-download
  endpoints:
  - lb_endpoints:
    - endpoint:
        address:
          socket_address:
            address: {{ .Values.filter.host }}
            port_value: 443
transport_socket:
  name: envoy.transport_sockets.tls
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
    sni: {{ .Values.filter.host }}
{{- end }}
