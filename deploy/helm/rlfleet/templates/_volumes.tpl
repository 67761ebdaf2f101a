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
    readOnly: true
- name: data
  persistentVolumeClaim:
    claimName: {{ default (include "rlfleet.name" (dict "root" .root "component" "checkpoints")) .root.Values.storage.checkpoints.existingClaim }}
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
  readOnly: true
- name: data
  mountPath: /data
{{- if not .writeCheckpoints }}
{{- /* Only trainer pods write checkpoints: everyone else sees the run's checkpoint folder read-only. */}}
- name: data
  mountPath: /data/runs/{{ .root.Values.runConfig.run.name }}/checkpoints
  subPath: runs/{{ .root.Values.runConfig.run.name }}/checkpoints
  readOnly: true
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
