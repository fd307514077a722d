#!/usr/bin/env python3
"""llama.cpp's tokenization of a SentencePiece vocabulary with `add_space_prefix`, for
`crates/engine/tests/spm_prefix.rs`.

None of the golden models has that flag set (Gemma 3's file says false, the other two are
byte-level BPE), yet it is llama.cpp's default for SentencePiece vocabularies (Llama 2,
Mistral, TinyLlama). So this takes Gemma 3's file with the flag turned to true (one byte of a
copy's metadata: the same vocabulary, scores and token types), and runs the pinned llama.cpp's
`llama-tokenize` (4df29be, built from the llama-cpp-python 0.3.35 sdist with cmake, target
`llama-tokenize`) on the golden tokenizer texts and a few chat-shaped ones, three ways as in
the golden `tokenizer.json`: special tokens parsed, with BOS, and special tokens as text.
Writes `fixtures/spm_prefix_golden.json`. Run by hand:

    python3 scripts/make_spm_prefix_golden.py --llama-tokenize /path/to/build/bin/llama-tokenize
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "gemma-3-270m-q4_k_m.gguf"
KEY = b"tokenizer.ggml.add_space_prefix"
GGUF_BOOL = 7

# Runs of text after special tokens, leading and doubled spaces, newlines first: where the
# prefix is or is not added.
EXTRA = [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>Hello",
    "Hello<end_of_turn>world",
    "<start_of_turn><end_of_turn>",
    " leading space",
    "  two leading spaces",
    "\nnewline first",
    "trailing space ",
    "▁already a marker",
    "a<start_of_turn> b",
]


def flip(src: Path, dst: Path):
    """Copy `src` with its add_space_prefix bool set to true (the key, then its u32 type 7,
    then one byte)."""
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        head = f.read(16 << 20)
        at = head.find(struct.pack("<Q", len(KEY)) + KEY)
        if at < 0:
            raise SystemExit(f"{src}: no {KEY.decode()} key in its first 16 MiB")
        at += 8 + len(KEY)
        (tag,) = struct.unpack_from("<I", head, at)
        if tag != GGUF_BOOL or head[at + 4] != 0:
            raise SystemExit(f"{src}: {KEY.decode()} is not a false bool (type {tag})")
        f.seek(at + 4)
        f.write(b"\x01")


def tokenize(tool: str, model: Path, text: str, bos: bool, special: bool) -> list:
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as t:
        t.write(text.encode())
    try:
        args = [tool, "-m", str(model), "-f", t.name, "--no-escape", "--ids", "--log-disable"]
        args += [] if bos else ["--no-bos"]
        args += [] if special else ["--no-parse-special"]  # parsed by default
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(t.name)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-tokenize", required=True)
    ap.add_argument("--models", default=os.environ.get("CORELM_MODELS_DIR", str(Path.home() / ".cache/corelm/models")))
    ap.add_argument("--golden", default=str(ROOT.parent / "shared/golden/gemma-3-270m-q4_k_m/tokenizer.json"))
    ap.add_argument("--out", default=str(ROOT / "fixtures/spm_prefix_golden.json"))
    a = ap.parse_args()
    texts = [c["text"] for c in json.load(open(a.golden))["cases"]] + EXTRA
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "prefix.gguf"
        flip(Path(a.models) / MODEL, model)
        cases = []
        for text in texts:
            cases.append({
                "text": text,
                "ids": tokenize(a.llama_tokenize, model, text, False, True),
                "ids_add_special": tokenize(a.llama_tokenize, model, text, True, True),
                "ids_no_parse_special": tokenize(a.llama_tokenize, model, text, False, False),
            })
    out = {"model_file": MODEL, "changed": "tokenizer.ggml.add_space_prefix = true", "llama_cpp_commit": "4df29be", "cases": cases}
    Path(a.out).write_text(json.dumps(out, ensure_ascii=False, indent=0) + "\n")
    print(f"{len(cases)} cases written to {a.out}")


if __name__ == "__main__":
    main()
