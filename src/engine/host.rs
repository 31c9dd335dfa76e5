//! Facts about the machine: its CPU and memory (for the memory budget and every benchmark
//! table), its load, and a GPU's temperature.

use serde::Serialize;

/// The machine a figure was measured on.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub mem_gib: f64,
    pub cpu_flags: Vec<String>,
    /// The CPU features ggml reports for this build on this machine (`Backend::cpu_features`):
    /// which of its kernels can run, and its extra buffer types (REPACK, AMX_INT8, …).
    #[serde(default)]
    pub ggml_cpu: Vec<String>,
    /// What the frigg that measured was compiled for (`FRIGG_BUILT_FOR`: a portable install's
    /// build name, else the target CPU), empty in files from before it was recorded.
    #[serde(default)]
    pub build: String,
}

impl Machine {
    /// "CPU · cores · memory · flags … · ggml CPU …", the line under every benchmark table.
    pub fn describe(&self) -> String {
        let build = if self.build.is_empty() { String::new() } else { format!(" · frigg built for {}", self.build) };
        format!(
            "{} · {} cores · {:.1} GiB · flags {} · ggml CPU features {}{build}",
            self.cpu,
            self.cores,
            self.mem_gib,
            self.cpu_flags.join(" "),
            if self.ggml_cpu.is_empty() { "not recorded".to_string() } else { self.ggml_cpu.join(" ") }
        )
    }
}

pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| cpuinfo.lines().find(|l| l.starts_with(name)).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string());
    let flags = field("flags").unwrap_or_default();
    // scripts/machine-tag.sh compares result files by this same list: keep the two equal
    let wanted = ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16", "f16c", "fma", "asimd", "sve"];
    Machine {
        cpu: field("model name").unwrap_or_else(|| "unknown".into()),
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        mem_gib: meminfo_bytes("MemTotal").unwrap_or(0) as f64 / (1u64 << 30) as f64,
        cpu_flags: flags.split_whitespace().filter(|f| wanted.contains(f)).map(str::to_string).collect(),
        ggml_cpu: crate::ggml::compute::Backend::cpu_features(),
        build: env!("FRIGG_BUILT_FOR").to_string(),
    }
}

/// A /proc/meminfo field ("MemTotal", "MemAvailable", …) in bytes.
pub fn meminfo_bytes(field: &str) -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = m.lines().find(|l| l.split(':').next() == Some(field))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The first GPU's temperature in °C, from `nvidia-smi` (None without one).
pub fn gpu_temperature() -> Option<f64> {
    let out = std::process::Command::new("nvidia-smi").args(["--query-gpu=temperature.gpu", "--format=csv,noheader,nounits", "--id=0"]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// The 1-minute load average.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok())).unwrap_or(-1.0)
}
