"""Writes the KV-event fixtures core's decoder is tested against, with vLLM's own event classes
and msgspec encoder (run with the CPU vLLM's venv: `.venv-vllm/bin/python tools/vllm/kv_events_fixture.py`).

- `vllm-0.32-bytes.msgpack`: vLLM 0.32's default, block hashes as bytes (32-byte digests).
- `vllm-0.32-int.msgpack`: the same events with integer hashes
  (what `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1` publishes).

The events: blocks 1, 2 stored (4 tokens a block, no parent), block 3 stored after block 2 on
the CPU tier with LoRA id 7, block 1 removed, then the whole cache cleared; data-parallel rank 0.
"""

import pathlib
import sys

import msgspec
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,
                                        KVEventBatch)

OUT = pathlib.Path(__file__).resolve().parents[2] / "core" / "src" / "kv_events"


def batch(h):
    return KVEventBatch(
        ts=1765000000.5,
        events=[
            BlockStored(block_hashes=[h(1), h(2)], parent_block_hash=None,
                        token_ids=list(range(8)), block_size=4, lora_id=None,
                        medium="GPU", lora_name=None),
            BlockStored(block_hashes=[h(3)], parent_block_hash=h(2),
                        token_ids=[8, 9, 10, 11], block_size=4, lora_id=7,
                        medium="CPU", lora_name="tenant-a"),
            BlockRemoved(block_hashes=[h(1)], medium="GPU"),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )


def main():
    enc = msgspec.msgpack.Encoder()
    (OUT / "vllm-0.32-bytes.msgpack").write_bytes(enc.encode(batch(lambda i: bytes([i]) * 32)))
    (OUT / "vllm-0.32-int.msgpack").write_bytes(enc.encode(batch(lambda i: (1 << 63) + i)))
    print("wrote", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
