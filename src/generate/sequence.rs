//! One sequence from its first token to its finish: sampling (under its constraint's mask when
//! it has one), end-of-turn tokens, stop strings held back across token boundaries, the token
//! budget, tool calls split from text, and the text that became final at each step. Both the
//! CLI's loop (`generate`) and the server's scheduler drive sequences through this type.

use super::constrain::{CallEvent, CallTracker, Constraint, ToolTokens};
use super::sampler::{Choice, Sampler, SamplingParams};
use super::Finish;
use crate::text::{StreamDecoder, Tokenizer};

/// A token's log-probability under the distribution it was sampled from (bias and penalties
/// applied, at temperature 1, as OpenAI reports them), and the `top` alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// What a step of a sequence made final, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Text (never part of a stop string, never half a character), with the logprobs of the
    /// tokens it came from (when asked for).
    Text { text: String, logprobs: Vec<TokenLogprob> },
    /// A tool call began: its index in the reply and its function's name.
    CallName { index: usize, name: String },
    /// A tool call ended: its index and its arguments as JSON text.
    CallArgs { index: usize, arguments: String },
}

/// How a sequence generates.
#[derive(Debug, Clone)]
pub struct SequenceParams {
    pub sampling: SamplingParams,
    /// Never emitted; the sequence ends where one appears.
    pub stops: Vec<String>,
    /// Keep going past end-of-turn tokens.
    pub ignore_eos: bool,
    pub max_tokens: usize,
    /// Report each token's logprob and this many alternatives (None: no logprobs).
    pub logprobs: Option<usize>,
}

/// A sequence's generation state.
#[derive(Debug)]
pub struct Sequence {
    sampler: Sampler,
    decoder: StreamDecoder,
    params: SequenceParams,
    tokens: Vec<u32>,
    /// Logprobs of tokens whose text the decoder still holds back.
    pending: Vec<TokenLogprob>,
    constraint: Option<Constraint>,
    tracker: Option<CallTracker>,
    finish: Option<Finish>,
}

/// Refusing a sampled token near the end of the budget (it would leave no completion that
/// fits) redraws at most this many times.
const REDRAWS: usize = 8;

impl Sequence {
    /// A sequence, constrained by `constraint` (its first mask computed) when given; `tools`
    /// says the constraint is a tool reply's, whose calls are split from its text.
    pub fn new(params: SequenceParams, constraint: Option<Constraint>, tools: Option<ToolTokens>) -> Self {
        Sequence {
            sampler: Sampler::new(params.sampling.clone()),
            decoder: StreamDecoder::new(),
            params,
            tokens: vec![],
            pending: vec![],
            constraint,
            tracker: tools.map(CallTracker::new),
            finish: None,
        }
    }

    /// The tokens generated so far (not counting an end-of-turn token that ended it).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Why the sequence ended, once it has.
    pub fn finish(&self) -> Option<Finish> {
        self.finish
    }

    /// The constraint, when its next mask is still to be computed, and the tokens of budget
    /// left (for `constrain::masks_beside`).
    pub fn pending_mask(&mut self) -> Option<(&mut Constraint, usize)> {
        let left = self.left();
        self.constraint.as_mut().filter(|c| c.mask_pending()).map(|c| (c, left))
    }

    fn left(&self) -> usize {
        self.params.max_tokens.saturating_sub(self.tokens.len())
    }

    /// Samples the next token from `logits` (bias, penalties and the constraint's mask applied
    /// in place), pushes what became final onto `out`, and returns the token to decode next;
    /// None once the sequence has ended (`finish` says why). An error ends it too.
    pub fn advance(&mut self, tok: &Tokenizer, logits: &mut [f32], out: &mut Vec<Output>) -> Result<Option<u32>, String> {
        if self.finish.is_some() {
            return Ok(None);
        }
        let on_eos = if self.tracker.as_ref().is_some_and(|t| t.calls > 0) { Finish::ToolCalls } else { Finish::Stop };
        let Some(c) = self.sample(tok, logits)? else { return Ok(self.end(tok, on_eos, out)) };
        if !self.params.ignore_eos && tok.is_eos(c.token) {
            return Ok(self.end(tok, on_eos, out));
        }
        self.sampler.accept(c.token);
        self.tokens.push(c.token);
        let mut done = None;
        if let Some(con) = &mut self.constraint {
            con.consume(c.token).map_err(|e| format!("constrained decoding: {e}"))?;
            // A reply the grammar could end here may be complete: look now rather than after
            // another forward (tool replies end through their tracker instead).
            if self.tracker.is_none() && con.accepting() {
                con.compute_mask(self.params.max_tokens - self.tokens.len());
                if con.finished() {
                    done = Some(Finish::Stop);
                }
            }
        }
        let text_token = match &mut self.tracker {
            None => true,
            Some(t) => {
                let was_text = !t.in_call();
                let ev = t.advance(c.token, &tok.token_bytes(c.token));
                if was_text && ev != CallEvent::Text {
                    // text held back for stop strings is final once a call starts
                    let rest = self.decoder.flush(tok, &self.params.stops).map_err(|e| e.to_string())?;
                    push_text(out, rest, std::mem::take(&mut self.pending));
                }
                let index = t.calls.saturating_sub(1);
                match &ev {
                    CallEvent::Name(name) => out.push(Output::CallName { index: t.calls, name: name.clone() }),
                    CallEvent::Call { arguments, .. } => out.push(Output::CallArgs { index, arguments: arguments.to_string() }),
                    CallEvent::End => done = Some(Finish::ToolCalls),
                    CallEvent::Text | CallEvent::Markup => {}
                }
                ev == CallEvent::Text
            }
        };
        let out_of_budget = self.tokens.len() >= self.params.max_tokens;
        if !text_token {
            if let Some(f) = done {
                return Ok(self.end(tok, f, out));
            }
            if out_of_budget {
                let complete_calls = self.tracker.as_ref().is_some_and(CallTracker::after_call);
                return Ok(self.end(tok, if complete_calls { Finish::ToolCalls } else { Finish::Length }, out));
            }
            return Ok(Some(c.token));
        }
        if let Some(k) = self.params.logprobs {
            let lse = super::sampler::logsumexp(logits);
            let top = if k > 0 { super::sampler::top_k(logits, k).into_iter().map(|(id, l)| (id, l - lse)).collect() } else { vec![] };
            self.pending.push(TokenLogprob { token: c.token, logprob: logits[c.token as usize] - lse, top });
        }
        self.decoder.push(tok, c.token).map_err(|e| e.to_string())?;
        let (piece, hit) = self.decoder.next_piece(&self.params.stops);
        if !piece.is_empty() || hit.is_some() {
            out.push(Output::Text { text: piece, logprobs: std::mem::take(&mut self.pending) });
        }
        if hit.is_some() {
            self.finish = Some(Finish::Stop);
            return Ok(None);
        }
        if let Some(f) = done {
            return Ok(self.end(tok, f, out));
        }
        if out_of_budget {
            return Ok(self.end(tok, Finish::Length, out));
        }
        Ok(Some(c.token))
    }

    /// The next token: sampled freely, or under the constraint's mask; near the end of the
    /// budget a sampled token must leave a completion that fits (else it is refused and
    /// another drawn, a few times; then the closing path's first token, or, no path fitting
    /// at all, the first draw after all). None: only the end of the turn is allowed and
    /// `ignore_eos` refuses it, or the grammar is complete.
    fn sample(&mut self, tok: &Tokenizer, logits: &mut [f32]) -> Result<Option<Choice>, String> {
        let left = self.left();
        let Some(con) = &mut self.constraint else { return Ok(Some(self.sampler.sample(logits))) };
        if con.finished() {
            return Ok(None);
        }
        con.mask().map_err(|e| format!("constrained decoding: {e}"))?;
        let ignore_eos = self.params.ignore_eos;
        let forced = con.forced(left);
        let con = &*con;
        let allowed = |t: u32| forced.map_or(con.allows(t) && !(ignore_eos && tok.is_eos(t)), |f| t == f);
        let first = self.sampler.sample_allowed(logits, allowed);
        let mut choice = first;
        let mut tries = 0;
        while let Some(c) = choice.filter(|c| forced.is_none() && con.near_end(left) && !tok.is_eos(c.token) && !con.fits_after(c.token, left - 1)) {
            let refused = logits[c.token as usize];
            logits[c.token as usize] = f32::NEG_INFINITY;
            tries += 1;
            choice = if tries < REDRAWS { self.sampler.draw_allowed(logits, allowed).filter(|d| logits[d.token as usize].is_finite()) } else { None };
            if choice.is_none() {
                logits[c.token as usize] = refused;
            }
        }
        let fallback = || con.closing_first().filter(|&t| con.allows(t)).map(|token| Choice { token, logprob: 0.0 }).or(first);
        Ok(choice.or_else(|| if tries > 0 { fallback() } else { None }))
    }

    /// Ends the sequence: the text held back becomes final.
    fn end(&mut self, tok: &Tokenizer, finish: Finish, out: &mut Vec<Output>) -> Option<u32> {
        let rest = self.decoder.flush(tok, &self.params.stops).unwrap_or_default();
        push_text(out, rest, std::mem::take(&mut self.pending));
        self.finish = Some(finish);
        None
    }
}

fn push_text(out: &mut Vec<Output>, text: String, logprobs: Vec<TokenLogprob>) {
    if !text.is_empty() || !logprobs.is_empty() {
        out.push(Output::Text { text, logprobs });
    }
}
