//! How llama.cpp splits text before byte-level BPE, by `tokenizer.ggml.pre`: the split regexes
//! (applied in order, each one splitting the pieces the one before left, every match kept as a
//! piece of its own), whether a piece that is itself a token is taken whole without its merges
//! (`ignore_merges`: Llama 3, Tekken), and whether BOS is added where the file does not say
//! (`add_bos_token` absent). Names, regexes and flags are llama.cpp's (`llama-vocab.cpp` at
//! 4df29be, the golden data's commit), copied as they are; a name it does not know, or one whose
//! splitting is not a list of regexes (Gemma 4's, Kimi K2's, …), is refused by the caller.
//! Every group is checked against llama.cpp's `llama-tokenize` on SmolLM2's vocabulary
//! relabelled with each name (`fixtures/pre_tokenizer_golden.json`,
//! `scripts/make_pre_tokenizer_golden.py`).

/// One of llama.cpp's pre-tokenizers.
#[derive(Debug)]
pub struct Pre {
    /// The `tokenizer.ggml.pre` values that select it.
    pub names: &'static [&'static str],
    pub regexes: &'static [&'static str],
    pub ignore_merges: bool,
    pub add_bos: bool,
}

/// llama.cpp's pre-tokenizers, each with the names that select it.
pub const TABLE: &[Pre] = &[
    Pre { names: &["default"], regexes: DEFAULT, ignore_merges: false, add_bos: false },
    Pre { names: &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"], regexes: LLAMA3, ignore_merges: true, add_bos: true },
    Pre { names: &["deepseek-llm"], regexes: DEEPSEEK_LLM, ignore_merges: false, add_bos: false },
    Pre { names: &["deepseek-coder"], regexes: DEEPSEEK_CODER, ignore_merges: false, add_bos: false },
    Pre { names: &["falcon"], regexes: FALCON, ignore_merges: false, add_bos: false },
    Pre { names: &["mpt", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "olmo", "jais", "exaone4", "trillion", "granite-docling"], regexes: GPT2, ignore_merges: false, add_bos: false },
    Pre { names: &["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"], regexes: STARCODER, ignore_merges: false, add_bos: false },
    Pre { names: &["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez", "hunyuan", "grok-2", "solar-open"], regexes: QWEN2, ignore_merges: false, add_bos: false },
    Pre { names: &["qwen35"], regexes: QWEN35, ignore_merges: false, add_bos: false },
    Pre { names: &["dbrx", "smaug-bpe"], regexes: LLAMA3, ignore_merges: false, add_bos: false },
    Pre { names: &["poro-chat", "bloom", "gpt3-finnish"], regexes: PORO, ignore_merges: false, add_bos: false },
    Pre { names: &["viking"], regexes: VIKING, ignore_merges: false, add_bos: false },
    Pre { names: &["tekken"], regexes: TEKKEN, ignore_merges: true, add_bos: true },
    Pre { names: &["gpt-4o", "llama4", "kanana2", "talkie"], regexes: GPT4O, ignore_merges: false, add_bos: false },
    Pre { names: &["seed-coder"], regexes: SEED_CODER, ignore_merges: false, add_bos: false },
];

/// The splitting llama.cpp gives `name` (`"default"` where the file names none).
pub fn pre_tokenizer(name: &str) -> Option<&'static Pre> {
    TABLE.iter().find(|p| p.names.contains(&name))
}

// llama.cpp's regexes, as its source writes them.
const DEFAULT: &[&str] = &[
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
];
const LLAMA3: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const DEEPSEEK_LLM: &[&str] = &[
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
];
const DEEPSEEK_CODER: &[&str] = &[
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}",
];
const FALCON: &[&str] = &[
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "[0-9][0-9][0-9]",
];
const GPT2: &[&str] = &[
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
];
const STARCODER: &[&str] = &[
    "\\p{N}",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
];
const QWEN2: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const QWEN35: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const PORO: &[&str] = &[
    " ?[^(\\s|.,!?…。，、।۔،)]+",
];
const VIKING: &[&str] = &[
    " ?[^(\\s|.,!?…。，、।۔،)]+",
    "\\p{N}",
];
const TEKKEN: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const GPT4O: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const SEED_CODER: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
