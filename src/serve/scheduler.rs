//! The engine thread: owns the model, admits queued requests into free streams (one prefill
//! between decode steps, so running streams are never starved), decodes every active sequence
//! in one batched step, and sends each piece of text back as soon as it is final.

use crate::engine::{Cancel, Engine, EngineError, Rows, StreamId, TokenId};
use crate::generate::constrain::{Compiled, ToolTokens};
use crate::generate::sampler::SamplingParams;
use crate::generate::sequence::{Output, Sequence, SequenceParams};
pub use crate::generate::sequence::TokenLogprob;
use crate::generate::Finish;
use crate::text::Tokenizer;
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

/// One choice of a request, in its stream.
struct Seq {
    job: Arc<Job>,
    choice: usize,
    stream: StreamId,
    seq: Sequence,
    logits: Vec<f32>,
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
            tracing::warn!("could not move stream {} to {}: {e}", top.stream.0, hole.0);
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
    let free: Vec<StreamId> = (0..engine.n_stream()).map(StreamId).filter(|&s| engine.stream_len(s).is_none()).take(job.n).collect();
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
    let prefilled = crate::generate::constrain::masks_beside(pending, || engine.prefill_cancellable(free[0], TokenId::slice(&job.prompt), Some(&ones), Rows::Last, Some(&cancel)));
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
        let mut sampling = job.sampling.clone();
        sampling.seed = sampling.seed.map(|s| s.wrapping_add(choice as u64));
        let params = SequenceParams { sampling, stops: job.stops.clone(), ignore_eos: job.ignore_eos, max_tokens: job.max_tokens, logprobs: job.logprobs };
        let tools = job.grammar.as_ref().and_then(|g| g.tools);
        active.push(Seq { job: job.clone(), choice, stream, seq: Sequence::new(params, constraint.clone(), tools), logits: logits.clone(), next: 0 });
    }
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
            Some(t) => seq.next = t,
            None => finished.push(i),
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
    let pairs: Vec<(StreamId, TokenId)> = active.iter().map(|seq| (seq.stream, TokenId(seq.next))).collect();
    let t0 = Instant::now();
    let constraints = active.iter_mut().filter_map(|s| s.seq.pending_mask()).collect();
    let decoded = crate::generate::constrain::masks_beside(constraints, || engine.decode(&pairs));
    Stats::add_time(&stats.decode_us, t0);
    stats.decode_steps.fetch_add(1, Ordering::Relaxed);
    stats.decode_rows.fetch_add(pairs.len(), Ordering::Relaxed);
    let padding = pairs.iter().map(|p| p.0 .0 + 1).max().unwrap_or(0) - pairs.len();
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

/// Advances one choice by a token and sends what became final; the token to decode next, or
/// None once it ended (its final events sent).
fn advance(s: &mut Seq, tok: &Tokenizer, stats: &Stats) -> Option<u32> {
    let before = s.seq.tokens().len();
    let mut out = vec![];
    let next = s.seq.advance(tok, &mut s.logits, &mut out);
    stats.generated_tokens.fetch_add(s.seq.tokens().len() - before, Ordering::Relaxed);
    for o in out {
        let ev = match o {
            Output::Text { text, logprobs } => Event::Piece { choice: s.choice, text, tokens: logprobs },
            Output::CallName { index, name } => Event::ToolName { choice: s.choice, index, id: format!("call_{}_{}_{index}", s.job.id, s.choice), name },
            Output::CallArgs { index, arguments } => Event::ToolArgs { choice: s.choice, index, arguments },
        };
        let _ = s.job.events.send(ev);
    }
    match next {
        Ok(Some(t)) => Some(t),
        Ok(None) => {
            let finish = s.seq.finish().expect("an ended sequence says why");
            let _ = s.job.events.send(Event::Done { choice: s.choice, finish, completion_tokens: s.seq.tokens().len() });
            None
        }
        Err(e) => {
            let _ = s.job.events.send(Event::Error(e));
            None
        }
    }
}
