//! llama.cpp's sampler chain as a peer in `nextok bench sampler --llama-lib <libllama>`.
//!
//! The library is the `libllama` shared object that building llama.cpp produces (for example
//! the one `pip install llama-cpp-python` builds and ships inside its package;
//! `bench/peers/llama_sampler.sh` does that and runs the benchmark). It is loaded at run time,
//! so nextok neither links nor builds llama.cpp; only the sampler part of its C API is used,
//! which needs no model.
//!
//! One call of [`LlamaChain::step`] is what `llama_sampler_sample` does on the CPU: fill the
//! candidate array from the logits row (one `{id, logit, p}` per token), apply the chain, read the
//! selected token, and accept it (the penalties sampler's history moves on, as nextok's does).
//! The chain is the one llama.cpp's common sampler builds for the same settings, without the
//! samplers that are off at those settings (DRY, XTC, top-n-σ, typical-p 1.0): a logit bias of
//! `-inf` on the reserved special ids (what `ignore_eos` and nextok's special mask do), then
//! penalties, top-k, top-p, min-p, temperature, and the random draw.
//!
//! The declarations below follow `include/llama.h` of the llama.cpp that llama-cpp-python
//! 0.3.36 vendors (the version the script pins); `llama_sampler_init_penalties` takes the
//! vocabulary size first there.

use std::ffi::c_void;
use std::path::Path;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct TokenData {
    id: i32,
    logit: f32,
    p: f32,
}

#[repr(C)]
#[derive(Debug)]
struct TokenDataArray {
    data: *mut TokenData,
    size: usize,
    selected: i64,
    sorted: bool,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct LogitBias {
    token: i32,
    bias: f32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ChainParams {
    no_perf: bool,
}

type Smpl = *mut c_void;

/// The sampler functions of a loaded `libllama`.
pub struct LlamaLib {
    chain_default_params: unsafe extern "C" fn() -> ChainParams,
    chain_init: unsafe extern "C" fn(ChainParams) -> Smpl,
    chain_add: unsafe extern "C" fn(Smpl, Smpl),
    init_logit_bias: unsafe extern "C" fn(i32, i32, *const LogitBias) -> Smpl,
    init_penalties: unsafe extern "C" fn(i32, i32, f32, f32, f32) -> Smpl,
    init_top_k: unsafe extern "C" fn(i32) -> Smpl,
    init_top_p: unsafe extern "C" fn(f32, usize) -> Smpl,
    init_min_p: unsafe extern "C" fn(f32, usize) -> Smpl,
    init_temp: unsafe extern "C" fn(f32) -> Smpl,
    init_dist: unsafe extern "C" fn(u32) -> Smpl,
    apply: unsafe extern "C" fn(Smpl, *mut TokenDataArray),
    accept: unsafe extern "C" fn(Smpl, i32),
    free: unsafe extern "C" fn(Smpl),
    // kept last: the function pointers above point into it
    _lib: libloading::Library,
}

impl std::fmt::Debug for LlamaLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaLib").finish_non_exhaustive()
    }
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol's type is the declaration in llama.h of the pinned llama.cpp (see
        // the module's overview); the pointer is used only while the library stays loaded.
        let s = unsafe { $lib.get($name) }.map_err(|e| {
            format!(
                "--llama-lib: no symbol {}: {e}",
                String::from_utf8_lossy($name)
            )
        })?;
        *s
    }};
}

impl LlamaLib {
    /// Loads `path` (a `libllama` shared object) and looks up the sampler functions.
    pub fn load(path: &Path) -> Result<LlamaLib, String> {
        // SAFETY: loading a library runs its initialisers; `libllama`'s do not touch our state.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("--llama-lib {}: {e}", path.display()))?;
        Ok(LlamaLib {
            chain_default_params: sym!(lib, b"llama_sampler_chain_default_params"),
            chain_init: sym!(lib, b"llama_sampler_chain_init"),
            chain_add: sym!(lib, b"llama_sampler_chain_add"),
            init_logit_bias: sym!(lib, b"llama_sampler_init_logit_bias"),
            init_penalties: sym!(lib, b"llama_sampler_init_penalties"),
            init_top_k: sym!(lib, b"llama_sampler_init_top_k"),
            init_top_p: sym!(lib, b"llama_sampler_init_top_p"),
            init_min_p: sym!(lib, b"llama_sampler_init_min_p"),
            init_temp: sym!(lib, b"llama_sampler_init_temp"),
            init_dist: sym!(lib, b"llama_sampler_init_dist"),
            apply: sym!(lib, b"llama_sampler_apply"),
            accept: sym!(lib, b"llama_sampler_accept"),
            free: sym!(lib, b"llama_sampler_free"),
            _lib: lib,
        })
    }
}

/// The settings of one llama.cpp chain (`None` / `0` = that sampler is off).
#[derive(Debug, Clone, PartialEq)]
pub struct ChainConfig {
    /// Ids whose logit the first sampler sets to `-inf`.
    pub banned: Vec<u32>,
    /// `(last_n, repeat, frequency, presence)`.
    pub penalties: Option<(i32, f32, f32, f32)>,
    /// Top-k (0 = off).
    pub top_k: i32,
    /// Top-p (1 = off).
    pub top_p: f32,
    /// Min-p (0 = off).
    pub min_p: f32,
    /// Temperature (1 = off).
    pub temperature: f32,
    /// The draw's seed.
    pub seed: u32,
}

/// A built chain with its candidate buffer.
pub struct LlamaChain<'a> {
    lib: &'a LlamaLib,
    chain: Smpl,
    cur: Vec<TokenData>,
}

impl std::fmt::Debug for LlamaChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaChain")
            .field("vocab", &self.cur.len())
            .finish()
    }
}

impl<'a> LlamaChain<'a> {
    /// Builds the chain for a vocabulary of `vocab` tokens and accepts `history` into it (the
    /// penalties' window).
    pub fn new(
        lib: &'a LlamaLib,
        cfg: &ChainConfig,
        vocab: usize,
        history: &[u32],
    ) -> Result<LlamaChain<'a>, String> {
        let n_vocab = i32::try_from(vocab).map_err(|_| "vocabulary too large".to_string())?;
        let bias: Vec<LogitBias> = cfg
            .banned
            .iter()
            .map(|&t| LogitBias {
                token: t as i32,
                bias: f32::NEG_INFINITY,
            })
            .collect();
        // SAFETY: each call is a llama.h function with arguments of the declared types; every
        // sampler made is handed to the chain, which owns and frees it (llama.h).
        let chain = unsafe {
            let chain = (lib.chain_init)((lib.chain_default_params)());
            if chain.is_null() {
                return Err("llama_sampler_chain_init failed".into());
            }
            let add = |s: Smpl| (lib.chain_add)(chain, s);
            if !bias.is_empty() {
                add((lib.init_logit_bias)(
                    n_vocab,
                    bias.len() as i32,
                    bias.as_ptr(),
                ));
            }
            if let Some((n, rep, freq, pres)) = cfg.penalties {
                add((lib.init_penalties)(n_vocab, n, rep, freq, pres));
            }
            if cfg.top_k > 0 {
                add((lib.init_top_k)(cfg.top_k));
            }
            if cfg.top_p < 1.0 {
                add((lib.init_top_p)(cfg.top_p, 1));
            }
            if cfg.min_p > 0.0 {
                add((lib.init_min_p)(cfg.min_p, 1));
            }
            if cfg.temperature != 1.0 {
                add((lib.init_temp)(cfg.temperature));
            }
            add((lib.init_dist)(cfg.seed));
            for &t in history {
                (lib.accept)(chain, t as i32);
            }
            chain
        };
        Ok(LlamaChain {
            lib,
            chain,
            cur: vec![
                TokenData {
                    id: 0,
                    logit: 0.0,
                    p: 0.0
                };
                vocab
            ],
        })
    }

    /// One step on `logits` (its length is the chain's vocabulary): returns the token.
    pub fn step(&mut self, logits: &[f32]) -> u32 {
        for ((c, &z), id) in self.cur.iter_mut().zip(logits).zip(0i32..) {
            *c = TokenData {
                id,
                logit: z,
                p: 0.0,
            };
        }
        let mut arr = TokenDataArray {
            data: self.cur.as_mut_ptr(),
            size: self.cur.len(),
            selected: -1,
            sorted: false,
        };
        // SAFETY: `arr` points at `self.cur`, alive and not otherwise borrowed for the call; the
        // chain may move `arr.data` within its own buffers, and `selected` indexes `arr.data`.
        unsafe {
            (self.lib.apply)(self.chain, &mut arr);
            let id = if arr.selected >= 0 && (arr.selected as usize) < arr.size {
                (*arr.data.add(arr.selected as usize)).id
            } else {
                -1
            };
            if id >= 0 {
                (self.lib.accept)(self.chain, id);
            }
            id as u32
        }
    }
}

impl Drop for LlamaChain<'_> {
    fn drop(&mut self) {
        // SAFETY: `chain` came from `llama_sampler_chain_init` and is freed once.
        unsafe { (self.lib.free)(self.chain) }
    }
}
