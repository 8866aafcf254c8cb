#!/usr/bin/env bash
# Install the pinned real CLIs (Claude Code, Codex) into tools/harnesses/node_modules.
#
# Idempotent and quiet: when the stamp in node_modules matches the hash of package.json and
# package-lock.json and both binaries are there, it does nothing. Otherwise it runs `npm ci`
# (`npm install` when there is no lock yet), checks that both CLIs start, and writes the
# stamp. Prints nothing on success and the npm log on failure. Concurrent runs wait for each
# other. With BRAID_CLAUDE_BIN and BRAID_CODEX_BIN both set there is nothing to install.
#   install.sh [--force]
# Used by tools/test; reusable by `braid setup-runners`.
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODULES="$DIR/node_modules"
STAMP="$MODULES/.braid-installed"
force=0
case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

if [ -n "${BRAID_CLAUDE_BIN:-}" ] && [ -n "${BRAID_CODEX_BIN:-}" ]; then exit 0; fi

want() { cat "$DIR/package.json" "$DIR/package-lock.json" 2>/dev/null | sha256sum | cut -d' ' -f1; }
installed() {
  [ "$force" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(want)" ] &&
    [ -x "$MODULES/.bin/claude" ] && [ -x "$MODULES/.bin/codex" ]
}
installed && exit 0

if ! command -v npm >/dev/null 2>&1; then
  echo "harnesses: npm not found; install Node.js 20 or newer" >&2
  exit 1
fi

# npm ci removes node_modules, so the lock lives outside it.
lock="${TMPDIR:-/tmp}/braid-harnesses-$(printf '%s' "$DIR" | sha256sum | cut -c1-16).lock"
exec 9>"$lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi
installed && exit 0

log="$(mktemp "${TMPDIR:-/tmp}/braid-harnesses-install.XXXXXX")"
# The start-up check runs in a throwaway home so the CLIs leave nothing in the user's.
scratch="$(mktemp -d "${TMPDIR:-/tmp}/braid-harnesses-home.XXXXXX")"
trap 'rm -rf "$log" "$scratch"' EXIT
check() { HOME="$scratch" CODEX_HOME="$scratch/.codex" "$MODULES/.bin/$1" --version; }
cmd=(ci)
[ -f "$DIR/package-lock.json" ] || cmd=(install)
if ! (cd "$DIR" && npm "${cmd[@]}" --no-audit --no-fund --loglevel=error) >"$log" 2>&1 ||
  ! check claude >>"$log" 2>&1 || ! check codex >>"$log" 2>&1; then
  cat "$log" >&2
  echo "harnesses: installing the CLIs into $MODULES failed (log above)" >&2
  exit 1
fi
want >"$STAMP"
