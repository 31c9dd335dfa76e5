//! The engine: one model, one KV cache of `n_stream` sequences, and the per-step decision of
//! which tokens run at which positions. The graph itself is built by the C extension
//! (`ggml-ext/hrm_graph.c`); this file only fills its inputs and reads its logits.
//!
//! Stream contract: a sequence lives in one stream (a row block of every virtual layer's cache).
//! `prefill` is its first forward (PrefixLM mask from token types, all prompt tokens at once);
//! `decode` advances any set of streams by one token each in one graph; `rewind` shortens a
//! stream for free (later cells are masked); `fork` copies a stream's cells into another.

pub mod arch;
pub mod file;
pub mod host;
pub mod kernels;
pub mod kv;
pub mod weights;

pub use file::{Budget, ModelFile};
pub use kernels::{KernelChoice, KernelPlan};
pub use kv::{KvCache, KvType};

use crate::engine::arch::HParams;
use crate::ggml::compute::{Backend, ComputeError, HostBuffer, Scheduler};
use crate::ggml::ext::{self, fill_mask, StepInputs};

pub use crate::ggml::compute::Cancel;
use crate::engine::weights::{LoadError, Model, Placement};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Load(#[from] LoadError),
    #[error("{0}")]
    Compute(#[from] ComputeError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("token id {id} is outside the vocabulary (size {n_vocab})")]
    BadToken { id: u32, n_vocab: u32 },
    #[error("context length exceeded: {needed} positions needed, the limit is {limit}")]
    ContextFull { needed: usize, limit: usize },
    #[error("token_type_ids has {got} entries for {expected} tokens")]
    TypesLength { got: usize, expected: usize },
    #[error("stream {0} does not exist or holds no sequence")]
    BadStream(usize),
    #[error("{0}")]
    Build(#[from] ext::BuildRefused),
    #[error("the computation was cancelled")]
    Cancelled,
}

/// The logits of one forward: `len()` rows of `n_vocab` f32s, in the order asked for. A decode
/// step's rows (and a prefill's, when they fit) are read straight from the engine's output
/// buffer, which they borrow until dropped; copy a row out to keep it past the next forward.
#[derive(Debug)]
pub struct Logits<'a> {
    data: std::borrow::Cow<'a, [f32]>,
    n_vocab: usize,
    /// Row `i` of the result is row `rows[i]` of `data`.
    rows: Vec<usize>,
}

impl Logits<'_> {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn row(&self, i: usize) -> &[f32] {
        let r = self.rows[i];
        &self.data[r * self.n_vocab..(r + 1) * self.n_vocab]
    }

    pub fn iter(&self) -> impl Iterator<Item = &[f32]> {
        (0..self.len()).map(|i| self.row(i))
    }

    /// Row `i` copied into `dst` (which keeps its allocation: no page faults at 262k floats).
    pub fn copy_row_to(&self, i: usize, dst: &mut Vec<f32>) {
        dst.clear();
        dst.extend_from_slice(self.row(i));
    }

    /// Every row, copied out.
    pub fn to_vecs(&self) -> Vec<Vec<f32>> {
        self.iter().map(<[f32]>::to_vec).collect()
    }
}

impl<'b> IntoIterator for &'b Logits<'_> {
    type Item = &'b [f32];
    type IntoIter = Box<dyn Iterator<Item = &'b [f32]> + 'b>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl std::ops::Index<usize> for Logits<'_> {
    type Output = [f32];

    fn index(&self, i: usize) -> &[f32] {
        self.row(i)
    }
}

/// Where `Engine::run` put a forward's logits.
enum RunOutput {
    /// The first rows of the engine's output buffer.
    Buffer,
    /// More rows than the buffer holds (a prefill asking for every row).
    Owned(Vec<f32>),
}

impl From<ext::BuildError> for EngineError {
    fn from(e: ext::BuildError) -> Self {
        match e {
            ext::BuildError::Refused(r) => EngineError::Build(r),
            ext::BuildError::Compute(c) => EngineError::from(c),
        }
    }
}

/// A sequence's place in the KV cache: stream `i` holds cells `i*cells..(i+1)*cells` of every
/// virtual layer (`cells` = `KvCache::cells_per_stream`, at least `n_ctx + 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub usize);

/// An index into the vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct TokenId(pub u32);

impl TokenId {
    /// Token ids as they come from the tokenizer, seen as `TokenId`s (no copy).
    pub fn slice(ids: &[u32]) -> &[TokenId] {
        bytemuck::cast_slice(ids)
    }
}

/// Where the engine runs and how much it holds.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub threads: usize,
    /// Positions per sequence (≤ the model's context length).
    pub n_ctx: usize,
    /// Sequences held at once (cache streams).
    pub n_stream: usize,
    pub kv_type: KvType,
    pub gpu: bool,
    /// Which GPU (ggml's device order) when `gpu`; None = the first.
    pub gpu_index: Option<usize>,
    /// On the CPU, put each weight in the first of ggml's extra buffer types (repacked
    /// layouts, AMX tiles, KleidiAI) whose kernels take it; off: every weight in plain memory.
    /// A batch-invariant engine with several streams takes a type only where a check at load
    /// shows its matmul keeps each column's bits whatever sits beside it (`Placement`): those
    /// types' kernels need not honour ggml's reference-kernel switch (the repacked Q4_K GEMM
    /// rounds four columns differently from one).
    pub extra_buffers: bool,
    /// With more than one stream: decode with ggml's reference kernels at every batch size, so
    /// a sequence's logits do not depend on what it is batched with (off: ggml's fastest
    /// kernels, whose rounding depends on the batch). A one-stream engine always uses the
    /// fastest kernels.
    pub batch_invariant: bool,
    /// Decode attention on a CPU: the extension's (`ggml-ext/hrm_attn.c`) or ggml's flash
    /// attention; by default timed at load (`engine::kernels`).
    pub decode_attention: KernelChoice,
    /// Decode matmuls of Q8_0/BF16 weights on a CPU: the extension's (`ggml-ext/hrm_matmul.c`:
    /// one pass over the weights for every stream) or ggml's; by default timed at load.
    pub decode_matmul: KernelChoice,
    /// Prefill attention (first forwards) on a CPU: the extension's (`ggml-ext/hrm_prefill.c`)
    /// or ggml's flash attention; by default timed at load.
    pub prefill_attention: KernelChoice,
    /// Each block's attention gate, q, k and v loaded as one weight of stacked rows, so a layer
    /// multiplies them in one matmul (`Model::load`). None: on GPU engines, where a
    /// matrix-vector product of four times the rows reads the weights faster than four launches
    /// do; CPU engines keep them apart (the extension's CPU kernels and ggml's extra buffer types
    /// take each weight in its own layout).
    pub stacked_projections: Option<bool>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            n_ctx: 0,
            n_stream: 1,
            kv_type: KvType::F16,
            gpu: false,
            gpu_index: None,
            extra_buffers: true,
            batch_invariant: true,
            decode_attention: KernelChoice::Measure,
            decode_matmul: KernelChoice::Measure,
            prefill_attention: KernelChoice::Measure,
            stacked_projections: None,
        }
    }
}

impl EngineOptions {
    /// The decode kernels the environment forces (to measure them one at a time:
    /// scripts/bench-ab.sh): FRIGG_DECODE_ATTENTION=flash|ext|measure,
    /// FRIGG_PREFILL_ATTENTION=flash|ext|measure, FRIGG_DECODE_MATMUL=ggml|ext|measure,
    /// FRIGG_EXTRA_BUFFERS=0 (every weight in plain memory), FRIGG_STACKED_PROJECTIONS=0|1.
    pub fn levers_from_env(mut self) -> Self {
        if let Ok(v) = std::env::var("FRIGG_STACKED_PROJECTIONS") {
            self.stacked_projections = Some(v != "0");
        }
        if std::env::var("FRIGG_EXTRA_BUFFERS").is_ok_and(|v| v == "0") {
            self.extra_buffers = false;
        }
        if let Some(c) = KernelChoice::from_env("FRIGG_DECODE_ATTENTION", "flash") {
            self.decode_attention = c;
        }
        if let Some(c) = KernelChoice::from_env("FRIGG_DECODE_MATMUL", "ggml") {
            self.decode_matmul = c;
        }
        if let Some(c) = KernelChoice::from_env("FRIGG_PREFILL_ATTENTION", "flash") {
            self.prefill_attention = c;
        }
        self
    }
}

/// Which rows of a first forward get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    Last,
    All,
}

/// How often the engine built and allocated graphs (`/metrics`, `bench matrix`). Once warm, a
/// decode step at a (streams, padded length) it ran last rebuilds and reallocates nothing, so
/// ggml-cuda can replay its captured graph; prefill allocates each forward inside the
/// compute buffer load reserved for a full-context prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GraphStats {
    pub prefill_builds: u64,
    pub decode_builds: u64,
    /// Graph allocations on either scheduler, and those that grew a compute buffer past what
    /// load reserved.
    pub allocations: u64,
    pub buffer_growths: u64,
    /// Decode steps that ran the previous step's graph as built and allocated.
    pub decode_reuses: u64,
    /// Of those, steps whose graph (nodes' headers and addresses) differed from its previous
    /// run: what would make ggml-cuda capture again.
    pub decode_changes: u64,
    /// ggml-cuda's own account of its CUDA graphs (process-wide).
    pub cuda: crate::ggml::CudaGraphLog,
}

impl GraphStats {
    /// What happened between `before` and `self`.
    pub fn since(&self, before: &GraphStats) -> GraphStats {
        GraphStats {
            prefill_builds: self.prefill_builds - before.prefill_builds,
            decode_builds: self.decode_builds - before.decode_builds,
            allocations: self.allocations - before.allocations,
            buffer_growths: self.buffer_growths - before.buffer_growths,
            decode_reuses: self.decode_reuses - before.decode_reuses,
            decode_changes: self.decode_changes - before.decode_changes,
            cuda: crate::ggml::CudaGraphLog {
                captures: self.cuda.captures - before.cuda.captures,
                resets: self.cuda.resets - before.cuda.resets,
                reuses: self.cuda.reuses - before.cuda.reuses,
            },
        }
    }
}

/// Pad the attended cache length to this multiple, so a decode graph is rebuilt only when a
/// sequence crosses a bucket (ggml-cuda's vector FA kernel also wants multiples of 256).
const KV_PAD: usize = 256;

pub struct Engine {
    pub model: Model,
    kv: KvCache,
    /// Two schedulers: ggml keeps an allocated graph's tensor addresses only until another
    /// graph is allocated on the same scheduler, so first forwards get their own and the decode
    /// graph stays allocated (and reusable, for ggml-cuda's graph capture) across prefills.
    sched_first: Scheduler,
    sched_decode: Scheduler,
    backends: Vec<Backend>,
    /// Current length (positions filled) of each stream; None = free.
    lens: Vec<Option<usize>>,
    decode_graph: Option<ext::Step>,
    graph_size: usize,
    /// Forwards run, when dumping intermediate tensors (the dump's file names count them).
    dumped_forwards: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
    /// Steps use the extension's CPU decode attention, decode matmul, prefill attention (`hrm_step`).
    cpu_decode_attention: bool,
    cpu_decode_matmul: bool,
    cpu_prefill_attention: bool,
    /// Decode steps keep each stream's bits apart from its neighbours' (`hrm_step.cpu_invariant_decode`).
    cpu_invariant_decode: bool,
    /// CPU engines: which kernels run, and why.
    kernels: Option<KernelPlan>,
    graphs: GraphStats,
    /// `Graph::signature` of the decode graph after its last run.
    decode_signature: Option<u64>,
    /// A decode step's logits, `n_vocab` per stream, in the memory the device copies into
    /// fastest (`HostBuffer`): read once per step with no allocation.
    logits: HostBuffer,
}

/// Intermediate-tensor dumps for parity diffs: every F32 node whose name contains `filter`
/// (names are "v<virtual layer>.<role>", e.g. "v017.attn_norm") is written as `<dir>/<forward>-<name>.npy`.
#[derive(Debug)]
struct Dump {
    dir: std::path::PathBuf,
    filter: String,
    /// Forwards run so far (shared by the two schedulers' observers).
    forward: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl crate::ggml::compute::NodeObserver for Dump {
    fn wants(&mut self, name: &str) -> bool {
        !name.is_empty() && name.contains(self.filter.as_str())
    }

    fn node(&mut self, name: &str, shape: &[i64], data: &[f32]) {
        let forward = self.forward.load(std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.join(format!("{forward:04}-{name}.npy"));
        if let Err(e) = write_npy(&path, shape, data) {
            tracing::warn!("dump {}: {e}", path.display());
        }
    }
}

/// A minimal .npy (version 1.0, little-endian f32, C order).
fn write_npy(path: &Path, shape: &[i64], data: &[f32]) -> std::io::Result<()> {
    use std::io::Write;
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(header.len() as u16).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    for x in data {
        f.write_all(&x.to_le_bytes())?;
    }
    f.flush()
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("model", &self.model).field("lens", &self.lens).finish()
    }
}

impl Engine {
    pub fn load(path: &Path, opts: &EngineOptions) -> Result<Engine, EngineError> {
        crate::ggml::route_logs();
        // Two CPU backends: first forwards get ggml's fastest kernels (tiled GEMM, tiled
        // attention). With several streams, decode gets ggml's reference kernels, whose
        // arithmetic per row does not change with the batch, so a sequence's logits are the
        // same alone or batched (docs/parity.md); they cost ~20% at batch 1 (docs/benchmarks.md,
        // matrix), so a one-stream engine, which cannot batch, keeps the fast kernels, and a
        // batched engine (`--batched-kernels`) takes whichever set times faster at load.
        let cpu_first = Backend::cpu(opts.threads)?;
        let cpu_decode = Backend::cpu(opts.threads)?;
        cpu_decode.set_reference_kernels(opts.batch_invariant && opts.n_stream > 1);
        let mut backends = vec![];
        if opts.gpu {
            backends.push(match opts.gpu_index {
                Some(i) => Backend::gpu_at(i)?,
                None => Backend::gpu()?,
            });
        }
        backends.push(cpu_first);
        backends.push(cpu_decode);
        let main = &backends[0];
        let invariant_batches = opts.batch_invariant && opts.n_stream > 1;
        let placement = if !opts.extra_buffers {
            Placement::Plain
        } else if invariant_batches {
            Placement::BatchInvariant { decode: &backends[backends.len() - 1], counts: weights::invariance_counts(opts.n_stream) }
        } else {
            Placement::Fastest
        };
        let model = Model::load(path, main, &placement, opts.stacked_projections.unwrap_or(opts.gpu))?;
        let hp = model.hp.clone();
        let n_ctx = if opts.n_ctx == 0 { hp.n_ctx_train as usize } else { opts.n_ctx };
        if n_ctx > hp.n_ctx_train as usize {
            return Err(EngineError::ContextFull { needed: n_ctx, limit: hp.n_ctx_train as usize });
        }
        let kv = KvCache::new(&hp, n_ctx, opts.gpu, opts.n_stream.max(1), opts.kv_type, main)?;
        let graph_size = ext::graph_nodes(&crate::engine::weights::c_hparams(&hp)) * 2;
        // Each scheduler ends with its own CPU backend (ggml requires the CPU last).
        let n = backends.len();
        let gpu: Vec<&Backend> = backends[..n - 2].iter().collect();
        let first: Vec<&Backend> = gpu.iter().copied().chain([&backends[n - 2]]).collect();
        let decode: Vec<&Backend> = gpu.iter().copied().chain([&backends[n - 1]]).collect();
        let sched_first = Scheduler::new(&first, graph_size)?;
        let sched_decode = Scheduler::new(&decode, graph_size)?;
        // The extension's decode kernels are CPU custom ops: on a GPU they would pull every
        // layer back to the CPU, so GPU engines keep ggml's ops.
        let kernels = (!opts.gpu).then(|| {
            let machine = host::machine();
            let input = kernels::PlanInput {
                backend: &backends[n - 1],
                prefill_backend: &backends[n - 2],
                // past any CPU's last-level cache, as a decode step streams them
                weights: model.layer_matmul_weights(512 << 20),
                kv_type: opts.kv_type.ggml(),
                head_dim: hp.head_dim as usize,
                n_head: hp.n_head as usize,
                n_ctx,
                n_stream: opts.n_stream.max(1),
                invariant: invariant_batches,
                key: format!(
                    "{} | {} | {} | kernels {} | {} | threads {} | streams {} | invariant {} | kv {}",
                    machine.cpu,
                    machine.ggml_cpu.join(" "),
                    crate::long_version(),
                    env!("FRIGG_EXT_SOURCE"),
                    model.placement(),
                    opts.threads,
                    opts.n_stream.max(1),
                    opts.batch_invariant && opts.n_stream > 1,
                    opts.kv_type
                ),
            };
            let choices = kernels::KernelChoices {
                decode_matmul: opts.decode_matmul,
                decode_attention: opts.decode_attention,
                prefill_attention: opts.prefill_attention,
            };
            let mut plan = kernels::plan(&input, choices);
            if invariant_batches {
                plan.matmul_in_layouts = model.extension_layout_weights();
            }
            backends[n - 1].set_reference_kernels(plan.reference_kernels.on);
            plan
        });
        let cpu_decode_attention = kernels.as_ref().is_some_and(|k| k.attention.extension);
        let cpu_decode_matmul = kernels.as_ref().is_some_and(|k| k.matmul.extension);
        let cpu_prefill_attention = kernels.as_ref().is_some_and(|k| k.prefill_attention.extension);
        if let Some(k) = &kernels {
            tracing::info!("{k}");
        }
        let logits = HostBuffer::for_backend(main, hp.n_vocab as usize * opts.n_stream.max(1), "logits")?;
        let mut engine = Engine {
            logits,
            model,
            kv,
            sched_first,
            sched_decode,
            lens: vec![None; opts.n_stream.max(1)],
            backends,
            decode_graph: None,
            graph_size,
            dumped_forwards: None,
            cpu_decode_attention,
            cpu_decode_matmul,
            cpu_prefill_attention,
            cpu_invariant_decode: invariant_batches && !opts.gpu,
            kernels,
            graphs: GraphStats::default(),
            decode_signature: None,
        };
        engine.reserve_compute()?;
        Ok(engine)
    }

    /// A prompt is prefilled in one forward whatever its length, so the prefill compute buffer
    /// is sized for a full-context prompt, and the decode buffer for every stream at full
    /// length, at load time.
    fn reserve_compute(&mut self) -> Result<(), EngineError> {
        let n_ctx = self.kv.n_ctx as i32;
        let worst_first = self.build(self.step(n_ctx, 1, n_ctx, 1, true))?;
        self.sched_first.reserve(worst_first.graph())?;
        let n_kv = (self.kv.n_ctx.div_ceil(KV_PAD) * KV_PAD).min(self.kv.cells_per_stream()) as i32;
        let n_stream = self.kv.n_stream as i32;
        let worst_decode = self.build(self.step(1, n_stream, n_kv, n_stream, false))?;
        self.sched_decode.reserve(worst_decode.graph())?;
        Ok(())
    }

    /// Writes every F32 intermediate whose name contains `filter` to `dir` as .npy, one file
    /// per node and forward (`None` stops dumping).
    pub fn set_dump(&mut self, dir: Option<(std::path::PathBuf, String)>) {
        let forward = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let observer = |dir: &std::path::PathBuf, filter: &String| -> Box<dyn crate::ggml::compute::NodeObserver> { Box::new(Dump { dir: dir.clone(), filter: filter.clone(), forward: forward.clone() }) };
        self.sched_first.observe(dir.as_ref().map(|(d, f)| observer(d, f)));
        self.sched_decode.observe(dir.as_ref().map(|(d, f)| observer(d, f)));
        self.dumped_forwards = dir.map(|_| forward);
    }

    pub fn hparams(&self) -> &HParams {
        &self.model.hp
    }

    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx
    }

    pub fn n_stream(&self) -> usize {
        self.kv.n_stream
    }

    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Compute-buffer bytes currently held.
    pub fn compute_bytes(&self) -> usize {
        // backends = [GPU…, CPU for first forwards, CPU for decode]; each scheduler knows only its own.
        let n = self.backends.len();
        let gpu: usize = self.backends[..n - 2].iter().map(|b| self.sched_first.buffer_size(b) + self.sched_decode.buffer_size(b)).sum();
        gpu + self.sched_first.buffer_size(&self.backends[n - 2]) + self.sched_decode.buffer_size(&self.backends[n - 1])
    }

    pub fn stream_len(&self, stream: StreamId) -> Option<usize> {
        self.lens.get(stream.0).copied().flatten()
    }

    /// Which decode kernels this engine runs, and why (CPU engines).
    pub fn kernels(&self) -> Option<&KernelPlan> {
        self.kernels.as_ref()
    }

    /// Graph builds, allocations and reuse so far (counts from load; the reservation at load
    /// is not counted).
    pub fn graph_stats(&self) -> GraphStats {
        GraphStats {
            allocations: self.sched_first.allocations + self.sched_decode.allocations,
            buffer_growths: self.sched_first.growths + self.sched_decode.growths,
            cuda: crate::ggml::cuda_graph_log(),
            ..self.graphs
        }
    }

    /// Cache cells holding a position of a live sequence, over all streams.
    pub fn cells_in_use(&self) -> usize {
        self.lens.iter().flatten().sum()
    }

    /// Cache cells sequences can use: `n_ctx` per stream.
    pub fn cells(&self) -> usize {
        self.kv.n_ctx * self.kv.n_stream
    }

    /// Frees a stream (its cells are simply reused later).
    pub fn release(&mut self, stream: StreamId) {
        if let Some(l) = self.lens.get_mut(stream.0) {
            *l = None;
        }
    }

    /// The lowest free stream.
    pub fn free_stream(&self) -> Option<StreamId> {
        self.lens.iter().position(Option::is_none).map(StreamId)
    }

    fn check_tokens(&self, tokens: &[TokenId]) -> Result<(), EngineError> {
        let n_vocab = self.model.hp.n_vocab;
        match tokens.iter().find(|t| t.0 >= n_vocab) {
            Some(&id) => Err(EngineError::BadToken { id: id.0, n_vocab }),
            None => Ok(()),
        }
    }

    /// The shape of one forward, with this engine's choice of decode kernels.
    fn step(&self, n_tokens: i32, n_stream: i32, n_kv: i32, n_out: i32, first: bool) -> ext::StepShape {
        ext::StepShape {
            n_tokens,
            n_stream,
            n_kv,
            n_out,
            first: i32::from(first),
            cpu_decode_attention: i32::from(self.cpu_decode_attention),
            cpu_decode_matmul: i32::from(self.cpu_decode_matmul),
            cpu_prefill_attention: i32::from(self.cpu_prefill_attention),
            cpu_invariant_decode: i32::from(self.cpu_invariant_decode),
        }
    }

    fn build(&self, step: ext::StepShape) -> Result<ext::Step, EngineError> {
        Ok(ext::build(&self.model.view(), &self.kv.view(), step, self.graph_size)?)
    }

    /// Runs a built step with its inputs; its `n_out` rows of logits go to the output buffer
    /// when they fit (`logits_of` reads them).
    /// `cancel` (first forwards only) is asked between graph nodes: by the CPU backend after
    /// each node, and on a GPU engine also by the scheduler between pieces of the graph.
    fn run(&mut self, first: bool, built: &ext::Step, inputs: &StepInputs, cancel: Option<&Cancel>) -> Result<RunOutput, EngineError> {
        let sched = if first { &mut self.sched_first } else { &mut self.sched_decode };
        // backends = [GPU…, CPU for first forwards, CPU for decode].
        let on_gpu = self.backends.len() > 2;
        let cpu_first = &self.backends[self.backends.len() - 2];
        let cancel = cancel.filter(|_| first);
        let _cancel_guard = cancel.map(|c| cpu_first.cancel_when(c));
        let n = self.model.hp.n_vocab as usize * inputs.out_rows.len();
        let mut owned = (n > self.logits.len()).then(|| vec![0f32; n]);
        let out = match owned.as_mut() {
            Some(v) => v.as_mut_slice(),
            None => &mut self.logits.as_mut_slice()[..n],
        };
        built.run(sched, inputs, out, cancel.filter(|_| on_gpu)).map_err(|e| match e {
            ComputeError::Cancelled => EngineError::Cancelled,
            e => EngineError::Compute(e),
        })?;
        if let Some(f) = &self.dumped_forwards {
            f.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(owned.map_or(RunOutput::Buffer, RunOutput::Owned))
    }

    /// The logits `run` wrote, as rows `rows` of them.
    fn logits_of(&self, out: RunOutput, rows: Vec<usize>) -> Logits<'_> {
        let data = match out {
            RunOutput::Buffer => std::borrow::Cow::Borrowed(self.logits.as_slice()),
            RunOutput::Owned(v) => std::borrow::Cow::Owned(v),
        };
        Logits { data, n_vocab: self.model.hp.n_vocab as usize, rows }
    }

    /// The first forward of a sequence in `stream`: all `tokens` at positions `0..n`, with the
    /// PrefixLM mask from `token_types` (None = causal; a prompt is all ones). Writes the
    /// stream's cache and returns logits for the requested rows.
    pub fn prefill(&mut self, stream: StreamId, tokens: &[TokenId], token_types: Option<&[i32]>, rows: Rows) -> Result<Logits<'_>, EngineError> {
        self.prefill_cancellable(stream, tokens, token_types, rows, None)
    }

    /// `prefill`, stopped between graph nodes once `cancel` says so (on the CPU): then it
    /// returns `ComputeError::Cancelled` and the stream stays free.
    pub fn prefill_cancellable(&mut self, stream: StreamId, tokens: &[TokenId], token_types: Option<&[i32]>, rows: Rows, cancel: Option<&Cancel>) -> Result<Logits<'_>, EngineError> {
        let _span = tracing::debug_span!("prefill", stream = stream.0, tokens = tokens.len()).entered();
        if stream.0 >= self.kv.n_stream {
            return Err(EngineError::BadStream(stream.0));
        }
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_tokens(tokens)?;
        let n = tokens.len();
        if n > self.kv.n_ctx {
            return Err(EngineError::ContextFull { needed: n, limit: self.kv.n_ctx });
        }
        if let Some(tt) = token_types {
            if tt.len() != n {
                return Err(EngineError::TypesLength { got: tt.len(), expected: n });
            }
        }
        let out: Vec<i32> = match rows {
            Rows::Last => vec![n as i32 - 1],
            Rows::All => (0..n as i32).collect(),
        };
        let step = self.step(n as i32, 1, n as i32, out.len() as i32, true);
        let built = self.build(step)?;
        self.graphs.prefill_builds += 1;
        let pos: Vec<i32> = (0..n as i32).collect();
        let base = (stream.0 * self.kv.cells_per_stream()) as i64;
        let kv_rows: Vec<i64> = (0..n as i64).map(|p| base + p).collect();
        let mut mask = vec![0u16; n * n];
        assert!(fill_mask(&mut mask, n, n, &pos, token_types), "mask arguments are consistent by construction");
        let toks: Vec<i32> = tokens.iter().map(|t| t.0 as i32).collect();
        let inputs = StepInputs { tokens: &toks, pos: &pos, kv_rows: &kv_rows, mask: &mask, out_rows: &out };
        let logits = self.run(true, &built, &inputs, cancel);
        self.sched_first.forget(built.graph());
        let logits = logits?;
        self.lens[stream.0] = Some(n);
        Ok(self.logits_of(logits, (0..out.len()).collect()))
    }

    /// One decode step: each `(stream, token)` appends `token` at its stream's next position.
    /// Returns one row of logits per entry, in order. Streams not listed are untouched: the
    /// graph's padding rows write only the scratch cell of their own stream.
    ///
    /// Batch invariance: decode runs on the CPU backend with ggml's reference kernels, whose
    /// arithmetic per output element does not depend on how many rows the step has.
    pub fn decode(&mut self, batch: &[(StreamId, TokenId)]) -> Result<Logits<'_>, EngineError> {
        let _span = tracing::debug_span!("decode", streams = batch.len()).entered();
        let tokens: Vec<TokenId> = batch.iter().map(|b| b.1).collect();
        self.check_tokens(&tokens)?;
        let mut n_stream = 0;
        let mut n_kv_needed = 0;
        for &(StreamId(s), _) in batch {
            let len = self.stream_len(StreamId(s)).ok_or(EngineError::BadStream(s))?;
            if len + 1 > self.kv.n_ctx {
                return Err(EngineError::ContextFull { needed: len + 1, limit: self.kv.n_ctx });
            }
            n_stream = n_stream.max(s + 1);
            n_kv_needed = n_kv_needed.max(len + 1);
        }
        if batch.is_empty() {
            return Ok(Logits { data: std::borrow::Cow::Borrowed(&[]), n_vocab: self.model.hp.n_vocab as usize, rows: vec![] });
        }
        let cells = self.kv.cells_per_stream();
        let n_kv = (n_kv_needed.div_ceil(KV_PAD) * KV_PAD).min(cells);
        let step = self.step(1, n_stream as i32, n_kv as i32, n_stream as i32, false);
        let reuse = self.decode_graph.as_ref().is_some_and(|b| steps_equal(b.shape(), &step));
        if !reuse {
            if let Some(old) = self.decode_graph.take() {
                self.sched_decode.forget(old.graph());
            }
            self.decode_graph = Some(self.build(step)?);
            self.graphs.decode_builds += 1;
            self.decode_signature = None;
        }

        // Row s is stream s. Streams not in the batch get a padding row that writes their
        // scratch cell (n_ctx) at position 0 and attends to cell 0 only; its logits are dropped.
        let mut toks = vec![0i32; n_stream];
        let mut pos = vec![0i32; n_stream];
        let mut rows: Vec<i64> = (0..n_stream).map(|s| (s * cells + self.kv.n_ctx) as i64).collect();
        let mut mask = vec![0u16; n_stream * n_kv];
        for s in 0..n_stream {
            fill_mask(&mut mask[s * n_kv..(s + 1) * n_kv], n_kv, n_kv, &[0], None);
        }
        for &(StreamId(s), t) in batch {
            let p = self.lens[s].expect("checked above");
            toks[s] = t.0 as i32;
            pos[s] = p as i32;
            rows[s] = (s * cells + p) as i64;
            // Decode rows see their whole sequence: cells 0..=p.
            assert!(fill_mask(&mut mask[s * n_kv..(s + 1) * n_kv], p + 1, n_kv, &[p as i32], None));
        }
        let out: Vec<i32> = (0..n_stream as i32).collect();
        let built = self.decode_graph.take().expect("built above");
        let inputs = StepInputs { tokens: &toks, pos: &pos, kv_rows: &rows, mask: &mask, out_rows: &out };
        let logits = self.run(false, &built, &inputs, None);
        let signature = built.graph().signature();
        if reuse {
            self.graphs.decode_reuses += 1;
            self.graphs.decode_changes += u64::from(self.decode_signature != Some(signature));
        }
        self.decode_signature = Some(signature);
        self.decode_graph = Some(built);
        let logits = logits?;
        for &(StreamId(s), _) in batch {
            *self.lens[s].as_mut().expect("checked") += 1;
        }
        // output row s is stream s
        Ok(self.logits_of(logits, batch.iter().map(|&(StreamId(s), _)| s).collect()))
    }

    /// Benchmarks only: marks `len` positions of `stream` as filled without computing them
    /// (their cache cells hold whatever they held). Decode attends to all of them, so its
    /// cost is that of a real sequence at this length; its logits mean nothing.
    pub fn fill_for_benchmark(&mut self, stream: StreamId, len: usize) -> Result<(), EngineError> {
        if stream.0 >= self.kv.n_stream || len >= self.kv.n_ctx {
            return Err(EngineError::BadStream(stream.0));
        }
        self.lens[stream.0] = Some(len);
        Ok(())
    }

    /// Shortens a stream to `len` positions (regenerate from there); later cells are masked.
    pub fn rewind(&mut self, stream: StreamId, len: usize) -> Result<(), EngineError> {
        match self.lens.get_mut(stream.0) {
            Some(Some(l)) if len <= *l => {
                *l = len;
                Ok(())
            }
            _ => Err(EngineError::BadStream(stream.0)),
        }
    }

    /// Copies the first `len` cells of every virtual layer from stream `src` into stream `dst`
    /// (n > 1 choices share one prefill).
    pub fn fork(&mut self, src: StreamId, dst: StreamId) -> Result<(), EngineError> {
        let len = self.stream_len(src).ok_or(EngineError::BadStream(src.0))?;
        if dst.0 >= self.kv.n_stream || dst == src {
            return Err(EngineError::BadStream(dst.0));
        }
        self.kv.copy_stream(src.0, dst.0, len);
        self.lens[dst.0] = Some(len);
        Ok(())
    }

    /// Moves stream `src`'s sequence into the free stream `dst`: its cells are copied and `src`
    /// is freed. A decode step computes rows 0..=the highest stream it names, so packing live
    /// sequences low keeps free streams below them from costing a padding row every step.
    pub fn move_stream(&mut self, src: StreamId, dst: StreamId) -> Result<(), EngineError> {
        if self.stream_len(dst).is_some() {
            return Err(EngineError::BadStream(dst.0));
        }
        self.fork(src, dst)?;
        self.release(src);
        Ok(())
    }
}

fn steps_equal(a: &ext::StepShape, b: &ext::StepShape) -> bool {
    (a.n_tokens, a.n_stream, a.n_kv, a.n_out, a.first) == (b.n_tokens, b.n_stream, b.n_kv, b.n_out, b.first)
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(b) = self.decode_graph.take() {
            self.sched_decode.forget(b.graph());
        }
    }
}
