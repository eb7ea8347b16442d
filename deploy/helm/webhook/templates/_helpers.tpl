{{/* The labels of every object of the chart. */}}
{{- define "webhook.labels" -}}
app.kubernetes.io/name: evercert-example-webhook
app.kubernetes.io/part-of: evercert
{{- end }}
