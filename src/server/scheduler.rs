//! The engine thread: owns the model, admits queued requests into free streams (one prefill
//! between decode steps, so running streams are never starved), decodes every active sequence
//! in one batched step, and sends each piece of text back as soon as it is final.

use crate::constrain::{JsonMachine, ToolChoice, ToolEvent, ToolMachine, ToolTokens};
use crate::engine::{Engine, EngineError, Rows};
use crate::ggml::compute::{Cancel, ComputeError};
use crate::generate::Finish;
use crate::sampler::{Sampler, SamplingParams};
use crate::tokenizer::{StreamDecoder, Tokenizer};
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
    pub grammar: Option<GrammarSpec>,
    pub events: UnboundedSender<Event>,
    pub enqueued: Instant,
}

/// Constrained decoding a request asks for.
#[derive(Debug, Clone)]
pub enum GrammarSpec {
    /// `response_format: json_object`: one JSON object, closed within max_tokens.
    JsonObject,
    /// Declared tools: calls the model makes are well-formed and parsed into `tool_calls`.
    Tools { ids: ToolTokens, names: Vec<String>, choice: ToolChoice, parallel: bool },
}

impl GrammarSpec {
    fn machine(&self) -> Grammar {
        match self.clone() {
            GrammarSpec::JsonObject => Grammar::Json(JsonMachine::default()),
            GrammarSpec::Tools { ids, names, choice, parallel } => Grammar::Tools(ToolMachine::new(ids, names, choice, parallel)),
        }
    }

    /// The fewest tokens a reply under this constraint can have, and what asks for it.
    pub fn min_tokens(&self) -> (usize, &'static str) {
        match self.machine() {
            Grammar::Json(j) => (j.min_tokens(), "`response_format: json_object`"),
            Grammar::Tools(m) => (m.min_tokens(), "the forced tool call (`tool_choice`)"),
        }
    }
}

#[derive(Debug, Clone)]
enum Grammar {
    Json(JsonMachine),
    Tools(ToolMachine),
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
    grammar: Option<Grammar>,
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
    let prefilled = engine.prefill_cancellable(free[0], &job.prompt, Some(&ones), Rows::Last, Some(&cancel));
    Stats::add_time(&stats.prefill_us, t0);
    let logits = match prefilled {
        Ok(mut l) => l.pop().expect("one row"),
        Err(EngineError::Compute(ComputeError::Cancelled)) => return, // its stream stays free
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
            grammar: job.grammar.as_ref().map(GrammarSpec::machine),
            next: 0,
        });
    }
}

/// Samples every active sequence, finishes those that ended, decodes the rest in one step
/// (with `pack`, first moved into the lowest streams). Returns the padding rows it computed.
fn step(engine: &mut Engine, tok: &Tokenizer, active: &mut Vec<Seq>, stats: &Stats, pack: bool) -> usize {
    let mut finished = vec![];
    for (i, seq) in active.iter_mut().enumerate() {
        if seq.job.events.is_closed() {
            finished.push(i); // client disconnected: free the slot now
            continue;
        }
        // sample() applies bias and penalties to the logits in place; logprobs report that
        // adjusted distribution at temperature 1, as OpenAI's do.
        let remaining = seq.job.max_tokens - seq.generated;
        let c = match &seq.grammar {
            None => seq.sampler.sample(&mut seq.logits),
            Some(g) => {
                let pieces = tok.pieces();
                let ignore_eos = seq.job.ignore_eos;
                let allowed = |t: u32| {
                    let piece = &pieces[t as usize];
                    match g {
                        Grammar::Json(j) => j.allows(piece, remaining),
                        Grammar::Tools(m) => m.allows(t, piece, tok.is_eos(t) && !ignore_eos, remaining),
                    }
                };
                match seq.sampler.sample_allowed(&mut seq.logits, allowed) {
                    Some(c) => c,
                    None => {
                        let _ = seq.job.events.send(Event::Error("constrained decoding: no token in the vocabulary is allowed here".into()));
                        finished.push(i);
                        continue;
                    }
                }
            }
        };
        let tool_calls = match &seq.grammar {
            Some(Grammar::Tools(m)) => m.calls,
            _ => 0,
        };
        let finish_on_eos = if tool_calls > 0 { Finish::ToolCalls } else { Finish::Stop };
        if !seq.job.ignore_eos && tok.is_eos(c.token) {
            flush(seq, tok, finish_on_eos);
            finished.push(i);
            continue;
        }
        seq.sampler.accept(c.token);
        seq.generated += 1;
        stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let mut text_token = true;
        let mut grammar_done = None;
        match &mut seq.grammar {
            None => {}
            Some(Grammar::Json(j)) => {
                j.advance(&tok.pieces()[c.token as usize]);
                if j.is_done() {
                    grammar_done = Some(Finish::Stop);
                }
            }
            Some(Grammar::Tools(m)) => {
                let was_text = !m.in_call();
                let ev = m.advance(c.token, &tok.pieces()[c.token as usize]);
                text_token = ev == ToolEvent::Text;
                if was_text && !text_token {
                    // text held back for stop strings is final once a call starts
                    let rest = seq.decoder.flush(tok, &seq.job.stops).unwrap_or_default();
                    let tokens = std::mem::take(&mut seq.pending);
                    if !rest.is_empty() || !tokens.is_empty() {
                        let _ = seq.job.events.send(Event::Piece { choice: seq.choice, text: rest, tokens });
                    }
                }
                let index = m.calls.saturating_sub(1);
                match ev {
                    ToolEvent::Name(name) => {
                        let id = format!("call_{}_{}_{}", seq.job.id, seq.choice, m.calls);
                        let _ = seq.job.events.send(Event::ToolName { choice: seq.choice, index: m.calls, id, name });
                    }
                    ToolEvent::Call { arguments, .. } => {
                        let _ = seq.job.events.send(Event::ToolArgs { choice: seq.choice, index, arguments: arguments.to_string() });
                    }
                    ToolEvent::End => grammar_done = Some(Finish::ToolCalls),
                    ToolEvent::Text | ToolEvent::Markup => {}
                }
            }
        }
        if !text_token {
            if let Some(f) = grammar_done {
                flush(seq, tok, f);
                finished.push(i);
            } else if seq.generated >= seq.job.max_tokens {
                let complete_calls = matches!(&seq.grammar, Some(Grammar::Tools(m)) if m.after_call());
                flush(seq, tok, if complete_calls { Finish::ToolCalls } else { Finish::Length });
                finished.push(i);
            } else {
                seq.next = c.token;
            }
            continue;
        }
        if let Some(k) = seq.job.logprobs {
            let lse = crate::sampler::logsumexp(&seq.logits);
            let top = if k > 0 { crate::parity::top_k(&seq.logits, k).into_iter().map(|(id, l)| (id, l - lse)).collect() } else { vec![] };
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
                true
            }
        };
        if stop_hit {
            let _ = seq.job.events.send(Event::Done { choice: seq.choice, finish: Finish::Stop, completion_tokens: seq.generated });
            finished.push(i);
        } else if let Some(f) = grammar_done {
            flush(seq, tok, f);
            finished.push(i);
        } else if seq.generated >= seq.job.max_tokens {
            flush(seq, tok, Finish::Length);
            finished.push(i);
        } else {
            seq.next = c.token;
        }
    }
    finished.sort_unstable();
    finished.dedup();
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
    let decoded = engine.decode(&pairs);
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

fn flush(seq: &mut Seq, tok: &Tokenizer, finish: Finish) {
    let rest = seq.decoder.flush(tok, &seq.job.stops).unwrap_or_default();
    let tokens = std::mem::take(&mut seq.pending);
    if !rest.is_empty() || !tokens.is_empty() {
        let _ = seq.job.events.send(Event::Piece { choice: seq.choice, text: rest, tokens });
    }
    let _ = seq.job.events.send(Event::Done { choice: seq.choice, finish, completion_tokens: seq.generated });
}
