#!/usr/bin/env bash
# Build the container runtime a lab node's kubelet drives, pinned in versions.env, and cache it
# outside the work tree ($CACHE = ${NODELB_CACHE:-$HOME/.cache/nodelb}). Rebuilds only what is
# missing; prints the directories as CONTAINERD_BIN=, RUNC_BIN=, PAUSE_BIN=, COREDNS_BIN= lines
# on stdout.
#
#   containerd, containerd-shim-runc-v2, ctr   $CACHE/containerd/<CONTAINERD_VERSION>/
#       pure Go (CGO_ENABLED=0) from github.com/containerd/containerd/v2
#   runc                                        $CACHE/runc/<RUNC_VERSION>/runc
#       cgo with the seccomp tag from github.com/opencontainers/runc: needs gcc, pkg-config and
#       libseccomp-dev (make deps)
#   pause                                       $CACHE/pause/<hash of pause.c>/pause
#       nodelb's own sandbox process, lab/images/pause/pause.c, gcc -static -Os
#   coredns                                     $CACHE/coredns/<COREDNS_VERSION>/coredns
#       the lab's cluster DNS, pure Go from github.com/coredns/coredns with its default
#       plugins (the upstream image's binary)
#
# Debian's packages are too old for kubelet 1.37 (containerd 1.6; runc 1.1.5 fails under
# containerd 2.4) and crun 1.8.1 refuses OCI spec 1.3: docs/decisions.md. The Go modules come
# from the module proxy through wrapper modules, as scripts/build-kube.sh does.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../versions.env
source "$ROOT/versions.env"
BUILD_NAME=build-runtime
CACHE="${NODELB_CACHE:-$HOME/.cache/nodelb}"
# shellcheck source=build-lib.sh
source "$ROOT/scripts/build-lib.sh"
CONTAINERD_OUT="$CACHE/containerd/$CONTAINERD_VERSION"
RUNC_OUT="$CACHE/runc/$RUNC_VERSION"
COREDNS_OUT="$CACHE/coredns/$COREDNS_VERSION"
PAUSE_SRC="$ROOT/lab/images/pause/pause.c"
# Keyed by the source alone (lab/binaries.py computes the same key); the flags are fixed here.
PAUSE_OUT="$CACHE/pause/$(sha256sum "$PAUSE_SRC" | cut -c1-16)"
export GOFLAGS="-buildvcs=false -mod=mod"
export GOTOOLCHAIN=local

# wrapper_module DIR NAME MODULE VERSION PACKAGE...: make DIR a module that requires
# MODULE@VERSION and nothing else (so its dependencies are the versions MODULE's own go.mod
# pins) and imports PACKAGE... for `go mod tidy`.
wrapper_module() {
  local dir=$1 name=$2 module=$3 version=$4 pkg
  shift 4
  mkdir -p "$dir"
  cd "$dir"
  printf 'module nodelb.local/%s\n\ngo 1.26.0\n\nrequire %s %s\n' "$name" "$module" "$version" \
    > go.mod
  {
    printf '//go:build tools\n\npackage %s\n\nimport (\n' "$name"
    for pkg in "$@"; do printf '\t_ "%s"\n' "$pkg"; done
    printf ')\n'
  } > tools.go
  quiet tidy.log go mod tidy
}

build_containerd() {
  local module=github.com/containerd/containerd/v2 missing=() b start ld
  for b in containerd containerd-shim-runc-v2 ctr; do
    [[ -x "$CONTAINERD_OUT/$b" ]] || missing+=("$b")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "containerd $CONTAINERD_VERSION cached in $CONTAINERD_OUT"
    return
  fi
  log "building ${missing[*]} $CONTAINERD_VERSION (cold: a few minutes)"
  mkdir -p "$CONTAINERD_OUT"
  wrapper_module "$CACHE/build/containerd-$CONTAINERD_VERSION" containerdbuild \
    "$module" "$CONTAINERD_VERSION" "${missing[@]/#/$module/cmd/}"
  # What containerd's Makefile sets, but the revision: the proxy does not say the commit.
  ld="-s -w -X $module/version.Version=$CONTAINERD_VERSION -X $module/version.Package=$module"
  for b in "${missing[@]}"; do
    start=$SECONDS
    CGO_ENABLED=0 quiet "build-$b.log" \
      go build -trimpath -ldflags "$ld" -o "$CONTAINERD_OUT/$b.tmp" "$module/cmd/$b"
    mv "$CONTAINERD_OUT/$b.tmp" "$CONTAINERD_OUT/$b"
    log "built $b in $((SECONDS - start)) s"
  done
  expect_output "containerd $module $CONTAINERD_VERSION" "$CONTAINERD_OUT/containerd" --version
}

build_runc() {
  local module=github.com/opencontainers/runc start
  if [[ ! -x "$RUNC_OUT/runc" ]]; then
    if ! { command -v gcc && command -v pkg-config && pkg-config --exists libseccomp; } >/dev/null
    then
      log "ERROR: runc needs gcc, pkg-config and libseccomp-dev (make deps installs them)"
      exit 1
    fi
    log "building runc $RUNC_VERSION"
    start=$SECONDS
    mkdir -p "$RUNC_OUT"
    wrapper_module "$CACHE/build/runc-$RUNC_VERSION" runcbuild "$module" "$RUNC_VERSION" "$module"
    # runc embeds its VERSION file; the tags are its Makefile's defaults without libpathrs
    # (an optional Rust library Debian does not package).
    CGO_ENABLED=1 quiet build-runc.log go build -trimpath -tags "seccomp urfave_cli_no_docs" \
      -ldflags "-s -w" -o "$RUNC_OUT/runc.tmp" "$module"
    mv "$RUNC_OUT/runc.tmp" "$RUNC_OUT/runc"
    log "built runc in $((SECONDS - start)) s"
  else
    log "runc $RUNC_VERSION cached in $RUNC_OUT"
  fi
  # Checked on every run: a dynamically linked runc breaks if libseccomp goes away.
  expect_output "runc version ${RUNC_VERSION#v}" "$RUNC_OUT/runc" --version
  expect_output "libseccomp: " "$RUNC_OUT/runc" --version
}

build_pause() {
  [[ -x "$PAUSE_OUT/pause" ]] && { log "pause cached in $PAUSE_OUT"; return; }
  log "building pause from ${PAUSE_SRC#"$ROOT"/}"
  mkdir -p "$PAUSE_OUT"
  quiet "$CACHE/build/pause.log" \
    gcc -static -Os -s -Wall -Wextra -o "$PAUSE_OUT/pause.tmp" "$PAUSE_SRC"
  mv "$PAUSE_OUT/pause.tmp" "$PAUSE_OUT/pause"
  expect_output "nodelb-pause" "$PAUSE_OUT/pause" -v
}

build_coredns() {
  local module=github.com/coredns/coredns start
  if [[ -x "$COREDNS_OUT/coredns" ]]; then
    log "coredns $COREDNS_VERSION cached in $COREDNS_OUT"
    return
  fi
  log "building coredns $COREDNS_VERSION (cold: a few minutes)"
  start=$SECONDS
  mkdir -p "$COREDNS_OUT"
  wrapper_module "$CACHE/build/coredns-$COREDNS_VERSION" corednsbuild "$module" \
    "$COREDNS_VERSION" "$module"
  CGO_ENABLED=0 quiet build-coredns.log go build -trimpath -ldflags "-s -w" \
    -o "$COREDNS_OUT/coredns.tmp" "$module"
  mv "$COREDNS_OUT/coredns.tmp" "$COREDNS_OUT/coredns"
  log "built coredns in $((SECONDS - start)) s"
  expect_output "CoreDNS-${COREDNS_VERSION#v}" "$COREDNS_OUT/coredns" -version
}

# expect_output TEXT CMD...: fail unless CMD's output contains TEXT.
expect_output() {
  local want=$1 out
  shift
  out="$("$@" 2>&1)" || true
  if [[ $out != *"$want"* ]]; then
    log "ERROR: \`$*\` does not report '$want'; it printed:"
    printf '%s\n' "$out" >&2
    exit 1
  fi
}

lock_build runtime
build_pause
build_runc
build_containerd
build_coredns
printf 'CONTAINERD_BIN=%s\nRUNC_BIN=%s\nPAUSE_BIN=%s\nCOREDNS_BIN=%s\n' \
  "$CONTAINERD_OUT" "$RUNC_OUT" "$PAUSE_OUT" "$COREDNS_OUT"
