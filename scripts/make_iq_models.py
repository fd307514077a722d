#!/usr/bin/env python3
"""Write i-quant (or MXFP4) variants of a GGUF model for benchmarks (never run in CI).

Every matrix whose rows are whole blocks of TYPE (256-value super-blocks for the i-quants: on
SmolLM2, Qwen2.5 and Gemma 3 only `ffn_down`, their model widths 576, 896 and 640 are not;
32-value blocks for MXFP4: every layer matrix) is dequantized and requantized by ggml's own
quantizer to TYPE, with a flat importance matrix where ggml requires one; everything else
(the token embeddings always) is copied as it is, as llama-quantize falls back for such rows.

    /work/cache/llama-venv/bin/python scripts/make_iq_models.py MODEL.gguf OUT.gguf IQ3_S
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures  # noqa: E402


# llama.h's LLAMA_FTYPE_MOSTLY_* of each type (`general.file_type`, what llama-bench prints).
FTYPES = {"IQ2_XXS": 19, "IQ2_XS": 20, "IQ3_XXS": 23, "IQ1_S": 24, "IQ3_S": 26, "IQ2_S": 28, "IQ1_M": 31,
          "MXFP4": 38}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("type", choices=sorted(FTYPES))
    a = ap.parse_args()
    import gguf
    from gguf.quants import dequantize
    lib = make_fixtures.libggml()
    tid = make_fixtures.TYPES[a.type]
    r = gguf.GGUFReader(a.model)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(a.out, arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.name == "general.file_type":
            w.add_file_type(FTYPES[a.type])
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
            else:
                val = [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(f.name, val, vt, sub_type=sub)
        elif vt == gguf.GGUFValueType.STRING:
            w.add_key_value(f.name, bytes(f.parts[-1]).decode("utf-8", "surrogateescape"), vt)
        else:
            w.add_key_value(f.name, f.parts[-1].tolist()[0], vt)
    moved = 0
    block = 32 if a.type == "MXFP4" else 256
    for t in r.tensors:
        shape = [int(d) for d in t.shape]  # ggml order: shape[0] is the row length
        if len(shape) == 2 and shape[0] % block == 0 and shape[1] > 1 and "token_embd" not in t.name and t.name != "output.weight":
            x = dequantize(t.data, t.tensor_type).reshape(shape[1], shape[0]).astype(np.float32)
            q = make_fixtures.quantize(lib, tid, x)
            w.add_tensor(t.name, q.reshape(shape[1], -1), raw_dtype=gguf.GGMLQuantizationType(tid))
            moved += 1
        else:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {moved} matrices as {a.type}")


if __name__ == "__main__":
    main()
