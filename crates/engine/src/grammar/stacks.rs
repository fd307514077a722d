//! The pushdown stacks of a grammar's automaton, interned: a stack is a node `(element,
//! parent)`, equal stacks are one id, so a set of stacks is a sorted list of ids and what a
//! stack expands to is computed once.
//!
//! A stack's top is the element to match next; the nodes below are where each enclosing rule
//! goes on once the one above it ends. [`Stacks::expand`] turns a stack whose top is a rule
//! reference into the stacks that start each of the rule's alternatives (llama.cpp's
//! `advance_stack`), until every top is a terminal — a character class, `.` or a token — or
//! the stack is empty ([`NIL`]: the grammar is complete there).

use super::{Elem, Grammar};
use std::collections::HashMap;

/// The empty stack.
pub const NIL: u32 = u32::MAX;

/// Not computed yet (in the memo tables).
const UNSET: (u32, u32) = (u32::MAX, 0);

#[derive(Debug, Clone)]
pub struct Stacks {
    /// Node id → (element position, parent id or [`NIL`]).
    nodes: Vec<(u32, u32)>,
    ids: HashMap<(u32, u32), u32>,
    /// Node id → its expansion (a span of `lists`).
    expanded: Vec<(u32, u32)>,
    /// Node id (its top a terminal) → the expansion of what follows once its top matched.
    after: Vec<(u32, u32)>,
    lists: Vec<u32>,
    /// [`expand`](Self::expand)'s work list and seen set.
    todo: Vec<u32>,
    seen: Vec<u32>,
}

impl Default for Stacks {
    fn default() -> Self {
        // `lists[0]` is the empty stack's expansion: itself.
        Stacks { nodes: vec![], ids: HashMap::new(), expanded: vec![], after: vec![], lists: vec![NIL], todo: vec![], seen: vec![] }
    }
}

impl Stacks {
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn top(&self, s: u32) -> u32 {
        self.nodes[s as usize].0
    }

    fn intern(&mut self, pos: u32, parent: u32) -> u32 {
        if let Some(&id) = self.ids.get(&(pos, parent)) {
            return id;
        }
        let id = self.nodes.len() as u32;
        self.nodes.push((pos, parent));
        self.expanded.push(UNSET);
        self.after.push(UNSET);
        self.ids.insert((pos, parent), id);
        id
    }

    /// The stack with `pos` pushed on `parent` — or `parent` itself where `pos` ends its
    /// alternative.
    fn push(&mut self, g: &Grammar, pos: u32, parent: u32) -> u32 {
        if g.elems[pos as usize] == Elem::End {
            parent
        } else {
            self.intern(pos, parent)
        }
    }

    /// The stacks the grammar starts in: each alternative of the root, expanded.
    pub fn start(&mut self, g: &Grammar, out: &mut Vec<u32>) {
        out.clear();
        for i in 0..g.alts[g.root as usize].len() {
            let s = self.push(g, g.alts[g.root as usize][i], NIL);
            let (at, n) = self.expand(g, s);
            out.extend_from_slice(&self.lists[at as usize..(at + n) as usize]);
        }
        out.sort_unstable();
        out.dedup();
    }

    /// The terminal-topped (or empty) stacks `s` stands for: a span of [`list`](Self::list).
    pub fn expand(&mut self, g: &Grammar, s: u32) -> (u32, u32) {
        if s == NIL {
            return (0, 1);
        }
        if self.expanded[s as usize] != UNSET {
            return self.expanded[s as usize];
        }
        let (mut todo, mut seen) = (std::mem::take(&mut self.todo), std::mem::take(&mut self.seen));
        let mut out = Vec::new();
        todo.clear();
        seen.clear();
        todo.push(s);
        while let Some(cur) = todo.pop() {
            if seen.contains(&cur) {
                continue;
            }
            seen.push(cur);
            if cur == NIL {
                out.push(NIL);
                continue;
            }
            let (pos, parent) = self.nodes[cur as usize];
            match g.elems[pos as usize] {
                Elem::Ref(r) => {
                    let cont = self.push(g, pos + 1, parent);
                    for i in 0..g.alts[r as usize].len() {
                        let a = g.alts[r as usize][i];
                        todo.push(self.push(g, a, cont));
                    }
                }
                Elem::End => unreachable!("a stack never rests on the end of an alternative"),
                _ => out.push(cur),
            }
        }
        out.sort_unstable();
        out.dedup();
        let span = (self.lists.len() as u32, out.len() as u32);
        self.lists.extend_from_slice(&out);
        self.expanded[s as usize] = span;
        (self.todo, self.seen) = (todo, seen);
        span
    }

    /// The stacks after terminal-topped `s` matched: its top popped, the rest expanded.
    pub fn after(&mut self, g: &Grammar, s: u32) -> (u32, u32) {
        if self.after[s as usize] != UNSET {
            return self.after[s as usize];
        }
        let (pos, parent) = self.nodes[s as usize];
        let next = self.push(g, pos + 1, parent);
        let span = self.expand(g, next);
        self.after[s as usize] = span;
        span
    }

    pub fn list(&self, (at, n): (u32, u32)) -> &[u32] {
        &self.lists[at as usize..(at + n) as usize]
    }

    /// A fresh table holding only the stacks `live` (rewritten to their new ids); the memo
    /// tables start empty. For a sequence whose table has grown large.
    pub fn compact(&mut self, live: &mut [u32]) {
        let mut fresh = Stacks::default();
        for s in live.iter_mut() {
            let mut chain = Vec::new();
            let mut at = *s;
            while at != NIL {
                chain.push(self.nodes[at as usize].0);
                at = self.nodes[at as usize].1;
            }
            let mut id = NIL;
            for &pos in chain.iter().rev() {
                id = fresh.intern(pos, id);
            }
            *s = id;
        }
        *self = fresh;
    }
}
