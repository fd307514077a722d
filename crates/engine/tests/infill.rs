//! Fill in the middle on Qwen2.5-Coder: its FIM tokens found, the prompt laid out as
//! Qwen2.5-Coder's card and llama-server write it, cut to a budget, and the middle it writes
//! equal to llama.cpp's.

mod common;

use common::*;
use corelm_engine::generate::{generate, GenerateParams, StopReason};
use corelm_engine::infill::{self, Chunk};
use corelm_engine::sample::SamplingParams;
use corelm_engine::tokenizer::Fim;

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf";

fn tokenizer(file: &str) -> corelm_engine::Tokenizer {
    let g = corelm_gguf::Gguf::open(model_path(file)).unwrap();
    corelm_engine::Tokenizer::from_gguf(&g).unwrap()
}

#[test]
fn fim_tokens_are_found_by_their_text() {
    let fim = Fim { pre: 151659, suf: 151661, mid: 151660, rep: Some(151663), sep: Some(151664) };
    let qwen = tokenizer(QWEN);
    assert_eq!(qwen.fim, Some(fim));
    // FIM tokens are control tokens: their text in a prompt parsed for special tokens is them.
    assert_eq!(qwen.encode("<|fim_prefix|>x<|fim_middle|>", false, true).unwrap(), [151659, 87, 151660]);
    // SmolLM2 has a `<reponame>` only, Gemma 3 none: no FIM.
    assert_eq!(tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf").fim, None);
    assert_eq!(tokenizer("gemma-3-270m-q4_k_m.gguf").fim, None);
    let e = infill::prompt(&tokenizer("gemma-3-270m-q4_k_m.gguf"), "a", "b", &[], "", 100).unwrap_err();
    assert!(e.to_string().contains("no fill-in-the-middle tokens"), "{e}");
}

#[test]
fn prompts_are_laid_out_and_cut_to_their_budget() {
    let tok = tokenizer(QWEN);
    let t = |s: &str| tok.encode(s, false, false).unwrap();
    let (pre, suf, mid, rep, sep) = (151659, 151661, 151660, 151663, 151664);
    let (prefix, suffix) = ("def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n");
    // One file: [PRE]prefix[SUF]suffix[MID] (Qwen adds no BOS).
    let one = infill::prompt(&tok, prefix, suffix, &[], "", 1000).unwrap();
    assert_eq!(one, [vec![pre], t(prefix), vec![suf], t(suffix), vec![mid]].concat());
    // With context files and a prompt after the prefix: llama-server's repository layout.
    let files = [Chunk { filename: "util.py".into(), text: "X = 1\n".into() }];
    let repo = infill::prompt(&tok, prefix, suffix, &files, "a", 1000).unwrap();
    let want = [vec![rep], t("myproject\n"), vec![sep], t("util.py\n"), t("X = 1\n"), vec![sep], t("filename\n"), vec![pre], t(prefix), t("a"), vec![suf], t(suffix), vec![mid]].concat();
    assert_eq!(repo, want);
    // Long prefix and suffix in 3 + 40 tokens: the prefix's last 30, the suffix's first 10.
    let long_prefix: String = (0..100).map(|i| format!("x{i} = {i}\n")).collect();
    let long_suffix: String = (0..100).map(|i| format!("y{i} = {i}\n")).collect();
    let cut = infill::prompt(&tok, &long_prefix, &long_suffix, &[], "", 43).unwrap();
    let (p, s) = (t(&long_prefix), t(&long_suffix));
    assert_eq!(cut, [vec![pre], p[p.len() - 30..].to_vec(), vec![suf], s[..10].to_vec(), vec![mid]].concat());
    // A short suffix leaves the prefix the rest; context files get what both leave, their end.
    let cut = infill::prompt(&tok, &long_prefix, "z", &[], "", 43).unwrap();
    assert_eq!(cut.len(), 43);
    assert_eq!(cut[1..40], p[p.len() - 39..]);
    let roomy = infill::prompt(&tok, "a", "b", &files, "", 8).unwrap();
    assert_eq!(roomy.len(), 8);
    let extra = [vec![rep], t("myproject\n"), vec![sep], t("util.py\n"), t("X = 1\n"), vec![sep], t("filename\n")].concat();
    assert_eq!(roomy, [extra[extra.len() - 3..].to_vec(), vec![pre], t("a"), vec![suf], t("b"), vec![mid]].concat(), "the files' last tokens");
    assert!(matches!(infill::prompt(&tok, "a", "b", &[], "a b c", 4), Err(corelm_engine::Error::PromptTooLong { .. })));
}

/// The middle Qwen2.5-Coder writes, greedy, batch-invariant (the server's default), on every
/// kernel table: what llama.cpp (4df29be, through llama-cpp-python 0.3.35, the same tokens)
/// writes. Its end is a near thing — `<|endoftext|>` at log-probability −0.84 against "``"
/// at −1.00 — well inside the golden tolerance, and `--no-batch-invariant`'s kernels, in
/// llama.cpp's batched orders, write "```" and go on.
#[test]
fn the_middle_is_llama_cpps() {
    let (mut engine, tok) = load(QWEN, corelm_engine::EngineConfig { batch_invariant: true, ..test_config(2) });
    let ids = infill::prompt(&tok, "def fib(n):\n    ", "\n\nprint(fib(10))\n", &[], "", 900).unwrap();
    let params = GenerateParams { max_tokens: 64, sampling: SamplingParams::greedy(), ..Default::default() };
    let g = generate(&mut engine, &tok, &ids, &params, |_| true).unwrap();
    assert_eq!(g.text, "if n <= 1:\n        return n\n    else:\n        return fib(n-1) + fib(n-2)\n\nprint(fib(10))\n");
    assert_eq!(g.reason, StopReason::Eog);
}
