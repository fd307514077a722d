"""Tiny random-weight GGUFs, one per architecture, and llama.cpp's logits on them.

Called by make_fixtures.py (`models`). Each fixture is `fixtures/<name>.gguf` (F16 matrices,
F32 norms; a few hundred kB) plus `fixtures/<name>.json`: the token ids fed, llama.cpp's
logits at every prompt position (one batch, flash attention on as in the golden data), and 8 greedy steps decoded one token at a time
with their logits. RoPE bases are small so every rotary frequency turns visibly within the
prompt, and the Llama 3 fixture's `rope_freqs` spread from 1 to 8, so a mistake in either
shows in the logits.
"""
import json
import os

import numpy as np

N_VOCAB = 288
PROMPT = 32
GREEDY = 8


def byte_tokens():
    # GPT-2's printable stand-ins for the 256 byte values.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def vocab():
    toks = byte_tokens()
    merges = []
    # A few merges so the BPE vocab is well formed; the rest are plain filler tokens.
    for a, b in [("Ġ", "t"), ("Ġ", "a"), ("h", "e"), ("i", "n"), ("Ġt", "he"), ("e", "r")]:
        merges.append(f"{a} {b}")
        toks.append(a + b)
    while len(toks) < N_VOCAB - 2:
        toks.append(f"<|filler_{len(toks)}|>")
    toks += ["<|endoftext|>", "<|im_end|>"]
    types = [1] * (N_VOCAB - 2) + [3, 3]
    return toks, types, merges


class Spec:
    def __init__(self, name, arch, n_embd=64, n_head=4, n_kv=2, head_dim=16, n_ff=128, n_layer=2,
                 rope_base=300.0, tied=True, freqs=None, qk_norm=False, bias=False, fused=False,
                 experts=None, q_scale=False, shared_ff=None, n_rot=None, longrope=None, floats=None,
                 window=None, post_norms=False, yarn=None, quants=None, pre_norms=True, row_qk_norm=False,
                 q8_layers=False, sections=None, ints=None, shared_gate=True, ffn_norm_name="ffn_norm",
                 oai=False):
        self.__dict__.update(locals())
        del self.__dict__["self"]


SPECS = [
    Spec("llama3", "llama", tied=False, freqs=[1.0, 1.0, 1.2, 1.7, 2.6, 4.0, 6.0, 8.0]),
    Spec("mistral", "llama", n_kv=1, tied=False, rope_base=1000.0),
    Spec("qwen3", "qwen3", head_dim=32, qk_norm=True, tied=True),
    Spec("qwen3moe", "qwen3moe", head_dim=32, qk_norm=True, tied=False, experts=(8, 2, 48)),
    Spec("phi3", "phi3", n_kv=4, fused=True, tied=False),
    Spec("qwen2moe", "qwen2moe", bias=True, tied=False, experts=(8, 2, 32), shared_ff=64),
    # Heads of 128 values, wider than the model (4 × 128 over 64): the device's attention tiles
    # of two threads a row.
    Spec("llama128", "llama", n_kv=2, head_dim=128, tied=False, rope_base=1000.0),
    # Phi-3 LongRoPE as Phi-4-mini has it (grouped-query, tied, 3/4 of each head rotated): short
    # and long divisors that differ, an attention factor, trained first on 256 positions, so
    # llama.cpp takes the short factors at n_ctx 128 (padded to 256) and the long at 512.
    Spec("phi3long", "phi3", n_kv=2, fused=True, tied=True, n_rot=12,
         longrope=dict(orig=256, attn=1.19, short=[1.0, 1.1, 1.4, 2.0, 3.0, 4.5],
                       long=[1.0, 1.7, 3.3, 6.0, 11.0, 21.0])),
    # Gemma (1): one KV head (Gemma 2B's), heads wider than the model (4 × 32 over 64).
    Spec("gemma", "gemma", n_kv=1, head_dim=32, tied=True, rope_base=1000.0),
    # SmolLM3: four layers, so the fourth runs without RoPE.
    Spec("smollm3", "smollm3", n_layer=4, tied=True, rope_base=1000.0),
    # Granite: its four multipliers, far from 1 (and an attention scale far from 1/√16).
    Spec("granite", "granite", tied=True, floats={"embedding_scale": 6.0, "residual_scale": 0.3,
                                                   "attention.scale": 0.09, "logit_scale": 4.0}),
    # Gemma 2: caps low enough that the random scores and logits reach them, a sliding window
    # of 8 on layer 0 (layer 1 global), norms after attention and the feed-forward.
    Spec("gemma2", "gemma2", n_kv=2, head_dim=32, tied=True, rope_base=1000.0, window=8, post_norms=True,
         floats={"attn_logit_softcapping": 1.5, "final_logit_softcapping": 3.0}),
    # Qwen2 with YaRN (Qwen2.5's long-context setting): factor 4 over an original context of
    # 64, so the ramp between interpolated and extrapolated angles falls inside the 8 pairs.
    Spec("qwen2yarn", "qwen2", bias=True, tied=False, rope_base=10000.0, yarn=(4.0, 64)),
    # ERNIE 4.5 (tied, as the 0.3B model) and EXAONE 3.x (NeoX pairs, Llama 3-style factors).
    Spec("ernie4_5", "ernie4_5", tied=True, rope_base=500.0),
    Spec("exaone", "exaone", n_kv=1, tied=False, rope_base=700.0, freqs=[1.0, 1.3, 2.0, 3.5, 5.0, 7.0, 8.0, 8.0]),
    # The 1- to 3-bit i-quants, each in two matrices of different shapes (rows of 256 and 512:
    # whole super-blocks), the embeddings too (rows looked up by dequantization).
    Spec("iquants", "llama", n_embd=256, n_head=4, n_kv=2, head_dim=64, n_ff=512, tied=False, rope_base=1000.0,
         quants={"token_embd": "IQ3_S", "output.": "IQ4_XS",
                 "blk.0.attn_q": "IQ2_XXS", "blk.0.attn_k": "IQ2_XS", "blk.0.attn_v": "IQ2_S",
                 "blk.0.attn_output": "IQ3_XXS", "blk.0.ffn_gate": "IQ3_S", "blk.0.ffn_up": "IQ1_S",
                 "blk.0.ffn_down": "IQ1_M",
                 "blk.1.attn_q": "IQ1_M", "blk.1.attn_k": "IQ1_S", "blk.1.attn_v": "IQ3_XXS",
                 "blk.1.attn_output": "IQ2_S", "blk.1.ffn_gate": "IQ2_XXS", "blk.1.ffn_up": "IQ2_XS",
                 "blk.1.ffn_down": "IQ3_S"}),
    # Mistral 3 (Ministral 3): YaRN with its own betas and log multiplier, set far from the
    # defaults so each shows (the ramp over pairs 1..4 instead of 0..1), and the queries'
    # temperature stepping every 16 positions (the original context), so the prompt and the
    # greedy steps cross two steps.
    Spec("mistral3", "mistral3", n_kv=1, tied=False, rope_base=10000.0, yarn=(4.0, 16),
         floats={"attention.temperature_scale": 0.5, "rope.scaling.yarn_beta_fast": 0.5,
                 "rope.scaling.yarn_beta_slow": 0.05, "rope.scaling.yarn_log_multiplier": 0.7}),
    # OLMo 2: norms only after attention and the feed-forward, Q/K norms over whole rows.
    Spec("olmo2", "olmo2", tied=False, rope_base=1000.0, qk_norm=True, row_qk_norm=True,
         post_norms=True, pre_norms=False),
    # OLMo 3: the same with a window of 8 on layers 0-2 (plain RoPE) and YaRN on layer 3.
    Spec("olmo3", "olmo2", n_layer=4, tied=False, rope_base=10000.0, qk_norm=True, row_qk_norm=True,
         post_norms=True, pre_norms=False, window=8, yarn=(4.0, 64)),
    # EXAONE 4 (1.2B's shape: no window): norms after only, per-head Q/K norms, Llama 3-style
    # factors.
    Spec("exaone4", "exaone4", n_kv=1, tied=False, rope_base=700.0, qk_norm=True, post_norms=True,
         pre_norms=False, freqs=[1.0, 1.3, 2.0, 3.5, 5.0, 7.0, 8.0, 8.0]),
    # EXAONE 4 at 64 layers (32B's depth, where llama.cpp windows three layers of four and the
    # fourth has no RoPE): narrow, its matrices Q8_0, a window of 8.
    Spec("exaone4swa", "exaone4", n_embd=32, n_head=2, n_kv=1, head_dim=16, n_ff=64, n_layer=64,
         tied=False, rope_base=700.0, qk_norm=True, post_norms=True, pre_norms=False, window=8,
         q8_layers=True),
    # LLaMA with Q/K/V biases, which llama.cpp adds for every family whose file has them.
    Spec("llamabias", "llama", n_kv=2, tied=False, rope_base=1000.0, bias=True),
    # The Qwen-VL language models on text: M-RoPE sections (three positions the token's, the
    # fourth 0: Qwen3-VL's interleaved sections leave pairs 12 and 15 still), Qwen3-VL with a
    # deepstack layer (zeros added for text).
    Spec("qwen2vl", "qwen2vl", bias=True, tied=False, rope_base=1000.0, sections=[2, 3, 3, 0]),
    Spec("qwen3vl", "qwen3vl", head_dim=32, qk_norm=True, tied=True, sections=[4, 6, 6, 0],
         ints={"n_deepstack_layers": 1}),
    Spec("qwen3vlmoe", "qwen3vlmoe", head_dim=32, qk_norm=True, tied=False, experts=(8, 2, 48),
         sections=[4, 6, 6, 0], ints={"n_deepstack_layers": 1}),
    # Granite MoE with a shared expert (GraniteMoeShared: added ungated), its multipliers far
    # from 1; `expert_weights_scale`, which llama.cpp does not read for the family, set too.
    # (Its experts are feed_forward_length wide in llama.cpp.)
    Spec("granitemoe", "granitemoe", tied=True, n_ff=32, experts=(8, 2, 32), shared_ff=48, shared_gate=False,
         floats={"embedding_scale": 6.0, "residual_scale": 0.3, "attention.scale": 0.09,
                 "logit_scale": 4.0, "expert_weights_scale": 2.5}),
    # Seed-OSS: NeoX RoPE, Q/K/V biases, the norm before the feed-forward named
    # post_attention_norm.
    Spec("seed_oss", "seed_oss", n_kv=1, tied=False, rope_base=1000.0, bias=True, ffn_norm_name="post_attention_norm"),
    # gpt-oss: Q/K/V and Wo biases, an attention sink per head, a window of 8 on the even
    # layers, YaRN, 3 of 8 experts weighted by a softmax over the chosen logits, the router's
    # and every expert's biases, the clamped SwiGLU; the experts in MXFP4 as the released files
    # (gain 4: gate and up reach the clamp at 7).
    Spec("gpt_oss", "gpt-oss", n_layer=4, tied=False, rope_base=1000.0, bias=True, window=8, yarn=(4.0, 64),
         experts=(8, 3, 64), ffn_norm_name="post_attention_norm", oai=True,
         quants={f"blk.{i}.ffn_{m}_exps.weight": "MXFP4" for i in range(4) for m in ("gate", "up", "down")}),
    # gpt-oss again with heads of 32 values, which quantized caches take (their blocks are 32
    # values): its sinks over Q8_0 and Q4_0 caches.
    Spec("gpt_oss32", "gpt-oss", n_layer=2, head_dim=32, tied=False, rope_base=1000.0, bias=True, window=8,
         yarn=(4.0, 64), experts=(8, 3, 64), ffn_norm_name="post_attention_norm", oai=True,
         quants={f"blk.{i}.ffn_{m}_exps.weight": "MXFP4" for i in range(2) for m in ("gate", "up", "down")}),
]

# llama.cpp's context for the fixtures' logits; LONG_CTX for a LongRoPE fixture's long factors.
N_CTX = 128
LONG_CTX = 512


def write(spec, path, rng):
    import gguf
    w = gguf.GGUFWriter(path, spec.arch)
    a = spec.arch
    # Not the family name: llama.cpp keys tokenizer quirks on `general.name` ("phi3" → RSTRIP).
    w.add_name("corelm test fixture")
    w.add_block_count(spec.n_layer)
    w.add_context_length(4096 if spec.longrope else 256)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.n_rot or spec.head_dim)
    if spec.longrope:
        w.add_rope_scaling_orig_ctx_len(spec.longrope["orig"])
        w.add_rope_scaling_attn_factors(spec.longrope["attn"])
    w.add_rope_freq_base(spec.rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    if spec.window:
        w.add_sliding_window(spec.window)
    if spec.yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(spec.yarn[0])
        w.add_rope_scaling_orig_ctx_len(spec.yarn[1])
    for k, v in (spec.floats or {}).items():
        w.add_float32(f"{a}.{k}", v)
    for k, v in (spec.ints or {}).items():
        w.add_uint32(f"{a}.{k}", v)
    if spec.sections:
        w.add_rope_dimension_sections(spec.sections)
    if spec.experts:
        n_exp, n_used, ff = spec.experts
        w.add_expert_count(n_exp)
        w.add_expert_used_count(n_used)
        w.add_expert_feed_forward_length(ff)
        if spec.shared_ff:
            w.add_expert_shared_feed_forward_length(spec.shared_ff)
    toks, types, merges = vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(N_VOCAB - 2)
    w.add_eos_token_id(N_VOCAB - 1)
    w.add_add_bos_token(False)

    def add(name, a):
        """A tensor, quantized by ggml where `spec.quants` names a type for it."""
        t = next((t for k, t in (spec.quants or {}).items() if name.startswith(k)), None)
        if spec.q8_layers and name.startswith("blk.") and a.ndim == 2:
            t = "Q8_0"  # every layer matrix (a deep fixture kept small)
        if t is None:
            return w.add_tensor(name, a)
        import make_fixtures
        tid = make_fixtures.TYPES[t]
        # Stacked experts quantized row by row; the stack's shape kept.
        q = make_fixtures.quantize(make_fixtures.libggml(), tid, a.reshape(-1, a.shape[-1]).astype(np.float32))
        w.add_tensor(name, q.reshape(*a.shape[:-1], -1), raw_dtype=gguf.GGMLQuantizationType(tid))

    e, hd = spec.n_embd, spec.head_dim
    qd, kvd = spec.n_head * hd, spec.n_kv * hd

    def mat(rows, cols, gain=1.0):  # GGML [cols, rows] = numpy (rows, cols)
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float16)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    # Small embeddings: logits (tied) stay O(1) and the layers, not the input token, dominate.
    add("token_embd.weight", (0.3 * rng.standard_normal((N_VOCAB, e))).astype(np.float16))
    add("output_norm.weight", norm(e))
    if not spec.tied:
        add("output.weight", mat(N_VOCAB, e, 2.0))
    if spec.freqs:
        add("rope_freqs.weight", np.array(spec.freqs, dtype=np.float32))
    if spec.longrope:
        for which in ("short", "long"):
            add(f"rope_factors_{which}.weight", np.array(spec.longrope[which], dtype=np.float32))
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        if spec.pre_norms:
            add(p + "attn_norm.weight", norm(e))
        if spec.fused:
            add(p + "attn_qkv.weight", mat(qd + 2 * kvd, e, 1.5))
        else:
            add(p + "attn_q.weight", mat(qd, e, 1.5))
            add(p + "attn_k.weight", mat(kvd, e, 1.5))
            add(p + "attn_v.weight", mat(kvd, e))
        if spec.bias:
            add(p + "attn_q.bias", (0.3 * rng.standard_normal(qd)).astype(np.float32))
            add(p + "attn_k.bias", (0.3 * rng.standard_normal(kvd)).astype(np.float32))
            add(p + "attn_v.bias", (0.3 * rng.standard_normal(kvd)).astype(np.float32))
        if spec.qk_norm:
            add(p + "attn_q_norm.weight", norm(qd if spec.row_qk_norm else hd))
            add(p + "attn_k_norm.weight", norm(kvd if spec.row_qk_norm else hd))
        add(p + "attn_output.weight", mat(e, qd))
        if spec.oai:
            add(p + "attn_output.bias", (0.3 * rng.standard_normal(e)).astype(np.float32))
            # Sinks about the scores' size: some heads' softmax dominated by them, some not.
            add(p + "attn_sinks.weight", (1.5 * rng.standard_normal(spec.n_head)).astype(np.float32))
        if spec.post_norms:
            add(p + "post_attention_norm.weight", norm(e))
            add(p + "post_ffw_norm.weight", norm(e))
        if spec.pre_norms:
            add(p + spec.ffn_norm_name + ".weight", norm(e))
        if spec.experts:
            n_exp, _, ff = spec.experts
            add(p + "ffn_gate_inp.weight", (rng.standard_normal((n_exp, e)) / np.sqrt(e) * 3).astype(np.float32))
            if spec.oai:
                add(p + "ffn_gate_exps.weight", np.stack([mat(ff, e, 4.0) for _ in range(n_exp)]))
                add(p + "ffn_up_exps.weight", np.stack([mat(ff, e, 4.0) for _ in range(n_exp)]))
                add(p + "ffn_down_exps.weight", np.stack([mat(e, ff, 0.3) for _ in range(n_exp)]))
                add(p + "ffn_gate_inp.bias", rng.standard_normal(n_exp).astype(np.float32))
                add(p + "ffn_gate_exps.bias", (0.5 * rng.standard_normal((n_exp, ff))).astype(np.float32))
                add(p + "ffn_up_exps.bias", (0.5 * rng.standard_normal((n_exp, ff))).astype(np.float32))
                add(p + "ffn_down_exps.bias", (0.3 * rng.standard_normal((n_exp, e))).astype(np.float32))
            else:
                add(p + "ffn_gate_exps.weight", np.stack([mat(ff, e) for _ in range(n_exp)]))
                add(p + "ffn_up_exps.weight", np.stack([mat(ff, e) for _ in range(n_exp)]))
                add(p + "ffn_down_exps.weight", np.stack([mat(e, ff) for _ in range(n_exp)]))
            if spec.shared_ff:
                sf = spec.shared_ff
                if spec.shared_gate:
                    add(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(e) / np.sqrt(e) * 2).astype(np.float32))
                add(p + "ffn_gate_shexp.weight", mat(sf, e))
                add(p + "ffn_up_shexp.weight", mat(sf, e))
                add(p + "ffn_down_shexp.weight", mat(e, sf))
        elif spec.fused:
            add(p + "ffn_up.weight", mat(2 * spec.n_ff, e))
            add(p + "ffn_down.weight", mat(e, spec.n_ff))
        else:
            add(p + "ffn_gate.weight", mat(spec.n_ff, e))
            add(p + "ffn_up.weight", mat(spec.n_ff, e))
            add(p + "ffn_down.weight", mat(e, spec.n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference(path, tokens, kv_type=None, n_ctx=N_CTX):
    """Prompt logits, greedy ids and greedy-step logits from llama.cpp (`kv_type`: ggml type
    id of the K and V cache, F16 when None)."""
    from llama_cpp import Llama
    kv = {"type_k": kv_type, "type_v": kv_type} if kv_type is not None else {}
    # YaRN's betas from the model, as llama.cpp's own tools take them (the wrapper's defaults,
    # 32 and 1, would override a Mistral 3 file's).
    llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=64, n_ubatch=64, n_threads=2,
                logits_all=True, verbose=False, seed=0, flash_attn=True,
                yarn_beta_fast=-1.0, yarn_beta_slow=-1.0, **kv)
    llm.eval(tokens)
    prompt = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    ids, steps = [], []
    last = prompt[-1]
    for _ in range(GREEDY):
        nxt = int(np.argmax(last))
        ids.append(nxt)
        steps.append(last)
        llm.eval([nxt])
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return prompt, ids, np.array(steps)


# Fixtures whose quantized-cache records hold the greedy steps too (`kv_q8_0_greedy_ids`, …),
# as the F16 cache's: gpt-oss's attention sinks on the one-chunk kernel, decode included.
KV_GREEDY = ("gpt_oss32",)


def kv_records(path, tokens, f16_prompt):
    """llama.cpp's prompt logits, greedy ids and greedy-step logits with Q8_0 and with Q4_0 K
    and V caches, as `kv_<type>_…` records (`f16_prompt`: its F16 cache's prompt logits, for
    the shift printed)."""
    rec = {}
    for name, tid in [("q8_0", 8), ("q4_0", 2)]:
        p, ids, steps = reference(path, tokens, tid)
        rec[f"kv_{name}_prompt_logits"] = np.round(p.astype(np.float64), 4).tolist()
        rec[f"kv_{name}_greedy_ids"] = ids
        rec[f"kv_{name}_greedy_logits"] = np.round(steps.astype(np.float64), 4).tolist()
        print(f"{os.path.basename(path)} KV {name}: max |Δlogit| from the F16 cache's {np.abs(p - f16_prompt).max():.3f}, greedy {ids}")
    return rec


def add_kv(out, names):
    """Add the quantized-cache records to existing fixtures (their GGUF and every other record
    kept as they are)."""
    for name in names:
        jpath = os.path.join(out, f"{name}.json")
        with open(jpath) as f:
            rec = json.load(f)
        rec.update(kv_records(os.path.join(out, rec["model"]), rec["tokens"], np.array(rec["prompt_logits"])))
        with open(jpath, "w") as f:
            json.dump(rec, f, separators=(",", ":"))


def make_all(out, only=None):
    """Every fixture, or those named in `only` (each keeps its seed: its place in SPECS)."""
    import llama_cpp
    for i, spec in enumerate(SPECS):
        if only and spec.name not in only:
            continue
        rng = np.random.default_rng(1000 + i)
        path = os.path.join(out, f"{spec.name}.gguf")
        write(spec, path, rng)
        tokens = [int(t) for t in rng.integers(0, N_VOCAB - 2, PROMPT)]
        prompt, ids, steps = reference(path, tokens)
        rec = {
            "model": f"{spec.name}.gguf",
            "arch": spec.arch,
            "llama_cpp": f"llama-cpp-python {llama_cpp.__version__}",
            "tokens": tokens,
            "prompt_logits": np.round(prompt.astype(np.float64), 4).tolist(),
            "greedy_ids": ids,
            "greedy_logits": np.round(steps.astype(np.float64), 4).tolist(),
        }
        if spec.longrope:
            p, i, st = reference(path, tokens, n_ctx=LONG_CTX)
            rec["long_n_ctx"] = LONG_CTX
            rec["long_prompt_logits"] = np.round(p.astype(np.float64), 4).tolist()
            rec["long_greedy_ids"] = i
            rec["long_greedy_logits"] = np.round(st.astype(np.float64), 4).tolist()
            print(f"{spec.name:9} long factors: max |Δlogit| from the short ones {np.abs(p - prompt).max():.3f}")
        if spec.head_dim % 32 == 0 and spec.name in ("qwen3", "gemma2"):
            # Quantized KV cache (llama.cpp's --cache-type-k/-v): prompt logits only.
            for name, tid in [("q8_0", 8), ("q4_0", 2)]:
                p, _, _ = reference(path, tokens, tid)
                rec[f"kv_{name}_prompt_logits"] = np.round(p.astype(np.float64), 4).tolist()
        if spec.name in KV_GREEDY:
            rec.update(kv_records(path, tokens, prompt))
        with open(os.path.join(out, f"{spec.name}.json"), "w") as f:
            json.dump(rec, f, separators=(",", ":"))
        spread = prompt.max(axis=1) - prompt.min(axis=1)
        print(f"{spec.name:9} {os.path.getsize(path):7} bytes  logit spread {spread.mean():.2f}  greedy {ids}")
