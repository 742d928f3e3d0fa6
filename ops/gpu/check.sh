#!/usr/bin/env bash
# ops/gpu/check.sh [OUT [ARGS]]: the GPU trainer path in one command, on a GPU machine with no network (ops/gpu/check.py says
# what it checks and prints). Needs only torch, peft, transformers, msgpack and xxhash there: whatever else hilo imports
# comes from ops/gpu/wheelhouse/ (ops/gpu/wheels.sh fills it beforehand), unpacked beside the project, nothing installed.
# Bounded to 8 minutes. Exit 0: every digest matched; the JSON is in OUT/gpu-check.json.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-${OUT:-/tmp/hilo-gpu-check}}
py=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the project as the `hilo` package without installing it: one link per folder, as pyproject.toml's package-dir maps them
mkdir -p "$work/hilo"
for d in schemas replica log replay producer consumer ops; do ln -s "$root/$d" "$work/hilo/$d"; done
# each wheel this interpreter can use, for a module it cannot import yet, unpacked into $work/deps (a wheel is a zip)
"$py" - "$here/wheelhouse" "$work/deps" <<'PY'
import importlib.util, pathlib, sys, zipfile
from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename
house, deps = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
modules = {"zstandard": "zstandard", "cryptography": "cryptography", "cffi": "cffi", "pycparser": "pycparser",
           "tenacity": "tenacity", "prometheus_client": "prometheus_client", "jproperties": "jproperties",
           "pythonjsonlogger": "python_json_logger", "crc32c": "crc32c", "kafka": "kafka_python", "requests": "requests",
           "urllib3": "urllib3", "certifi": "certifi", "charset_normalizer": "charset_normalizer", "idna": "idna",
           "tqdm": "tqdm", "six": "six"}
tags, wheels = set(sys_tags()), list(house.glob("*.whl")) if house.is_dir() else []
for module, dist in modules.items():
    if importlib.util.find_spec(module) is not None:
        continue
    fits = [w for w in wheels if parse_wheel_filename(w.name)[0].replace("-", "_") == dist and parse_wheel_filename(w.name)[3] & tags]
    if not fits:
        sys.exit(f"check.sh: {module} is not installed and ops/gpu/wheelhouse/ has no wheel of {dist} for this Python "
                 f"({sys.version.split()[0]}): run ops/gpu/wheels.sh {sys.version_info[0]}.{sys.version_info[1]} where there is a network")
    zipfile.ZipFile(max(fits)).extractall(deps)
    print(f"check.sh: {dist} from {max(fits).name}", file=sys.stderr)
PY
PYTHONPATH="$work:$work/deps" timeout 470 "$py" "$here/check.py" --out "$out" "${@:2}"  # ARGS: check.py's (--help)
