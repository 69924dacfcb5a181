//! Top-k (reference step 7): keep the `k` candidates with the highest processed logits.
//! Ties at the boundary go to the lower token id (`ties: "by_id"`, exactly k kept), or every
//! token tied with the k-th value is kept (`ties: "keep_all"`, what HF and vLLM's PyTorch path
//! do). `k` must be ≥ 1 in a pipeline; the request-level `top_k <= 0` means "disabled" and
//! simply leaves the processor out.

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx};
use crate::error::{Error, Result};
use crate::kernels;
use crate::state::DecoderState;
use crate::support::sort::push_heap;
use crate::support::{canonical, Cand};
use crate::support::{TopKTies, Workspace};
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Tie rule at the k-th position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Ties {
    /// Exactly k; ties → lower token id.
    #[default]
    ById,
    /// Keep every token tied with the k-th value.
    KeepAll,
}

/// Config of top-k.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopK {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// Number of candidates to keep (≥ 1).
    pub top_k: i64,
    /// Tie rule.
    #[serde(default)]
    pub ties: Ties,
}

/// Compiled form.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub(crate) k: usize,
    ties: TopKTies,
}

impl Compile for TopK {
    const NAME: &'static str = "top_k";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, _ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        if self.top_k < 1 {
            return Err(Error::invalid(
                format!("{field}.top_k"),
                format!(
                    "{} must be >= 1 in a pipeline (leave the processor out to disable top-k)",
                    self.top_k
                ),
            ));
        }
        let ties = match self.ties {
            Ties::ById => TopKTies::ById,
            Ties::KeepAll => TopKTies::KeepAll,
        };
        Ok(Compiled {
            k: self.top_k.min(u32::MAX as i64) as usize,
            ties,
        })
    }
}

impl Apply for Compiled {
    const TRUNCATION: bool = true;

    fn apply(&self, _st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        ws.top_k(self.k, self.ties);
        Ok(())
    }
}

// The truncation itself, on the step's workspace.

impl Workspace {
    /// Top-k with the given tie rule. `k >= 1`.
    pub(crate) fn top_k(&mut self, k: usize, ties: TopKTies) {
        if self.support_len() <= k {
            return;
        }
        if self.dense {
            self.dense_top_k(k);
            if ties == TopKTies::KeepAll {
                let kth = self.cands[k - 1].z;
                self.cands.clear();
                for (i, &z) in self.buf.iter().enumerate() {
                    if z >= kth {
                        self.cands.push(Cand { id: i as u32, z });
                    }
                }
                self.sorted = false;
            }
            self.dense = false;
        } else {
            self.sort_canonical();
            let mut keep = k;
            if ties == TopKTies::KeepAll {
                let kth = self.cands[k - 1].z;
                while keep < self.cands.len() && self.cands[keep].z == kth {
                    keep += 1;
                }
            }
            self.cands.truncate(keep);
        }
        self.invalidate();
    }

    /// Dense top-k; result in canonical order in `cands`.
    ///
    /// With block bounds and at least four blocks per kept token, the bounds give a threshold
    /// first: the k-th largest bound `t` (a size-k heap over the bounds). The tokens with `z >=
    /// t` are collected, reading only the blocks whose bound reaches `t` (about k of them). When
    /// there are at least k of them, no token below `t` is among the top k, and the best k of
    /// the collection are kept. Every block holds a token at its bound after loading, and
    /// single edits and masks keep it so; an allow-list that masks in place leaves bounds above
    /// their blocks, and then the collection may fall short. Then (and without bounds, or when
    /// `t` is `-inf`: a row with fewer than k live blocks) a size-k heap whose root is the worst
    /// kept candidate scans the row.
    pub(crate) fn dense_top_k(&mut self, k: usize) {
        let level = self.level();
        if self.bmax_valid && k >= 1 && 4 * k <= self.bmax.len() {
            let heap = &mut self.cands;
            heap.clear();
            for (b, &x) in self.bmax[..k].iter().enumerate() {
                push_heap(heap, Cand { id: b as u32, z: x });
            }
            kernels::top_k_scan(level, &self.bmax, &[], k, heap);
            let t = heap[0].z;
            if t > f32::NEG_INFINITY {
                self.cands.clear();
                let band = kernels::Band::new(t, f32::INFINITY);
                kernels::collect_band(level, &self.buf, &self.bmax, band, &mut self.cands);
                if self.cands.len() >= k {
                    if self.cands.len() > k {
                        self.cands.select_nth_unstable_by(k - 1, canonical);
                        self.cands.truncate(k);
                    }
                    self.cands.sort_unstable_by(canonical);
                    self.sorted = true;
                    return;
                }
            }
        }
        let heap = &mut self.cands;
        heap.clear();
        let buf = &self.buf;
        let mut i = 0usize;
        // fill with the first k finite entries
        while heap.len() < k && i < buf.len() {
            let z = buf[i];
            if z > f32::NEG_INFINITY {
                push_heap(heap, Cand { id: i as u32, z });
            }
            i += 1;
        }
        // scan the rest; a later id with an equal z is worse, so only strictly greater enters
        if heap.len() == k && i < buf.len() {
            let bmax: &[f32] = if self.bmax_valid { &self.bmax } else { &[] };
            kernels::top_k_scan(level, buf, bmax, i, heap);
        }
        heap.sort_unstable_by(canonical);
        self.sorted = true;
    }
}
