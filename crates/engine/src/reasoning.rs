//! Reasoning apart from the answer, as llama-server's `--reasoning-format deepseek` reads it:
//! an answer that opens with `<think>` (or whose prompt ends in one: the template opened the
//! block, as DeepSeek-R1's and Qwen3's thinking turns do) holds its reasoning up to
//! `</think>`; what follows is the answer's content. Both are trimmed of the whitespace at
//! their ends (the content only at its start: a stream cannot know its end). An answer cut
//! inside the block is all reasoning.
//!
//! [`Splitter`] reads an answer piece by piece and hands out each part as soon as it is sure
//! of it (holding back what may still be the start of a tag, or whitespace that may turn out
//! to be trailing); [`split`] reads a whole one. Every way of cutting an answer into pieces
//! gives the same parts (tested).

/// The tags of a reasoning block.
pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// Whether a rendered prompt leaves the answer inside a reasoning block: its last `<think>`
/// is not closed (the template opened it, or a prefill began one).
pub fn starts_open(prompt: &str) -> bool {
    prompt.rfind(OPEN).is_some_and(|at| !prompt[at..].contains(CLOSE))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before anything but whitespace: the answer may still open a block.
    Start,
    /// Inside the block.
    Inside,
    /// After it (or with none): content.
    After,
}

/// An answer's reasoning and content, piece by piece (see the module doc).
#[derive(Clone, Debug)]
pub struct Splitter {
    state: State,
    /// Text read and not handed out yet.
    held: String,
    /// Reasoning or content has been handed out (so whitespace is no longer leading).
    started: bool,
    /// The answer has (or opened inside) a reasoning block.
    block: bool,
}

/// Parts of the answer a piece made sure of.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parts {
    pub reasoning: String,
    pub content: String,
}

impl Splitter {
    /// For an answer whose prompt left it inside a block (`open`), or not.
    pub fn new(open: bool) -> Splitter {
        Splitter { state: if open { State::Inside } else { State::Start }, held: String::new(), started: false, block: open }
    }

    /// Whether the answer has a reasoning block (so far).
    pub fn has_block(&self) -> bool {
        self.block
    }

    /// Whether the answer is still inside its reasoning block.
    pub fn inside(&self) -> bool {
        self.state == State::Inside
    }

    /// Read one more piece.
    pub fn push(&mut self, piece: &str) -> Parts {
        self.held.push_str(piece);
        let mut out = Parts::default();
        loop {
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Inside;
                        self.started = false;
                        self.block = true;
                    } else if OPEN.starts_with(t) {
                        return out; // still maybe the tag
                    } else {
                        self.state = State::After;
                    }
                }
                State::Inside => {
                    if let Some(at) = self.held.find(CLOSE) {
                        let r = self.held[..at].trim_end().to_string();
                        self.emit_reasoning(&r, &mut out);
                        self.held = self.held[at + CLOSE.len()..].to_string();
                        self.state = State::After;
                        self.started = false;
                        continue;
                    }
                    // Hand out all but a possible start of the tag and trailing whitespace.
                    let keep = partial_suffix(&self.held, CLOSE);
                    let safe = self.held[..self.held.len() - keep].trim_end().len();
                    let r = self.held[..safe].to_string();
                    self.emit_reasoning(&r, &mut out);
                    self.held.drain(..safe);
                    return out;
                }
                State::After => {
                    let t = if self.started { &self.held[..] } else { self.held.trim_start() };
                    if !t.is_empty() {
                        out.content.push_str(t);
                        self.started = true;
                    }
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    fn emit_reasoning(&mut self, r: &str, out: &mut Parts) {
        let r = if self.started { r } else { r.trim_start() };
        if !r.is_empty() {
            out.reasoning.push_str(r);
            self.started = true;
        }
    }

    /// The answer ended: what was held (an unclosed block's reasoning, trimmed; an answer of
    /// only a tag's start as content).
    pub fn finish(&mut self) -> Parts {
        let mut out = Parts::default();
        match self.state {
            State::Inside => {
                let r = std::mem::take(&mut self.held);
                self.emit_reasoning(r.trim_end(), &mut out);
            }
            State::Start | State::After => {
                let t = std::mem::take(&mut self.held);
                let t = if self.started { &t[..] } else { t.trim_start() };
                out.content.push_str(t);
            }
        }
        out
    }
}

/// Bytes at the end of `s` that are a proper start of `tag`.
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1)).rev().find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..])).unwrap_or(0)
}

/// A whole answer's reasoning (`None` where it had no block) and content.
pub fn split(text: &str, open: bool) -> (Option<String>, String) {
    let mut s = Splitter::new(open);
    let (a, b) = (s.push(text), s.finish());
    (s.has_block().then_some(a.reasoning + &b.reasoning), a.content + &b.content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn whole_answers() {
        assert_eq!(split("<think>\nLet me see.\n</think>\n\nParis.", false), (Some("Let me see.".into()), "Paris.".into()));
        assert_eq!(split("Let me see.</think>Paris.", true), (Some("Let me see.".into()), "Paris.".into()));
        assert_eq!(split("  Paris <think> is", false), (None, "Paris <think> is".into()));
        assert_eq!(split("<think>cut off", false), (Some("cut off".into()), String::new()));
        assert_eq!(split("<thi", false), (None, "<thi".into()));
        assert_eq!(split("\n\n</think>\n\nParis.", true), (Some(String::new()), "Paris.".into()));
        assert!(starts_open("<|im_start|>assistant\n<think>\n") && starts_open("<think>a</think>b<think>\nSo") && !starts_open("<think>\n\n</think>\n\n"));
    }

    proptest! {
        /// Any cutting of an answer into pieces gives the whole answer's parts.
        #[test]
        fn pieces_give_the_whole(words in proptest::collection::vec(prop_oneof![
            Just("<think>"), Just("</think>"), Just("<th"), Just("ink>"), Just("</"), Just(" "), Just("\n"), Just("a"), Just("é b"), Just("<")
        ], 0..12), cuts in proptest::collection::vec(0usize..40, 0..6), open: bool) {
            let text: String = words.concat();
            let (reasoning, content) = split(&text, open);
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).filter(|&c| text.is_char_boundary(c)).collect();
            bounds.sort();
            let mut s = Splitter::new(open);
            let (mut r, mut c, mut at) = (String::new(), String::new(), 0);
            for b in bounds.into_iter().chain([text.len()]) {
                let p = s.push(&text[at..b]);
                r.push_str(&p.reasoning);
                c.push_str(&p.content);
                at = b;
            }
            let p = s.finish();
            r.push_str(&p.reasoning);
            c.push_str(&p.content);
            prop_assert_eq!(r, reasoning.unwrap_or_default());
            prop_assert_eq!(c, content);
        }
    }
}
