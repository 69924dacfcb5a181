//! Chat templates: the GGUF `tokenizer.chat_template` (Jinja) rendered with `minijinja`.
//!
//! The template sees `messages` (a list of `{role, content}`), `add_generation_prompt`,
//! `bos_token` and `eos_token`, and a `raise_exception(message)` function, as in the Hugging
//! Face renderer.

use serde::Serialize;

use crate::error::{ModelError, ModelErrorKind, Result};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, …
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message from `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Renders `template` for `messages`.
pub fn render(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let mut env = minijinja::Environment::new();
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.render_str(
        template,
        minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
        },
    )
    .map_err(|e| {
        ModelError::new(format!("chat template: {e}"))
            .with_kind(ModelErrorKind::Template)
            .with_source(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nDefault<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_default_system() {
        let s = render(CHATML, &[Message::new("user", "Hi")], true, "", "").unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nDefault<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_is_an_error() {
        let e = render("{{ raise_exception('no') }}", &[], false, "", "").unwrap_err();
        assert!(e.message().contains("no"), "{e}");
    }
}
