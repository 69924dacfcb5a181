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
        Ok(VocabInfo {
            vocab_size: self.vocab_size,
            eos_token_ids: sorted_ids("eos_token_ids", &self.eos_token_ids, self.vocab_size)?,
            special_token_ids: sorted_ids(
                "special_token_ids",
                &self.special_token_ids,
                self.vocab_size,
            )?,
        })
    }

    /// Whether `id` is a special token (`special_token_ids` must be sorted, as after validation).
    #[inline]
    pub fn is_special(&self, id: u32) -> bool {
        self.special_token_ids.binary_search(&id).is_ok()
    }
}

/// Checks that every id in `ids` is below `vocab_size`; the error names the first bad one as
/// `field[i]`.
pub(crate) fn check_ids(field: &str, ids: &[u32], vocab_size: usize) -> Result<()> {
    match ids.iter().position(|&t| t as usize >= vocab_size) {
        Some(i) => Err(Error::out_of_range(
            format!("{field}[{i}]"),
            ids[i] as u64,
            vocab_size,
        )),
        None => Ok(()),
    }
}

/// `ids` checked with [`check_ids`], sorted and deduplicated.
pub(crate) fn sorted_ids(field: &str, ids: &[u32], vocab_size: usize) -> Result<Vec<u32>> {
    check_ids(field, ids, vocab_size)?;
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// The exact bytes of every token, stored flat (token `i` is
/// `bytes[offsets[i]..offsets[i + 1]]`). Text work in nextok — stop strings, streaming,
/// constraints — uses these bytes, never display strings. A token's bytes may be partial UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenBytes {
    offsets: Vec<u32>,
    bytes: Vec<u8>,
}

impl TokenBytes {
    /// Builds the table from one byte string per token id.
    pub fn new<I, B>(tokens: I) -> Result<TokenBytes>
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        let mut offsets = vec![0u32];
        let mut bytes = Vec::new();
        for t in tokens {
            bytes.extend_from_slice(t.as_ref());
            let end = u32::try_from(bytes.len())
                .map_err(|_| Error::invalid("vocabulary", "token bytes exceed 4 GiB in total"))?;
            offsets.push(end);
        }
        Ok(TokenBytes { offsets, bytes })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of token `id`, or `None` when out of range.
    #[inline]
    pub fn get(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if i + 1 >= self.offsets.len() {
            return None;
        }
        Some(&self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize])
    }

    /// Iterates `(id, bytes)`.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &[u8])> + '_ {
        self.offsets
            .windows(2)
            .enumerate()
            .map(|(i, w)| (i as u32, &self.bytes[w[0] as usize..w[1] as usize]))
    }
}
