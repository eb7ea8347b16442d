{{/* The labels of every object of the chart. */}}
{{- define "apiserver.labels" -}}
app.kubernetes.io/name: evercert-example-apiserver
app.kubernetes.io/part-of: evercert
{{- end }}
