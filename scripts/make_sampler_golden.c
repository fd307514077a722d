// llama.cpp's samplers applied to fixed logits, for fixtures/sampler_golden.json (read by
// crates/engine/tests/sampler_golden.rs). Build against a libllama of llama.cpp 4df29be (the
// vendored copy in the llama-cpp-python==0.3.35 sdist), e.g.:
//   cmake -B build -DLLAMA_CURL=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
//         -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=ON && cmake --build build --target llama
//   cc -O2 scripts/make_sampler_golden.c -I$LLAMA/include -I$LLAMA/ggml/include
//      -Lbuild/bin -lllama -lm -o /tmp/sampler_golden
//   LD_LIBRARY_PATH=build/bin /tmp/sampler_golden SmolLM2-135M-Instruct.Q4_1.gguf > fixtures/sampler_golden.json
// The logits: token i gets ((i·40503) mod 65537)/65537·8 − 4 (in f32; no two alike), plus 2 for every
// token of the history; the history is the tokens of TEXT (no BOS). Each case's chain is built in
// its order (llama.cpp's letters, as `--sampling-seq` takes them; default "edskypmx", the default
// chain without the temperature), `t` being the temperature `temp`; nothing draws.
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char * TEXT =
    "Q: what is the capital of France?\nA: Paris is the capital of France.\n"
    "Q: what is the capital of Spain?\nA: Madrid is the capital of Spain.\n"
    "Q: what is the capital of Italy?\nA: Rome is the capital of";

struct cfg {
    const char * name;
    float repeat, freq, present; int last_n;
    float dry_mult, dry_base; int dry_allowed, dry_last_n;
    float sigma; int top_k; float typical, top_p, min_p, xtc_p, xtc_t;
    const char * breaker; // DRY's one breaker, or NULL for llama.cpp's four
    const char * order;   // NULL: "edskypmx"
    float temp;
    struct { const char * text; float logit; } set[6]; // these tokens' logits set first
};

static const struct cfg CASES[] = {
    {"dry_whole",    1.0f, 0.0f, 0.0f, 64, 0.8f, 1.75f, 2, 64, -1.0f, 0, 1.0f, 1.0f, 0.0f, 0.0f, 0.1f},
    {"dry_breaker",  1.0f, 0.0f, 0.0f, 64, 0.8f, 1.75f, 1, 64, -1.0f, 0, 1.0f, 1.0f, 0.0f, 0.0f, 0.1f, " capital"},
    {"penalties_whole", 1.3f, 0.2f, 0.3f, 32, 0.0f, 1.75f, 2, 64, -1.0f, 0, 1.0f, 1.0f, 0.0f, 0.0f, 0.1f},
    {"dry",          1.0f, 0.0f, 0.0f, 64, 0.8f, 1.75f, 2, 64, -1.0f, 40, 1.0f, 1.0f, 0.0f, 0.0f, 0.1f},
    {"dry_long",     1.0f, 0.0f, 0.0f, 64, 1.5f, 2.0f,  1, 256, -1.0f, 60, 1.0f, 1.0f, 0.0f, 0.0f, 0.1f},
    {"penalties",    1.3f, 0.2f, 0.3f, 32, 0.0f, 1.75f, 2, 64, -1.0f, 40, 1.0f, 1.0f, 0.0f, 0.0f, 0.1f},
    {"top_n_sigma",  1.0f, 0.0f, 0.0f, 64, 0.0f, 1.75f, 2, 64, 1.5f, 0, 1.0f, 1.0f, 0.0f, 0.0f, 0.1f},
    {"typical",      1.0f, 0.0f, 0.0f, 64, 0.0f, 1.75f, 2, 64, -1.0f, 200, 0.9f, 1.0f, 0.0f, 0.0f, 0.1f},
    {"xtc",          1.0f, 0.0f, 0.0f, 64, 0.0f, 1.75f, 2, 64, -1.0f, 40, 1.0f, 1.0f, 0.0f, 1.0f, 0.02f},
    {"all",          1.1f, 0.1f, 0.1f, 64, 0.8f, 1.75f, 2, 64, 4.0f, 100, 0.99f, 0.99f, 0.001f, 1.0f, 0.3f},
    // Custom orders: the temperature first; penalties and DRY after the cuts; XTC and typical
    // on the whole vocabulary; top-nσ after the temperature.
    {"order_temp_first", 1.0f, 0.0f, 0.0f, 64, 0.0f, 1.75f, 2, 64, -1.0f, 40, 1.0f, 0.8f, 0.0f, 0.0f, 0.1f, NULL, "tkp", 2.0f},
    {"order_penalties_last", 1.3f, 0.2f, 0.3f, 32, 0.8f, 1.75f, 2, 64, -1.0f, 50, 1.0f, 1.0f, 0.002f, 0.0f, 0.1f, NULL, "kmed", 1.0f},
    {"order_xtc_first", 1.0f, 0.0f, 0.0f, 64, 0.0f, 1.75f, 2, 64, -1.0f, 100, 0.95f, 0.95f, 0.0f, 1.0f, 0.001f, NULL, "xykpt", 1.5f},
    // The infill stage, on tokens given biases (a text of one token each): prefixes merged,
    // end-of-generation tokens taking over, no text token left.
    {"order_infill_merge", 1.0f, 0.0f, 0.0f, 64, 0.0f, 1.75f, 2, 64, -1.0f, 10, 1.0f, 1.0f, 0.0f, 0.0f, 0.1f, NULL, "kti", 1.0f,
     {{" return", 20.0f}, {" ret", 19.6f}, {" re", 19.0f}, {" x", 18.0f}}},
    {"order_infill_end", 1.0f, 0.0f, 0.0f, 64, 0.0f, 1.75f, 2, 64, -1.0f, 10, 1.0f, 1.0f, 0.0f, 0.0f, 0.1f, NULL, "kti", 1.0f,
     {{" return", 20.0f}, {"<|endoftext|>", 19.0f}, {"<|im_end|>", 18.0f}}},
    {"order_infill_none", 1.0f, 0.0f, 0.0f, 64, 0.0f, 1.75f, 2, 64, -1.0f, 8, 1.0f, 1.0f, 0.0f, 0.0f, 0.1f, NULL, "kti", 1.0f,
     {{" a", 20.0f}, {" b", 20.0f}, {" c", 20.0f}, {" d", 20.0f}, {" e", 20.0f}, {" f", 20.0f}}},
    {"order_sigma_after_temp", 1.3f, 0.0f, 0.0f, 64, 0.0f, 1.75f, 2, 64, 3.0f, 30, 1.0f, 1.0f, 0.0f, 0.0f, 0.1f, NULL, "tske", 0.7f},
};

int main(int argc, char ** argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]); return 1; }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token hist[512];
    const int n_hist = llama_tokenize(vocab, TEXT, strlen(TEXT), hist, 512, false, false);
    float * logits = malloc(sizeof(float) * n_vocab);
    for (int i = 0; i < n_vocab; i++) {
        logits[i] = (float)((unsigned long long) i * 40503u % 65537u) / 65537.0f * 8.0f - 4.0f;
    }
    for (int i = 0; i < n_hist; i++) logits[hist[i]] += 2.0f;
    llama_token_data * data = malloc(sizeof(llama_token_data) * n_vocab);
    const char * defaults[] = {"\n", ":", "\"", "*"};
    printf("{\"text\": \"see scripts/make_sampler_golden.c\", \"history\": [");
    for (int i = 0; i < n_hist; i++) printf("%s%d", i ? ", " : "", hist[i]);
    printf("], \"cases\": [\n");
    const int n_cases = sizeof(CASES) / sizeof(CASES[0]);
    for (int c = 0; c < n_cases; c++) {
        const struct cfg * k = &CASES[c];
        struct llama_sampler * ch = llama_sampler_chain_init(llama_sampler_chain_default_params());
        const char * one[1] = {k->breaker};
        const char ** breakers = k->breaker ? one : defaults;
        const char * order = k->order ? k->order : "edskypmx";
        for (const char * o = order; *o; o++) {
            switch (*o) {
                case 'e': llama_sampler_chain_add(ch, llama_sampler_init_penalties(n_vocab, k->last_n, k->repeat, k->freq, k->present)); break;
                case 'd': llama_sampler_chain_add(ch, llama_sampler_init_dry(vocab, k->dry_mult, k->dry_base, k->dry_allowed, k->dry_last_n, breakers, k->breaker ? 1 : 4)); break;
                case 's': llama_sampler_chain_add(ch, llama_sampler_init_top_n_sigma(k->sigma)); break;
                case 'k': llama_sampler_chain_add(ch, llama_sampler_init_top_k(k->top_k)); break;
                case 'y': llama_sampler_chain_add(ch, llama_sampler_init_typical(k->typical, 0)); break;
                case 'p': llama_sampler_chain_add(ch, llama_sampler_init_top_p(k->top_p, 0)); break;
                case 'm': llama_sampler_chain_add(ch, llama_sampler_init_min_p(k->min_p, 0)); break;
                case 'x': llama_sampler_chain_add(ch, llama_sampler_init_xtc(k->xtc_p, k->xtc_t, 0, 1234)); break;
                case 't': llama_sampler_chain_add(ch, llama_sampler_init_temp_ext(k->temp, 0.0f, 1.0f)); break;
                case 'i': llama_sampler_chain_add(ch, llama_sampler_init_infill(vocab)); break;
                default: fprintf(stderr, "unknown stage %c\n", *o); return 1;
            }
        }
        for (int i = 0; i < n_hist; i++) llama_sampler_accept(ch, hist[i]);
        for (int i = 0; i < n_vocab; i++) data[i] = (llama_token_data){i, logits[i], 0.0f};
        // Logits set by text: written out as biases onto the fixed logits.
        llama_token set_ids[6]; int n_set = 0;
        for (int j = 0; j < 6 && k->set[j].text; j++) {
            llama_token t[4];
            if (llama_tokenize(vocab, k->set[j].text, strlen(k->set[j].text), t, 4, false, true) != 1) {
                fprintf(stderr, "%s is not one token\n", k->set[j].text); return 1;
            }
            set_ids[n_set++] = t[0];
            data[t[0]].logit = k->set[j].logit;
        }
        llama_token_data_array cur = {data, (size_t) n_vocab, -1, false};
        llama_sampler_apply(ch, &cur);
        printf("  {\"name\": \"%s\", \"repeat_penalty\": %g, \"frequency_penalty\": %g, \"presence_penalty\": %g, "
               "\"repeat_last_n\": %d, \"dry_multiplier\": %g, \"dry_base\": %g, \"dry_allowed_length\": %d, "
               "\"dry_penalty_last_n\": %d, \"top_n_sigma\": %g, \"top_k\": %d, \"typical_p\": %g, \"top_p\": %g, "
               "\"min_p\": %g, \"xtc_probability\": %g, \"xtc_threshold\": %g, \"breaker\": \"%s\", \"order\": \"%s\", "
               "\"temperature\": %g, \"bias\": [",
               k->name, k->repeat, k->freq, k->present, k->last_n, k->dry_mult, k->dry_base, k->dry_allowed,
               k->dry_last_n, k->sigma, k->top_k, k->typical, k->top_p, k->min_p, k->xtc_p, k->xtc_t,
               k->breaker ? k->breaker : "", order, k->order ? k->temp : 1.0f);
        for (int j = 0; j < n_set; j++) printf("%s[%d, %.9g]", j ? ", " : "", set_ids[j], k->set[j].logit - logits[set_ids[j]]);
        printf("],\n   \"kept\": [");
        // Every finite logit when few are left; else how many are, and those that changed.
        int first = 1, finite = 0;
        for (size_t i = 0; i < cur.size; i++) finite += !isinf(cur.data[i].logit);
        for (size_t i = 0; i < cur.size && finite <= 200; i++) {
            if (isinf(cur.data[i].logit)) continue;
            printf("%s[%d, %.9g]", first ? "" : ", ", cur.data[i].id, cur.data[i].logit);
            first = 0;
        }
        printf("],\n   \"size\": %d, \"changed\": [", finite);
        first = 1;
        for (size_t i = 0; i < cur.size; i++) {
            if (isinf(cur.data[i].logit) || cur.data[i].logit == logits[cur.data[i].id]) continue;
            printf("%s[%d, %.9g]", first ? "" : ", ", cur.data[i].id, cur.data[i].logit);
            first = 0;
        }
        printf("]}%s\n", c + 1 < n_cases ? "," : "");
        llama_sampler_free(ch);
    }
    printf("]}\n");
    llama_model_free(model);
    return 0;
}
