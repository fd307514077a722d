//! Tokenizer built from the GGUF vocabulary with the Hugging Face `tokenizers` crate.
//!
//! * `tokenizer.ggml.model = gpt2`: byte-level BPE over the file's vocabulary and merges. The
//!   split regexes are not in the file: they are chosen by `tokenizer.ggml.pre` from llama.cpp's
//!   table ([`pre`]), with its `ignore_merges` and BOS defaults.
//! * `tokenizer.ggml.model = llama`: SentencePiece-style BPE. Merges are derived from the piece
//!   scores (every split of a piece into two pieces, ranked by the merged piece's score, which is
//!   what SentencePiece's bigram merging does); unknown characters fall back to `<0xXX>` bytes;
//!   spaces become `▁`, and with `tokenizer.ggml.add_space_prefix` (true unless the file says
//!   otherwise, as in llama.cpp) each run of text between special tokens starts with one.
//!   Pieces keep their leading space when decoded, as llama.cpp's `token_to_piece` and
//!   `llama-server` give them.
//! * Control tokens (type 3) are special tokens, recognised in prompts only when parsing of
//!   special tokens is asked for; user-defined tokens (type 4) are always recognised.
//! * Detokenization is byte-exact per token ([`Tokenizer::piece`]), so a stream can be cut at
//!   any token; [`Utf8Stream`] then holds back incomplete UTF-8 sequences.

pub mod pre;

use crate::Error;
use corelm_gguf::{Array, Gguf};
use std::collections::HashMap;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

const TOKEN_CONTROL: i64 = 3;
/// Texts llama.cpp treats as end of generation (and therefore as control tokens).
const EOG_TEXTS: [&str; 22] = [
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
];
/// FIM pad / repository / file-separator tokens, which llama.cpp also ends generation on.
const FIM_EOG_TEXTS: [&str; 11] = [
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>", "<|repo_name|>",
    "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
];
/// Fill-in-the-middle tokens by role (prefix, suffix, middle, repository, file separator), by
/// the texts llama.cpp recognises them by where the GGUF names none (`llama-vocab.cpp`).
const FIM_TEXTS: [&[&str]; 5] = [
    &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"],
    &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"],
    &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"],
    &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    &["<|file_sep|>"],
];
/// The GGUF keys that name them (and the older names of the first three).
const FIM_KEYS: [[&str; 2]; 5] = [
    ["tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"],
    ["tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"],
    ["tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"],
    ["tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_rep_token_id"],
    ["tokenizer.ggml.fim_sep_token_id", "tokenizer.ggml.fim_sep_token_id"],
];
const TOKEN_USER_DEFINED: i64 = 4;
const TOKEN_UNKNOWN: i64 = 2;
const TOKEN_UNUSED: i64 = 5;
const TOKEN_BYTE: i64 = 6;

/// GPT-2's byte ↔ printable-character map used by byte-level vocabularies.
fn byte_level_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (b'!' as u32..=b'~' as u32).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        map[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    map
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE (`gpt2`).
    Bpe,
    /// SentencePiece-style (`llama`).
    Spm,
}

pub struct Tokenizer {
    /// Recognises special tokens in text.
    hf: tokenizers::Tokenizer,
    /// Treats control-token text as plain text.
    hf_plain: tokenizers::Tokenizer,
    pub kind: VocabKind,
    pieces: Vec<Vec<u8>>,
    texts: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End of turn: the GGUF's `eot_token_id`, else the first token with one of llama.cpp's
    /// end-of-turn texts (`<|im_end|>`, `<end_of_turn>`, …).
    pub eot: Option<u32>,
    pub add_bos: bool,
    /// Append EOS to text tokenized with its special tokens (`tokenizer.ggml.add_eos_token`,
    /// which embedding models with last-token pooling set).
    pub add_eos: bool,
    eog: Vec<u32>,
    /// Tokens that never stand for text: control, unknown and unused ones (GGUF types 3, 2, 5).
    not_text: Vec<bool>,
    /// Fill-in-the-middle tokens, where the model has the three it needs.
    pub fim: Option<Fim>,
}

/// A code model's fill-in-the-middle tokens: `pre` text `suf` text `mid` (the model writes the
/// middle); `rep` and `sep` open a repository's name and each file of its context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fim {
    pub pre: u32,
    pub suf: u32,
    pub mid: u32,
    pub rep: Option<u32>,
    pub sep: Option<u32>,
}

fn strings<'a>(g: &'a Gguf, key: &str) -> Result<&'a [String], Error> {
    match g.opt_array(key)? {
        Some(Array::String(v)) => Ok(v),
        Some(_) => Err(Error::Tokenizer(format!("'{key}' is not an array of strings"))),
        None => Err(Error::Tokenizer(format!("GGUF has no '{key}'"))),
    }
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

impl Tokenizer {
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, Error> {
        let model = g.str("tokenizer.ggml.model")?;
        let tokens = strings(g, "tokenizer.ggml.tokens")?;
        let n = tokens.len();
        let token_type = match g.opt_array("tokenizer.ggml.token_type")? {
            Some(a) => a.to_i64().ok_or_else(|| Error::Tokenizer("token_type is not an integer array".into()))?,
            None => vec![1; n],
        };
        if token_type.len() != n {
            return Err(Error::Tokenizer(format!("{} token types for {n} tokens", token_type.len())));
        }
        let id = |key: &str| -> Result<Option<u32>, Error> {
            Ok(g.opt_u64(key)?.filter(|&v| (v as usize) < n).map(|v| v as u32))
        };
        // llama.cpp promotes tokens by their text: end-of-generation and FIM tokens become
        // control tokens (parsed as special, never as text) whatever type the file gives them.
        let mut token_type = token_type;
        const EOT_TEXTS: [&str; 11] = [
            "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
            "<｜end▁of▁sentence｜>", "<end_of_utterance>",
        ];
        let eot_key = id("tokenizer.ggml.eot_token_id")?;
        let eot = eot_key.or_else(|| tokens.iter().position(|t| EOT_TEXTS.contains(&t.as_str())).map(|i| i as u32));
        let mut eog: Vec<u32> = [
            id("tokenizer.ggml.eos_token_id")?,
            eot_key,
            id("tokenizer.ggml.eom_token_id")?,
        ]
        .into_iter()
        .flatten()
        .collect();
        // FIM tokens: named by the GGUF, else found by their text (first in id order) and then
        // made control tokens; the repository and file separators end generation (llama.cpp's
        // rules).
        let mut fim_ids = [None; 5];
        for (role, slot) in fim_ids.iter_mut().enumerate() {
            *slot = match (id(FIM_KEYS[role][0])?, id(FIM_KEYS[role][1])?) {
                (Some(t), _) | (None, Some(t)) => Some(t),
                (None, None) => {
                    let found = tokens.iter().position(|t| FIM_TEXTS[role].contains(&t.as_str()));
                    found.inspect(|&i| token_type[i] = TOKEN_CONTROL).map(|i| i as u32)
                }
            };
            if let (Some(t), 3..) = (*slot, role) {
                if !eog.contains(&t) {
                    eog.push(t);
                }
            }
        }
        let fim = match fim_ids {
            [Some(pre), Some(suf), Some(mid), rep, sep] => Some(Fim { pre, suf, mid, rep, sep }),
            _ => None,
        };
        let has_tool_response = tokens.iter().any(|t| t == "<|tool_response>");
        for (i, t) in tokens.iter().enumerate() {
            let text_eog = EOG_TEXTS.contains(&t.as_str()) && !(t == "</s>" && has_tool_response);
            let fim = FIM_EOG_TEXTS.contains(&t.as_str());
            if text_eog || fim {
                token_type[i] = TOKEN_CONTROL;
                if !eog.contains(&(i as u32)) {
                    eog.push(i as u32);
                }
            }
        }
        // BOS where the file does not say: SentencePiece's default, and some pre-tokenizers'.
        let mut pre_bos = false;
        let (kind, bpe, normalizer, pre) = match model {
            "gpt2" => {
                let pre_name = g.opt_str("tokenizer.ggml.pre")?.unwrap_or("default");
                let p = pre::pre_tokenizer(pre_name)
                    .ok_or_else(|| Error::Tokenizer(format!("unknown pre-tokenizer '{pre_name}'")))?;
                pre_bos = p.add_bos;
                let merges = strings(g, "tokenizer.ggml.merges")?
                    .iter()
                    .map(|m| {
                        m.split_once(' ')
                            .map(|(a, b)| (a.to_string(), b.to_string()))
                            .ok_or_else(|| Error::Tokenizer(format!("merge '{m}' has no space")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let vocab: tokenizers::models::bpe::Vocab =
                    tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
                let bpe = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(p.ignore_merges).build().map_err(tok_err)?;
                let mut splits: Vec<PreTokenizerWrapper> = p
                    .regexes
                    .iter()
                    .map(|r| {
                        Split::new(SplitPattern::Regex((*r).to_string()), SplitDelimiterBehavior::Isolated, false)
                            .map(PreTokenizerWrapper::Split)
                            .map_err(tok_err)
                    })
                    .collect::<Result<_, _>>()?;
                splits.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)));
                (VocabKind::Bpe, bpe, None, Some(Sequence::new(splits)))
            }
            "llama" => {
                let scores: Vec<f32> = match g.opt_array("tokenizer.ggml.scores")? {
                    Some(Array::F32(v)) if v.len() == n => v.clone(),
                    _ => return Err(Error::Tokenizer("SentencePiece vocabulary needs f32 scores per token".into())),
                };
                let bpe = spm_as_bpe(tokens, &scores, &token_type)?;
                let spaces: NormalizerWrapper = Replace::new(" ", "▁").map_err(tok_err)?.into();
                // llama.cpp's default for SentencePiece vocabularies (Llama 2, Mistral,
                // TinyLlama; Gemma's files say false): a space before every run of text, which
                // is always the first or follows a special token. The normalizer runs on each
                // run between added tokens, so prepending there is the same.
                let norm = if g.opt_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true) {
                    NormalizerSequence::new(vec![Prepend::new("▁".into()).into(), spaces]).into()
                } else {
                    spaces
                };
                (VocabKind::Spm, bpe, Some(norm), None)
            }
            other => return Err(Error::Tokenizer(format!("unsupported tokenizer model '{other}'"))),
        };
        let mut hf = tokenizers::Tokenizer::new(bpe);
        if let Some(nz) = normalizer {
            hf.with_normalizer(Some(nz)).map_err(tok_err)?;
        }
        if let Some(p) = pre {
            hf.with_pre_tokenizer(Some(p));
        }
        let specials: Vec<AddedToken> = (0..n)
            .filter(|&i| token_type[i] == TOKEN_CONTROL && !tokens[i].is_empty())
            .map(|i| AddedToken::from(tokens[i].clone(), true))
            .collect();
        let user: Vec<AddedToken> = (0..n)
            .filter(|&i| token_type[i] == TOKEN_USER_DEFINED && !tokens[i].is_empty())
            .map(|i| AddedToken::from(tokens[i].clone(), false).normalized(false))
            .collect();
        hf.add_special_tokens(specials).map_err(tok_err)?;
        hf.add_tokens(user).map_err(tok_err)?;
        let mut hf_plain = hf.clone();
        hf_plain.set_encode_special_tokens(true);

        let bl = byte_level_chars();
        let inv: HashMap<char, u8> = bl.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        let pieces = (0..n)
            .map(|i| piece_bytes(&tokens[i], token_type[i], kind, &inv))
            .collect();
        let add_bos = g.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(kind == VocabKind::Spm || pre_bos);
        let add_eos = g.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let eos = id("tokenizer.ggml.eos_token_id")?;
        let not_text = token_type.iter().map(|&t| matches!(t, TOKEN_CONTROL | TOKEN_UNKNOWN | TOKEN_UNUSED)).collect();
        Ok(Tokenizer { hf, hf_plain, kind, pieces, texts: tokens.to_vec(), bos, eos, eot, add_bos, add_eos, eog, not_text, fim })
    }

    pub fn n_vocab(&self) -> usize {
        self.pieces.len()
    }

    /// Tokenize `text`. `add_special`: prepend BOS and append EOS where the model asks for them
    /// (as `llama_tokenize`); `parse_special`: recognise control-token text (e.g.
    /// `<|im_start|>`) as those tokens.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>, Error> {
        let t = if parse_special { &self.hf } else { &self.hf_plain };
        let enc = t.encode(text, false).map_err(tok_err)?;
        let mut ids = Vec::with_capacity(enc.len() + 2);
        if add_special && self.add_bos {
            if let Some(b) = self.bos {
                ids.push(b);
            }
        }
        ids.extend_from_slice(enc.get_ids());
        if add_special && self.add_eos {
            ids.extend(self.eos);
        }
        Ok(ids)
    }

    /// The bytes a token stands for (control tokens as their text).
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], |p| p.as_slice())
    }

    /// The token's vocabulary string.
    pub fn text(&self, id: u32) -> &str {
        self.texts.get(id as usize).map_or("", |s| s.as_str())
    }

    /// Concatenated bytes of tokens, as UTF-8 with replacement characters.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| self.piece(i).iter().copied()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Is this a control, unknown or unused token (one that never stands for text)?
    pub fn is_control(&self, id: u32) -> bool {
        self.not_text.get(id as usize).copied().unwrap_or(true)
    }

    /// Does this token end generation?
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }
}

fn piece_bytes(text: &str, ty: i64, kind: VocabKind, inv: &HashMap<char, u8>) -> Vec<u8> {
    if ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED {
        return text.as_bytes().to_vec();
    }
    match kind {
        VocabKind::Bpe => text.chars().map(|c| inv.get(&c).copied().unwrap_or(b'?')).collect(),
        VocabKind::Spm => {
            if ty == TOKEN_BYTE {
                if let Some(h) = text.strip_prefix("<0x").and_then(|s| s.strip_suffix('>')) {
                    if let Ok(b) = u8::from_str_radix(h, 16) {
                        return vec![b];
                    }
                }
            }
            text.replace('▁', " ").into_bytes()
        }
    }
}

/// A SentencePiece vocabulary as a BPE model: for each normal piece, every split into two
/// pieces of the vocabulary is a merge, ranked by the merged piece's score (higher first).
fn spm_as_bpe(tokens: &[String], scores: &[f32], types: &[i64]) -> Result<BPE, Error> {
    let vocab: tokenizers::models::bpe::Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new(); // (score, merged, left, right)
    for (i, t) in tokens.iter().enumerate() {
        if types[i] != 1 || t.chars().nth(1).is_none() {
            continue;
        }
        for (split, _) in t.char_indices().skip(1) {
            let (a, b) = t.split_at(split);
            if let (Some(&l), Some(&r)) = (vocab.get(a), vocab.get(b)) {
                ranked.push((scores[i], i as u32, l, r));
            }
        }
    }
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    let merges = ranked
        .iter()
        .map(|&(_, _, l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone()))
        .collect();
    let unk = types.iter().position(|&t| t == 2).map(|i| tokens[i].clone());
    let mut b = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true);
    if let Some(u) = unk {
        b = b.unk_token(u);
    }
    b.build().map_err(tok_err)
}

/// Turns a stream of token bytes into text without ever emitting half a UTF-8 character.
#[derive(Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Append bytes; return the text that is complete so far.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        let mut out = String::new();
        self.push_to(bytes, &mut out);
        out
    }

    /// Append bytes; append the text that is complete so far to `out` (no allocation beyond
    /// `out`'s own growth).
    pub fn push_to(&mut self, bytes: &[u8], out: &mut String) {
        self.pending.extend_from_slice(bytes);
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // SAFETY-free: valid_up_to marks a valid prefix.
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete sequence at the end: keep it for the next token.
                        None => {
                            self.pending.drain(..good);
                            return;
                        }
                        // Invalid bytes: replace them and go on.
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flush at the end of a stream (an incomplete tail becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
