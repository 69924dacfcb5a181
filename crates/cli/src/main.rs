//! `nextok` — the command-line front end of the nextok decoding runtime.
//!
//! * `nextok explain FILE [--json]` — run one step from a JSON request and print its ledger.
//! * `nextok bench sampler [--json]` — interleaved sampler benchmarks (floor / naive / nextok).
//! * `nextok bench decode [--json]` — decode tokens/s on the real model: unconstrained, JSON
//!   schema (mask overlapped or inline), trace on; Q4_1 and Q8_0.
//! * `nextok bench engine [--json] [--llama-cpp [--pairs N]]` — continuous batching: aggregate
//!   tokens/s, time to first token and inter-token latency at 1, 4, 16 and 64 concurrent
//!   requests against the one-at-a-time loop; prefill against decode; optionally llama.cpp on
//!   the same file, paired with nextok (prompt, decode and 16 streams, alternating).
//! * `nextok bench speculative [--json]` — plain against speculative decoding (prompt lookup, a
//!   draft model) on the real model.
//! * `nextok serve [--model PATH] [--host H] [--port P] [--max-num-seqs N] [--api-key KEY]` —
//!   the OpenAI-compatible server (chat and completions, streaming, metrics, explain, traces).
//! * `nextok vocab --tokenizer FILE | --model FILE.gguf [--id N...] [--json]` — a vocabulary's
//!   size, EOS, BOS and special ids, and the exact bytes of tokens.
//! * `nextok tokenize --tokenizer FILE | --model FILE.gguf --text T [--json]` — ids and bytes.

/// Writes to standard output; a closed pipe (the reader has gone, as in `nextok vocab --json |
/// head -1`) ends the process normally, with status 0, and any other write error ends it with
/// a one-line error. Every writer to standard output goes through here (`out!` / `outln!`).
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>, flush: bool) {
    use std::io::Write;
    let mut lock = std::io::stdout().lock();
    let r = lock
        .write_fmt(args)
        .and_then(|()| if flush { lock.flush() } else { Ok(()) });
    if let Err(e) = r {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(2);
    }
}

/// `print!` that ends the process normally on a closed pipe (see [`write_stdout`]); flushes.
macro_rules! out {
    ($($arg:tt)*) => { $crate::write_stdout(format_args!($($arg)*), true) };
}

/// `println!` that ends the process normally on a closed pipe (see [`write_stdout`]).
macro_rules! outln {
    () => { $crate::write_stdout(format_args!("\n"), false) };
    ($($arg:tt)*) => { $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*)), false) };
}

mod constrain;
mod error;
mod explain;
mod generate;
mod serve;
mod vocab;

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
    /// Run benchmarks: `nextok bench sampler`, `decode`, `engine` or `speculative`.
    #[command(subcommand)]
    Bench(nextok_bench::BenchCmd),
    /// Print a vocabulary's size, EOS and special tokens, and the exact bytes of tokens.
    Vocab(vocab::VocabArgs),
    /// Tokenize a text and print each token's ids and bytes.
    Tokenize(vocab::TokenizeArgs),
    /// Check a text against a constraint (JSON schema, regex, choice, grammar), token by token.
    Constrain(constrain::ConstrainArgs),
    /// Generate text from a GGUF model, streaming it to stdout.
    Generate(Box<generate::GenerateArgs>),
    /// Re-run a `generate --trace` file and check every step bit for bit.
    Replay(generate::ReplayArgs),
    /// Serve the OpenAI API (chat and completions, streaming) over the engine.
    Serve(Box<serve::ServeArgs>),
}

/// mimalloc rather than the C library's allocator (docs/performance.md). The weights' planes
/// take their own mappings advised for transparent huge pages (a decode step streams every
/// weight); mimalloc is built without advising its own arenas (`no_thp`), whose huge pages
/// also held their freed and partly used ranges. Results do not depend on the allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Hands the memory freed so far back to the system now: what loading a model built and
/// dropped (the file's metadata, the tokenizer's temporary tables) would otherwise stay
/// resident until mimalloc's delayed purge, which runs only when the freeing thread allocates
/// again — and the loading thread goes on to wait on the server's socket.
pub(crate) fn return_freed_memory() {
    // SAFETY: `mi_collect` takes no pointers and may be called from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Explain(a) => explain::run(a),
        Cmd::Bench(b) => nextok_bench::run(b).map_err(error::CliError::from),
        Cmd::Vocab(a) => vocab::run_vocab(a),
        Cmd::Tokenize(a) => vocab::run_tokenize(a),
        Cmd::Constrain(a) => constrain::run(a),
        Cmd::Generate(a) => generate::run(*a),
        Cmd::Replay(a) => generate::run_replay(a),
        Cmd::Serve(a) => serve::run(*a),
    };
    // what is still buffered goes out now (a closed pipe is a normal end here too)
    write_stdout(format_args!(""), true);
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_silent() => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {}", e.message().replace('\n', " "));
            ExitCode::from(2)
        }
    }
}
