#!/usr/bin/env bash
# Build promtool from the Go module proxy, pinned, and cache it outside the work tree keyed by
# version (~/.cache/nodelb/promtool/<version>/promtool). Does nothing when it is cached.
#
# Why a wrapper module: `go install module@version` refuses modules whose go.mod has replace
# directives and gives no say over flags; a tiny module that requires
# github.com/prometheus/prometheus and imports cmd/promtool builds it like scripts/build-kube.sh
# builds the Kubernetes binaries. Prints PROMTOOL=<path> on stdout.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../versions-promtool.env
source "$ROOT/versions-promtool.env"
CACHE="${NODELB_CACHE:-$HOME/.cache/nodelb}"
OUT="$CACHE/promtool/$PROMTOOL_VERSION"
export GOFLAGS="-buildvcs=false -mod=mod"
export GOTOOLCHAIN=local
export CGO_ENABLED=0

log() { printf '[build-promtool] %s\n' "$*" >&2; }

if [[ -x "$OUT/promtool" ]]; then
  log "promtool $PROMTOOL_VERSION cached in $OUT"
else
  log "building promtool $PROMTOOL_VERSION (cold: takes a few minutes)"
  work="$CACHE/build/promtool-$PROMTOOL_VERSION"
  mkdir -p "$work" "$OUT"
  cd "$work"
  cat > go.mod <<MOD
module nodelb.local/promtoolbuild

go 1.26.0

require github.com/prometheus/prometheus $PROMTOOL_VERSION
MOD
  cat > tools.go <<'GO'
//go:build tools

package promtoolbuild

import _ "github.com/prometheus/prometheus/cmd/promtool"
GO
  go mod tidy
  # Module v0.X.Y.Z is Prometheus (X/100).(X%100).Z; promtool --version reports it.
  minor="${PROMTOOL_VERSION#v0.}"; minor="${minor%%.*}"
  patch="${PROMTOOL_VERSION##*.}"
  release="$((minor / 100)).$((minor % 100)).$patch"
  ld="-s -w -X github.com/prometheus/common/version.Version=$release"
  ld+=" -X github.com/prometheus/common/version.Revision=$PROMTOOL_VERSION"
  ld+=" -X github.com/prometheus/common/version.Branch=release"
  ld+=" -X github.com/prometheus/common/version.BuildDate=19700101-00:00:00"
  # remove_all_sd leaves out every service-discovery plugin (AWS, Azure, GCE, Kubernetes, ...):
  # only `promtool check service-discovery` needs them, and they are most of the compile time.
  go build -tags remove_all_sd -trimpath -ldflags "$ld" -o "$OUT/promtool.tmp" \
    github.com/prometheus/prometheus/cmd/promtool
  mv "$OUT/promtool.tmp" "$OUT/promtool"
fi
printf 'PROMTOOL=%s\n' "$OUT/promtool"
