{{/* The container of one rlfleet service: the shared command line, config, token, probes, metrics port. */}}
{{- define "rlfleet.serviceContainer" -}}
{{- $mtls := eq (include "rlfleet.securityMode" .root) "mtls" -}}
- name: {{ .module | replace "_" "-" }}
  image: {{ include "rlfleet.image" (dict "root" .root "role" .role) }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: ["python", "-m", "rlfleet.services.{{ .module }}"]
  args:
    - --config=/etc/rlfleet/config.yaml
    - --listen=0.0.0.0:{{ .port }}
    - --metrics-port=9400
    {{- range .extraArgs }}
    - {{ . }}
    {{- end }}
  env:
    {{- include "rlfleet.commonEnv" .root | nindent 4 }}
    {{- include "rlfleet.identityEnv" (dict "root" .root "identity" .module) | nindent 4 }}
    {{- if and $mtls (not .execProbe) }}
    - name: RLFLEET_HEALTH_PORT
      value: {{ .port | quote }}
    {{- end }}
    {{- with .extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: grpc
      containerPort: {{ .port }}
      protocol: TCP
    - name: metrics
      containerPort: 9400
      protocol: TCP
    {{- with .extraPorts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- include "rlfleet.grpcProbes" (dict "port" .port "startupFailures" .startupFailures "exec" .execProbe "mtls" $mtls) | nindent 2 }}
  resources:
    {{- include "rlfleet.resources" (dict "root" .root "resources" .resources "gpus" (default 0 .gpus)) | nindent 4 }}
  securityContext:
    {{- include "rlfleet.containerSecurityContext" (dict "root" .root "gpu" (gt (int (default 0 .gpus)) 0)) | nindent 4 }}
  volumeMounts:
    {{- include "rlfleet.volumeMounts" (dict "root" .root "storage" true "gpu" (gt (int (default 0 .gpus)) 0) "identity" .module) | nindent 4 }}
    {{- with .extraMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
