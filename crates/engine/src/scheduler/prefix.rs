//! The prefix cache: the caches of recent prompts, kept so that a later request whose prompt
//! starts the same way shares their blocks instead of computing them again. Entries go least
//! recently used first, when the cache is full or the KV budget needs their blocks.

use std::sync::Arc;

use nextok_model::{KvPool, SeqKv};

/// A prompt and its cache.
struct PrefixEntry {
    /// The prompt's ids.
    ids: Arc<Vec<u32>>,
    /// Its cache (blocks shared with the sequences that use it).
    kv: SeqKv,
    /// When it was last stored or used, on [`PrefixCache`]'s clock.
    used: u64,
}

/// The prompts' caches kept for reuse, with a clock that orders their uses.
#[derive(Default)]
pub(super) struct PrefixCache {
    /// The entries, in no order.
    entries: Vec<PrefixEntry>,
    /// Ticks at every store and every use.
    clock: u64,
}

impl PrefixCache {
    /// The longest cached prefix of `prompt` (at most all but its last token, whose logits
    /// the request needs).
    pub(super) fn lookup(&mut self, prompt: &[u32]) -> Option<(SeqKv, usize)> {
        let mut best: Option<(usize, usize)> = None;
        for (i, e) in self.entries.iter().enumerate() {
            let common = e
                .ids
                .iter()
                .zip(prompt)
                .take_while(|(a, b)| a == b)
                .count()
                .min(prompt.len() - 1)
                .min(e.kv.len());
            if common > 0 && best.is_none_or(|(_, c)| common > c) {
                best = Some((i, common));
            }
        }
        let (i, n) = best?;
        self.clock += 1;
        self.entries[i].used = self.clock;
        let mut kv = self.entries[i].kv.clone();
        kv.truncate(n).ok()?;
        Some((kv, n))
    }

    /// Keeps `kv`, the cache of prompt `ids`, replacing an entry of the same prompt; at most
    /// `max` entries (the least recently used goes), none when `max` is 0.
    pub(super) fn remember(&mut self, ids: Arc<Vec<u32>>, kv: SeqKv, max: usize) {
        if max == 0 {
            return;
        }
        self.clock += 1;
        self.entries.retain(|e| e.ids != ids);
        if self.entries.len() >= max {
            if let Some((i, _)) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used) {
                self.entries.swap_remove(i);
            }
        }
        self.entries.push(PrefixEntry {
            ids,
            kv,
            used: self.clock,
        });
    }

    /// Drops the least recently used entry; `false` when the cache is empty.
    pub(super) fn evict(&mut self) -> bool {
        match self.entries.iter().enumerate().min_by_key(|(_, e)| e.used) {
            Some((i, _)) => {
                self.entries.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Drops entries, least recently used first, while the blocks alive in `pool` exceed
    /// `budget`.
    pub(super) fn trim(&mut self, pool: &KvPool, budget: usize) {
        while pool.blocks_in_use() > budget {
            if !self.evict() {
                break;
            }
        }
    }

    /// Drops every entry.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }
}
