//! nextok's benchmarks — not library code, never published.
//!
//! * [`fixtures`] — deterministic logits rows and ready-made per-step and batch workloads, shared
//!   by the criterion benchmark (`benches/sampler.rs`), `nextok bench sampler` and the core's
//!   tests that need a realistic row.
//! * [`run`] (feature `cli`, on by default) — the `nextok bench` subcommands: `sampler`
//!   (synthetic rows, floor / naive / nextok interleaved), `decode`, `engine` and `speculative`
//!   (the real model). The command-line front end parses [`BenchArgs`] and lends its standard
//!   output and model loader through a [`Frontend`], so the benchmarks print and load exactly as
//!   its other subcommands do.

#[cfg(feature = "cli")]
mod frontend;
#[cfg(feature = "cli")]
pub use frontend::Frontend;

/// `println!` through the front end's standard-output writer (see [`Frontend::write_stdout`]).
#[cfg(feature = "cli")]
macro_rules! outln {
    () => { $crate::frontend::write_stdout(format_args!("\n"), false) };
    ($($arg:tt)*) => {
        $crate::frontend::write_stdout(format_args!("{}\n", format_args!($($arg)*)), false)
    };
}

#[cfg(feature = "cli")]
mod decode;
#[cfg(feature = "cli")]
mod engine;
pub mod fixtures;
#[cfg(feature = "cli")]
mod llama_peer;
#[cfg(feature = "cli")]
mod llama_tools;
#[cfg(feature = "cli")]
mod sampler;
#[cfg(feature = "cli")]
mod speculative;

#[cfg(feature = "cli")]
pub use sampler::BenchArgs;

/// Runs `nextok bench` with the front end's standard output and model loader.
#[cfg(feature = "cli")]
pub fn run(args: BenchArgs, frontend: Frontend) -> Result<(), String> {
    frontend::install(frontend);
    sampler::run(args)
}

#[cfg(all(test, feature = "cli"))]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: super::BenchArgs,
    }

    #[test]
    fn pairs_default_to_five_and_zero_is_rejected_by_name() {
        let ok = Cli::try_parse_from(["nextok", "engine", "--llama-cpp"]).unwrap();
        assert_eq!(ok.bench.pairs, 5);
        let ok = Cli::try_parse_from(["nextok", "engine", "--pairs", "1"]).unwrap();
        assert_eq!(ok.bench.pairs, 1);
        let err = Cli::try_parse_from(["nextok", "engine", "--llama-cpp", "--pairs", "0"])
            .err()
            .expect("--pairs 0 is rejected");
        assert!(err.to_string().contains("--pairs"), "{err}");
    }
}
