//! `run` and `chat`'s sampling flags (llama.cpp's names) and the generation parameters they
//! make.

use anyhow::{Context, Result};
use clap::Args;
use corelm_engine::constraint::{Constraint, Lazy, Trigger};
use corelm_engine::generate::{ContextShift, GenerateParams};
use corelm_engine::grammar::Grammar;
use corelm_engine::json::Schema;
use corelm_engine::sample::{Breakers, Dry, InfillVocab, Item, Mirostat, SamplingParams, Stage, DEFAULT_ORDER};
use corelm_engine::Tokenizer;

#[derive(Args, Clone)]
pub(crate) struct SampleArgs {
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub(crate) n_predict: usize,
    #[command(flatten)]
    pub(crate) chain: ChainArgs,
    /// RNG seed.
    #[arg(short, long, default_value_t = 0xC0FFEE)]
    pub(crate) seed: u64,
    /// Add a bias to a token's logit, as llama.cpp's: `ID+BIAS` or `ID-BIAS` (`15043-inf`
    /// bans token 15043; repeatable).
    #[arg(short = 'l', long, value_name = "ID(+|-)BIAS", value_parser = parse_logit_bias)]
    pub(crate) logit_bias: Vec<(u32, f32)>,
    /// Stop when this text is generated (repeatable).
    #[arg(long)]
    pub(crate) stop: Vec<String>,
    /// Keep generating past end-of-generation tokens (for benchmarks).
    #[arg(long)]
    pub(crate) ignore_eos: bool,
    /// JSON mode: generate a JSON object, stopping when it closes (as `serve`'s
    /// `response_format: {"type": "json_object"}`).
    #[arg(long)]
    pub(crate) json: bool,
    /// Generate a JSON value of this JSON Schema (a file), stopping when it closes (as
    /// `serve`'s `response_format: {"type": "json_schema", ...}`; see README for the keywords).
    #[arg(long, value_name = "FILE", conflicts_with = "json")]
    pub(crate) json_schema: Option<std::path::PathBuf>,
    /// Constrain the text to this GBNF grammar (llama.cpp's syntax; its start rule is `root`),
    /// stopping where it can take nothing more (as `serve`'s `grammar` field).
    #[arg(long, value_name = "GBNF", conflicts_with_all = ["json", "json_schema"])]
    pub(crate) grammar: Option<String>,
    /// `--grammar` read from a file.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["json", "json_schema", "grammar"])]
    pub(crate) grammar_file: Option<std::path::PathBuf>,
    /// Make the grammar or schema lazy: the text is free until this word appears in it, and
    /// held from the word on (repeatable; as llama-server's `grammar_lazy` with word triggers).
    #[arg(long, value_name = "WORD")]
    pub(crate) grammar_trigger: Vec<String>,
    /// Prompt-lookup speculative decoding: feed up to N draft tokens copied from the prompt
    /// and answer beside each token, keeping those the model samples anyway (0: off). The
    /// answer is the one without drafts (bit for bit with --batch-invariant).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) lookup: usize,
    /// Context shift, llama.cpp's: when the context fills, drop half of the tokens after the
    /// first `--keep` and go on generating (the rows after the dropped ones move down, their
    /// keys rotated to their new positions) instead of stopping; a draft model's cache drops
    /// the same tokens.
    #[arg(long)]
    pub(crate) context_shift: bool,
    /// With --context-shift: tokens of the prompt always kept, besides a BOS (-1: all of it).
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true, requires = "context_shift")]
    pub(crate) keep: i64,
    #[command(flatten)]
    pub(crate) draft: crate::draft::DraftArgs,
}

pub(crate) fn gen_params(s: &SampleArgs, tok: &Tokenizer, n_ctx: usize) -> Result<GenerateParams> {
    let json = match &s.json_schema {
        Some(f) => {
            let text = std::fs::read_to_string(f).with_context(|| format!("cannot read --json-schema {}", f.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("--json-schema {} is not JSON", f.display()))?;
            Some(std::sync::Arc::new(Schema::compile(&v).with_context(|| format!("--json-schema {}", f.display()))?))
        }
        None => s.json.then(|| std::sync::Arc::new(Schema::object())),
    };
    let grammar = match (&s.grammar, &s.grammar_file) {
        (Some(g), _) => Some(Grammar::parse(g).context("--grammar")?),
        (None, Some(f)) => {
            let text = std::fs::read_to_string(f).with_context(|| format!("cannot read --grammar-file {}", f.display()))?;
            Some(Grammar::parse(&text).with_context(|| format!("--grammar-file {}", f.display()))?)
        }
        (None, None) => None,
    };
    let mut constraint = json.map(Constraint::Json).or(grammar.map(|g| Constraint::Grammar(std::sync::Arc::new(g))));
    if !s.grammar_trigger.is_empty() {
        let then = constraint.context("--grammar-trigger needs --grammar, --grammar-file, --json or --json-schema")?;
        let triggers = s.grammar_trigger.iter().map(|w| Trigger::Word(w.clone())).collect();
        constraint = Some(Constraint::Lazy(std::sync::Arc::new(Lazy::new(triggers, then, false).context("--grammar-trigger")?)));
    }
    Ok(GenerateParams {
        max_tokens: s.n_predict,
        sampling: SamplingParams { seed: s.seed, logit_bias: s.logit_bias.clone(), ..s.chain.params(Some(tok), n_ctx) },
        stop: s.stop.clone(),
        seq: 0,
        ignore_eos: s.ignore_eos,
        constraint,
        lookup: s.lookup,
        context_shift: s.context_shift.then_some(ContextShift { n_keep: s.keep, n_discard: 0, n_ctx: 0 }),
    })
}

/// The sampler chain's flags, llama.cpp's names and defaults: `run` and `chat` sample with
/// them, `serve` takes them as the defaults of requests that leave a field out.
#[derive(Args, Clone)]
pub(crate) struct ChainArgs {
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub(crate) temp: f32,
    #[arg(long, default_value_t = 40)]
    pub(crate) top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub(crate) top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub(crate) min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub(crate) repeat_penalty: f32,
    #[arg(long, default_value_t = 64)]
    pub(crate) repeat_last_n: usize,
    #[arg(long, default_value_t = 0.0)]
    pub(crate) frequency_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub(crate) presence_penalty: f32,
    /// Locally typical sampling's mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) typical: f32,
    /// Keep the logits within N standard deviations of the best (-1 = off).
    #[arg(long, value_name = "N", default_value_t = -1.0)]
    pub(crate) top_n_sigma: f32,
    /// XTC: the chance per token of removing the likely tokens (0 = off) ...
    #[arg(long, default_value_t = 0.0)]
    pub(crate) xtc_probability: f32,
    /// ... those at or above this probability, but the least likely of them (> 0.5 = off).
    #[arg(long, default_value_t = 0.1)]
    pub(crate) xtc_threshold: f32,
    /// Dynamic temperature: temp ± this range, by the candidates' entropy (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) dynatemp_range: f32,
    #[arg(long, default_value_t = 1.0)]
    pub(crate) dynatemp_exp: f32,
    /// Mirostat 1 or 2 in place of the cuts (0 = off; no penalties then, as llama.cpp).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub(crate) mirostat: u8,
    /// Mirostat's learning rate (eta).
    #[arg(long, default_value_t = 0.1)]
    pub(crate) mirostat_lr: f32,
    /// Mirostat's target surprise (tau).
    #[arg(long, default_value_t = 5.0)]
    pub(crate) mirostat_ent: f32,
    /// DRY: a token that would extend a repeat loses multiplier·base^(length − allowed) from
    /// its logit (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) dry_multiplier: f32,
    #[arg(long, default_value_t = 1.75)]
    pub(crate) dry_base: f32,
    /// Repeats up to this long are free.
    #[arg(long, default_value_t = 2)]
    pub(crate) dry_allowed_length: usize,
    /// How many recent tokens DRY searches (0 = off).
    #[arg(long, default_value_t = 64)]
    pub(crate) dry_penalty_last_n: usize,
    /// A text that ends DRY's look back (repeatable; replaces the defaults "\n", ":", "\"",
    /// "*"; `none` for none).
    #[arg(long, value_name = "TEXT")]
    pub(crate) dry_sequence_breaker: Vec<String>,
    /// The chain's stages in order, by llama.cpp's names separated by ';' (default
    /// "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"; a stage left out
    /// is not applied; `infill` is fill-in-the-middle's cut).
    #[arg(long, value_name = "NAMES", value_parser = parse_names)]
    pub(crate) samplers: Option<Order>,
    /// `--samplers` by llama.cpp's letters (default "edskypmxt").
    #[arg(long, visible_alias = "sampler-seq", value_name = "LETTERS", value_parser = parse_letters, conflicts_with = "samplers")]
    pub(crate) sampling_seq: Option<Order>,
}

/// A chain order from `--samplers` or `--sampling-seq`.
#[derive(Clone, Debug)]
pub(crate) struct Order(Vec<Stage>);

fn parse_names(s: &str) -> Result<Order, String> {
    Stage::parse_order(s.split(';').filter(|n| !n.is_empty()).map(Item::Name), true).map(Order)
}

fn parse_letters(s: &str) -> Result<Order, String> {
    Stage::parse_order(s.chars().map(Item::Letter), true).map(Order)
}

impl ChainArgs {
    /// DRY's breaker texts: the defaults unless given (`none`: none).
    pub(crate) fn breaker_texts(&self) -> Vec<String> {
        match self.dry_sequence_breaker.as_slice() {
            [] => Breakers::DEFAULT.map(String::from).to_vec(),
            [none] if none == "none" => vec![],
            b => b.to_vec(),
        }
    }

    /// The chain (seed and biases left at their defaults); DRY's breakers found in `tok`'s
    /// vocabulary when DRY is on and a tokenizer is given (the server finds them itself). The
    /// look-backs are cut to the context, `n_ctx`, which is all there is to look back on.
    pub(crate) fn params(&self, tok: Option<&Tokenizer>, n_ctx: usize) -> SamplingParams {
        let mut dry = Dry {
            multiplier: self.dry_multiplier,
            base: self.dry_base,
            allowed_length: self.dry_allowed_length,
            last_n: self.dry_penalty_last_n.min(n_ctx),
            breakers: Default::default(),
        };
        if let (true, Some(tok)) = (dry.is_on(), tok) {
            dry.breakers = std::sync::Arc::new(Breakers::new(tok, &self.breaker_texts()));
        }
        let order = self.samplers.as_ref().or(self.sampling_seq.as_ref()).map_or(DEFAULT_ORDER.to_vec(), |o| o.0.clone());
        let infill = match tok {
            Some(tok) if order.contains(&Stage::Infill) => InfillVocab::new(tok).map(std::sync::Arc::new),
            _ => None,
        };
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n.min(n_ctx),
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            typical_p: self.typical,
            top_n_sigma: self.top_n_sigma,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            dynatemp_range: self.dynatemp_range,
            dynatemp_exponent: self.dynatemp_exp,
            mirostat: [Mirostat::Off, Mirostat::V1, Mirostat::V2][self.mirostat as usize],
            mirostat_tau: self.mirostat_ent,
            mirostat_eta: self.mirostat_lr,
            dry,
            order,
            infill,
            ..Default::default()
        }
    }
}

/// `--logit-bias ID+BIAS` / `ID-BIAS` (llama.cpp's form; `-inf` bans).
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let at = s.find(['+', '-']).ok_or_else(|| format!("{s:?}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS"))?;
    let id = s[..at].parse::<u32>().map_err(|_| format!("{s:?}: {:?} is not a token id", &s[..at]))?;
    let bias = s[at..].parse::<f32>().map_err(|_| format!("{s:?}: {:?} is not a bias", &s[at..]))?;
    Ok((id, bias))
}
