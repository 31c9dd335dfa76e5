//! Prometheus text for `/metrics`: HTTP requests by status, the engine replicas' counters and
//! gauges, and latency histograms.

use super::scheduler::Stats;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Fixed-bucket histogram.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    total: AtomicU64,
}

pub const LATENCY_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(), sum_micros: AtomicU64::new(0), total: AtomicU64::new(0) }
    }

    pub fn observe(&self, secs: f64) {
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

/// What the HTTP front counts itself.
#[derive(Debug)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<u16, u64>>,
    pub ttft: Histogram,
    pub per_token: Histogram,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        HttpMetrics { requests: Default::default(), ttft: Histogram::new(LATENCY_BUCKETS), per_token: Histogram::new(LATENCY_BUCKETS) }
    }
}

impl HttpMetrics {
    pub fn count(&self, status: u16) {
        *self.requests.lock().expect("metrics lock").entry(status).or_default() += 1;
    }

    /// The whole exposition: HTTP counts, then the replicas' counters summed, then histograms.
    /// `slots` is per replica.
    pub fn render(&self, replicas: &[std::sync::Arc<Stats>], slots: usize) -> String {
        let mut out = String::new();
        out.push_str("# HELP frigg_requests_total HTTP requests by status.\n# TYPE frigg_requests_total counter\n");
        for (status, n) in self.requests.lock().expect("metrics lock").iter() {
            out.push_str(&format!("frigg_requests_total{{status=\"{status}\"}} {n}\n"));
        }
        let sum = |f: fn(&Stats) -> usize| replicas.iter().map(|r| f(r)).sum::<usize>();
        for (name, help, ty, v) in [
            ("frigg_prompt_tokens_total", "Prompt tokens prefilled.", "counter", sum(|r| r.prompt_tokens.load(Ordering::Relaxed))),
            ("frigg_generated_tokens_total", "Tokens generated.", "counter", sum(|r| r.generated_tokens.load(Ordering::Relaxed))),
            ("frigg_queue_depth", "Requests waiting for a slot.", "gauge", sum(|r| r.queued.load(Ordering::Relaxed))),
            ("frigg_busy_slots", "Sequences decoding.", "gauge", sum(|r| r.busy_slots.load(Ordering::Relaxed))),
            ("frigg_running_requests", "Requests being served: admitted, not finished (n choices count once).", "gauge", sum(|r| r.running.load(Ordering::Relaxed))),
            ("frigg_slots", "Sequences decoded together at most (all replicas).", "gauge", slots * replicas.len()),
            ("frigg_replicas", "Engine replicas behind this endpoint.", "gauge", replicas.len()),
            ("frigg_decode_steps_total", "Decode steps (one batched forward each).", "counter", sum(|r| r.decode_steps.load(Ordering::Relaxed))),
            ("frigg_decode_rows_total", "Sequences carried by decode steps (rows / steps = mean batch).", "counter", sum(|r| r.decode_rows.load(Ordering::Relaxed))),
            ("frigg_decode_padding_rows_total", "Rows decode steps computed for free streams below a live one (logits dropped).", "counter", sum(|r| r.decode_padding_rows.load(Ordering::Relaxed))),
        ] {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {ty}\n{name} {v}\n"));
        }
        let cells = sum(|r| r.kv_cells.load(Ordering::Relaxed));
        let usage = if cells == 0 { 0.0 } else { sum(|r| r.kv_cells_used.load(Ordering::Relaxed)) as f64 / cells as f64 };
        out.push_str(&format!(
            "# HELP frigg_kv_cache_usage_ratio KV-cache cells holding live sequences over all cells (all replicas), 0 to 1.\n# TYPE frigg_kv_cache_usage_ratio gauge\nfrigg_kv_cache_usage_ratio {usage:.6}\n"
        ));
        let seconds = |f: fn(&Stats) -> u64| replicas.iter().map(|r| f(r)).sum::<u64>() as f64 / 1e6;
        for (name, help, v) in [
            ("frigg_prefill_seconds_total", "Engine time in prompt prefills.", seconds(|r| r.prefill_us.load(Ordering::Relaxed))),
            ("frigg_decode_seconds_total", "Engine time in decode steps.", seconds(|r| r.decode_us.load(Ordering::Relaxed))),
        ] {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n{name} {v:.6}\n"));
        }
        let graphs: Vec<crate::engine::GraphStats> = replicas.iter().map(|r| *r.graphs.lock().expect("stats lock")).collect();
        let total = |f: fn(&crate::engine::GraphStats) -> u64| graphs.iter().map(f).sum::<u64>();
        // ggml-cuda's log counts are process-wide: every replica reports the same, so once.
        let cuda = graphs.iter().map(|g| g.cuda).max_by_key(|c| c.captures + c.resets + c.reuses).unwrap_or_default();
        for (name, help, v) in [
            ("frigg_graph_builds_total{kind=\"prefill\"}", "Compute graphs built, by forward kind.", total(|g| g.prefill_builds)),
            ("frigg_graph_builds_total{kind=\"decode\"}", "", total(|g| g.decode_builds)),
            ("frigg_graph_allocations_total", "Graphs given addresses in the compute buffers (a reused decode graph is not).", total(|g| g.allocations)),
            ("frigg_compute_buffer_growths_total", "Allocations that grew a compute buffer past what load reserved (0 when the reservation holds).", total(|g| g.buffer_growths)),
            ("frigg_decode_graph_reuses_total", "Decode steps that ran the previous step's graph as built and allocated.", total(|g| g.decode_reuses)),
            ("frigg_decode_graph_changes_total", "Reused decode steps whose nodes or addresses changed (what makes ggml-cuda capture again; 0 expected).", total(|g| g.decode_changes)),
            ("frigg_cuda_graph_captures_total", "CUDA graphs ggml-cuda captured (its log; 0 off CUDA).", cuda.captures),
            ("frigg_cuda_graph_resets_total", "Captured CUDA graphs whose nodes changed, so ggml-cuda ran them uncaptured again (its log).", cuda.resets),
            ("frigg_cuda_graph_reuses_total", "Graph splits ggml-cuda replayed as captured (its log).", cuda.reuses),
        ] {
            let family = name.split('{').next().unwrap_or(name);
            if !help.is_empty() {
                out.push_str(&format!("# HELP {family} {help}\n# TYPE {family} counter\n"));
            }
            out.push_str(&format!("{name} {v}\n"));
        }
        out.push_str("# HELP frigg_replica_requests_total Requests routed to each replica.\n# TYPE frigg_replica_requests_total counter\n");
        for (i, r) in replicas.iter().enumerate() {
            out.push_str(&format!("frigg_replica_requests_total{{replica=\"{i}\"}} {}\n", r.routed.load(Ordering::Relaxed)));
        }
        self.ttft.render("frigg_time_to_first_token_seconds", "Enqueue to first token.", &mut out);
        self.per_token.render("frigg_time_per_output_token_seconds", "Mean time per generated token after the first, per request.", &mut out);
        out
    }
}
