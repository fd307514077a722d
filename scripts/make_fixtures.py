#!/usr/bin/env python3
"""Write corelm's test fixtures with llama.cpp as the independent reference.

Run by hand (never in CI), with the llama-cpp-python venv that bench_compare.py uses plus the
`gguf` package:

    /work/cache/llama-venv/bin/pip install gguf
    /work/cache/llama-venv/bin/python scripts/make_fixtures.py quants
    /work/cache/llama-venv/bin/python scripts/make_fixtures.py models [--only NAME ...]

`quants` writes fixtures/quants.gguf: one f32 input matrix, and for each weight type the bytes
ggml's own quantizer (`ggml_quantize_chunk`; no importance matrix, except a flat one of ones
for the types ggml refuses to quantize without: IQ2_XXS, IQ2_XS, IQ1_S, IQ1_M) makes of it, and ggml's own
dequantization of those bytes (`type_traits.to_float`); for the 1- to 3-bit i-quants also
ggml-cpu's activations and `vec_dot` of each row (`ggml_dots`). Tests check our dequantizers against
the latter bit for bit and our quantizer (`corelm quantize`) against the former.

`kv` adds llama.cpp's Q8_0- and Q4_0-cache records (prompt and greedy steps) to the existing
fixtures of `fixture_models.KV_GREEDY` (gpt-oss with heads of 32 values), the GGUF and the other records unchanged.

`models` writes tiny random-weight GGUFs, one per architecture (see models.py beside this
file), and the logits llama.cpp computes on them. `iquants`' logits come from an AVX-512
build of the same llama.cpp, as the golden data's (`LLAMA_CPP_LIB_PATH=<its bin/>`, which
llama-cpp-python loads instead of its own): the venv's AVX2 build differs from it at one
prompt position by 0.071, where corelm agrees with the AVX-512 build.
"""
import argparse
import ctypes
import glob
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "fixtures")

# ggml type ids (ggml.h) of the weight types corelm reads.
TYPES = {
    "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11,
    "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20, "IQ4_XS": 23, "F16": 1, "BF16": 30,
    "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19, "IQ3_S": 21, "IQ2_S": 22, "IQ1_M": 29,
    "MXFP4": 39,
}


class TypeTraits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


def libggml():
    import llama_cpp
    # The library llama-cpp-python itself loads: LLAMA_CPP_LIB_PATH's where set, else its own.
    libdir = os.environ.get("LLAMA_CPP_LIB_PATH") or os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    path = glob.glob(os.path.join(libdir, "libggml-base.so"))[0]
    lib = ctypes.CDLL(path)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    return lib


def quantize(lib, tid, x):
    """ggml's bytes for the f32 rows `x` as type `tid` (a flat importance matrix where ggml
    requires one)."""
    rows, cols = x.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    q = np.zeros(rows * lib.ggml_row_size(tid, cols), dtype=np.uint8)
    im = np.ones(cols, dtype=np.float32)
    imp = im.ctypes.data if lib.ggml_quantize_requires_imatrix(tid) else None
    n = lib.ggml_quantize_chunk(tid, x.ctypes.data, q.ctypes.data, 0, rows, cols, imp)
    assert n == q.size, (tid, n, q.size)
    return q


class TypeTraitsCpu(ctypes.Structure):
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


def ggml_dots(tid, q, x):
    """ggml-cpu's own `vec_dot` of each row of the quantized `q` against its `from_float` of
    `x` (row by row): the activations' bytes and the dots, in the order this build's SIMD
    kernels sum them (the venv's llama.cpp is built for AVX2)."""
    import llama_cpp
    cpu = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu.so"))[0])
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
    tt = cpu.ggml_get_type_traits_cpu(tid).contents
    lib = libggml()
    rows, cols = x.shape
    vrs = lib.ggml_row_size(tt.vec_dot_type, cols)
    xq = np.zeros((rows, vrs), dtype=np.uint8)
    act = cpu.ggml_get_type_traits_cpu(tt.vec_dot_type).contents
    from_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(act.from_float)
    vec_dot = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                               ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)(tt.vec_dot)
    rs = q.size // rows
    out = np.zeros(rows, dtype=np.float32)
    for r in range(rows):
        xr = np.ascontiguousarray(x[r], dtype=np.float32)
        from_float(xr.ctypes.data, xq[r].ctypes.data, cols)
        vec_dot(cols, out[r:].ctypes.data, 0, q[r * rs:].ctypes.data, 0, xq[r].ctypes.data, 0, 1)
    return tt.vec_dot_type, xq, out


def quant_input(rows=4, cols=512, seed=7):
    rng = np.random.default_rng(seed)
    x = np.empty((rows, cols), dtype=np.float32)
    x[0] = rng.normal(0, 0.02, cols)              # typical weight row
    x[1] = rng.uniform(-3, 3, cols)               # wide uniform
    x[2] = rng.normal(0, 0.05, cols)              # with outliers
    x[2, rng.choice(cols, 6, replace=False)] = rng.normal(0, 2.0, 6)
    x[3] = rng.normal(0, 1e-3, cols) + 1e-3       # tiny, off-centre
    return x


def make_quants():
    import gguf
    lib = libggml()
    x = quant_input()
    rows, cols = x.shape
    w = gguf.GGUFWriter(os.path.join(OUT, "quants.gguf"), "corelm-quant-fixture")
    w.add_string("fixture.source", "ggml_quantize_chunk / type_traits.to_float, llama.cpp 4df29be")
    w.add_tensor("input", x)
    # The i-quants' dots: weight and activation rows of 4096 values.
    rng = np.random.default_rng(11)
    dot_w = rng.standard_normal((4, 4096)).astype(np.float32) * 0.02
    dot_x = rng.standard_normal((4, 4096)).astype(np.float32)
    w.add_tensor("dot_x", dot_x)
    for name, tid in TYPES.items():
        rs = lib.ggml_row_size(tid, cols)
        q = quantize(lib, tid, x)
        tt = lib.ggml_get_type_traits(tid).contents
        to_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(tt.to_float)
        deq = np.zeros((rows, cols), dtype=np.float32)
        to_float(q.ctypes.data, deq.ctypes.data, rows * cols)
        qtype = gguf.GGMLQuantizationType(tid)
        w.add_tensor(f"{name}.q", q.reshape(rows, rs), raw_dtype=qtype)
        w.add_tensor(f"{name}.deq", deq)
        if (name.startswith("IQ") and name not in ("IQ4_NL", "IQ4_XS")) or name == "MXFP4":
            # Rows of 16 super-blocks (MXFP4: 128 blocks), so every float step of a dot repeats.
            wq = quantize(lib, tid, dot_w)
            vdt, xq, dots = ggml_dots(tid, wq, dot_x)
            w.add_tensor(f"{name}.dw", wq.reshape(dot_w.shape[0], -1), raw_dtype=qtype)
            w.add_tensor(f"{name}.act", xq, raw_dtype=gguf.GGMLQuantizationType(vdt))
            w.add_tensor(f"{name}.dot", dots)
        err = np.abs(deq - x).max(axis=1) / np.abs(x).max(axis=1)
        print(f"{name:7} {rs:5} bytes/row  max rel err per row {np.round(err, 4)}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["quants", "models", "all", "kv"])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="models: only these fixtures (e.g. a new one)")
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if a.what in ("quants", "all"):
        make_quants()
    if a.what in ("models", "all"):
        sys.path.insert(0, HERE)
        import fixture_models
        fixture_models.make_all(OUT, a.only)
    if a.what == "kv":
        sys.path.insert(0, HERE)
        import fixture_models
        fixture_models.add_kv(OUT, a.only or list(fixture_models.KV_GREEDY))


if __name__ == "__main__":
    main()
