//! Loading a row of raw logits into a [`Workspace`]: one pass that copies (or, for
//! [`Workspace::with_attached`], only reads), validates (no NaN, no `+inf`), counts the
//! selectable tokens and takes the maximum and the block bounds; and the error that names the
//! first offending logit.

use super::Workspace;
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::{self, nan_or_pos_inf};

impl Workspace {
    /// Validates `raw` (no NaN, no `+inf`, right length) and loads it as the processed logits.
    /// `-inf` raw logits are allowed and mean "not selectable".
    pub(crate) fn load(&mut self, raw: &[f32], exact: bool) -> Result<()> {
        self.load_with(raw, exact, true)
    }

    /// [`Workspace::load`], copying `raw` into the workspace's row when `copy` (otherwise the
    /// caller, [`Workspace::with_attached`], points the row at `raw`).
    pub(super) fn load_with(&mut self, raw: &[f32], exact: bool, copy: bool) -> Result<()> {
        if raw.len() != self.v {
            return Err(ErrorKind::VocabSizeMismatch {
                expected: self.v,
                got: raw.len(),
            }
            .into());
        }
        // one pass: copy, validate, count the selectable tokens and take the maximum
        let level = self.level();
        let (bad, count, max) = if copy {
            kernels::load(level, raw, self.buf.own_buffer(), &mut self.bmax)
        } else {
            kernels::scan(level, raw, &mut self.bmax)
        };
        if bad {
            self.dense = true;
            self.dense_count = 0;
            self.cands.clear();
            self.max_valid = false;
            self.bmax_valid = false;
            self.norm_valid = false;
            self.dense_w_valid = false;
            self.cand_w_valid = false;
            return Err(check_logits(raw).expect("a NaN or +inf was seen"));
        }
        self.dense_count = count;
        self.max_cache = max;
        self.max_valid = true;
        self.bmax_valid = true;
        self.dense = true;
        self.cands.clear();
        self.sorted = false;
        self.norm_valid = false;
        self.dense_w_valid = false;
        self.cand_w_valid = false;
        self.exact = exact;
        self.stages.clear();
        Ok(())
    }
}

/// Returns the error for the first NaN or `+inf` in `raw`, if any.
fn check_logits(raw: &[f32]) -> Option<Error> {
    // fast vectorisable test first; locate the index only when something is wrong
    let mut bad = false;
    for c in raw.chunks(64) {
        let mut b = false;
        for &x in c {
            b |= nan_or_pos_inf(x);
        }
        if b {
            bad = true;
            break;
        }
    }
    if !bad {
        return None;
    }
    raw.iter().position(|x| nan_or_pos_inf(*x)).map(|index| {
        let value = if raw[index].is_nan() { "NaN" } else { "+inf" };
        ErrorKind::NonFiniteLogit { index, value }.into()
    })
}
