//! The `frigg` command line: every subcommand is parsed and dispatched in `cli`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
