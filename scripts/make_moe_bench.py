"""A synthetic Qwen3-MoE GGUF for timing the expert matmuls against llama.cpp.

No real mixture-of-experts model is reachable from this project's machines (only package
registries are), so this writes one of a realistic shape with random weights: the tokenizer and
writer of `fixture_models.py`, 12 layers of n_embd 1024 (16 query heads, 4 KV heads of 64), 32
experts of 512 neurons per layer, 4 used per token, a random router (so routing is close to
uniform, as a trained router is on average). F16 out; quantize it with `corelm quantize --type
q4_k` (or q8_0, q4_0) for `corelm bench` and `llama-bench` on the same file. Speed only: its
text is noise.

    python3 scripts/make_moe_bench.py /tmp/moe/moe-f16.gguf
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_models import Spec, write  # noqa: E402

SPEC = Spec("moe-bench", "qwen3moe", n_embd=1024, n_head=16, n_kv=4, head_dim=64, n_ff=2048, n_layer=12,
            rope_base=1e6, qk_norm=True, tied=False, experts=(32, 4, 512))

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "moe-bench-f16.gguf"
    write(SPEC, out, np.random.default_rng(7))
    print(out, os.path.getsize(out) // (1 << 20), "MiB")
