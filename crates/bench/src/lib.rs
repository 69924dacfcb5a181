//! nextok's benchmarks — not library code, never published.
//!
//! * [`fixtures`] — deterministic logits rows (from [`nextok_testdata::rows`]) and ready-made
//!   per-step and batch workloads, shared by the criterion benchmark (`benches/sampler.rs`) and
//!   `nextok bench sampler`.
//! * [`run`] — the `nextok bench` subcommands ([`BenchCmd`]): `sampler` (synthetic rows,
//!   floor / naive / nextok interleaved), `decode`, `engine` and `speculative` (the real model).
//!   The command-line front end parses a [`BenchCmd`] and calls [`run`]. Models are found and
//!   loaded as the front end's other subcommands do ([`nextok_model::model_path`],
//!   [`nextok_model::load_model`]), and standard output is written as they write it: a closed
//!   pipe ends the process normally.

use std::path::{Path, PathBuf};

use nextok_model::{Model, Requant};

/// Writes to standard output; a closed pipe (the reader has gone, as in `nextok bench sampler
/// --json | head -1`) ends the process normally, with status 0, and any other write error ends
/// it with a one-line error, as the `nextok` command's own writer does.
fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(2);
    }
}

/// `println!` that ends the process normally on a closed pipe (see [`write_stdout`]).
macro_rules! outln {
    () => { $crate::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

mod decode;
mod engine;
pub mod fixtures;
mod llama_peer;
mod llama_tools;
mod memory;
mod peak;
mod sampler;
mod speculative;

pub use decode::DecodeArgs;
pub use engine::EngineArgs;
pub use sampler::SamplerArgs;
pub use speculative::SpeculativeArgs;

/// `nextok bench`: which benchmark to run, with its own flags.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum BenchCmd {
    /// The sampler on synthetic rows (no model): the floor (one summing pass), a naive
    /// full-sort sampler and nextok interleaved, and batch stepping on one thread against two.
    Sampler(SamplerArgs),
    /// Decode tokens/s on the real model: unconstrained, JSON schema (mask overlapped or
    /// inline), trace on; the file as shipped and re-quantised to Q8_0.
    Decode(DecodeArgs),
    /// Continuous batching on the real model: aggregate tokens/s, time to first token and
    /// inter-token latency at several concurrency levels against the one-at-a-time loop;
    /// optionally llama.cpp on the same file, paired with nextok.
    Engine(EngineArgs),
    /// Plain against speculative decoding (prompt lookup, a draft model) on the real model.
    Speculative(SpeculativeArgs),
}

/// The flags of the benchmarks that run a real model (`decode`, `engine`, `speculative`).
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file of a supported family, or a model name (default: the default model, fetched
    /// once).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Use at most these kernels: `scalar`, `avx2`, `avx512` or `avx512-vnni` (default: the
    /// best this CPU has; results do not change, only the speed). One cap for every kernel:
    /// the model's matrix kernels and the sampler's follow it.
    #[arg(long)]
    pub kernels: Option<String>,
}

impl ModelArgs {
    /// Caps every kernel at `--kernels`, if given.
    fn cap_kernels(&self) -> Result<(), String> {
        if let Some(name) = &self.kernels {
            let level = nextok_core::cpu::Level::from_name(name).ok_or_else(|| {
                format!("unknown --kernels `{name}` (expected scalar, avx2, avx512 or avx512-vnni)")
            })?;
            nextok_core::cpu::set_max_level(level);
        }
        Ok(())
    }

    /// The model file: `--model`, or the default model (fetched once).
    fn path(&self) -> Result<PathBuf, String> {
        model_path(self.model.as_deref())
    }
}

/// Runs one `nextok bench` subcommand.
pub fn run(cmd: BenchCmd) -> Result<(), String> {
    match cmd {
        BenchCmd::Sampler(a) => sampler::run(&a),
        BenchCmd::Decode(a) => {
            a.model.cap_kernels()?;
            decode::run(&a)
        }
        BenchCmd::Engine(a) => {
            a.model.cap_kernels()?;
            engine::run(&a)
        }
        BenchCmd::Speculative(a) => {
            a.model.cap_kernels()?;
            speculative::run(&a)
        }
    }
}

/// The model file `arg` names (see [`nextok_model::model_path`]).
fn model_path(arg: Option<&Path>) -> Result<PathBuf, String> {
    nextok_model::model_path(arg).map_err(|e| e.to_string())
}

/// Loads a model with a re-quantisation, reporting it on standard error (see
/// [`nextok_model::load_model`]).
fn load_model(path: &Path, requant: Requant) -> Result<Model, String> {
    nextok_model::load_model(path, requant).map_err(|e| e.to_string())
}

/// The prompt ids of one user message: rendered with the model's chat template when the file
/// has one, else the text itself (a base model such as Gemma 3 270M has none).
fn user_prompt(model: &Model, text: &str) -> Result<Vec<u32>, String> {
    let rendered = if model.chat_template.is_some() {
        model
            .render_chat(
                &[nextok_model::chat::Message::new("user", text.to_string())],
                true,
            )
            .map_err(|e| e.to_string())?
    } else {
        text.to_string()
    };
    model.encode_prompt(&rendered).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::BenchCmd;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        bench: BenchCmd,
    }

    fn engine(args: &[&str]) -> super::EngineArgs {
        match Cli::try_parse_from(args).unwrap().bench {
            BenchCmd::Engine(a) => a,
            other => panic!("not `engine`: {other:?}"),
        }
    }

    #[test]
    fn pairs_default_to_five_and_zero_is_rejected_by_name() {
        assert_eq!(engine(&["nextok", "engine", "--llama-cpp"]).pairs, 5);
        assert_eq!(engine(&["nextok", "engine", "--pairs", "1"]).pairs, 1);
        let err = Cli::try_parse_from(["nextok", "engine", "--llama-cpp", "--pairs", "0"])
            .err()
            .expect("--pairs 0 is rejected");
        assert!(err.to_string().contains("--pairs"), "{err}");
    }

    #[test]
    fn each_subcommand_takes_only_its_own_flags() {
        let ok = [
            &[
                "nextok",
                "sampler",
                "--real",
                "--model",
                "m.gguf",
                "--no-flat",
                "--simd",
                "avx2",
            ][..],
            &[
                "nextok",
                "decode",
                "--model",
                "m.gguf",
                "--kernels",
                "avx2",
                "--max-tokens",
                "8",
            ],
            &[
                "nextok",
                "engine",
                "--model",
                "m.gguf",
                "--llama-cpp",
                "--pairs",
                "5",
                "--reps",
                "1",
            ],
            &[
                "nextok",
                "speculative",
                "--tasks",
                "chat",
                "--reps",
                "7",
                "--max-tokens",
                "128",
            ],
        ];
        for args in ok {
            Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
        let wrong = [
            &["nextok", "sampler", "--llama-cpp"][..],
            &["nextok", "sampler", "--max-tokens", "8"],
            &["nextok", "decode", "--llama-lib", "libllama.so"],
            &["nextok", "decode", "--concurrency", "1"],
            &["nextok", "engine", "--tasks", "chat"],
            &["nextok", "speculative", "--pairs", "3"],
        ];
        for args in wrong {
            assert!(Cli::try_parse_from(args).is_err(), "{args:?} is accepted");
        }
    }

    #[test]
    fn the_command_is_well_formed() {
        Cli::command().debug_assert();
    }
}
