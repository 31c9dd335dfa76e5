//! Constrained decoding: byte-level automata that say which tokens may come next.
//!
//! - `ValueMachine` accepts one object in JSON (`response_format: json_object`) or in Gemma-4's
//!   tool-argument dialect (`{location:<|"|>Oslo<|"|>,days:3}`: bare keys, strings delimited by
//!   the `<|"|>` token, no escapes), and knows the shortest text that completes what it has
//!   seen — so a constrained sequence can always be closed within its token budget.
//! - `ToolMachine` wraps it for tool calls: free text, then `<|tool_call>call:NAME{ARGS}<tool_call|>`
//!   with NAME one of the declared tools and ARGS well-formed; `tool_choice` `required` or a
//!   named function force the call.
//!
//! Tokens are seen as bytes (`Piece`): byte-fallback tokens as their byte, special tokens as
//! themselves. `<|"|>` is the byte `QUOTE` in the Gemma dialect.

use serde_json::Value;

/// Stand-in byte for the `<|"|>` token in the Gemma dialect (never valid inside JSON text).
pub const QUOTE: u8 = 0x01;
/// Longest run of whitespace allowed between JSON tokens (stops a model from padding forever).
const MAX_WS_RUN: u8 = 8;
/// Deepest nesting accepted (strict parsers limit recursion: serde_json at 128).
const MAX_DEPTH: usize = 64;
/// Longest number literal accepted.
const MAX_NUMBER: u8 = 32;

/// What one vocabulary entry is, for the automata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Bytes(Vec<u8>),
    Special,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Json,
    GemmaArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    /// After `{`: a key or `}`.
    ObjFirst,
    /// After `,` in an object: a key.
    ObjKey,
    /// After a JSON key string: `:`.
    ObjColon,
    /// After `:`: a value.
    ObjValue,
    /// After a member: `,` or `}`.
    ObjNext,
    /// After `[`: a value or `]`.
    ArrFirst,
    /// After `,` in an array: a value.
    ArrValue,
    /// After an element: `,` or `]`.
    ArrNext,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    /// One or two exponent digits: at most two, so every accepted number fits an f64 (strict
    /// parsers such as serde_json reject `1e400`).
    Exp1,
    Exp2,
}

impl Num {
    fn can_end(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::Exp1 | Num::Exp2)
    }
}

/// Where a `\u` escape stands with respect to UTF-16 surrogates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sur {
    /// Nothing pending.
    No,
    /// The escape's first digit was `d`: the second decides (0-7 plain, 8-b high, c-f a lone low).
    FirstD,
    /// The escape is a high surrogate (D800–DBFF): `\u` + a low surrogate must follow.
    High,
    /// The escape must be a low surrogate (DC00–DFFF).
    Low,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    None,
    /// Inside a string; `esc`: 0 none, 1 after `\`, 2..=5 expecting the (esc-1)th hex digit
    /// of a `\u` escape, 6 after a high-surrogate escape (a `\` must follow), 7 after that `\`
    /// (a `u` must follow). `sur` keeps surrogate escapes paired, as JSON parsers demand.
    Str { esc: u8, sur: Sur },
    Num { state: Num, len: u8 },
    Lit { word: &'static [u8], at: u8 },
    /// A bare Gemma key, ended by `:`.
    BareKey,
}

/// Accepts exactly one top-level object, byte by byte.
#[derive(Debug, Clone)]
pub struct ValueMachine {
    dialect: Dialect,
    stack: Vec<Frame>,
    lex: Lex,
    ws: u8,
    started: bool,
    done: bool,
    /// Inside a string: continuation bytes the current UTF-8 character still needs, and the
    /// range the next one must fall in (strings must stay valid UTF-8).
    utf8_left: u8,
    utf8_range: (u8, u8),
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\t' | b'\r')
}

fn is_ident(b: u8, first: bool) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || (!first && (b.is_ascii_digit() || b == b'-' || b == b'.'))
}

impl ValueMachine {
    pub fn new(dialect: Dialect) -> Self {
        ValueMachine { dialect, stack: vec![], lex: Lex::None, ws: 0, started: false, done: false, utf8_left: 0, utf8_range: (0x80, 0xBF) }
    }

    /// The object is closed: nothing more may follow.
    pub fn is_done(&self) -> bool {
        self.done
    }

    fn quote(&self) -> u8 {
        if self.dialect == Dialect::Json {
            b'"'
        } else {
            QUOTE
        }
    }

    /// A value is complete: the enclosing frame expects `,` or its closer.
    fn end_value(&mut self) {
        match self.stack.last_mut() {
            Some(f @ Frame::ObjValue) => *f = Frame::ObjNext,
            Some(f @ (Frame::ArrFirst | Frame::ArrValue)) => *f = Frame::ArrNext,
            Some(_) => {}
            None => self.done = true,
        }
    }

    fn close(&mut self) {
        self.stack.pop();
        if self.stack.is_empty() {
            self.done = true;
        } else {
            self.end_value();
        }
    }

    fn start_value(&mut self, b: u8) -> bool {
        let q = self.quote();
        if matches!(b, b'{' | b'[') && self.stack.len() >= MAX_DEPTH {
            return false;
        }
        match b {
            b'{' => {
                self.end_value();
                self.stack.push(Frame::ObjFirst);
            }
            b'[' => {
                self.end_value();
                self.stack.push(Frame::ArrFirst);
            }
            _ if b == q => {
                self.end_value();
                self.lex = Lex::Str { esc: 0, sur: Sur::No };
            }
            b'-' => {
                self.end_value();
                self.lex = Lex::Num { state: Num::Minus, len: 1 };
            }
            b'0' => {
                self.end_value();
                self.lex = Lex::Num { state: Num::Zero, len: 1 };
            }
            b'1'..=b'9' => {
                self.end_value();
                self.lex = Lex::Num { state: Num::Int, len: 1 };
            }
            b't' | b'f' | b'n' => {
                self.end_value();
                let word: &'static [u8] = match b {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                self.lex = Lex::Lit { word, at: 1 };
            }
            _ => return false,
        }
        true
    }

    fn start_key(&mut self, b: u8) -> bool {
        match self.dialect {
            Dialect::Json if b == b'"' => {
                *self.stack.last_mut().expect("in an object") = Frame::ObjColon;
                self.lex = Lex::Str { esc: 0, sur: Sur::No };
                true
            }
            Dialect::GemmaArgs if is_ident(b, true) => {
                *self.stack.last_mut().expect("in an object") = Frame::ObjValue;
                self.lex = Lex::BareKey;
                true
            }
            _ => false,
        }
    }

    fn structural(&mut self, b: u8) -> bool {
        if is_ws(b) {
            if self.dialect == Dialect::Json && self.started && !self.done && self.ws < MAX_WS_RUN {
                self.ws += 1;
                return true;
            }
            return false;
        }
        if !self.started {
            if b != b'{' {
                return false;
            }
            self.started = true;
            self.stack.push(Frame::ObjFirst);
            return true;
        }
        let Some(&top) = self.stack.last() else { return false };
        match (top, b) {
            (Frame::ObjFirst, b'}') | (Frame::ObjNext, b'}') | (Frame::ArrFirst, b']') | (Frame::ArrNext, b']') => {
                self.close();
                true
            }
            (Frame::ObjFirst | Frame::ObjKey, _) => self.start_key(b),
            (Frame::ObjColon, b':') => {
                *self.stack.last_mut().expect("nonempty") = Frame::ObjValue;
                true
            }
            (Frame::ObjNext, b',') => {
                *self.stack.last_mut().expect("nonempty") = Frame::ObjKey;
                true
            }
            (Frame::ArrNext, b',') => {
                *self.stack.last_mut().expect("nonempty") = Frame::ArrValue;
                true
            }
            (Frame::ObjValue | Frame::ArrFirst | Frame::ArrValue, _) => self.start_value(b),
            _ => false,
        }
    }

    /// Feeds one byte; false (and the machine unusable) if it is not allowed here.
    pub fn feed(&mut self, b: u8) -> bool {
        if self.done {
            return false;
        }
        if !is_ws(b) {
            self.ws = 0;
        }
        match self.lex {
            Lex::None => self.structural(b),
            Lex::Str { esc, .. } if self.utf8_left > 0 || (esc == 0 && b >= 0x80) => {
                if self.utf8_left > 0 {
                    let (lo, hi) = self.utf8_range;
                    if !(lo..=hi).contains(&b) {
                        return false;
                    }
                    self.utf8_left -= 1;
                    self.utf8_range = (0x80, 0xBF);
                    return true;
                }
                // A lead byte: how many continuation bytes, and the range of the first one
                // (excluding overlong forms and surrogates, as str::from_utf8 does).
                let (left, range) = match b {
                    0xC2..=0xDF => (1, (0x80, 0xBF)),
                    0xE0 => (2, (0xA0, 0xBF)),
                    0xE1..=0xEC | 0xEE..=0xEF => (2, (0x80, 0xBF)),
                    0xED => (2, (0x80, 0x9F)),
                    0xF0 => (3, (0x90, 0xBF)),
                    0xF1..=0xF3 => (3, (0x80, 0xBF)),
                    0xF4 => (3, (0x80, 0x8F)),
                    _ => return false,
                };
                self.utf8_left = left;
                self.utf8_range = range;
                true
            }
            Lex::Str { esc, sur } => {
                let q = self.quote();
                let str_at = |esc, sur| Lex::Str { esc, sur };
                match self.dialect {
                    Dialect::GemmaArgs => {
                        if b == q {
                            self.lex = Lex::None;
                        }
                        true
                    }
                    Dialect::Json => {
                        let next = match (esc, sur, b) {
                            (0, _, b'"') => Some(Lex::None),
                            (0, _, b'\\') => Some(str_at(1, Sur::No)),
                            (0, _, _) if b >= 0x20 => Some(str_at(0, Sur::No)),
                            (1, _, b'u') => Some(str_at(2, Sur::No)),
                            (1, _, _) if b"\"\\/bfnrt".contains(&b) => Some(str_at(0, Sur::No)),
                            (2, Sur::Low, b'd' | b'D') => Some(str_at(3, Sur::Low)),
                            (2, Sur::No, b'd' | b'D') => Some(str_at(3, Sur::FirstD)),
                            (2, Sur::No, _) if b.is_ascii_hexdigit() => Some(str_at(3, Sur::No)),
                            (3, Sur::Low, b'c'..=b'f' | b'C'..=b'F') => Some(str_at(4, Sur::No)),
                            (3, Sur::FirstD, b'0'..=b'7') => Some(str_at(4, Sur::No)),
                            (3, Sur::FirstD, b'8' | b'9' | b'a' | b'b' | b'A' | b'B') => Some(str_at(4, Sur::High)),
                            (3, Sur::No, _) | (4, _, _) if b.is_ascii_hexdigit() => Some(str_at(esc + 1, sur)),
                            (5, Sur::High, _) if b.is_ascii_hexdigit() => Some(str_at(6, Sur::No)),
                            (5, _, _) if b.is_ascii_hexdigit() => Some(str_at(0, Sur::No)),
                            (6, _, b'\\') => Some(str_at(7, Sur::No)),
                            (7, _, b'u') => Some(str_at(2, Sur::Low)),
                            _ => None,
                        };
                        match next {
                            Some(l) => {
                                self.lex = l;
                                true
                            }
                            None => false,
                        }
                    }
                }
            }
            Lex::Num { state, len } => {
                let next = match (state, b) {
                    (Num::Minus, b'0') => Some(Num::Zero),
                    (Num::Minus, b'1'..=b'9') => Some(Num::Int),
                    (Num::Int, b'0'..=b'9') => Some(Num::Int),
                    (Num::Zero | Num::Int, b'.') => Some(Num::Dot),
                    (Num::Dot | Num::Frac, b'0'..=b'9') => Some(Num::Frac),
                    (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Some(Num::E),
                    (Num::E, b'+' | b'-') => Some(Num::ESign),
                    (Num::E | Num::ESign, b'0'..=b'9') => Some(Num::Exp1),
                    (Num::Exp1, b'0'..=b'9') => Some(Num::Exp2),
                    _ => None,
                };
                match next {
                    // Past the length cap only the digit that completes a number is allowed,
                    // so closing() can always finish one.
                    Some(s) if len < MAX_NUMBER || (!state.can_end() && s.can_end()) => {
                        self.lex = Lex::Num { state: s, len: len + 1 };
                        true
                    }
                    Some(_) => false,
                    None if state.can_end() => {
                        self.lex = Lex::None;
                        self.structural(b)
                    }
                    None => false,
                }
            }
            Lex::Lit { word, at } => {
                if word.get(at as usize) == Some(&b) {
                    self.lex = if at as usize + 1 == word.len() { Lex::None } else { Lex::Lit { word, at: at + 1 } };
                    true
                } else {
                    false
                }
            }
            Lex::BareKey => {
                if is_ident(b, false) {
                    true
                } else if b == b':' {
                    self.lex = Lex::None;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Would these bytes be accepted (without changing the machine)?
    pub fn accepts(&self, bytes: &[u8]) -> Option<ValueMachine> {
        let mut m = self.clone();
        bytes.iter().all(|&b| m.feed(b)).then_some(m)
    }

    /// The shortest bytes that complete the object from here.
    pub fn closing(&self) -> Vec<u8> {
        let mut m = self.clone();
        let mut out = vec![];
        while !m.done {
            let b = m.next_closing_byte();
            out.push(b);
            let ok = m.feed(b);
            debug_assert!(ok, "closing byte {b} rejected");
            if !ok || out.len() > 4096 {
                break;
            }
        }
        out
    }

    fn next_closing_byte(&self) -> u8 {
        match self.lex {
            Lex::Str { .. } if self.utf8_left > 0 => self.utf8_range.0,
            Lex::Str { esc: 1, .. } => b'n',
            Lex::Str { esc: 2, sur: Sur::Low } => b'd',
            Lex::Str { esc: 3, sur: Sur::Low } => b'c',
            Lex::Str { esc: 2..=5, .. } => b'0',
            Lex::Str { esc: 6, .. } => b'\\',
            Lex::Str { esc: 7, .. } => b'u',
            Lex::Str { .. } => self.quote(),
            Lex::Num { state, .. } if !state.can_end() => b'0',
            Lex::Lit { word, at } => word[at as usize],
            Lex::BareKey => b':',
            _ if !self.started => b'{',
            _ => match self.stack.last() {
                Some(Frame::ObjFirst | Frame::ObjNext) | None => b'}',
                Some(Frame::ObjKey) => {
                    if self.dialect == Dialect::Json {
                        b'"'
                    } else {
                        b'k'
                    }
                }
                Some(Frame::ObjColon) => b':',
                Some(Frame::ObjValue | Frame::ArrValue) => b'0',
                Some(Frame::ArrFirst | Frame::ArrNext) => b']',
            },
        }
    }
}

/// Parses what a `GemmaArgs` machine accepted into JSON (keys bare, `QUOTE`-delimited strings).
pub fn gemma_args_to_json(bytes: &[u8]) -> Result<Value, String> {
    let mut p = GemmaParser { b: bytes, i: 0 };
    let v = p.value()?;
    if p.i != bytes.len() {
        return Err(format!("trailing bytes at {}", p.i));
    }
    Ok(v)
}

struct GemmaParser<'a> {
    b: &'a [u8],
    i: usize,
}

impl GemmaParser<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at {}", c as char, self.i))
        }
    }

    fn value(&mut self) -> Result<Value, String> {
        match self.peek() {
            Some(b'{') => {
                self.i += 1;
                let mut m = serde_json::Map::new();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Ok(Value::Object(m));
                }
                loop {
                    let start = self.i;
                    while self.peek().is_some_and(|b| b != b':') {
                        self.i += 1;
                    }
                    let key = String::from_utf8_lossy(&self.b[start..self.i]).into_owned();
                    self.eat(b':')?;
                    m.insert(key, self.value()?);
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Value::Object(m));
                        }
                        _ => return Err(format!("expected , or }} at {}", self.i)),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut a = vec![];
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(Value::Array(a));
                }
                loop {
                    a.push(self.value()?);
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Value::Array(a));
                        }
                        _ => return Err(format!("expected , or ] at {}", self.i)),
                    }
                }
            }
            Some(QUOTE) => {
                self.i += 1;
                let start = self.i;
                while self.peek().is_some_and(|b| b != QUOTE) {
                    self.i += 1;
                }
                let s = String::from_utf8_lossy(&self.b[start..self.i]).into_owned();
                self.eat(QUOTE)?;
                Ok(Value::String(s))
            }
            Some(_) => {
                let start = self.i;
                while self.peek().is_some_and(|b| !matches!(b, b',' | b'}' | b']')) {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.b[start..self.i]).map_err(|e| e.to_string())?;
                serde_json::from_str(text).map_err(|e| format!("bad literal {text:?}: {e}"))
            }
            None => Err("unexpected end".into()),
        }
    }
}

/// Token ids the tool machine needs.
#[derive(Debug, Clone, Copy)]
pub struct ToolTokens {
    pub call_open: u32,
    pub call_close: u32,
    pub response_open: u32,
    pub quote: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    Required,
    Named(String),
}

#[derive(Debug, Clone)]
enum Phase {
    /// Free text (Auto), or waiting for the forced `<|tool_call>`.
    Text,
    /// Inside `<|tool_call>`: the bytes of `call:NAME{` so far.
    Name(Vec<u8>),
    Args { name: String, machine: ValueMachine, bytes: Vec<u8> },
    /// The arguments closed: only `<tool_call|>` may follow.
    Close { name: String, bytes: Vec<u8> },
    /// After `<tool_call|>`: another call (if parallel) or the end of the turn.
    After,
}

/// What a token did, for the caller to report.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolEvent {
    /// Plain text: decode and stream it.
    Text,
    /// Part of a call's markup: nothing to stream yet.
    Markup,
    /// The call's name is known.
    Name(String),
    /// The call is complete: its arguments as JSON.
    Call { name: String, arguments: Value },
    /// The turn is over after tool calls.
    End,
}

/// Tool-call grammar over a whole response.
#[derive(Debug, Clone)]
pub struct ToolMachine {
    ids: ToolTokens,
    names: Vec<String>,
    choice: ToolChoice,
    parallel: bool,
    phase: Phase,
    pub calls: usize,
}

impl ToolMachine {
    pub fn new(ids: ToolTokens, names: Vec<String>, choice: ToolChoice, parallel: bool) -> Self {
        ToolMachine { ids, names, choice, parallel, phase: Phase::Text, calls: 0 }
    }

    fn name_targets(&self) -> Vec<String> {
        match &self.choice {
            ToolChoice::Named(n) => vec![format!("call:{n}{{")],
            _ => self.names.iter().map(|n| format!("call:{n}{{")).collect(),
        }
    }

    fn forced_call(&self) -> bool {
        self.calls == 0 && self.choice != ToolChoice::Auto
    }

    /// Whether `token` may come next, given `remaining` tokens of budget (this one included).
    pub fn allows(&self, token: u32, piece: &Piece, is_eos: bool, remaining: usize) -> bool {
        match &self.phase {
            Phase::Text => {
                if token == self.ids.call_open {
                    return self.call_fits(remaining);
                }
                !self.forced_call()
            }
            Phase::Name(sofar) => {
                let Piece::Bytes(b) = piece else { return false };
                let mut s = sofar.clone();
                s.extend_from_slice(b);
                self.name_targets().iter().any(|t| {
                    let t = t.as_bytes();
                    if s.len() <= t.len() {
                        t.starts_with(&s) && remaining > t.len() - s.len() + 2
                    } else {
                        // the token runs past `{` into the arguments
                        s.starts_with(t) && {
                            let mut m = ValueMachine::new(Dialect::GemmaArgs);
                            m.feed(b'{') && m.accepts(&s[t.len()..]).is_some_and(|m| m.closing().len() + 1 < remaining)
                        }
                    }
                })
            }
            Phase::Args { machine, .. } => {
                let bytes = if token == self.ids.quote {
                    vec![QUOTE]
                } else {
                    match piece {
                        Piece::Bytes(b) if !b.is_empty() => b.clone(),
                        _ => return false,
                    }
                };
                match machine.accepts(&bytes) {
                    // room for the rest of the arguments and `<tool_call|>`
                    Some(m) => m.closing().len() + 1 < remaining,
                    None => false,
                }
            }
            Phase::Close { .. } => token == self.ids.call_close,
            Phase::After => (token == self.ids.call_open && self.parallel && self.call_fits(remaining)) || token == self.ids.response_open || is_eos,
        }
    }

    /// After `<|tool_call>` (this token), the shortest call `call:NAME{}` and `<tool_call|>`
    /// must still fit in the budget (one token per byte at worst).
    fn call_fits(&self, remaining: usize) -> bool {
        let shortest = self.name_targets().iter().map(|t| t.len() + 2).min().unwrap_or(usize::MAX);
        remaining > shortest
    }

    /// The fewest tokens a response can have under this machine: a forced call needs
    /// `<|tool_call>`, the shortest `call:NAME{` one byte per token, `}` and `<tool_call|>`.
    pub fn min_tokens(&self) -> usize {
        if self.forced_call() {
            self.name_targets().iter().map(|t| t.len() + 3).min().unwrap_or(usize::MAX)
        } else {
            1
        }
    }

    /// Between or after complete calls (where running out of budget still leaves whole calls).
    pub fn after_call(&self) -> bool {
        matches!(self.phase, Phase::After)
    }

    /// Advances past an allowed token.
    pub fn advance(&mut self, token: u32, piece: &Piece) -> ToolEvent {
        let phase = std::mem::replace(&mut self.phase, Phase::After);
        let (next, ev) = match phase {
            Phase::Text if token == self.ids.call_open => (Phase::Name(vec![]), ToolEvent::Markup),
            Phase::Text => (Phase::Text, ToolEvent::Text),
            Phase::Name(mut sofar) => {
                if let Piece::Bytes(b) = piece {
                    sofar.extend_from_slice(b);
                }
                match self.name_targets().into_iter().find(|t| sofar.starts_with(t.as_bytes())) {
                    Some(t) => {
                        let name = t["call:".len()..t.len() - 1].to_string();
                        let mut machine = ValueMachine::new(Dialect::GemmaArgs);
                        machine.feed(b'{');
                        let rest = sofar[t.len()..].to_vec();
                        for &b in &rest {
                            machine.feed(b);
                        }
                        let mut bytes = vec![b'{'];
                        bytes.extend_from_slice(&rest);
                        let next = if machine.is_done() { Phase::Close { name: name.clone(), bytes } } else { Phase::Args { name: name.clone(), machine, bytes } };
                        (next, ToolEvent::Name(name))
                    }
                    None => (Phase::Name(sofar), ToolEvent::Markup),
                }
            }
            Phase::Args { name, mut machine, mut bytes } => {
                let add = if token == self.ids.quote {
                    vec![QUOTE]
                } else if let Piece::Bytes(b) = piece {
                    b.clone()
                } else {
                    vec![]
                };
                for &b in &add {
                    machine.feed(b);
                }
                bytes.extend_from_slice(&add);
                if machine.is_done() {
                    (Phase::Close { name, bytes }, ToolEvent::Markup)
                } else {
                    (Phase::Args { name, machine, bytes }, ToolEvent::Markup)
                }
            }
            Phase::Close { name, bytes } => {
                self.calls += 1;
                let arguments = gemma_args_to_json(&bytes).unwrap_or(Value::Null);
                (Phase::After, ToolEvent::Call { name, arguments })
            }
            Phase::After if token == self.ids.call_open => (Phase::Name(vec![]), ToolEvent::Markup),
            Phase::After => (Phase::After, ToolEvent::End),
        };
        self.phase = next;
        ev
    }

    /// Inside a call's markup (text must not be streamed).
    pub fn in_call(&self) -> bool {
        !matches!(self.phase, Phase::Text)
    }
}

/// `response_format: json_object` over a whole response.
#[derive(Debug, Clone)]
pub struct JsonMachine {
    machine: ValueMachine,
}

impl Default for JsonMachine {
    fn default() -> Self {
        JsonMachine { machine: ValueMachine::new(Dialect::Json) }
    }
}

impl JsonMachine {
    /// The fewest tokens a response can have: `{}`, one byte per token at worst.
    pub fn min_tokens(&self) -> usize {
        self.machine.closing().len()
    }

    pub fn is_done(&self) -> bool {
        self.machine.is_done()
    }

    /// Allowed if the bytes keep the text a prefix of an object that can still be closed
    /// within `remaining` tokens (this one included; every closing byte is one ASCII token at
    /// worst).
    pub fn allows(&self, piece: &Piece, remaining: usize) -> bool {
        match piece {
            Piece::Bytes(b) if !b.is_empty() => self.machine.accepts(b).is_some_and(|m| m.closing().len() < remaining),
            _ => false,
        }
    }

    pub fn advance(&mut self, piece: &Piece) {
        if let Piece::Bytes(b) = piece {
            for &x in b {
                self.machine.feed(x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_ok(s: &str) -> bool {
        let mut m = ValueMachine::new(Dialect::Json);
        s.bytes().all(|b| m.feed(b)) && m.is_done()
    }

    #[test]
    fn json_machine_accepts_objects_and_rejects_the_rest() {
        for ok in [r#"{}"#, r#"{"a":1}"#, r#"{"a": [1, -2.5e+3, true, null, "x\"\u00e6"], "b": {"c": {}}}"#, r#"{"ø":"å"}"#, "{\n  \"a\": 0\n}"] {
            assert!(json_ok(ok), "{ok}");
            assert!(serde_json::from_str::<Value>(ok).is_ok());
        }
        for bad in [r#"[]"#, r#"{"a"}"#, r#"{"a":01}"#, r#"{"a":1,}"#, r#"{a:1}"#, r#"{"a":tru}"#, r#"{"a":"\x"}"#, " {}", "{}x", "{\"a\":1}   "] {
            assert!(!json_ok(bad), "{bad}");
        }
    }

    /// From any prefix of a valid object, `closing` completes it into JSON that parses.
    #[test]
    fn closing_completes_every_prefix() {
        let docs = [r#"{"key": [1, {"x": -0.5e-2}, "str\\n\u00e6"], "t": true, "n": null}"#, r#"{"a":{"b":[[],[{}]]}}"#];
        for doc in docs {
            for cut in 0..=doc.len() {
                if !doc.is_char_boundary(cut) {
                    continue;
                }
                let mut m = ValueMachine::new(Dialect::Json);
                assert!(doc[..cut].bytes().all(|b| m.feed(b)));
                let mut text = doc[..cut].as_bytes().to_vec();
                text.extend(m.closing());
                let s = String::from_utf8(text).unwrap();
                assert!(serde_json::from_str::<Value>(&s).is_ok(), "{cut}: {s}");
            }
        }
    }

    /// Found by the `tool_call_parser` fuzz target: a lone byte >= 0x80 inside a string was
    /// accepted, so accepted text + closing was not valid UTF-8 (and not parseable JSON).
    #[test]
    fn strings_stay_valid_utf8() {
        let mut m = ValueMachine::new(Dialect::Json);
        assert!(br#"{"a"#.iter().all(|&b| m.feed(b)));
        assert!(m.accepts(&[0xa3]).is_none(), "a continuation byte cannot start a character");
        assert!(m.accepts(&[0xc3, 0xa6]).is_some(), "æ");
        assert!(m.accepts(&[0xe0, 0x80]).is_none(), "overlong");
        assert!(m.accepts(&[0xed, 0xa0]).is_none(), "surrogate");
        for lead in [0xc3u8, 0xe0, 0xed, 0xf0, 0xf4] {
            let m2 = m.accepts(&[lead]).unwrap();
            let mut text = br#"{"a"#.to_vec();
            text.push(lead);
            text.extend(m2.closing());
            assert!(serde_json::from_slice::<Value>(&text).is_ok(), "{text:?}");
        }
        let mut m = ValueMachine::new(Dialect::Json);
        assert!(br#"{"a":-2.5e31"#.iter().all(|&b| m.feed(b)));
        assert!(!m.feed(b'6'), "a third exponent digit could overflow f64 (found by fuzzing: -2.5e316)");
        let mut m = ValueMachine::new(Dialect::Json);
        assert!(br#"{"a":"#.iter().all(|&b| m.feed(b)));
        assert!(std::iter::repeat_n(b'5', MAX_NUMBER as usize - 1).all(|b| m.feed(b)) && m.feed(b'.'));
        assert!(!m.clone().feed(b'.') && m.closing() == b"0}", "a number at the length cap still closes (found by fuzzing)");
        let mut m = ValueMachine::new(Dialect::Json);
        assert!(br#"{"a":"#.iter().all(|&b| m.feed(b)));
        assert!((1..MAX_DEPTH).all(|_| m.feed(b'[')) && !m.feed(b'['), "nesting is capped (found by fuzzing: serde_json's recursion limit)");
        // \u escapes: surrogates only in high+low pairs (found by fuzzing: `{"a\uDa00e`).
        let after = |text: &[u8]| {
            let mut m = ValueMachine::new(Dialect::Json);
            text.iter().all(|&b| m.feed(b)).then_some(m)
        };
        assert!(after(br#"{"a\uDa00e"#).is_none(), "a high surrogate must be followed by \\u");
        assert!(after(br#"{"a\udc00"#).is_none(), "a lone low surrogate");
        assert!(after(br#"{"a\ud83d\ud83d"#).is_none(), "a high surrogate followed by another high one");
        assert!(after(br#"{"a":"\ud83d\ude00\u00e6\uD7FF\uE000"}"#).is_some());
        for prefix in [&br#"{"a\uD"#[..], br#"{"a\ud8"#, br#"{"a\ud83d"#, br#"{"a\ud83d\"#, br#"{"a\ud83d\u"#, br#"{"a\ud83d\ud"#] {
            let m = after(prefix).unwrap();
            let text = [prefix, &m.closing()[..]].concat();
            assert!(serde_json::from_slice::<Value>(&text).is_ok(), "{}", String::from_utf8_lossy(&text));
        }
        let crash = b"{\"ah,saudhys::,ta45[$1-.,e36= -.,e3&= [4,  2[t\xa3{}}";
        let mut m = ValueMachine::new(Dialect::Json);
        let mut accepted = vec![];
        for &b in crash.iter() {
            match m.accepts(&[b]) {
                Some(n) => {
                    m = n;
                    accepted.push(b);
                }
                None => break,
            }
        }
        accepted.extend(m.closing());
        assert!(serde_json::from_slice::<Value>(&accepted).is_ok());
    }

    #[test]
    fn gemma_args_parse_into_json() {
        let src = b"{city:\x01K\xc3\xb8benhavn, DK\x01,days:3,opts:{metric:true,tags:[\x01a\x01,\x01b\x01]},x:null}";
        let mut m = ValueMachine::new(Dialect::GemmaArgs);
        assert!(src.iter().all(|&b| m.feed(b)) && m.is_done());
        let v = gemma_args_to_json(src).unwrap();
        assert_eq!(v, serde_json::json!({"city": "København, DK", "days": 3, "opts": {"metric": true, "tags": ["a", "b"]}, "x": null}));
        let mut m = ValueMachine::new(Dialect::GemmaArgs);
        assert!(b"{a:".iter().all(|&b| m.feed(b)));
        assert!(!m.feed(b'"'), "a JSON quote is not a Gemma string delimiter");
    }

    #[test]
    fn tool_machine_forces_a_named_call_within_budget() {
        let ids = ToolTokens { call_open: 48, call_close: 49, response_open: 50, quote: 52 };
        let b = |s: &str| Piece::Bytes(s.as_bytes().to_vec());
        let mut t = ToolMachine::new(ids, vec!["get_weather".into(), "add".into()], ToolChoice::Named("add".into()), true);
        assert!(!t.allows(7, &b("hi"), false, 100), "required call: text is not allowed first");
        assert!(t.allows(48, &Piece::Special, false, 100));
        assert_eq!(t.advance(48, &Piece::Special), ToolEvent::Markup);
        assert!(!t.allows(9, &b("call:get"), false, 100), "only the named tool");
        assert!(t.allows(9, &b("call:ad"), false, 100));
        t.advance(9, &b("call:ad"));
        assert_eq!(t.advance(10, &b("d{a")), ToolEvent::Name("add".into()));
        // budget: this token, then `0}` and `<tool_call|>` = 4 tokens
        assert!(!t.allows(11, &b(":"), false, 3));
        assert!(t.allows(11, &b(":"), false, 4));
        for p in [":", "1", ",b:"] {
            t.advance(11, &b(p));
        }
        t.advance(52, &Piece::Special);
        t.advance(12, &b("x y"));
        t.advance(52, &Piece::Special);
        assert!(!t.allows(49, &Piece::Special, false, 10), "the object is still open");
        t.advance(13, &b("}"));
        assert!(t.allows(49, &Piece::Special, false, 10) && !t.allows(13, &b("x"), false, 10));
        assert_eq!(t.advance(49, &Piece::Special), ToolEvent::Call { name: "add".into(), arguments: serde_json::json!({"a": 1, "b": "x y"}) });
        assert!(t.allows(50, &Piece::Special, false, 10) && t.allows(1, &Piece::Special, true, 10) && !t.allows(13, &b("x"), false, 10));
    }

    #[test]
    fn json_machine_respects_the_budget() {
        let mut j = JsonMachine::default();
        let b = |s: &str| Piece::Bytes(s.as_bytes().to_vec());
        assert!(!j.allows(&b("x"), 10));
        assert!(j.allows(&b("{"), 2) && !j.allows(&b("{"), 1));
        j.advance(&b("{\"k"));
        // closing is `":0}` (4 bytes): a token must leave room for it
        assert!(j.allows(&b("ey"), 5) && !j.allows(&b("ey"), 4));
        assert!(!j.allows(&Piece::Special, 10));
    }
}
