//! `nextok` — the command-line front end of the nextok decoding runtime.
//!
//! * `nextok explain FILE [--json]` — run one step from a JSON request and print its ledger.
//! * `nextok bench sampler [--json]` — interleaved sampler benchmarks (floor / naive / nextok).

mod bench;
mod explain;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "nextok",
    version,
    about = "Explainable, reproducible next-token selection"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one step from a JSON request and print the decoding ledger.
    Explain(explain::ExplainArgs),
    /// Run benchmarks (`nextok bench sampler`).
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Explain(a) => explain::run(a),
        Cmd::Bench(a) => bench::run(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {}", msg.replace('\n', " "));
            ExitCode::from(2)
        }
    }
}
