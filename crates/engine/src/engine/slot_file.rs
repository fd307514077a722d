//! A slot's KV cache saved to a file and read back: llama-server's `POST /slots/{id}` with
//! `action=save|restore|erase` (`serve --slot-save-path`), on the paged cache.
//!
//! What a slot holds here: the whole blocks of the tokens its sequence holds, or held when it
//! last ended (`Blocks::chain`) — prompts live in the prefix cache that every slot shares, so
//! a partly filled last block (never cached) is not saved. Restoring puts the blocks back in
//! the prefix cache, unreferenced, as if a sequence had just released them: the next request
//! whose prompt opens with those tokens, on any slot, attaches them instead of computing them.
//!
//! File: `CORELMKV`, a little-endian `u32` version, a `u32` length and that many bytes of JSON
//! [`Header`] (the model, the cache's geometry, the adapters' scales and the sparsity, all
//! checked on restore), the tokens (`u32` each), then each block's rows as `KvCache::read_block` gives
//! them. Layers on the accelerator (`--accel-layers`) are saved from the CPU's cache once
//! their rows are read back into it (in its type, so an F16 cache rounds the device's f32
//! rows), and restored rows are uploaded there.

use super::Engine;
use crate::Error;
use corelm_core::kv::{Blocks, BLOCK};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"CORELMKV";
const VERSION: u32 = 1;

/// What the rows were computed by and how they are laid out.
#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Header {
    model: String,
    arch: String,
    n_layer: usize,
    n_embd: usize,
    n_vocab: usize,
    /// KV heads the cache holds (with tensor parallelism, each shard's copies).
    kv_slots: usize,
    head_dim: usize,
    k_type: String,
    v_type: String,
    k_layout: String,
    tp: usize,
    /// The LoRA adapters' scales.
    lora: Vec<f32>,
    /// The sparse feed-forwards' thresholds (`--sparsity`; empty: dense) and whether a
    /// predictor chose their gates: both change every layer's input after the first.
    sparsity: Vec<f32>,
    predictor: bool,
    n_tokens: usize,
}

/// What a save or restore moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotIo {
    pub n_tokens: usize,
    pub n_bytes: usize,
}

impl Engine {
    fn slot_header(&self, model: &str, n_tokens: usize) -> Header {
        let (h, kv) = (self.hyper(), &self.kv);
        Header {
            model: model.to_string(),
            arch: h.arch.clone(),
            n_layer: h.n_layer,
            n_embd: h.n_embd,
            n_vocab: h.n_vocab,
            kv_slots: kv.n_kv_head,
            head_dim: kv.head_dim,
            k_type: kv.k_type.name().to_string(),
            v_type: kv.v_type.name().to_string(),
            k_layout: format!("{:?}", kv.k_layout),
            tp: self.tp_degree(),
            lora: self.lora_adapters().iter().map(|a| a.scale).collect(),
            sparsity: self.cfg.sparsity.as_ref().map_or(vec![], |s| s.thresholds.clone()),
            predictor: self.cfg.sparsity.as_ref().is_some_and(|s| s.predictor.is_some()),
            n_tokens,
        }
    }

    /// Write what sequence `seq` holds (or last held) to `path` (see the module doc), for the
    /// model named `model`.
    pub fn save_slot(&mut self, seq: i32, path: &Path, model: &str) -> Result<SlotIo, Error> {
        self.save_slot_upto(seq, path, model, usize::MAX)
    }

    /// [`Engine::save_slot`] of the sequence's first `n_tokens` at most (its prompt alone).
    pub fn save_slot_upto(&mut self, seq: i32, path: &Path, model: &str, n_tokens: usize) -> Result<SlotIo, Error> {
        let s = self.seq_index(seq).ok_or_else(|| Error::Slot(format!("there is no sequence {seq}")))?;
        let mut chain = self.kv.blocks.chain(s);
        chain.truncate(n_tokens / BLOCK);
        if let Some(d) = &self.device_layers {
            // Layers on the device: their rows into the CPU's cache, which the file is written from.
            let cells: Vec<u32> = chain.iter().flat_map(|&b| b * BLOCK as u32..(b + 1) * BLOCK as u32).collect();
            d.pull(&mut self.kv, self.kernels, &cells)?;
        }
        let header = serde_json::to_vec(&self.slot_header(model, chain.len() * BLOCK)).expect("a header serializes");
        let mut out = Vec::with_capacity(16 + header.len() + chain.len() * (BLOCK * 4 + self.kv.block_bytes()));
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        for &b in &chain {
            out.extend(self.kv.blocks.block_tokens(b).iter().flat_map(|t| t.to_le_bytes()));
        }
        for &b in &chain {
            self.kv.read_block(b, &mut out);
        }
        let io = |e: std::io::Error| Error::Slot(format!("{}: {e}", path.display()));
        // Written beside, then renamed: a restore never reads a half-written file.
        let tmp = path.with_extension("partial");
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&out).and_then(|_| f.sync_all()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        Ok(SlotIo { n_tokens: chain.len() * BLOCK, n_bytes: out.len() })
    }

    /// Read a file [`Engine::save_slot`] wrote into the prefix cache. Blocks the cache holds
    /// already are kept; where the cache has no room for the rest (without evicting what this
    /// restore brought), the tokens restored so far are what is reported.
    pub fn restore_slot(&mut self, path: &Path, model: &str) -> Result<SlotIo, Error> {
        let bad = |what: String| Error::Slot(format!("{}: {what}", path.display()));
        let mut data = Vec::new();
        std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut data)).map_err(|e| bad(e.to_string()))?;
        let u32_at = |at: usize| data.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().expect("four bytes")));
        if data.get(..8) != Some(&MAGIC[..]) {
            return Err(bad("not a corelm slot file".into()));
        }
        if u32_at(8) != Some(VERSION) {
            return Err(bad(format!("version {:?}, this build reads {VERSION}", u32_at(8))));
        }
        let hlen = u32_at(12).ok_or_else(|| bad("truncated header".into()))? as usize;
        let header: Header = data.get(16..16 + hlen).and_then(|h| serde_json::from_slice(h).ok()).ok_or_else(|| bad("unreadable header".into()))?;
        let want = self.slot_header(model, header.n_tokens);
        if header != want {
            return Err(bad(format!("saved for another model or cache: {}", differences(&header, &want))));
        }
        let n_blocks = header.n_tokens / BLOCK;
        let (toks_at, block_bytes) = (16 + hlen, self.kv.block_bytes());
        let need = n_blocks.checked_mul(BLOCK * 4 + block_bytes).and_then(|n| n.checked_add(toks_at));
        if !header.n_tokens.is_multiple_of(BLOCK) || need != Some(data.len()) {
            let need = need.map_or("more".to_string(), |n| n.to_string());
            return Err(bad(format!("{} bytes where {} tokens take {need}", data.len(), header.n_tokens)));
        }
        let rows_at = toks_at + n_blocks * BLOCK * 4;
        let tokens: Vec<u32> = data[toks_at..rows_at].chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("four bytes"))).collect();
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= header.n_vocab) {
            return Err(bad(format!("token {t} is outside the vocabulary of {}", header.n_vocab)));
        }
        let (mut parent, mut restored, mut fresh_cells) = (Blocks::root(), Vec::with_capacity(n_blocks), vec![]);
        for (i, toks) in tokens.chunks_exact(BLOCK).enumerate() {
            let Some((b, key, fresh)) = self.kv.blocks.restore(parent, toks, &restored) else { break };
            if fresh {
                self.kv.write_block(b, &data[rows_at + i * block_bytes..][..block_bytes]);
                fresh_cells.extend(b * BLOCK as u32..(b + 1) * BLOCK as u32);
            }
            restored.push(b);
            parent = key;
        }
        if let Some(d) = &self.device_layers {
            // Layers on the device read their rows there.
            fresh_cells.sort_unstable();
            d.push(&self.kv, self.kernels, &fresh_cells);
        }
        self.kv.blocks.touch_chain(&restored);
        Ok(SlotIo { n_tokens: restored.len() * BLOCK, n_bytes: data.len() })
    }

    /// Forget what sequence `seq` last held (its cached blocks that no running sequence uses).
    /// Returns the tokens it held; 0 while it runs.
    pub fn erase_slot(&mut self, seq: i32) -> usize {
        self.seq_index(seq).map_or(0, |s| self.kv.blocks.erase_last(s))
    }
}

/// The header fields in which `got` differs from `want`.
fn differences(got: &Header, want: &Header) -> String {
    let (g, w) = (serde_json::to_value(got).expect("serializes"), serde_json::to_value(want).expect("serializes"));
    let (Some(g), Some(w)) = (g.as_object(), w.as_object()) else { return String::new() };
    g.iter().filter(|(k, v)| w.get(*k) != Some(v) && k.as_str() != "n_tokens").map(|(k, v)| format!("{k} {v} (here {})", w[k])).collect::<Vec<_>>().join(", ")
}
