#!/usr/bin/env python3
"""llama.cpp's byte-level BPE tokenization under each `tokenizer.ggml.pre` corelm knows, for
`crates/engine/tests/golden.rs` (`pre_tokenizers_split_as_llama_cpp`).

The golden models name two pre-tokenizers (`smollm`, `qwen2`); the others llama.cpp keeps
(Llama 3's, Tekken, DeepSeek's, GPT-4o's, ...) differ in their split regexes, in taking a
piece that is itself a token whole (`ignore_merges`) and in adding BOS where the file does not
say. So this relabels SmolLM2's file with each name (through gguf-py's `gguf_new_metadata`;
`tokenizer.ggml.add_bos_token` removed so each name's BOS default shows, three merges removed
so that `ignore_merges` shows) and runs the pinned
llama.cpp's `llama-tokenize` (4df29be, from the llama-cpp-python 0.3.35 sdist, cmake target
`llama-tokenize`) on the golden tokenizer texts and a few more, joined by `<|endoftext|>` (a
control token: llama.cpp tokenizes the text between special tokens piece by piece, so the ids
split back per text). Identical results are stored once. Writes
`fixtures/pre_tokenizer_golden.json`. Run by hand (needs numpy for gguf-py):

    python3 scripts/make_pre_tokenizer_golden.py --llama-cpp /path/to/vendor/llama.cpp
"""
import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from make_spm_prefix_golden import tokenize  # llama-tokenize on a text: its ids

ROOT = Path(__file__).resolve().parent.parent
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
SEP, SEP_ID = "<|endoftext|>", 0
# SmolLM2's vocabulary reaches every token through its merges, so `ignore_merges` (a piece that
# is a token taken whole) would change nothing on it; without these merges " the", " and" and
# "ing" are tokens that the merges no longer build.
REMOVED_MERGES = ["Ġt he", "Ġa nd", "in g"]

# Where the regex groups differ: letters of other scripts and cases, digit runs, contractions
# in capitals, CR LF, punctuation runs, camel case, and words SmolLM2's merges do not reach
# whole although the vocabulary holds them (`ignore_merges`).
EXTRA = [
    "HelloWorld iPhone McDonald's DON'T WE'LL",
    "1234567 12 123 1,234,567.89",
    "中文分词测试 日本語のテキスト 한국어 텍스트",
    "line one\r\nline two\r\n\r\n",
    "!!! ??? ... --- +++ === <<<>>> $$$ ^^^ ~~~ |||",
    "Ελληνικά кириллица עברית العربية हिन्दी",
    "snake_case_name = camelCaseName + PascalCase",
    "a/b/c\\d https://example.com/path?q=1&r=2",
]


def names_from_table() -> list:
    src = (ROOT / "crates/engine/src/tokenizer/pre.rs").read_text()
    table = src[src.index("pub const TABLE"):src.index("];", src.index("pub const TABLE"))]
    return [n for row in re.findall(r"names: &\[([^\]]*)\]", table) for n in re.findall(r'"([^"]+)"', row)]


def relabel(llama_cpp: Path, src: Path, dst: Path, pre: str):
    """`src` copied to `dst` with `tokenizer.ggml.pre = pre`, without `add_bos_token` and
    without the merges of REMOVED_MERGES (through gguf-py's `gguf_new_metadata`)."""
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata
    reader = gguf.GGUFReader(src, "r")
    merges = reader.get_field("tokenizer.ggml.merges").contents()
    assert all(m in merges for m in REMOVED_MERGES), "a merge to remove is not in the file"
    arch = reader.get_field("general.architecture").contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    new = {
        "tokenizer.ggml.pre": MetadataDetails(gguf.GGUFValueType.STRING, pre),
        "tokenizer.ggml.merges": MetadataDetails(gguf.GGUFValueType.ARRAY, [m for m in merges if m not in REMOVED_MERGES], sub_type=gguf.GGUFValueType.STRING),
    }
    copy_with_new_metadata(reader, writer, new, ["tokenizer.ggml.add_bos_token"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, type=Path, help="the sdist's vendor/llama.cpp, built")
    ap.add_argument("--models", default=os.environ.get("CORELM_MODELS_DIR", str(Path.home() / ".cache/corelm/models")))
    ap.add_argument("--golden", default=str(ROOT.parent / "shared/golden/SmolLM2-135M-Instruct.Q4_1/tokenizer.json"))
    ap.add_argument("--out", default=str(ROOT / "fixtures/pre_tokenizer_golden.json"))
    a = ap.parse_args()
    tool = a.llama_cpp / "build/bin/llama-tokenize"
    texts = [c["text"] for c in json.load(open(a.golden))["cases"]] + EXTRA
    assert not any(SEP in t for t in texts), f"a text holds the separator {SEP}"
    outputs, names = [], {}
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "pre.gguf"
        for name in names_from_table():
            relabel(a.llama_cpp, Path(a.models) / MODEL, model, name)
            ids = tokenize(str(tool), model, SEP.join(texts), False, True)
            per_text, cur = [], []
            for i in ids:
                if i == SEP_ID:
                    per_text.append(cur)
                    cur = []
                else:
                    cur.append(i)
            per_text.append(cur)
            assert len(per_text) == len(texts), f"{name}: {len(per_text)} pieces for {len(texts)} texts"
            if per_text not in outputs:
                outputs.append(per_text)
            names[name] = {"output": outputs.index(per_text), "hello_with_special": tokenize(str(tool), model, "Hello", True, True)}
            print(f"{name}: output {names[name]['output']}, BOS {names[name]['hello_with_special'][:1]}")
    out = {"model_file": MODEL, "changed": "tokenizer.ggml.pre = <name>; tokenizer.ggml.add_bos_token removed; removed_merges removed",
           "removed_merges": REMOVED_MERGES,
           "llama_cpp_commit": "4df29be", "texts": texts, "names": names, "outputs": outputs}
    Path(a.out).write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"{len(names)} names, {len(outputs)} distinct outputs written to {a.out}")


if __name__ == "__main__":
    main()
