#!/usr/bin/env python3
"""`corelm quantize` against llama.cpp's own quantizer on the same F16/F32/BF16 GGUF.

For each target type, quantizes the input with `corelm quantize` and with llama.cpp's
`llama_model_quantize` (`pure`: one type for every matrix, as corelm writes; no importance
matrix), then compares every tensor the two wrote with the same type byte for byte, and
checks that llama.cpp loads corelm's file and computes the same next-token argmax as it does
on its own file.

    /work/cache/llama-venv/bin/python scripts/check_quantize.py --model /tmp/smol-f16.gguf

(an F16 model can be made from any GGUF with `corelm quantize IN OUT --type f16
--allow-requantize`).
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# target name -> llama_ftype
FTYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q4_k": 14, "q6_k": 18, "iq4_nl": 25, "iq4_xs": 30}


def llama_quantize(src, dst, ftype):
    import llama_cpp
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = ftype
    p.pure = True
    p.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed: {rc}")


def tensors(path):
    import gguf
    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, bytes(t.data.tobytes())) for t in r.tensors}


def argmax_logits(path, tokens):
    from llama_cpp import Llama
    llm = Llama(model_path=path, n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)]).argmax(axis=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--types", default=",".join(FTYPES))
    a = ap.parse_args()
    exe = os.path.join(ROOT, "target", "release", "corelm")
    tmp = tempfile.mkdtemp(prefix="corelm-quant-")
    tokens = [1, 504, 3458, 282, 4649, 314, 2114, 28, 9225, 30, 378, 1092, 4077]
    ok = True
    for name in a.types.split(","):
        ours, theirs = os.path.join(tmp, f"corelm-{name}.gguf"), os.path.join(tmp, f"llama-{name}.gguf")
        subprocess.run([exe, "quantize", a.model, ours, "--type", name], check=True, capture_output=True)
        llama_quantize(a.model, theirs, FTYPES[name])
        t_ours, t_theirs = tensors(ours), tensors(theirs)
        same_type = [n for n in t_ours if n in t_theirs and t_ours[n][0] == t_theirs[n][0]]
        differ_type = [n for n in t_ours if n in t_theirs and t_ours[n][0] != t_theirs[n][0]]
        equal = [n for n in same_type if t_ours[n][1] == t_theirs[n][1]]
        am_ours, am_theirs = argmax_logits(ours, tokens), argmax_logits(theirs, tokens)
        agree = int((am_ours == am_theirs).sum())
        good = len(equal) == len(same_type) and agree == len(tokens)
        ok &= good
        kinds = sorted({t_ours[n][0] for n in same_type})
        print(f"{name:5} {len(equal)}/{len(same_type)} tensors byte-identical (types {kinds}); "
              f"{len(differ_type)} typed differently {[(n, t_ours[n][0], t_theirs[n][0]) for n in differ_type[:3]]}; "
              f"llama.cpp argmax on ours vs its own: {agree}/{len(tokens)} {'OK' if good else 'MISMATCH'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
