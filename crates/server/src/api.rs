//! OpenAI request bodies, their validation into engine parameters, and error bodies.
//!
//! Bodies are parsed once into JSON, then read twice with `serde_path_to_error` (the fields
//! both endpoints share, then the endpoint's own), so a bad field is named in the 400 answer
//! (`messages[1].content: invalid type ...`). Unknown fields are ignored, as OpenAI clients
//! send fields this server does not use (`user`, `metadata` ...); fields it cannot honour with
//! a different meaning (a schema keyword the constraint cannot hold) are refused by name. `n`
//! choices (and `/v1/completions`' several prompts) become one engine request each.
//! `response_format: {"type": "json_object"}` is JSON mode, `{"type": "json_schema", ...}` a
//! JSON Schema (`corelm_engine::json`); `grammar` (llama-server's field) a GBNF grammar
//! (`corelm_engine::grammar`), held from a trigger on with `grammar_lazy` and
//! `grammar_triggers` (`corelm_engine::constraint::lazy`); `tools` and `tool_choice` are read into a
//! [`ToolPlan`] (`corelm_engine::tools`).

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use corelm_engine::constraint::{Constraint, Lazy, Trigger};
use corelm_engine::grammar::Grammar;
use corelm_engine::json::Schema;
use corelm_engine::sample::{Breakers, Dry, Item, Mirostat, SamplingParams, Stage};
use corelm_engine::tools::{Choice, Tool};
use serde::Deserialize;
use serde_json::json;

/// An OpenAI-style error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After` (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn bad(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()).filter(|p| !p.is_empty()),
            code: None,
            retry_after: None,
        }
    }

    pub fn new(status: StatusCode, kind: &'static str, code: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code, retry_after: None }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message, "type": self.kind, "param": self.param, "code": self.code,
        }});
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", s.into());
        }
        r
    }
}

/// Parse a JSON body (an object) into a value, or a 400 naming the syntax error.
pub fn parse_body(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad("", format!("malformed JSON body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad("", "the request body must be a JSON object"));
    }
    Ok(v)
}

/// Read `T`'s fields from a parsed body, naming the offending field on error.
pub fn fields<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v.clone()).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            ApiError::bad("", format!("invalid request body: {inner}"))
        } else {
            ApiError::bad(&path, format!("{path}: {inner}"))
        }
    })
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize, Debug)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Deserialize, Debug)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` turn's call.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning (llama-server's field), for templates that render it.
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

/// An earlier call, as the client sends it back: `arguments` is JSON text.
#[derive(Deserialize, Debug)]
pub struct ToolCallIn {
    pub id: String,
    pub function: FunctionIn,
}

#[derive(Deserialize, Debug)]
pub struct FunctionIn {
    pub name: String,
    pub arguments: String,
}

/// The tools a chat request offers and what it lets the model do with them.
#[derive(Debug)]
pub struct ToolPlan {
    pub tools: Vec<Tool>,
    pub choice: Choice,
    /// `parallel_tool_calls` (default true): more than one call per answer.
    pub parallel: bool,
}

#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields shared by both completion endpoints.
#[derive(Deserialize, Debug, Default)]
pub struct Common {
    #[serde(default)]
    pub model: Option<String>,
    /// Context shift's cut (llama-server's fields; `GenParams::n_keep`).
    #[serde(default)]
    pub n_keep: Option<i64>,
    #[serde(default)]
    pub n_discard: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    /// llama-server's other samplers (README: "Samplers").
    pub repeat_last_n: Option<i64>,
    pub typical_p: Option<f32>,
    pub top_n_sigma: Option<f32>,
    pub xtc_probability: Option<f32>,
    pub xtc_threshold: Option<f32>,
    pub dynatemp_range: Option<f32>,
    pub dynatemp_exponent: Option<f32>,
    pub mirostat: Option<i64>,
    pub mirostat_tau: Option<f32>,
    pub mirostat_eta: Option<f32>,
    pub dry_multiplier: Option<f32>,
    pub dry_base: Option<f32>,
    pub dry_allowed_length: Option<i64>,
    pub dry_penalty_last_n: Option<i64>,
    pub dry_sequence_breakers: Option<Vec<String>>,
    /// The chain's order: llama.cpp's names (`["top_k", "temperature"]`) or letters (`"kt"`).
    pub samplers: Option<serde_json::Value>,
    /// LoRA adapters' scales for this request, `[{"id", "scale"}]` (llama-server's; those left
    /// out at 0; absent or empty: the server's, `POST /lora-adapters`).
    pub lora: Option<serde_json::Value>,
    pub stop: Option<Stop>,
    pub n: Option<u64>,
    #[serde(default)]
    pub ignore_eos: bool,
    pub response_format: Option<ResponseFormat>,
    /// A GBNF grammar (llama-server's extension; empty: none).
    pub grammar: Option<String>,
    /// A JSON Schema (llama-server's extension, as `response_format`'s `json_schema`).
    pub json_schema: Option<serde_json::Value>,
    /// llama-server's lazy grammars: the grammar (or schema) holds the text only from one of
    /// `grammar_triggers` on, each `{"type": 0 token | 1 word | 2 pattern | 3 pattern_full,
    /// "value": text, "token": id}` (the type also by name).
    #[serde(default)]
    pub grammar_lazy: bool,
    pub grammar_triggers: Option<Vec<serde_json::Value>>,
    /// Token id (as a string) → bias in [−100, 100], added to its logit.
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
}

/// `response_format`: `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`.
#[derive(Deserialize, Debug)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`: `{"name": ..., "schema": {...}, "strict": ...}`. `strict`
/// changes nothing here: the answer is always held to the schema.
#[derive(Deserialize, Debug)]
pub struct JsonSchemaFormat {
    pub schema: Option<serde_json::Value>,
}

#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<u64>,
    pub tools: Option<Vec<serde_json::Value>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": ...}}`.
    pub tool_choice: Option<serde_json::Value>,
    /// A forced call is one call; an `auto` answer may hold several, or (`false`) ends after
    /// its first.
    pub parallel_tool_calls: Option<bool>,
    /// More variables for the chat template (llama-server's; e.g. `{"enable_thinking": false}`).
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// `none` (reasoning stays in the content) or `deepseek`/`auto` (apart, where the template
    /// thinks: the server's `--reasoning-format` when left out).
    pub reasoning_format: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// Set the chat template variable `key` in a chat request body (`chat`) to `value`, unless
/// its `chat_template_kwargs` already set it (for another API's switch that maps to one).
pub fn template_default(chat: &mut serde_json::Map<String, serde_json::Value>, key: &str, value: serde_json::Value) {
    let kwargs = chat.entry("chat_template_kwargs").or_insert_with(|| json!({}));
    if let Some(k) = kwargs.as_object_mut() {
        k.entry(key).or_insert(value);
    }
}

/// Most choices one request may ask for: `n` times its prompts.
pub const MAX_CHOICES: usize = 64;

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// Legacy API: how many top alternatives per token (0..=20).
    pub logprobs: Option<u64>,
    /// The prompt before the answer, in the text and (with `logprobs`) in the log-probabilities,
    /// the first prompt token's `null`.
    #[serde(default)]
    pub echo: bool,
    /// Fill in the middle: the text after the hole the answer fills (`prompt` the text before).
    pub suffix: Option<String>,
}

/// What the engine needs from a request, validated.
#[derive(Debug)]
pub struct GenParams {
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// Choices per prompt (`n`): each its own engine request, choice `i` sampled with seed
    /// `seed + i`.
    pub n: usize,
    /// JSON mode, a JSON Schema or a GBNF grammar.
    pub constraint: Option<Constraint>,
    /// `echo` with `logprobs`: score every prompt token too, with this many alternatives.
    pub prompt_logprobs: Option<usize>,
    /// llama-server's `post_sampling_probs`: log-probabilities under the sampling chain's
    /// distribution (native endpoints).
    pub chain_probs: bool,
    /// DRY's sequence breakers, to be found in the vocabulary (when DRY is on).
    pub dry_breakers: Option<Vec<String>>,
    /// The request's `lora` field, read against the adapters at admission (`crate::lora`).
    pub lora: Option<serde_json::Value>,
    /// llama-server's `n_keep` and `n_discard`: where a context shift cuts (with
    /// `serve --context-shift`; `None`: the server's).
    pub n_keep: Option<i64>,
    pub n_discard: Option<usize>,
}

/// What a request that leaves a sampling field out gets (`serve`'s sampling flags; by
/// default llama-server's defaults).
#[derive(Clone, Debug)]
pub struct RequestDefaults {
    /// (`sampling.dry.breakers` is not used: every request's breakers are found by their
    /// texts.)
    pub sampling: SamplingParams,
    /// DRY's breaker texts (found in the vocabulary at start when DRY is on by default).
    pub dry_breakers: Vec<String>,
    /// Most tokens a request that sets no limit generates (`serve -n`; `None`: the rest of the
    /// context), as llama-server's `--n-predict`.
    pub max_tokens: Option<usize>,
}

impl Default for RequestDefaults {
    fn default() -> Self {
        RequestDefaults { sampling: SamplingParams::default(), dry_breakers: Breakers::DEFAULT.map(String::from).to_vec(), max_tokens: None }
    }
}

/// `repeat_last_n` or `dry_penalty_last_n` of −1: the whole context, settled at admission.
pub const WHOLE_CONTEXT: usize = usize::MAX;

fn range(param: &str, v: Option<f32>, lo: f32, hi: f32, default: f32) -> Result<f32, ApiError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x),
        Some(x) => Err(ApiError::bad(param, format!("{param} must be in [{lo}, {hi}], got {x}"))),
    }
}

impl Common {
    /// `grammar_triggers`, as llama-server reads them.
    fn triggers(&self) -> Result<Vec<Trigger>, ApiError> {
        let list = self.grammar_triggers.as_deref().unwrap_or_default();
        if list.len() > 64 {
            return Err(ApiError::bad("grammar_triggers", "at most 64 grammar triggers"));
        }
        let mut out = Vec::with_capacity(list.len());
        for (i, t) in list.iter().enumerate() {
            let field = format!("grammar_triggers[{i}]");
            let kind = match &t["type"] {
                serde_json::Value::Number(n) => n.as_u64(),
                serde_json::Value::String(s) => ["token", "word", "pattern", "pattern_full"].iter().position(|k| k == s).map(|k| k as u64),
                _ => None,
            };
            let value = t["value"].as_str();
            let need_value = || value.ok_or_else(|| ApiError::bad(&field, format!("{field} needs a \"value\" string")));
            let trigger = match kind {
                Some(0) => match t["token"].as_u64() {
                    Some(id) if id <= u32::MAX as u64 => Trigger::Token(id as u32),
                    _ => return Err(ApiError::bad(&field, format!("{field}: a token trigger needs a \"token\" id"))),
                },
                Some(1) => Trigger::Word(need_value()?.to_string()),
                Some(2) => Trigger::pattern(need_value()?).map_err(|e| ApiError::bad(&field, e.to_string()))?,
                Some(3) => Trigger::full(need_value()?).map_err(|e| ApiError::bad(&field, e.to_string()))?,
                _ => return Err(ApiError::bad(&field, format!("{field}: type must be 0 (token), 1 (word), 2 (pattern) or 3 (pattern_full)"))),
            };
            out.push(trigger);
        }
        Ok(out)
    }

    /// Validate the shared fields; a field left out takes its value from `d` (llama-server's
    /// defaults unless `serve` was given others); a missing seed draws a fresh one.
    pub fn params(&self, d: &RequestDefaults) -> Result<GenParams, ApiError> {
        self.params_with(d, false)
    }

    /// [`Self::params`]; `max_tokens: 0` taken when `zero_tokens` (an echoed prompt, only scored).
    pub fn params_with(&self, d: &RequestDefaults, zero_tokens: bool) -> Result<GenParams, ApiError> {
        let n = match self.n {
            None => 1,
            Some(n) if (1..=MAX_CHOICES as u64).contains(&n) => n as usize,
            Some(n) => return Err(ApiError::bad("n", format!("n must be in 1..={MAX_CHOICES}, got {n}"))),
        };
        let json = match self.response_format.as_ref() {
            None => None,
            Some(f) => match f.kind.as_str() {
                "text" => None,
                "json_object" => Some(Arc::new(Schema::object())),
                "json_schema" => {
                    let schema = f.json_schema.as_ref().and_then(|j| j.schema.as_ref());
                    let schema = schema.ok_or_else(|| ApiError::bad("response_format", "json_schema needs {\"json_schema\": {\"schema\": {...}}}"))?;
                    Some(Arc::new(Schema::compile(schema).map_err(|e| ApiError::bad("response_format", e.to_string()))?))
                }
                k => return Err(ApiError::bad("response_format", format!("unknown response_format type {k:?} (text, json_object or json_schema)"))),
            },
        };
        let json = match (&self.json_schema, json) {
            (None | Some(serde_json::Value::Null), json) => json,
            (Some(_), Some(_)) => return Err(ApiError::bad("json_schema", "json_schema together with response_format is not supported")),
            (Some(s), None) => Some(Arc::new(Schema::compile(s).map_err(|e| ApiError::bad("json_schema", e.to_string()))?)),
        };
        let grammar = match self.grammar.as_deref() {
            None | Some("") => None,
            Some(_) if json.is_some() => return Err(ApiError::bad("grammar", "grammar together with json_schema or a JSON response_format is not supported")),
            Some(g) => Some(Arc::new(Grammar::parse(g).map_err(|e| ApiError::bad("grammar", e.to_string()))?)),
        };
        let constraint = match (json.map(Constraint::Json).or(grammar.map(Constraint::Grammar)), self.grammar_lazy) {
            (c, false) => c,
            (None, true) => return Err(ApiError::bad("grammar_lazy", "grammar_lazy needs a grammar or a json_schema")),
            (Some(then), true) => {
                let lazy = Lazy::new(self.triggers()?, then, false).map_err(|e| ApiError::bad("grammar_triggers", e.to_string()))?;
                Some(Constraint::Lazy(Arc::new(lazy)))
            }
        };
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(0) if !zero_tokens => return Err(ApiError::bad("max_tokens", "max_tokens must be at least 1 (0 only with echo)")),
            Some(m) => Some(m.min(usize::MAX as u64) as usize),
            None => None,
        };
        let top_k = match self.top_k {
            None => d.sampling.top_k,
            Some(k) if k <= 0 => 0,
            Some(k) => k as usize,
        };
        let stop = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) if v.len() <= 16 => v.clone(),
            Some(Stop::Many(_)) => return Err(ApiError::bad("stop", "at most 16 stop strings")),
        };
        let seed = self.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            t.as_nanos() as u64 ^ 0x5DEE_CE66_D1CE_4E5B
        });
        let ds = &d.sampling;
        let sampling = SamplingParams {
            temperature: range("temperature", self.temperature, 0.0, 2.0, ds.temperature)?,
            top_k,
            top_p: range("top_p", self.top_p, 0.0, 1.0, ds.top_p)?.max(f32::MIN_POSITIVE),
            min_p: range("min_p", self.min_p, 0.0, 1.0, ds.min_p)?,
            repeat_penalty: range("repeat_penalty", self.repeat_penalty, 0.0, 10.0, ds.repeat_penalty)?.max(f32::MIN_POSITIVE),
            frequency_penalty: range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, ds.frequency_penalty)?,
            presence_penalty: range("presence_penalty", self.presence_penalty, -2.0, 2.0, ds.presence_penalty)?,
            seed,
            logit_bias: self.logit_bias()?,
            ..self.other_samplers(ds)?
        };
        let dry_breakers = sampling.dry.is_on().then(|| self.dry_sequence_breakers.clone().unwrap_or_else(|| d.dry_breakers.clone()));
        Ok(GenParams {
            max_tokens,
            sampling,
            stop,
            ignore_eos: self.ignore_eos,
            stream: self.stream,
            include_usage: self.stream_options.as_ref().is_some_and(|o| o.include_usage),
            n,
            constraint,
            prompt_logprobs: None,
            chain_probs: false,
            dry_breakers,
            lora: self.lora.clone(),
            n_keep: self.n_keep,
            n_discard: self.n_discard.map(|n| n.min(u32::MAX as u64) as usize),
        })
    }

    /// llama-server's samplers beyond OpenAI's, with its defaults and ranges.
    fn other_samplers(&self, d: &SamplingParams) -> Result<SamplingParams, ApiError> {
        let d = d.clone();
        let last_n = |field: &str, v: Option<i64>, default: usize| match v {
            None => Ok(default),
            Some(-1) => Ok(WHOLE_CONTEXT),
            Some(n) if n >= 0 => Ok(n as usize),
            Some(n) => Err(ApiError::bad(field, format!("{field} must be >= -1 (-1: the whole context), got {n}"))),
        };
        let finite = |field: &str, v: Option<f32>, default: f32| match v {
            None => Ok(default),
            Some(x) if x.is_finite() => Ok(x),
            Some(x) => Err(ApiError::bad(field, format!("{field} must be a finite number, got {x}"))),
        };
        let mirostat = match self.mirostat {
            None | Some(0) => Mirostat::Off,
            Some(1) => Mirostat::V1,
            Some(2) => Mirostat::V2,
            Some(m) => return Err(ApiError::bad("mirostat", format!("mirostat must be 0, 1 or 2, got {m}"))),
        };
        let allowed = match self.dry_allowed_length {
            None => d.dry.allowed_length,
            Some(n) if n >= 0 => n as usize,
            Some(n) => return Err(ApiError::bad("dry_allowed_length", format!("dry_allowed_length must be >= 0, got {n}"))),
        };
        if self.dry_sequence_breakers.as_ref().is_some_and(|b| b.is_empty()) {
            return Err(ApiError::bad("dry_sequence_breakers", "dry_sequence_breakers must be a non-empty array of strings"));
        }
        let order = match &self.samplers {
            None | Some(serde_json::Value::Null) => Ok(d.order.clone()),
            Some(serde_json::Value::String(s)) => Stage::parse_order(s.chars().map(Item::Letter), false),
            Some(serde_json::Value::Array(a)) => match a.iter().map(|v| v.as_str().map(Item::Name)).collect::<Option<Vec<_>>>() {
                Some(names) => Stage::parse_order(names, false),
                None => Err("samplers must be an array of names or a string of letters".into()),
            },
            Some(_) => Err("samplers must be an array of names or a string of letters".into()),
        }
        .map_err(|e| ApiError::bad("samplers", e))?;
        // As llama-server: a `dry_base` below 1 takes the default.
        let base = finite("dry_base", self.dry_base, d.dry.base)?;
        Ok(SamplingParams {
            repeat_last_n: last_n("repeat_last_n", self.repeat_last_n, d.repeat_last_n)?,
            typical_p: finite("typical_p", self.typical_p, d.typical_p)?,
            top_n_sigma: finite("top_n_sigma", self.top_n_sigma, d.top_n_sigma)?,
            xtc_probability: range("xtc_probability", self.xtc_probability, 0.0, 1.0, d.xtc_probability)?,
            xtc_threshold: range("xtc_threshold", self.xtc_threshold, 0.0, 1.0, d.xtc_threshold)?,
            dynatemp_range: range("dynatemp_range", self.dynatemp_range, 0.0, 2.0, d.dynatemp_range)?,
            dynatemp_exponent: finite("dynatemp_exponent", self.dynatemp_exponent, d.dynatemp_exponent)?,
            mirostat,
            mirostat_tau: finite("mirostat_tau", self.mirostat_tau, d.mirostat_tau)?,
            mirostat_eta: finite("mirostat_eta", self.mirostat_eta, d.mirostat_eta)?,
            dry: Dry {
                multiplier: range("dry_multiplier", self.dry_multiplier, 0.0, 100.0, d.dry.multiplier)?,
                base: if base < 1.0 { d.dry.base } else { base },
                allowed_length: allowed,
                last_n: last_n("dry_penalty_last_n", self.dry_penalty_last_n, d.dry.last_n)?,
                breakers: Default::default(),
            },
            order,
            ..d
        })
    }
}

impl Common {
    /// `logit_bias` as (token, bias) pairs; the ids are checked against the vocabulary at
    /// admission.
    fn logit_bias(&self) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(m) = &self.logit_bias else { return Ok(vec![]) };
        if m.len() > 1024 {
            return Err(ApiError::bad("logit_bias", "at most 1024 biased tokens"));
        }
        m.iter()
            .map(|(k, &b)| {
                let t = k.parse::<u32>().map_err(|_| ApiError::bad("logit_bias", format!("logit_bias keys are token ids, got {k:?}")))?;
                let b = range("logit_bias", Some(b), -100.0, 100.0, 0.0)?;
                Ok((t, b))
            })
            .collect()
    }
}

impl ChatRequest {
    /// The tools offered and `tool_choice` (default `auto` with tools); `None` without tools
    /// or with `"none"`.
    pub fn tool_plan(&self) -> Result<Option<ToolPlan>, ApiError> {
        let tools = self.tools.as_deref().unwrap_or_default();
        if tools.len() > 128 {
            return Err(ApiError::bad("tools", "at most 128 tools"));
        }
        let tools = tools.iter().enumerate().map(|(i, t)| Tool::from_openai(t, &format!("tools[{i}]"))).collect::<Result<Vec<_>, _>>().map_err(|e| ApiError::bad("tools", e.to_string()))?;
        let choice = match &self.tool_choice {
            None | Some(serde_json::Value::Null) => Choice::Auto,
            Some(serde_json::Value::String(s)) => match s.as_str() {
                "none" => Choice::None,
                "auto" => Choice::Auto,
                "required" => Choice::Required,
                _ => return Err(ApiError::bad("tool_choice", format!("tool_choice must be none, auto, required or a function, got {s:?}"))),
            },
            Some(v) => match v["function"]["name"].as_str() {
                Some(n) if v["type"] == "function" => Choice::Named(n.to_string()),
                _ => return Err(ApiError::bad("tool_choice", "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}")),
            },
        };
        if tools.is_empty() {
            return match choice {
                Choice::Required | Choice::Named(_) => Err(ApiError::bad("tool_choice", "tool_choice asks for a call but there are no tools")),
                _ => Ok(None),
            };
        }
        if let Choice::Named(n) = &choice {
            if !tools.iter().any(|t| &t.name == n) {
                return Err(ApiError::bad("tool_choice", format!("tool_choice names {n:?}, which is not among the tools")));
            }
        }
        Ok((choice != Choice::None).then_some(ToolPlan { tools, choice, parallel: self.parallel_tool_calls.unwrap_or(true) }))
    }

    /// The messages as the chat template takes them; `top_logprobs` when `logprobs` is set.
    pub fn messages(&self) -> Result<Vec<corelm_engine::chat::Message>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad("messages", "messages must not be empty"));
        }
        let mut out = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            if !matches!(m.role.as_str(), "system" | "developer" | "user" | "assistant" | "tool") {
                return Err(ApiError::bad(&format!("messages[{i}].role"), format!("unknown role {:?}", m.role)));
            }
            let text = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut t = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(s)) => t.push_str(s),
                            _ => {
                                return Err(ApiError::bad(
                                    &format!("messages[{i}].content[{j}]"),
                                    format!("only text content parts are supported, got type {:?}", p.kind),
                                ))
                            }
                        }
                    }
                    t
                }
            };
            let role = if m.role == "developer" { "system" } else { m.role.as_str() };
            let mut msg = corelm_engine::chat::Message::new(role, &text);
            if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
                let calls = calls.iter().enumerate().map(|(j, c)| {
                    // Templates read the arguments as an object.
                    let args: serde_json::Value = serde_json::from_str(&c.function.arguments).ok().filter(serde_json::Value::is_object).ok_or_else(|| {
                        ApiError::bad(&format!("messages[{i}].tool_calls[{j}].function.arguments"), "arguments must be the JSON text of an object")
                    })?;
                    Ok(json!({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}}))
                });
                msg.tool_calls = Some(calls.collect::<Result<_, ApiError>>()?);
            }
            msg.tool_call_id = m.tool_call_id.clone();
            msg.reasoning_content = m.reasoning_content.clone().filter(|_| role == "assistant");
            out.push(msg);
        }
        Ok(out)
    }

    /// Whether reasoning is read apart from the content, `server` when the request leaves it out.
    pub fn reasoning(&self, server: bool) -> Result<bool, ApiError> {
        match self.reasoning_format.as_deref() {
            None => Ok(server),
            Some("none") => Ok(false),
            Some("deepseek" | "auto") => Ok(true),
            Some(f) => Err(ApiError::bad("reasoning_format", format!("reasoning_format must be none, deepseek or auto, got {f:?}"))),
        }
    }

    pub fn top_logprobs(&self) -> Result<Option<usize>, ApiError> {
        match (self.logprobs, self.top_logprobs) {
            (false, None) => Ok(None),
            (false, Some(_)) => Err(ApiError::bad("top_logprobs", "top_logprobs needs logprobs: true")),
            (true, None) => Ok(Some(0)),
            (true, Some(n)) if n <= 20 => Ok(Some(n as usize)),
            (true, Some(n)) => Err(ApiError::bad("top_logprobs", format!("top_logprobs must be in 0..=20, got {n}"))),
        }
    }
}

impl CompletionRequest {
    pub fn top_logprobs(&self) -> Result<Option<usize>, ApiError> {
        match self.logprobs {
            None => Ok(None),
            // OpenAI takes up to 5; llama-cpp-python's server and vLLM more (lm-evaluation-harness's
            // `gguf` model asks for 10).
            Some(n) if n <= 20 => Ok(Some(n as usize)),
            Some(n) => Err(ApiError::bad("logprobs", format!("logprobs must be in 0..=20, got {n}"))),
        }
    }
}
