#!/usr/bin/env bash
# Create (or reuse) the reference Python venv used by scripts/make_*.py.
#   FRIGG_VENV   venv path, relative to the repo root unless absolute (default: venv)
#   PYTHON       interpreter used to create it (default: python3)
# Idempotent: if every pin in scripts/requirements-ref.txt is already satisfied, nothing is installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$root/scripts/requirements-ref.txt"
venv="${FRIGG_VENV:-venv}"
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac
py="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    echo "setup-venv: creating $venv"
    "$py" -m venv "$venv"
fi

# Check every pin with the venv's own interpreter (importlib.metadata, no network).
if "$venv/bin/python" - "$req" <<'PY'
import re, sys
from importlib.metadata import version, PackageNotFoundError
bad = []
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, want = re.split(r"==", line, maxsplit=1)
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    # torch wheels may carry a local tag (2.15.0+cu132)
    if have is None or have.split("+", 1)[0] != want:
        bad.append(f"{name}: have {have}, want {want}")
if bad:
    print("setup-venv: missing or wrong versions:\n  " + "\n  ".join(bad))
    sys.exit(1)
PY
then
    echo "setup-venv: $venv already satisfies $(basename "$req")"
    exit 0
fi

"$venv/bin/python" -m pip install --upgrade pip >/dev/null
"$venv/bin/python" -m pip install -r "$req"
echo "setup-venv: done ($venv)"
