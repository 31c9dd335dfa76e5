//! `frigg bench load`: a bounded HTTP load generator for an OpenAI-compatible server on
//! loopback. N clients each stream chat completions back to back until the duration is up
//! (requests in flight then finish), with mixed prompts and lengths; every response is checked
//! complete (a finish reason per choice, usage, `[DONE]`, no error event).
//!
//! With `mix`, requests cycle through the parameter sets stock clients send (greedy with stop
//! strings, nucleus/top-k with penalties, logprobs, n = 2, non-streamed, json_object, logit_bias),
//! and json_object replies must parse. With a server pid (the soak), the server's resident memory
//! is sampled throughout and its busy slots and queue read from /metrics once every client is done.

use serde::Serialize;
use std::io::BufRead;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub label: String,
    pub url: String,
    pub streams: usize,
    pub duration: Duration,
    pub max_tokens: Vec<usize>,
    pub api_key: Option<String>,
    /// Cycle through varied parameter sets instead of one streamed sampling request.
    pub mix: bool,
    /// The server's pid on this machine: sample its resident memory (the soak).
    pub server_pid: Option<u32>,
    /// Resident memory after this long is the soak's baseline.
    pub warmup: Duration,
    /// Per-request timeline, one JSON line each (`RequestLine`).
    pub log: Option<std::path::PathBuf>,
}

/// One request in the `log` timeline.
#[derive(Debug, Serialize)]
struct RequestLine<'a> {
    client: usize,
    /// Unix seconds.
    start: f64,
    end: f64,
    ok: bool,
    error: Option<&'a str>,
    ttft_s: Option<f64>,
    completion_tokens: u64,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// What a soak measures besides throughput: memory growth and leaked slots.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SoakFigures {
    pub server_pid: u32,
    pub warmup_s: f64,
    /// (seconds since start, resident MiB), every 2 s.
    pub rss_samples: Vec<(f64, f64)>,
    pub rss_after_warmup_mib: f64,
    pub rss_end_mib: f64,
    pub rss_max_mib: f64,
    /// (end - after warm-up) / after warm-up, in percent.
    pub rss_growth_pct: f64,
    /// `frigg_busy_slots` and `frigg_queue_depth` once every client is done.
    pub busy_slots_end: Option<u64>,
    pub queue_depth_end: Option<u64>,
    /// Requests per parameter set, by name.
    pub mix_counts: Vec<(String, usize)>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LoadReport {
    pub label: String,
    pub url: String,
    pub streams: usize,
    pub duration_s: f64,
    /// From the first request to the last response (in-flight requests finish after the duration).
    pub wall_s: f64,
    pub server_slots: Option<u64>,
    pub requests: usize,
    pub complete: usize,
    pub errors: usize,
    pub error_samples: Vec<String>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Completion tokens of all clients / wall time.
    pub aggregate_tok_s: f64,
    /// Time to the first text, over the requests that streamed any (None when none did: a
    /// random-weight model may emit only tokens that decode to no text).
    #[serde(default)]
    pub ttft_p50_s: Option<f64>,
    #[serde(default)]
    pub ttft_p95_s: Option<f64>,
    pub machine: crate::tools::bench::Machine,
    pub load_before: f64,
    pub load_after: f64,
    #[serde(default)]
    pub soak: Option<SoakFigures>,
    /// The frigg server's engine time over the run, from its /metrics counters (None for other
    /// servers and for reports made before the counters existed).
    #[serde(default)]
    pub engine: Option<EngineTime>,
}

/// Differences of a frigg server's engine counters between the start and the end of a run.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct EngineTime {
    pub prefill_s: f64,
    pub decode_s: f64,
    pub decode_steps: u64,
    pub decode_rows: u64,
    /// Rows computed for free streams below a live one (None: a server without the counter).
    #[serde(default)]
    pub padding_rows: Option<u64>,
}

impl EngineTime {
    const COUNTERS: [&'static str; 4] = ["frigg_prefill_seconds_total", "frigg_decode_seconds_total", "frigg_decode_steps_total", "frigg_decode_rows_total"];

    const PADDING: &'static str = "frigg_decode_padding_rows_total";

    /// The four counters, and the padding rows where the server has that counter.
    fn read(agent: &ureq::Agent, url: &str) -> Option<([f64; 4], Option<f64>)> {
        let text = metrics_text(agent, url)?;
        let mut v = [0.0; 4];
        for (slot, name) in v.iter_mut().zip(Self::COUNTERS) {
            *slot = metric_value(&text, name)?;
        }
        Some((v, metric_value(&text, Self::PADDING)))
    }

    fn between(before: ([f64; 4], Option<f64>), after: ([f64; 4], Option<f64>)) -> EngineTime {
        let d = |i: usize| after.0[i] - before.0[i];
        EngineTime {
            prefill_s: d(0),
            decode_s: d(1),
            decode_steps: d(2).round() as u64,
            decode_rows: d(3).round() as u64,
            padding_rows: after.1.zip(before.1).map(|(a, b)| (a - b).round() as u64),
        }
    }

    /// "prefill s / decode s (share of the wall) · mean decode batch (+ mean padding rows)"
    fn cell(e: Option<&EngineTime>, wall_s: f64) -> String {
        match e {
            Some(e) => {
                let steps = e.decode_steps.max(1) as f64;
                format!(
                    "{:.0} s ({:.0}%) / {:.0} s ({:.0}%) · {:.2}{}",
                    e.prefill_s,
                    e.prefill_s / wall_s * 100.0,
                    e.decode_s,
                    e.decode_s / wall_s * 100.0,
                    e.decode_rows as f64 / steps,
                    e.padding_rows.map(|p| format!(" (+{:.2} padding)", p as f64 / steps)).unwrap_or_default()
                )
            }
            None => "–".into(),
        }
    }
}

const PROMPTS: &[&str] = &[
    "Hvad er hovedstaden i Danmark?",
    "Write one sentence about the sea.",
    "Forklar kort, hvorfor himlen er blå, og giv et eksempel fra hverdagen.",
    "List three colours.",
    "Hvad er 7 plus 8? Svar med et tal og forklar derefter regnestykket trin for trin, så et barn kan forstå det.",
    "Tell me a short story about a fox, a crow and a piece of cheese, in plain English.",
];

/// The parameter sets of a mixed run: (name, extra fields, streamed).
fn mix_sets(slots: u64) -> Vec<(&'static str, serde_json::Value, bool)> {
    use serde_json::json;
    vec![
        ("sampled", json!({"temperature": 0.8}), true),
        ("greedy+stop", json!({"temperature": 0, "stop": [".", "\n\n"]}), true),
        ("top_p/top_k+penalties", json!({"temperature": 1.0, "top_p": 0.9, "top_k": 40, "presence_penalty": 0.5, "frequency_penalty": 0.3}), true),
        ("logprobs+min_p", json!({"temperature": 0.7, "min_p": 0.05, "logprobs": true, "top_logprobs": 3}), true),
        ("n", json!({"temperature": 0.9, "n": slots.clamp(1, 2)}), true),
        ("non-streamed+repetition_penalty", json!({"temperature": 0.7, "repetition_penalty": 1.1}), false),
        ("json_object", json!({"temperature": 0.5, "response_format": {"type": "json_object"}}), true),
        ("non-streamed+logit_bias", json!({"temperature": 0.6, "logit_bias": {"3": -100, "4": 5}}), false),
    ]
}

struct One {
    /// Unix seconds at the request's start and end.
    start: f64,
    end: f64,
    ok: bool,
    set: &'static str,
    error: Option<String>,
    ttft: Option<f64>,
    prompt_tokens: u64,
    completion_tokens: u64,
}

fn is_loopback(url: &str) -> bool {
    let rest = url.strip_prefix("http://").unwrap_or("");
    let host = rest.split(['/', '?']).next().unwrap_or("");
    let host = host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host);
    matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

/// One request of the load and what it measured (time to first token, tokens, the error).
/// Long on purpose: the streamed and the non-streamed arm each read their response in place.
fn one_request(agent: &ureq::Agent, o: &LoadOptions, sets: &[(&'static str, serde_json::Value, bool)], i: usize, stream_no: usize) -> One {
    let (set, extra, streamed) = if o.mix { sets[(i + stream_no) % sets.len()].clone() } else { sets[0].clone() };
    let mut r = One { start: unix_now(), end: 0.0, ok: false, set, error: None, ttft: None, prompt_tokens: 0, completion_tokens: 0 };
    let prompt = PROMPTS[(i + stream_no) % PROMPTS.len()];
    let content = if set == "json_object" { format!("Answer in JSON. {prompt}") } else { prompt.to_string() };
    let mut body = serde_json::json!({
        "model": "frigg",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": o.max_tokens[(i * 7 + stream_no) % o.max_tokens.len()],
        "seed": (stream_no * 1000 + i) as u64,
        "stream": streamed,
    });
    if streamed {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    let n = body["n"].as_u64().unwrap_or(1) as usize;
    let t0 = Instant::now();
    let mut req = agent.post(format!("{}/v1/chat/completions", o.url.trim_end_matches('/'))).header("Content-Type", "application/json");
    if let Some(k) = &o.api_key {
        req = req.header("Authorization", format!("Bearer {k}"));
    }
    let resp = match req.send(body.to_string()) {
        Ok(x) => x,
        Err(e) => {
            r.error = Some(e.to_string());
            return r;
        }
    };
    if !streamed {
        let t = t0.elapsed().as_secs_f64();
        let v: serde_json::Value = match resp.into_body().read_to_string().map_err(|e| e.to_string()).and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string())) {
            Ok(v) => v,
            Err(e) => {
                r.error = Some(format!("reading the response: {e}"));
                return r;
            }
        };
        r.ttft = Some(t);
        r.prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        r.completion_tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        let choices = v["choices"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        r.ok = choices.len() == n && choices.iter().all(|c| c["finish_reason"].is_string() && c["message"]["content"].is_string()) && v["usage"].is_object();
        if !r.ok {
            r.error = Some(format!("incomplete response: {}", v.to_string().chars().take(300).collect::<String>()));
        }
        return r;
    }
    let reader = std::io::BufReader::new(resp.into_body().into_reader());
    let (mut done, mut usage) = (false, false);
    let mut finished = vec![false; n];
    let mut text = vec![String::new(); n];
    for line in reader.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                r.error = Some(format!("reading the stream: {e}"));
                return r;
            }
        };
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: serde_json::Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                r.error = Some(format!("bad SSE data: {e}"));
                return r;
            }
        };
        if let Some(err) = v.get("error") {
            r.error = Some(err.to_string());
            return r;
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = true;
            r.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
            r.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
        }
        for c in v["choices"].as_array().into_iter().flatten() {
            let Some(k) = c["index"].as_u64().map(|k| k as usize).filter(|&k| k < n) else {
                r.error = Some(format!("choice index out of range: {c}"));
                return r;
            };
            if let Some(piece) = c["delta"]["content"].as_str().filter(|s| !s.is_empty()) {
                r.ttft.get_or_insert(t0.elapsed().as_secs_f64());
                text[k].push_str(piece);
            }
            if c["finish_reason"].is_string() {
                finished[k] = true;
            }
        }
    }
    let all_finished = finished.iter().all(|&f| f);
    r.ok = all_finished && done && usage;
    if !r.ok {
        r.error = Some(format!("incomplete response (finish_reason on every choice {all_finished}, usage {usage}, [DONE] {done})"));
    } else if set == "json_object" {
        if let Some(bad) = text.iter().find(|t| serde_json::from_str::<serde_json::Value>(t).is_err()) {
            r.ok = false;
            r.error = Some(format!("json_object reply does not parse: {bad:?}"));
        }
    }
    r
}

fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib / 1024.0)
}

fn percentile(v: &mut [f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[((v.len() - 1) as f64 * p).round() as usize])
}

fn metrics_text(agent: &ureq::Agent, url: &str) -> Option<String> {
    agent.get(format!("{}/metrics", url.trim_end_matches('/'))).call().ok()?.into_body().read_to_string().ok()
}

/// The value of an unlabelled metric in Prometheus text.
fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())
}

/// Reads one gauge (`frigg_slots`, `frigg_busy_slots`, …) from the server's /metrics (None for
/// other servers).
fn server_gauge(agent: &ureq::Agent, url: &str, name: &str) -> Option<u64> {
    metric_value(&metrics_text(agent, url)?, name).map(|v| v as u64)
}

/// The load: `streams` client threads for `duration`, a memory sampler for the soak, then the
/// report. Long on purpose: it reads top to bottom as the run happens, over state the client
/// threads, the sampler and the report share.
pub fn run(o: &LoadOptions) -> Result<LoadReport, String> {
    if !is_loopback(&o.url) {
        return Err(format!("{}: frigg bench load only targets loopback (http://127.0.0.1:PORT or http://localhost:PORT)", o.url));
    }
    if o.streams == 0 || o.streams > 256 || o.max_tokens.is_empty() {
        return Err("--streams must be 1..=256 and --max-tokens non-empty".into());
    }
    let config = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(3600))).http_status_as_error(true).build();
    let agent: ureq::Agent = config.into();
    let slots = server_gauge(&agent, &o.url, "frigg_slots");
    if let Some(pid) = o.server_pid {
        rss_mib(pid).ok_or_else(|| format!("--server-pid {pid}: no such process to sample"))?;
    }
    let sets = &mix_sets(slots.unwrap_or(1));
    let engine_before = EngineTime::read(&agent, &o.url);
    let load_before = crate::tools::bench::loadavg();
    let start = Instant::now();
    let deadline = start + o.duration;
    let clients_done = std::sync::atomic::AtomicBool::new(false);
    let mut rss_samples = vec![];
    let results: Vec<Vec<One>> = std::thread::scope(|s| {
        let sampler = o.server_pid.map(|pid| {
            let clients_done = &clients_done;
            s.spawn(move || {
                let mut samples = vec![];
                loop {
                    let last = clients_done.load(std::sync::atomic::Ordering::Relaxed);
                    if let Some(m) = rss_mib(pid) {
                        samples.push((start.elapsed().as_secs_f64(), m));
                    }
                    if last {
                        return samples;
                    }
                    std::thread::sleep(Duration::from_secs(2));
                }
            })
        });
        let handles: Vec<_> = (0..o.streams)
            .map(|k| {
                let agent = agent.clone();
                s.spawn(move || {
                    let mut out = vec![];
                    let mut i = 0;
                    while Instant::now() < deadline {
                        let mut one = one_request(&agent, o, sets, i, k);
                        one.end = unix_now();
                        out.push(one);
                        i += 1;
                    }
                    out
                })
            })
            .collect();
        let results = handles.into_iter().map(|h| h.join().unwrap_or_default()).collect();
        clients_done.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = sampler {
            rss_samples = h.join().unwrap_or_default();
        }
        results
    });
    let wall = start.elapsed().as_secs_f64();
    if let Some(path) = &o.log {
        let mut text = String::new();
        for (client, r) in results.iter().enumerate().flat_map(|(k, rs)| rs.iter().map(move |r| (k, r))) {
            let line = RequestLine { client, start: r.start, end: r.end, ok: r.ok, error: r.error.as_deref(), ttft_s: r.ttft, completion_tokens: r.completion_tokens };
            text.push_str(&serde_json::to_string(&line).map_err(|e| e.to_string())?);
            text.push('\n');
        }
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let engine = engine_before.zip(EngineTime::read(&agent, &o.url)).map(|(b, a)| EngineTime::between(b, a));
    let soak = o.server_pid.map(|pid| {
        // A finished request frees its slot within one decode step: give the server a moment.
        let mut busy = None;
        for _ in 0..20 {
            busy = server_gauge(&agent, &o.url, "frigg_busy_slots");
            if busy == Some(0) {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let warm = o.warmup.as_secs_f64();
        let after_warmup = rss_samples.iter().find(|(t, _)| *t >= warm).or(rss_samples.last()).map(|s| s.1).unwrap_or(f64::NAN);
        let end = rss_samples.last().map(|s| s.1).unwrap_or(f64::NAN);
        let all: Vec<&One> = results.iter().flatten().collect();
        SoakFigures {
            server_pid: pid,
            warmup_s: warm,
            rss_after_warmup_mib: after_warmup,
            rss_end_mib: end,
            rss_max_mib: rss_samples.iter().map(|s| s.1).fold(f64::NAN, f64::max),
            rss_growth_pct: (end - after_warmup) / after_warmup * 100.0,
            rss_samples: rss_samples.clone(),
            busy_slots_end: busy,
            queue_depth_end: server_gauge(&agent, &o.url, "frigg_queue_depth"),
            mix_counts: sets.iter().map(|(name, ..)| (name.to_string(), all.iter().filter(|r| r.set == *name).count())).filter(|(_, c)| *c > 0).collect(),
        }
    });
    let all: Vec<&One> = results.iter().flatten().collect();
    let mut ttfts: Vec<f64> = all.iter().filter_map(|r| r.ttft).collect();
    let completion_tokens: u64 = all.iter().map(|r| r.completion_tokens).sum();
    let errors: Vec<String> = all.iter().filter_map(|r| r.error.clone()).collect();
    Ok(LoadReport {
        label: o.label.clone(),
        url: o.url.clone(),
        streams: o.streams,
        duration_s: o.duration.as_secs_f64(),
        wall_s: wall,
        server_slots: slots,
        requests: all.len(),
        complete: all.iter().filter(|r| r.ok).count(),
        errors: errors.len(),
        error_samples: errors.into_iter().take(5).collect(),
        prompt_tokens: all.iter().map(|r| r.prompt_tokens).sum(),
        completion_tokens,
        aggregate_tok_s: completion_tokens as f64 / wall,
        ttft_p50_s: percentile(&mut ttfts, 0.5),
        ttft_p95_s: percentile(&mut ttfts, 0.95),
        machine: crate::tools::bench::machine(),
        load_before,
        load_after: crate::tools::bench::loadavg(),
        soak,
        engine,
    })
}

impl LoadReport {
    pub fn markdown_row(&self) -> String {
        let label = &self.label;
        format!(
            "| {label} | {} | {} | {:.0} s ({:.0} s wall) | {} | {} | {} | {} | **{:.2}** | {} | {} | {} | {:.2} → {:.2} |",
            self.server_slots.map(|s| s.to_string()).unwrap_or_else(|| "?".into()),
            self.streams,
            self.duration_s,
            self.wall_s,
            self.requests,
            self.complete,
            self.errors,
            self.completion_tokens,
            self.aggregate_tok_s,
            seconds(self.ttft_p50_s),
            seconds(self.ttft_p95_s),
            EngineTime::cell(self.engine.as_ref(), self.wall_s),
            self.load_before,
            self.load_after
        )
    }
}

/// For each run with several slots, compared with the one-slot run before it in `reports`: the
/// measured aggregate ratio, and the most the slots could give that one-slot workload if every
/// decode row of a step cost nothing beyond the first (prefill seconds unchanged, since every
/// stream waits during a prompt's prefill). From the one-slot run's engine time:
/// ceiling = (prefill + decode) / (prefill + decode / slots).
/// A duration cell: "1.23 s", or "–" when nothing was measured.
fn seconds(s: Option<f64>) -> String {
    s.map_or_else(|| "–".to_string(), |s| format!("{s:.2} s"))
}

pub fn slot_scaling_lines(reports: &[LoadReport]) -> Vec<String> {
    let mut lines = vec![];
    let mut one: Option<&LoadReport> = None;
    for r in reports {
        match r.server_slots {
            Some(1) => one = Some(r),
            Some(slots) if slots > 1 => {
                let Some(base) = one else { continue };
                let mut line = format!(
                    "- {} over {}: **{:.2}×** measured ({:.2} / {:.2} tok/s)",
                    r.label,
                    base.label,
                    r.aggregate_tok_s / base.aggregate_tok_s,
                    r.aggregate_tok_s,
                    base.aggregate_tok_s
                );
                if let Some(e) = &base.engine {
                    let ceiling = (e.prefill_s + e.decode_s) / (e.prefill_s + e.decode_s / slots as f64);
                    line += &format!(
                        "; ceiling with {slots} decode rows for the price of one: ({:.0} s + {:.0} s) / ({:.0} s + {:.0} s / {slots}) = **{ceiling:.2}×** (the one-slot run's prefill and decode seconds)",
                        e.prefill_s, e.decode_s, e.prefill_s, e.decode_s
                    );
                }
                lines.push(line + ".");
            }
            _ => {}
        }
    }
    lines
}

impl LoadReport {
    pub fn soak_row(&self) -> Option<String> {
        let s = self.soak.as_ref()?;
        let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "?".into());
        Some(format!(
            "| {} | {} | {} | {:.0} s ({:.0} s wall) | {} | {} | {} | {} | {:.0} MiB → {:.0} MiB (**{:+.1}%**, max {:.0}) | {} | {} | {:.2} → {:.2} |",
            self.label,
            self.server_slots.map(|s| s.to_string()).unwrap_or_else(|| "?".into()),
            self.streams,
            self.duration_s,
            self.wall_s,
            self.requests,
            self.complete,
            self.errors,
            self.completion_tokens,
            s.rss_after_warmup_mib,
            s.rss_end_mib,
            s.rss_growth_pct,
            s.rss_max_mib,
            opt(s.busy_slots_end),
            opt(s.queue_depth_end),
            self.load_before,
            self.load_after
        ))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn engine_time_is_read_from_prometheus_text() {
        let text = "# HELP frigg_prefill_seconds_total x\nfrigg_prefill_seconds_total 1.500000\nfrigg_prefill_seconds_total_other 9\nfrigg_decode_steps_total 12\n";
        assert_eq!(super::metric_value(text, "frigg_prefill_seconds_total"), Some(1.5));
        assert_eq!(super::metric_value(text, "frigg_decode_steps_total"), Some(12.0));
        assert_eq!(super::metric_value(text, "frigg_decode_rows_total"), None);
        let e = super::EngineTime::between(([1.0, 2.0, 10.0, 30.0], None), ([4.0, 12.0, 20.0, 70.0], Some(5.0)));
        assert_eq!((e.prefill_s, e.decode_s, e.decode_steps, e.decode_rows, e.padding_rows), (3.0, 10.0, 10, 40, None));
        assert_eq!(super::EngineTime::cell(Some(&e), 20.0), "3 s (15%) / 10 s (50%) · 4.00");
        let e = super::EngineTime::between(([1.0, 2.0, 10.0, 30.0], Some(1.0)), ([4.0, 12.0, 20.0, 70.0], Some(6.0)));
        assert_eq!(super::EngineTime::cell(Some(&e), 20.0), "3 s (15%) / 10 s (50%) · 4.00 (+0.50 padding)");
        assert_eq!(super::EngineTime::cell(None, 20.0), "–");
    }

    #[test]
    fn slot_scaling_compares_each_multi_slot_run_with_the_one_slot_run_before_it() {
        let run = |label: &str, slots: u64, tok_s: f64, engine: Option<(f64, f64)>| {
            let mut r: super::LoadReport = serde_json::from_value(serde_json::json!({
                "label": label, "url": "http://127.0.0.1:1", "streams": 16, "duration_s": 120.0, "wall_s": 200.0,
                "server_slots": slots, "requests": 1, "complete": 1, "errors": 0, "error_samples": [],
                "prompt_tokens": 1, "completion_tokens": 1, "aggregate_tok_s": tok_s, "ttft_p50_s": 0.0, "ttft_p95_s": 0.0,
                "machine": crate::tools::bench::machine(), "load_before": 0.0, "load_after": 0.0
            }))
            .unwrap();
            r.engine = engine.map(|(p, d)| super::EngineTime { prefill_s: p, decode_s: d, decode_steps: 1, decode_rows: 1, padding_rows: None });
            r
        };
        let lines = super::slot_scaling_lines(&[
            run("tiny, 16 slots", 16, 100.0, None), // no one-slot run before it: no line
            run("one", 1, 2.0, Some((80.0, 200.0))),
            run("four", 4, 3.0, Some((90.0, 100.0))),
        ]);
        assert_eq!(lines.len(), 1);
        // (80 + 200) / (80 + 200 / 4) = 280 / 130
        assert!(lines[0].starts_with("- four over one: **1.50×** measured (3.00 / 2.00 tok/s); ceiling"), "{}", lines[0]);
        assert!(lines[0].contains("= **2.15×**"), "{}", lines[0]);
    }

    #[test]
    fn a_run_that_streamed_no_text_has_no_ttft_and_still_renders() {
        // as `bench load` writes it when no request streamed any text: the percentiles are null
        let r: super::LoadReport = serde_json::from_value(serde_json::json!({
            "label": "random weights", "url": "http://127.0.0.1:1", "streams": 16, "duration_s": 120.0, "wall_s": 200.0,
            "server_slots": 1, "requests": 3, "complete": 3, "errors": 0, "error_samples": [],
            "prompt_tokens": 9, "completion_tokens": 48, "aggregate_tok_s": 0.24, "ttft_p50_s": null, "ttft_p95_s": null,
            "machine": crate::tools::bench::machine(), "load_before": 0.0, "load_after": 0.0
        }))
        .unwrap();
        assert_eq!((r.ttft_p50_s, r.ttft_p95_s), (None, None));
        assert!(r.markdown_row().contains("| **0.24** | – | – |"), "{}", r.markdown_row());
        assert_eq!(super::percentile(&mut [], 0.5), None);
        assert_eq!(super::percentile(&mut [3.0, 1.0, 2.0], 0.5), Some(2.0));
    }

    #[test]
    fn only_loopback_urls_are_targets() {
        assert!(super::is_loopback("http://127.0.0.1:8080"));
        assert!(super::is_loopback("http://localhost:1/v1"));
        assert!(!super::is_loopback("http://10.0.0.1:8080"));
        assert!(!super::is_loopback("https://api.openai.com"));
        assert!(!super::is_loopback("http://127.0.0.1.evil.com:80"));
    }
}
