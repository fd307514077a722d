// LoRA adapters for a tiny fixture model and llama.cpp's logits with them applied, for
// fixtures/lora_<model>.json (read by crates/engine/tests/lora.rs). Build against a libllama of
// llama.cpp 4df29be (the vendored copy in the llama-cpp-python==0.3.35 sdist; see
// make_sampler_golden.c for the cmake line):
//   cc -O2 scripts/make_lora_golden.c -I$LLAMA/include -I$LLAMA/ggml/include
//      -Lbuild/bin -lllama -lggml -lggml-base -lm -o /tmp/lora_golden
//   LD_LIBRARY_PATH=build/bin /tmp/lora_golden fixtures/llama3.gguf fixtures/lora_llama3 > fixtures/lora_llama3.json
// Writes two adapters beside the prefix: `.f32.gguf` (rank 4, alpha 8, F32: Q, V, Wo, gate,
// down of every layer) and `.f16.gguf` (rank 2, no alpha, F16: K, up, gate), values from a
// fixed xorshift in ±0.15·√(64/n_embd); then, with both applied (scales 0.75 and 0.5), every position's logits of 32
// fixed tokens in one batch and 8 greedy steps one token at a time — the fields of the fixture
// JSONs of make_fixtures.py; rows of a vocabulary over 1,024 tokens as their 16 largest
// logits, [id, logit] — and the first prompt row without adapters (`base_row0`).
// crates/engine/tests/lora.rs writes the same adapters (same xorshift, same order).
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned int rng = 2463534242u;
static unsigned int next(void) {
    rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5;
    return rng;
}
static float uniform(float r) {
    return ((float) (next() % 20001) / 10000.0f - 1.0f) * r;
}

static int meta_int(struct llama_model * m, const char * arch, const char * key, int dflt) {
    char k[128], buf[64];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return llama_model_meta_val_str(m, k, buf, sizeof buf) < 0 ? dflt : atoi(buf);
}

// Adds `name`.lora_a ([n_in, r]) and .lora_b ([r, n_out]) of `type` to `g`.
static void pair(struct ggml_context * c, struct gguf_context * g, enum ggml_type type, const char * name, int n_in, int n_out, int r, float amp) {
    char n[160];
    struct ggml_tensor * t[2] = {ggml_new_tensor_2d(c, type, n_in, r), ggml_new_tensor_2d(c, type, r, n_out)};
    for (int k = 0; k < 2; k++) {
        snprintf(n, sizeof n, "%s.lora_%c", name, k ? 'b' : 'a');
        ggml_set_name(t[k], n);
        const int64_t count = ggml_nelements(t[k]);
        for (int64_t i = 0; i < count; i++) {
            float v = uniform(amp);
            if (type == GGML_TYPE_F16) ((ggml_fp16_t *) t[k]->data)[i] = ggml_fp32_to_fp16(v);
            else ((float *) t[k]->data)[i] = v;
        }
        gguf_add_tensor(g, t[k]);
    }
}

struct spec { const char * file; enum ggml_type type; int rank; float alpha; const char * mats; float scale; };

// A row of logits: all of them for a small vocabulary, else the TOP largest as [id, logit]
// pairs, largest first.
enum { TOP = 16 };
static void print_row(const float * l, int n) {
    printf("[");
    if (n <= 1024) {
        for (int i = 0; i < n; i++) printf("%s%.4f", i ? ", " : "", l[i]);
    } else {
        int top[TOP];
        for (int k = 0; k < TOP; k++) {
            int best = -1;
            for (int i = 0; i < n; i++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= top[j] == i;
                if (!taken && (best < 0 || l[i] > l[best])) best = i;
            }
            top[k] = best;
            printf("%s[%d, %.4f]", k ? ", " : "", best, l[best]);
        }
    }
    printf("]");
}

int main(int argc, char ** argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s MODEL.gguf OUT_PREFIX\n", argv[0]); return 1; }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    char arch[64];
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    const int n_embd = llama_model_n_embd(model), n_layer = llama_model_n_layer(model);
    const int n_head = llama_model_n_head(model), n_kv = llama_model_n_head_kv(model);
    const int hd = meta_int(model, arch, "attention.key_length", n_embd / n_head);
    const int n_ff = meta_int(model, arch, "feed_forward_length", 0);
    // Matrices by letter: q k v o g u d.
    const char * tname[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    const char * letters = "qkvogud";
    const int n_in[] = {n_embd, n_embd, n_embd, n_head * hd, n_embd, n_embd, n_ff};
    const int n_out[] = {n_head * hd, n_kv * hd, n_kv * hd, n_embd, n_ff, n_ff, n_embd};
    struct spec specs[2] = {
        {"f32", GGML_TYPE_F32, 4, 8.0f, "qvogd", 0.75f},
        {"f16", GGML_TYPE_F16, 2, 0.0f, "kug", 0.5f},
    };
    // Values in ±amp: 0.15 at a width of 64, less for wider models (a product of two of them
    // over the width moves an output by about amp² · width).
    const float amp = 0.15f * sqrtf(64.0f / (float) n_embd);
    struct llama_adapter_lora * adapters[2];
    float scales[2];
    char files[2][512];
    for (int s = 0; s < 2; s++) {
        struct ggml_init_params ip = {256u << 20, NULL, false};
        struct ggml_context * c = ggml_init(ip);
        struct gguf_context * g = gguf_init_empty();
        gguf_set_val_str(g, "general.type", "adapter");
        gguf_set_val_str(g, "general.architecture", arch);
        gguf_set_val_str(g, "adapter.type", "lora");
        gguf_set_val_f32(g, "adapter.lora.alpha", specs[s].alpha);
        for (int il = 0; il < n_layer; il++) {
            for (const char * m = specs[s].mats; *m; m++) {
                const int j = (int) (strchr(letters, *m) - letters);
                char name[128];
                snprintf(name, sizeof name, "blk.%d.%s.weight", il, tname[j]);
                pair(c, g, specs[s].type, name, n_in[j], n_out[j], specs[s].rank, amp);
            }
        }
        snprintf(files[s], sizeof files[s], "%s.%s.gguf", argv[2], specs[s].file);
        if (!gguf_write_to_file(g, files[s], false)) { fprintf(stderr, "cannot write %s\n", files[s]); return 1; }
        gguf_free(g);
        ggml_free(c);
        adapters[s] = llama_adapter_lora_init(model, files[s]);
        if (!adapters[s]) return 1;
        scales[s] = specs[s].scale;
    }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 128; cp.n_batch = 64; cp.n_ubatch = 64; cp.n_threads = 2; cp.n_threads_batch = 2;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    enum { N = 32, STEPS = 8 };
    llama_token tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (llama_token) (next() % (unsigned) n_vocab);

    // Without adapters: the first row, to show the adapters change it.
    struct llama_batch b = llama_batch_init(N, 0, 1);
    for (int i = 0; i < N; i++) { b.token[i] = tokens[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1; }
    b.n_tokens = N;
    if (llama_decode(ctx, b)) return 1;
    float * base0 = malloc(sizeof(float) * n_vocab);
    memcpy(base0, llama_get_logits_ith(ctx, 0), sizeof(float) * n_vocab);
    llama_memory_clear(llama_get_memory(ctx), true);

    llama_set_adapters_lora(ctx, adapters, 2, scales);
    if (llama_decode(ctx, b)) return 1;
    printf("{\"model\": \"%s\", \"arch\": \"%s\", \"llama_cpp\": \"4df29be\",\n", strrchr(argv[1], '/') ? strrchr(argv[1], '/') + 1 : argv[1], arch);
    printf("\"adapters\": [");
    for (int s = 0; s < 2; s++) printf("%s{\"file\": \"%s\", \"scale\": %g}", s ? ", " : "", strrchr(files[s], '/') ? strrchr(files[s], '/') + 1 : files[s], scales[s]);
    printf("],\n\"tokens\": [");
    for (int i = 0; i < N; i++) printf("%s%d", i ? ", " : "", tokens[i]);
    printf("],\n\"base_row0\": ");
    print_row(base0, n_vocab);
    printf(",\n\"prompt_logits\": [");
    for (int i = 0; i < N; i++) { printf(i ? ",\n" : "\n"); print_row(llama_get_logits_ith(ctx, i), n_vocab); }
    llama_token last = 0;
    {
        const float * l = llama_get_logits_ith(ctx, N - 1);
        for (int v = 1; v < n_vocab; v++) if (l[v] > l[last]) last = v;
    }
    llama_token ids[STEPS];
    float * steps = malloc(sizeof(float) * n_vocab * STEPS);
    for (int k = 0; k < STEPS; k++) {
        ids[k] = last;
        struct llama_batch one = llama_batch_get_one(&last, 1);
        if (llama_decode(ctx, one)) return 1;
        const float * l = llama_get_logits_ith(ctx, -1);
        memcpy(steps + (size_t) k * n_vocab, l, sizeof(float) * n_vocab);
        last = 0;
        for (int v = 1; v < n_vocab; v++) if (l[v] > l[last]) last = v;
    }
    printf("],\n\"greedy_ids\": [");
    for (int k = 0; k < STEPS; k++) printf("%s%d", k ? ", " : "", ids[k]);
    printf("],\n\"greedy_logits\": [");
    for (int k = 0; k < STEPS; k++) { printf(k ? ",\n" : "\n"); print_row(steps + (size_t) k * n_vocab, n_vocab); }
    printf("]}\n");
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
