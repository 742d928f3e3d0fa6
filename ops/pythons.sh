#!/usr/bin/env bash
# A virtualenv for each end of the Python range the package claims (requires-python's lowest, the newest
# classifier), with hilo-sync and its core dependencies installed from this checkout as a user installs them: a
# wheel, not editable, no extras. tests/ops/test_install.py builds a fresh wheel, installs it into each of these
# and runs the CLI from it. Cached: reinstalled only when the core dependencies in pyproject.toml change.
#   ops/pythons.sh      # prints "VERSION VENV" a line
# Interpreters come from pyenv ($PYENV_ROOT/versions/X.Y.*) or from pythonX.Y on PATH.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HILO_CACHE=${HILO_CACHE:-$HOME/.cache/hilo-sync}
HILO_VENV=${HILO_VENV:-$HILO_CACHE/venv}
read -r deps versions < <("$HILO_VENV/bin/python" -c '
import hashlib, re, sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
low = re.fullmatch(r">=\s*(3\.\d+)", p["requires-python"]).group(1)
high = max((c.rsplit(" :: ", 1)[1] for c in p["classifiers"] if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)),
           key=lambda v: int(v.split(".")[1]))
print(hashlib.sha256(repr(p["dependencies"]).encode()).hexdigest()[:16], low, high)' "$ROOT/pyproject.toml")
interpreter() {  # the python for version $1 (3.10), or nothing
  local root found
  root=${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}
  found=$(ls -d "$root/versions/$1".*/bin/python 2>/dev/null | sort -V | tail -1 || true)
  [ -n "$found" ] || found=$(command -v "python$1" 2>/dev/null || true)
  echo "$found"
}
for v in $versions; do
  py=$(interpreter "$v")
  [ -n "$py" ] || { echo "pythons: no Python $v here (pyenv install $v, or put python$v on PATH): the package claims it" >&2; exit 1; }
  venv=$HILO_CACHE/py$v-venv
  stamp="$venv/.hilo-deps-$deps"
  if [ ! -f "$stamp" ]; then
    echo "pythons: installing hilo-sync and its core dependencies on Python $v into $venv (a few minutes the first time)" >&2
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
    out=$("$venv/bin/python" -m pip install -q "$ROOT" 2>&1) || { echo "$out" >&2; exit 1; }
    touch "$stamp"
  fi
  echo "$v $venv"
done
