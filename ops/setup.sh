#!/usr/bin/env bash
# Create (once) the project's virtualenv outside the repo and install hilo-sync into it, editable.
#   ops/setup.sh            # prints nothing but progress; afterwards: $HILO_VENV/bin/hilo --help
# The venv lives at $HILO_VENV (default ~/.cache/hilo-sync/venv) so fresh clones reuse the torch install.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HILO_VENV=${HILO_VENV:-${HILO_CACHE:-$HOME/.cache/hilo-sync}/venv}
stamp="$HILO_VENV/.hilo-deps-$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ ! -x "$HILO_VENV/bin/python" ]; then
  echo "setup: creating virtualenv $HILO_VENV" >&2
  python3 -m venv "$HILO_VENV"
fi
if [ ! -f "$stamp" ]; then
  echo "setup: installing dependencies (torch, peft, transformers, kafka-python, ...); the first time takes a few minutes" >&2
  "$HILO_VENV/bin/python" -m pip install -q --upgrade pip >&2
  out=$("$HILO_VENV/bin/python" -m pip install -q -e "$ROOT[test]" 2>&1) || { echo "$out" >&2; exit 1; }
  rm -f "$HILO_VENV"/.hilo-deps-*; touch "$stamp"
else
  # Point the editable install at this checkout (a fresh clone lives elsewhere); no dependency changes.
  # setuptools' editable-build warnings are noise here; show its output only if the install fails.
  out=$("$HILO_VENV/bin/python" -m pip install -q --no-deps -e "$ROOT" 2>&1) || { echo "$out" >&2; exit 1; }
fi
