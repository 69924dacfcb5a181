//! Where a matrix's planes live (its quants, scales, minimums, high bits): memory every decode
//! step streams whole.
//!
//! A plane of at least [`OWN_MAPPING`] bytes gets an anonymous mapping of its own, advised for
//! transparent huge pages (`MADV_HUGEPAGE`): a decode step reads every weight once, and 2 MiB
//! pages spare it most of the TLB misses of 4 KiB ones. Only whole 2 MiB ranges inside the
//! mapping become huge pages, so a plane never holds more memory than its length rounded up to
//! 4 KiB. (Left to the allocator's arenas, which it advises for huge pages as a whole, huge
//! pages also covered the arenas' freed and partly used ranges.) A smaller plane, or one whose
//! mapping fails, lives on the heap. The contents are the same either way: only where they are
//! changes.

use std::ops::{Deref, DerefMut};

use super::Chunk;

/// Planes at least this large get their own mapping.
const OWN_MAPPING: usize = 64 << 10;

/// What a plane may hold: plain bytes for which every bit pattern, zero included, is a value,
/// aligned to at most a page.
///
/// # Safety
///
/// Implement only for such types.
pub(crate) unsafe trait Item: Copy + Default + PartialEq + std::fmt::Debug {}

// SAFETY: 32 bytes, any pattern a value, aligned to 32.
unsafe impl Item for Chunk {}
// SAFETY: integers and byte arrays: any pattern a value, aligned to at most 4.
unsafe impl Item for u16 {}
// SAFETY: as above.
unsafe impl Item for u32 {}
// SAFETY: as above.
unsafe impl Item for [u8; 16] {}

/// A zero-initialised slice of `T`, in its own mapping when large.
pub(crate) struct Plane<T: Item> {
    inner: Inner<T>,
}

/// A plane of [`Chunk`]s: a matrix's quants.
pub(crate) type ChunkPlane = Plane<Chunk>;

enum Inner<T> {
    Heap(Vec<T>),
    Mapped { map: memmap2::MmapMut, len: usize },
}

impl<T: Item> Plane<T> {
    /// `len` zero values.
    pub(crate) fn zeroed(len: usize) -> Plane<T> {
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        if bytes >= OWN_MAPPING {
            if let Ok(map) = memmap2::MmapOptions::new().len(bytes).map_anon() {
                #[cfg(target_os = "linux")]
                {
                    // advice only: without it the plane works the same on 4 KiB pages
                    let _ = map.advise(memmap2::Advice::HugePage);
                }
                return Plane {
                    inner: Inner::Mapped { map, len },
                };
            }
        }
        Plane {
            inner: Inner::Heap(vec![T::default(); len]),
        }
    }

    /// No values.
    pub(crate) fn empty() -> Plane<T> {
        Plane {
            inner: Inner::Heap(Vec::new()),
        }
    }
}

impl<T: Item> Deref for Plane<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.inner {
            Inner::Heap(v) => v,
            // SAFETY: the mapping is `len · size_of::<T>()` bytes, page-aligned (at least
            // `T`'s alignment, `Item`), zero-filled by the kernel when made and written only as
            // `T`s since, and every bit pattern is a `T` (`Item`); it lives as long as `self`.
            Inner::Mapped { map, len } => unsafe {
                std::slice::from_raw_parts(map.as_ptr().cast::<T>(), *len)
            },
        }
    }
}

impl<T: Item> DerefMut for Plane<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.inner {
            Inner::Heap(v) => v,
            // SAFETY: as in `deref`, and the mapping is borrowed mutably through `self`.
            Inner::Mapped { map, len } => unsafe {
                std::slice::from_raw_parts_mut(map.as_mut_ptr().cast::<T>(), *len)
            },
        }
    }
}

impl<T: Item> Clone for Plane<T> {
    fn clone(&self) -> Plane<T> {
        let mut out = Plane::zeroed(self.len());
        out.copy_from_slice(self);
        out
    }
}

impl<T: Item> std::fmt::Debug for Plane<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plane")
            .field("len", &self.len())
            .field("mapped", &matches!(self.inner, Inner::Mapped { .. }))
            .finish()
    }
}

impl<T: Item> PartialEq for Plane<T> {
    fn eq(&self, other: &Plane<T>) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_planes_are_on_the_heap_and_large_ones_mapped_and_both_hold_what_is_written() {
        for (len, mapped) in [(10, false), (OWN_MAPPING / 32 + 3, true), (3 << 16, true)] {
            let mut p: ChunkPlane = Plane::zeroed(len);
            assert_eq!(p.len(), len);
            assert_eq!(matches!(p.inner, Inner::Mapped { .. }), mapped, "{len}");
            assert!(p.iter().all(|c| *c == Chunk::default()));
            p[len - 1] = Chunk([7; 32]);
            p[0] = Chunk([1; 32]);
            let q = p.clone();
            assert_eq!(q, p);
            assert_eq!(q[len - 1], Chunk([7; 32]));
            assert_eq!(q[0], Chunk([1; 32]));
        }
    }
}
