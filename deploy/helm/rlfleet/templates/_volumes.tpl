{{/* Volumes of a service pod: the run config, model and checkpoint storage, scratch, and (mtls) the certificate
of component `identity`. */}}
{{- define "rlfleet.volumes" -}}
- name: config
  configMap:
    name: {{ include "rlfleet.name" (dict "root" .root "component" "config") }}
- name: tmp
  emptyDir: {}
{{- if .storage }}
- name: model
  persistentVolumeClaim:
    claimName: {{ default (include "rlfleet.name" (dict "root" .root "component" "model")) .root.Values.storage.model.existingClaim }}
    {{- /* Read-only everywhere but in trainer pods that build it (model.prepare): there only their init container
    mounts it writable; every service container mounts it read-only. */}}
    readOnly: {{ not (and (eq .identity "trainer") .root.Values.runConfig.model.prepare) }}
{{- if eq .identity "trainer" }}
{{- /* The checkpoint volume reaches trainer pods only: no other pod can hide, replace or roll back a sealed
checkpoint (a read-only subPath overlay on a writable mount could be side-stepped by renaming its parent). */}}
- name: data
  persistentVolumeClaim:
    claimName: {{ default (include "rlfleet.name" (dict "root" .root "component" "checkpoints")) .root.Values.storage.checkpoints.existingClaim }}
{{- else }}
{{- /* Everyone else's run folder (metrics, logs) is the pod's own scratch. */}}
- name: data
  emptyDir: {}
{{- end }}
{{- if and (include "rlfleet.deltaVolume" .root) (has .identity (list "trainer" "rollout")) }}
{{- /* disk_delta's files: a volume of their own, written by trainer pods, read-only in rollout pods. */}}
- name: deltas
  persistentVolumeClaim:
    claimName: {{ default (include "rlfleet.name" (dict "root" .root "component" "deltas")) .root.Values.storage.deltas.existingClaim }}
    readOnly: {{ ne .identity "trainer" }}
{{- end }}
{{- end }}
{{- if and .identity (eq (include "rlfleet.securityMode" .root) "mtls") }}
{{ include "rlfleet.pkiVolume" (dict "root" .root "identity" .identity) }}
{{- end }}
{{- $signing := include "rlfleet.signingSecret" .root }}
{{- if and $signing (has .identity (list "trainer" "rollout")) }}
{{- /* The private key reaches trainer pods only; replicas get the public half (a Secret volume mounts the items it
lists and no others). */}}
- name: signing
  secret:
    secretName: {{ $signing }}
    defaultMode: 0440
    items:
      - {key: tls.crt, path: weights-signing.crt}
      {{- if eq .identity "trainer" }}
      - {key: tls.key, path: weights-signing.key}
      {{- end }}
{{- end }}
{{- if .gpu }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .root.Values.gpuPod.sharedMemorySize }}
{{- end }}
{{- end -}}

{{- define "rlfleet.volumeMounts" -}}
- name: config
  mountPath: /etc/rlfleet
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .storage }}
- name: model
  mountPath: /models
  readOnly: {{ not .writeModel }}
- name: data
  mountPath: /data
{{- if and (include "rlfleet.deltaVolume" .root) (has .identity (list "trainer" "rollout")) }}
- name: deltas
  mountPath: {{ include "rlfleet.deltaDir" .root }}
  readOnly: {{ ne .identity "trainer" }}
{{- end }}
{{- end }}
{{- if and .identity (eq (include "rlfleet.securityMode" .root) "mtls") }}
- name: pki
  mountPath: {{ include "rlfleet.pkiDir" .root }}
  readOnly: true
{{- end }}
{{- if and (include "rlfleet.signingSecret" .root) (has .identity (list "trainer" "rollout")) }}
- name: signing
  mountPath: {{ include "rlfleet.signingDir" .root }}
  readOnly: true
{{- end }}
{{- if .gpu }}
- name: dshm
  mountPath: /dev/shm
{{- end }}
{{- end -}}


{{/* "true" when the run's weight transport may use delta files (disk_delta, or auto, which may pick it). */}}
{{- define "rlfleet.deltaVolume" -}}
{{- $ws := default dict .Values.runConfig.weight_sync -}}
{{- if has (default "bucketed" $ws.transport) (list "disk_delta" "auto") }}true{{ end -}}
{{- end -}}

{{/* Where the delta volume is mounted: weight_sync.delta_dir in the rendered config. */}}
{{- define "rlfleet.deltaDir" -}}/deltas{{- end -}}
