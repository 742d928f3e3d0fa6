#!/usr/bin/env bash
# ops/gpu/wheels.sh [PYTHON_VERSIONS]: fetch, where there is a network, the wheels that ops/gpu/check.sh installs on a GPU
# machine that has none (only torch, peft, transformers, msgpack and xxhash there), into ops/gpu/wheelhouse/.
# PYTHON_VERSIONS: the machine's Python, e.g. "3.11" (default: 3.10 3.11 3.12; about 25 MB). numba is left out: without
# it a site runs the reference path, which computes the same bits (replica/kernels/__init__.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
# what hilo imports beyond those five and their own requirements (found with `python -X importtime ops/gpu/check.py`)
pkgs="zstandard cryptography cffi pycparser tenacity prometheus-client jproperties python-json-logger crc32c kafka-python
      six requests urllib3 certifi charset-normalizer idna tqdm"
mkdir -p "$here/wheelhouse"
for v in ${1:-3.10 3.11 3.12}; do
  echo "wheels.sh: wheels for Python $v" >&2
  # shellcheck disable=SC2086
  "$py" -m pip download --quiet --only-binary=:all: --no-deps --python-version "$v" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$here/wheelhouse" $pkgs
done
du -sh "$here/wheelhouse" >&2
