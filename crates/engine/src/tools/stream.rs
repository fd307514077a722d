//! Calls read while the answer is still being written, for a stream that sends each call as
//! OpenAI streams them: its name once written (and one of the tools'), then its arguments' text
//! piece by piece as the model writes it.
//!
//! A call is recognised in the held-back text (what [`super::plain_prefix`] does not release)
//! in the shape the call schema holds it to, `{"name": "<tool>", "arguments": {…}}`, behind
//! Hermes' tags, a code fence or a list's `[` and `,`. Anything else that opens with `{` (JSON of
//! no call, the keys in another order) stops the reader: the answer is then read whole at its
//! end ([`super::parse`]), as before streaming calls.

use super::Tool;

/// What one more piece of the answer released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallDelta {
    /// Call `index` of tool `name` begins.
    Start { index: usize, name: String },
    /// More of call `index`'s arguments (JSON text).
    Args { index: usize, text: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Looking for the next call's `{`.
    Seek,
    /// Inside call `calls − 1`'s arguments: object depth, inside a string, after a backslash.
    Args { depth: usize, in_str: bool, escaped: bool },
    /// Something other than a call: nothing more is read.
    Stopped,
}

/// Reads an answer's calls as it grows (see the module doc).
#[derive(Debug)]
pub struct CallReader {
    /// Bytes of the held text read.
    at: usize,
    state: State,
    calls: usize,
    /// Whether the last call's arguments closed.
    closed: bool,
}

impl Default for CallReader {
    fn default() -> Self {
        CallReader { at: 0, state: State::Seek, calls: 0, closed: true }
    }
}

/// Where a call's arguments begin in `t` (at a `{` that opens a call): `Ok(Some((name, at)))`,
/// `Ok(None)` while `t` could still grow into a call's head, `Err(())` when it cannot.
fn head(t: &str) -> Result<Option<(String, usize)>, ()> {
    let b = t.as_bytes();
    let mut i = 1;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Each literal piece: all of it, or the text ends inside it.
    let lit = |i: &mut usize, s: &str| -> Result<bool, ()> {
        let n = s.len().min(b.len() - *i);
        if b[*i..*i + n] != s.as_bytes()[..n] {
            return Err(());
        }
        *i += n;
        Ok(n == s.len())
    };
    for piece in ["\"name\"", ":"] {
        ws(&mut i);
        if !lit(&mut i, piece)? {
            return Ok(None);
        }
    }
    ws(&mut i);
    if !lit(&mut i, "\"")? {
        return Ok(None);
    }
    let start = i;
    while i < b.len() && b[i] != b'"' {
        // Tool names are letters, digits, `_` and `-`.
        if !(b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'-') {
            return Err(());
        }
        i += 1;
    }
    if i == b.len() {
        return Ok(None);
    }
    let name = t[start..i].to_string();
    i += 1;
    for piece in [",", "\"arguments\"", ":", "{"] {
        ws(&mut i);
        if !lit(&mut i, piece)? {
            return Ok(None);
        }
    }
    Ok(Some((name, i - 1)))
}

impl CallReader {
    /// Read `text` (the answer so far, which only grows) past what was read before and past
    /// `from` (the bytes before it went out as content).
    pub fn feed(&mut self, text: &str, from: usize, tools: &[Tool], out: &mut Vec<CallDelta>) {
        let held = text;
        loop {
            match self.state {
                State::Stopped => return,
                State::Seek => {
                    self.at = self.at.max(from);
                    let Some(open) = held[self.at..].find('{').map(|i| self.at + i) else { return };
                    match head(&held[open..]) {
                        Ok(None) => return,
                        Err(()) => {
                            self.state = State::Stopped;
                            return;
                        }
                        Ok(Some((name, args))) => {
                            if !tools.iter().any(|t| t.name == name) {
                                self.state = State::Stopped;
                                return;
                            }
                            out.push(CallDelta::Start { index: self.calls, name });
                            self.calls += 1;
                            self.closed = false;
                            self.at = open + args;
                            self.state = State::Args { depth: 0, in_str: false, escaped: false };
                        }
                    }
                }
                State::Args { mut depth, mut in_str, mut escaped } => {
                    let from = self.at;
                    let mut end = None;
                    for (i, &c) in held.as_bytes()[from..].iter().enumerate() {
                        if in_str {
                            match (escaped, c) {
                                (true, _) => escaped = false,
                                (false, b'\\') => escaped = true,
                                (false, b'"') => in_str = false,
                                _ => {}
                            }
                            continue;
                        }
                        match c {
                            b'"' => in_str = true,
                            b'{' | b'[' => depth += 1,
                            b'}' | b']' => {
                                depth -= 1;
                                if depth == 0 {
                                    end = Some(from + i + 1);
                                    break;
                                }
                            }
                            _ => {}
                        }
                    }
                    let to = end.unwrap_or(held.len());
                    // Whole characters only (the text may end inside one).
                    let to = (from..=to).rev().find(|&j| held.is_char_boundary(j)).unwrap_or(from);
                    if to > from {
                        out.push(CallDelta::Args { index: self.calls - 1, text: held[from..to].to_string() });
                    }
                    self.at = to;
                    match end {
                        Some(_) => {
                            self.closed = true;
                            self.state = State::Seek;
                        }
                        None => {
                            self.state = State::Args { depth, in_str, escaped };
                            return;
                        }
                    }
                }
            }
        }
    }

    /// How many calls began.
    pub fn started(&self) -> usize {
        self.calls
    }

    /// Did every call that began close its arguments?
    pub fn all_closed(&self) -> bool {
        self.closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Vec<Tool> {
        ["get_time", "get_weather"].iter().map(|n| Tool::from_openai(&json!({"type": "function", "function": {"name": n}}), "t").unwrap()).collect()
    }

    /// Fed a byte at a time (where a character ends), the deltas join to the calls.
    fn read(text: &str) -> (Vec<(String, String)>, CallReader) {
        let (mut r, mut out) = (CallReader::default(), vec![]);
        for end in (1..=text.len()).filter(|&e| text.is_char_boundary(e)) {
            r.feed(&text[..end], 0, &tools(), &mut out);
        }
        let mut calls: Vec<(String, String)> = vec![];
        for d in out {
            match d {
                CallDelta::Start { index, name } => {
                    assert_eq!(index, calls.len());
                    calls.push((name, String::new()));
                }
                CallDelta::Args { index, text } => calls[index].1.push_str(&text),
            }
        }
        (calls, r)
    }

    #[test]
    fn calls_stream_in_every_wrapping() {
        let one = |n: &str, a: &str| (n.to_string(), a.to_string());
        let hermes = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\": \"Zürich {x}\", \"q\": [1, {\"a\": \"\\\"}\"}]}}\n</tool_call>";
        let (calls, r) = read(hermes);
        assert_eq!(calls, [one("get_time", "{\"zone\": \"CET\"}"), one("get_weather", "{\"city\": \"Zürich {x}\", \"q\": [1, {\"a\": \"\\\"}\"}]}")]);
        assert!(r.all_closed());
        let (calls, _) = read("```json\n[{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]\n```");
        assert_eq!(calls, [one("get_time", "{}"), one("get_time", "{\"zone\": \"UTC\"}")]);
        // Cut off inside the arguments: what was written, not closed.
        let (calls, r) = read("{\"name\": \"get_time\", \"arguments\": {\"zone\": \"Eu");
        assert_eq!((calls, r.all_closed()), (vec![one("get_time", "{\"zone\": \"Eu")], false));
    }

    #[test]
    fn what_is_no_call_stops_the_reader() {
        for text in [
            "{\"a\": 1}",
            "{\"arguments\": {}, \"name\": \"get_time\"}",
            "{\"name\": \"get_news\", \"arguments\": {}}",
            "{\"name\": \"get time\", \"arguments\": {}}",
        ] {
            let (calls, r) = read(text);
            assert!(calls.is_empty() && r.started() == 0, "{text}");
        }
        // A call, then JSON of none: the first call stands, nothing more is read.
        let (calls, _) = read("{\"name\": \"get_time\", \"arguments\": {}}\n```json\n{\"a\": 1}\n```\n{\"name\": \"get_time\", \"arguments\": {}}");
        assert_eq!(calls.len(), 1);
    }
}
