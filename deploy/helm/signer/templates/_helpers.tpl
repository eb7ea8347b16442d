{{/* The labels of every object of the chart. */}}
{{- define "signer.labels" -}}
app.kubernetes.io/name: evercert-signer
app.kubernetes.io/part-of: evercert
{{- end }}

{{/* The name of the ClusterTrustBundle the signer publishes into, as
cabundle.ClusterTrustBundleName makes it from --signer-name and
--cluster-trust-bundle. */}}
{{- define "signer.clusterTrustBundleName" -}}
{{ replace "/" ":" .Values.signerName }}:{{ .Values.clusterTrustBundle }}
{{- end }}
