{{/* The trainer rank pod template, shared by the StatefulSet and the JobSet. */}}
{{- define "rlfleet.trainerPodTemplate" -}}
{{- $c := dict "root" . "component" "trainer" -}}
{{- $gpus := int .Values.trainer.gpusPerPod -}}
metadata:
  labels:
    {{- include "rlfleet.labels" $c | nindent 4 }}
    {{- if and .Values.kueue.enabled .Values.kueue.queueName }}
    kueue.x-k8s.io/queue-name: {{ .Values.kueue.queueName }}
    {{- end }}
  annotations:
    {{- include "rlfleet.configChecksum" . | nindent 4 }}
    {{- include "rlfleet.scrapeAnnotations" . | nindent 4 }}
    {{- if and .Values.kueue.enabled .Values.kueue.topologyAware }}
    kueue.x-k8s.io/podset-required-topology: {{ .Values.topology.rackLabel }}
    {{- end }}
spec:
  {{- include "rlfleet.podCommon" . | nindent 2 }}
  {{- if and (gt $gpus 0) .Values.gpuPod.hostIPC }}
  hostIPC: true
  {{- end }}
  {{- if .Values.jobSet.enabled }}
  restartPolicy: Never
  {{- end }}
  priorityClassName: {{ include "rlfleet.runPriorityClass" . }}
  terminationGracePeriodSeconds: {{ .Values.trainer.terminationGracePeriodSeconds }}
  {{- with .Values.trainer.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.trainer.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  affinity:
    {{- include "rlfleet.nodeAffinity" (dict "root" . "pinRacks" true) | nindent 4 }}
    podAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        - labelSelector:
            matchLabels:
              {{- include "rlfleet.selectorLabels" $c | nindent 14 }}
          topologyKey: {{ .Values.topology.rackLabel }}
  {{- if .Values.runConfig.model.prepare }}
  {{- /* Nothing else on a cluster runs model.prepare (`rlfleet run`'s launcher does it on one machine): the model
  folder is built here, on the model volume (writable in this init container only; model.path must be under /models,
  the one volume replicas see too), before the rank starts; replicas wait for it. */}}
  initContainers:
    - name: prepare-model
      image: {{ include "rlfleet.image" (dict "root" . "role" "trainer") }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command: ["python", "-m", "rlfleet.services.trainer.prepare_model", "--config=/etc/rlfleet/config.yaml"]
      env:
        {{- include "rlfleet.commonEnv" . | nindent 8 }}
        - name: OMP_NUM_THREADS
          value: {{ .Values.trainer.threads | quote }}
      resources:
        {{- include "rlfleet.resources" (dict "root" . "resources" .Values.trainer.resources "gpus" 0) | nindent 8 }}
      securityContext:
        {{- include "rlfleet.containerSecurityContext" (dict "root" . "gpu" false) | nindent 8 }}
      volumeMounts:
        {{- include "rlfleet.volumeMounts" (dict "root" . "storage" true "gpu" false "writeCheckpoints" true "writeModel" true "identity" "") | nindent 8 }}
  {{- end }}
  containers:
    {{- $env := list
        (dict "name" "WORLD_SIZE" "value" (include "rlfleet.trainerWorldSize" .))
        (dict "name" "RLFLEET_RANKS_PER_POD" "value" (include "rlfleet.trainerRanksPerPod" .))
        (dict "name" "MASTER_ADDR" "value" (include "rlfleet.trainerRank0Host" .))
        (dict "name" "MASTER_PORT" "value" "29500")
        (dict "name" "OMP_NUM_THREADS" "value" (toString .Values.trainer.threads))
        (dict "name" "RLFLEET_HEALTH_PORT" "value" "50053")
        (dict "name" "RLFLEET_POD_IP" "valueFrom" (dict "fieldRef" (dict "fieldPath" "status.podIP"))) -}}
    {{- if .Values.jobSet.enabled }}
    {{- $env = append $env (dict "name" "RLFLEET_POD_INDEX" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.annotations['batch.kubernetes.io/job-completion-index']"))) }}
    {{- else }}
    {{- $env = append $env (dict "name" "RLFLEET_POD_INDEX" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.labels['apps.kubernetes.io/pod-index']"))) }}
    {{- end }}
    {{- $ports := list
        (dict "name" "weights" "containerPort" 50054 "protocol" "TCP")
        (dict "name" "rendezvous" "containerPort" 29500 "protocol" "TCP") -}}
    {{- include "rlfleet.serviceContainer" (dict "root" . "module" "trainer" "role" "trainer" "port" 50053 "resources" .Values.trainer.resources "gpus" $gpus "extraEnv" $env "extraPorts" $ports "startupFailures" 90 "execProbe" true) | nindent 4 }}
  volumes:
    {{- include "rlfleet.volumes" (dict "root" . "storage" true "gpu" (gt $gpus 0) "identity" "trainer") | nindent 4 }}
{{- end -}}
