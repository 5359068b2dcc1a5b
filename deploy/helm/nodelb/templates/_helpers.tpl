{{/* A CEL list literal of strings: ['a', 'b']. */}}
{{- define "nodelb.celList" -}}
[{{ range $i, $v := . }}{{ if $i }}, {{ end }}'{{ $v }}'{{ end }}]
{{- end }}

{{/* Every pool address the chart knows (configPools and pools), as a YAML list; a range
fails the render, since the admission policy can hold only CIDRs. */}}
{{- define "nodelb.poolCIDRs" -}}
{{- $out := list -}}
{{- $pools := concat (.Values.configPools | default list) (.Values.pools | default list) -}}
{{- range $pools -}}
{{- $addresses := .addresses | default (dig "spec" "addresses" list .) -}}
{{- range $addresses -}}
{{- if contains "-" . -}}
{{- fail (printf "pool address %s is a range: with admissionPolicy.enabled, pools given to the chart must be CIDRs (the policy's poolCIDRs holds CIDRs only)" .) -}}
{{- end -}}
{{- $out = append $out . -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end }}
