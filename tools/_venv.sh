# Sourced by tools/*: make sure .venv exists with the package (and, with BRAID_DEV=1, dev extras).
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
# The interpreter a new .venv is made with: BRAID_PYTHON when set, else the first Python >= 3.11
# (with venv) among python3 and /usr/bin/python3, preferring one with libpython linked into
# its executable over one that loads it as a shared library. pyenv's default build is the
# shared kind, which calls every C-API function through the PLT; on this project's
# evidence ingest it took ~10% more CPU than Debian's /usr/bin/python3.11 (5 alternating
# pairs; docs/architecture.md). An existing .venv is kept: delete it to pick again.
pick_python() {
  local cand kind fallback=""
  for cand in python3 /usr/bin/python3; do
    command -v "$cand" >/dev/null 2>&1 || continue
    kind="$("$cand" -c '
import sys
try:
    import ensurepip, venv
except ImportError:
    raise SystemExit
if sys.version_info >= (3, 11):
    try:
        with open("/proc/self/maps") as maps:
            print("shared" if "libpython" in maps.read() else "static")
    except OSError:
        print("shared")
' 2>/dev/null || true)"
    if [ "$kind" = static ]; then echo "$cand"; return; fi
    if [ "$kind" = shared ] && [ -z "$fallback" ]; then fallback="$cand"; fi
  done
  echo "${fallback:-python3}"
}
if [ ! -x "$VENV/bin/python" ]; then
  if [ -n "${BRAID_PYTHON:-}" ]; then
    "$BRAID_PYTHON" -m venv "$VENV"
  elif ! "$(pick_python)" -m venv "$VENV" >/dev/null 2>&1; then
    rm -rf "$VENV"  # (a distribution Python without its venv package, say)
    python3 -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
fi
extras=""
stamp="$VENV/.braid-installed"
if [ "${BRAID_DEV:-0}" = "1" ]; then extras="[dev]"; stamp="$VENV/.braid-installed-dev"; fi
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log="$VENV/.braid-install.log"
  if ! "$VENV/bin/python" -m pip install -q -e "$ROOT$extras" >"$log" 2>&1; then
    cat "$log" >&2
    echo "tools: installing the package into $VENV failed (log above)" >&2
    exit 1
  fi
  echo "$want" >"$stamp"
fi
export PATH="$VENV/bin:$PATH"
