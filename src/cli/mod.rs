use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use frigg::convert::{self, ConvertOptions, OutType};
use frigg::engine::{Engine, EngineOptions};
use frigg::engine::KvType;
use frigg::generate::sampler::SamplingParams;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod variant;

/// A library enum as a clap value: its names (and aliases) are the possible values.
trait Choice: Copy + Send + Sync + 'static {
    const ALL: &'static [Self];
    fn name(self) -> &'static str;
    fn aliases(self) -> &'static [&'static str] {
        &[]
    }
}

impl Choice for KvType {
    const ALL: &'static [Self] = &KvType::ALL;
    fn name(self) -> &'static str {
        KvType::name(self)
    }
}

impl Choice for OutType {
    const ALL: &'static [Self] = &OutType::ALL;
    fn name(self) -> &'static str {
        OutType::name(self)
    }
    fn aliases(self) -> &'static [&'static str] {
        if self == OutType::Q4K {
            &["q4_k_m"]
        } else {
            &[]
        }
    }
}

impl Choice for frigg::tools::eval::Task {
    const ALL: &'static [Self] = &frigg::tools::eval::Task::ALL;
    fn name(self) -> &'static str {
        frigg::tools::eval::Task::name(self)
    }
}

impl Choice for frigg::tools::eval::Arm {
    const ALL: &'static [Self] = &frigg::tools::eval::Arm::ALL;
    fn name(self) -> &'static str {
        frigg::tools::eval::Arm::name(self)
    }
}

fn choice<T: Choice>() -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::TypedValueParser;
    let values = T::ALL.iter().map(|t| clap::builder::PossibleValue::new(t.name()).aliases(t.aliases().iter().copied()));
    clap::builder::PossibleValuesParser::new(values).map(|s| *T::ALL.iter().find(|t| t.name() == s || t.aliases().contains(&s.as_str())).expect("clap checked the value"))
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Device {
    Cpu,
    /// The first GPU backend compiled in (builds with --features cuda/vulkan/metal).
    #[value(alias = "cuda")]
    Gpu,
}

/// `bench matrix --kernels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Kernels {
    /// ggml's reference kernels (what an engine with several streams uses by default).
    Invariant,
    /// Tiled GEMM (what one-stream engines and --batched-kernels use).
    Batched,
}

/// Where and how a model runs.
#[derive(Debug, Clone, Args)]
struct RunnerArgs {
    /// Compute threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Context length per sequence (default and maximum: the model's).
    #[arg(long)]
    ctx: Option<usize>,
    /// KV-cache element type.
    #[arg(long, value_parser = choice::<KvType>(), default_value = "f16")]
    kv_type: KvType,
    #[arg(long, value_enum, default_value = "cpu")]
    device: Device,
    /// Apply transformers' fix_mistral_regex pre-tokenizer patch (off: the reference and
    /// Mimir's training data use the raw tokenizer.json; see docs).
    #[arg(long)]
    tokenizer_mistral_regex: bool,
    /// Decode batches with ggml's batched GEMM kernels, or its reference ones where those time
    /// faster at load (faster with several sequences on most CPUs; a sequence's logits may then
    /// depend on what it is batched with). Default: batch-invariant.
    #[arg(long)]
    batched_kernels: bool,
}

impl RunnerArgs {
    fn engine_options(&self, n_stream: usize) -> Result<EngineOptions, String> {
        let gpu = self.device == Device::Gpu;
        let mut o = EngineOptions { n_ctx: self.ctx.unwrap_or(0), n_stream, kv_type: self.kv_type, gpu, batch_invariant: !self.batched_kernels, ..Default::default() }.levers_from_env();
        if let Some(t) = self.threads {
            o.threads = t.max(1);
        }
        Ok(o)
    }
}

/// Sampling flags (OpenAI names).
#[derive(Debug, Clone, Args)]
struct SamplingArgs {
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
}

impl SamplingArgs {
    fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: vec![],
        }
    }
}

/// frigg: inference engine for HRM-Text (DFM-Mimir) on ggml.
#[derive(Debug, Parser)]
#[command(name = "frigg")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Convert a Hugging Face HRM-Text checkpoint directory into one GGUF file.
    Convert {
        /// Checkpoint directory: config.json, model.safetensors (or shards + index),
        /// tokenizer.json, tokenizer_config.json, generation_config.json.
        checkpoint: PathBuf,
        /// Output GGUF path (written atomically: a temporary file beside it is renamed on success).
        #[arg(short, long)]
        output: PathBuf,
        /// Weight type. q4_k is a mixed recipe like llama.cpp's Q4_K_M.
        #[arg(long = "type", value_parser = choice::<OutType>(), default_value = "bf16")]
        out_type: OutType,
        /// Threads for quantization (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// general.name to record (default: the checkpoint's name).
        #[arg(long)]
        name: Option<String>,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Generate text: streams to stdout, prefill and decode speed to stderr.
    Run {
        model: PathBuf,
        /// A user message (rendered with the chat template unless --raw).
        #[arg(short, long, conflicts_with = "chat", required_unless_present = "chat")]
        prompt: Option<String>,
        /// A conversation: one JSON message per line ({"role": ..., "content": ...}).
        #[arg(long)]
        chat: Option<PathBuf>,
        /// Encode the prompt as plain text (<bos> + text), no chat template.
        #[arg(long, requires = "prompt")]
        raw: bool,
        #[arg(long, default_value_t = 256)]
        max_tokens: usize,
        /// Keep going past end-of-turn tokens.
        #[arg(long)]
        ignore_eos: bool,
        /// Stop when this text appears (repeatable); it is not printed.
        #[arg(long)]
        stop: Vec<String>,
        /// Read the prompt causally (token_type_ids 0) instead of as Mimir's bidirectional
        /// PrefixLM prefix; exists to measure what ignoring the mask costs.
        #[arg(long)]
        causal_prompt: bool,
        /// Print one JSON object with the text, tokens, finish reason and timings.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        runner: RunnerArgs,
        #[command(flatten)]
        sampling: SamplingArgs,
    },
    /// The parity contract: run fixed cases and write last-row logits, argmaxes, greedy tokens.
    Logits {
        model: PathBuf,
        /// JSONL: {"id", "input_ids", "token_type_ids" (or null), "max_new", optional "mode": "verify", "prefix_len"}.
        #[arg(long)]
        cases: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Also write each case's full last-row logits.
        #[arg(long)]
        full_logits: bool,
        /// Dump intermediate tensors (named v<virtual layer>.<role>) as .npy files into this directory.
        #[arg(long)]
        dump_dir: Option<PathBuf>,
        /// Only dump tensors whose name contains this (e.g. "v000." or "stack_norm").
        #[arg(long, default_value = "")]
        dump_filter: String,
        #[command(flatten)]
        runner: RunnerArgs,
    },
    /// Compare every tier (weights f32, bf16, q8_0, q4_0; KV caches f32, f16, q8_0) against the
    /// committed transformers goldens; on a GPU, also against the CPU on the same file.
    Parity {
        /// Directory with ckpt/<fixture>/ and goldens/<fixture>.jsonl.
        #[arg(long, default_value = "tests/fixtures")]
        fixtures: PathBuf,
        /// Reference margins below this are ties and are not judged.
        #[arg(long, default_value_t = 1e-3)]
        eps: f32,
        /// Write the reports as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Regenerate the table between the parity markers of this markdown file (docs/parity.md).
        #[arg(long)]
        markdown: Option<PathBuf>,
        /// The table's marker pair in --markdown: <!-- KEY:begin --> … <!-- KEY:end -->.
        #[arg(long, default_value = "parity")]
        key: String,
        /// Only these tiers (names as in the table: f32, f32-kv-f16, …); default all.
        #[arg(long, value_delimiter = ',')]
        tiers: Vec<String>,
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// gpu: ggml's first GPU device (a build with one; on a CPU-type Vulkan device such as
        /// lavapipe, GGML_VK_VISIBLE_DEVICES=0 must name it).
        #[arg(long, value_enum, default_value = "cpu")]
        device: Device,
    },
    /// Serve an OpenAI-compatible API (chat/completions, completions, models, health, metrics,
    /// tokenize, detokenize) with continuous batching. Without MODEL: the bundled demo model.
    Serve {
        model: Option<PathBuf>,
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Sequences decoded together (each holds a KV stream of --ctx positions).
        #[arg(long, default_value_t = 4)]
        slots: usize,
        /// Requests waiting beyond the slots; more get 429.
        #[arg(long, default_value_t = 16)]
        queue: usize,
        /// Require this key (Authorization: Bearer KEY). Needed to listen beyond loopback.
        #[arg(long, conflicts_with = "api_key_file")]
        api_key: Option<String>,
        /// Read the API key from this file (first line).
        #[arg(long)]
        api_key_file: Option<PathBuf>,
        /// Send CORS headers allowing this origin (off by default).
        #[arg(long)]
        cors_origin: Option<String>,
        /// The model id reported by /v1/models and in responses.
        #[arg(long)]
        alias: Option<String>,
        /// Largest request body in bytes (larger: 413).
        #[arg(long, default_value_t = 4 << 20)]
        max_body: usize,
        /// One engine replica per entry behind this endpoint, least-loaded routing: GPU
        /// indices (`0,1`, CUDA builds) or `cpu` (each CPU replica loads its own weights).
        #[arg(long)]
        devices: Option<String>,
        /// Seconds after SIGTERM during which requests are still served while /health
        /// answers 503, so load balancers notice before the listener closes.
        #[arg(long, default_value_t = 0.0)]
        drain_delay: f64,
        /// Seconds requests in flight may run once no new ones are accepted; those still
        /// running then end with an error and frigg exits non-zero.
        #[arg(long, default_value_t = 600.0)]
        drain_timeout: f64,
        /// Who may read /metrics: `auto` (open on loopback, the API key elsewhere), `key`, or
        /// `open` (no key, e.g. for an in-cluster Prometheus).
        #[arg(long, default_value = "auto", value_parser = ["auto", "key", "open"])]
        metrics_auth: String,
        #[command(flatten)]
        runner: RunnerArgs,
    },
    /// Benchmarks (commands, not tests).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Task accuracy: frigg with the PrefixLM prompt, with a causal prompt, and llama.cpp, on the same files.
    Eval {
        models: Vec<PathBuf>,
        #[arg(long, value_parser = choice::<frigg::tools::eval::Task>(), default_value = "demo-qa")]
        task: frigg::tools::eval::Task,
        /// JSONL items (default for demo-qa: tests/fixtures/demo/heldout.jsonl).
        #[arg(long)]
        data: Option<PathBuf>,
        #[arg(long, value_parser = choice::<frigg::tools::eval::Arm>(), value_delimiter = ',', default_value = "prefix,causal,llama")]
        arms: Vec<frigg::tools::eval::Arm>,
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Greedy tokens per answer (default 16 for demo-qa, 256 for gsm8k).
        #[arg(long)]
        max_tokens: Option<usize>,
        /// Only the first N items.
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write the table into this markdown file between <!-- bench:KEY:begin/end --> markers.
        #[arg(long)]
        markdown: Option<PathBuf>,
        #[arg(long, default_value = "eval")]
        key: String,
    },
    /// Show a GGUF's metadata, tensors and whether frigg can run it.
    Inspect {
        file: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// HTTP load on an OpenAI-compatible server on loopback: N streaming clients for a while.
    Load {
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        #[arg(long, default_value_t = 16)]
        streams: usize,
        /// Seconds during which clients start new requests (those in flight then finish).
        #[arg(long, default_value_t = 120.0)]
        duration: f64,
        /// max_tokens per request, cycled through.
        #[arg(long, value_delimiter = ',', default_value = "16,32,64")]
        max_tokens: Vec<usize>,
        #[arg(long)]
        api_key: Option<String>,
        /// Names the run in tables.
        #[arg(long, default_value = "load")]
        label: String,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Vary the parameters per request (greedy+stop, top_p/top_k+penalties, logprobs, n,
        /// non-streamed, json_object, logit_bias).
        #[arg(long)]
        mix: bool,
        /// The soak: sample this server process's resident memory, and read its busy slots
        /// and queue from /metrics at the end (it must be on this machine).
        #[arg(long)]
        server_pid: Option<u32>,
        /// Seconds of warm-up before the soak's memory baseline.
        #[arg(long, default_value_t = 60.0)]
        warmup: f64,
        /// Write one JSON line per request (client, start and end as Unix seconds, ok, error,
        /// time to first token, tokens): a timeline to line faults up with.
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Decode aggregate tok/s and prefill tok/s per (model, batch, context, KV type) cell.
    Matrix {
        models: Vec<PathBuf>,
        #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
        batches: Vec<usize>,
        /// Positions already in each sequence when decode is timed.
        #[arg(long, value_delimiter = ',', default_value = "512")]
        contexts: Vec<usize>,
        #[arg(long, value_parser = choice::<KvType>(), value_delimiter = ',', default_value = "f16")]
        kv_types: Vec<KvType>,
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Decode steps timed per repetition.
        #[arg(long, default_value_t = 8)]
        steps: usize,
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Prompt lengths for the prefill columns, comma-separated (0: no prefill).
        #[arg(long, value_delimiter = ',', default_value = "128")]
        prefill: Vec<usize>,
        /// frigg's CPU decode kernels to time: `invariant` (ggml's reference kernels, what an
        /// engine with several streams uses by default), `batched` (tiled GEMM, what one-stream
        /// engines and --batched-kernels use), or both.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "invariant")]
        kernels: Vec<Kernels>,
        /// Time llama.cpp's hrm_text on the same file and cells, alternated with frigg.
        #[arg(long, value_parser = ["llama.cpp"])]
        vs: Option<String>,
        /// gpu: frigg's weights, cache and graphs on the first GPU, and llama.cpp's with every
        /// layer offloaded.
        #[arg(long, value_enum, default_value = "cpu")]
        device: Device,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Constrained decoding's cost: decode steps sampled free and held to a JSON Schema
    /// (masks computed beside each forward), alternated, per batch size.
    Grammar(GrammarArgs),
    /// The machine's read bandwidth with all threads: the decode ceiling.
    Bandwidth {
        #[arg(long)]
        threads: Option<usize>,
        /// Buffer size in GiB (at least 2, so caches do not count).
        #[arg(long, default_value_t = 2.0)]
        gib: f64,
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
    /// Bytes a decode step reads (L stack × L_cycles × H_cycles, H stack × H_cycles, lm_head,
    /// KV at --ctx) and the tok/s that bandwidth allows.
    Ceiling(CeilingArgs),
    /// The decode matmul at each column count (streams per step) on the model's own weights:
    /// frigg's kernel against ggml's reference and fast kernels, alternated.
    Matmul(MatmulArgs),
    /// Writes tables from benchmark JSON into a markdown file (between bench:KEY markers).
    Render(RenderArgs),
    /// frigg vs llama.cpp's own hrm_text on the same GGUF files, alternated in one process.
    Compare(CompareArgs),
}

/// `frigg bench grammar`'s arguments.
#[derive(Debug, clap::Args)]
struct GrammarArgs {
    model: PathBuf,
    /// The JSON Schema (a file); default: an object with a bounded string, an enum, an
    /// integer range, an array and a nested object.
    #[arg(long)]
    schema: Option<PathBuf>,
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    batches: Vec<usize>,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 16)]
    steps: usize,
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Positions in each sequence before the timed steps.
    #[arg(long, default_value_t = 64)]
    context: usize,
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the table into this markdown file (between bench:grammar markers).
    #[arg(long)]
    markdown: Option<PathBuf>,
}

/// `frigg bench ceiling`'s arguments.
#[derive(Debug, clap::Args)]
struct CeilingArgs {
    models: Vec<PathBuf>,
    #[arg(long, value_delimiter = ',', default_value = "512")]
    ctx: Vec<usize>,
    /// Sequences decoded together (each row: the weights once, every sequence's cache).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    batches: Vec<usize>,
    #[arg(long, value_parser = choice::<KvType>(), default_value = "f16")]
    kv_type: KvType,
    /// Bandwidth in GB/s (default: measure it now, as `bench bandwidth` does).
    #[arg(long)]
    bandwidth: Option<f64>,
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the table into this markdown file (between bench:ceiling markers).
    #[arg(long)]
    markdown: Option<PathBuf>,
}

/// `frigg bench matmul`'s arguments.
#[derive(Debug, clap::Args)]
struct MatmulArgs {
    models: Vec<PathBuf>,
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    columns: Vec<usize>,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Rounds, each timing every column count and arm in rotated order; each (count, arm)
    /// keeps its fastest round.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// MiB of weights timed (whole layers from the first): more than the CPU caches, as a
    /// decode step streams them.
    #[arg(long, default_value_t = 512)]
    mib: usize,
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the table into this markdown file (between bench:matmul-columns markers).
    #[arg(long)]
    markdown: Option<PathBuf>,
}

/// `frigg bench render`'s arguments.
#[derive(Debug, clap::Args)]
struct RenderArgs {
    /// `frigg bench load --json` reports, one row each.
    #[arg(long, num_args = 1..)]
    load: Vec<PathBuf>,
    /// `frigg bench matrix --json` reports, one row per cell.
    #[arg(long, num_args = 1..)]
    matrix: Vec<PathBuf>,
    /// `frigg bench matmul --json` reports, one row per file and column count.
    #[arg(long, num_args = 1..)]
    matmul: Vec<PathBuf>,
    #[arg(long, default_value = "docs/benchmarks.md")]
    markdown: PathBuf,
    #[arg(long, default_value = "load")]
    key: String,
}

/// `frigg bench compare`'s arguments.
#[derive(Debug, clap::Args)]
struct CompareArgs {
    models: Vec<PathBuf>,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Prompt tokens (one prefill forward: frigg PrefixLM, llama.cpp causal).
    #[arg(long, default_value_t = 256)]
    prompt: usize,
    /// Decode steps timed after the prefill.
    #[arg(long, default_value_t = 32)]
    decode: usize,
    /// Alternated repetitions per arm (after one warm-up each).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    #[arg(long, value_parser = choice::<KvType>(), default_value = "f16")]
    kv_type: KvType,
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the table into this markdown file between <!-- bench:KEY:begin/end --> markers.
    #[arg(long)]
    markdown: Option<PathBuf>,
    #[arg(long, default_value = "compare")]
    key: String,
}

fn bench(cmd: BenchCommand) -> Result<(), String> {
    match cmd {
        BenchCommand::Load { url, streams, duration, max_tokens, api_key, label, json, mix, server_pid, warmup, log } => {
            let o = frigg::tools::loadgen::LoadOptions { label, url, streams, duration: seconds(duration, "--duration")?, max_tokens, api_key, mix, server_pid, warmup: seconds(warmup, "--warmup")?, log };
            let r = frigg::tools::loadgen::run(&o)?;
            println!("{}", r.soak_row().unwrap_or_else(|| r.markdown_row()));
            if let Some(p) = json {
                write_json(&p, &r)?;
            }
            if r.errors > 0 {
                return Err(format!("{} of {} requests failed, e.g. {:?}", r.errors, r.requests, r.error_samples));
            }
            Ok(())
        }
        BenchCommand::Matrix { models, batches, contexts, kv_types, threads, steps, reps, prefill, kernels, vs, device, json } => {
            let kernels = kernels.iter().map(|&k| k == Kernels::Invariant).collect();
            let levers = EngineOptions::default().levers_from_env();
            let o = frigg::tools::bench::MatrixOptions { models, batches, contexts, kv_types, threads, steps, reps, prefill, kernels, vs_llama: vs.is_some(), gpu: device == Device::Gpu, levers };
            println!("{}", frigg::tools::bench::MatrixCell::markdown_header(o.vs_llama));
            let cells = frigg::tools::bench::matrix(&o, |c| println!("{}", c.markdown_row()))?;
            if let Some(p) = json {
                write_json(&p, &cells)?;
            }
            Ok(())
        }
        BenchCommand::Grammar(a) => bench_grammar(a),
        BenchCommand::Bandwidth { threads, gib, reps } => {
            let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
            if gib < 2.0 {
                return Err("--gib must be at least 2 (smaller buffers measure caches, not memory)".into());
            }
            let bw = frigg::tools::bench::bandwidth(threads, (gib * (1u64 << 30) as f64) as usize, reps);
            let m = frigg::tools::bench::machine();
            println!("{:.1} GB/s read bandwidth (best of {reps} passes over {gib} GiB, {threads} threads) on {} · {} cores · load {:.2}", bw / 1e9, m.cpu, m.cores, frigg::tools::bench::loadavg());
            Ok(())
        }
        BenchCommand::Ceiling(a) => bench_ceiling(a),
        BenchCommand::Matmul(a) => bench_matmul(a),
        BenchCommand::Render(a) => bench_render(a),
        BenchCommand::Compare(a) => bench_compare(a),
    }
}

fn bench_grammar(a: GrammarArgs) -> Result<(), String> {
    let GrammarArgs { model, schema, batches, threads, steps, reps, context, json, markdown } = a;
    let (schema, schema_name) = match &schema {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let v = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
            (v, p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default())
        }
        None => (
            serde_json::json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
                "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["lat", "lon"], "additionalProperties": false}},
                "required": ["city", "unit", "days", "tags", "where"], "additionalProperties": false}),
            "weather (built in)".to_string(),
        ),
    };
    let o = frigg::tools::bench::GrammarOptions { model, schema, schema_name, batches, threads, steps, reps, context };
    let cells = frigg::tools::bench::grammar(&o)?;
    let mut lines = vec![frigg::tools::bench::GrammarCell::markdown_header().to_string()];
    lines.extend(cells.iter().map(|c| c.markdown_row()));
    println!("{}", lines.join("\n"));
    if let Some(p) = markdown {
        let m = frigg::tools::bench::machine();
        let cmd: Vec<String> = std::env::args().collect();
        let body = format!("Generated by `{}` ({})\n\nMachine: {}.\n\n{}", cmd.join(" "), frigg::long_version(), m.describe(), lines.join("\n"));
        frigg::tools::bench::write_markdown_block(&p, "grammar", &body)?;
    }
    if let Some(p) = json {
        write_json(&p, &cells)?;
    }
    Ok(())
}

fn bench_ceiling(a: CeilingArgs) -> Result<(), String> {
    let CeilingArgs { models, ctx, batches, kv_type, bandwidth, json, markdown } = a;
    if batches.contains(&0) {
        return Err("--batches: a batch holds at least one sequence".into());
    }
    let bw = match bandwidth {
        Some(gbs) => gbs * 1e9,
        None => frigg::tools::bench::bandwidth(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), 2 << 30, 5),
    };
    let m = frigg::tools::bench::machine();
    let mut lines = vec![
        format!(
            "Bandwidth {:.1} GB/s{} on {} · load {:.2}.\n",
            bw / 1e9,
            if bandwidth.is_some() { " (given)" } else { " (measured: 2 GiB, all threads, best of 5)" },
            m.describe(),
            frigg::tools::bench::loadavg()
        ),
        "| file | ctx | KV | batch | L stack × passes | H stack × passes | lm_head | KV read (every sequence) | bytes/step | ceiling tok/s (aggregate) | × batch 1 |\n|---|---|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    let mut all = vec![];
    let mib = |b: u64| format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64);
    for m in &models {
        for &n in &ctx {
            let one = frigg::tools::bench::ceiling(m, n, 1, kv_type, bw)?;
            for &b in &batches {
                let c = frigg::tools::bench::ceiling(m, n, b, kv_type, bw)?;
                let file = m.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
                lines.push(format!(
                    "| {file} | {n} | {} | {b} | {} × {} | {} × {} | {} | {} | {} | **{:.2}** | {:.2}× |",
                    c.kv_type,
                    mib(c.l_stack_bytes),
                    c.l_passes,
                    mib(c.h_stack_bytes),
                    c.h_passes,
                    mib(c.lm_head_bytes),
                    mib(c.kv_bytes),
                    mib(c.total_bytes),
                    c.ceiling_tok_s,
                    c.ceiling_tok_s / one.ceiling_tok_s
                ));
                all.push(c);
            }
        }
    }
    println!("{}", lines.join("\n"));
    if let Some(p) = markdown {
        let cmd: Vec<String> = std::env::args().collect();
        frigg::tools::bench::write_markdown_block(&p, "ceiling", &format!("Generated by `{}`\n\n{}", cmd.join(" "), lines.join("\n")))?;
    }
    if let Some(p) = json {
        write_json(&p, &all)?;
    }
    Ok(())
}

fn bench_matmul(a: MatmulArgs) -> Result<(), String> {
    let MatmulArgs { models, columns, threads, rounds, mib, json, markdown } = a;
    if models.is_empty() {
        return Err("bench matmul: name at least one GGUF file".into());
    }
    println!("{}", frigg::tools::bench::MatmulCell::markdown_header());
    let mut all = vec![];
    for model in models {
        let o = frigg::tools::bench::MatmulOptions { model, columns: columns.clone(), threads, rounds, bytes: mib << 20 };
        let cells = frigg::tools::bench::matmul(&o)?;
        for row in frigg::tools::bench::MatmulCell::markdown_rows(&cells) {
            println!("{row}");
        }
        all.extend(cells);
    }
    if let Some(p) = markdown {
        let cmd: Vec<String> = std::env::args().collect();
        let body = format!(
            "Generated by `{}` ({})\n\nMachine: {}.\n\n{}\n{}",
            cmd.join(" "),
            frigg::long_version(),
            all[0].machine.describe(),
            frigg::tools::bench::MatmulCell::markdown_header(),
            frigg::tools::bench::MatmulCell::markdown_rows(&all).join("\n")
        );
        frigg::tools::bench::write_markdown_block(&p, "matmul-columns", &body)?;
    }
    if let Some(p) = json {
        write_json(&p, &all)?;
    }
    Ok(())
}

fn bench_render(a: RenderArgs) -> Result<(), String> {
    let RenderArgs { load, matrix, matmul, markdown, key } = a;
    if [!load.is_empty(), !matrix.is_empty(), !matmul.is_empty()].iter().filter(|&&x| x).count() > 1 {
        return Err("one table per render: give --load, --matrix or --matmul files, not two kinds".into());
    }
    let cmd: Vec<String> = std::env::args().collect();
    let sources = load.iter().chain(&matrix).chain(&matmul).map(|p| format!("`{}`", p.display())).collect::<Vec<_>>().join(", ");
    let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    // One table per machine the rows were measured on, each under its own machine line, so that
    // no figure is read as another CPU's.
    let mut tables: Vec<(frigg::engine::host::Machine, Vec<String>)> = vec![];
    let mut add = |m: &frigg::engine::host::Machine, row: String| match tables.iter_mut().find(|(t, _)| t == m) {
        Some((_, rows)) => rows.push(row),
        None => tables.push((m.clone(), vec![row])),
    };
    let header = if !load.is_empty() {
        let mut soak = None;
        let mut reports = vec![];
        for p in &load {
            let r: frigg::tools::loadgen::LoadReport = serde_json::from_str(&read(p)?).map_err(|e| format!("{}: not a `frigg bench load` report: {e}", p.display()))?;
            // One table is either load runs or soaks (with --server-pid), not both.
            if *soak.get_or_insert(r.soak.is_some()) != r.soak.is_some() {
                return Err(format!("{}: soak and plain load reports go in separate tables", p.display()));
            }
            if reports.first().is_some_and(|f: &frigg::tools::loadgen::LoadReport| f.machine != r.machine) {
                return Err(format!("{}: measured on another machine than {}; slot scaling compares runs of one machine", p.display(), load[0].display()));
            }
            add(&r.machine, r.soak_row().unwrap_or_else(|| r.markdown_row()));
            reports.push(r);
        }
        let scaling = frigg::tools::loadgen::slot_scaling_lines(&reports);
        if soak != Some(true) && !scaling.is_empty() {
            // after the table: one blank line ends it
            add(&reports[0].machine, format!("\nSlots against one slot, from the rows above:\n\n{}", scaling.join("\n")));
        }
        if soak == Some(true) {
            "| run | server slots | streaming clients | duration | requests | complete | errors | completion tokens | server resident memory after warm-up → end (growth, max) | busy slots at end | queue at end | load before → after |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
        } else {
            "| run | server slots | streaming clients | duration | requests | complete | errors | completion tokens | aggregate tok/s | TTFT p50 | TTFT p95 | engine time: prefill / decode (share of wall) · mean decode batch (+ padding rows per step) | load before → after |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        }
    } else if !matmul.is_empty() {
        let mut cells: Vec<frigg::tools::bench::MatmulCell> = vec![];
        for p in &matmul {
            let more: Vec<frigg::tools::bench::MatmulCell> = serde_json::from_str(&read(p)?).map_err(|e| format!("{}: not a `frigg bench matmul` report: {e}", p.display()))?;
            cells.extend(more);
        }
        for (c, row) in cells.iter().zip(frigg::tools::bench::MatmulCell::markdown_rows(&cells)) {
            add(&c.machine, row);
        }
        frigg::tools::bench::MatmulCell::markdown_header()
    } else {
        let mut vs_llama = None;
        for p in &matrix {
            let cells: Vec<frigg::tools::bench::MatrixCell> = serde_json::from_str(&read(p)?).map_err(|e| format!("{}: not a `frigg bench matrix` report: {e}", p.display()))?;
            for c in cells {
                if *vs_llama.get_or_insert(c.llama.is_some()) != c.llama.is_some() {
                    return Err(format!("{}: matrix reports with and without --vs llama.cpp go in separate tables", p.display()));
                }
                add(&c.machine, c.markdown_row());
            }
        }
        frigg::tools::bench::MatrixCell::markdown_header(vs_llama == Some(true))
    };
    if tables.is_empty() {
        return Err("nothing to render: give --load FILE…, --matrix FILE… or --matmul FILE…".into());
    }
    let tables: Vec<String> = tables.iter().map(|(m, rows)| format!("Machine: {}.\n\n{header}\n{}", m.describe(), rows.join("\n"))).collect();
    let body = format!("Generated by `{}` from {}\n\n{}", cmd.join(" "), sources, tables.join("\n\n"));
    frigg::tools::bench::write_markdown_block(&markdown, &key, &body)
}

fn bench_compare(a: CompareArgs) -> Result<(), String> {
    let CompareArgs { models, threads, prompt, decode, reps, kv_type, json, markdown, key } = a;
    let mut reports = vec![];
    let mut rows = vec![];
    for m in &models {
        let o = frigg::tools::bench::CompareOptions { model: m.clone(), threads, prompt_len: prompt, decode_len: decode, reps, kv_type };
        let r = frigg::tools::bench::compare(&o)?;
        let label = m.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let row = r.markdown_row(&label);
        println!("{row}");
        rows.push(row);
        reports.push(r);
    }
    if let Some(p) = json {
        write_json(&p, &reports)?;
    }
    if let (Some(p), Some(first)) = (markdown, reports.first()) {
        let m = &first.machine;
        let cmd: Vec<String> = std::env::args().collect();
        let body = format!(
            "Generated by `{}`\n\nMachine: {} · {} · prompt {} tokens, {} decode steps, {} alternated repetitions after one warm-up each.\n\n| file | threads | KV | frigg decode tok/s (range) | llama.cpp decode tok/s (range) | decode ratio (median of pairs) | frigg prefill tok/s, PrefixLM (range) | llama.cpp prefill tok/s, causal (range) | prefill ratio | reps | load before → after |\n|---|---|---|---|---|---|---|---|---|---|---|\n{}",
            cmd.join(" "), m.describe(), first.frigg_version, prompt, decode, reps, rows.join("\n")
        );
        frigg::tools::bench::write_markdown_block(&p, &key, &body)?;
    }
    Ok(())
}

/// Long on purpose: one match arm per command, each a call into the library.
pub fn main() -> ExitCode {
    // A file-size limit should fail the write with an error we report, not kill the process
    // before the temporary file can be removed.
    frigg::ggml::os::ignore_file_size_signal();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("FRIGG_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // At debug level, a line with its duration when each prefill, decode, admit and
        // scheduler step span closes.
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .init();
    if let Err(e) = variant::run_chosen_build() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let version: &'static str = Box::leak(frigg::long_version().into_boxed_str());
    let matches = Cli::command().version(version).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Convert { checkpoint, output, out_type, threads, name, quiet } => {
            let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
            let opts = ConvertOptions {
                checkpoint,
                output,
                out_type,
                threads,
                progress: !quiet && std::io::stderr().is_terminal(),
                name,
            };
            let t0 = std::time::Instant::now();
            match convert::convert(&opts) {
                Ok(r) => {
                    for n in &r.notes {
                        eprintln!("note: {n}");
                    }
                    let types: Vec<String> = r.type_counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
                    println!(
                        "wrote {}: {} tensors ({}), {} parameters, {} bytes ({:.2} GiB), {:.2} bits per weight, {:.1} s",
                        r.output.display(),
                        r.n_tensors,
                        types.join(", "),
                        r.n_params,
                        r.size_bytes,
                        r.size_bytes as f64 / (1u64 << 30) as f64,
                        r.bits_per_weight,
                        t0.elapsed().as_secs_f64()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Run { model, prompt, chat, raw, max_tokens, ignore_eos, stop, causal_prompt, json, runner, sampling } => {
            let req = RunRequest { prompt, chat, raw, max_tokens, ignore_eos, stop, causal_prompt, json, sampling: sampling.params() };
            exit(run(&model, &runner, req))
        }
        Command::Logits { model, cases, out, full_logits, dump_dir, dump_filter, runner } => {
            exit(logits(&model, &cases, &out, full_logits, dump_dir.map(|d| (d, dump_filter)), &runner))
        }
        Command::Parity { fixtures, eps, json, markdown, key, tiers, threads, device } => exit(parity(&fixtures, eps, json.as_deref(), markdown.as_deref(), &key, &tiers, threads, device == Device::Gpu)),
        Command::Bench(cmd) => exit(bench(cmd)),
        Command::Eval { models, task, data, arms, threads, max_tokens, limit, json, markdown, key } => exit(eval(models, task, data, arms, threads, max_tokens, limit, json, markdown, key)),
        Command::Serve { model, host, port, slots, queue, api_key, api_key_file, cors_origin, alias, max_body, devices, drain_delay, drain_timeout, metrics_auth, runner } => {
            let drain = (drain_delay, drain_timeout, metrics_auth);
            exit(serve(model, host, port, slots, queue, api_key, api_key_file, cors_origin, alias, max_body, devices, drain, &runner))
        }
        Command::Inspect { file, json } => match frigg::tools::inspect::inspect(&file) {
            Ok(i) => {
                if json {
                    println!("{}", serde_json::to_string_pretty(&i.to_json()).expect("json"));
                } else {
                    print!("{}", i.to_table());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
    }
}

/// Writes a benchmark or eval report as pretty JSON; errors name the file.
fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), String> {
    std::fs::write(path, serde_json::to_string_pretty(value).expect("serializable")).map_err(|e| format!("{}: {e}", path.display()))
}

/// One JSON value per non-empty line; errors name the file and the line.
fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("{} line {}: {e}", path.display(), i + 1)))
        .collect()
}

fn exit(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn eval(models: Vec<PathBuf>, task: frigg::tools::eval::Task, data: Option<PathBuf>, arms: Vec<frigg::tools::eval::Arm>, threads: usize, max_tokens: Option<usize>, limit: Option<usize>, json: Option<PathBuf>, markdown: Option<PathBuf>, key: String) -> Result<(), String> {
    use frigg::tools::eval::Task;
    let data = match (data, task) {
        (Some(d), _) => d,
        (None, Task::DemoQa) => PathBuf::from("tests/fixtures/demo/heldout.jsonl"),
        (None, Task::Gsm8k) => return Err("--task gsm8k needs --data FILE.jsonl".into()),
    };
    let max_tokens = max_tokens.unwrap_or(if task == Task::DemoQa { 16 } else { 256 });
    let splits: &[&str] = if task == Task::DemoQa { &["heldout", "recall"] } else { &["test"] };
    let mut reports = vec![];
    let mut rows = vec![];
    for m in &models {
        let o = frigg::tools::eval::EvalOptions { model: m.clone(), task, data: data.clone(), arms: arms.clone(), threads, max_tokens, limit };
        let r = frigg::tools::eval::run(&o)?;
        for row in r.markdown_rows(splits) {
            println!("{row}");
            rows.push(row);
        }
        reports.push(r);
    }
    if let Some(p) = json {
        write_json(&p, &reports)?;
    }
    if let (Some(p), Some(first)) = (markdown, reports.first()) {
        let cmd: Vec<String> = std::env::args().collect();
        let body = format!(
            "Generated by `{}` · {} · data `{}` · greedy, {} tokens at most per answer.\n\n| file | arm | {} |\n|---|---|{}\n{}",
            cmd.join(" "),
            first.frigg_version,
            first.data,
            max_tokens,
            splits.iter().map(|s| format!("{s} accuracy")).collect::<Vec<_>>().join(" | "),
            "---|".repeat(splits.len()),
            rows.join("\n")
        );
        frigg::tools::bench::write_markdown_block(&p, &key, &body)?;
    }
    Ok(())
}

struct RunRequest {
    prompt: Option<String>,
    chat: Option<PathBuf>,
    raw: bool,
    max_tokens: usize,
    ignore_eos: bool,
    stop: Vec<String>,
    causal_prompt: bool,
    json: bool,
    sampling: SamplingParams,
}

fn run(model: &Path, runner: &RunnerArgs, r: RunRequest) -> Result<(), String> {
    let g = frigg::ggml::gguf::GgufFile::open(model).map_err(|e| e.to_string())?;
    let tok = frigg::text::Tokenizer::from_gguf(&g, runner.tokenizer_mistral_regex).map_err(|e| e.to_string())?;
    let prompt_ids = if r.raw {
        tok.encode_prompt(r.prompt.as_deref().unwrap_or_default()).map_err(|e| e.to_string())?
    } else {
        let messages: Vec<serde_json::Value> = match (&r.prompt, &r.chat) {
            (Some(p), _) => vec![serde_json::json!({"role": "user", "content": p})],
            (None, Some(f)) => {
                read_jsonl(f)?
            }
            (None, None) => return Err("give -p TEXT or --chat FILE".into()),
        };
        let source = g.get_str(frigg::engine::arch::key::CHAT_TEMPLATE).map_err(|_| "the model has no chat template; use --raw".to_string())?;
        let bos = tok.bos.and_then(|b| tok.token_text(b)).unwrap_or_default();
        let eos = tok.eos.first().and_then(|&e| tok.token_text(e)).unwrap_or_default();
        let tmpl = frigg::text::chat::ChatTemplate::new(&source, &bos, &eos).map_err(|e| e.to_string())?;
        let text = tmpl.render(&messages, None, true).map_err(|e| e.to_string())?;
        tok.encode(&text).map_err(|e| e.to_string())?
    };
    drop(g);
    let mut engine = Engine::load(model, &runner.engine_options(1)?).map_err(|e| e.to_string())?;
    eprintln!(
        "frigg: {} · {} KV cache {:.1} MiB for {} positions · compute buffers {:.1} MiB · {} threads",
        model.display(),
        runner.kv_type,
        engine.kv().bytes_per_stream() as f64 / (1 << 20) as f64,
        engine.n_ctx(),
        engine.compute_bytes() as f64 / (1 << 20) as f64,
        runner.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
    );
    eprintln!("frigg: weights: {}", engine.model.placement());
    for check in &engine.model.placement_checks {
        eprintln!("frigg: weights: {check}");
    }
    if let Some(k) = engine.kernels() {
        eprintln!("frigg: {k}");
    }
    let req = frigg::generate::Request {
        token_types: r.causal_prompt.then(|| vec![0; prompt_ids.len()]),
        prompt: prompt_ids,
        max_tokens: r.max_tokens,
        sampling: r.sampling,
        stops: r.stop,
        ignore_eos: r.ignore_eos,
    };
    let stream = !r.json;
    let mut stdout = std::io::stdout();
    let out = frigg::generate::generate(&mut engine, &tok, &req, |piece| {
        if stream {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
    })
    .map_err(|e| e.to_string())?;
    let prefill_tps = out.prompt_tokens as f64 / out.prefill.as_secs_f64();
    // The first token comes from the prefill; decode steps produce the rest.
    let decode_steps = out.tokens.len().saturating_sub(1);
    let decode_tps = if decode_steps > 0 { decode_steps as f64 / out.decode.as_secs_f64() } else { 0.0 };
    if r.json {
        let j = serde_json::json!({
            "text": out.text, "tokens": out.tokens, "finish_reason": out.finish,
            "prompt_tokens": out.prompt_tokens, "completion_tokens": out.tokens.len(),
            "prefill_s": out.prefill.as_secs_f64(), "decode_s": out.decode.as_secs_f64(),
            "prefill_tok_s": prefill_tps, "decode_tok_s": decode_tps,
        });
        println!("{j}");
    } else {
        println!();
    }
    eprintln!(
        "prefill {} tokens in {:.2} s ({:.1} tok/s) · decode {} tokens ({:.2} tok/s) · finish: {:?}",
        out.prompt_tokens,
        out.prefill.as_secs_f64(),
        prefill_tps,
        out.tokens.len(),
        decode_tps,
        out.finish
    );
    Ok(())
}

fn logits(model: &Path, cases: &Path, out: &Path, full: bool, dump: Option<(PathBuf, String)>, runner: &RunnerArgs) -> Result<(), String> {
    let parsed: Vec<frigg::tools::parity::Case> = read_jsonl(cases)?;
    let mut engine = Engine::load(model, &runner.engine_options(1)?).map_err(|e| e.to_string())?;
    if let Some((dir, _)) = &dump {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    engine.set_dump(dump);
    let mut w = std::io::BufWriter::new(std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?);
    for c in &parsed {
        let r = frigg::tools::parity::run_case(&mut engine, c, full).map_err(|e| format!("case {}: {e}", c.id))?;
        writeln!(w, "{}", serde_json::to_string(&r).expect("serializable")).map_err(|e| e.to_string())?;
    }
    w.flush().map_err(|e| e.to_string())?;
    eprintln!("wrote {} cases to {}", parsed.len(), out.display());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn parity(fixtures: &Path, eps: f32, json: Option<&Path>, markdown: Option<&Path>, key: &str, tier_names: &[String], threads: usize, gpu: bool) -> Result<(), String> {
    let tiers: Vec<frigg::tools::parity::Tier> = if tier_names.is_empty() {
        frigg::tools::parity::TIERS.to_vec()
    } else {
        tier_names.iter().map(|n| frigg::tools::parity::tier(n).ok_or_else(|| format!("--tiers: no tier {n:?} (known: {})", frigg::tools::parity::TIERS.map(|t| t.name).join(", ")))).collect::<Result<_, _>>()?
    };
    let mut reports = vec![];
    let vs_cpu_head = if gpu { (" max \\|Δ\\| vs CPU | greedy as CPU |", "---|---|") } else { ("", "") };
    let mut md = format!("| tier (weights / KV) | fixture | cases | max \\|Δlogit\\| | mean of per-case max | last-row argmax | greedy tokens | identical sequences | verify rows |{}\n|---|---|---|---|---|---|---|---|---|{}\n", vs_cpu_head.0, vs_cpu_head.1);
    println!("{:6} {:20} {:>6} {:>12} {:>12} {:>9} {:>13} {:>9} {:>10}", "tier", "fixture", "cases", "max|Δlogit|", "mean max|Δ|", "argmax", "greedy tokens", "seqs", "verify");
    let mut names: Vec<String> = std::fs::read_dir(fixtures.join("goldens"))
        .map_err(|e| format!("{}: {e}", fixtures.join("goldens").display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".jsonl")).map(str::to_string))
        .collect();
    names.sort();
    for &tier in &tiers {
        for name in &names {
            let ckpt = fixtures.join("ckpt").join(name);
            if !ckpt.is_dir() {
                continue;
            }
            let r = frigg::tools::parity::run_tier(&ckpt, &fixtures.join("goldens").join(format!("{name}.jsonl")), tier, eps, threads, gpu)?;
            println!(
                "{:6} {:20} {:>6} {:>12.2e} {:>12.2e} {:>4}/{:<4} {:>6}/{:<6} {:>4}/{:<4} {:>5}/{:<4}",
                r.tier, r.fixture, r.cases, r.max_abs_diff, r.mean_max_abs_diff, r.argmax_agreed, r.argmax_judged,
                r.greedy_matched, r.greedy_compared, r.sequences_identical, r.cases, r.verify_agreed, r.verify_judged
            );
            let vs_cpu = match (r.max_abs_diff_vs_cpu, r.greedy_same_as_cpu) {
                (Some(d), Some(g)) => format!(" {d:.2e} | {g}/{} |", r.cases),
                _ => String::new(),
            };
            md.push_str(&format!(
                "| {} ({:?} / {:?}) | {} | {} | {:.2e} | {:.2e} | {}/{} | {}/{} | {}/{} | {}/{} |{vs_cpu}\n",
                r.tier, tier.weights, tier.kv, r.fixture, r.cases, r.max_abs_diff, r.mean_max_abs_diff, r.argmax_agreed, r.argmax_judged,
                r.greedy_matched, r.greedy_compared, r.sequences_identical, r.cases, r.verify_agreed, r.verify_judged
            ));
            reports.push(r);
        }
    }
    if let Some(p) = markdown {
        let doc = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let (begin, end) = (format!("<!-- {key}:begin -->"), format!("<!-- {key}:end -->"));
        let (Some(a), Some(b)) = (doc.find(&begin), doc.find(&end)) else {
            return Err(format!("{}: no {begin} … {end} markers", p.display()));
        };
        let device = if gpu { " --device gpu" } else { "" };
        let key_arg = if key == "parity" { String::new() } else { format!(" --key {key}") };
        let tiers_arg = if tier_names.is_empty() { String::new() } else { format!(" --tiers {}", tier_names.join(",")) };
        let cmd = format!("frigg parity --threads {threads} --eps {eps}{device}{tiers_arg} --markdown {}{key_arg}", p.display());
        let shaders = match (gpu, std::env::var("GGML_VK_DISABLE_F16").is_ok()) {
            (false, _) => String::new(),
            (true, f32_only) => format!("; GPU device: {}{}", frigg::ggml::compute::Backend::gpu_description(), if f32_only { ", GGML_VK_DISABLE_F16=1 (f32 shaders)" } else { "" }),
        };
        let body = format!("{begin}\nGenerated by `{cmd}` (frigg {}, {} threads{shaders}; {}).\n\n{md}", frigg::long_version(), threads, frigg::engine::host::machine().describe());
        std::fs::write(p, format!("{}{}{}", &doc[..a], body, &doc[b..])).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = json {
        write_json(p, &reports)?;
    }
    Ok(())
}

/// The bundled demo model (`demo/frigg-demo.gguf`, committed): a small HRM-Text trained by
/// scripts/train_demo.py on Danish/English question-answer pairs (docs/eval.md). Found beside an
/// installed binary (`<prefix>/share/frigg/demo/`, as the container image has it), else in the
/// checkout the binary was built from.
fn demo_model() -> Result<PathBuf, String> {
    let installed = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.parent()?.join("share/frigg/demo/frigg-demo.gguf")));
    let path = installed.filter(|p| p.is_file()).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("demo/frigg-demo.gguf"));
    if !path.is_file() {
        return Err(format!("the bundled demo model {} is missing (a git checkout has it); give a model: frigg serve MODEL.gguf", path.display()));
    }
    eprintln!(
        "frigg serve: no model given, serving the bundled demo model {} — a 1.2M-parameter HRM-Text trained on small Danish/English questions \
(capitals, opposites, sums, counting: try \"Hvad er hovedstaden i Frankrig?\" or \"What is 7 plus 8?\").\n  For a real model: frigg convert /path/to/DFM-Mimir -o mimir-q8_0.gguf --type q8_0 && frigg serve mimir-q8_0.gguf",
        path.display()
    );
    Ok(path)
}

#[allow(clippy::too_many_arguments)]
fn serve(
    model: Option<PathBuf>,
    host: String,
    port: u16,
    slots: usize,
    queue: usize,
    api_key: Option<String>,
    api_key_file: Option<PathBuf>,
    cors_origin: Option<String>,
    alias: Option<String>,
    max_body: usize,
    devices: Option<String>,
    (drain_delay, drain_timeout, metrics_auth): (f64, f64, String),
    runner: &RunnerArgs,
) -> Result<(), String> {
    let model = match model {
        Some(m) => m,
        None => demo_model()?,
    };
    let api_key = match (api_key, api_key_file) {
        (Some(k), _) if k.trim().is_empty() => return Err("--api-key: the key is empty (an empty key would turn authentication off)".into()),
        (Some(k), _) => Some(k),
        (None, Some(f)) => {
            let text = std::fs::read_to_string(&f).map_err(|e| format!("--api-key-file: {e}"))?;
            let k = text.lines().next().unwrap_or("").trim().to_string();
            if k.is_empty() {
                return Err("--api-key-file: the file is empty".into());
            }
            Some(k)
        }
        (None, None) => None,
    };
    if slots == 0 {
        return Err("--slots must be at least 1".into());
    }
    let devices = match &devices {
        None => vec![],
        Some(list) => list
            .split(',')
            .map(|d| match d.trim() {
                "cpu" => Ok(None),
                n => n.parse::<usize>().map(Some).map_err(|_| format!("--devices {list}: each entry is a GPU index (0, 1, …) or `cpu`")),
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    frigg::serve::serve(frigg::serve::ServeOptions {
        model,
        host,
        port,
        slots,
        queue,
        api_key,
        cors_origin,
        alias,
        engine: runner.engine_options(slots)?,
        mistral_regex: runner.tokenizer_mistral_regex,
        max_body,
        devices,
        drain_delay: seconds(drain_delay, "--drain-delay")?,
        drain_timeout: seconds(drain_timeout, "--drain-timeout")?,
        metrics_auth: match metrics_auth.as_str() {
            "key" => frigg::serve::MetricsAuth::Key,
            "open" => frigg::serve::MetricsAuth::Open,
            _ => frigg::serve::MetricsAuth::Auto,
        },
    })
}

/// A flag's seconds as a Duration; negative or not finite is an error naming the flag.
fn seconds(s: f64, flag: &str) -> Result<std::time::Duration, String> {
    std::time::Duration::try_from_secs_f64(s).map_err(|_| format!("{flag} {s}: not a number of seconds"))
}
