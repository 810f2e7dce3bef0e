"""Helpers to run real podsim processes in end-to-end tests.

- `start_podsim(tmp_path, *flags, ...)` starts `target/debug/podsim --port 0 ...`, waits for its
  `podsim listening on http://127.0.0.1:PORT` line and returns `(process, base_url)`.
- `make_adapter(root, name, rank=8)` writes a real PEFT-style adapter directory
  (`adapter_config.json` + a small, valid `adapter_model.safetensors`) that podsim (like vLLM)
  accepts as a `lora_path`; its bytes are deterministic, so a SHA-256 manifest of it is stable.

The caller stops the process (`process.stop()`, SIGTERM then SIGKILL after a grace period).
"""
from __future__ import annotations

import itertools
import json
import struct
from pathlib import Path
from typing import Optional, Sequence

from . import LISTENING, ManagedProcess, bin_path

_counter = itertools.count()


def start_podsim(
    tmp_path: Path,
    *flags: str,
    allow_runtime_lora: bool = True,
    env: Optional[dict] = None,
    name: Optional[str] = None,
    timeout: float = 30.0,
) -> tuple[ManagedProcess, str]:
    """Starts podsim on 127.0.0.1 with a free port. `flags` are podsim's flags (`--enable-lora`,
    `--time-scale 50`, ...; pass `--port` only to override 0). `allow_runtime_lora` sets
    `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1` (the LoRA routes also need `--enable-lora`).
    Returns the process and its base URL (`http://127.0.0.1:PORT`, no trailing slash)."""
    argv = [str(bin_path("podsim"))]
    if "--port" not in flags:
        argv += ["--port", "0"]
    argv += [str(f) for f in flags]
    full_env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1" if allow_runtime_lora else "0"}
    if env:
        full_env.update(env)
    label = name or f"podsim-{next(_counter)}"
    proc = ManagedProcess(
        argv, Path(tmp_path) / f"{label}.log", ready=LISTENING, env=full_env, timeout=timeout
    )
    assert proc.match is not None
    return proc, f"http://{proc.match.group('addr')}"


def make_adapter(
    root: Path,
    name: str,
    rank: int = 8,
    target_modules: Sequence[str] = ("q_proj", "v_proj"),
    base_model: str = "meta-llama/Llama-3.1-8B-Instruct",
    hidden: int = 16,
) -> Path:
    """Writes adapter `name` under `root` and returns its directory: `adapter_config.json`
    (PEFT LoRA config with rank `r`) and `adapter_model.safetensors` holding one zero lora_A
    and lora_B tensor per target module (F16, `hidden` wide)."""
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(target_modules),
    }
    (path / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    header: dict = {}
    offset = 0
    for module in target_modules:
        for part, shape in (("lora_A", [rank, hidden]), ("lora_B", [hidden, rank])):
            size = shape[0] * shape[1] * 2
            key = f"base_model.model.model.layers.0.self_attn.{module}.{part}.weight"
            header[key] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    raw += b" " * (-len(raw) % 8)
    (path / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return path
