//! `frigg bench load`: a bounded HTTP load generator for an OpenAI-compatible server on
//! loopback. N clients each stream chat completions back to back until the duration is up
//! (requests in flight then finish), with mixed prompts and lengths; every response is checked
//! complete (a finish reason, usage, `[DONE]`, no error event).

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
    pub ttft_p50_s: f64,
    pub ttft_p95_s: f64,
    pub machine: crate::bench::Machine,
    pub load_before: f64,
    pub load_after: f64,
}

const PROMPTS: &[&str] = &[
    "Hvad er hovedstaden i Danmark?",
    "Write one sentence about the sea.",
    "Forklar kort, hvorfor himlen er blå, og giv et eksempel fra hverdagen.",
    "List three colours.",
    "Hvad er 7 plus 8? Svar med et tal og forklar derefter regnestykket trin for trin, så et barn kan forstå det.",
    "Tell me a short story about a fox, a crow and a piece of cheese, in plain English.",
];

struct One {
    ok: bool,
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

fn one_request(agent: &ureq::Agent, o: &LoadOptions, i: usize, stream_no: usize) -> One {
    let mut r = One { ok: false, error: None, ttft: None, prompt_tokens: 0, completion_tokens: 0 };
    let body = serde_json::json!({
        "model": "frigg",
        "messages": [{"role": "user", "content": PROMPTS[(i + stream_no) % PROMPTS.len()]}],
        "max_tokens": o.max_tokens[(i * 7 + stream_no) % o.max_tokens.len()],
        "temperature": 0.8,
        "seed": (stream_no * 1000 + i) as u64,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
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
    let reader = std::io::BufReader::new(resp.into_body().into_reader());
    let (mut finished, mut done, mut usage) = (false, false, false);
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
        if let Some(c) = v["choices"].get(0) {
            if r.ttft.is_none() && c["delta"]["content"].as_str().is_some_and(|s| !s.is_empty()) {
                r.ttft = Some(t0.elapsed().as_secs_f64());
            }
            if c["finish_reason"].is_string() {
                finished = true;
            }
        }
    }
    r.ok = finished && done && usage;
    if !r.ok {
        r.error = Some(format!("incomplete response (finish_reason {finished}, usage {usage}, [DONE] {done})"));
    }
    r
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Reads `frigg_slots` from the server's /metrics (None for other servers).
fn server_slots(agent: &ureq::Agent, url: &str) -> Option<u64> {
    let text = agent.get(format!("{}/metrics", url.trim_end_matches('/'))).call().ok()?.into_body().read_to_string().ok()?;
    text.lines().find_map(|l| l.strip_prefix("frigg_slots ")).and_then(|v| v.trim().parse().ok())
}

pub fn run(o: &LoadOptions) -> Result<LoadReport, String> {
    if !is_loopback(&o.url) {
        return Err(format!("{}: frigg bench load only targets loopback (http://127.0.0.1:PORT or http://localhost:PORT)", o.url));
    }
    if o.streams == 0 || o.streams > 256 || o.max_tokens.is_empty() {
        return Err("--streams must be 1..=256 and --max-tokens non-empty".into());
    }
    let config = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(3600))).http_status_as_error(true).build();
    let agent: ureq::Agent = config.into();
    let slots = server_slots(&agent, &o.url);
    let load_before = crate::bench::loadavg();
    let start = Instant::now();
    let deadline = start + o.duration;
    let results: Vec<Vec<One>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..o.streams)
            .map(|k| {
                let agent = agent.clone();
                s.spawn(move || {
                    let mut out = vec![];
                    let mut i = 0;
                    while Instant::now() < deadline {
                        out.push(one_request(&agent, o, i, k));
                        i += 1;
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    let wall = start.elapsed().as_secs_f64();
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
        machine: crate::bench::machine(),
        load_before,
        load_after: crate::bench::loadavg(),
    })
}

impl LoadReport {
    pub fn markdown_row(&self) -> String {
        let label = &self.label;
        format!(
            "| {label} | {} | {} | {:.0} s ({:.0} s wall) | {} | {} | {} | {} | **{:.2}** | {:.2} s | {:.2} s | {:.2} → {:.2} |",
            self.server_slots.map(|s| s.to_string()).unwrap_or_else(|| "?".into()),
            self.streams,
            self.duration_s,
            self.wall_s,
            self.requests,
            self.complete,
            self.errors,
            self.completion_tokens,
            self.aggregate_tok_s,
            self.ttft_p50_s,
            self.ttft_p95_s,
            self.load_before,
            self.load_after
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_loopback_urls_are_targets() {
        assert!(super::is_loopback("http://127.0.0.1:8080"));
        assert!(super::is_loopback("http://localhost:1/v1"));
        assert!(!super::is_loopback("http://10.0.0.1:8080"));
        assert!(!super::is_loopback("https://api.openai.com"));
        assert!(!super::is_loopback("http://127.0.0.1.evil.com:80"));
    }
}
