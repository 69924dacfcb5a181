//! Opening a model the way nextok's front ends do (`nextok generate`, `serve`, `bench`, …): the
//! file a `--model` argument names ([`model_path`]: a path, a model name, or the default model)
//! and a load that reports itself on standard error ([`load_model`]).

use std::path::{Path, PathBuf};

use crate::{fetch, Model, Requant, Result};

/// The model file a `--model` argument names: a path, or a model name
/// ([`fetch::NAMED_MODELS`]: `smollm2-135m-instruct`, `gemma-3-270m`) fetched into the cache
/// once and hash-checked; the default model ([`fetch::default_model`]) when absent. An
/// existing file of that name wins over a model name.
pub fn model_path(arg: Option<&Path>) -> Result<PathBuf> {
    match arg {
        Some(p) if !p.exists() => match p.to_str().and_then(fetch::named_model) {
            Some(r) => r,
            None => Ok(p.to_path_buf()),
        },
        Some(p) => Ok(p.to_path_buf()),
        None => fetch::default_model(),
    }
}

/// [`Model::load`], then one line on standard error naming the file, its layers, its
/// vocabulary size, the re-quantisation and the load time.
pub fn load_model(path: &Path, requant: Requant) -> Result<Model> {
    let t = std::time::Instant::now();
    let m = Model::load(path, requant)?;
    eprintln!(
        "nextok: {} ({} layers, vocabulary {}, requant {}) loaded in {:.1} s",
        path.file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        m.weights.config.n_layer,
        m.weights.config.vocab_size,
        requant.name(),
        t.elapsed().as_secs_f64()
    );
    Ok(m)
}
