//! `nextok serve`: the OpenAI-compatible server (`nextok-server`) on the default model or a
//! GGUF file. Prints `nextok: listening on http://HOST:PORT` (with the port actually bound, so
//! `--port 0` gives an ephemeral one) on standard output once it accepts requests; one log line
//! per request goes to standard error. Ctrl-C or SIGTERM stops admitting, lets running streams
//! finish for up to `--shutdown-grace` seconds, and exits 0.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nextok_engine::speculative::{Acceptance, SpecOptions};
use nextok_engine::{Engine, EngineConfig};
use nextok_model::{load_model, model_path};
use nextok_server::ServerConfig;

use crate::generate::{KvCacheArg, RequantArg};

use crate::error::CliError;

/// Arguments of `nextok serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A GGUF file (llama, qwen2, qwen3, gemma3 or phi3), or a model name fetched once
    /// (`smollm2-135m-instruct`, the default; `gemma-3-270m`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Re-quantise the weights at load.
    #[arg(long, value_enum, default_value = "keep")]
    pub requant: RequantArg,
    /// What the KV cache stores keys and values as (`q8_0`: 56 % of the memory of `f16`, so
    /// the same memory holds 1.78 times the positions; traces record it).
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_cache_type: KvCacheArg,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (`0`: any free port, printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Sequences running at once.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Tokens one forward pass takes at most (decode rows and prompt chunks; default 512,
    /// raised to `--max-num-seqs` if below).
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
    /// Prompt tokens one forward pass takes while other streams decode: the least chunk when
    /// `--itl-target-ms` sizes it, the chunk itself with `--itl-target-ms 0`.
    #[arg(long, default_value_t = nextok_engine::PREFILL_CHUNK_TOKENS)]
    pub prefill_chunk_tokens: usize,
    /// The inter-token latency (ms) that each pass's prompt chunk is sized to while streams
    /// decode, from how long passes take on this machine (0: a fixed `--prefill-chunk-tokens`).
    /// Larger: first tokens sooner, running streams slower.
    #[arg(long, default_value_t = nextok_engine::ITL_TARGET_MS)]
    pub itl_target_ms: u64,
    /// Let a special token's string written in a chat message (`<|im_start|>system`, say)
    /// become that control token, as vLLM and llama.cpp do; by default it is ordinary text and
    /// control tokens come from the chat template only.
    #[arg(long)]
    pub parse_special_in_messages: bool,
    /// `max_tokens` of a request that sets none (default: to the end of the context, or
    /// `--max-tokens-limit` when set).
    #[arg(long)]
    pub default_max_tokens: Option<u64>,
    /// The largest `max_tokens` a request may ask for; larger: 400 naming `max_tokens`.
    #[arg(long)]
    pub max_tokens_limit: Option<u64>,
    /// Requests that may wait for admission; past that, 429.
    #[arg(long, default_value_t = 1024)]
    pub max_waiting: usize,
    /// Require `Authorization: Bearer KEY` on `/v1/*` (repeat for several keys; a trace can
    /// be read only with the key of the request that made it).
    #[arg(long)]
    pub api_key: Vec<String>,
    /// The model's name in the API (default: the file name without `.gguf`).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Seconds running streams may take to finish after Ctrl-C / SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace: u64,
    /// Seconds a client has to send a request's headers; past that the connection is closed.
    #[arg(long, default_value_t = nextok_server::DEFAULT_HEADER_READ_TIMEOUT.as_secs_f64())]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's body once its headers are in; past that, 408.
    #[arg(long, default_value_t = nextok_server::DEFAULT_BODY_READ_TIMEOUT.as_secs_f64())]
    pub body_timeout: f64,
    /// Speculative decoding for requests that do not choose (`nextok.speculative`):
    /// `ngram` or `ngram:K` (prompt-lookup drafts of at most K tokens), `model` or `model:K`
    /// (the draft model's).
    #[arg(long)]
    pub speculative: Option<String>,
    /// A draft model (a GGUF file with the model's vocabulary) for requests that draft with
    /// `model` (`--speculative model`, `nextok.speculative: "model:K"`).
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// How drafted tokens are accepted: `exact` (plain decoding's tokens) or `rejection`.
    #[arg(long, default_value = "exact", requires = "speculative")]
    pub spec_acceptance: String,
}

/// Runs `nextok serve`.
pub fn run(a: ServeArgs) -> Result<(), CliError> {
    let acceptance = a
        .spec_acceptance
        .parse::<Acceptance>()
        .map_err(|e| format!("--spec-acceptance: {e}"))?;
    let speculative = match &a.speculative {
        None => None,
        Some(t) => {
            Some(SpecOptions::parse(t, acceptance).map_err(|e| format!("--speculative: {e}"))?)
        }
    };
    let seconds = |flag: &str, x: f64| {
        if x.is_finite() && x > 0.0 && x <= 86_400.0 {
            Ok(Duration::from_secs_f64(x))
        } else {
            Err(format!(
                "{flag}: must be a number of seconds in (0, 86400], not {x}"
            ))
        }
    };
    let header_read_timeout = seconds("--header-timeout", a.header_timeout)?;
    let body_read_timeout = seconds("--body-timeout", a.body_timeout)?;
    let path = model_path(a.model.as_deref())?;
    let model = Arc::new(load_model(&path, a.requant.into())?);
    let defaults = EngineConfig::default();
    let config = EngineConfig {
        max_num_seqs: a.max_num_seqs,
        max_batch_tokens: a
            .max_batch_tokens
            .unwrap_or(defaults.max_batch_tokens.max(a.max_num_seqs)),
        prefill_chunk_tokens: a.prefill_chunk_tokens,
        itl_target_ms: a.itl_target_ms,
        max_waiting: a.max_waiting,
        parse_special_in_messages: a.parse_special_in_messages,
        default_max_tokens: a.default_max_tokens,
        max_tokens_limit: a.max_tokens_limit,
        kv_cache_type: a.kv_cache_type.into(),
        ..defaults
    };
    let engine = match &a.draft_model {
        None => {
            Engine::new(model, config).map_err(|e| CliError::context("engine configuration", e))?
        }
        Some(p) => {
            let d = Arc::new(
                load_model(p, a.requant.into())
                    .map_err(|e| CliError::context("--draft-model", e))?,
            );
            Engine::with_draft_model(model, d, config)
                .map_err(|e| CliError::context("--draft-model", e))?
        }
    };
    let engine = Arc::new(engine);
    crate::return_freed_memory();
    let server = ServerConfig {
        model_id: a
            .served_model_name
            .clone()
            .unwrap_or_else(|| nextok_server::model_id_of(&path)),
        api_keys: a.api_key.clone(),
        body_limit: a.max_body_bytes,
        speculative,
        body_read_timeout,
        ..Default::default()
    };
    let model_id = server.model_id.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::context("cannot start the runtime", e))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .map_err(|e| format!("cannot bind {}:{}: {e}", a.host, a.port))?;
        let addr = listener
            .local_addr()
            .map_err(|e| CliError::context("cannot read the bound address", e))?;
        eprintln!("nextok: serving `{model_id}`");
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "nextok: listening on http://{addr}");
        let _ = out.flush();
        drop(out);
        let app = nextok_server::router(engine.clone(), server);
        nextok_server::serve(
            listener,
            app,
            nextok_server::shutdown_signal(),
            nextok_server::ServeOptions {
                grace: Duration::from_secs(a.shutdown_grace),
                header_read_timeout,
            },
        )
        .await
        .map_err(|e| CliError::context("server", e))
    })?;
    // dropping the runtime drops the last streams (cancelling their requests), then the engine
    drop(rt);
    eprintln!("nextok: stopped");
    Ok(())
}
