//! `frigg serve`: an OpenAI-compatible HTTP endpoint (actix-web) in front of one engine thread
//! that batches every active request into each decode step.

pub mod api;
pub mod scheduler;

use crate::chat::ChatTemplate;
use crate::engine::{Engine, EngineOptions};
use crate::generate::Finish;
use crate::tokenizer::Tokenizer;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use api::{ApiError, Kind};
use scheduler::{Event, Job, Stats};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
}

/// Fixed-bucket histogram for Prometheus.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    total: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(), sum_micros: AtomicU64::new(0), total: AtomicU64::new(0) }
    }

    fn observe(&self, secs: f64) {
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            if secs <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_micros.fetch_add((secs * 1e6) as u64, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            out.push_str(&format!("{name}_bucket{{le=\"{b}\"}} {}\n", c.load(Ordering::Relaxed)));
        }
        let total = self.total.load(Ordering::Relaxed);
        out.push_str(&format!("{name}_bucket{{le=\"+Inf\"}} {total}\n"));
        out.push_str(&format!("{name}_sum {}\n{name}_count {total}\n", self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6));
    }
}

/// Longest silence on an SSE stream before a keep-alive comment (see the streaming loop).
const KEEP_ALIVE: Duration = Duration::from_millis(250);

const LATENCY_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

struct State {
    tok: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    /// One job queue per engine replica; None once draining.
    jobs: Mutex<Option<Vec<crossbeam_channel::Sender<Job>>>>,
    replicas: Vec<Arc<Stats>>,
    draining: std::sync::atomic::AtomicBool,
    model_id: String,
    n_ctx: usize,
    n_vocab: usize,
    slots: usize,
    queue: usize,
    api_key: Option<String>,
    requests: Mutex<std::collections::BTreeMap<u16, u64>>,
    ttft: Histogram,
    per_token: Histogram,
    next_id: AtomicU64,
}

/// Constant-time comparison, so response timing does not reveal how much of a key matched.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn error_response(st: &State, e: &ApiError) -> HttpResponse {
    count(st, e.status);
    let mut r = HttpResponse::build(StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST));
    if e.status == 429 {
        r.insert_header(("Retry-After", "1"));
    }
    r.json(e.body())
}

fn count(st: &State, status: u16) {
    *st.requests.lock().expect("metrics lock").entry(status).or_default() += 1;
}

fn authorized(st: &State, req: &HttpRequest) -> Result<(), ApiError> {
    let Some(key) = &st.api_key else { return Ok(()) };
    let given = req.headers().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
    if ct_eq(given.as_bytes(), key.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError { status: 401, kind: "authentication_error", message: "invalid or missing API key".into(), param: None, code: Some("invalid_api_key") })
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

async fn models(st: web::Data<State>, req: HttpRequest) -> HttpResponse {
    if let Err(e) = authorized(&st, &req) {
        return error_response(&st, &e);
    }
    HttpResponse::Ok().json(json!({"object": "list", "data": [{"id": st.model_id, "object": "model", "created": 0, "owned_by": "frigg"}]}))
}

async fn metrics(st: web::Data<State>) -> HttpResponse {
    let mut out = String::new();
    out.push_str("# HELP frigg_requests_total HTTP requests by status.\n# TYPE frigg_requests_total counter\n");
    for (status, n) in st.requests.lock().expect("metrics lock").iter() {
        out.push_str(&format!("frigg_requests_total{{status=\"{status}\"}} {n}\n"));
    }
    let sum = |f: fn(&Stats) -> usize| st.replicas.iter().map(|r| f(r)).sum::<usize>();
    for (name, help, ty, v) in [
        ("frigg_prompt_tokens_total", "Prompt tokens prefilled.", "counter", sum(|r| r.prompt_tokens.load(Ordering::Relaxed))),
        ("frigg_generated_tokens_total", "Tokens generated.", "counter", sum(|r| r.generated_tokens.load(Ordering::Relaxed))),
        ("frigg_queue_depth", "Requests waiting for a slot.", "gauge", sum(|r| r.queued.load(Ordering::Relaxed))),
        ("frigg_busy_slots", "Sequences decoding.", "gauge", sum(|r| r.busy_slots.load(Ordering::Relaxed))),
        ("frigg_slots", "Sequences decoded together at most (all replicas).", "gauge", st.slots * st.replicas.len()),
        ("frigg_replicas", "Engine replicas behind this endpoint.", "gauge", st.replicas.len()),
        ("frigg_decode_steps_total", "Decode steps (one batched forward each).", "counter", sum(|r| r.decode_steps.load(Ordering::Relaxed))),
        ("frigg_decode_rows_total", "Sequences carried by decode steps (rows / steps = mean batch).", "counter", sum(|r| r.decode_rows.load(Ordering::Relaxed))),
        ("frigg_decode_padding_rows_total", "Rows decode steps computed for free streams below a live one (logits dropped).", "counter", sum(|r| r.decode_padding_rows.load(Ordering::Relaxed))),
    ] {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {ty}\n{name} {v}\n"));
    }
    let seconds = |f: fn(&Stats) -> u64| st.replicas.iter().map(|r| f(r)).sum::<u64>() as f64 / 1e6;
    for (name, help, v) in [
        ("frigg_prefill_seconds_total", "Engine time in prompt prefills.", seconds(|r| r.prefill_us.load(Ordering::Relaxed))),
        ("frigg_decode_seconds_total", "Engine time in decode steps.", seconds(|r| r.decode_us.load(Ordering::Relaxed))),
    ] {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n{name} {v:.6}\n"));
    }
    out.push_str("# HELP frigg_replica_requests_total Requests routed to each replica.\n# TYPE frigg_replica_requests_total counter\n");
    for (i, r) in st.replicas.iter().enumerate() {
        out.push_str(&format!("frigg_replica_requests_total{{replica=\"{i}\"}} {}\n", r.routed.load(Ordering::Relaxed)));
    }
    st.ttft.render("frigg_time_to_first_token_seconds", "Enqueue to first token.", &mut out);
    st.per_token.render("frigg_time_per_output_token_seconds", "Mean time per generated token after the first, per request.", &mut out);
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(out)
}

async fn tokenize(st: web::Data<State>, req: HttpRequest, body: web::Json<Value>) -> HttpResponse {
    if let Err(e) = authorized(&st, &req) {
        return error_response(&st, &e);
    }
    let Some(text) = body.get("content").or_else(|| body.get("prompt")).and_then(Value::as_str) else {
        return error_response(&st, &ApiError::invalid("`content` (a string) is required", Some("content")));
    };
    let add_special = body.get("add_special").and_then(Value::as_bool).unwrap_or(false);
    let ids = if add_special { st.tok.encode_prompt(text) } else { st.tok.encode(text) };
    match ids {
        Ok(ids) => HttpResponse::Ok().json(json!({"tokens": ids})),
        Err(e) => error_response(&st, &ApiError::invalid(e.to_string(), Some("content"))),
    }
}

async fn detokenize(st: web::Data<State>, req: HttpRequest, body: web::Json<Value>) -> HttpResponse {
    if let Err(e) = authorized(&st, &req) {
        return error_response(&st, &e);
    }
    let ids: Option<Vec<u32>> = body.get("tokens").and_then(Value::as_array).map(|a| a.iter().filter_map(|x| x.as_u64().map(|v| v as u32)).collect());
    match ids {
        Some(ids) if ids.iter().all(|&t| (t as usize) < st.n_vocab) => match st.tok.decode(&ids, false) {
            Ok(text) => HttpResponse::Ok().json(json!({"content": text})),
            Err(e) => error_response(&st, &ApiError::invalid(e.to_string(), Some("tokens"))),
        },
        _ => error_response(&st, &ApiError::invalid("`tokens` must be a list of token ids in the vocabulary", Some("tokens"))),
    }
}

async fn chat(st: web::Data<State>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    complete(st, req, body, Kind::Chat).await
}

async fn completions(st: web::Data<State>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    complete(st, req, body, Kind::Completion).await
}

/// Validates, tokenizes and enqueues; answers with SSE or one JSON body.
async fn complete(st: web::Data<State>, req: HttpRequest, body: web::Bytes, kind: Kind) -> HttpResponse {
    if let Err(e) = authorized(&st, &req) {
        return error_response(&st, &e);
    }
    if st.draining.load(Ordering::SeqCst) {
        return error_response(&st, &ApiError { status: 503, kind: "server_error", message: "the server is shutting down".into(), param: None, code: None });
    }
    let chat = matches!(kind, Kind::Chat);
    let obj = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return error_response(&st, &ApiError::invalid("the request body must be a JSON object", None)),
        Err(e) => return error_response(&st, &ApiError::invalid(format!("malformed JSON: {e}"), None)),
    };
    let p = match api::parse(&obj, kind, st.n_vocab) {
        Ok(p) => p,
        Err(e) => return error_response(&st, &e),
    };
    let prompt = match (&p.messages, &p.prompt_text, &p.prompt_ids) {
        (Some(msgs), _, _) => {
            let Some(t) = &st.template else {
                return error_response(&st, &ApiError::invalid("this model has no chat template; use /v1/completions", Some("messages")));
            };
            let tools = (p.tool_choice != api::ToolChoiceParam::None).then_some(p.tools.as_slice());
            match t.render(msgs, tools, true).map_err(|e| e.to_string()).and_then(|text| st.tok.encode(&text).map_err(|e| e.to_string())) {
                Ok(ids) => ids,
                Err(e) => return error_response(&st, &ApiError::invalid(e, Some("messages"))),
            }
        }
        (_, Some(text), _) => match st.tok.encode_prompt(text) {
            Ok(ids) => ids,
            Err(e) => return error_response(&st, &ApiError::invalid(e.to_string(), Some("prompt"))),
        },
        (_, _, Some(ids)) => ids.clone(),
        _ => unreachable!("parse requires a prompt"),
    };
    if prompt.is_empty() {
        return error_response(&st, &ApiError::invalid("the prompt is empty", Some(if chat { "messages" } else { "prompt" })));
    }
    let room = st.n_ctx.saturating_sub(prompt.len());
    let max_tokens = p.max_tokens.unwrap_or(room);
    if prompt.len() + max_tokens > st.n_ctx || room == 0 {
        let e = ApiError {
            status: 400,
            kind: "invalid_request_error",
            message: format!(
                "this model's context length is {} tokens; the prompt has {} tokens and max_tokens is {} ({} in all)",
                st.n_ctx,
                prompt.len(),
                max_tokens,
                prompt.len() + max_tokens
            ),
            param: Some("max_tokens".into()),
            code: Some("context_length_exceeded"),
        };
        return error_response(&st, &e);
    }
    if p.n > st.slots {
        return error_response(&st, &ApiError::invalid(format!("`n` = {} exceeds the server's {} slots", p.n, st.slots), Some("n")));
    }
    let grammar = if p.json_object {
        Some(scheduler::GrammarSpec::JsonObject)
    } else if p.tool_choice != api::ToolChoiceParam::None {
        let id = |t: &str| st.tok.token_id(t);
        let Some(ids) = (|| Some(crate::constrain::ToolTokens { call_open: id("<|tool_call>")?, call_close: id("<tool_call|>")?, response_open: id("<|tool_response>")?, quote: id("<|\"|>")? }))() else {
            return error_response(&st, &ApiError::unsupported("tools", "this model's vocabulary lacks Gemma-4's tool-call tokens"));
        };
        let choice = match &p.tool_choice {
            api::ToolChoiceParam::Required => crate::constrain::ToolChoice::Required,
            api::ToolChoiceParam::Named(n) => crate::constrain::ToolChoice::Named(n.clone()),
            _ => crate::constrain::ToolChoice::Auto,
        };
        let names = p.tools.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_string)).collect();
        Some(scheduler::GrammarSpec::Tools { ids, names, choice, parallel: p.parallel_tool_calls })
    } else {
        None
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let id = format!("{}-{}", if chat { "chatcmpl" } else { "cmpl" }, st.next_id.fetch_add(1, Ordering::Relaxed));
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
    // The queue holds at most --queue waiting requests (per replica); beyond that, 429.
    // Routing: the replica with the fewest busy slots plus waiting requests.
    let sent = {
        let guard = st.jobs.lock().expect("jobs lock");
        match guard.as_ref() {
            None => Err(503),
            Some(senders) => {
                let load = |r: &Stats| r.busy_slots.load(Ordering::SeqCst) + r.queued.load(Ordering::SeqCst);
                let (i, r) = st.replicas.iter().enumerate().min_by_key(|(_, r)| load(r)).expect("at least one replica");
                // Waiting room: the queue plus the slots that are free right now.
                if r.queued.load(Ordering::SeqCst) >= st.queue + st.slots.saturating_sub(r.busy_slots.load(Ordering::SeqCst)) {
                    Err(429)
                } else {
                    r.queued.fetch_add(1, Ordering::SeqCst);
                    r.routed.fetch_add(1, Ordering::Relaxed);
                    senders[i].send(job).map_err(|_| 503)
                }
            }
        }
    };
    match sent {
        Ok(()) => {}
        Err(429) => {
            let e = ApiError { status: 429, kind: "rate_limit_error", message: format!("all {} slots are busy and {} requests are waiting; retry shortly", st.slots, st.queue), param: None, code: Some("queue_full") };
            return error_response(&st, &e);
        }
        Err(_) => return error_response(&st, &ApiError { status: 503, kind: "server_error", message: "the server is shutting down".into(), param: None, code: None }),
    }
    let created = now_secs();
    let model = st.model_id.clone();
    let enqueued = Instant::now();
    let tok = st.tok.clone();
    let logprob_json = move |t: &scheduler::TokenLogprob| -> Value {
        let piece = |id: u32| tok.decode(&[id], false).unwrap_or_default();
        let entry = |id: u32, lp: f32| json!({"token": piece(id), "logprob": lp, "bytes": piece(id).into_bytes()});
        let mut e = entry(t.token, t.logprob);
        e["top_logprobs"] = Value::Array(t.top.iter().map(|&(i, l)| entry(i, l)).collect());
        e
    };

    if p.stream {
        count(&st, 200);
        let st2 = st.clone();
        let stream = async_stream::stream! {
            let mut first = true;
            let mut done = 0;
            let mut completion_tokens = 0;
            loop {
                // An SSE comment whenever nothing was sent for a while (a long prefill, a long
                // wait in the queue): a client that left is noticed only when a write fails,
                // and that drops this stream, which cancels the request — mid-prefill too.
                let ev = match tokio::time::timeout(KEEP_ALIVE, rx.recv()).await {
                    Ok(Some(ev)) => ev,
                    Ok(None) => break,
                    Err(_) => {
                        yield Ok(web::Bytes::from_static(b": keep-alive\n\n"));
                        continue;
                    }
                };
                let chunk = match ev {
                    Event::Started => continue,
                    Event::Piece { choice, text, tokens } => {
                        if first {
                            st2.ttft.observe(enqueued.elapsed().as_secs_f64());
                            first = false;
                        }
                        let lp = (!tokens.is_empty() && p.logprobs.is_some()).then(|| json!({"content": tokens.iter().map(&logprob_json).collect::<Vec<_>>()}));
                        if chat {
                            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                                   "choices": [{"index": choice, "delta": {"role": "assistant", "content": text}, "logprobs": lp, "finish_reason": null}]})
                        } else {
                            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                                   "choices": [{"index": choice, "text": text, "logprobs": lp, "finish_reason": null}]})
                        }
                    }
                    Event::ToolName { choice, index, id: call_id, name } => {
                        if first {
                            st2.ttft.observe(enqueued.elapsed().as_secs_f64());
                            first = false;
                        }
                        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": [{"index": choice, "delta": {"role": "assistant", "tool_calls": [{"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]}, "logprobs": null, "finish_reason": null}]})
                    }
                    Event::ToolArgs { choice, index, arguments } => {
                        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": [{"index": choice, "delta": {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}, "logprobs": null, "finish_reason": null}]})
                    }
                    Event::Done { choice, finish, completion_tokens: n } => {
                        done += 1;
                        completion_tokens += n;
                        let reason = finish_reason(finish);
                        if chat {
                            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                                   "choices": [{"index": choice, "delta": {}, "logprobs": null, "finish_reason": reason}]})
                        } else {
                            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                                   "choices": [{"index": choice, "text": "", "logprobs": null, "finish_reason": reason}]})
                        }
                    }
                    Event::Error(m) => json!({"error": {"message": m, "type": "server_error", "param": null, "code": null}}),
                };
                let is_error = chunk.get("error").is_some();
                yield Ok::<_, actix_web::Error>(web::Bytes::from(format!("data: {chunk}\n\n")));
                if is_error || done == p.n {
                    break;
                }
            }
            if done < p.n {
                let err = json!({"error": {"message": "the engine stopped before the request finished", "type": "server_error", "param": null, "code": null}});
                yield Ok(web::Bytes::from(format!("data: {err}\n\n")));
            }
            if p.include_usage {
                let usage = json!({"id": id, "object": if chat { "chat.completion.chunk" } else { "text_completion" }, "created": created, "model": model, "choices": [],
                                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}});
                yield Ok(web::Bytes::from(format!("data: {usage}\n\n")));
            }
            if completion_tokens > 1 {
                st2.per_token.observe(enqueued.elapsed().as_secs_f64() / completion_tokens as f64);
            }
            yield Ok(web::Bytes::from_static(b"data: [DONE]\n\n"));
        };
        return HttpResponse::Ok().content_type("text/event-stream").insert_header(("Cache-Control", "no-cache")).streaming(stream);
    }

    // Non-streaming: collect every choice.
    let mut texts = vec![String::new(); p.n];
    let mut lps: Vec<Vec<Value>> = vec![vec![]; p.n];
    let mut finishes: Vec<Option<Finish>> = vec![None; p.n];
    let mut calls: Vec<Vec<Value>> = vec![vec![]; p.n];
    let mut completion_tokens = 0;
    let mut first = true;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Started => {}
            Event::Piece { choice, text, tokens } => {
                if first {
                    st.ttft.observe(enqueued.elapsed().as_secs_f64());
                    first = false;
                }
                texts[choice].push_str(&text);
                lps[choice].extend(tokens.iter().map(&logprob_json));
            }
            Event::ToolName { choice, index: _, id: call_id, name } => {
                calls[choice].push(json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}));
            }
            Event::ToolArgs { choice, index, arguments } => {
                if let Some(c) = calls[choice].get_mut(index) {
                    c["function"]["arguments"] = Value::String(arguments);
                }
            }
            Event::Done { choice, finish, completion_tokens: n } => {
                finishes[choice] = Some(finish);
                completion_tokens += n;
                if finishes.iter().all(Option::is_some) {
                    break;
                }
            }
            Event::Error(m) => {
                return error_response(&st, &ApiError { status: 500, kind: "server_error", message: m, param: None, code: None });
            }
        }
    }
    if !finishes.iter().all(Option::is_some) {
        return error_response(&st, &ApiError { status: 500, kind: "server_error", message: "the engine stopped before the request finished".into(), param: None, code: None });
    }
    if completion_tokens > 1 {
        st.per_token.observe(enqueued.elapsed().as_secs_f64() / completion_tokens as f64);
    }
    count(&st, 200);
    let choices: Vec<Value> = (0..p.n)
        .map(|i| {
            let reason = finishes[i].map(finish_reason);
            let lp = p.logprobs.is_some().then(|| json!({"content": lps[i]}));
            if chat {
                let mut message = json!({"role": "assistant", "content": texts[i]});
                if !calls[i].is_empty() {
                    if texts[i].is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = Value::Array(calls[i].clone());
                }
                json!({"index": i, "message": message, "logprobs": lp, "finish_reason": reason})
            } else {
                json!({"index": i, "text": texts[i], "logprobs": lp, "finish_reason": reason})
            }
        })
        .collect();
    HttpResponse::Ok().json(json!({
        "id": id, "object": if chat { "chat.completion" } else { "text_completion" }, "created": created, "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    }))
}

fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::ToolCalls => "tool_calls",
    }
}

/// Memory the engine will allocate for its KV cache (checked before allocating).
pub fn kv_bytes(hp: &crate::arch::HParams, n_ctx: usize, slots: usize, kv: crate::model::KvType) -> u64 {
    let row = kv.ggml().row_bytes(hp.n_embd_attn() as u64);
    2 * hp.n_slots() as u64 * ((n_ctx + 1) * slots) as u64 * row
}

/// Loads the model, checks the memory budget, starts the engine thread and the HTTP server;
/// returns when the server has shut down (SIGINT/SIGTERM) and in-flight work has finished.
pub fn serve(o: ServeOptions) -> Result<(), String> {
    let loopback = o.host == "127.0.0.1" || o.host == "localhost" || o.host == "::1";
    if !loopback && o.api_key.is_none() {
        return Err(format!("refusing to listen on {} without --api-key (or --api-key-file): only loopback is open without a key", o.host));
    }
    let g = crate::ggml::gguf::GgufFile::open(&o.model).map_err(|e| e.to_string())?;
    let hp = crate::arch::HParams::from_gguf(&g).map_err(|e| e.to_string())?;
    let n_ctx = if o.engine.n_ctx == 0 { hp.n_ctx_train as usize } else { o.engine.n_ctx };
    if n_ctx > hp.n_ctx_train as usize {
        return Err(format!("--ctx {n_ctx} exceeds the model's context length {}", hp.n_ctx_train));
    }
    let weights = std::fs::metadata(&o.model).map(|m| m.len()).unwrap_or(0);
    let kv = kv_bytes(&hp, n_ctx, o.slots, o.engine.kv_type);
    // Prefill of a full-context prompt: activations, FFN intermediates and the mask dominate.
    let compute = (n_ctx as u64) * (hp.n_embd as u64 * 16 + hp.n_ff as u64 * 12 + n_ctx as u64 * 2) + hp.n_vocab as u64 * 4 * o.slots as u64;
    let need = weights + kv + compute;
    eprintln!(
        "frigg serve: weights {:.2} GiB · KV {:.1} MiB per slot × {} slots = {:.2} GiB ({} positions, {:?}) · compute ≈ {:.2} GiB · total ≈ {:.2} GiB",
        weights as f64 / (1u64 << 30) as f64,
        kv as f64 / o.slots as f64 / (1u64 << 20) as f64,
        o.slots,
        kv as f64 / (1u64 << 30) as f64,
        n_ctx,
        o.engine.kv_type,
        compute as f64 / (1u64 << 30) as f64,
        need as f64 / (1u64 << 30) as f64
    );
    // CPU replicas each hold their own weights, cache and buffers in host memory.
    let host_replicas = if o.devices.is_empty() { usize::from(!o.engine.gpu) } else { o.devices.iter().filter(|d| d.is_none()).count() } as u64;
    if o.devices.len() > 1 {
        eprintln!("frigg serve: {} replicas ({} in host memory): ≈ {:.2} GiB of host memory in all", o.devices.len(), host_replicas, (need * host_replicas) as f64 / (1u64 << 30) as f64);
    }
    let need = need * host_replicas;
    if let Some(avail) = crate::bench::meminfo_bytes("MemAvailable") {
        if need + need / 10 > avail {
            return Err(format!(
                "this configuration needs about {:.2} GiB (+10% headroom) but {:.2} GiB is available; lower --slots, --ctx or use --kv-type q8_0",
                need as f64 / (1u64 << 30) as f64,
                avail as f64 / (1u64 << 30) as f64
            ));
        }
    }
    let tok = Arc::new(Tokenizer::from_gguf(&g, o.mistral_regex).map_err(|e| e.to_string())?);
    let template = match g.get_str(crate::arch::key::CHAT_TEMPLATE) {
        Ok(src) => {
            let bos = tok.bos.and_then(|b| tok.token_text(b)).unwrap_or_default();
            let eos = tok.eos.first().and_then(|&e| tok.token_text(e)).unwrap_or_default();
            Some(ChatTemplate::new(&src, &bos, &eos).map_err(|e| e.to_string())?)
        }
        Err(_) => None,
    };
    drop(g);

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
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<usize, String>>();
        let stats2 = stats.clone();
        let tok2 = tok.clone();
        let t = std::thread::Builder::new()
            .name(format!("frigg-engine-{i}"))
            .spawn(move || match Engine::load(&model_path, &eopts) {
                Ok(engine) => {
                    let _ = ready_tx.send(Ok(engine.compute_bytes()));
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
        let compute_bytes = r.recv().map_err(|e| e.to_string())?.map_err(|e| format!("replica {i}: {e}"))?;
        eprintln!("frigg serve: replica {i} loaded; compute buffers reserved for a full-context prompt: {:.1} MiB", compute_bytes as f64 / (1u64 << 20) as f64);
    }

    let state = web::Data::new(State {
        n_vocab: hp.n_vocab as usize,
        tok,
        template,
        jobs: Mutex::new(Some(senders)),
        replicas,
        draining: Default::default(),
        model_id: o.alias.clone().unwrap_or_else(|| o.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "frigg".into())),
        n_ctx,
        slots: o.slots,
        queue: o.queue,
        api_key: o.api_key.clone(),
        requests: Mutex::new(Default::default()),
        ttft: Histogram::new(LATENCY_BUCKETS),
        per_token: Histogram::new(LATENCY_BUCKETS),
        next_id: AtomicU64::new(1),
    });
    let cors = o.cors_origin.clone();
    let max_body = o.max_body;
    let state2 = state.clone();
    let state_outer = state.clone();
    let addr = (o.host.clone(), o.port);
    eprintln!("frigg serve: listening on http://{}:{} (model id `{}`, {} slots, queue {})", o.host, o.port, state.model_id, o.slots, o.queue);
    let sys = actix_web::rt::System::new();
    let result = sys.block_on(async move {
        let server = HttpServer::new(move || {
            let cors_header = cors.clone();
            App::new()
                .app_data(state2.clone())
                .app_data(web::PayloadConfig::new(max_body))
                .app_data(web::JsonConfig::default().limit(max_body).error_handler(|err, _| {
                    let status = if matches!(err, actix_web::error::JsonPayloadError::Overflow { .. } | actix_web::error::JsonPayloadError::OverflowKnownLength { .. }) { 413 } else { 400 };
                    let e = ApiError { status, kind: "invalid_request_error", message: err.to_string(), param: None, code: None };
                    actix_web::error::InternalError::from_response(err, HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST)).json(e.body())).into()
                }))
                .wrap(actix_web::middleware::Condition::new(
                    cors_header.is_some(),
                    actix_web::middleware::DefaultHeaders::new()
                        .add(("Access-Control-Allow-Origin", cors_header.clone().unwrap_or_default()))
                        .add(("Access-Control-Allow-Headers", "authorization, content-type"))
                        .add(("Access-Control-Allow-Methods", "GET, POST, OPTIONS")),
                ))
                .route("/health", web::get().to(health))
                .route("/metrics", web::get().to(metrics))
                .route("/v1/models", web::get().to(models))
                .route("/v1/chat/completions", web::post().to(chat))
                .route("/v1/completions", web::post().to(completions))
                .route("/tokenize", web::post().to(tokenize))
                .route("/detokenize", web::post().to(detokenize))
        })
        .workers(2)
        .shutdown_timeout(60)
        .bind(addr)
        .map_err(|e| format!("cannot listen: {e}"))?
        .run();
        let handle = server.handle();
        let st = state.clone();
        actix_web::rt::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            eprintln!("frigg serve: draining (no new requests; in-flight ones finish)");
            st.draining.store(true, Ordering::SeqCst);
            handle.stop(true).await;
        });
        server.await.map_err(|e| e.to_string())
    });
    // Closing the queue lets the engine thread finish what is active and return.
    drop(state_outer.jobs.lock().expect("jobs lock").take());
    for t in threads {
        let _ = t.join();
    }
    eprintln!("frigg serve: stopped");
    result
}
