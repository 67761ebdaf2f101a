{{/* Names: every object of a run is prefixed with the release name (one release = one run). */}}
{{- define "rlfleet.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "rlfleet.name" -}}
{{- printf "%s-%s" (include "rlfleet.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rlfleet.selectorLabels" -}}
app.kubernetes.io/name: rlfleet
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "rlfleet.labels" -}}
{{ include "rlfleet.selectorLabels" . }}
app.kubernetes.io/part-of: rlfleet
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* Every pod of the run (the NetworkPolicies select on this). */}}
{{- define "rlfleet.runSelector" -}}
app.kubernetes.io/name: rlfleet
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rlfleet.image" -}}
{{- $v := .root.Values.image -}}
{{- if has .role (list "trainer" "rollout") -}}
{{- printf "%s/rlfleet-%s-%s:%s" $v.registry .role $v.variant $v.tag -}}
{{- else -}}
{{- printf "%s/rlfleet-%s:%s" $v.registry .role $v.tag -}}
{{- end -}}
{{- end -}}

{{- define "rlfleet.runPriorityClass" -}}
{{- default (printf "%s-run" (include "rlfleet.fullname" .)) .Values.priority.run.name -}}
{{- end -}}

{{- define "rlfleet.sparePriorityClass" -}}
{{- default (printf "%s-spare" (include "rlfleet.fullname" .)) .Values.priority.spare.name -}}
{{- end -}}

{{- define "rlfleet.redisSecret" -}}
{{- default (printf "%s-redis" (include "rlfleet.fullname" .)) .Values.redis.auth.existingSecret -}}
{{- end -}}

{{- define "rlfleet.tokenSecret" -}}
{{- default (printf "%s-token" (include "rlfleet.fullname" .)) .Values.token.existingSecret -}}
{{- end -}}

{{- define "rlfleet.namespace" -}}
{{- .Release.Namespace -}}
{{- end -}}

{{/* Stable DNS names the run config's endpoints hold. */}}
{{- define "rlfleet.svcHost" -}}
{{- printf "%s.%s.svc.cluster.local" (include "rlfleet.name" (dict "root" .root "component" .component)) .root.Release.Namespace -}}
{{- end -}}

{{/* Ranks one trainer pod runs: trainer.ranksPerPod, else one per GPU (trainer.gpusPerPod), else 1. */}}
{{- define "rlfleet.trainerRanksPerPod" -}}
{{- $gpus := int .Values.trainer.gpusPerPod -}}
{{- $rpp := int (default 0 .Values.trainer.ranksPerPod) -}}
{{- if eq $rpp 0 }}{{- $rpp = max $gpus 1 -}}{{- end -}}
{{- if and (gt $gpus 0) (gt $rpp $gpus) -}}
{{- fail (printf "trainer.ranksPerPod=%d is more than trainer.gpusPerPod=%d: a rank drives one GPU" $rpp $gpus) -}}
{{- end -}}
{{- $rpp -}}
{{- end -}}

{{/* The trainer's world size: pods x ranks per pod (rlfleet/services/trainer/ranks.py numbers them pod by pod). */}}
{{- define "rlfleet.trainerWorldSize" -}}
{{- mul (int .Values.trainer.pods) (int (include "rlfleet.trainerRanksPerPod" .)) -}}
{{- end -}}

{{- define "rlfleet.trainerRank0Host" -}}
{{- $trainer := include "rlfleet.name" (dict "root" . "component" "trainer") -}}
{{- if .Values.jobSet.enabled -}}
{{- printf "%s-rank-0-0.%s.%s.svc.cluster.local" $trainer $trainer .Release.Namespace -}}
{{- else -}}
{{- printf "%s-0.%s.%s.svc.cluster.local" $trainer $trainer .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* Pod-level settings shared by every pod of the run. */}}
{{- define "rlfleet.podCommon" -}}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
securityContext:
{{ toYaml .Values.podSecurityContext | indent 2 }}
{{- end -}}

{{/* Required node affinity every pod of the run keeps: away from quarantined nodes, within the run's racks
(pinRacks: topology.racks; or the racks given). */}}
{{- define "rlfleet.nodeAffinity" -}}
{{- $racks := list -}}
{{- if .pinRacks }}{{ $racks = .root.Values.topology.racks }}{{ end -}}
{{- if .racks }}{{ $racks = .racks }}{{ end -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - key: {{ .root.Values.quarantine.label }}
            operator: DoesNotExist
          {{- if $racks }}
          - key: {{ .root.Values.topology.rackLabel }}
            operator: In
            values: {{ toJson $racks }}
          {{- end }}
{{- end -}}

{{/* Container securityContext; GPU pods may opt in to IPC_LOCK. */}}
{{- define "rlfleet.containerSecurityContext" -}}
{{- $sc := deepCopy .root.Values.containerSecurityContext -}}
{{- if and .gpu .root.Values.gpuPod.ipcLock -}}
{{- $caps := deepCopy (default dict $sc.capabilities) -}}
{{- $_ := set $caps "add" (list "IPC_LOCK") -}}
{{- $_ := set $sc "capabilities" $caps -}}
{{- end -}}
{{ toYaml $sc }}
{{- end -}}

{{/* Resources from values plus GPUs and RDMA devices. */}}
{{- define "rlfleet.resources" -}}
{{- $r := deepCopy .resources -}}
{{- if gt (int .gpus) 0 -}}
{{- $req := deepCopy (default dict $r.requests) -}}
{{- $lim := deepCopy (default dict $r.limits) -}}
{{- $_ := set $req "nvidia.com/gpu" (int .gpus) -}}
{{- $_ := set $lim "nvidia.com/gpu" (int .gpus) -}}
{{- if .root.Values.gpuPod.rdma.enabled -}}
{{- $_ := set $req .root.Values.gpuPod.rdma.resourceName (int .root.Values.gpuPod.rdma.count) -}}
{{- $_ := set $lim .root.Values.gpuPod.rdma.resourceName (int .root.Values.gpuPod.rdma.count) -}}
{{- end -}}
{{- $_ := set $r "requests" $req -}}
{{- $_ := set $r "limits" $lim -}}
{{- end -}}
{{ toYaml $r }}
{{- end -}}

{{/* Environment every service container gets. */}}
{{- define "rlfleet.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- if eq (include "rlfleet.securityMode" .) "token" }}
- name: RLFLEET_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "rlfleet.tokenSecret" . }}
      key: token
{{- end }}
- name: HOME
  value: /tmp
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{- define "rlfleet.grpcProbes" -}}
{{- /* mtls: the kubelet's gRPC probe speaks no TLS; the image's health check presents the pod's certificate. */}}
{{- if or .exec .mtls }}
{{- /* Trainer: only rank 0 serves gRPC; the image's health check asks rank 0's grpc.health.v1 and passes on the
other ranks (their failures show as container exits, which the controller acts on). */}}
startupProbe:
  exec:
    command: ["python", "/usr/local/bin/rlfleet-healthcheck"]
  periodSeconds: 10
  timeoutSeconds: 8
  failureThreshold: {{ default 30 .startupFailures }}
readinessProbe:
  exec:
    command: ["python", "/usr/local/bin/rlfleet-healthcheck"]
  periodSeconds: 30
  timeoutSeconds: 8
  failureThreshold: 3
livenessProbe:
  exec:
    command: ["python", "/usr/local/bin/rlfleet-healthcheck"]
  periodSeconds: 60
  timeoutSeconds: 8
  failureThreshold: 5
{{- else }}
startupProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 10
  failureThreshold: {{ default 30 .startupFailures }}
readinessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 10
  failureThreshold: 3
livenessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 6
{{- end }}
{{- end -}}

{{- /* Pods roll when the run config changes, but not for rollout.replicas: the config holds only the count the run
starts with (configmap-config.yaml), so `helm upgrade --set rollout.replicas=N` must start or stop replicas, not
restart the trainer, buffer and weight sync (found by playing the chart: tests/cluster/play/). */ -}}
{{- define "rlfleet.configChecksum" -}}
checksum/config: {{ regexReplaceAll "(?m)^(    rollout:\n(?:      .*\n)*?      replicas:) [0-9]+$" (include (print .Template.BasePath "/configmap-config.yaml") .) "${1} N" | sha256sum }}
{{- end -}}

{{- define "rlfleet.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: "9400"
{{- end -}}

{{/* security.mode, checked: mtls needs a certificate source, and existingSecrets names all five; none renders only
with security.allowInsecure: true. */}}
{{- define "rlfleet.securityMode" -}}
{{- $sec := .Values.security -}}
{{- if and (eq $sec.mode "none") (not $sec.allowInsecure) -}}
{{- fail "security.mode none turns off authentication and encryption for every service of the run: anyone who can reach a pod can take rollout work, feed the buffer samples and read or replace weights. Use mtls (the default) or token; to render it anyway (a throwaway cluster of your own), also set security.allowInsecure: true" -}}
{{- end -}}
{{- if eq $sec.mode "mtls" -}}
{{- with $sec.existingSecrets -}}
{{- range $key := list "trainer" "buffer" "weightSync" "controller" "rollout" -}}
{{- if not (index $sec.existingSecrets $key) -}}
{{- fail (printf "security.existingSecrets.%s is not set: name a Secret for each of trainer, buffer, weightSync, controller and rollout, or use security.certManager" $key) -}}
{{- end -}}
{{- end -}}
{{- if or $.Values.rollout.hpa.enabled $.Values.rollout.keda.enabled (gt (int $.Values.rollout.replicas) 1) -}}
{{- fail "security.existingSecrets gives every rollout replica one identity (rollout-0): use rollout.replicas 1 without autoscaling, or security.certManager (a certificate per replica from the csi-driver)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $sec.mode -}}
{{- end -}}

{{/* The Secret of the weight-signing key (keys tls.key: Ed25519 PKCS8 PEM; tls.crt: a certificate or public key
PEM holding its public key), or "" when weights go unsigned: security.weightSigning.existingSecret, else under mtls
with cert-manager the Secret of the chart's Ed25519 Certificate (certificates.yaml). */}}
{{- define "rlfleet.signingSecret" -}}
{{- $ws := .Values.security.weightSigning -}}
{{- if $ws.enabled -}}
{{- if $ws.existingSecret -}}
{{- $ws.existingSecret -}}
{{- else if eq (include "rlfleet.securityMode" .) "mtls" -}}
{{- if .Values.security.existingSecrets -}}
{{- fail "security.existingSecrets: name the weight-signing key too (security.weightSigning.existingSecret, keys tls.key and tls.crt), or set security.weightSigning.enabled false" -}}
{{- end -}}
{{- include "rlfleet.name" (dict "root" . "component" "weights-signing") -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rlfleet.signingDir" -}}/etc/rlfleet-signing{{- end -}}

{{/* Where each pod finds its certificate (rlfleet.security.identity.load_identity's layout). */}}
{{- define "rlfleet.pkiDir" -}}/etc/rlfleet-pki{{- end -}}

{{/* The issuer of the run's certificates: security.certManager.issuerRef, else the run CA the chart makes. */}}
{{- define "rlfleet.issuerRef" -}}
{{- $ref := .Values.security.certManager.issuerRef -}}
name: {{ default (include "rlfleet.name" (dict "root" . "component" "ca")) $ref.name }}
kind: {{ default "Issuer" $ref.kind }}
group: {{ default "cert-manager.io" $ref.group }}
{{- end -}}

{{/* The Secret holding component `identity`'s certificate (keys tls.crt, tls.key, ca.crt). */}}
{{- define "rlfleet.identitySecret" -}}
{{- $key := ternary "weightSync" .identity (eq .identity "weight_sync") -}}
{{- with .root.Values.security.existingSecrets -}}
{{- index . $key -}}
{{- else -}}
{{- printf "%s-tls" (include "rlfleet.name" (dict "root" .root "component" (.identity | replace "_" "-"))) -}}
{{- end -}}
{{- end -}}

{{/* The volume holding component `identity`'s certificate as <identity>.crt, <identity>.key and ca.crt: its Secret
(mode 0440: the pod's fsGroup reads it), or for a rollout replica under cert-manager its own certificate from the
csi-driver, named for its pod (the replica id). */}}
{{- define "rlfleet.pkiVolume" -}}
{{- $root := .root -}}
- name: pki
{{- if and (eq .identity "rollout") (not $root.Values.security.existingSecrets) }}
{{- $ref := include "rlfleet.issuerRef" $root | fromYaml }}
{{- $svc := include "rlfleet.svcHost" (dict "root" $root "component" "rollout") }}
  csi:
    driver: csi.cert-manager.io
    readOnly: true
    volumeAttributes:
      csi.cert-manager.io/issuer-name: {{ $ref.name | quote }}
      csi.cert-manager.io/issuer-kind: {{ $ref.kind | quote }}
      csi.cert-manager.io/issuer-group: {{ $ref.group | quote }}
      csi.cert-manager.io/uri-sans: "spiffe://rlfleet/rollout/${POD_NAME}"
      csi.cert-manager.io/common-name: "${POD_NAME}"
      csi.cert-manager.io/dns-names: {{ printf "%s,localhost" $svc | quote }}
      csi.cert-manager.io/ip-sans: "127.0.0.1"
      csi.cert-manager.io/key-usages: "server auth,client auth,digital signature"
      csi.cert-manager.io/duration: {{ $root.Values.security.certManager.duration | quote }}
      csi.cert-manager.io/certificate-file: rollout.crt
      csi.cert-manager.io/privatekey-file: rollout.key
      csi.cert-manager.io/ca-file: ca.crt
      csi.cert-manager.io/fs-group: {{ $root.Values.podSecurityContext.fsGroup | quote }}
{{- else }}
  secret:
    secretName: {{ include "rlfleet.identitySecret" . }}
    defaultMode: 0440
    items:
      - {key: tls.crt, path: {{ .identity }}.crt}
      - {key: tls.key, path: {{ .identity }}.key}
      - {key: ca.crt, path: ca.crt}
{{- end }}
{{- end -}}

{{/* mtls: the environment naming the certificate a container presents (services and the health check). */}}
{{- define "rlfleet.identityEnv" -}}
{{- if eq (include "rlfleet.securityMode" .root) "mtls" }}
- name: RLFLEET_IDENTITY
  value: {{ .identity }}
- name: RLFLEET_PKI_DIR
  value: {{ include "rlfleet.pkiDir" .root }}
{{- end }}
{{- end -}}
