# shellcheck shell=bash
# Helpers shared by the build scripts (sourced, not run). The sourcing script sets BUILD_NAME,
# the prefix of its log lines, and CACHE.

log() { printf '[%s] %s\n' "$BUILD_NAME" "$*" >&2; }

# quiet LOGFILE CMD...: run CMD with its output kept in LOGFILE, so a build that works prints
# nothing; when CMD fails, say which command failed and show the end of its log, then exit.
quiet() {
  local logfile=$1
  shift
  [[ $logfile == /* ]] || logfile="$PWD/$logfile"
  if ! "$@" >"$logfile" 2>&1; then
    log "FAILED: $*"
    log "last lines of $logfile:"
    tail -n 40 "$logfile" >&2
    exit 1
  fi
}

# lock_build NAME: hold $CACHE/build/NAME.lock until the script exits, so two checkouts running
# the same build at once (make setup in two worktrees) take turns instead of both rewriting
# the shared build directory.
lock_build() {
  local lockfile="$CACHE/build/$1.lock" fd
  mkdir -p "$CACHE/build"
  exec {fd}>"$lockfile"
  if ! flock -n "$fd"; then
    log "waiting for another build holding $lockfile"
    flock "$fd"
  fi
}
