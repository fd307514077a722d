//! `corelm run --prompt-cache FILE` (llama-cli's flags): the prompt's KV rows kept in a slot
//! file (`Engine::save_slot`, the format `serve --slot-save-path` writes), so a later run whose
//! prompt opens with the same tokens takes their whole 16-token blocks from it instead of
//! computing them.

use anyhow::{Context, Result};
use corelm_engine::Engine;
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct PromptCacheArgs {
    /// Keep the prompt's KV cache in this file: read at start where it exists (the prompt's
    /// blocks it holds are not computed again), written after the run.
    #[arg(long)]
    pub prompt_cache: Option<PathBuf>,
    /// With --prompt-cache: keep the answer's blocks too, not only the prompt's.
    #[arg(long, requires = "prompt_cache")]
    pub prompt_cache_all: bool,
    /// With --prompt-cache: read the file, never write it.
    #[arg(long, requires = "prompt_cache", conflicts_with = "prompt_cache_all")]
    pub prompt_cache_ro: bool,
}

impl PromptCacheArgs {
    /// Read the cache file into the engine's prefix cache and start sequence `seq` on the
    /// blocks of `ids` it holds. Returns how many leading tokens need no computing.
    pub fn restore(&self, engine: &mut Engine, seq: i32, model: &str, ids: &[u32]) -> Result<usize> {
        let Some(path) = self.prompt_cache.as_ref().filter(|p| p.exists()) else { return Ok(0) };
        let io = engine.restore_slot(path, model).with_context(|| format!("--prompt-cache {}", path.display()))?;
        let reused = engine.attach_prefix(seq, ids);
        eprintln!("[prompt cache: {} tokens read, {reused} of the prompt's {} reused]", io.n_tokens, ids.len());
        Ok(reused)
    }

    /// Write sequence `seq`'s blocks — the first `n_prompt` tokens', or with
    /// `--prompt-cache-all` every one — unless the cache is read-only.
    pub fn save(&self, engine: &mut Engine, seq: i32, model: &str, n_prompt: usize) -> Result<()> {
        let Some(path) = self.prompt_cache.as_ref().filter(|_| !self.prompt_cache_ro) else { return Ok(()) };
        let upto = if self.prompt_cache_all { usize::MAX } else { n_prompt };
        let io = engine.save_slot_upto(seq, path, model, upto).with_context(|| format!("--prompt-cache {}", path.display()))?;
        eprintln!("[prompt cache: {} tokens written to {} ({:.1} MB)]", io.n_tokens, path.display(), io.n_bytes as f64 / 1e6);
        Ok(())
    }
}
