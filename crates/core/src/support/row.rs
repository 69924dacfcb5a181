//! The dense row of processed logits, copied on write.
//!
//! A step that processes and selects in one call ([`crate::Sampler::select`] and the calls
//! built on it), with a pipeline that does not edit the dense row (truncations, a temperature
//! after them), does not copy the raw logits into the workspace: copying them cost as much as
//! the rest of such a step. The [`Row`] reads the caller's slice during a call of
//! [`Workspace::with_attached`], which borrows it for the call, and copies it into its own
//! buffer if something writes to it after all (copy on write), so the result never depends on
//! the path.
//!
//! When that call ends, a row that was never copied is marked *stale*: it holds no processed
//! logits any more (see [`Workspace::processed_logits`]). The call ends the borrow itself,
//! whatever the closure does (returns, panics), so no row outlives the slice it reads.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::Workspace;
use crate::error::Result;

/// The processed logits of every token: the workspace's own buffer, or (during
/// [`Workspace::with_attached`]) the caller's raw logits until the first write. Reads go
/// through [`Deref`], writes through [`DerefMut`], which copies a borrowed row first.
pub(crate) struct Row {
    owned: Vec<f32>,
    /// The raw logits (`owned.len()` values) during [`Workspace::with_attached`].
    borrowed: Option<NonNull<f32>>,
    /// Set when a call of [`Workspace::with_attached`] ended before the borrowed row was
    /// copied: `owned` is not this step's.
    stale: bool,
}

// SAFETY: `borrowed` is only set by `Workspace::with_attached`, which holds the shared borrow of
// the raw logits (`&[f32]`, which is `Send` and `Sync`) and the exclusive borrow of the
// workspace for the whole call, and clears it before it returns or unwinds (its `Detach`, a
// local no caller can forget, checks that the row it clears is the one it set); so the pointer
// is only ever read while the slice it came from is borrowed, from whichever thread holds the
// workspace.
unsafe impl Send for Row {}
// SAFETY: as above; reads through `&Row` only read the borrowed `&[f32]`.
unsafe impl Sync for Row {}

impl Row {
    /// A row of `n` zeros, owned.
    pub(crate) fn new(n: usize) -> Self {
        Row {
            owned: vec![0.0; n],
            borrowed: None,
            stale: false,
        }
    }

    /// The workspace's own buffer, for a load that copies into it (not borrowed any more, not
    /// stale once filled).
    pub(crate) fn own_buffer(&mut self) -> &mut [f32] {
        self.borrowed = None;
        self.stale = false;
        &mut self.owned
    }

    /// Whether this row holds no processed logits (a borrowed row whose guard has ended).
    pub(crate) fn is_stale(&self) -> bool {
        self.stale
    }

    /// Whether the row reads the caller's raw logits (not copied yet).
    #[cfg(test)]
    pub(crate) fn is_borrowed(&self) -> bool {
        self.borrowed.is_some()
    }
}

impl Deref for Row {
    type Target = [f32];

    #[inline]
    fn deref(&self) -> &[f32] {
        match self.borrowed {
            // SAFETY: set by `Workspace::with_attached` from a slice of `owned.len()` values
            // that it keeps borrowed until it clears `borrowed` (see the `Send` impl).
            Some(p) => unsafe { std::slice::from_raw_parts(p.as_ptr(), self.owned.len()) },
            None => &self.owned,
        }
    }
}

impl DerefMut for Row {
    #[inline]
    fn deref_mut(&mut self) -> &mut [f32] {
        if let Some(p) = self.borrowed.take() {
            // SAFETY: as in `deref`: `with_attached` still borrows the `owned.len()` raw values.
            let raw = unsafe { std::slice::from_raw_parts(p.as_ptr(), self.owned.len()) };
            self.owned.copy_from_slice(raw);
        }
        &mut self.owned
    }
}

impl Clone for Row {
    /// An owned copy of what the row reads now (a clone never borrows).
    fn clone(&self) -> Self {
        Row {
            owned: self.deref().to_vec(),
            borrowed: None,
            stale: self.stale,
        }
    }
}

impl fmt::Debug for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Row")
            .field("len", &self.owned.len())
            .field("borrowed", &self.borrowed.is_some())
            .field("stale", &self.stale)
            .finish()
    }
}

/// Ends the borrow of [`Workspace::with_attached`] when dropped (on return or unwinding): a
/// row that was never copied is marked stale.
struct Detach<'a> {
    ws: &'a mut Workspace,
    /// The attached row's own buffer, which identifies it: the row `ws` must still hold (`None`
    /// for a row of no value, which reads nothing: empty buffers need not be distinct).
    owned: Option<*const f32>,
}

impl Drop for Detach<'_> {
    fn drop(&mut self) {
        let row = &mut self.ws.buf;
        if self.owned.is_some_and(|p| p != row.owned.as_ptr()) {
            // The closure moved the attached row out of the workspace (nothing in the crate
            // does): it may point at logits no longer borrowed, and cannot be reached to be
            // cleared.
            std::process::abort();
        }
        if row.borrowed.take().is_some() {
            row.stale = true;
        }
    }
}

impl Workspace {
    /// [`Workspace::load`] without the copy: validates `raw`, then runs `f` on the workspace
    /// reading `raw` as the processed logits (the first edit copies it), and returns what `f`
    /// returns. When `f` ends — it returns or panics — a row that was never copied is marked
    /// stale. On an error `f` does not run and the workspace holds no support, as after a
    /// failed `load`.
    pub(crate) fn with_attached<R>(
        &mut self,
        raw: &[f32],
        exact: bool,
        f: impl FnOnce(&mut Workspace) -> R,
    ) -> Result<R> {
        self.load_with(raw, exact, false)?;
        self.buf.borrowed = Some(NonNull::from(raw).cast::<f32>());
        self.buf.stale = false;
        let owned = (!self.buf.owned.is_empty()).then_some(self.buf.owned.as_ptr());
        let detach = Detach { ws: self, owned };
        Ok(f(&mut *detach.ws))
    }
}
