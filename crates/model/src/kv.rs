//! The paged KV cache: keys and values of every sequence, in blocks of [`BLOCK_POSITIONS`]
//! positions, shared between sequences until one of them writes.
//!
//! A block holds, for [`BLOCK_POSITIONS`] consecutive positions, the key and the value of every
//! layer and key/value head, in half precision (llama.cpp keeps its cache in `f16` too) or, when
//! the pool's [`KvCacheType`] says so, in GGML's Q8_0 blocks. A sequence ([`SeqKv`]) is a list
//! of reference-counted blocks and a length:
//!
//! * a decode step writes only its new position (no copy of what is already cached);
//! * [`fork`](SeqKv::clone) clones the list (the branches share every block), and the first
//!   write into a shared block copies that one block (copy on write);
//! * [`truncate`](SeqKv::truncate) drops the blocks past the new length;
//! * the [`KvPool`] counts the blocks alive (each shared block once), which is what the engine's
//!   memory budget and the server's metrics read, and can refuse to allocate past a limit.
//!
//! # Where the values live
//!
//! The pool owns *segments* of block slots, each laid out
//! `[layer][key | value][kv head][slot][position][head_dim]`: a block is one slot, and its part
//! for (layer, keys or values, head) is `BLOCK_POSITIONS · head_dim` values in that triple's
//! region of the segment. A sequence whose blocks are consecutive slots therefore has each
//! head's keys (and values) of a layer in one contiguous run, which is what a long-context
//! decode step reads, head by head; a block laid out on its own would cut that run into pieces
//! of `BLOCK_POSITIONS` positions (2 KiB for a 64-wide head), which the CPU's prefetchers do not
//! follow from one block to the next (`docs/performance.md`: 9–10 against 21–24 GB/s).
//!
//! A head's values are stored in column groups of [`VALUE_COLUMNS`] (when the head width is a
//! multiple of it): region (layer, values, head) holds one run per group, each
//! `[slot][position][VALUE_COLUMNS]`, so that a task summing some columns of the values reads
//! one run of memory too (reading every other cache line of a run measured slower than
//! reading all of it).
//!
//! So a new block takes the slot after the sequence's last block when that slot is free, and
//! otherwise the middle of the largest run of free slots (its start when the run begins a
//! segment), which leaves room behind it for the sequence to grow into and in front of it for
//! the sequence that ends there. Slots are zeroed when handed out, so a block reads as it did
//! when each block was a fresh allocation. A segment is kept until the pool is dropped (a
//! freed slot is reused, not returned to the system), as llama.cpp and vLLM keep their caches.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use half::f16;

use crate::error::{ModelError, ModelErrorKind, Result};
use crate::kernels::Level;

/// Positions per block.
pub const BLOCK_POSITIONS: usize = 16;

/// The columns of one group of a head's values (see "Where the values live").
pub const VALUE_COLUMNS: usize = 32;

/// The size a segment aims at: its slots are this over a block's bytes, within
/// [`SEGMENT_MIN_SLOTS`]..=[`SEGMENT_MAX_SLOTS`] (and a limited pool's limit). Memory is taken
/// from the system when a slot is first handed out, not when the segment is made.
const SEGMENT_BYTES: usize = 32 << 20;
const SEGMENT_MIN_SLOTS: usize = 16;
const SEGMENT_MAX_SLOTS: usize = 1024;

/// How the cache stores each key and value (both the same; llama.cpp's `--cache-type-k` and
/// `--cache-type-v`, vLLM's `kv_cache_dtype`).
///
/// Attention computes the same operations for both, on the values the cache holds: an `f16`
/// value converted to `f32`, or a `q8_0` value `q · d` (an 8-bit integer times its block's
/// `f16` scale, a product that is exact in `f32`). So a `q8_0` cache changes what is stored,
/// never the arithmetic after it (docs/semantics.md, "The KV cache's type").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvCacheType {
    /// Half precision, as llama.cpp's default cache: 2 bytes per value.
    #[default]
    F16,
    /// GGML's Q8_0 blocks of [`Q8_COLUMNS`] values along a head (one `f16` scale each, the
    /// rule of ggml's x86 `quantize_row_q8_0`): 1.125 bytes per value as nextok stores them
    /// (the scale kept as the `f32` it stands for).
    Q8_0,
}

impl KvCacheType {
    /// Every type, in the order `name` lists them.
    pub const ALL: [KvCacheType; 2] = [KvCacheType::F16, KvCacheType::Q8_0];

    /// `f16` or `q8_0` (the names llama.cpp's `--cache-type-k` takes).
    pub fn name(self) -> &'static str {
        match self {
            KvCacheType::F16 => "f16",
            KvCacheType::Q8_0 => "q8_0",
        }
    }

    /// The type named `name` ([`name`](Self::name)).
    pub fn from_name(name: &str) -> Option<KvCacheType> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl std::fmt::Display for KvCacheType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Values per scale of a `q8_0` cache (GGML's `QK8_0`).
pub const Q8_COLUMNS: usize = 32;

/// The shape of a model's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// What each key and value is stored as.
    pub dtype: KvCacheType,
}

impl KvGeometry {
    /// Why this cache cannot be made, if it cannot: a `q8_0` cache needs heads a multiple of
    /// [`Q8_COLUMNS`] wide (its blocks run along a head, as llama.cpp's do).
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.dtype == KvCacheType::Q8_0 && !self.head_dim.is_multiple_of(Q8_COLUMNS) {
            return Err(format!(
                "q8_0 needs heads a multiple of {Q8_COLUMNS} wide; this model's are {}",
                self.head_dim
            ));
        }
        Ok(())
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.n_layer * 2 * self.n_kv_head * self.slab_bytes()
    }

    /// Bytes of one (layer, keys or values, head) part of a block: `f16` values, or `q8_0`'s
    /// quants then one `f32` scale per [`Q8_COLUMNS`] of them.
    fn slab_bytes(&self) -> usize {
        let n = BLOCK_POSITIONS * self.head_dim;
        match self.dtype {
            KvCacheType::F16 => 2 * n,
            KvCacheType::Q8_0 => n + 4 * (n / Q8_COLUMNS),
        }
    }

    /// Bytes the cache takes per position.
    pub fn bytes_per_position(&self) -> usize {
        self.block_bytes() / BLOCK_POSITIONS
    }

    /// Blocks that hold `positions` positions.
    pub fn blocks_for(positions: usize) -> usize {
        positions.div_ceil(BLOCK_POSITIONS)
    }

    /// The column groups a head's values are stored in: `head_dim / VALUE_COLUMNS` when that
    /// divides, else one.
    pub fn value_groups(&self) -> usize {
        if self.head_dim >= VALUE_COLUMNS && self.head_dim.is_multiple_of(VALUE_COLUMNS) {
            self.head_dim / VALUE_COLUMNS
        } else {
            1
        }
    }

    /// The pieces of keys (`kv = 0`: one, every column) or values (`kv = 1`: one per column
    /// group), and the columns of each.
    fn pieces(&self, kv: usize) -> (usize, usize) {
        if kv == 0 {
            (1, self.head_dim)
        } else {
            let g = self.value_groups();
            (g, self.head_dim / g)
        }
    }

    /// The (layer, keys or values, head) parts of a block.
    fn slabs(&self) -> usize {
        self.n_layer * 2 * self.n_kv_head
    }

    /// Index of the region of (`layer`, key (`0`) or value (`1`), `head`) in a segment.
    fn region(&self, layer: usize, kv: usize, head: usize) -> usize {
        (layer * 2 + kv) * self.n_kv_head + head
    }

    /// Every (region, piece) of a block.
    fn all_pieces(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.slabs())
            .flat_map(move |r| (0..self.pieces(r / self.n_kv_head % 2).0).map(move |p| (r, p)))
    }

    /// Slots of a full segment.
    fn segment_slots(&self) -> usize {
        (SEGMENT_BYTES / self.block_bytes().max(1)).clamp(SEGMENT_MIN_SLOTS, SEGMENT_MAX_SLOTS)
    }
}

/// Keys or values of the cache in place, `[position][columns]`: `f16` values, or `q8_0`
/// quants with their scales `[position][columns / Q8_COLUMNS]`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KvRun<'a> {
    /// Half-precision values.
    F16(&'a [f16]),
    /// Quants and the scales of each [`Q8_COLUMNS`] of them (value = `q · d`, exact in `f32`).
    Q8 {
        /// The quants.
        q: &'a [i8],
        /// One scale per [`Q8_COLUMNS`] quants.
        d: &'a [f32],
    },
}

impl<'a> KvRun<'a> {
    /// Values held.
    pub(crate) fn len(&self) -> usize {
        match self {
            KvRun::F16(v) => v.len(),
            KvRun::Q8 { q, .. } => q.len(),
        }
    }

    /// Value `i` as `f32` (exactly).
    pub(crate) fn value(&self, i: usize) -> f32 {
        match self {
            KvRun::F16(v) => v[i].to_f32(),
            KvRun::Q8 { q, d } => f32::from(q[i]) * d[i / Q8_COLUMNS],
        }
    }

    /// Positions `lo..hi` of a run of `cols` values per position.
    pub(crate) fn positions(&self, lo: usize, hi: usize, cols: usize) -> KvRun<'a> {
        match *self {
            KvRun::F16(v) => KvRun::F16(&v[lo * cols..hi * cols]),
            KvRun::Q8 { q, d } => {
                let b = cols / Q8_COLUMNS;
                KvRun::Q8 {
                    q: &q[lo * cols..hi * cols],
                    d: &d[lo * b..hi * b],
                }
            }
        }
    }

    /// Every value as `f32` (exactly) into `dst` (`len()` values), with the kernels of `level`
    /// (the same bits at every level).
    pub(crate) fn to_f32(self, level: Level, dst: &mut [f32]) {
        assert_eq!(dst.len(), self.len());
        match self {
            KvRun::F16(v) => crate::kernels::convert::f16_to_f32(level, v, dst),
            KvRun::Q8 { q, d } => {
                for ((o, q), d) in dst
                    .chunks_exact_mut(Q8_COLUMNS)
                    .zip(q.chunks_exact(Q8_COLUMNS))
                    .zip(d.iter())
                {
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = f32::from(q) * d;
                    }
                }
            }
        }
    }

    /// The run's memory (a prefetch hint's range): its values or quants.
    pub(crate) fn bytes(&self) -> &'a [u8] {
        match *self {
            // SAFETY: any initialised memory reads as bytes
            KvRun::F16(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v))
            },
            // SAFETY: as above
            KvRun::Q8 { q, .. } => unsafe {
                std::slice::from_raw_parts(q.as_ptr().cast(), q.len())
            },
        }
    }
}

/// Quantises `x` ([`Q8_COLUMNS`] values) into `q` as ggml's x86 `quantize_row_q8_0` does (what
/// llama.cpp's cache of type `q8_0` holds): `m = max |x_i|`, scale `d = m / 127` stored as
/// `f16`, `q_i = round_ties_even(x_i · (127 / m))` (`0` when `m = 0`). Returns the stored scale
/// as `f32`.
pub(crate) fn quantize_q8_0(x: &[f32], q: &mut [i8]) -> f32 {
    let m = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(m / 127.0).to_f32();
    let id = if m != 0.0 { 127.0 / m } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    d
}

/// One allocation of block slots, laid out `[layer][key | value][kv head][slot][position]
/// [head_dim]`, with a bit per slot saying whether a block holds it.
struct Segment {
    data: NonNull<u8>,
    layout: Layout,
    slots: usize,
    /// One bit per slot, set while a block holds it; the bits past `slots` are set.
    used: Vec<u64>,
    /// Slots a block has held at least once: their memory has been written, so it is the
    /// process's (the rest of the segment is only reserved).
    touched: Vec<u64>,
    touched_count: usize,
}

// SAFETY: a segment owns its memory; its values are read and written only through the
// `Block`s that hold its slots (see `Block`), and its bitmap only under the pool's lock.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Segment {
    /// A segment of `slots` slots for `geometry`, zeroed.
    fn new(geometry: &KvGeometry, slots: usize) -> Result<Segment> {
        let bytes = slots
            .checked_mul(geometry.block_bytes())
            .filter(|&v| v <= isize::MAX as usize / 2)
            .ok_or_else(|| {
                ModelError::new("KV cache segment too large").with_kind(ModelErrorKind::Capacity)
            })?;
        // at least one cache line, so that an empty geometry still makes a valid allocation
        let layout = Layout::from_size_align(bytes.max(64), 64)
            .map_err(|e| ModelError::new(format!("KV cache segment: {e}")))?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let data = NonNull::new(ptr).ok_or_else(|| {
            ModelError::new(format!(
                "KV cache: the system refused {} bytes for {slots} blocks",
                layout.size()
            ))
            .with_kind(ModelErrorKind::Capacity)
        })?;
        let mut used = vec![0u64; slots.div_ceil(64)];
        if !slots.is_multiple_of(64) {
            used[slots / 64] = !0u64 << (slots % 64);
        }
        Ok(Segment {
            data,
            layout,
            slots,
            touched: vec![0u64; used.len()],
            used,
            touched_count: 0,
        })
    }

    fn is_used(&self, s: usize) -> bool {
        self.used[s / 64] >> (s % 64) & 1 == 1
    }

    fn set_used(&mut self, s: usize, used: bool) {
        if used {
            self.used[s / 64] |= 1 << (s % 64);
        } else {
            self.used[s / 64] &= !(1 << (s % 64));
        }
    }

    /// The first slot from `from` on whose bit is `used` (`slots` if none).
    fn next(&self, from: usize, used: bool) -> usize {
        let mut w = from / 64;
        if w >= self.used.len() {
            return self.slots;
        }
        let flip = if used { 0 } else { !0u64 };
        let mut bits = (self.used[w] ^ flip) & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return (w * 64 + bits.trailing_zeros() as usize).min(self.slots);
            }
            w += 1;
            if w == self.used.len() {
                return self.slots;
            }
            bits = self.used[w] ^ flip;
        }
    }

    /// The longest run of free slots (its start and length; the first of equal ones).
    fn largest_free_run(&self) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        let mut s = self.next(0, false);
        while s < self.slots {
            let e = self.next(s, true);
            if best.is_none_or(|(_, len)| e - s > len) {
                best = Some((s, e - s));
            }
            s = self.next(e, false);
        }
        best
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.data.as_ptr().cast(), self.layout) };
    }
}

struct PoolInner {
    geometry: KvGeometry,
    in_use: AtomicUsize,
    limit: Option<usize>,
    segments: Mutex<Vec<Segment>>,
}

impl PoolInner {
    fn segments(&self) -> MutexGuard<'_, Vec<Segment>> {
        // a panic while the lock was held left the bitmaps consistent (each update is one
        // statement), so a poisoned lock is taken as it is
        self.segments.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Where a model's KV blocks come from: counts the blocks alive and optionally caps them.
#[derive(Clone)]
pub struct KvPool(Arc<PoolInner>);

impl std::fmt::Debug for KvPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvPool")
            .field("geometry", &self.0.geometry)
            .field("blocks_in_use", &self.blocks_in_use())
            .field("limit", &self.0.limit)
            .finish()
    }
}

impl KvPool {
    /// A pool for caches of `geometry`; with `limit`, allocating a block past that many alive
    /// fails with an error instead.
    pub fn new(geometry: KvGeometry, limit: Option<usize>) -> KvPool {
        KvPool(Arc::new(PoolInner {
            geometry,
            in_use: AtomicUsize::new(0),
            limit,
            segments: Mutex::new(Vec::new()),
        }))
    }

    /// The cache shape.
    pub fn geometry(&self) -> KvGeometry {
        self.0.geometry
    }

    /// Blocks alive (a block shared by several sequences counts once).
    pub fn blocks_in_use(&self) -> usize {
        self.0.in_use.load(Ordering::Relaxed)
    }

    /// Bytes of the blocks alive.
    pub fn bytes_in_use(&self) -> usize {
        self.blocks_in_use() * self.0.geometry.block_bytes()
    }

    /// Bytes of the block slots that have held a block at least once (alive, or free for
    /// reuse): the memory the cache has written, which stays the process's — what the cache
    /// costs in resident memory, at least [`KvPool::bytes_in_use`].
    pub fn bytes_touched(&self) -> usize {
        let slots: usize = self.0.segments().iter().map(|s| s.touched_count).sum();
        slots * self.0.geometry.block_bytes()
    }

    /// Block slots the pool has reserved (in use or free for reuse); the system gives memory
    /// to a slot the first time it is handed out.
    pub fn slots_reserved(&self) -> usize {
        self.0.segments().iter().map(|s| s.slots).sum()
    }

    /// The block limit, if any.
    pub fn limit(&self) -> Option<usize> {
        self.0.limit
    }

    /// A new, empty sequence.
    pub fn sequence(&self) -> SeqKv {
        SeqKv {
            blocks: Vec::new(),
            len: 0,
            pool: self.0.clone(),
        }
    }
}

/// One slot of a segment, held by one block at a time.
struct Block {
    segment: usize,
    slot: usize,
    /// The segment's bytes.
    data: NonNull<u8>,
    /// The segment's slots.
    slots: usize,
    pool: Arc<PoolInner>,
}

// SAFETY: the pool hands a slot to one `Block` at a time and takes it back when the block is
// dropped, so a block's values are reached only through it: read through `&Block`, written
// through `&mut Block` (a `SeqKv` writes only into blocks it holds alone, `Arc::get_mut`). The
// segment's memory lives as long as the pool, which the block keeps alive.
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Block {
    /// A block in a free slot: the one after `after`'s when free, otherwise the middle of the
    /// largest run of free slots (its start when the run begins a segment); a new segment when
    /// every slot is held. Zeroed.
    fn alloc(pool: &Arc<PoolInner>, after: Option<&Block>) -> Result<Block> {
        let n = pool.in_use.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(limit) = pool.limit {
            if n > limit {
                pool.in_use.fetch_sub(1, Ordering::Relaxed);
                return Err(ModelError::new(format!(
                    "KV cache full: {limit} blocks of {} positions in use",
                    BLOCK_POSITIONS
                ))
                .with_kind(ModelErrorKind::Capacity));
            }
        }
        let g = pool.geometry;
        let mut segments = pool.segments();
        let next = after.and_then(|b| {
            let s = &segments[b.segment];
            (b.slot + 1 < s.slots && !s.is_used(b.slot + 1)).then_some((b.segment, b.slot + 1))
        });
        let picked = next.or_else(|| {
            let mut best: Option<(usize, usize, usize)> = None;
            for (i, s) in segments.iter().enumerate() {
                if let Some((start, len)) = s.largest_free_run() {
                    if best.is_none_or(|(_, _, l)| len > l) {
                        best = Some((i, start, len));
                    }
                }
            }
            best.map(|(i, start, len)| (i, if start == 0 { 0 } else { start + len / 2 }))
        });
        let (segment, slot) = match picked {
            Some(p) => p,
            None => {
                let reserved: usize = segments.iter().map(|s| s.slots).sum();
                let slots = match pool.limit {
                    Some(limit) => g.segment_slots().min(limit.saturating_sub(reserved)).max(1),
                    None => g.segment_slots(),
                };
                match Segment::new(&g, slots) {
                    Ok(s) => segments.push(s),
                    Err(e) => {
                        pool.in_use.fetch_sub(1, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                (segments.len() - 1, 0)
            }
        };
        let s = &mut segments[segment];
        s.set_used(slot, true);
        if s.touched[slot / 64] >> (slot % 64) & 1 == 0 {
            s.touched[slot / 64] |= 1 << (slot % 64);
            s.touched_count += 1;
        }
        let (data, slots) = (s.data, s.slots);
        drop(segments);
        let block = Block {
            segment,
            slot,
            data,
            slots,
            pool: pool.clone(),
        };
        for (r, piece) in g.all_pieces() {
            for (at, n) in block.piece_bytes(r, piece) {
                // SAFETY: the piece's bytes are inside the segment and reached only through
                // this block (see `piece_bytes` and the `Send` impl)
                unsafe { std::ptr::write_bytes(block.data.as_ptr().add(at), 0, n) };
            }
        }
        Ok(block)
    }

    /// Where piece `piece` of region `r` ([`KvGeometry::region`]) of this block lies in the
    /// segment: the byte offsets of its values (`f16`) or quants (`q8_0`) and of its scales
    /// (`q8_0`; `0` for `f16`), and how many values it holds. A region takes `slots ·
    /// slab_bytes` bytes: its pieces' values one after the other, each `[slot][position][its
    /// columns]`, and for `q8_0` then their scales, each `[slot][position][its columns / 32]`.
    #[inline]
    fn piece_at(&self, r: usize, piece: usize) -> (usize, usize, usize) {
        let g = &self.pool.geometry;
        let (_, cols) = g.pieces(r / g.n_kv_head % 2);
        let per_slot = BLOCK_POSITIONS * cols;
        let base = r * self.slots * g.slab_bytes();
        let i = piece * self.slots + self.slot;
        match g.dtype {
            KvCacheType::F16 => (base + 2 * i * per_slot, 0, per_slot),
            KvCacheType::Q8_0 => {
                let scales = base + self.slots * BLOCK_POSITIONS * g.head_dim;
                (
                    base + i * per_slot,
                    scales + 4 * i * (per_slot / Q8_COLUMNS),
                    per_slot,
                )
            }
        }
    }

    /// The byte ranges (offset, length) of piece `piece` of region `r` in the segment.
    fn piece_bytes(&self, r: usize, piece: usize) -> [(usize, usize); 2] {
        let (at, d, n) = self.piece_at(r, piece);
        match self.pool.geometry.dtype {
            KvCacheType::F16 => [(at, 2 * n), (0, 0)],
            KvCacheType::Q8_0 => [(at, n), (d, 4 * (n / Q8_COLUMNS))],
        }
    }

    /// Piece `piece` of this block's part of region `r`.
    #[inline]
    fn piece(&self, r: usize, piece: usize) -> KvRun<'_> {
        let (at, d, n) = self.piece_at(r, piece);
        let p = self.data.as_ptr();
        // SAFETY: the piece's bytes are inside the segment (`r < slabs()`, `piece` below the
        // region's pieces, `slot < slots`) and aligned for their type (the segment is aligned
        // to 64, and every offset of a `q8_0` scale is a multiple of 4 as `head_dim` is a
        // multiple of 32); the slot's values are reached only through this block (see the
        // `Send` impl).
        unsafe {
            match self.pool.geometry.dtype {
                KvCacheType::F16 => KvRun::F16(std::slice::from_raw_parts(p.add(at).cast(), n)),
                KvCacheType::Q8_0 => KvRun::Q8 {
                    q: std::slice::from_raw_parts(p.add(at).cast(), n),
                    d: std::slice::from_raw_parts(p.add(d).cast(), n / Q8_COLUMNS),
                },
            }
        }
    }

    /// Writes `src` (`cols` values) at position `p` of piece `piece` of region `r`, rounded
    /// to the cache's type.
    fn write(&mut self, r: usize, piece: usize, p: usize, src: &[f32]) {
        let (at, d, n) = self.piece_at(r, piece);
        let cols = src.len();
        assert!((p + 1) * cols <= n);
        let base = self.data.as_ptr();
        // SAFETY: as in `piece`, the ranges are inside this block's piece, and `&mut self` is
        // the only way to this block's values.
        unsafe {
            match self.pool.geometry.dtype {
                KvCacheType::F16 => {
                    let dst = std::slice::from_raw_parts_mut(
                        base.add(at).cast::<f16>().add(p * cols),
                        cols,
                    );
                    // F16C when the CPU has it, the same bits as `f16::from_f32` one value at
                    // a time
                    crate::kernels::convert::f32_to_f16(Level::current(), src, dst);
                }
                KvCacheType::Q8_0 => {
                    let blocks = cols / Q8_COLUMNS;
                    let q = std::slice::from_raw_parts_mut(
                        base.add(at).cast::<i8>().add(p * cols),
                        cols,
                    );
                    let dd = std::slice::from_raw_parts_mut(
                        base.add(d).cast::<f32>().add(p * blocks),
                        blocks,
                    );
                    for ((q, d), x) in q
                        .chunks_exact_mut(Q8_COLUMNS)
                        .zip(dd)
                        .zip(src.chunks_exact(Q8_COLUMNS))
                    {
                        *d = quantize_q8_0(x, q);
                    }
                }
            }
        }
    }

    /// A copy of this block in a new slot (after `after`'s when free).
    fn copy(&self, after: Option<&Block>) -> Result<Block> {
        let copy = Block::alloc(&self.pool, after)?;
        for (r, piece) in self.pool.geometry.all_pieces() {
            for ((from, n), (to, _)) in self
                .piece_bytes(r, piece)
                .into_iter()
                .zip(copy.piece_bytes(r, piece))
            {
                // SAFETY: both ranges are inside their segments, in slots held by `self` and
                // by `copy` (another slot: never the same bytes); `copy` is not shared yet.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.data.as_ptr().add(from),
                        copy.data.as_ptr().add(to),
                        n,
                    )
                };
            }
        }
        Ok(copy)
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.pool.segments()[self.segment].set_used(self.slot, false);
        self.pool.in_use.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One sequence's cache: its blocks and how many positions are filled. Cloning it is a fork:
/// both copies share every block until one writes into it.
#[derive(Clone)]
pub struct SeqKv {
    blocks: Vec<Arc<Block>>,
    len: usize,
    pool: Arc<PoolInner>,
}

impl std::fmt::Debug for SeqKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqKv")
            .field("len", &self.len)
            .field("blocks", &self.blocks.len())
            .finish()
    }
}

impl SeqKv {
    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Blocks this sequence refers to (some may be shared).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks this sequence shares with another sequence or the prefix cache.
    pub fn shared_blocks(&self) -> usize {
        self.blocks
            .iter()
            .filter(|b| Arc::strong_count(b) > 1)
            .count()
    }

    /// Keeps the first `len` positions (`len ≤ self.len()`), dropping the blocks past them.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(ModelError::new(format!(
                "cannot truncate to {len}: only {} positions",
                self.len
            ))
            .with_kind(ModelErrorKind::Invalid));
        }
        self.blocks.truncate(KvGeometry::blocks_for(len));
        self.len = len;
        Ok(())
    }

    /// The blocks that making `n` more positions writable would allocate: the new ones, and a
    /// copy of each shared block among them.
    pub fn blocks_to_write(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let first = self.len / BLOCK_POSITIONS;
        let need = KvGeometry::blocks_for(self.len + n);
        let copies = (first..need.min(self.blocks.len()))
            .filter(|&b| Arc::strong_count(&self.blocks[b]) > 1)
            .count();
        need.saturating_sub(self.blocks.len()) + copies
    }

    /// Makes positions `len..len + n` writable: allocates the blocks they need and copies any
    /// shared block among them. Nothing is written and the length does not change.
    pub(crate) fn prepare_write(&mut self, n: usize) -> Result<()> {
        let end = self.len + n;
        let first = self.len / BLOCK_POSITIONS;
        let need = KvGeometry::blocks_for(end);
        for b in first..need.min(self.blocks.len()) {
            if Arc::strong_count(&self.blocks[b]) > 1 {
                let after = b.checked_sub(1).map(|a| &*self.blocks[a]);
                let copy = self.blocks[b].copy(after)?;
                self.blocks[b] = Arc::new(copy);
            }
        }
        while self.blocks.len() < need {
            let block = Block::alloc(&self.pool, self.blocks.last().map(|b| &**b))?;
            self.blocks.push(Arc::new(block));
        }
        Ok(())
    }

    /// Writes the keys and values (`[n_kv_head * head_dim]` each, rounded to the cache's type) of `layer`
    /// at position `pos` (prepared by [`prepare_write`](Self::prepare_write)).
    pub(crate) fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let g = self.pool.geometry;
        let block = self
            .blocks
            .get_mut(pos / BLOCK_POSITIONS)
            .and_then(Arc::get_mut)
            .ok_or_else(|| {
                ModelError::new(format!("KV position {pos} was not prepared for writing"))
                    .with_kind(ModelErrorKind::Invalid)
            })?;
        let p = pos % BLOCK_POSITIONS;
        let hd = g.head_dim;
        for head in 0..g.n_kv_head {
            for (kv, src) in [k, v].into_iter().enumerate() {
                let (pieces, cols) = g.pieces(kv);
                let r = g.region(layer, kv, head);
                for piece in 0..pieces {
                    let src = &src[head * hd + piece * cols..head * hd + (piece + 1) * cols];
                    block.write(r, piece, p, src);
                }
            }
        }
        Ok(())
    }

    /// Sets the filled length after a forward pass wrote positions up to `len`.
    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.blocks.len() * BLOCK_POSITIONS);
        self.len = len;
    }

    /// The column groups of a head's values ([`KvGeometry::value_groups`]).
    #[inline]
    pub(crate) fn value_groups(&self) -> usize {
        self.pool.geometry.value_groups()
    }

    /// Piece `piece` of the keys (`kv = 0`; one piece, `[BLOCK_POSITIONS][head_dim]`) or the
    /// values (`kv = 1`; [`KvGeometry::value_groups`] pieces of `[BLOCK_POSITIONS][columns]`,
    /// columns `piece · columns..`) of `head` in `layer` held by block `block`.
    #[inline]
    pub(crate) fn piece(
        &self,
        block: usize,
        layer: usize,
        kv: usize,
        head: usize,
        piece: usize,
    ) -> KvRun<'_> {
        let g = &self.pool.geometry;
        self.blocks[block].piece(g.region(layer, kv, head), piece)
    }

    /// [`piece`](Self::piece) from block `block` on, over the blocks after it whose values
    /// follow in memory, at most `max` blocks: the `[blocks · BLOCK_POSITIONS][columns]`
    /// values, and how many blocks they span.
    #[inline]
    pub(crate) fn piece_run(
        &self,
        block: usize,
        max: usize,
        layer: usize,
        kv: usize,
        head: usize,
        piece: usize,
    ) -> (KvRun<'_>, usize) {
        let mut n = 1;
        while n < max && self.continues(block + n - 1) {
            n += 1;
        }
        let first = self.piece(block, layer, kv, head, piece);
        // SAFETY: blocks `block..block + n` hold consecutive slots of one segment, so their
        // pieces' values (and scales) are one run of `n` times the first one's; this sequence
        // holds all of them and only reads them while `&self` lives (a write takes
        // `&mut self`).
        let run = unsafe {
            match first {
                KvRun::F16(v) => KvRun::F16(std::slice::from_raw_parts(v.as_ptr(), n * v.len())),
                KvRun::Q8 { q, d } => KvRun::Q8 {
                    q: std::slice::from_raw_parts(q.as_ptr(), n * q.len()),
                    d: std::slice::from_raw_parts(d.as_ptr(), n * d.len()),
                },
            }
        };
        (run, n)
    }

    /// Whether block `block + 1`'s values directly follow block `block`'s in memory (the next
    /// slot of the same segment), so that reading one head's keys or values goes on in one run.
    #[inline]
    pub(crate) fn continues(&self, block: usize) -> bool {
        match (self.blocks.get(block), self.blocks.get(block + 1)) {
            (Some(a), Some(b)) => a.segment == b.segment && a.slot + 1 == b.slot,
            _ => false,
        }
    }

    /// Whether both sequences hold the very same block at index `block` (tests).
    pub fn same_block(&self, other: &SeqKv, block: usize) -> bool {
        match (self.blocks.get(block), other.blocks.get(block)) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Runs of blocks whose values lie one after the other in memory (1 when all do).
    pub fn runs(&self) -> usize {
        if self.blocks.is_empty() {
            return 0;
        }
        1 + (0..self.blocks.len() - 1)
            .filter(|&b| !self.continues(b))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> KvGeometry {
        KvGeometry {
            n_layer: 2,
            n_kv_head: 1,
            head_dim: 4,
            dtype: KvCacheType::F16,
        }
    }

    #[test]
    fn forks_share_until_written_and_the_pool_counts_once() {
        let pool = KvPool::new(geo(), None);
        let mut a = pool.sequence();
        a.prepare_write(20).unwrap();
        for p in 0..20 {
            for l in 0..2 {
                a.write(l, p, &[p as f32; 4], &[-(p as f32); 4]).unwrap();
            }
        }
        a.set_len(20);
        assert_eq!(pool.blocks_in_use(), 2);
        let mut b = a.clone();
        assert_eq!(pool.blocks_in_use(), 2);
        assert!(a.same_block(&b, 0) && a.same_block(&b, 1));
        assert_eq!(b.blocks_to_write(0), 0);
        assert_eq!(b.blocks_to_write(1), 1);
        assert_eq!(b.blocks_to_write(13), 2);
        let before = pool.blocks_in_use();
        b.prepare_write(1).unwrap();
        assert_eq!(pool.blocks_in_use() - before, 1);
        // the partially filled last block is copied, the full first one stays shared
        assert_eq!(pool.blocks_in_use(), 3);
        assert!(a.same_block(&b, 0) && !a.same_block(&b, 1));
        b.write(0, 20, &[9.0; 4], &[9.0; 4]).unwrap();
        b.set_len(21);
        assert_eq!(a.piece(1, 0, 0, 0, 0).value(4 * 4), 0.0);
        assert_eq!(b.piece(1, 0, 0, 0, 0).value(4 * 4), 9.0);
        assert_eq!(b.piece(1, 1, 0, 0, 0).value(3 * 4), 19.0);
        b.truncate(3).unwrap();
        assert_eq!(b.blocks(), 1);
        assert_eq!(pool.blocks_in_use(), 2);
        drop(a);
        drop(b);
        assert_eq!(pool.blocks_in_use(), 0);
        assert!(pool.sequence().truncate(1).is_err());
    }

    #[test]
    fn touched_bytes_count_every_slot_written_once_and_stay_after_a_free() {
        let pool = KvPool::new(geo(), None);
        let bb = geo().block_bytes();
        assert_eq!(pool.bytes_touched(), 0);
        let mut a = pool.sequence();
        a.prepare_write(40).unwrap();
        let three = pool.bytes_touched();
        assert_eq!(three, pool.bytes_in_use());
        assert_eq!(three, 3 * bb);
        drop(a);
        // the freed slots' memory was written: still the process's
        assert_eq!(pool.bytes_in_use(), 0);
        assert_eq!(pool.bytes_touched(), three);
        // a new sequence of the same size may take other slots (the middle of the largest
        // free run): the count is of distinct slots ever held, never of blocks alive
        let mut b = pool.sequence();
        b.prepare_write(40).unwrap();
        let t = pool.bytes_touched();
        assert!(t >= three && t <= 6 * bb, "{t}");
        assert!(t >= pool.bytes_in_use());
    }

    #[test]
    fn a_limited_pool_refuses_past_its_limit() {
        let pool = KvPool::new(geo(), Some(2));
        let mut a = pool.sequence();
        a.prepare_write(32).unwrap();
        let mut b = pool.sequence();
        let e = b.prepare_write(1).unwrap_err();
        assert!(e.to_string().contains("KV cache full"), "{e}");
        assert_eq!(e.kind(), ModelErrorKind::Capacity);
        assert_eq!(pool.blocks_in_use(), 2);
    }

    #[test]
    fn a_sequence_alone_is_one_run_and_freed_slots_are_reused_zeroed() {
        let g = KvGeometry {
            n_layer: 3,
            n_kv_head: 2,
            head_dim: 8,
            dtype: KvCacheType::F16,
        };
        let pool = KvPool::new(g, None);
        let mut a = pool.sequence();
        // a prompt, then decode steps one position at a time
        a.prepare_write(40).unwrap();
        a.set_len(40);
        for pos in 40..200 {
            a.prepare_write(1).unwrap();
            for l in 0..3 {
                a.write(l, pos, &[1.5; 16], &[-2.5; 16]).unwrap();
            }
            a.set_len(pos + 1);
        }
        assert_eq!(a.blocks(), 13);
        assert_eq!(a.runs(), 1, "one sequence alone gets consecutive slots");
        // every (layer, kv, head) part of a block sits at its own place
        assert_eq!(a.piece(12, 2, 1, 1, 0).value(7 * 8), -2.5);
        assert_eq!(a.piece(12, 2, 0, 0, 0).value(7 * 8), 1.5);
        let reserved = pool.slots_reserved();
        drop(a);
        assert_eq!(pool.blocks_in_use(), 0);
        // the slots come back zeroed, and no new segment is made
        let mut b = pool.sequence();
        b.prepare_write(200).unwrap();
        assert_eq!(pool.slots_reserved(), reserved);
        assert_eq!(b.runs(), 1);
        for blk in 0..b.blocks() {
            for l in 0..3 {
                for kv in 0..2 {
                    for h in 0..2 {
                        let p = b.piece(blk, l, kv, h, 0);
                        assert!((0..p.len()).all(|i| p.value(i).to_bits() == 0));
                    }
                }
            }
        }
    }

    #[test]
    fn values_are_stored_in_column_groups() {
        let g = KvGeometry {
            n_layer: 2,
            n_kv_head: 2,
            head_dim: 64,
            dtype: KvCacheType::F16,
        };
        assert_eq!(g.value_groups(), 2);
        let pool = KvPool::new(g, None);
        let mut a = pool.sequence();
        a.prepare_write(40).unwrap();
        let k: Vec<f32> = (0..128).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..128).map(|i| -(i as f32)).collect();
        for pos in 0..40 {
            a.write(1, pos, &k, &v).unwrap();
        }
        a.set_len(40);
        for (b, p) in [(0, 0), (1, 3), (2, 7)] {
            for h in 0..2 {
                let keys = a.piece(b, 1, 0, h, 0);
                assert_eq!(keys.len(), BLOCK_POSITIONS * 64);
                assert_eq!(keys.value(p * 64 + 5), (h * 64 + 5) as f32);
                for c in 0..2 {
                    let vals = a.piece(b, 1, 1, h, c);
                    assert_eq!(vals.len(), BLOCK_POSITIONS * 32);
                    assert_eq!(vals.value(p * 32 + 9), -((h * 64 + c * 32 + 9) as f32));
                }
            }
        }
        // one run per column group across the blocks
        let (run, n) = a.piece_run(0, 3, 1, 1, 1, 1);
        assert_eq!(n, 3);
        assert_eq!(run.value((2 * BLOCK_POSITIONS + 7) * 32), -(64.0 + 32.0));
    }

    #[test]
    fn a_q8_0_cache_holds_ggml_blocks_in_runs_and_copies_them_on_write() {
        let g = KvGeometry {
            n_layer: 2,
            n_kv_head: 2,
            head_dim: 64,
            dtype: KvCacheType::Q8_0,
        };
        assert_eq!(g.check(), Ok(()));
        let f16 = KvGeometry {
            dtype: KvCacheType::F16,
            ..g
        };
        // 32 quants and one 4-byte scale per 32 values, against 64 bytes
        assert_eq!(g.block_bytes() * 32, f16.block_bytes() * 18);
        let pool = KvPool::new(g, None);
        let mut a = pool.sequence();
        a.prepare_write(40).unwrap();
        let row = |pos: usize, sign: f32| -> Vec<f32> {
            (0..128)
                .map(|i| sign * ((i * 7 + pos * 3) % 23) as f32 * 0.37)
                .collect()
        };
        for pos in 0..40 {
            for l in 0..2 {
                a.write(l, pos, &row(pos, 1.0), &row(pos, -1.0)).unwrap();
            }
        }
        a.set_len(40);
        // what `quantize_q8_0` makes of each 32 values, read back exactly as `q · d`
        let want = |x: &[f32]| -> Vec<f32> {
            let mut q = [0i8; Q8_COLUMNS];
            let d = quantize_q8_0(x, &mut q);
            q.iter().map(|&q| f32::from(q) * d).collect()
        };
        for (b, p) in [(0, 0), (1, 5), (2, 7)] {
            let pos = b * BLOCK_POSITIONS + p;
            for h in 0..2 {
                let keys = a.piece(b, 1, 0, h, 0);
                assert_eq!(keys.len(), BLOCK_POSITIONS * 64);
                let k = row(pos, 1.0);
                let kq = [
                    want(&k[h * 64..h * 64 + 32]),
                    want(&k[h * 64 + 32..h * 64 + 64]),
                ]
                .concat();
                let got: Vec<f32> = (0..64).map(|i| keys.value(p * 64 + i)).collect();
                assert_eq!(got, kq);
                for c in 0..2 {
                    let vals = a.piece(b, 1, 1, h, c);
                    let v = row(pos, -1.0);
                    let vq = want(&v[h * 64 + c * 32..h * 64 + c * 32 + 32]);
                    let got: Vec<f32> = (0..32).map(|i| vals.value(p * 32 + i)).collect();
                    assert_eq!(got, vq);
                }
            }
        }
        // a run over three blocks: quants and scales each one run, the values as in the blocks
        let (run, n) = a.piece_run(0, 3, 1, 1, 1, 1);
        assert_eq!(n, 3);
        let mut all = vec![0f32; run.len()];
        run.to_f32(Level::current(), &mut all);
        for b in 0..3 {
            let piece = a.piece(b, 1, 1, 1, 1);
            for i in 0..piece.len() {
                assert_eq!(all[b * piece.len() + i], piece.value(i));
            }
        }
        // a fork's write copies the block, quants and scales, and leaves the original alone
        let mut b = a.clone();
        b.truncate(39).unwrap();
        b.prepare_write(1).unwrap();
        assert!(!a.same_block(&b, 2));
        b.write(0, 39, &[1.0; 128], &[2.0; 128]).unwrap();
        b.set_len(40);
        let (ka, kb) = (a.piece(2, 0, 0, 0, 0), b.piece(2, 0, 0, 0, 0));
        for i in 0..7 * 64 {
            assert_eq!(ka.value(i), kb.value(i), "copied value {i}");
        }
        let one = want(&[1.0; Q8_COLUMNS])[0];
        assert_eq!(kb.value(7 * 64), one);
        assert_ne!(ka.value(7 * 64), one);
        // heads whose width is not a multiple of 32 cannot be stored as q8_0
        let odd = KvGeometry { head_dim: 48, ..g };
        assert!(odd.check().unwrap_err().contains("multiple of 32"));
    }

    #[test]
    fn sequences_growing_side_by_side_keep_long_runs() {
        let pool = KvPool::new(geo(), None);
        let mut seqs: Vec<SeqKv> = (0..4).map(|_| pool.sequence()).collect();
        // four sequences take a block in turn, 16 blocks each
        for _ in 0..16 {
            for s in &mut seqs {
                let len = s.len();
                s.prepare_write(BLOCK_POSITIONS).unwrap();
                s.set_len(len + BLOCK_POSITIONS);
            }
        }
        let runs: Vec<usize> = seqs.iter().map(SeqKv::runs).collect();
        // interleaved one slot at a time, each would be 16 runs of one block
        assert!(runs.iter().all(|&r| r <= 4), "runs per sequence: {runs:?}");
        assert_eq!(pool.blocks_in_use(), 64);
    }

    #[test]
    fn a_limited_pool_reserves_no_more_than_its_limit() {
        let g = KvGeometry {
            n_layer: 1,
            n_kv_head: 1,
            head_dim: 4,
            dtype: KvCacheType::F16,
        };
        let limit = g.segment_slots() + 3;
        let pool = KvPool::new(g, Some(limit));
        let mut a = pool.sequence();
        a.prepare_write(limit * BLOCK_POSITIONS).unwrap();
        assert_eq!(pool.slots_reserved(), limit);
        assert_eq!(a.runs(), 2, "one run per segment");
        a.set_len(limit * BLOCK_POSITIONS);
        // full: a fork that writes needs a block (a copy of the last) and is refused
        let mut b = a.clone();
        b.truncate(limit * BLOCK_POSITIONS - 1).unwrap();
        let e = b.prepare_write(1).unwrap_err();
        assert_eq!(e.kind(), ModelErrorKind::Capacity);
        assert_eq!(pool.slots_reserved(), limit);
        drop(a);
        // now the fork holds every block alone and writes in place
        b.prepare_write(1).unwrap();
        assert_eq!(pool.blocks_in_use(), limit);
    }
}
