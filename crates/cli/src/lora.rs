//! `--lora` and `--lora-scaled`: LoRA adapters applied at run time, as llama.cpp's flags take
//! them (comma-separated lists; `FILE:SCALE` pairs).

use anyhow::{bail, Result};
use clap::Args;
use corelm_engine::lora::LoraSpec;

/// LoRA adapters, for every command that loads a model.
#[derive(Args, Clone, Default)]
pub(crate) struct LoraArgs {
    /// LoRA adapter GGUF files applied at scale 1 (repeat the flag or separate by commas).
    /// Adapters of attention and feed-forward matrices, F32/F16/BF16 (or Q8_0 with whole
    /// blocks), as llama.cpp's convert_lora_to_gguf.py writes them; not with --tp, --sparsity
    /// or the accelerator.
    #[arg(long, value_delimiter = ',')]
    pub(crate) lora: Vec<String>,
    /// LoRA adapters with their scales, FILE:SCALE (repeat or separate by commas); loaded after
    /// the --lora ones (the server's adapter ids count in that order).
    #[arg(long, value_delimiter = ',')]
    pub(crate) lora_scaled: Vec<String>,
}

impl LoraArgs {
    /// The adapters in load order.
    pub(crate) fn specs(&self) -> Result<Vec<LoraSpec>> {
        let mut out: Vec<LoraSpec> = self.lora.iter().map(LoraSpec::new).collect();
        for item in &self.lora_scaled {
            let Some((file, scale)) = item.rsplit_once(':') else { bail!("--lora-scaled {item}: expected FILE:SCALE") };
            match scale.parse::<f32>() {
                Ok(s) if s.is_finite() => out.push(LoraSpec { path: file.into(), scale: s }),
                _ => bail!("--lora-scaled {item}: the scale {scale:?} is not a number"),
            }
        }
        Ok(out)
    }
}
