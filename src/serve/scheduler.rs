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
    /// Requests admitted and not yet finished (a request's `n` choices count once).
    pub running: AtomicUsize,
    /// Cache cells holding positions of live sequences, and the cells there are.
    pub kv_cells_used: AtomicUsize,
    pub kv_cells: AtomicUsize,
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
    /// The engine's graph builds, allocations and reuse, as of its last forward.
    pub graphs: std::sync::Mutex<crate::engine::GraphStats>,
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
    stats.kv_cells.store(engine.cells(), Ordering::SeqCst);
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
                publish(&engine, &active, &stats);
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
        publish(&engine, &active, &stats);
    }
}

/// The gauges a balancer or an endpoint picker reads: busy streams, running requests, cache use.
fn publish(engine: &Engine, active: &[Seq], stats: &Stats) {
    stats.busy_slots.store(active.len(), Ordering::SeqCst);
    let mut jobs: Vec<*const Job> = active.iter().map(|s| Arc::as_ptr(&s.job)).collect();
    jobs.sort();
    jobs.dedup();
    stats.running.store(jobs.len(), Ordering::SeqCst);
    stats.kv_cells_used.store(engine.cells_in_use(), Ordering::SeqCst);
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

/// Prefills a request's prompt into free streams and forks it into its `n` choices; answers
/// a request that cannot be admitted (client gone, too many choices, engine error) itself.
fn admit(engine: &mut Engine, job: Job, active: &mut Vec<Seq>, stats: &Stats) {
    let _span = tracing::debug_span!("admit", id = %job.id, n = job.n, prompt_tokens = job.prompt.len()).entered();
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
    let prefilled = crate::generate::constrain::masks_beside(pending, || engine.prefill_cancellable(free[0], TokenId::slice(&job.prompt), Some(&ones), Rows::Last, Some(&cancel))).map(|l| l.row(0).to_vec());
    Stats::add_time(&stats.prefill_us, t0);
    *stats.graphs.lock().expect("stats lock") = engine.graph_stats();
    let logits = match prefilled {
        Ok(l) => l,
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
    let _span = tracing::debug_span!("step", sequences = active.len()).entered();
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
    // each sequence keeps its row in its own buffer (reused: no allocation per step)
    let decoded = decoded.map(|rows| {
        for (i, seq) in active.iter_mut().enumerate() {
            rows.copy_row_to(i, &mut seq.logits);
        }
    });
    Stats::add_time(&stats.decode_us, t0);
    *stats.graphs.lock().expect("stats lock") = engine.graph_stats();
    stats.decode_steps.fetch_add(1, Ordering::Relaxed);
    stats.decode_rows.fetch_add(pairs.len(), Ordering::Relaxed);
    let padding = pairs.iter().map(|p| p.0 .0 + 1).max().unwrap_or(0) - pairs.len();
    stats.decode_padding_rows.fetch_add(padding, Ordering::Relaxed);
    match decoded {
        Ok(()) => {}
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

#[cfg(test)]
mod tests {
    //! The scheduler's admit, compact and step on a real engine (the tiny fixture), no HTTP.
    use super::*;
    use crate::engine::EngineOptions;
    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    struct Fixture {
        _dir: tempfile::TempDir,
        engine: Engine,
        tok: Tokenizer,
        stats: Stats,
    }

    fn fixture(n_stream: usize) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("tiny.gguf");
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        crate::convert::convert(&crate::convert::ConvertOptions {
            checkpoint: root.join("tests/fixtures/ckpt/tiny-packed"),
            output: gguf.clone(),
            out_type: crate::convert::OutType::F32,
            threads: 1,
            progress: false,
            name: None,
        })
        .unwrap();
        let file = crate::engine::ModelFile::open(&gguf).unwrap();
        let tok = Tokenizer::from_model(&file, false).unwrap();
        let engine = Engine::load(&gguf, &EngineOptions { threads: 1, n_ctx: 128, n_stream, ..Default::default() }).unwrap();
        Fixture { _dir: dir, engine, tok, stats: Stats::default() }
    }

    /// A greedy request for exactly `max_tokens` tokens (end of turn ignored).
    fn job(id: &str, prompt: &[u32], n: usize, max_tokens: usize) -> (Job, UnboundedReceiver<Event>) {
        let (events, rx) = unbounded_channel();
        let job = Job {
            id: id.into(),
            prompt: prompt.to_vec(),
            n,
            max_tokens,
            sampling: SamplingParams::default(),
            stops: vec![],
            logprobs: None,
            ignore_eos: true,
            grammar: None,
            events,
            enqueued: Instant::now(),
        };
        (job, rx)
    }

    fn drain(rx: &mut UnboundedReceiver<Event>) -> Vec<Event> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    fn streams(active: &[Seq]) -> Vec<usize> {
        let mut s: Vec<usize> = active.iter().map(|q| q.stream.0).collect();
        s.sort();
        s
    }

    const PROMPT: [u32; 5] = [5, 17, 42, 9, 33];

    #[test]
    fn admit_prefills_once_and_forks_n_choices_into_free_streams() {
        let mut f = fixture(4);
        let mut active = vec![];
        let (j, mut rx) = job("a", &PROMPT, 3, 4);
        admit(&mut f.engine, j, &mut active, &f.stats);
        assert_eq!(streams(&active), vec![0, 1, 2]);
        for q in &active {
            assert_eq!(f.engine.stream_len(q.stream), Some(PROMPT.len()));
            assert_eq!(q.logits, active[0].logits, "choices share one prefill");
        }
        assert_eq!(f.engine.stream_len(StreamId(3)), None);
        assert!(matches!(drain(&mut rx)[..], [Event::Started]));
        assert_eq!(f.stats.prompt_tokens.load(Ordering::Relaxed), PROMPT.len());

        // More choices than free streams: an error, and nothing taken.
        let (j, mut rx) = job("b", &PROMPT, 2, 4);
        admit(&mut f.engine, j, &mut active, &f.stats);
        assert!(matches!(&drain(&mut rx)[..], [Event::Error(m)] if m.contains("exceeds")));
        assert_eq!(active.len(), 3);
        assert_eq!(f.engine.stream_len(StreamId(3)), None);

        // A client that left while queued: not prefilled.
        let (j, rx) = job("c", &PROMPT, 1, 4);
        drop(rx);
        admit(&mut f.engine, j, &mut active, &f.stats);
        assert_eq!(active.len(), 3);
        assert_eq!(f.stats.prompt_tokens.load(Ordering::Relaxed), PROMPT.len());
    }

    #[test]
    fn step_decodes_every_sequence_to_its_length_and_frees_its_stream() {
        let mut f = fixture(2);
        let mut active = vec![];
        let (j, mut rx) = job("a", &PROMPT, 2, 3);
        admit(&mut f.engine, j, &mut active, &f.stats);
        let mut steps = 0;
        while !active.is_empty() {
            step(&mut f.engine, &f.tok, &mut active, &f.stats, false);
            steps += 1;
            assert!(steps <= 4, "a 3-token request still running after {steps} steps");
        }
        // Three tokens sampled per choice; the third needs no forward, so two decode steps.
        assert_eq!(f.stats.decode_steps.load(Ordering::Relaxed), 2);
        assert_eq!(f.stats.decode_rows.load(Ordering::Relaxed), 4);
        assert_eq!(f.stats.generated_tokens.load(Ordering::Relaxed), 6);
        let events = drain(&mut rx);
        let done: Vec<(usize, Finish, usize)> = events
            .iter()
            .filter_map(|e| match e {
                Event::Done { choice, finish, completion_tokens } => Some((*choice, *finish, *completion_tokens)),
                _ => None,
            })
            .collect();
        assert_eq!(done.len(), 2, "{events:?}");
        assert!(done.iter().all(|&(_, finish, n)| finish == Finish::Length && n == 3), "{done:?}");
        // Greedy choices of one prompt say the same thing.
        let text = |c: usize| events.iter().filter_map(|e| match e { Event::Piece { choice, text, .. } if *choice == c => Some(text.as_str()), _ => None }).collect::<String>();
        assert_eq!(text(0), text(1));
        assert_eq!((f.engine.stream_len(StreamId(0)), f.engine.stream_len(StreamId(1))), (None, None));
    }

    #[test]
    fn step_frees_a_left_clients_stream_without_decoding_it() {
        let mut f = fixture(2);
        let mut active = vec![];
        let (j, _keep) = job("stays", &PROMPT, 1, 8);
        admit(&mut f.engine, j, &mut active, &f.stats);
        let (j, rx) = job("leaves", &PROMPT, 1, 8);
        admit(&mut f.engine, j, &mut active, &f.stats);
        drop(rx);
        step(&mut f.engine, &f.tok, &mut active, &f.stats, false);
        assert_eq!(streams(&active), vec![0]);
        assert_eq!(f.engine.stream_len(StreamId(1)), None);
        assert_eq!(f.stats.decode_rows.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn compact_moves_the_top_sequence_into_the_hole_and_it_reads_the_same() {
        // Reference: the sequence decoded alone from stream 0 of a same-sized engine (the
        // engine's promise: a sequence's logits do not depend on its neighbours or its stream).
        let mut reference = fixture(3);
        let mut alone = vec![];
        let (j, _r) = job("ref", &PROMPT, 1, 8);
        admit(&mut reference.engine, j, &mut alone, &reference.stats);
        let mut expected = vec![];
        for _ in 0..3 {
            step(&mut reference.engine, &reference.tok, &mut alone, &reference.stats, false);
            expected.push(alone[0].logits.clone());
        }

        let mut f = fixture(3);
        let mut active = vec![];
        let (j, rx0) = job("low", &[7, 7, 7], 1, 8);
        admit(&mut f.engine, j, &mut active, &f.stats);
        let (j, _r1) = job("mid", &[8, 8], 1, 8);
        admit(&mut f.engine, j, &mut active, &f.stats);
        let (j, _r2) = job("top", &PROMPT, 1, 8);
        admit(&mut f.engine, j, &mut active, &f.stats);
        step(&mut f.engine, &f.tok, &mut active, &f.stats, false);
        drop(rx0); // stream 0 frees at the next step, leaving a hole below two live ones
        step(&mut f.engine, &f.tok, &mut active, &f.stats, false);
        assert_eq!(streams(&active), vec![1, 2]);
        let len = f.engine.stream_len(StreamId(2));

        compact(&mut f.engine, &mut active);
        assert_eq!(streams(&active), vec![0, 1], "the top sequence moved down into stream 0");
        assert_eq!(f.engine.stream_len(StreamId(0)), len);
        assert_eq!(f.engine.stream_len(StreamId(2)), None);
        let top = active.iter().position(|q| q.job.id == "top").unwrap();
        assert_eq!(active[top].stream, StreamId(0));
        assert_eq!(active[top].logits, expected[1], "after two steps in stream 2");
        step(&mut f.engine, &f.tok, &mut active, &f.stats, false);
        let top = active.iter().position(|q| q.job.id == "top").unwrap();
        assert_eq!(active[top].logits, expected[2], "the moved sequence's next logits, bit for bit");
        // Nothing to move when the live streams are the lowest.
        compact(&mut f.engine, &mut active);
        assert_eq!(streams(&active), vec![0, 1]);
    }
}
