#!/usr/bin/env bash
# Build kube-apiserver, kube-proxy, kubectl and etcd from the Go module proxy, pinned, and
# cache them outside the work tree keyed by version. Rebuilds only what is missing.
#
# Why wrapper modules: k8s.io/kubernetes requires its staging repos (k8s.io/api, ...) at
# v0.0.0 and relies on replace directives that only apply inside its own repo. A tiny module
# that requires k8s.io/kubernetes and replaces every staging module with its published
# v0.<minor>.<patch> tag makes `go build k8s.io/kubernetes/cmd/...` work from the proxy alone.
set -euo pipefail

# shellcheck source=../versions.env
source "$(cd "$(dirname "$0")/.." && pwd)/versions.env"
CACHE="${NODELB_CACHE:-$HOME/.cache/nodelb}"
KUBE_OUT="$CACHE/k8s/$KUBE_VERSION"
ETCD_OUT="$CACHE/etcd/$ETCD_VERSION"
export GOFLAGS="-buildvcs=false -mod=mod"
export GOTOOLCHAIN=local
export CGO_ENABLED=0

log() { printf '[build-kube] %s\n' "$*" >&2; }

build_kube() {
  local missing=()
  for b in kube-apiserver kube-proxy kubectl; do
    [[ -x "$KUBE_OUT/$b" ]] || missing+=("$b")
  done
  [[ ${#missing[@]} -eq 0 ]] && { log "kubernetes $KUBE_VERSION cached in $KUBE_OUT"; return; }
  log "building ${missing[*]} $KUBE_VERSION (cold: takes many minutes)"
  local work staging_ver major minor
  work="$CACHE/build/k8s-$KUBE_VERSION"
  mkdir -p "$work" "$KUBE_OUT"
  major="${KUBE_VERSION#v}"; major="${major%%.*}"
  minor="${KUBE_VERSION#v*.}"; minor="${minor%%.*}"
  staging_ver="v0.${KUBE_VERSION#v*.}"
  cd "$work"
  cat > go.mod <<MOD
module nodelb.local/kubebuild

go 1.26.0

require k8s.io/kubernetes $KUBE_VERSION
MOD
  # The staging modules are the k8s.io/* requirements pinned at v0.0.0 in k8s.io/kubernetes' go.mod.
  go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" > mod.json
  local gomod
  gomod="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' mod.json)"
  grep -Eo 'k8s\.io/[a-z0-9-]+ v0\.0\.0' "$gomod" | awk '{print $1}' | sort -u | while read -r m; do
    printf 'replace %s v0.0.0 => %s %s\n' "$m" "$m" "$staging_ver" >> go.mod
  done
  cat > tools.go <<'GO'
//go:build tools

package kubebuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  go mod tidy
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for b in "${missing[@]}"; do
    log "go build $b"
    go build -trimpath -ldflags "$ld" -o "$KUBE_OUT/$b.tmp" "k8s.io/kubernetes/cmd/$b"
    mv "$KUBE_OUT/$b.tmp" "$KUBE_OUT/$b"
  done
}

build_etcd() {
  [[ -x "$ETCD_OUT/etcd" ]] && { log "etcd $ETCD_VERSION cached in $ETCD_OUT"; return; }
  log "building etcd $ETCD_VERSION"
  local work="$CACHE/build/etcd-$ETCD_VERSION"
  mkdir -p "$work" "$ETCD_OUT"
  cd "$work"
  cat > go.mod <<MOD
module nodelb.local/etcdbuild

go 1.26.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
MOD
  cat > main.go <<'GO'
// Command etcd is etcd's own entry point, built from the published server module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  go mod tidy
  go build -trimpath -ldflags "-s -w" -o "$ETCD_OUT/etcd.tmp" .
  mv "$ETCD_OUT/etcd.tmp" "$ETCD_OUT/etcd"
}

build_etcd
build_kube
# Print the cache directories for callers (Makefile, test fixtures).
printf 'KUBE_BIN=%s\nETCD_BIN=%s\n' "$KUBE_OUT" "$ETCD_OUT"
