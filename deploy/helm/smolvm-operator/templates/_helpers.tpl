{{/*
The labels of every object: kustomize's `app.kubernetes.io/part-of` (the overlays' kustomization.yaml)
and Helm's own. Pod templates and selectors keep the kustomize install's labels only, so that an
install moved from kustomize to Helm (or back) keeps its selectors.
*/}}
{{- define "smolvm-operator.labels" -}}
app.kubernetes.io/part-of: smolvm-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
An image reference from images.operator or images.runtime: repository@digest when a digest is
given, else repository:tag (the tag defaulting to the chart's appVersion).
Call: include "smolvm-operator.image" (list . .Values.images.operator)
*/}}
{{- define "smolvm-operator.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- if $image.digest -}}
{{ $image.repository }}@{{ $image.digest }}
{{- else -}}
{{ $image.repository }}:{{ $image.tag | default $root.Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
The namespace, fixed: the policy's identities, the webhook configurations' Service reference and
the RBAC subjects name smolvm-system (docs/operations.md, "What gets installed").
*/}}
{{- define "smolvm-operator.namespace" -}}
{{- if ne .Release.Namespace "smolvm-system" -}}
{{- fail (printf "smolvm-operator installs into the namespace smolvm-system only (the policy's identities, the webhook configurations and the RBAC subjects name it), not %q: helm install -n smolvm-system --create-namespace" .Release.Namespace) -}}
{{- end -}}
smolvm-system
{{- end }}
