#!/usr/bin/env bash
# Render the all-in-one manifests from the Helm chart with its default values, so the chart is
# the one source of truth: deploy/daemonset.yaml (everything but the admission policies) and
# deploy/admission-policy.yaml. Writes into the folder given (default: deploy/);
# tests/unit/test_chart.py renders into a temporary one and fails when the files differ.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/deploy}"
HELM="${HELM:-$("$ROOT/scripts/build-helm.sh" | sed -n 's/^HELM=//p')}"
CHART="$ROOT/deploy/helm/nodelb"

render() {
  # helm reports the chart's symlinks (files/) on stderr at INFO level: not an error.
  "$HELM" template nodelb "$CHART" --namespace nodelb-system "$@" 2>/dev/null
}

render -s templates/00-header.yaml -s templates/namespace.yaml -s templates/rbac.yaml \
  -s templates/configmap.yaml -s templates/agent.yaml -s templates/controller.yaml \
  > "$OUT/daemonset.yaml.tmp"
render -s templates/admission-policy.yaml > "$OUT/admission-policy.yaml.tmp"
mv "$OUT/daemonset.yaml.tmp" "$OUT/daemonset.yaml"
mv "$OUT/admission-policy.yaml.tmp" "$OUT/admission-policy.yaml"
