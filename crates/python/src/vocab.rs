//! `nextok.Vocab`: a vocabulary's size, EOS and special ids, and (when known) every token's
//! exact bytes — from a `tokenizer.json`, a GGUF file, a list of byte strings, or just a size.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use nextok_core::{TokenBytes, VocabInfo};
use nextok_vocab::{LoadOptions, Vocabulary};

use crate::convert::{opt_count, token_id, token_ids, type_name};
use crate::errors::Failure;

/// A vocabulary: its size, EOS ids and special ids, and (unless made with `Vocab.plain`) the
/// exact bytes of every token, which stop strings and constraints need.
#[pyclass(module = "nextok", name = "Vocab", frozen)]
pub struct PyVocab {
    pub(crate) info: VocabInfo,
    pub(crate) bytes: Option<Arc<TokenBytes>>,
    names: Option<Vec<String>>,
    bos: Option<u32>,
    label: String,
}

fn opt_ids(arg: &str, obj: Option<&Bound<'_, PyAny>>) -> Result<Option<Vec<u32>>, Failure> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => token_ids(arg, o).map(Some),
    }
}

fn load_options(
    vocab_size: Option<&Bound<'_, PyAny>>,
    eos_token_ids: Option<&Bound<'_, PyAny>>,
) -> Result<LoadOptions, Failure> {
    Ok(LoadOptions {
        eos_token_ids: opt_ids("eos_token_ids", eos_token_ids)?,
        vocab_size: opt_count("vocab_size", vocab_size)?,
    })
}

impl PyVocab {
    fn from_vocabulary(v: Vocabulary, label: String) -> PyVocab {
        PyVocab {
            info: v.info,
            bytes: Some(Arc::new(v.bytes)),
            names: Some(v.names),
            bos: v.bos,
            label,
        }
    }

    /// A plain vocabulary of `size` tokens (no bytes, no EOS, no special ids).
    pub(crate) fn plain_info(size: usize) -> Result<VocabInfo, Failure> {
        check_size(size)?;
        Ok(VocabInfo::plain(size).validated()?)
    }
}

#[pymethods]
impl PyVocab {
    /// Loads a Hugging Face `tokenizer.json` or a GGUF file (told apart by the GGUF magic; a
    /// GGUF file's tensors are not read). `vocab_size` pads the vocabulary to the model's logits
    /// row length; `eos_token_ids` replaces the derived EOS ids.
    #[staticmethod]
    #[pyo3(signature = (path, *, vocab_size=None, eos_token_ids=None))]
    fn from_file(
        path: &Bound<'_, PyAny>,
        vocab_size: Option<&Bound<'_, PyAny>>,
        eos_token_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyVocab> {
        let path = crate::convert::path("path", path)?;
        let opts = load_options(vocab_size, eos_token_ids)?;
        let label = path.display().to_string();
        let v = Vocabulary::load(&path, &opts).map_err(Failure::from)?;
        Ok(PyVocab::from_vocabulary(v, label))
    }

    /// Loads a `tokenizer.json` given as text or bytes.
    #[staticmethod]
    #[pyo3(signature = (data, *, vocab_size=None, eos_token_ids=None))]
    fn from_tokenizer_json(
        data: &Bound<'_, PyAny>,
        vocab_size: Option<&Bound<'_, PyAny>>,
        eos_token_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyVocab> {
        let opts = load_options(vocab_size, eos_token_ids)?;
        let v = if let Ok(s) = data.cast::<PyString>() {
            Vocabulary::from_tokenizer_json(s.to_str()?.as_bytes(), "<tokenizer.json>", &opts)
        } else if let Ok(b) = data.cast::<PyBytes>() {
            Vocabulary::from_tokenizer_json(b.as_bytes(), "<tokenizer.json>", &opts)
        } else {
            return Err(Failure::argument(
                "data",
                format!("must be str or bytes, got {}", type_name(data)),
            )
            .into());
        };
        Ok(PyVocab::from_vocabulary(
            v.map_err(Failure::from)?,
            "<tokenizer.json>".into(),
        ))
    }

    /// A vocabulary from the exact bytes of every token, by id (`bytes`, or `str` taken as
    /// UTF-8).
    #[staticmethod]
    #[pyo3(signature = (tokens, *, eos_token_ids=None, special_token_ids=None))]
    fn from_token_bytes(
        tokens: &Bound<'_, PyAny>,
        eos_token_ids: Option<&Bound<'_, PyAny>>,
        special_token_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyVocab> {
        let iter = tokens.try_iter().map_err(|_| {
            Failure::argument(
                "tokens",
                format!(
                    "must be a sequence of bytes or str, got {}",
                    type_name(tokens)
                ),
            )
        })?;
        let mut all: Vec<Vec<u8>> = Vec::new();
        for (i, t) in iter.enumerate() {
            let t = t?;
            if let Ok(b) = t.cast::<PyBytes>() {
                all.push(b.as_bytes().to_vec());
            } else if let Ok(s) = t.cast::<PyString>() {
                all.push(s.to_str()?.as_bytes().to_vec());
            } else {
                return Err(Failure::argument(
                    format!("tokens[{i}]"),
                    format!("must be bytes or str, got {}", type_name(&t)),
                )
                .into());
            }
        }
        let info = VocabInfo {
            vocab_size: all.len(),
            eos_token_ids: opt_ids("eos_token_ids", eos_token_ids)?.unwrap_or_default(),
            special_token_ids: opt_ids("special_token_ids", special_token_ids)?.unwrap_or_default(),
        }
        .validated()
        .map_err(Failure::from)?;
        let bytes = TokenBytes::new(all.iter().map(Vec::as_slice)).map_err(Failure::from)?;
        Ok(PyVocab {
            info,
            bytes: Some(Arc::new(bytes)),
            names: None,
            bos: None,
            label: "<token bytes>".into(),
        })
    }

    /// A vocabulary of `size` tokens known only by id (no bytes: no stop strings, no
    /// constraints).
    #[staticmethod]
    #[pyo3(signature = (size, *, eos_token_ids=None, special_token_ids=None))]
    fn plain(
        size: &Bound<'_, PyAny>,
        eos_token_ids: Option<&Bound<'_, PyAny>>,
        special_token_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyVocab> {
        let size = crate::convert::count("size", size)?;
        check_size(size)?;
        let info = VocabInfo {
            vocab_size: size,
            eos_token_ids: opt_ids("eos_token_ids", eos_token_ids)?.unwrap_or_default(),
            special_token_ids: opt_ids("special_token_ids", special_token_ids)?.unwrap_or_default(),
        }
        .validated()
        .map_err(Failure::from)?;
        Ok(PyVocab {
            info,
            bytes: None,
            names: None,
            bos: None,
            label: "<plain>".into(),
        })
    }

    /// Number of token ids (the logits row length).
    #[getter]
    fn size(&self) -> usize {
        self.info.vocab_size
    }

    fn __len__(&self) -> usize {
        self.info.vocab_size
    }

    /// End-of-sequence ids, ascending.
    #[getter]
    fn eos_token_ids(&self) -> Vec<u32> {
        self.info.eos_token_ids.clone()
    }

    /// Special/control ids, ascending.
    #[getter]
    fn special_token_ids(&self) -> Vec<u32> {
        self.info.special_token_ids.clone()
    }

    /// The beginning-of-sequence id, when the file names one.
    #[getter]
    fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// Whether every token's bytes are known.
    #[getter]
    fn has_bytes(&self) -> bool {
        self.bytes.is_some()
    }

    /// The exact bytes of token `id`.
    fn token_bytes<'py>(
        &self,
        py: Python<'py>,
        id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let id = token_id("id", id)?;
        let bytes = self.bytes.as_ref().ok_or_else(|| {
            Failure::argument("id", "this vocabulary has no token bytes (Vocab.plain)")
        })?;
        check_id(&self.info, "id", id)?;
        Ok(PyBytes::new(py, bytes.get(id).unwrap_or_default()))
    }

    /// The token's name as the file spells it (`Ġhello`, `<|eot_id|>`), when the vocabulary
    /// came from a file.
    fn name(&self, id: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        let id = token_id("id", id)?;
        check_id(&self.info, "id", id)?;
        Ok(self
            .names
            .as_ref()
            .and_then(|n| n.get(id as usize).cloned()))
    }

    /// The concatenated bytes of `ids`.
    fn decode<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let ids = token_ids("ids", ids)?;
        let bytes = self.bytes.as_ref().ok_or_else(|| {
            Failure::argument("ids", "this vocabulary has no token bytes (Vocab.plain)")
        })?;
        let mut out = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            check_id(&self.info, &format!("ids[{i}]"), id)?;
            out.extend_from_slice(bytes.get(id).unwrap_or_default());
        }
        Ok(PyBytes::new(py, &out))
    }

    fn __repr__(&self) -> String {
        format!(
            "Vocab(size={}, eos_token_ids={:?}, special={}, bytes={}, from={})",
            self.info.vocab_size,
            self.info.eos_token_ids,
            self.info.special_token_ids.len(),
            self.bytes.is_some(),
            self.label
        )
    }
}

/// `id` as a usize index, checked against `info`.
pub(crate) fn check_id(info: &VocabInfo, field: &str, id: u32) -> Result<(), Failure> {
    if (id as usize) < info.vocab_size {
        Ok(())
    } else {
        Err(Failure::from(nextok_core::Error::from(
            nextok_core::ErrorKind::TokenOutOfRange {
                field: field.into(),
                token: id as u64,
                vocab_size: info.vocab_size,
            },
        )))
    }
}

/// A plain vocabulary's size is at most [`nextok_vocab::MAX_VOCAB_SIZE`]: the sampler holds a
/// few values per id, and a size from a typo must not exhaust memory.
fn check_size(size: usize) -> Result<(), Failure> {
    if size > nextok_vocab::MAX_VOCAB_SIZE {
        return Err(Failure::parameter(
            "vocab_size",
            format!(
                "{size} is above the limit of {} ids",
                nextok_vocab::MAX_VOCAB_SIZE
            ),
        ));
    }
    Ok(())
}
