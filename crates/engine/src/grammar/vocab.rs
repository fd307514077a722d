//! The vocabulary as a grammar reads it: a trie of the code points each token's piece decodes
//! to (from a clean character boundary), so the tokens sharing a prefix are tried together.

use super::{decode, Partial};
use crate::tokenizer::Tokenizer;
use std::collections::HashMap;

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
        let mut edges: HashMap<(u32, u32), u32> = HashMap::new();
        let mut n_nodes = 1u32;
        let (mut ends, mut cuts, mut eog, mut text) = (vec![], vec![], vec![], vec![]);
        let mut cps = Vec::new();
        let mut whole = vec![false; n_vocab];
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
            cps.clear();
            let Some(end) = decode(piece, Partial::default(), &mut cps) else { continue };
            whole[id as usize] = !cps.is_empty();
            let mut node = 0u32;
            for &c in &cps {
                node = *edges.entry((node, c)).or_insert_with(|| {
                    n_nodes += 1;
                    n_nodes - 1
                });
            }
            if end.remain == 0 {
                ends.push((node, id));
            } else {
                cuts.push((node, (id, end)));
            }
        }
        // Renumber the nodes in the walk's order (depth first, children by code point), so that
        // a walk reads every table front to back.
        let mut kids: Vec<(u32, u32, u32)> = edges.into_iter().map(|((n, c), k)| (n, c, k)).collect();
        kids.sort_unstable();
        let mut first = vec![0u32; n_nodes as usize + 1];
        for k in &kids {
            first[k.0 as usize + 1] += 1;
        }
        for i in 0..n_nodes as usize {
            first[i + 1] += first[i];
        }
        let mut order = vec![0u32; n_nodes as usize];
        let (mut next_id, mut todo) = (0u32, vec![0u32]);
        while let Some(n) = todo.pop() {
            order[n as usize] = next_id;
            next_id += 1;
            for k in kids[first[n as usize] as usize..first[n as usize + 1] as usize].iter().rev() {
                todo.push(k.2);
            }
        }
        let mut kids: Vec<(u32, u32, u32)> = kids.iter().map(|&(n, c, k)| (order[n as usize], c, order[k as usize])).collect();
        kids.sort_unstable();
        let mut ends: Vec<(u32, u32)> = ends.iter().map(|&(n, id)| (order[n as usize], id)).collect();
        ends.sort_unstable();
        let mut cuts: Vec<(u32, (u32, Partial))> = cuts.iter().map(|&(n, c)| (order[n as usize], c)).collect();
        cuts.sort_unstable_by_key(|&(n, (id, _))| (n, id));
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
            kid_at: offsets(&mut kids.iter().map(|k| k.0)),
            kids: kids.iter().map(|&(_, c, k)| (c, k)).collect(),
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
