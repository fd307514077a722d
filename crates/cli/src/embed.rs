//! `corelm embed`: one vector per text, pooled from the final norm's rows as `/v1/embeddings`
//! pools them (`corelm_engine::embed`), printed as JSON lines or as a cosine-similarity table.

use anyhow::{Context, Result};
use clap::Args;
use corelm_engine::embed::{cosine, normalize, Pooling};
use std::io::Write;

#[derive(Args, Clone)]
pub struct EmbedArgs {
    #[command(flatten)]
    model: crate::ModelArgs,
    /// Texts to embed (special tokens such as <|im_start|> are recognised).
    #[arg(required = true)]
    texts: Vec<String>,
    /// mean, cls or last (default: the model's `pooling_type`, else mean).
    #[arg(long, value_parser = parse_pooling)]
    pooling: Option<Pooling>,
    /// Print the vectors as pooled, without scaling them to unit length.
    #[arg(long)]
    no_normalize: bool,
    /// Print the texts' pairwise cosine similarities instead of the vectors.
    #[arg(long)]
    similarity: bool,
}

/// A `--pooling` value.
pub fn parse_pooling(s: &str) -> Result<Pooling, String> {
    Pooling::parse(s).map_err(|e| e.to_string())
}

pub fn embed(a: &EmbedArgs) -> Result<()> {
    let (mut engine, tok) = crate::load(&a.model, 1)?;
    let pooling = match a.pooling {
        Some(p) => p,
        None => Pooling::from_gguf(engine.gguf())?.unwrap_or(Pooling::Mean),
    };
    let mut vectors = Vec::with_capacity(a.texts.len());
    for (i, text) in a.texts.iter().enumerate() {
        let ids = tok.encode(text, true, true)?;
        let mut v = engine.embed(0, &ids, pooling).with_context(|| format!("text {i}"))?;
        if !a.no_normalize {
            normalize(&mut v);
        }
        vectors.push((ids.len(), v));
    }
    let mut out = std::io::stdout().lock();
    if a.similarity {
        eprintln!("cosine similarity ({} pooling), rows and columns in text order", pooling.name());
        for (_, x) in &vectors {
            let row: Vec<String> = vectors.iter().map(|(_, y)| format!("{:7.4}", cosine(x, y))).collect();
            writeln!(out, "{}", row.join(" "))?;
        }
    } else {
        for (i, (n, v)) in vectors.iter().enumerate() {
            writeln!(out, "{}", serde_json::json!({"index": i, "tokens": n, "pooling": pooling.name(), "embedding": v}))?;
        }
    }
    Ok(())
}
