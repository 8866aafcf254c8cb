# Sourced by tools/*: make sure .venv exists with the package (and, with BRAID_DEV=1, dev extras).
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${BRAID_PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
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
