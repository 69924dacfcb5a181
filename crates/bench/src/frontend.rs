//! What the command-line front end lends the benchmarks: its standard-output writer and its
//! model loader, installed once by [`crate::run`].

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nextok_model::{Model, Requant};

/// The front end's services the benchmarks use.
#[derive(Clone, Copy, Debug)]
pub struct Frontend {
    /// Writes to standard output, flushing when asked; on a closed pipe it ends the process
    /// normally, as every other subcommand does.
    pub write_stdout: fn(std::fmt::Arguments<'_>, bool),
    /// The model file: the `--model` argument, or the default model (fetched once).
    pub model_path: fn(Option<&Path>) -> Result<PathBuf, String>,
    /// Loads a model with a re-quantisation, reporting it on standard error.
    pub load_model: fn(&Path, Requant) -> Result<Model, String>,
}

static FRONTEND: OnceLock<Frontend> = OnceLock::new();

/// Installs `frontend` (the first one installed stays: a process has one front end).
pub(crate) fn install(frontend: Frontend) {
    let _ = FRONTEND.set(frontend);
}

fn get() -> Result<&'static Frontend, String> {
    FRONTEND
        .get()
        .ok_or_else(|| "the benchmarks run through nextok_bench::run".to_string())
}

/// Writes through the front end (plain `print!` before one is installed).
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>, flush: bool) {
    match FRONTEND.get() {
        Some(f) => (f.write_stdout)(args, flush),
        None => print!("{args}"),
    }
}

/// The front end's model file for `--model`.
pub(crate) fn model_path(arg: Option<&Path>) -> Result<PathBuf, String> {
    (get()?.model_path)(arg)
}

/// The front end's model loader.
pub(crate) fn load_model(path: &Path, requant: Requant) -> Result<Model, String> {
    (get()?.load_model)(path, requant)
}

/// The prompt ids of one user message: rendered with the model's chat template when the file
/// has one, else the text itself (a base model such as Gemma 3 270M has none).
pub(crate) fn user_prompt(model: &Model, text: &str) -> Result<Vec<u32>, String> {
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
