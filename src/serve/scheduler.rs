//! The engine thread: owns the model, admits queued requests into free streams (one prefill
//! between decode steps, so running streams are never starved), decodes every active sequence
//! in one batched step, and sends each piece of text back as soon as it is final.

use crate::generate::constrain::{CallEvent, CallTracker, Compiled, Constraint, ToolTokens};
use crate::engine::{Cancel, Engine, EngineError, Rows};
use crate::generate::Finish;
use crate::generate::sampler::{Sampler, SamplingParams};
use crate::text::{StreamDecoder, Tokenizer};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// A request as the engine sees it: token ids, and `n` choices that share one prefill.
#[derive(Debug)]
pub struct Job {
    pub id: String,
    pub prompt: Vec<u32>,
    pub n: usize,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stops: Vec<String>,
    /// Top alternatives to report per token (OpenAI top_logprobs); None = no logprobs.
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    pub grammar: Option<Grammar>,
    pub events: UnboundedSender<Event>,
    pub enqueued: Instant,
}

/// Constrained decoding a request asks for: its compiled grammar, and for tool replies the
/// call syntax's tokens (a tracker then splits text from calls).
pub struct Grammar {
    pub compiled: Compiled,
    pub tools: Option<ToolTokens>,
    /// A lower bound on the reply's tokens, and what sets it (`Spec::min_tokens`).
    pub min_tokens: Option<(usize, &'static str)>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("tools", &self.tools).finish_non_exhaustive()
    }
}

/// What the engine sends back for a request.
#[derive(Debug, Clone)]
pub enum Event {
    /// The prompt was prefilled (time to first token starts counting at enqueue).
    Started,
    Piece { choice: usize, text: String, tokens: Vec<TokenLogprob> },
    /// A tool call began: its index within the choice, id and function name.
    ToolName { choice: usize, index: usize, id: String, name: String },
    /// A tool call ended: its arguments as a JSON string.
    ToolArgs { choice: usize, index: usize, arguments: String },
    Done { choice: usize, finish: Finish, completion_tokens: usize },
    Error(String),
}

#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Live counters the HTTP side reads for /metrics and /health.
#[derive(Debug, Default)]
pub struct Stats {
    pub busy_slots: AtomicUsize,
    pub queued: AtomicUsize,
    pub prompt_tokens: AtomicUsize,
    pub generated_tokens: AtomicUsize,
    pub ready: AtomicBool,
    /// Requests routed to this replica.
    pub routed: AtomicUsize,
    /// Where the engine thread's time goes: microseconds in prefill forwards (cancelled ones
    /// included) and in decode steps, the decode steps, and the sequences those steps carried
    /// (rows / steps is the mean batch).
    pub prefill_us: AtomicU64,
    pub decode_us: AtomicU64,
    pub decode_steps: AtomicUsize,
    pub decode_rows: AtomicUsize,
    /// Rows a decode step computed for free streams below its highest (their logits dropped).
    pub decode_padding_rows: AtomicUsize,
}

impl Stats {
    fn add_time(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
    }
}

struct Seq {
    job: Arc<Job>,
    choice: usize,
    stream: usize,
    sampler: Sampler,
    decoder: StreamDecoder,
    logits: Vec<f32>,
    generated: usize,
    /// Logprobs of tokens whose text the decoder still holds back.
    pending: Vec<TokenLogprob>,
    constraint: Option<Constraint>,
    tracker: Option<CallTracker>,
    /// The token sampled last, fed at the next decode step.
    next: u32,
}

/// Runs until `jobs` disconnects (shutdown) and every active sequence has finished or been
/// cancelled.
pub fn run(mut engine: Engine, tok: Arc<Tokenizer>, jobs: Receiver<Job>, stats: Arc<Stats>) {
    let mut active: Vec<Seq> = vec![];
    let mut closed = false;
    // The head of the queue, taken from the channel but not yet admitted: a request with n
    // choices waits here until n streams are free (first come, first served).
    let mut head: Option<Job> = None;
    let mut padded = false; // the last decode step computed padding rows
    stats.ready.store(true, Ordering::SeqCst);
    loop {
        let free = engine.n_stream() - active.len();
        if head.is_none() && !closed && free > 0 {
            head = if active.is_empty() {
                match jobs.recv_timeout(Duration::from_millis(200)) {
                    Ok(j) => Some(j),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        closed = true;
                        None
                    }
                }
            } else {
                jobs.try_recv().ok()
            };
        }
        // Admit at most one request per decode step, once all its choices fit (or it cannot
        // ever fit, or its client left: admit answers those).
        if let Some(job) = head.take() {
            if job.n <= free || active.is_empty() || job.events.is_closed() {
                // Its slots count as busy from the start of its prefill.
                stats.busy_slots.store(active.len() + job.n, Ordering::SeqCst);
                stats.queued.fetch_sub(1, Ordering::SeqCst);
                admit(&mut engine, job, &mut active, &stats);
                stats.busy_slots.store(active.len(), Ordering::SeqCst);
            } else {
                head = Some(job);
            }
        }
        if active.is_empty() {
            if closed && head.is_none() {
                return;
            }
            continue;
        }
        // A free stream below a live one that outlived a step with nothing waiting (no admit
        // took it): move the live ones down rather than pay a padding row every step. Under
        // back-to-back requests an admit refills it before the next step, and nothing is copied.
        let pack = padded && head.is_none() && jobs.is_empty();
        padded = step(&mut engine, &tok, &mut active, &stats, pack) > 0;
        stats.busy_slots.store(active.len(), Ordering::SeqCst);
    }
}

/// Moves the sequence in the highest stream into the lowest free one while that is below it.
/// A decode step computes a row for every stream up to the highest it names, so a free stream
/// below a live one costs a padding row every step; a move costs one copy of the moved
/// sequence's cells.
fn compact(engine: &mut Engine, active: &mut [Seq]) {
    while let (Some(hole), Some(top)) = (engine.free_stream(), active.iter_mut().max_by_key(|s| s.stream)) {
        if top.stream < hole {
            return;
        }
        if let Err(e) = engine.move_stream(top.stream, hole) {
            tracing::warn!("could not move stream {} to {hole}: {e}", top.stream);
            return;
        }
        top.stream = hole;
    }
}

fn admit(engine: &mut Engine, job: Job, active: &mut Vec<Seq>, stats: &Stats) {
    let job = Arc::new(job);
    if job.events.is_closed() {
        return; // the client left while queued
    }
    let free: Vec<usize> = (0..engine.n_stream()).filter(|s| engine.stream_len(*s).is_none()).take(job.n).collect();
    if free.len() < job.n {
        let _ = job.events.send(Event::Error(format!("n = {} exceeds the server's {} slots", job.n, engine.n_stream())));
        return;
    }
    let ones = vec![1; job.prompt.len()];
    // A client that leaves mid-prefill stops the prefill within one graph node (CPU).
    let client_left = || job.events.is_closed();
    let cancel = Cancel(&client_left);
    let t0 = Instant::now();
    // The first mask is computed while the prompt is prefilled.
    let mut constraint = job.grammar.as_ref().map(|g| g.compiled.constraint());
    let pending = constraint.iter_mut().map(|c| (c, job.max_tokens)).collect();
    let prefilled = crate::generate::constrain::masks_beside(pending, || engine.prefill_cancellable(free[0], &job.prompt, Some(&ones), Rows::Last, Some(&cancel)));
    Stats::add_time(&stats.prefill_us, t0);
    let logits = match prefilled {
        Ok(mut l) => l.pop().expect("one row"),
        Err(EngineError::Cancelled) => return, // its stream stays free
        Err(e) => {
            let _ = job.events.send(Event::Error(e.to_string()));
            return;
        }
    };
    for &s in &free[1..] {
        if let Err(e) = engine.fork(free[0], s) {
            let _ = job.events.send(Event::Error(e.to_string()));
            for &t in &free {
                engine.release(t);
            }
            return;
        }
    }
    stats.prompt_tokens.fetch_add(job.prompt.len(), Ordering::Relaxed);
    let _ = job.events.send(Event::Started);
    for (choice, &stream) in free.iter().enumerate() {
        // Choices differ but stay reproducible: choice i samples with seed + i.
        let mut params = job.sampling.clone();
        params.seed = params.seed.map(|s| s.wrapping_add(choice as u64));
        active.push(Seq {
            job: job.clone(),
            choice,
            stream,
            sampler: Sampler::new(params),
            decoder: StreamDecoder::new(),
            logits: logits.clone(),
            generated: 0,
            pending: vec![],
            constraint: constraint.clone(),
            tracker: job.grammar.as_ref().and_then(|g| g.tools).map(CallTracker::new),
            next: 0,
        });
    }
}

/// What sampling one sequence's next token led to.
enum Next {
    /// Decode this token at the next step.
    Token(u32),
    /// The sequence ended (its final events are sent).
    Finished,
}

/// Samples every active sequence, finishes those that ended, decodes the rest in one step
/// (with `pack`, first moved into the lowest streams) while the next masks of constrained
/// sequences are computed beside it. Returns the padding rows it computed.
fn step(engine: &mut Engine, tok: &Tokenizer, active: &mut Vec<Seq>, stats: &Stats, pack: bool) -> usize {
    let mut finished = vec![];
    for (i, seq) in active.iter_mut().enumerate() {
        if seq.job.events.is_closed() {
            finished.push(i); // client disconnected: free the slot now
            continue;
        }
        match advance(seq, tok, stats) {
            Next::Token(t) => seq.next = t,
            Next::Finished => finished.push(i),
        }
    }
    for i in finished.into_iter().rev() {
        let seq = active.swap_remove(i);
        engine.release(seq.stream);
    }
    if pack {
        compact(engine, active);
    }
    if active.is_empty() {
        return 0;
    }
    let pairs: Vec<(usize, u32)> = active.iter().map(|seq| (seq.stream, seq.next)).collect();
    let t0 = Instant::now();
    let constraints = active.iter_mut().filter_map(|seq| Some((seq.constraint.as_mut()?, seq.job.max_tokens - seq.generated))).collect();
    let decoded = crate::generate::constrain::masks_beside(constraints, || engine.decode(&pairs));
    Stats::add_time(&stats.decode_us, t0);
    stats.decode_steps.fetch_add(1, Ordering::Relaxed);
    stats.decode_rows.fetch_add(pairs.len(), Ordering::Relaxed);
    let padding = pairs.iter().map(|p| p.0 + 1).max().unwrap_or(0) - pairs.len();
    stats.decode_padding_rows.fetch_add(padding, Ordering::Relaxed);
    match decoded {
        Ok(rows) => {
            for (seq, row) in active.iter_mut().zip(rows) {
                seq.logits = row;
            }
        }
        Err(e) => {
            for seq in active.drain(..) {
                let _ = seq.job.events.send(Event::Error(e.to_string()));
                engine.release(seq.stream);
            }
        }
    }
    padding
}

/// Samples one sequence's next token from its logits (under its constraint's mask), sends
/// the text that became final, and says whether the sequence goes on.
fn advance(seq: &mut Seq, tok: &Tokenizer, stats: &Stats) -> Next {
    let finish_on_eos = if seq.tracker.as_ref().is_some_and(|t| t.calls > 0) { Finish::ToolCalls } else { Finish::Stop };
    // sample() applies bias and penalties to the logits in place; logprobs report that
    // adjusted distribution at temperature 1, as OpenAI's do.
    let c = match &mut seq.constraint {
        None => seq.sampler.sample(&mut seq.logits),
        Some(con) if con.finished() => {
            flush(seq, tok, finish_on_eos);
            return Next::Finished;
        }
        Some(con) => {
            if let Err(e) = con.mask() {
                let _ = seq.job.events.send(Event::Error(format!("constrained decoding: {e}")));
                return Next::Finished;
            }
            let ignore_eos = seq.job.ignore_eos;
            let left = seq.job.max_tokens - seq.generated;
            let forced = con.forced(left);
            let con = &*con;
            let allowed = |t: u32| forced.map_or(con.allows(t) && !(ignore_eos && tok.is_eos(t)), |f| t == f);
            let first = seq.sampler.sample_allowed(&mut seq.logits, allowed);
            // Near the end of the budget a sampled token must leave a completion that fits:
            // else it is refused and another drawn, a few times; then the closing path's first
            // token, or (no path fits at all) the first draw after all.
            let mut choice = first;
            let mut tries = 0;
            while let Some(c) = choice.filter(|c| forced.is_none() && con.near_end(left) && !tok.is_eos(c.token) && !con.fits_after(c.token, left - 1)) {
                let refused = seq.logits[c.token as usize];
                seq.logits[c.token as usize] = f32::NEG_INFINITY;
                tries += 1;
                choice = if tries < 8 { seq.sampler.draw_allowed(&mut seq.logits, allowed).filter(|d| seq.logits[d.token as usize].is_finite()) } else { None };
                if choice.is_none() {
                    seq.logits[c.token as usize] = refused;
                }
            }
            let fallback = || con.closing_first().filter(|&t| con.allows(t)).map(|token| crate::generate::sampler::Choice { token, logprob: 0.0 }).or(first);
            match choice.or_else(|| if tries > 0 { fallback() } else { None }) {
                Some(c) => c,
                // Only the end of the turn is allowed, and ignore_eos refuses it: the reply is complete.
                None => {
                    flush(seq, tok, finish_on_eos);
                    return Next::Finished;
                }
            }
        }
    };
    if !seq.job.ignore_eos && tok.is_eos(c.token) {
        flush(seq, tok, finish_on_eos);
        return Next::Finished;
    }
    seq.sampler.accept(c.token);
    seq.generated += 1;
    stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
    let mut grammar_done = None;
    if let Some(con) = &mut seq.constraint {
        if let Err(e) = con.consume(c.token) {
            let _ = seq.job.events.send(Event::Error(format!("constrained decoding: {e}")));
            return Next::Finished;
        }
        // A reply the grammar could end here may be complete: look now rather than after
        // another forward (tool replies end through their tracker instead).
        if seq.tracker.is_none() && con.accepting() {
            con.compute_mask(seq.job.max_tokens - seq.generated);
            if con.finished() {
                grammar_done = Some(Finish::Stop);
            }
        }
    }
    let text_token = match &mut seq.tracker {
        None => true,
        Some(t) => {
            let was_text = !t.in_call();
            let ev = t.advance(c.token, &tok.token_bytes(c.token));
            if was_text && ev != CallEvent::Text {
                // text held back for stop strings is final once a call starts
                let rest = seq.decoder.flush(tok, &seq.job.stops).unwrap_or_default();
                let tokens = std::mem::take(&mut seq.pending);
                if !rest.is_empty() || !tokens.is_empty() {
                    let _ = seq.job.events.send(Event::Piece { choice: seq.choice, text: rest, tokens });
                }
            }
            let index = t.calls.saturating_sub(1);
            match &ev {
                CallEvent::Name(name) => {
                    let id = format!("call_{}_{}_{}", seq.job.id, seq.choice, t.calls);
                    let _ = seq.job.events.send(Event::ToolName { choice: seq.choice, index: t.calls, id, name: name.clone() });
                }
                CallEvent::Call { arguments, .. } => {
                    let _ = seq.job.events.send(Event::ToolArgs { choice: seq.choice, index, arguments: arguments.to_string() });
                }
                CallEvent::End => grammar_done = Some(Finish::ToolCalls),
                CallEvent::Text | CallEvent::Markup => {}
            }
            ev == CallEvent::Text
        }
    };
    let out_of_budget = seq.generated >= seq.job.max_tokens;
    if !text_token {
        if let Some(f) = grammar_done {
            flush(seq, tok, f);
            return Next::Finished;
        }
        if out_of_budget {
            let complete_calls = seq.tracker.as_ref().is_some_and(CallTracker::after_call);
            flush(seq, tok, if complete_calls { Finish::ToolCalls } else { Finish::Length });
            return Next::Finished;
        }
        return Next::Token(c.token);
    }
    if let Some(k) = seq.job.logprobs {
        let lse = crate::generate::sampler::logsumexp(&seq.logits);
        let top = if k > 0 { crate::tools::parity::top_k(&seq.logits, k).into_iter().map(|(id, l)| (id, l - lse)).collect() } else { vec![] };
        seq.pending.push(TokenLogprob { token: c.token, logprob: seq.logits[c.token as usize] - lse, top });
    }
    let stop_hit = match seq.decoder.push(tok, c.token) {
        Ok(_) => {
            let (piece, hit) = seq.decoder.next_piece(&seq.job.stops);
            if !piece.is_empty() || hit.is_some() {
                let tokens = std::mem::take(&mut seq.pending);
                let _ = seq.job.events.send(Event::Piece { choice: seq.choice, text: piece, tokens });
            }
            hit.is_some()
        }
        Err(e) => {
            let _ = seq.job.events.send(Event::Error(e.to_string()));
            return Next::Finished;
        }
    };
    if stop_hit {
        let _ = seq.job.events.send(Event::Done { choice: seq.choice, finish: Finish::Stop, completion_tokens: seq.generated });
        return Next::Finished;
    }
    if let Some(f) = grammar_done {
        flush(seq, tok, f);
        return Next::Finished;
    }
    if out_of_budget {
        flush(seq, tok, Finish::Length);
        return Next::Finished;
    }
    Next::Token(c.token)
}

fn flush(seq: &mut Seq, tok: &Tokenizer, finish: Finish) {
    let rest = seq.decoder.flush(tok, &seq.job.stops).unwrap_or_default();
    let tokens = std::mem::take(&mut seq.pending);
    if !rest.is_empty() || !tokens.is_empty() {
        let _ = seq.job.events.send(Event::Piece { choice: seq.choice, text: rest, tokens });
    }
    let _ = seq.job.events.send(Event::Done { choice: seq.choice, finish, completion_tokens: seq.generated });
}
