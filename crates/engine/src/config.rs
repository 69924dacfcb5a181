//! How the engine schedules: [`EngineConfig`], read by the engine's handle when a request is
//! submitted (its checks) and by the scheduler thread on every iteration (its limits).

/// The default [`EngineConfig::prefill_chunk_tokens`].
pub const PREFILL_CHUNK_TOKENS: usize = 16;

/// The default [`EngineConfig::itl_target_ms`].
pub const ITL_TARGET_MS: u64 = 60;

/// The largest [`EngineConfig::itl_target_ms`] accepted (ten minutes).
pub const ITL_TARGET_MS_MAX: u64 = 600_000;

/// How the engine schedules.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Sequences running at once (each of a request's `n` counts).
    pub max_num_seqs: usize,
    /// Tokens one forward pass takes at most: one per decoding sequence, the rest for chunks
    /// of prompts being prefilled.
    pub max_batch_tokens: usize,
    /// Prompt tokens one forward pass takes while some sequence is decoding (within
    /// `max_batch_tokens`), so a long prompt does not stall running streams. With
    /// `itl_target_ms` at 0 this is the chunk: a decoding sequence waits for at most this many
    /// prompt rows between two of its tokens. Otherwise it is the least chunk, taken even when
    /// the decode rows alone fill the target, so that prompts always advance. With no sequence
    /// decoding, prompts take the whole `max_batch_tokens`.
    pub prefill_chunk_tokens: usize,
    /// The inter-token latency, in milliseconds, that the prompt chunk is sized to while
    /// sequences decode (0: a fixed chunk of `prefill_chunk_tokens`). The engine measures how
    /// long its iterations take for the rows they run and gives each pass the prompt rows that
    /// keep it within this time beside its decode rows (at least `prefill_chunk_tokens`), so
    /// the chunk follows the machine, the model and the number of streams. A larger target
    /// gives prompts more of each pass: the first token comes sooner, and running streams get
    /// their tokens further apart.
    pub itl_target_ms: u64,
    /// KV cache memory the running sequences and the prefix cache may hold, in bytes. A request
    /// is admitted when its prompt fits (with a block of growth for every running sequence);
    /// sequences take blocks as they grow, and when the next pass would not fit the request
    /// holding the most blocks is preempted (its cache recomputed when it resumes). A request
    /// whose prompt and `max_tokens` (every sequence's) could never fit is refused at submission.
    ///
    /// The memory guard ([`nextok_model::memory`]): a budget larger than the memory left beside
    /// the loaded model is refused when the engine starts, naming both sizes; the default
    /// ([`DEFAULT_KV_BUDGET_BYTES`]) is lowered to 90 % of what is left instead.
    pub kv_budget_bytes: usize,
    /// Requests that may wait for admission; past that,
    /// [`ErrorKind::QueueFull`](crate::ErrorKind::QueueFull).
    pub max_waiting: usize,
    /// Prompts whose cache is kept for reuse by later requests with the same prefix (`0`
    /// disables the prefix cache).
    pub prefix_cache_entries: usize,
    /// Whether a special token's string written in a chat message's content becomes that
    /// control token (`false`, the default: it is ordinary text, and control tokens come from
    /// the chat template only — see [`nextok_model::Model::encode_chat`]).
    pub parse_special_in_messages: bool,
    /// `max_tokens` of a request that sets none (`None`: to the end of the context).
    pub default_max_tokens: Option<u64>,
    /// The largest `max_tokens` a request may ask for (`None`: the context's room); a larger
    /// one is refused naming `max_tokens`.
    pub max_tokens_limit: Option<u64>,
    /// Bytes the cache of compiled constraints may keep (least recently used go first; one
    /// constraint larger than this is compiled for its request but not kept).
    pub constraint_cache_bytes: usize,
    /// What the KV cache stores each key and value as (`f16`, the default, or `q8_0`: 56 % of
    /// the bytes, so `kv_budget_bytes` holds 1.78 times the positions and a long-context decode
    /// step reads about half the memory). Part of what a request's tokens depend on: its trace
    /// records it.
    pub kv_cache_type: nextok_model::KvCacheType,
}

/// The default KV cache budget: 4 GiB, or 90 % of the memory left beside the model when that is
/// less.
pub const DEFAULT_KV_BUDGET_BYTES: usize = 4 << 30;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 64,
            max_batch_tokens: 512,
            prefill_chunk_tokens: PREFILL_CHUNK_TOKENS,
            itl_target_ms: ITL_TARGET_MS,
            kv_budget_bytes: DEFAULT_KV_BUDGET_BYTES,
            max_waiting: 1024,
            prefix_cache_entries: 32,
            parse_special_in_messages: false,
            default_max_tokens: None,
            max_tokens_limit: None,
            constraint_cache_bytes: 256 << 20,
            kv_cache_type: nextok_model::KvCacheType::F16,
        }
    }
}
