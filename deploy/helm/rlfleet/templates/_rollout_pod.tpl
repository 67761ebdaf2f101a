{{/* A rollout replica's pod template (the Deployment's pods, or the leader of a LeaderWorkerSet group). */}}
{{- define "rlfleet.rolloutPodTemplate" -}}
{{- $c := dict "root" . "component" "rollout" -}}
{{- $gpus := int .Values.rollout.gpusPerReplica -}}
metadata:
  labels:
    {{- include "rlfleet.labels" $c | nindent 4 }}
  annotations:
    {{- include "rlfleet.configChecksum" . | nindent 4 }}
    {{- include "rlfleet.scrapeAnnotations" . | nindent 4 }}
spec:
  {{- include "rlfleet.podCommon" . | nindent 2 }}
  {{- if and (gt $gpus 0) .Values.gpuPod.hostIPC }}
  hostIPC: true
  {{- end }}
  priorityClassName: {{ include "rlfleet.runPriorityClass" . }}
  {{- with .Values.rollout.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.rollout.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  affinity:
    {{- include "rlfleet.nodeAffinity" (dict "root" . "racks" .Values.topology.rolloutRacks) | nindent 4 }}
  # Replicas spread across racks (a rack failure takes out at most its share), then across hosts.
  topologySpreadConstraints:
    - maxSkew: {{ .Values.topology.rolloutMaxSkew }}
      topologyKey: {{ .Values.topology.rackLabel }}
      whenUnsatisfiable: DoNotSchedule
      labelSelector:
        matchLabels:
          {{- include "rlfleet.selectorLabels" $c | nindent 10 }}
      {{- if not .Values.rollout.leaderWorkerSet.enabled }}
      matchLabelKeys: ["pod-template-hash"]
      {{- end }}
    - maxSkew: 1
      topologyKey: {{ .Values.topology.hostLabel }}
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "rlfleet.selectorLabels" $c | nindent 10 }}
  containers:
    {{- $env := list (dict "name" "OMP_NUM_THREADS" "value" "1") -}}
    {{- include "rlfleet.serviceContainer" (dict "root" . "module" "rollout" "role" "rollout" "port" 50055 "resources" .Values.rollout.resources "gpus" $gpus "extraEnv" $env "extraArgs" (list "--replica-index=0" (ternary "--replica-id=rollout-0" "--replica-id=$(POD_NAME)" (and (eq (include "rlfleet.securityMode" .) "mtls") (not (empty .Values.security.existingSecrets))))) "startupFailures" 90) | nindent 4 }}
  volumes:
    {{- include "rlfleet.volumes" (dict "root" . "storage" true "gpu" (gt $gpus 0) "identity" "rollout") | nindent 4 }}
{{- end -}}
