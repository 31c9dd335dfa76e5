use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use frigg::convert::{self, ConvertOptions, OutType};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

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
        #[arg(long = "type", value_enum, default_value = "bf16")]
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
    /// Show a GGUF's metadata, tensors and whether frigg can run it.
    Inspect {
        file: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
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
        Command::Inspect { file, json } => match frigg::inspect::inspect(&file) {
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
