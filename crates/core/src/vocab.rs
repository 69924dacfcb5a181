//! What the core needs to know about a vocabulary: its size, its EOS ids and which ids are
//! special/control tokens. (Token bytes live with the tokenizer, outside the pure core.)

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Vocabulary facts used by processors and validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VocabInfo {
    /// Number of token ids (`logits.len()` must equal it).
    pub vocab_size: usize,
    /// End-of-sequence token ids.
    #[serde(default)]
    pub eos_token_ids: Vec<u32>,
    /// Special/control token ids (excluded from penalties by default, hidden by the special mask).
    #[serde(default)]
    pub special_token_ids: Vec<u32>,
}

impl VocabInfo {
    /// A vocabulary of `vocab_size` plain tokens with no EOS and no special tokens.
    pub fn plain(vocab_size: usize) -> Self {
        VocabInfo {
            vocab_size,
            eos_token_ids: Vec::new(),
            special_token_ids: Vec::new(),
        }
    }

    /// Checks sizes and ids; returns a copy with id lists sorted and deduplicated.
    pub fn validated(&self) -> Result<VocabInfo> {
        if self.vocab_size == 0 {
            return Err(Error::invalid("vocab_size", "must be at least 1"));
        }
        if self.vocab_size > u32::MAX as usize {
            return Err(Error::invalid("vocab_size", "must fit in 32-bit token ids"));
        }
        let mut v = self.clone();
        for (name, ids) in [
            ("eos_token_ids", &mut v.eos_token_ids),
            ("special_token_ids", &mut v.special_token_ids),
        ] {
            for (i, &t) in ids.iter().enumerate() {
                if t as usize >= self.vocab_size {
                    return Err(Error::out_of_range(
                        format!("{name}[{i}]"),
                        t as u64,
                        self.vocab_size,
                    ));
                }
            }
            ids.sort_unstable();
            ids.dedup();
        }
        Ok(v)
    }

    /// Whether `id` is a special token (`special_token_ids` must be sorted, as after validation).
    #[inline]
    pub fn is_special(&self, id: u32) -> bool {
        self.special_token_ids.binary_search(&id).is_ok()
    }
}
