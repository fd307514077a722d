//! The vocabulary as a grammar reads it: a trie of the code points each token's piece decodes
//! to (from a clean character boundary), so the tokens sharing a prefix are tried together.

use super::{decode, Partial};
use crate::tokenizer::Tokenizer;

/// Built once per tokenizer ([`GrammarVocab::new`]); nodes are numbered from the root (0), each
/// node's lists stored contiguously (`*_at[i]..*_at[i + 1]`).
#[derive(Debug)]
pub struct GrammarVocab {
    /// Children as (code point, node), sorted by code point.
    kid_at: Vec<u32>,
    kids: Vec<(u32, u32)>,
    /// Tokens whose piece ends at this node on a character boundary.
    end_at: Vec<u32>,
    ends: Vec<u32>,
    /// Tokens whose piece ends past this node inside a character, with that character's start.
    cut_at: Vec<u32>,
    cuts: Vec<(u32, Partial)>,
    /// End-of-generation tokens.
    pub eog: Vec<u32>,
    /// Every token other than those and those never allowed (empty piece, or a NUL first byte):
    /// what a grammar may take, tried one by one after a token that cut a character.
    pub text: Vec<u32>,
    /// Per token: does its piece read (from a character boundary) as at least one whole
    /// character? Only such a token can match a token element, as in llama.cpp (which refuses
    /// one that is only a cut character there).
    pub whole: Vec<bool>,
    pub n_vocab: usize,
}

impl GrammarVocab {
    pub fn new(tok: &Tokenizer) -> GrammarVocab {
        let n_vocab = tok.n_vocab();
        let (mut eog, mut text, mut whole) = (vec![], vec![], vec![false; n_vocab]);
        // Each readable token's code points; sorted, neighbours share their common prefix, so
        // the trie is built in one pass with its nodes numbered depth first, children by code
        // point: the order a walk visits them, so it reads every table front to back.
        let mut read: Vec<(Vec<u32>, u32, Partial)> = Vec::with_capacity(n_vocab);
        for id in 0..n_vocab as u32 {
            let piece = tok.piece(id);
            if tok.is_eog(id) {
                eog.push(id);
                continue;
            }
            if piece.first().is_none_or(|&b| b == 0) {
                continue;
            }
            text.push(id);
            let mut cps = Vec::with_capacity(piece.len());
            let Some(end) = decode(piece, Partial::default(), &mut cps) else { continue };
            whole[id as usize] = !cps.is_empty();
            read.push((cps, id, end));
        }
        read.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        // (parent, code point, child) in creation order; the path of the last token's nodes.
        let (mut edges, mut ends, mut cuts) = (Vec::<(u32, u32, u32)>::new(), Vec::<(u32, u32)>::new(), Vec::<(u32, (u32, Partial))>::new());
        let mut path: Vec<(u32, u32)> = Vec::new();
        let mut n_nodes = 1u32;
        for (cps, id, end) in &read {
            let common = path.iter().zip(cps).take_while(|(p, c)| p.0 == **c).count();
            path.truncate(common);
            for &c in &cps[common..] {
                let parent = path.last().map_or(0, |p| p.1);
                edges.push((parent, c, n_nodes));
                path.push((c, n_nodes));
                n_nodes += 1;
            }
            let node = path.last().map_or(0, |p| p.1);
            if end.remain == 0 {
                ends.push((node, *id));
            } else {
                cuts.push((node, (*id, *end)));
            }
        }
        // Children grouped by parent (a stable sort keeps them by code point).
        edges.sort_by_key(|e| e.0);
        let offsets = |keys: &mut dyn Iterator<Item = u32>| {
            let mut at = vec![0u32; n_nodes as usize + 1];
            for k in keys {
                at[k as usize + 1] += 1;
            }
            for i in 0..n_nodes as usize {
                at[i + 1] += at[i];
            }
            at
        };
        GrammarVocab {
            kid_at: offsets(&mut edges.iter().map(|k| k.0)),
            kids: edges.iter().map(|&(_, c, k)| (c, k)).collect(),
            end_at: offsets(&mut ends.iter().map(|e| e.0)),
            ends: ends.iter().map(|e| e.1).collect(),
            cut_at: offsets(&mut cuts.iter().map(|c| c.0)),
            cuts: cuts.iter().map(|c| c.1).collect(),
            eog,
            text,
            whole,
            n_vocab,
        }
    }

    pub fn kids(&self, node: u32) -> &[(u32, u32)] {
        &self.kids[self.kid_at[node as usize] as usize..self.kid_at[node as usize + 1] as usize]
    }

    pub fn ends(&self, node: u32) -> &[u32] {
        &self.ends[self.end_at[node as usize] as usize..self.end_at[node as usize + 1] as usize]
    }

    pub fn cuts(&self, node: u32) -> &[(u32, Partial)] {
        &self.cuts[self.cut_at[node as usize] as usize..self.cut_at[node as usize + 1] as usize]
    }

    pub fn n_nodes(&self) -> usize {
        self.kid_at.len() - 1
    }
}
