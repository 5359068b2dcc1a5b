#!/usr/bin/env bash
# Build the container images the lab's nodes import into containerd, as OCI archives cached
# outside the work tree (no registry is reachable from the lab; `ctr -n k8s.io images import`
# names each image after the archive's org.opencontainers.image.ref.name annotation).
#
#   scripts/build-images.sh [nodelb|pause|agnhost|coredns ...]   build what is missing (default: all)
#   scripts/build-images.sh --list                        only print them, build nothing
#
# Prints one line per image on stdout, "<reference><TAB><archive>"; logs to stderr only when it
# builds something, and keeps each tool's output in $CACHE/images/logs/, shown on failure.
#
#   base     docker.io/library/debian:bookworm-slim, the FROM of deploy/Containerfile, made by
#            mmdebstrap from Debian packages (minbase, docs/man/locales left out like Debian's
#            slim images) and committed into buildah's storage under that reference. Cached
#            as a rootfs tarball keyed by a hash of the recipe below; re-committed (same image
#            ID) when the storage lost it.
#   nodelb   deploy/Containerfile built as a user would (`buildah bud -f deploy/Containerfile .`),
#            tagged with the image deploy/daemonset.yaml runs. Keyed by a hash of the build's
#            inputs (git-tracked content plus uncommitted changes) and the base recipe.
#   pause    PAUSE_IMAGE (versions.env): lab/images/pause/Containerfile over the static pause
#            binary. agnhost: AGNHOST_IMAGE over the agnhost binary built at KUBE_VERSION.
#            Rebuilt in place when the binary, the Containerfile or the base recipe changes.
#   coredns  COREDNS_IMAGE: lab/images/coredns/Containerfile over the coredns binary
#            scripts/build-runtime.sh builds at COREDNS_VERSION (the real-node lab's DNS).
#
# Needs root (mmdebstrap's root mode, buildah's storage in /var/lib/containers). Storage driver:
# overlay (kernel overlayfs, root, no fuse-overlayfs); NODELB_STORAGE_DRIVER overrides it.
# RUN steps share the host's network and run with chroot isolation: buildah creates no network,
# bridge or firewall rule, and needs no OCI runtime.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../versions.env
source "$ROOT/versions.env"
CACHE="${NODELB_CACHE:-$HOME/.cache/nodelb}"
IMAGES="$CACHE/images"
LOGS="$IMAGES/logs"
STORAGE_DRIVER="${NODELB_STORAGE_DRIVER:-overlay}"
# The binaries scripts/build-kube.sh and scripts/build-runtime.sh build (pause keyed, as there,
# by the first 16 hex digits of its source's SHA-256).
AGNHOST_BIN="${NODELB_AGNHOST_BIN:-$CACHE/k8s/$KUBE_VERSION/agnhost}"
COREDNS_BIN="${NODELB_COREDNS_BIN:-$CACHE/coredns/$COREDNS_VERSION}/coredns"
PAUSE_SRC="$ROOT/lab/images/pause/pause.c"
PAUSE_BIN="${NODELB_PAUSE_BIN:-}"
if [[ -z "$PAUSE_BIN" && -f "$PAUSE_SRC" ]]; then
  PAUSE_BIN="$CACHE/pause/$(sha256sum "$PAUSE_SRC" | cut -c1-16)/pause"
fi
# Certificate authorities the host's admin added (Debian's update-ca-certificates directory),
# trusted by the build stages too: when the ca-certificates package is installed there it
# folds them into the bundle pip verifies against, so a build behind a TLS-inspecting proxy
# works. Only the stages before the last see them, so they never reach a shipped image (see
# build_nodelb). Set NODELB_BUILD_CA_DIR empty to not mount it.
BUILD_CA_DIR="${NODELB_BUILD_CA_DIR-/usr/local/share/ca-certificates}"

log() { printf '[build-images] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# run LOG CMD...: run CMD with its output appended to LOG; on failure show the log's end.
run() {
  local logfile="$1"
  shift
  if ! "$@" >>"$logfile" 2>&1; then
    log "failed: $*"
    tail -n 40 "$logfile" | sed 's/^/  | /' >&2
    die "full log: $logfile"
  fi
}

buildah_() { nice -n 10 buildah --storage-driver "$STORAGE_DRIVER" "$@"; }

sha() { sha256sum | cut -c1-16; }

# -- the base: Debian bookworm slim from Debian packages -----------------------------------
BASE_REF=docker.io/library/debian:bookworm-slim
BASE_SOURCES='Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
'
# Images keep no .deb files or apt binary caches in their layers: what Debian's own images
# configure, and what `rm -rf /var/lib/apt/lists/*` in a Containerfile relies on for the rest.
BASE_APT_CLEAN='// A container image: no downloaded packages or apt binary caches left in a layer.
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
'
BASE_ARGS=(
  --mode=root --variant=minbase --format=tar
  # bookworm's init-system-helpers needs merged /usr: set it up directly instead of letting
  # apt pull usrmerge, which drags perl into the image.
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  # /dev is the container runtime's business.
  --skip=output/dev
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/groff/*'
  --dpkgopt='path-exclude=/usr/share/lintian/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-include=/usr/share/locale/locale.alias'
  --aptopt='Acquire::Languages "none"'
)
# Run last: mmdebstrap copies the host's resolv.conf and hostname in (a runtime provides
# both), and its own cleanup misses apt's binary caches once docker-clean empties their names.
# shellcheck disable=SC2016 # $1 is the hook's argument, expanded by mmdebstrap's shell
BASE_FINAL_HOOK='rm -f "$1/etc/resolv.conf" "$1/etc/hostname" "$1"/var/cache/apt/*.bin'
BASE_KEY="$(printf '%s\n' "${BASE_ARGS[@]}" "$BASE_SOURCES" "$BASE_APT_CLEAN" "$BASE_FINAL_HOOK" | sha)"
BASE_DIR="$IMAGES/debian-bookworm-slim/$BASE_KEY"

stamp_get() { sed -n "s/^$2=//p" "$1" 2>/dev/null || true; }

build_base() {
  [[ -f "$BASE_DIR/stamp" && -f "$BASE_DIR/rootfs.tar" ]] && return
  log "building $BASE_REF with mmdebstrap (recipe $BASE_KEY)"
  local tmp epoch
  tmp="$(mktemp -d "$IMAGES/tmp.XXXXXX")"
  printf '%s' "$BASE_SOURCES" >"$tmp/debian.sources"
  printf '%s' "$BASE_APT_CLEAN" >"$tmp/docker-clean"
  epoch="$(date +%s)"
  # A private mount namespace: whatever mmdebstrap mounts in its chroot goes away with it.
  SOURCE_DATE_EPOCH="$epoch" run "$LOGS/base.log" \
    nice -n 10 unshare --mount --propagation private --pid --fork \
    mmdebstrap --quiet "${BASE_ARGS[@]}" \
    --customize-hook="upload $tmp/docker-clean /etc/apt/apt.conf.d/docker-clean" \
    --customize-hook="$BASE_FINAL_HOOK" \
    bookworm "$tmp/rootfs.tar" "$tmp/debian.sources"
  mkdir -p "$BASE_DIR"
  mv "$tmp/rootfs.tar" "$BASE_DIR/rootfs.tar"
  rm -rf "$tmp"
  printf 'recipe=%s\nepoch=%s\nbuilt=%s\n' "$BASE_KEY" "$epoch" "$(date -u +%FT%TZ)" \
    >"$BASE_DIR/stamp"
}

# Commit the cached rootfs into buildah's storage as BASE_REF unless it is already there. The
# commit is reproducible (fixed timestamp), so the image ID recorded in the stamp tells.
load_base() {
  build_base
  local want have epoch ctr id
  want="$(stamp_get "$BASE_DIR/stamp" image_id)"
  have="$(buildah_ inspect --type image --format '{{.FromImageID}}' "$BASE_REF" 2>/dev/null || true)"
  [[ -n "$want" && "$want" == "$have" ]] && return
  log "committing $BASE_REF into buildah storage ($STORAGE_DRIVER)"
  epoch="$(stamp_get "$BASE_DIR/stamp" epoch)"
  ctr="$(buildah_ from --quiet scratch 2>>"$LOGS/base.log")"
  run "$LOGS/base.log" buildah_ add --quiet "$ctr" "$BASE_DIR/rootfs.tar" /
  run "$LOGS/base.log" buildah_ config \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd '["bash"]' "$ctr"
  id="$(buildah_ commit --quiet --rm --timestamp "$epoch" "$ctr" "$BASE_REF" 2>>"$LOGS/base.log")"
  sed -i '/^image_id=/d' "$BASE_DIR/stamp"
  printf 'image_id=%s\n' "$id" >>"$BASE_DIR/stamp"
}

# -- the archives ---------------------------------------------------------------------------
# The reference deploy/daemonset.yaml runs (all its image: lines name the same one). The file
# is rendered by helm, which writes the value in double quotes: take what is inside them.
nodelb_ref() {
  local refs
  refs="$(sed -n 's/^[[:space:]]*image:[[:space:]]*"\{0,1\}\([^"[:space:]]*\).*/\1/p' \
    "$ROOT/deploy/daemonset.yaml" | sort -u)"
  [[ -n "$refs" && "$refs" != *$'\n'* ]] ||
    die "deploy/daemonset.yaml: expected one image reference, found: ${refs:-none}"
  printf '%s\n' "$refs"
}
NODELB_REF="$(nodelb_ref)"
NODELB_INPUTS=(deploy/Containerfile deploy/Containerfile.dockerignore pyproject.toml README.md
  agent rules)

# The hash of what the nodelb image is built from: mode, git blob and path of every input file
# as it is in the work tree (committed or not, untracked but not ignored included), the
# reference and the base recipe. Committing a change does not move it; nothing else does.
nodelb_key() {
  git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
    die "$ROOT is not a git checkout: the nodelb image's cache key is made from git"
  local -A changed=()
  local f mode
  while IFS= read -r -d '' f; do
    changed["$f"]=1
  done < <(git -C "$ROOT" ls-files -z -m -o --exclude-standard -- "${NODELB_INPUTS[@]}")
  {
    printf 'ref %s\nbase %s\n' "$NODELB_REF" "$BASE_KEY"
    # Unchanged files: the index has their blob. Changed ones: hash what is on disk.
    git -C "$ROOT" ls-files -s -z -- "${NODELB_INPUTS[@]}" | while IFS= read -r -d '' f; do
      [[ -n "${changed["${f#*$'\t'}"]:-}" ]] || printf '%s\n' "$f"
    done
    for f in "${!changed[@]}"; do
      [[ -f "$ROOT/$f" ]] || continue
      mode=100644
      [[ -x "$ROOT/$f" ]] && mode=100755
      printf '%s %s 0\t%s\n' "$mode" "$(git -C "$ROOT" hash-object -- "$f")" "$f"
    done
  } | LC_ALL=C sort | sha
}

nodelb_archive() { printf '%s/nodelb/%s/nodelb.oci.tar' "$IMAGES" "$1"; }
pause_archive() { printf '%s/pause/%s/pause.oci.tar' "$IMAGES" "${PAUSE_IMAGE##*:}"; }
agnhost_archive() { printf '%s/agnhost/%s/agnhost.oci.tar' "$IMAGES" "${AGNHOST_IMAGE##*:}"; }
coredns_archive() { printf '%s/coredns/%s/coredns.oci.tar' "$IMAGES" "${COREDNS_IMAGE##*:}"; }

# write_stamp ARCHIVE REF KEY: record the key and the sizes next to a finished archive. The
# unpacked size is that of the layers' uncompressed tar streams (what a snapshotter unpacks).
write_stamp() {
  local archive="$1" ref="$2" key="$3" unpacked
  unpacked="$(python3 - "$archive" <<'PY'
import gzip, json, sys, tarfile

with tarfile.open(sys.argv[1]) as tar:
    def blob(digest):
        return tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1])

    index = json.load(tar.extractfile("index.json"))
    manifest = json.load(blob(index["manifests"][0]["digest"]))
    total = 0
    for layer in manifest["layers"]:
        raw = blob(layer["digest"])
        stream = gzip.open(raw) if layer["mediaType"].endswith("gzip") else raw
        while chunk := stream.read(1 << 20):
            total += len(chunk)
    print(total)
PY
)"
  printf 'ref=%s\nkey=%s\narchive_bytes=%s\nunpacked_bytes=%s\nbuilt=%s\n' "$ref" "$key" \
    "$(stat -c %s "$archive")" "$unpacked" "$(date -u +%FT%TZ)" >"$(dirname "$archive")/stamp"
  log "$ref: $(numfmt --to=iec "$(stat -c %s "$archive")") archive, $(numfmt --to=iec "$unpacked") unpacked"
}

# export_archive REF ARCHIVE KEY: push REF from storage into an OCI archive, atomically.
export_archive() {
  local ref="$1" archive="$2" key="$3" name
  name="$(basename "$archive" .oci.tar)"
  mkdir -p "$(dirname "$archive")"
  rm -f "$archive.tmp"
  run "$LOGS/$name.log" buildah_ push --quiet "$ref" "oci-archive:$archive.tmp:$ref"
  mv "$archive.tmp" "$archive"
  write_stamp "$archive" "$ref" "$key"
}

BUD=(bud --quiet --pull=never --layers --force-rm --isolation chroot --network host)

# The names of deploy/Containerfile's stages before the last one (unnamed ones skipped).
early_stages() {
  awk 'toupper($1) == "FROM" { n++; name[n] = (toupper($(NF-1)) == "AS") ? $NF : "" }
       END { for (i = 1; i < n; i++) if (name[i] != "") print name[i] }' \
    "$ROOT/deploy/Containerfile"
}

# nodelb: the earlier stages first, with the host's added CAs mounted (pip downloads there),
# then the whole file without them. The second pass reuses those stages' cached layers, so no
# stage it builds sees the mount (buildah leaves mount points behind in a layer).
build_nodelb() {
  local key archive stage
  key="$(nodelb_key)"
  archive="$(nodelb_archive "$key")"
  if [[ -f "$archive" && -f "$(dirname "$archive")/stamp" ]]; then
    touch "$(dirname "$archive")"
    return
  fi
  log "building $NODELB_REF from deploy/Containerfile (inputs $key)"
  load_base
  : >"$LOGS/nodelb.log"
  local build=(--ignorefile "$ROOT/deploy/Containerfile.dockerignore"
    -f "$ROOT/deploy/Containerfile")
  if [[ -n "$BUILD_CA_DIR" ]] && compgen -G "$BUILD_CA_DIR/*.crt" >/dev/null; then
    for stage in $(early_stages); do
      run "$LOGS/nodelb.log" buildah_ "${BUD[@]}" "${build[@]}" \
        -v "$BUILD_CA_DIR:/usr/local/share/ca-certificates:ro" --target "$stage" "$ROOT"
    done
  fi
  run "$LOGS/nodelb.log" buildah_ "${BUD[@]}" "${build[@]}" -t "$NODELB_REF" "$ROOT"
  export_archive "$NODELB_REF" "$archive" "$key"
  prune_nodelb
}

# Keep the most recently used nodelb archives (a few work trees or changes), drop the rest.
prune_nodelb() {
  find "$IMAGES/nodelb" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %p\n' | sort -rn |
    tail -n +"$((${NODELB_IMAGES_KEEP:-4} + 1))" | cut -d' ' -f2- | xargs -r -d '\n' rm -rf --
}

# have_binary NAME PATH: whether the binary an image wraps is built; says so when it is not.
have_binary() {
  [[ -n "$2" && -x "$2" ]] && return
  log "$1: no binary at ${2:-(none: no $PAUSE_SRC in this checkout)}" \
    "(scripts/build-kube.sh and scripts/build-runtime.sh build them; NODELB_${1^^}_BIN overrides)"
  return 1
}

# build_binary_image NAME REF BINARY [base]: lab/images/NAME/Containerfile over a context
# holding only BINARY (as NAME), rebuilt when the binary or the recipe changed.
build_binary_image() {
  local name="$1" ref="$2" bin="$3" base="${4:-}" archive key ctx
  archive="$("${name}_archive")"
  key="$({
    printf 'ref %s\nbase %s\n' "$ref" "${base:+$BASE_KEY}"
    sha256sum <"$ROOT/lab/images/$name/Containerfile"
    sha256sum <"$bin"
  } | sha)"
  [[ -f "$archive" && "$(stamp_get "$(dirname "$archive")/stamp" key)" == "$key" ]] && return
  log "building $ref from lab/images/$name/Containerfile and $bin ($key)"
  [[ -n "$base" ]] && load_base
  : >"$LOGS/$name.log"
  ctx="$(mktemp -d "$IMAGES/tmp.XXXXXX")"
  cp "$bin" "$ctx/$name"
  chmod 0755 "$ctx/$name"
  run "$LOGS/$name.log" buildah_ "${BUD[@]}" -f "$ROOT/lab/images/$name/Containerfile" \
    -t "$ref" "$ctx"
  rm -rf "$ctx"
  export_archive "$ref" "$archive" "$key"
}

list() {
  printf '%s\t%s\n' "$NODELB_REF" "$(nodelb_archive "$(nodelb_key)")" \
    "$PAUSE_IMAGE" "$(pause_archive)" \
    "$AGNHOST_IMAGE" "$(agnhost_archive)" \
    "$COREDNS_IMAGE" "$(coredns_archive)"
}

main() {
  if [[ "${1:-}" == "--list" ]]; then
    list
    return
  fi
  local wanted=("$@") failed=0 name
  [[ ${#wanted[@]} -gt 0 ]] || wanted=(nodelb pause agnhost coredns)
  [[ $EUID -eq 0 ]] || die "needs root (mmdebstrap's root mode and buildah's system storage)"
  mkdir -p "$IMAGES" "$LOGS"
  # One build at a time per cache (work trees share it).
  exec 9>"$IMAGES/.lock"
  flock 9
  for name in "${wanted[@]}"; do
    case "$name" in
      nodelb) build_nodelb ;;
      pause)
        if have_binary pause "$PAUSE_BIN"; then
          build_binary_image pause "$PAUSE_IMAGE" "$PAUSE_BIN"
        else
          failed=1
        fi
        ;;
      agnhost)
        if have_binary agnhost "$AGNHOST_BIN"; then
          build_binary_image agnhost "$AGNHOST_IMAGE" "$AGNHOST_BIN" base
        else
          failed=1
        fi
        ;;
      coredns)
        if have_binary coredns "$COREDNS_BIN"; then
          build_binary_image coredns "$COREDNS_IMAGE" "$COREDNS_BIN"
        else
          failed=1
        fi
        ;;
      *) die "unknown image $name (nodelb, pause, agnhost, coredns)" ;;
    esac
  done
  list
  return "$failed"
}

main "$@"
