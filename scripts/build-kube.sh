#!/usr/bin/env bash
# Build the Kubernetes binaries and etcd from the Go module proxy, pinned in versions.env, and
# cache them outside the work tree keyed by version. Rebuilds only what is missing.
#
#   scripts/build-kube.sh [lab|nodes|all|conformance]...      (no argument: all)
#     lab          etcd, kube-apiserver, kube-proxy, kubectl: the namespace lab's control plane
#     nodes        kubelet, kube-controller-manager, kube-scheduler, agnhost: real nodes (#13)
#     all          lab and nodes
#     conformance  e2e.test and the ginkgo CLI: the upstream e2e suite (issue #14); not in
#                  `all`, so `make setup` does not wait for the largest binary of all
# A caller that needs only the lab's binaries passes `lab` and does not wait for the kubelet.
#
# Why wrapper modules: k8s.io/kubernetes requires its staging repos (k8s.io/api, ...) at
# v0.0.0 and relies on replace directives that only apply inside its own repo. A tiny module
# that requires k8s.io/kubernetes and replaces every staging module with its published
# v0.<minor>.<patch> tag makes `go build k8s.io/kubernetes/cmd/...` work from the proxy alone.
# agnhost, the e2e framework's test server, is a main package of the same module
# (test/images/agnhost). versions.env pins AGNHOST_IMAGE and PAUSE_IMAGE, the references that
# framework uses at KUBE_VERSION; this script fails when they disagree with the module's
# test/utils/image/manifest.go.
# e2e.test is the test binary of k8s.io/kubernetes/test/e2e (`go test -c`, stamped with the
# same version as the others) and ginkgo the CLI of github.com/onsi/ginkgo/v2 at the version
# k8s.io/kubernetes' go.mod requires, built from the same module graph as the suite; the
# script fails when the graph selects another ginkgo than that go.mod names.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../versions.env
source "$ROOT/versions.env"
BUILD_NAME=build-kube
CACHE="${NODELB_CACHE:-$HOME/.cache/nodelb}"
# shellcheck source=build-lib.sh
source "$ROOT/scripts/build-lib.sh"
KUBE_OUT="$CACHE/k8s/$KUBE_VERSION"
ETCD_OUT="$CACHE/etcd/$ETCD_VERSION"
export GOFLAGS="-buildvcs=false -mod=mod"
export GOTOOLCHAIN=local
export CGO_ENABLED=0

LAB_BINARIES=(kube-apiserver kube-proxy kubectl)
NODE_BINARIES=(kubelet kube-controller-manager kube-scheduler agnhost)
CONFORMANCE_BINARIES=(e2e.test ginkgo)
GINKGO_MODULE=github.com/onsi/ginkgo/v2

# kube_package NAME: the Go package of a Kubernetes binary (for e2e.test, the package whose
# test binary it is).
kube_package() {
  case $1 in
    agnhost) echo k8s.io/kubernetes/test/images/agnhost ;;
    e2e.test) echo k8s.io/kubernetes/test/e2e ;;
    ginkgo) echo "$GINKGO_MODULE/ginkgo" ;;
    *) echo "k8s.io/kubernetes/cmd/$1" ;;
  esac
}

# build_kube NAME...: build the named Kubernetes binaries that are not cached; when agnhost is
# among them, also check the pinned e2e image references.
build_kube() {
  local wanted=("$@") missing=() b check_images=0 check_ginkgo=0
  for b in "${wanted[@]}"; do
    [[ -x "$KUBE_OUT/$b" ]] || missing+=("$b")
    [[ $b == agnhost ]] && check_images=1
  done
  # The ginkgo check matters only when ginkgo is built: the directory is keyed by KUBE_VERSION.
  for b in "${missing[@]}"; do
    [[ $b == ginkgo ]] && check_ginkgo=1
  done
  # The check's result is cached next to the binaries: manifest.go never changes for a version.
  if ((check_images)) && [[ -f "$KUBE_OUT/e2e-images.env" ]]; then
    compare_e2e_images "$KUBE_OUT/e2e-images.env"
    check_images=0
  fi
  if [[ ${#missing[@]} -eq 0 && $check_images -eq 0 ]]; then
    log "kubernetes $KUBE_VERSION cached in $KUBE_OUT"
    return
  fi
  local work major minor staging_ver
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
  quiet mod.json go mod download -json "k8s.io/kubernetes@$KUBE_VERSION"
  local gomod moddir
  gomod="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' mod.json)"
  moddir="$(sed -n 's/.*"Dir": "\(.*\)".*/\1/p' mod.json)"
  if [[ ! -f $gomod || ! -d $moddir ]]; then
    log "ERROR: no go.mod or source directory in $PWD/mod.json"
    exit 1
  fi
  grep -Eo 'k8s\.io/[a-z0-9-]+ v0\.0\.0' "$gomod" | awk '{print $1}' | sort -u | while read -r m; do
    printf 'replace %s v0.0.0 => %s %s\n' "$m" "$m" "$staging_ver" >> go.mod
  done
  {
    printf '//go:build tools\n\npackage kubebuild\n\nimport (\n'
    for b in "${missing[@]}"; do printf '\t_ "%s"\n' "$(kube_package "$b")"; done
    printf ')\n'
  } > tools.go
  mkdir -p e2eimages
  cat > e2eimages/main.go <<'GO'
// Command e2eimages prints the agnhost and pause image references that the e2e framework of
// the required k8s.io/kubernetes uses (test/utils/image/manifest.go), as versions.env lines.
package main

import (
	"fmt"

	imageutils "k8s.io/kubernetes/test/utils/image"
)

func main() {
	fmt.Printf("AGNHOST_IMAGE=%s\n", imageutils.GetE2EImage(imageutils.Agnhost))
	fmt.Printf("PAUSE_IMAGE=%s\n", imageutils.GetPauseImageName())
}
GO
  quiet tidy.log go mod tidy
  ((check_ginkgo)) && check_ginkgo_version "$gomod"
  if ((check_images)); then
    # Without the overrides the framework reads from the environment: the defaults are the pins.
    quiet e2e-images.env env -u KUBE_TEST_REPO_LIST -u KUBE_TEST_REPO go run ./e2eimages
    compare_e2e_images e2e-images.env
    cp e2e-images.env "$KUBE_OUT/e2e-images.env"
  fi
  [[ ${#missing[@]} -eq 0 ]] && return
  log "building ${missing[*]} $KUBE_VERSION (cold: takes many minutes)"
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  local start extra
  for b in "${missing[@]}"; do
    start=$SECONDS
    extra=""
    # agnhost reports its own version (test/images/agnhost/VERSION), as its Makefile sets it.
    [[ $b == agnhost ]] && extra=" -X main.Version=$(<"$moddir/test/images/agnhost/VERSION")"
    if [[ $b == e2e.test ]]; then
      # The suite's entry point (TestMain, TestE2E) lives in its _test.go files: only
      # `go test -c` links it. -vet=off: vetting upstream's tests is not this build's job.
      quiet "build-$b.log" go test -c -vet=off -trimpath -ldflags "$ld" \
        -o "$KUBE_OUT/$b.tmp" "$(kube_package "$b")"
    else
      quiet "build-$b.log" go build -trimpath -ldflags "$ld$extra" -o "$KUBE_OUT/$b.tmp" \
        "$(kube_package "$b")"
    fi
    mv "$KUBE_OUT/$b.tmp" "$KUBE_OUT/$b"
    log "built $b in $((SECONDS - start)) s"
  done
}

# check_ginkgo_version GOMOD: fail unless the wrapper module selects the ginkgo that GOMOD
# (k8s.io/kubernetes' go.mod) requires: the CLI must match the library linked into e2e.test.
check_ginkgo_version() {
  local want got
  want="$(awk -v m="$GINKGO_MODULE" '$1 == m { print $2; exit }' "$1")"
  got="$(go list -m -f '{{.Version}}' "$GINKGO_MODULE")"
  if [[ -z $want || $want != "$got" ]]; then
    log "ERROR: k8s.io/kubernetes $KUBE_VERSION requires $GINKGO_MODULE ${want:-<nothing>}," \
      "but the build module selects ${got:-<nothing>}"
    exit 1
  fi
  log "ginkgo $got, as k8s.io/kubernetes $KUBE_VERSION requires"
}

# compare_e2e_images FILE: fail unless FILE (what manifest.go says) matches the versions.env pins.
compare_e2e_images() {
  local key want got bad=0
  for key in AGNHOST_IMAGE PAUSE_IMAGE; do
    want="${!key:-}"
    got="$(sed -n "s/^$key=//p" "$1")"
    if [[ -z $got || $want != "$got" ]]; then
      log "ERROR: versions.env pins $key=${want:-<unset>}, but k8s.io/kubernetes $KUBE_VERSION" \
        "(test/utils/image/manifest.go) uses ${got:-<nothing>}"
      bad=1
    fi
  done
  if ((bad)); then
    log "ERROR: set the references in versions.env to what the e2e framework at $KUBE_VERSION uses"
    exit 1
  fi
}

build_etcd() {
  [[ -x "$ETCD_OUT/etcd" ]] && { log "etcd $ETCD_VERSION cached in $ETCD_OUT"; return; }
  log "building etcd $ETCD_VERSION"
  local work="$CACHE/build/etcd-$ETCD_VERSION" start=$SECONDS
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
  quiet tidy.log go mod tidy
  quiet build.log go build -trimpath -ldflags "-s -w" -o "$ETCD_OUT/etcd.tmp" .
  mv "$ETCD_OUT/etcd.tmp" "$ETCD_OUT/etcd"
  log "built etcd in $((SECONDS - start)) s"
}

want_etcd=0
kube_wanted=()
(($#)) || set -- all
for group in "$@"; do
  case $group in
    lab) want_etcd=1; kube_wanted+=("${LAB_BINARIES[@]}") ;;
    nodes) kube_wanted+=("${NODE_BINARIES[@]}") ;;
    all) want_etcd=1; kube_wanted+=("${LAB_BINARIES[@]}" "${NODE_BINARIES[@]}") ;;
    conformance) kube_wanted+=("${CONFORMANCE_BINARIES[@]}") ;;
    *) echo "usage: $0 [lab|nodes|all|conformance]..." >&2; exit 2 ;;
  esac
done

lock_build "k8s-$KUBE_VERSION"
((want_etcd)) && build_etcd
build_kube "${kube_wanted[@]}"
# Print the cache directories for callers (Makefile, test fixtures).
printf 'KUBE_BIN=%s\nETCD_BIN=%s\n' "$KUBE_OUT" "$ETCD_OUT"
