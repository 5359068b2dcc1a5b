#!/usr/bin/env bash
# Build helm from the Go module proxy, pinned, and cache it outside the work tree keyed by
# version (~/.cache/nodelb/helm/<version>/helm). Does nothing when it is cached.
#
# A wrapper module that requires helm.sh/helm/v4 and imports cmd/helm, as
# scripts/build-promtool.sh does for promtool (`go install` refuses replace directives and
# gives no say over the flags). Prints HELM=<path> on stdout.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../versions-helm.env
source "$ROOT/versions-helm.env"
CACHE="${NODELB_CACHE:-$HOME/.cache/nodelb}"
OUT="$CACHE/helm/$HELM_VERSION"
export GOFLAGS="-buildvcs=false -mod=mod"
export GOTOOLCHAIN=local
export CGO_ENABLED=0

BUILD_NAME=build-helm
# shellcheck source=build-lib.sh
source "$ROOT/scripts/build-lib.sh"

if [[ -x "$OUT/helm" ]]; then
  log "helm $HELM_VERSION cached in $OUT"
else
  log "building helm $HELM_VERSION (cold: takes a few minutes)"
  lock_build "helm-$HELM_VERSION"  # worktrees share the cache: one build at a time
  if [[ -x "$OUT/helm" ]]; then  # built by the holder of the lock meanwhile
    printf 'HELM=%s\n' "$OUT/helm"
    exit 0
  fi
  work="$CACHE/build/helm-$HELM_VERSION"
  mkdir -p "$work" "$OUT"
  cd "$work"
  cat > go.mod <<MOD
module nodelb.local/helmbuild

go 1.26.0

require helm.sh/helm/v4 $HELM_VERSION
MOD
  cat > tools.go <<'GO'
//go:build tools

package helmbuild

import _ "helm.sh/helm/v4/cmd/helm"
GO
  quiet go-mod-tidy.log go mod tidy
  # `helm version` reports what internal/version holds; set it as helm's own Makefile does.
  ld="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
  ld+=" -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
  quiet go-build.log go build -trimpath -ldflags "$ld" -o "$OUT/helm.tmp" helm.sh/helm/v4/cmd/helm
  mv "$OUT/helm.tmp" "$OUT/helm"
fi
printf 'HELM=%s\n' "$OUT/helm"
