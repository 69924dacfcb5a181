//! Orders of the support: the canonical order (processed logit descending, then token id
//! ascending), the stable radix sorts into it and by id, and the top-k heap whose root is the
//! worst kept candidate.

use super::Cand;

/// Canonical order: processed logit descending, then token id ascending.
#[inline]
pub(crate) fn canonical(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.z.partial_cmp(&a.z)
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

/// A key whose ascending order is the descending order of `z` (no NaN), with `-0.0 == 0.0`.
#[inline(always)]
pub(super) fn descending_key(z: f32) -> u32 {
    let b = (z + 0.0).to_bits(); // -0.0 + 0.0 = +0.0
    let ascending = if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    };
    !ascending
}

/// Stable LSD radix sort of `v` by the low `bits` bits of `key`, with `tmp` as scratch (no
/// allocation when `tmp` can hold `v`). Passes whose digit is the same for every element are
/// skipped.
fn radix_sort_by(v: &mut [Cand], tmp: &mut Vec<Cand>, bits: u32, key: impl Fn(&Cand) -> u32) {
    const DIGIT: u32 = 8;
    let n = v.len();
    tmp.clear();
    tmp.resize(n, Cand { id: 0, z: 0.0 });
    let mut in_v = true;
    let mut shift = 0;
    while shift < bits {
        let (src, dst) = if in_v {
            (&v[..], &mut tmp[..])
        } else {
            (&tmp[..], &mut v[..])
        };
        let mut count = [0usize; 1 << DIGIT];
        for c in src {
            count[((key(c) >> shift) & 0xff) as usize] += 1;
        }
        if !count.contains(&n) {
            let mut sum = 0;
            for c in count.iter_mut() {
                let k = *c;
                *c = sum;
                sum += k;
            }
            for c in src {
                let d = ((key(c) >> shift) & 0xff) as usize;
                dst[count[d]] = *c;
                count[d] += 1;
            }
            in_v = !in_v;
        }
        shift += DIGIT;
    }
    if !in_v {
        v.copy_from_slice(tmp);
    }
}

/// Sorts candidates listed in ascending id order into the canonical order (a stable sort by
/// score descending keeps equal scores in id order).
pub(super) fn sort_canonical_from_id_order(v: &mut [Cand], tmp: &mut Vec<Cand>) {
    if v.len() < 128 {
        v.sort_unstable_by(canonical);
    } else {
        radix_sort_by(v, tmp, 32, |c| descending_key(c.z));
    }
}

/// Sorts candidates by id (ids are distinct and below `vocab_size`).
pub(crate) fn sort_by_id(v: &mut [Cand], tmp: &mut Vec<Cand>, vocab_size: usize) {
    if v.len() < 128 {
        v.sort_unstable_by_key(|c| c.id);
    } else {
        let bits = usize::BITS - vocab_size.saturating_sub(1).leading_zeros();
        radix_sort_by(v, tmp, bits, |c| c.id);
    }
}

/// "Worse" in a top-k heap: lower z, or equal z and higher id (the root holds the worst).
#[inline(always)]
pub(crate) fn worse(a: &Cand, b: &Cand) -> bool {
    a.z < b.z || (a.z == b.z && a.id > b.id)
}

/// Adds `c` to a heap whose root is its worst candidate (sift up).
pub(crate) fn push_heap(heap: &mut Vec<Cand>, c: Cand) {
    heap.push(c);
    let mut j = heap.len() - 1;
    while j > 0 {
        let p = (j - 1) / 2;
        if worse(&heap[j], &heap[p]) {
            heap.swap(j, p);
            j = p;
        } else {
            break;
        }
    }
}

#[inline(always)]
pub(crate) fn sift_down(h: &mut [Cand], mut i: usize) {
    let n = h.len();
    loop {
        let l = 2 * i + 1;
        if l >= n {
            break;
        }
        let r = l + 1;
        let mut w = l;
        if r < n && worse(&h[r], &h[l]) {
            w = r;
        }
        if worse(&h[w], &h[i]) {
            h.swap(w, i);
            i = w;
        } else {
            break;
        }
    }
}
