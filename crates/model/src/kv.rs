//! The paged KV cache: keys and values of every sequence, in blocks of [`BLOCK_POSITIONS`]
//! positions, shared between sequences until one of them writes.
//!
//! A block holds, for [`BLOCK_POSITIONS`] consecutive positions, the key and the value of every
//! layer and key/value head, in half precision (llama.cpp keeps its cache in `f16` too), laid
//! out `[layer][key | value][kv head][position][head_dim]` so that one head's keys for a block
//! are contiguous. A sequence ([`SeqKv`]) is a list of reference-counted blocks and a length:
//!
//! * a decode step writes only its new position (no copy of what is already cached);
//! * [`fork`](SeqKv::clone) clones the list (the branches share every block), and the first
//!   write into a shared block copies that one block (copy on write);
//! * [`truncate`](SeqKv::truncate) drops the blocks past the new length;
//! * the [`KvPool`] counts the blocks alive (each shared block once), which is what the engine's
//!   memory budget and the server's metrics read, and can refuse to allocate past a limit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use half::f16;

use crate::error::{ModelError, ModelErrorKind, Result};

/// Positions per block.
pub const BLOCK_POSITIONS: usize = 16;

/// The shape of a model's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl KvGeometry {
    /// Values (keys and values, all layers and heads) in one block.
    pub fn block_values(&self) -> usize {
        self.n_layer * 2 * self.n_kv_head * BLOCK_POSITIONS * self.head_dim
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.block_values() * std::mem::size_of::<f16>()
    }

    /// Bytes the cache takes per position.
    pub fn bytes_per_position(&self) -> usize {
        self.block_bytes() / BLOCK_POSITIONS
    }

    /// Blocks that hold `positions` positions.
    pub fn blocks_for(positions: usize) -> usize {
        positions.div_ceil(BLOCK_POSITIONS)
    }

    /// Start of the `[position][head_dim]` slab of (`layer`, key (`0`) or value (`1`), `head`).
    fn slab(&self, layer: usize, kv: usize, head: usize) -> usize {
        ((layer * 2 + kv) * self.n_kv_head + head) * BLOCK_POSITIONS * self.head_dim
    }
}

struct PoolInner {
    geometry: KvGeometry,
    in_use: AtomicUsize,
    limit: Option<usize>,
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

struct Block {
    data: Box<[f16]>,
    pool: Arc<PoolInner>,
}

impl Block {
    fn alloc(pool: &Arc<PoolInner>, data: Box<[f16]>) -> Result<Block> {
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
        Ok(Block {
            data,
            pool: pool.clone(),
        })
    }
}

impl Drop for Block {
    fn drop(&mut self) {
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

    /// The blocks [`prepare_write`](Self::prepare_write) would allocate to make `n` more
    /// positions writable: the new ones, and a copy of each shared block among them.
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
                let copy = Block::alloc(&self.pool, self.blocks[b].data.clone())?;
                self.blocks[b] = Arc::new(copy);
            }
        }
        let values = self.pool.geometry.block_values();
        while self.blocks.len() < need {
            let data = vec![f16::ZERO; values].into_boxed_slice();
            self.blocks.push(Arc::new(Block::alloc(&self.pool, data)?));
        }
        Ok(())
    }

    /// Writes the keys and values (`[n_kv_head * head_dim]` each, rounded to `f16`) of `layer`
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
                let at = g.slab(layer, kv, head) + p * hd;
                let dst = &mut block.data[at..at + hd];
                for (d, s) in dst.iter_mut().zip(&src[head * hd..(head + 1) * hd]) {
                    *d = f16::from_f32(*s);
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

    /// The `[BLOCK_POSITIONS][head_dim]` keys (`kv = 0`) or values (`kv = 1`) of `head` in
    /// `layer` held by block `block`.
    #[inline]
    pub(crate) fn slab(&self, block: usize, layer: usize, kv: usize, head: usize) -> &[f16] {
        let g = &self.pool.geometry;
        let at = g.slab(layer, kv, head);
        &self.blocks[block].data[at..at + BLOCK_POSITIONS * g.head_dim]
    }

    /// Whether both sequences hold the very same block at index `block` (tests).
    pub fn same_block(&self, other: &SeqKv, block: usize) -> bool {
        match (self.blocks.get(block), other.blocks.get(block)) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
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
        assert_eq!(a.slab(1, 0, 0, 0)[4 * 4].to_f32(), 0.0);
        assert_eq!(b.slab(1, 0, 0, 0)[4 * 4].to_f32(), 9.0);
        assert_eq!(b.slab(1, 1, 0, 0)[3 * 4].to_f32(), 19.0);
        b.truncate(3).unwrap();
        assert_eq!(b.blocks(), 1);
        assert_eq!(pool.blocks_in_use(), 2);
        drop(a);
        drop(b);
        assert_eq!(pool.blocks_in_use(), 0);
        assert!(pool.sequence().truncate(1).is_err());
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
}
