// What a LoRA adapter costs llama.cpp, beside `corelm bench --lora` on the same file
// (docs/benchmarks.md). Writes OUT.gguf: a rank-R F32 adapter (alpha = R) on every layer's
// Q, K, V, Wo, gate, up and down — PEFT's "all-linear", in convert_lora_to_gguf.py's default
// type — then times llama.cpp's prompt processing (PP tokens, one batch) and generation (TG
// tokens one at a time) without and with it, best of REPS, on THREADS threads.
// Build as make_lora_golden.c; run:
//   LD_LIBRARY_PATH=build/bin /tmp/bench_lora MODEL.gguf OUT.gguf R PP TG REPS THREADS
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static unsigned int rng = 2463534242u;
static float uniform(float r) {
    rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5;
    return ((float) (rng % 20001) / 10000.0f - 1.0f) * r;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int meta_int(struct llama_model * m, const char * arch, const char * key, int dflt) {
    char k[128], buf[64];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return llama_model_meta_val_str(m, k, buf, sizeof buf) < 0 ? dflt : atoi(buf);
}

// Best-of-`reps` prompt and generation rates (t/s) of `ctx`.
static void timed(struct llama_context * ctx, int n_vocab, int pp, int tg, int reps, double * pp_ts, double * tg_ts) {
    llama_token * toks = malloc(sizeof(llama_token) * pp);
    for (int i = 0; i < pp; i++) toks[i] = (llama_token) ((i * 7919 + 13) % n_vocab);
    *pp_ts = *tg_ts = 0;
    for (int r = 0; r < reps; r++) {
        llama_memory_clear(llama_get_memory(ctx), true);
        double t0 = now();
        if (llama_decode(ctx, llama_batch_get_one(toks, pp))) exit(1);
        double t1 = now();
        llama_token t = 1;
        for (int i = 0; i < tg; i++) {
            if (llama_decode(ctx, llama_batch_get_one(&t, 1))) exit(1);
            t = (llama_token) ((t * 31 + 7) % n_vocab);
        }
        double t2 = now();
        if (pp / (t1 - t0) > *pp_ts) *pp_ts = pp / (t1 - t0);
        if (tg / (t2 - t1) > *tg_ts) *tg_ts = tg / (t2 - t1);
    }
    free(toks);
}

int main(int argc, char ** argv) {
    if (argc != 8) { fprintf(stderr, "usage: %s MODEL.gguf OUT.gguf R PP TG REPS THREADS\n", argv[0]); return 1; }
    const int r = atoi(argv[3]), pp = atoi(argv[4]), tg = atoi(argv[5]), reps = atoi(argv[6]), threads = atoi(argv[7]);
    llama_backend_init();
    struct llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) return 1;
    char arch[64];
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    const int n_embd = llama_model_n_embd(model), n_layer = llama_model_n_layer(model);
    const int n_head = llama_model_n_head(model), n_kv = llama_model_n_head_kv(model);
    const int hd = meta_int(model, arch, "attention.key_length", n_embd / n_head);
    const int n_ff = meta_int(model, arch, "feed_forward_length", 0);
    const char * tname[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    const int n_in[] = {n_embd, n_embd, n_embd, n_head * hd, n_embd, n_embd, n_ff};
    const int n_out[] = {n_head * hd, n_kv * hd, n_kv * hd, n_embd, n_ff, n_ff, n_embd};
    struct ggml_init_params ip = {(size_t) 1 << 30, NULL, false};
    struct ggml_context * c = ggml_init(ip);
    struct gguf_context * g = gguf_init_empty();
    gguf_set_val_str(g, "general.type", "adapter");
    gguf_set_val_str(g, "general.architecture", arch);
    gguf_set_val_str(g, "adapter.type", "lora");
    gguf_set_val_f32(g, "adapter.lora.alpha", (float) r);
    const float amp = 0.15f * sqrtf(64.0f / (float) n_embd);
    for (int il = 0; il < n_layer; il++) {
        for (int j = 0; j < 7; j++) {
            struct ggml_tensor * t[2] = {ggml_new_tensor_2d(c, GGML_TYPE_F32, n_in[j], r), ggml_new_tensor_2d(c, GGML_TYPE_F32, r, n_out[j])};
            for (int k = 0; k < 2; k++) {
                char name[160];
                snprintf(name, sizeof name, "blk.%d.%s.weight.lora_%c", il, tname[j], k ? 'b' : 'a');
                ggml_set_name(t[k], name);
                for (int64_t i = 0; i < ggml_nelements(t[k]); i++) ((float *) t[k]->data)[i] = uniform(amp);
                gguf_add_tensor(g, t[k]);
            }
        }
    }
    if (!gguf_write_to_file(g, argv[2], false)) return 1;
    struct llama_adapter_lora * a = llama_adapter_lora_init(model, argv[2]);
    if (!a) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = pp + tg + 16; cp.n_batch = pp; cp.n_ubatch = pp; cp.n_threads = threads; cp.n_threads_batch = threads;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    double pp0, tg0, pp1, tg1;
    float one = 1.0f;
    timed(ctx, n_vocab, pp, tg, reps, &pp0, &tg0);
    llama_set_adapters_lora(ctx, &a, 1, &one);
    timed(ctx, n_vocab, pp, tg, reps, &pp1, &tg1);
    printf("llama.cpp rank %d: pp%d %.1f -> %.1f t/s (%.3f), tg%d %.1f -> %.1f t/s (%.3f)\n", r, pp, pp0, pp1, pp1 / pp0, tg, tg0, tg1, tg1 / tg0);
    return 0;
}
