#!/usr/bin/env python3
"""llama.cpp's greedy answers under GBNF grammars, for `crates/engine/tests/grammar.rs`.

Runs the pinned llama-cpp-python 0.3.35 (llama.cpp 4df29be, the golden data's commit) on each
golden model with a few prompts and grammars: the prompt tokenized by llama.cpp (its BOS rule),
then `Llama.generate` with temperature 0, no repeat penalty and the grammar (llama.cpp's
sampler chain: penalties, grammar, greedy), until an end-of-generation token or `max_tokens`.
Writes `fixtures/grammar_golden.json`: per case the model, prompt ids, grammar, generated ids,
whether an end token stopped it, and at each step the 16 highest raw logits and the chosen one's (before the grammar),
so a test can tell a near tie (where another summation order may pick the other token) from a
real difference. Run by hand with the venv that has llama-cpp-python:

    /work/cache/llama-venv/bin/python scripts/make_grammar_golden.py
"""
import json
import os
from pathlib import Path

MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "qwen2": "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
}

JSON_GBNF = r"""root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
"""

CASES = [
    ("Three fruits, one per line:\n", r'root ::= ("- " [A-Za-z ]+ "\n"){2,4}', 40),
    ("12 times 7 equals", r'root ::= " " [0-9]+ ("." [0-9]{1,2})? "."', 16),
    ("A JSON object describing a cat named Tom:", JSON_GBNF, 48),
    ("The Japanese word for cat is", r'root ::= " " [ぁ-んァ-ン一-龯]{1,4} ( " (" [a-z]+ ")" )? "."', 24),
    ("Is the sky blue? Answer yes or no, then why.", r'root ::= " " ("Yes" | "No") ", because " [a-z ,]{5,60} "."', 40),
    ("Write a greeting in French:", r'root ::= " " [^\n]{1,30} "\n"', 24),
]


def main():
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama, LlamaGrammar

    models = Path(os.environ.get("CORELM_MODELS_DIR", Path.home() / ".cache/corelm/models"))
    out = []
    for name, file in MODELS.items():
        llm = Llama(model_path=str(models / file), n_ctx=2048, n_batch=2048, n_ubatch=512, n_threads=2, flash_attn=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
        for prompt, gbnf, max_tokens in CASES:
            grammar = LlamaGrammar.from_string(gbnf, verbose=False)
            ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
            toks, eog, tops = [], False, []
            for t in llm.generate(ids, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, grammar=grammar):
                # The logits this token was chosen from (the context's only output row).
                row = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
                top = np.argsort(-row)[:16]
                tops.append([[int(i), round(float(row[i]), 4)] for i in top] + [[int(t), round(float(row[t]), 4)]])
                if llama_cpp.llama_vocab_is_eog(vocab, t):
                    eog = True
                    break
                toks.append(t)
                if len(toks) == max_tokens:
                    break
            text = llm.detokenize(toks).decode("utf-8", "replace")
            print(f"{name}: {prompt!r} -> {text!r}{' <eog>' if eog else ''}")
            out.append({"model": name, "file": file, "prompt": prompt, "prompt_ids": ids, "grammar": gbnf,
                        "max_tokens": max_tokens, "tokens": toks, "eog": eog, "text": text, "top_logits": tops})
        del llm
    path = Path(__file__).resolve().parent.parent / "fixtures" / "grammar_golden.json"
    path.write_text(json.dumps({"llama_cpp": "4df29be (llama-cpp-python 0.3.35)", "cases": out}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
