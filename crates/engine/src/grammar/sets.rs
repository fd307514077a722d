//! Stack sets interned for the trie walk. Which set follows a set on a code point depends only
//! on which of its stacks' tops take that code point, so each set keeps its transitions by that
//! choice (a bit per stack): a step of the walk is a few range checks and a lookup in a list
//! of one to three entries, with no set built, sorted or compared.

use super::stacks::{Stacks, NIL};
use super::Grammar;
use std::collections::HashMap;

/// Sets past which the table starts afresh (before a walk).
const MAX_SETS: usize = 1 << 16;

#[derive(Clone, Debug, Default)]
pub struct Sets {
    /// Set id → its stacks, sorted.
    stacks: Vec<Vec<u32>>,
    /// Set id → each stack's top element ([`NIL`] for the empty stack).
    tops: Vec<Vec<u32>>,
    ids: HashMap<Vec<u32>, u32>,
    /// Set id → (the stacks a code point matched, as bits; the set that follows).
    trans: Vec<Vec<(u64, u32)>>,
    /// A union being built (reused).
    scratch: Vec<u32>,
}

impl Sets {
    /// Forget every set (their ids too); done between walks when the table has grown large or
    /// the stacks were renumbered.
    pub fn clear(&mut self) {
        self.stacks.clear();
        self.tops.clear();
        self.ids.clear();
        self.trans.clear();
    }

    /// Start afresh if the table has grown past [`MAX_SETS`].
    pub fn trim(&mut self) {
        if self.stacks.len() > MAX_SETS {
            self.clear();
        }
    }

    pub fn get(&self, id: u32) -> &[u32] {
        &self.stacks[id as usize]
    }

    /// The id of the (sorted, deduplicated) stack set `set`.
    pub fn intern(&mut self, st: &Stacks, set: &[u32]) -> u32 {
        if let Some(&id) = self.ids.get(set) {
            return id;
        }
        let id = self.stacks.len() as u32;
        self.stacks.push(set.to_vec());
        self.tops.push(set.iter().map(|&s| if s == NIL { NIL } else { st.top(s) }).collect());
        self.trans.push(Vec::new());
        self.ids.insert(set.to_vec(), id);
        id
    }

    /// The set after set `id` takes code point `c`; `None` where no stack takes it.
    pub fn step(&mut self, g: &Grammar, st: &mut Stacks, id: u32, c: u32) -> Option<u32> {
        let tops = &self.tops[id as usize];
        if tops.len() > 64 {
            return self.step_wide(g, st, id, c);
        }
        let mut hit = 0u64;
        for (i, &pos) in tops.iter().enumerate() {
            if pos != NIL && g.matches(pos, c) {
                hit |= 1 << i;
            }
        }
        if hit == 0 {
            return None;
        }
        if let Some(&(_, next)) = self.trans[id as usize].iter().find(|t| t.0 == hit) {
            return Some(next);
        }
        let mut u = std::mem::take(&mut self.scratch);
        u.clear();
        for (i, &s) in self.stacks[id as usize].iter().enumerate() {
            if hit >> i & 1 == 1 {
                let span = st.after(g, s);
                u.extend_from_slice(st.list(span));
            }
        }
        u.sort_unstable();
        u.dedup();
        let next = self.intern(st, &u);
        self.scratch = u;
        self.trans[id as usize].push((hit, next));
        Some(next)
    }

    /// [`step`](Self::step) for a set of more than 64 stacks: the union built each time.
    fn step_wide(&mut self, g: &Grammar, st: &mut Stacks, id: u32, c: u32) -> Option<u32> {
        let mut u = std::mem::take(&mut self.scratch);
        u.clear();
        for i in 0..self.stacks[id as usize].len() {
            let (s, pos) = (self.stacks[id as usize][i], self.tops[id as usize][i]);
            if pos != NIL && g.matches(pos, c) {
                let span = st.after(g, s);
                u.extend_from_slice(st.list(span));
            }
        }
        u.sort_unstable();
        u.dedup();
        let next = (!u.is_empty()).then(|| self.intern(st, &u));
        self.scratch = u;
        next
    }
}
