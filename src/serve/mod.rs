//! `frigg serve`: an OpenAI-compatible HTTP endpoint (actix-web) in front of one engine thread
//! per replica that batches every active request into each decode step.
//!
//! Every answer that is not a success has OpenAI's error shape, 404 and 405 included. A
//! client that leaves frees its slots within a step, streamed or not. SIGTERM: `/health`
//! turns 503 at once, requests are still served for `--drain-delay`, then no new ones are
//! accepted and those in flight finish; any still running after `--drain-timeout` end with an
//! explicit error and the process exits non-zero.

pub mod api;
pub mod metrics;
pub mod openai;
pub mod scheduler;

use crate::text::chat::ChatTemplate;
use crate::engine::{Engine, EngineOptions};
use crate::generate::Finish;
use crate::text::Tokenizer;
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::{ConnectionType, Method, StatusCode, Version};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use api::{ApiError, Kind};
use futures_util::StreamExt;
use metrics::HttpMetrics;
use scheduler::{Event, Job, Stats};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Who may read `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsAuth {
    /// Open when listening on loopback, the API key elsewhere.
    Auto,
    /// Always the API key (when one is set).
    Key,
    /// Never the key (an in-cluster Prometheus scraping a pod).
    Open,
}

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub model: PathBuf,
    pub host: String,
    pub port: u16,
    pub slots: usize,
    pub queue: usize,
    pub api_key: Option<String>,
    pub cors_origin: Option<String>,
    pub alias: Option<String>,
    pub engine: EngineOptions,
    pub mistral_regex: bool,
    /// Request bodies larger than this get 413.
    pub max_body: usize,
    /// One engine replica per entry (None: CPU, Some(i): GPU i), least-loaded routing.
    /// Empty: one replica on `engine`'s device.
    pub devices: Vec<Option<usize>>,
    /// After SIGTERM, how long requests are still accepted while `/health` says 503.
    pub drain_delay: Duration,
    /// After that, how long requests in flight may run before they are ended with an error.
    pub drain_timeout: Duration,
    pub metrics_auth: MetricsAuth,
}

/// Longest silence on an SSE stream before a keep-alive comment (see the streaming loop);
/// also how often a waiting non-streamed request looks at its client's socket.
const KEEP_ALIVE: Duration = Duration::from_millis(250);

/// A request body that sends no byte for this long is answered 408.
pub const BODY_STALL: Duration = Duration::from_secs(10);

struct State {
    tok: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    /// One job queue per engine replica; None once the server stops.
    jobs: Mutex<Option<Vec<crossbeam_channel::Sender<Job>>>>,
    replicas: Vec<Arc<Stats>>,
    /// SIGTERM arrived: `/health` is 503 (requests are still served during the drain delay).
    draining: AtomicBool,
    /// The drain delay is over: new requests get 503.
    closed: AtomicBool,
    /// The drain timeout passed: requests still in flight end now with an error.
    cut: AtomicBool,
    /// Completion requests between their parse and their last byte (or their client leaving).
    in_flight: AtomicUsize,
    model_id: String,
    n_ctx: usize,
    n_vocab: usize,
    slots: usize,
    queue: usize,
    max_body: usize,
    api_key: Option<String>,
    metrics_need_key: bool,
    /// Compiles requests' constraints over the model's vocabulary.
    grammars: crate::generate::constrain::Grammars,
    http: HttpMetrics,
    next_id: AtomicU64,
}

/// Counts a completion request as in flight while it lives.
struct InFlight(web::Data<State>);

impl InFlight {
    fn new(st: &web::Data<State>) -> Self {
        st.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(st.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A duplicate of a connection's socket, to see whether the client has gone while its
/// non-streamed request waits (actix-web runs a pending handler to its end regardless).
#[derive(Clone)]
struct Peer(Arc<std::net::TcpStream>);

impl Peer {
    fn attach(conn: &dyn std::any::Any, ext: &mut actix_web::dev::Extensions) {
        use std::os::fd::AsFd;
        if let Some(sock) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
            if let Ok(fd) = sock.as_fd().try_clone_to_owned() {
                ext.insert(Peer(Arc::new(std::net::TcpStream::from(fd))));
            }
        }
    }

    /// The client closed its end (an orderly EOF or a reset). The socket is non-blocking
    /// (tokio's), so a live connection answers WouldBlock.
    fn closed(&self) -> bool {
        match self.0.peek(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::Interrupted,
        }
    }
}

/// Constant-time comparison, so response timing does not reveal how much of a key matched.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn error_response(st: &State, e: &ApiError) -> HttpResponse {
    st.http.count(e.status);
    let mut r = HttpResponse::build(StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST));
    if e.status == 429 || e.status == 503 {
        r.insert_header(("Retry-After", "1"));
    }
    r.json(e.body())
}

/// `Authorization: Bearer KEY`, the scheme in any case.
fn authorized(st: &State, req: &HttpRequest) -> Result<(), ApiError> {
    let Some(key) = &st.api_key else { return Ok(()) };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, k)| k.trim());
    if ct_eq(given.as_bytes(), key.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError { status: 401, kind: "authentication_error", message: "invalid or missing API key".into(), param: None, code: Some("invalid_api_key") })
    }
}

/// The request body, at most `max_body` bytes (413) and never stalled for `BODY_STALL` (408).
async fn read_body(st: &State, req: &HttpRequest, mut payload: web::Payload) -> Result<web::Bytes, ApiError> {
    let too_large = || ApiError {
        status: 413,
        kind: "invalid_request_error",
        message: format!("the request body is larger than this server's limit of {} bytes", st.max_body),
        param: None,
        code: Some("request_too_large"),
    };
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|s| s.parse::<u64>().ok());
    if declared.is_some_and(|n| n > st.max_body as u64) {
        return Err(too_large());
    }
    let mut body = web::BytesMut::new();
    loop {
        match tokio::time::timeout(BODY_STALL, payload.next()).await {
            Err(_) => {
                return Err(ApiError {
                    status: 408,
                    kind: "invalid_request_error",
                    message: format!("the request body stalled: no byte arrived for {} s", BODY_STALL.as_secs()),
                    param: None,
                    code: Some("request_timeout"),
                })
            }
            Ok(None) => return Ok(body.freeze()),
            Ok(Some(Err(e))) => return Err(ApiError::invalid(format!("reading the request body failed: {e}"), None)),
            Ok(Some(Ok(chunk))) => {
                if body.len() + chunk.len() > st.max_body {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk);
            }
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

async fn health(st: web::Data<State>) -> HttpResponse {
    if st.replicas.iter().all(|r| r.ready.load(Ordering::SeqCst)) && !st.draining.load(Ordering::SeqCst) {
        HttpResponse::Ok().json(json!({"status": "ok"}))
    } else {
        HttpResponse::ServiceUnavailable().json(json!({"status": "loading or draining"}))
    }
}

/// Liveness: 200 while the process runs, loading and draining included (readiness is /health).
async fn live() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "alive"}))
}

async fn models(st: web::Data<State>, req: HttpRequest) -> HttpResponse {
    if let Err(e) = authorized(&st, &req) {
        return error_response(&st, &e);
    }
    HttpResponse::Ok().json(openai::ModelList { object: "list", data: vec![openai::Model { id: &st.model_id, object: "model", created: 0, owned_by: "frigg" }] })
}

async fn metrics(st: web::Data<State>, req: HttpRequest) -> HttpResponse {
    if st.metrics_need_key {
        if let Err(e) = authorized(&st, &req) {
            return error_response(&st, &e);
        }
    }
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(st.http.render(&st.replicas, st.slots))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    model: Option<String>,
    content: Option<String>,
    prompt: Option<String>,
    /// Add the tokenizer's BOS as a completion prompt does.
    add_special: Option<bool>,
}

async fn tokenize(st: web::Data<State>, req: HttpRequest, payload: web::Payload) -> HttpResponse {
    let r = async {
        authorized(&st, &req)?;
        let body = read_body(&st, &req, payload).await?;
        let t: TokenizeRequest = api::decode(&body)?;
        let _ = &t.model;
        let text = match (t.content, t.prompt) {
            (Some(_), Some(_)) => return Err(ApiError::invalid("give `content` or `prompt`, not both", Some("prompt"))),
            (Some(s), None) | (None, Some(s)) => s,
            (None, None) => return Err(ApiError::invalid("`content` (a string) is required", Some("content"))),
        };
        let ids = if t.add_special.unwrap_or(false) { st.tok.encode_prompt(&text) } else { st.tok.encode(&text) };
        ids.map_err(|e| ApiError::invalid(e.to_string(), Some("content")))
    };
    match r.await {
        Ok(ids) => HttpResponse::Ok().json(json!({"tokens": ids})),
        Err(e) => error_response(&st, &e),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<Value>,
}

async fn detokenize(st: web::Data<State>, req: HttpRequest, payload: web::Payload) -> HttpResponse {
    let r = async {
        authorized(&st, &req)?;
        let body = read_body(&st, &req, payload).await?;
        let d: DetokenizeRequest = api::decode(&body)?;
        let _ = &d.model;
        let ids = api::token_ids(&d.tokens, st.n_vocab, "tokens")?;
        st.tok.decode(&ids, false).map_err(|e| ApiError::invalid(e.to_string(), Some("tokens")))
    };
    match r.await {
        Ok(text) => HttpResponse::Ok().json(json!({"content": text})),
        Err(e) => error_response(&st, &e),
    }
}

async fn not_found(st: web::Data<State>, req: HttpRequest) -> HttpResponse {
    let e = ApiError { status: 404, kind: "invalid_request_error", message: format!("no route {} {}", req.method(), req.path()), param: None, code: Some("not_found") };
    error_response(&st, &e)
}

/// 405 for a known path asked with another method; `allow` is the method it takes.
fn method_not_allowed(st: &State, req: &HttpRequest, allow: &'static str) -> HttpResponse {
    let e = ApiError { status: 405, kind: "invalid_request_error", message: format!("{} takes {allow}, not {}", req.path(), req.method()), param: None, code: Some("method_not_allowed") };
    let mut r = error_response(st, &e);
    r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

async fn get_only(st: web::Data<State>, req: HttpRequest) -> HttpResponse {
    method_not_allowed(&st, &req, "GET")
}

async fn post_only(st: web::Data<State>, req: HttpRequest) -> HttpResponse {
    method_not_allowed(&st, &req, "POST")
}

async fn chat(st: web::Data<State>, req: HttpRequest, payload: web::Payload) -> HttpResponse {
    complete(st, req, payload, Kind::Chat).await
}

async fn completions(st: web::Data<State>, req: HttpRequest, payload: web::Payload) -> HttpResponse {
    complete(st, req, payload, Kind::Completion).await
}

/// A request on its way to the engine.
struct Prepared {
    p: api::Parsed,
    prompt: Vec<u32>,
    max_tokens: usize,
    grammar: Option<scheduler::Grammar>,
}

/// Validates, tokenizes and checks a completion request against the context and the slots.
async fn prepare(st: &State, req: &HttpRequest, payload: web::Payload, kind: Kind) -> Result<Prepared, ApiError> {
    authorized(st, req)?;
    if st.closed.load(Ordering::SeqCst) {
        return Err(ApiError::server(503, "the server is shutting down"));
    }
    let body = read_body(st, req, payload).await?;
    let p = api::parse(&body, kind, st.n_vocab)?;
    let prompt_param = if kind == Kind::Chat { "messages" } else { "prompt" };
    let prompt = match (&p.messages, &p.prompt_text, &p.prompt_ids) {
        (Some(msgs), _, _) => {
            let t = st.template.as_ref().ok_or_else(|| ApiError::invalid("this model has no chat template; use /v1/completions", Some("messages")))?;
            let tools = (p.tool_choice != api::ToolChoiceParam::None).then_some(p.tools.as_slice());
            t.encode(&st.tok, msgs, tools, true).map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?
        }
        (_, Some(text), _) => st.tok.encode_prompt(text).map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))?,
        (_, _, Some(ids)) => ids.clone(),
        _ => unreachable!("parse requires a prompt"),
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty", Some(prompt_param)));
    }
    let room = st.n_ctx.saturating_sub(prompt.len());
    let max_tokens = p.max_tokens.unwrap_or(room);
    if room == 0 || prompt.len().checked_add(max_tokens).is_none_or(|total| total > st.n_ctx) {
        return Err(ApiError {
            status: 400,
            kind: "invalid_request_error",
            message: format!(
                "this model's context length is {} tokens; the prompt has {} tokens and max_tokens is {} ({} in all)",
                st.n_ctx,
                prompt.len(),
                max_tokens,
                prompt.len() as u128 + max_tokens as u128
            ),
            param: Some("max_tokens".into()),
            code: Some("context_length_exceeded"),
        });
    }
    if p.n > st.slots {
        return Err(ApiError::invalid(format!("`n` = {} exceeds the server's {} slots", p.n, st.slots), Some("n")));
    }
    let grammar = grammar(st, &p)?;
    if let Some((need, what)) = grammar.as_ref().and_then(|g| g.min_tokens) {
        if max_tokens < need {
            return Err(ApiError::invalid(format!("{what} needs max_tokens of at least {need} (the shortest reply that satisfies it, one token per byte at worst); max_tokens is {max_tokens}"), Some("max_tokens")));
        }
    }
    Ok(Prepared { p, prompt, max_tokens, grammar })
}

/// The request's constraint, compiled: its response format, or its tools' call grammar.
fn grammar(st: &State, p: &api::Parsed) -> Result<Option<scheduler::Grammar>, ApiError> {
    use crate::generate::constrain::{Spec, ToolChoice, ToolTokens};
    let (spec, param) = match &p.format {
        Some(api::Format::JsonObject) => (Spec::JsonObject, "response_format"),
        Some(api::Format::JsonSchema(s)) => (Spec::JsonSchema(s.clone()), "response_format.json_schema.schema"),
        Some(api::Format::Regex(r)) => (Spec::Regex(r.clone()), "response_format.regex"),
        Some(api::Format::Grammar(g)) => (Spec::Lark(g.clone()), "response_format.grammar"),
        None if p.tool_choice == api::ToolChoiceParam::None => return Ok(None),
        None => {
            let id = |t: &str| st.tok.token_id(t);
            let ids = (|| Some(ToolTokens { call_open: id("<|tool_call>")?, call_close: id("<tool_call|>")?, response_open: id("<|tool_response>")?, quote: id("<|\"|>")? }))()
                .ok_or_else(|| ApiError::unsupported("tools", "this model's vocabulary lacks Gemma-4's tool-call tokens"))?;
            let choice = match &p.tool_choice {
                api::ToolChoiceParam::Required => ToolChoice::Required,
                api::ToolChoiceParam::Named(n) => ToolChoice::Named(n.clone()),
                _ => ToolChoice::Auto,
            };
            (Spec::Tools { tools: p.tool_decls.clone(), choice, parallel: p.parallel_tool_calls, ids }, "tools")
        }
    };
    let compiled = st.grammars.compile(&spec).map_err(|e| ApiError { status: 400, kind: "invalid_request_error", message: format!("{param}: {e}"), param: Some(param.into()), code: Some("invalid_grammar") })?;
    if !compiled.compile_time.is_zero() {
        tracing::debug!("compiled the {param} constraint in {:.1} ms", compiled.compile_time.as_secs_f64() * 1e3);
    }
    let min = spec.min_tokens();
    let tools = match spec {
        Spec::Tools { ids, .. } => Some(ids),
        _ => None,
    };
    Ok(Some(scheduler::Grammar { compiled, tools, min_tokens: min }))
}

/// Routes a job to the replica with the fewest busy slots plus waiting requests. The waiting
/// room per replica is the queue plus the slots free right now; beyond it, 429.
fn enqueue(st: &State, job: Job) -> Result<(), ApiError> {
    let guard = st.jobs.lock().expect("jobs lock");
    let Some(senders) = guard.as_ref() else { return Err(ApiError::server(503, "the server is shutting down")) };
    let load = |r: &Stats| r.busy_slots.load(Ordering::SeqCst) + r.queued.load(Ordering::SeqCst);
    let (i, r) = st.replicas.iter().enumerate().min_by_key(|(_, r)| load(r)).expect("at least one replica");
    if r.queued.load(Ordering::SeqCst) >= st.queue + st.slots.saturating_sub(r.busy_slots.load(Ordering::SeqCst)) {
        return Err(ApiError {
            status: 429,
            kind: "rate_limit_error",
            message: format!("all {} slots are busy and {} requests are waiting; retry shortly", st.slots, st.queue),
            param: None,
            code: Some("queue_full"),
        });
    }
    r.queued.fetch_add(1, Ordering::SeqCst);
    r.routed.fetch_add(1, Ordering::Relaxed);
    senders[i].send(job).map_err(|_| ApiError::server(503, "the server is shutting down"))
}

/// Validates, tokenizes and enqueues; answers with SSE or one JSON body.
async fn complete(st: web::Data<State>, req: HttpRequest, payload: web::Payload, kind: Kind) -> HttpResponse {
    let in_flight = InFlight::new(&st);
    let Prepared { p, prompt, max_tokens, grammar } = match prepare(&st, &req, payload, kind).await {
        Ok(x) => x,
        Err(e) => return error_response(&st, &e),
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let id = format!("{}-{}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, st.next_id.fetch_add(1, Ordering::Relaxed));
    let prompt_tokens = prompt.len();
    let job = Job {
        id: id.clone(),
        prompt,
        n: p.n,
        max_tokens,
        sampling: p.sampling.clone(),
        stops: p.stops.clone(),
        logprobs: p.logprobs,
        ignore_eos: p.ignore_eos,
        grammar,
        events: tx,
        enqueued: Instant::now(),
    };
    if let Err(e) = enqueue(&st, job) {
        return error_response(&st, &e);
    }
    let reply = Reply { id, kind, created: now_secs(), model: st.model_id.clone(), prompt_tokens, n: p.n, logprobs: p.logprobs.is_some(), tok: st.tok.clone() };
    if p.stream {
        st.http.count(200);
        let mut res = HttpResponse::Ok().content_type("text/event-stream").insert_header(("Cache-Control", "no-cache")).streaming(sse(st.clone(), rx, reply, p.include_usage, in_flight));
        if req.version() < Version::HTTP_11 {
            // HTTP/1.0 has no chunked encoding: the body ends when the connection closes.
            res.head_mut().no_chunking(true);
            res.head_mut().set_connection_type(ConnectionType::Close);
        }
        return res;
    }
    let peer = req.conn_data::<Peer>().cloned();
    let res = collect(&st, rx, reply, peer).await;
    drop(in_flight);
    res
}

/// What every chunk or body of one response repeats.
struct Reply {
    id: String,
    kind: Kind,
    created: u64,
    model: String,
    prompt_tokens: usize,
    n: usize,
    logprobs: bool,
    tok: Arc<Tokenizer>,
}

/// Per-choice logprobs in the route's shape: chat's `{"content": [...]}`, or the legacy
/// completions object (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) whose
/// offsets count characters of the choice's text.
struct Logprobs {
    kind: Kind,
    tok: Arc<Tokenizer>,
    /// Each choice's token bytes so far (for `text_offset`).
    bytes: Vec<Vec<u8>>,
}

impl Logprobs {
    fn new(r: &Reply) -> Self {
        Logprobs { kind: r.kind, tok: r.tok.clone(), bytes: vec![vec![]; r.n] }
    }

    fn text(&self, id: u32) -> String {
        self.tok.decode(&[id], false).unwrap_or_default()
    }

    fn entry(&self, id: u32, logprob: f32, top: Option<Vec<openai::TokenLogprob>>) -> openai::TokenLogprob {
        openai::TokenLogprob { token: self.text(id), logprob, bytes: self.tok.token_bytes(id), top_logprobs: top }
    }

    fn of(&mut self, choice: usize, tokens: &[scheduler::TokenLogprob]) -> openai::Logprobs {
        match self.kind {
            Kind::Chat => openai::Logprobs::Chat {
                content: tokens.iter().map(|t| self.entry(t.token, t.logprob, Some(t.top.iter().map(|&(i, l)| self.entry(i, l, None)).collect()))).collect(),
            },
            Kind::Completion => {
                let mut text_offset = Vec::with_capacity(tokens.len());
                for t in tokens {
                    let done = &self.bytes[choice];
                    let valid = match std::str::from_utf8(done) {
                        Ok(s) => s,
                        Err(e) => std::str::from_utf8(&done[..e.valid_up_to()]).unwrap_or_default(),
                    };
                    text_offset.push(valid.chars().count());
                    let b = self.tok.token_bytes(t.token);
                    self.bytes[choice].extend_from_slice(&b);
                }
                openai::Logprobs::Legacy {
                    tokens: tokens.iter().map(|t| self.text(t.token)).collect(),
                    token_logprobs: tokens.iter().map(|t| t.logprob).collect(),
                    top_logprobs: tokens.iter().map(|t| t.top.iter().map(|&(i, l)| (self.text(i), json!(l))).collect()).collect(),
                    text_offset,
                }
            }
        }
    }
}

fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::ToolCalls => "tool_calls",
    }
}

fn sse_data(v: &impl serde::Serialize) -> web::Bytes {
    web::Bytes::from(format!("data: {}\n\n", serde_json::to_string(v).expect("responses serialize")))
}

fn error_event(message: &str) -> web::Bytes {
    sse_data(&ApiError::server(500, message).body())
}

const SHUTDOWN_CUT: &str = "the server is shutting down and its drain timeout ended this request";

impl Reply {
    fn head(&self, streamed: bool) -> openai::Head<'_> {
        let object = match (self.kind, streamed) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        };
        openai::Head { id: &self.id, object, created: self.created, model: &self.model }
    }

    /// One chunk of the stream for an event (None: nothing to send).
    fn chunk(&self, ev: Event, logprobs: &mut Logprobs) -> Option<web::Bytes> {
        use openai::{ChatChunkChoice, CompletionChoice, Delta, FunctionDelta, ToolCallDelta};
        let one = |index: usize, delta: Delta, lp: Option<openai::Logprobs>, reason: Option<&'static str>| {
            sse_data(&openai::Chunk { head: self.head(true), choices: vec![ChatChunkChoice { index, delta, logprobs: lp, finish_reason: reason }], usage: None })
        };
        let text = |index: usize, text: String, lp: Option<openai::Logprobs>, reason: Option<&'static str>| {
            sse_data(&openai::Chunk { head: self.head(true), choices: vec![CompletionChoice { index, text, logprobs: lp, finish_reason: reason }], usage: None })
        };
        let chat = self.kind == Kind::Chat;
        Some(match ev {
            Event::Started | Event::Error(_) => return None,
            Event::Piece { choice, text: t, tokens } => {
                let lp = (self.logprobs && !tokens.is_empty()).then(|| logprobs.of(choice, &tokens));
                if chat {
                    one(choice, Delta { role: Some("assistant"), content: Some(t), tool_calls: None }, lp, None)
                } else {
                    text(choice, t, lp, None)
                }
            }
            Event::ToolName { choice, index, id, name } => {
                let call = ToolCallDelta { index, id: Some(id), kind: Some("function"), function: FunctionDelta { name: Some(name), arguments: String::new() } };
                one(choice, Delta { role: Some("assistant"), content: None, tool_calls: Some(vec![call]) }, None, None)
            }
            Event::ToolArgs { choice, index, arguments } => {
                let call = ToolCallDelta { index, id: None, kind: None, function: FunctionDelta { name: None, arguments } };
                one(choice, Delta { tool_calls: Some(vec![call]), ..Default::default() }, None, None)
            }
            Event::Done { choice, finish, .. } => {
                if chat {
                    one(choice, Delta::default(), None, Some(finish_reason(finish)))
                } else {
                    text(choice, String::new(), None, Some(finish_reason(finish)))
                }
            }
        })
    }
}

/// The SSE body: one chunk per event, keep-alive comments during silences, exactly one error
/// event when the request fails, usage when asked, then `[DONE]`.
fn sse(st: web::Data<State>, mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>, r: Reply, include_usage: bool, in_flight: InFlight) -> impl futures_util::Stream<Item = Result<web::Bytes, actix_web::Error>> {
    async_stream::stream! {
        let _in_flight = in_flight;
        let enqueued = Instant::now();
        let mut logprobs = Logprobs::new(&r);
        let mut first = true;
        let mut done = 0;
        let mut failed = false;
        let mut completion_tokens = 0;
        while done < r.n {
            if st.cut.load(Ordering::SeqCst) {
                yield Ok(error_event(SHUTDOWN_CUT));
                failed = true;
                break;
            }
            // A keep-alive comment whenever nothing was sent for a while (a long prefill, a
            // long wait in the queue): a client that left is noticed only when a write fails,
            // and that drops this stream, which cancels the request — mid-prefill too.
            let ev = match tokio::time::timeout(KEEP_ALIVE, rx.recv()).await {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(_) => {
                    yield Ok(web::Bytes::from_static(b": keep-alive\n\n"));
                    continue;
                }
            };
            if first && matches!(ev, Event::Piece { .. } | Event::ToolName { .. }) {
                st.http.ttft.observe(enqueued.elapsed().as_secs_f64());
                first = false;
            }
            match &ev {
                Event::Done { completion_tokens: n, .. } => {
                    done += 1;
                    completion_tokens += n;
                }
                Event::Error(m) => {
                    yield Ok(error_event(m));
                    failed = true;
                    break;
                }
                _ => {}
            }
            if let Some(chunk) = r.chunk(ev, &mut logprobs) {
                yield Ok(chunk);
            }
        }
        if !failed && done < r.n {
            yield Ok(error_event("the engine stopped before the request finished"));
            failed = true;
        }
        if include_usage && !failed {
            let usage: openai::Chunk<openai::CompletionChoice> = openai::Chunk { head: r.head(true), choices: vec![], usage: Some(openai::Usage::new(r.prompt_tokens, completion_tokens)) };
            yield Ok(sse_data(&usage));
        }
        if completion_tokens > 1 {
            st.http.per_token.observe(enqueued.elapsed().as_secs_f64() / completion_tokens as f64);
        }
        yield Ok(web::Bytes::from_static(b"data: [DONE]\n\n"));
    }
}

/// A non-streamed answer: every choice collected into one body. While it waits, the client's
/// socket is looked at every `KEEP_ALIVE`: a client that left cancels the request (dropping
/// the receiver frees its slots at the engine's next step).
/// Long on purpose: one loop over the engine's events and the socket poll, then the body.
async fn collect(st: &State, mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>, r: Reply, peer: Option<Peer>) -> HttpResponse {
    let enqueued = Instant::now();
    let mut logprobs = Logprobs::new(&r);
    let mut texts = vec![String::new(); r.n];
    let mut lps: Vec<Option<openai::Logprobs>> = vec![None; r.n];
    let mut finishes: Vec<Option<Finish>> = vec![None; r.n];
    let mut calls: Vec<Vec<openai::ToolCall>> = vec![vec![]; r.n];
    let mut completion_tokens = 0;
    let mut first = true;
    let mut looked = Instant::now();
    while !finishes.iter().all(Option::is_some) {
        if st.cut.load(Ordering::SeqCst) {
            return error_response(st, &ApiError::server(503, SHUTDOWN_CUT));
        }
        if looked.elapsed() >= KEEP_ALIVE {
            looked = Instant::now();
            if peer.as_ref().is_some_and(Peer::closed) {
                // nginx's "client closed request": counted, never sent
                st.http.count(499);
                return HttpResponse::build(StatusCode::from_u16(499).expect("valid code")).finish();
            }
        }
        let ev = match tokio::time::timeout(KEEP_ALIVE, rx.recv()).await {
            Ok(Some(ev)) => ev,
            Ok(None) => break,
            Err(_) => continue,
        };
        if first && matches!(ev, Event::Piece { .. } | Event::ToolName { .. }) {
            st.http.ttft.observe(enqueued.elapsed().as_secs_f64());
            first = false;
        }
        match ev {
            Event::Started => {}
            Event::Piece { choice, text, tokens } => {
                texts[choice].push_str(&text);
                if r.logprobs && !tokens.is_empty() {
                    let more = logprobs.of(choice, &tokens);
                    match &mut lps[choice] {
                        Some(l) => l.extend(more),
                        slot => *slot = Some(more),
                    }
                }
            }
            Event::ToolName { choice, index: _, id, name } => {
                calls[choice].push(openai::ToolCall { id, kind: "function", function: openai::FunctionCall { name, arguments: String::new() } });
            }
            Event::ToolArgs { choice, index, arguments } => {
                if let Some(c) = calls[choice].get_mut(index) {
                    c.function.arguments = arguments;
                }
            }
            Event::Done { choice, finish, completion_tokens: n } => {
                finishes[choice] = Some(finish);
                completion_tokens += n;
            }
            Event::Error(m) => return error_response(st, &ApiError::server(500, m)),
        }
    }
    if !finishes.iter().all(Option::is_some) {
        return error_response(st, &ApiError::server(500, "the engine stopped before the request finished"));
    }
    if completion_tokens > 1 {
        st.http.per_token.observe(enqueued.elapsed().as_secs_f64() / completion_tokens as f64);
    }
    st.http.count(200);
    let usage = openai::Usage::new(r.prompt_tokens, completion_tokens);
    let empty_logprobs = || match r.kind {
        Kind::Chat => openai::Logprobs::Chat { content: vec![] },
        Kind::Completion => openai::Logprobs::Legacy { tokens: vec![], token_logprobs: vec![], top_logprobs: vec![], text_offset: vec![] },
    };
    let mut parts = texts.into_iter().zip(lps).zip(finishes).zip(calls).enumerate();
    let lp_of = |lp: Option<openai::Logprobs>| r.logprobs.then(|| lp.unwrap_or_else(empty_logprobs));
    match r.kind {
        Kind::Chat => {
            let choices = parts
                .by_ref()
                .map(|(index, (((text, lp), finish), tool_calls))| {
                    let content = if text.is_empty() && !tool_calls.is_empty() { None } else { Some(text) };
                    openai::ChatChoice { index, message: openai::Message { role: "assistant", content, tool_calls }, logprobs: lp_of(lp), finish_reason: finish.map(finish_reason) }
                })
                .collect();
            HttpResponse::Ok().json(openai::Response { head: r.head(false), choices, usage })
        }
        Kind::Completion => {
            let choices = parts.map(|(index, (((text, lp), finish), _))| openai::CompletionChoice { index, text, logprobs: lp_of(lp), finish_reason: finish.map(finish_reason) }).collect();
            HttpResponse::Ok().json(openai::Response::<openai::CompletionChoice> { head: r.head(false), choices, usage })
        }
    }
}

/// Loads the model, checks the memory budget, starts the engine threads and the HTTP server;
/// returns when the server has shut down (SIGINT/SIGTERM) and in-flight work has finished, or
/// an error when the drain timeout had to cut requests.
pub fn serve(o: ServeOptions) -> Result<(), String> {
    let loopback = o.host == "127.0.0.1" || o.host == "localhost" || o.host == "::1";
    if !loopback && o.api_key.is_none() {
        return Err(format!("refusing to listen on {} without --api-key (or --api-key-file): only loopback is open without a key", o.host));
    }
    if o.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err("--api-key: the key is empty".into());
    }
    let file = crate::engine::ModelFile::open(&o.model).map_err(|e| e.to_string())?;
    let hp = file.hp.clone();
    let n_ctx = check_memory(&o, &file)?;
    let tok = Arc::new(Tokenizer::from_model(&file, o.mistral_regex).map_err(|e| e.to_string())?);
    let template = ChatTemplate::from_model(&file, &tok).map_err(|e| e.to_string())?;
    drop(file);
    // llguidance's view of the vocabulary, built while the engines load.
    let tok3 = tok.clone();
    let grammars = std::thread::spawn(move || crate::generate::constrain::Grammars::new(&tok3.tok_env()));

    let Replicas { stats: replicas, jobs: senders, threads } = start_replicas(&o, n_ctx, &tok)?;

    let grammars = grammars.join().map_err(|_| "building the grammar compiler panicked".to_string())??;
    let state = web::Data::new(State {
        grammars,
        n_vocab: hp.n_vocab as usize,
        tok,
        template,
        jobs: Mutex::new(Some(senders)),
        replicas,
        draining: AtomicBool::new(false),
        closed: AtomicBool::new(false),
        cut: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        model_id: o.alias.clone().unwrap_or_else(|| o.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "frigg".into())),
        n_ctx,
        slots: o.slots,
        queue: o.queue,
        max_body: o.max_body,
        metrics_need_key: match o.metrics_auth {
            MetricsAuth::Auto => !loopback,
            MetricsAuth::Key => true,
            MetricsAuth::Open => false,
        },
        api_key: o.api_key.clone(),
        http: HttpMetrics::default(),
        next_id: AtomicU64::new(1),
    });
    let result = listen(state.clone(), &o);
    // Closing the queues lets the engine threads finish what is active and return.
    drop(state.jobs.lock().expect("jobs lock").take());
    for t in threads {
        let _ = t.join();
    }
    let cut = result?;
    if cut > 0 {
        return Err(format!("stopped after the drain timeout ({} s) ended {cut} request(s) in flight", o.drain_timeout.as_secs()));
    }
    eprintln!("frigg serve: stopped");
    Ok(())
}

/// The context length to serve, once the memory budget (printed) fits this host.
fn check_memory(o: &ServeOptions, file: &crate::engine::ModelFile) -> Result<usize, String> {
    let n_ctx = if o.engine.n_ctx == 0 { file.hp.n_ctx_train as usize } else { o.engine.n_ctx };
    if n_ctx > file.hp.n_ctx_train as usize {
        return Err(format!("--ctx {n_ctx} exceeds the model's context length {}", file.hp.n_ctx_train));
    }
    // a GPU replica's cache rounds its cells up (engine::kv::kv_cells): the larger figure
    let gpu = o.engine.gpu || o.devices.iter().any(|d| d.is_some());
    let budget = crate::engine::Budget::new(file, n_ctx, o.slots, o.engine.kv_type, gpu);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    eprintln!(
        "frigg serve: weights {:.2} GiB · KV {:.1} MiB per slot × {} slots = {:.2} GiB ({} positions, {}) · compute ≈ {:.2} GiB · total ≈ {:.2} GiB",
        gib(budget.weights),
        budget.kv_per_stream as f64 / (1u64 << 20) as f64,
        o.slots,
        gib(budget.kv),
        n_ctx,
        o.engine.kv_type,
        gib(budget.compute),
        gib(budget.total)
    );
    // CPU replicas each hold their own weights, cache and buffers in host memory.
    let host_replicas = if o.devices.is_empty() { usize::from(!o.engine.gpu) } else { o.devices.iter().filter(|d| d.is_none()).count() } as u64;
    if o.devices.len() > 1 {
        eprintln!("frigg serve: {} replicas ({} in host memory): ≈ {:.2} GiB of host memory in all", o.devices.len(), host_replicas, gib(budget.total * host_replicas));
    }
    budget.fits(host_replicas)?;
    Ok(n_ctx)
}

/// Serves HTTP until SIGTERM/SIGINT and the drain after it; returns the requests the drain
/// timeout cut.
fn listen(state: web::Data<State>, o: &ServeOptions) -> Result<usize, String> {
    let cors = o.cors_origin.clone();
    let state2 = state.clone();
    let addr = (o.host.clone(), o.port);
    eprintln!("frigg serve: listening on http://{}:{} (model id `{}`, {} slots, queue {})", o.host, o.port, state.model_id, o.slots, o.queue);
    let sys = actix_web::rt::System::new();
    let (drain_delay, drain_timeout) = (o.drain_delay, o.drain_timeout);
    sys.block_on(async move {
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state2.clone())
                .wrap(actix_web::middleware::Condition::new(cors.is_some(), cors_middleware(cors.as_deref())))
                .wrap_fn(preflight_no_content)
                .service(web::resource("/health").get(health).default_service(web::to(get_only)))
                .service(web::resource("/live").get(live).default_service(web::to(get_only)))
                .service(web::resource("/metrics").get(metrics).default_service(web::to(get_only)))
                .service(web::resource("/v1/models").get(models).default_service(web::to(get_only)))
                .service(web::resource("/v1/chat/completions").post(chat).default_service(web::to(post_only)))
                .service(web::resource("/v1/completions").post(completions).default_service(web::to(post_only)))
                .service(web::resource("/tokenize").post(tokenize).default_service(web::to(post_only)))
                .service(web::resource("/detokenize").post(detokenize).default_service(web::to(post_only)))
                .default_service(web::to(not_found))
        })
        .on_connect(Peer::attach)
        .workers(2)
        // frigg drains in-flight work itself (below); this only closes idle connections.
        .shutdown_timeout(5)
        .disable_signals()
        .bind(addr)
        .map_err(|e| format!("cannot listen: {e}"))?
        .run();
        let handle = server.handle();
        let st = state.clone();
        let drained = actix_web::rt::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            let cut = drain(&st, drain_delay, drain_timeout).await;
            handle.stop(true).await;
            cut
        });
        server.await.map_err(|e| e.to_string())?;
        Ok::<usize, String>(drained.await.unwrap_or(0))
    })
}

/// The engine replicas, each on its own thread: its counters, its job queue, its thread.
struct Replicas {
    stats: Vec<Arc<Stats>>,
    jobs: Vec<crossbeam_channel::Sender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Loads one engine per `--devices` entry (one on the CPU or the first GPU by default), each
/// running the scheduler on its own thread; returns once every one has loaded.
fn start_replicas(o: &ServeOptions, n_ctx: usize, tok: &Arc<Tokenizer>) -> Result<Replicas, String> {
    let devices: Vec<Option<Option<usize>>> = if o.devices.is_empty() { vec![None] } else { o.devices.iter().map(|d| Some(*d)).collect() };
    let mut replicas = vec![];
    let mut senders = vec![];
    let mut threads = vec![];
    let mut ready = vec![];
    for (i, dev) in devices.iter().enumerate() {
        let stats = Arc::new(Stats::default());
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Job>();
        let mut eopts = EngineOptions { n_ctx, n_stream: o.slots, ..o.engine.clone() };
        if let Some(d) = dev {
            eopts.gpu = d.is_some();
            eopts.gpu_index = *d;
        }
        let model_path = o.model.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(usize, String, String), String>>();
        let stats2 = stats.clone();
        let tok2 = tok.clone();
        let t = std::thread::Builder::new()
            .name(format!("frigg-engine-{i}"))
            .spawn(move || match Engine::load(&model_path, &eopts) {
                Ok(engine) => {
                    let kernels = engine.kernels().map_or("GPU: ggml's ops".to_string(), |k| k.to_string());
                    let placement = std::iter::once(engine.model.placement()).chain(engine.model.placement_checks.iter().cloned()).collect::<Vec<_>>().join("; ");
                    let _ = ready_tx.send(Ok((engine.compute_bytes(), placement, kernels)));
                    scheduler::run(engine, tok2, jobs_rx, stats2);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                }
            })
            .map_err(|e| e.to_string())?;
        replicas.push(stats);
        senders.push(jobs_tx);
        threads.push(t);
        ready.push(ready_rx);
    }
    for (i, r) in ready.iter().enumerate() {
        let (compute_bytes, placement, kernels) = r.recv().map_err(|e| e.to_string())?.map_err(|e| format!("replica {i}: {e}"))?;
        eprintln!("frigg serve: replica {i} loaded; compute buffers reserved for a full-context prompt: {:.1} MiB", compute_bytes as f64 / (1u64 << 20) as f64);
        eprintln!("frigg serve: replica {i} weights: {placement}");
        eprintln!("frigg serve: replica {i} {kernels}");
    }

    Ok(Replicas { stats: replicas, jobs: senders, threads })
}

/// The drain after SIGTERM: `/health` 503 at once, requests still served for `delay`, then no
/// new ones; in-flight requests get `timeout` to finish. Returns how many had to be cut.
async fn drain(st: &State, delay: Duration, timeout: Duration) -> usize {
    st.draining.store(true, Ordering::SeqCst);
    eprintln!("frigg serve: draining: /health is 503; accepting requests for {} s more", delay.as_secs_f64());
    tokio::time::sleep(delay).await;
    st.closed.store(true, Ordering::SeqCst);
    let waiting = st.in_flight.load(Ordering::SeqCst);
    eprintln!("frigg serve: no new requests; {waiting} in flight get up to {} s to finish", timeout.as_secs_f64());
    let deadline = Instant::now() + timeout;
    while st.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cut = st.in_flight.load(Ordering::SeqCst);
    if cut > 0 {
        eprintln!("frigg serve: drain timeout: ending {cut} request(s) with an error");
        st.cut.store(true, Ordering::SeqCst);
        // Each handler notices within KEEP_ALIVE and writes its error; allow a few rounds.
        let deadline = Instant::now() + KEEP_ALIVE * 20;
        while st.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    cut
}

/// actix-cors answers a preflight 200; a preflight has no content, so frigg says 204.
fn preflight_no_content<S, B>(req: actix_web::dev::ServiceRequest, srv: &S) -> impl std::future::Future<Output = Result<actix_web::dev::ServiceResponse<B>, actix_web::Error>>
where
    S: actix_web::dev::Service<actix_web::dev::ServiceRequest, Response = actix_web::dev::ServiceResponse<B>, Error = actix_web::Error>,
{
    let preflight = req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let fut = srv.call(req);
    async move {
        let mut res = fut.await?;
        if preflight && res.status() == StatusCode::OK {
            *res.response_mut().status_mut() = StatusCode::NO_CONTENT;
        }
        Ok(res)
    }
}

/// CORS for one origin (or `*`): preflights answered 204 with the methods and headers the API
/// takes; other responses carry the origin when the request's matches.
fn cors_middleware(origin: Option<&str>) -> actix_cors::Cors {
    let cors = actix_cors::Cors::default()
        .allowed_methods([Method::GET, Method::POST, Method::OPTIONS])
        .allowed_headers([header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT])
        .max_age(600);
    match origin {
        Some("*") => cors.allow_any_origin().send_wildcard(),
        Some(o) => cors.allowed_origin(o),
        None => cors,
    }
}
