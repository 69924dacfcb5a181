//! Orders of the support: the canonical order (processed logit descending, then token id
//! ascending) and the stable radix sorts into it and by id. The top-k heap whose root is the
//! worst kept candidate is shared with the kernels (`kernels::common`).

use super::Cand;
pub(crate) use crate::kernels::common::push_heap;

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
