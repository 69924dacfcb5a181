//! The workspace's truncations at every kernel level (pinned per workspace, so these tests
//! never touch the process-wide cap) against plain scalar code written the obvious way: same
//! sets, same orders, same bits.

use super::sort::{canonical, sort_by_id, sort_canonical_from_id_order};
use super::*;
use crate::kernels::tests::{bits, exp_sum_ref, levels, max_ref, rows, Rng};
use crate::math::{self, exp_f32};

#[test]
fn block_bounds_follow_edits_and_temperature() {
    const NAME: &str = "block_bounds_follow_edits_and_temperature";
    for level in levels(NAME) {
        for row in rows() {
            let n = row.len();
            let mut r = Rng(n as u64);
            let mut ws = Workspace::new(n);
            ws.kernel_level = Some(level);
            ws.load(&row, false).unwrap();
            let mut z = row.clone();
            // raise, lower and mask a few entries, then divide by a temperature
            for _ in 0..8 {
                let i = r.below(n);
                let d = (r.unit() - 0.3) * 50.0;
                ws.edit_buf(i as u32, |x| x + d);
                if z[i] > f32::NEG_INFINITY {
                    z[i] += d;
                }
                let j = r.below(n);
                ws.mask(j as u32);
                z[j] = f32::NEG_INFINITY;
            }
            // lower the top value of a few blocks: their bounds follow
            for _ in 0..3 {
                let b = r.below(n.div_ceil(BLOCK));
                let blk = b * BLOCK..(b * BLOCK + BLOCK).min(n);
                if let Some(i) = blk.max_by(|&i, &j| z[i].total_cmp(&z[j])) {
                    if z[i] > f32::NEG_INFINITY {
                        ws.edit_buf(i as u32, |x| x - 100.0);
                        z[i] -= 100.0;
                    }
                }
            }
            ws.divide(0.7);
            for x in z.iter_mut() {
                if *x > f32::NEG_INFINITY {
                    *x = (*x / 0.7).clamp(-f32::MAX, f32::MAX);
                }
            }
            assert_eq!(bits(&ws.buf), bits(&z));
            // the bounds are exact: each the maximum of its block
            for (b, blk) in z.chunks(BLOCK).enumerate() {
                let m = blk.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                assert_eq!(ws.bmax[b], m, "block {b}, level {level:?}");
            }
            assert_eq!(ws.dense_max().to_bits(), max_ref(&z).to_bits());
            let mut canon: Vec<Cand> = z
                .iter()
                .enumerate()
                .filter(|(_, x)| **x > f32::NEG_INFINITY)
                .map(|(i, &x)| Cand { id: i as u32, z: x })
                .collect();
            canon.sort_by(canonical);
            let k = 5.min(canon.len());
            if k > 0 {
                ws.top_k(k, TopKTies::ById);
                if !ws.dense {
                    assert_eq!(ws.cands, &canon[..k], "level {level:?}");
                }
            }
        }
    }
}

#[test]
fn truncation_kernels_match_scalar_at_every_level() {
    const NAME: &str = "truncation_kernels_match_scalar_at_every_level";
    for level in levels(NAME) {
        for row in rows() {
            let n = row.len();
            let finite: Vec<Cand> = row
                .iter()
                .enumerate()
                .filter(|(_, z)| **z > f32::NEG_INFINITY)
                .map(|(i, &z)| Cand { id: i as u32, z })
                .collect();
            if finite.is_empty() {
                continue;
            }
            let mut canon = finite.clone();
            canon.sort_by(canonical);
            // top-k
            for k in [1usize, 3, 40, 100] {
                let mut ws = Workspace::new(n);
                ws.kernel_level = Some(level);
                ws.load(&row, false).unwrap();
                ws.top_k(k, TopKTies::ById);
                let want = &canon[..k.min(canon.len())];
                assert_eq!(ws.support_len(), want.len());
                if !ws.dense {
                    assert_eq!(ws.cands, want, "level {level:?}, k {k}");
                }
            }
            // radix sorts
            let mut v = finite.clone();
            let mut tmp = Vec::new();
            sort_canonical_from_id_order(&mut v, &mut tmp);
            assert_eq!(v, canon);
            let mut by_id = canon.clone();
            sort_by_id(&mut by_id, &mut tmp, n);
            assert_eq!(by_id, finite);
            // top-p: the smallest canonical prefix with mass >= p
            let m = canon[0].z;
            for (p, min_keep) in [
                (0.1, 1),
                (0.5, 1),
                (0.9, 1),
                (0.95, 1),
                (0.999, 1),
                (0.5, 3),
                (0.95, 40),
                (0.999_999, 1),
            ] {
                let mut ws = Workspace::new(n);
                ws.kernel_level = Some(level);
                ws.load(&row, false).unwrap();
                let (s, _) = exp_sum_ref(&row, m);
                let mut cum = 0.0f64;
                let mut keep = canon.len();
                for (i, c) in canon.iter().enumerate() {
                    cum += exp_f32(c.z - m) as f64 / s;
                    if cum >= p && i + 1 >= min_keep {
                        keep = i + 1;
                        break;
                    }
                }
                ws.top_p(p, min_keep);
                // the dense top-p leaves the nucleus in id order (or canonical order when
                // the exact sequential sum decided)
                let mut got = ws.cands.clone();
                got.sort_by(canonical);
                assert_eq!(
                    got,
                    &canon[..keep],
                    "level {level:?}, p {p}, min_keep {min_keep}"
                );
                assert!(
                    ws.sorted || ws.cands.is_sorted_by_key(|c| c.id),
                    "level {level:?}, p {p}"
                );
                // the normaliser over the nucleus, without and with sorting it
                let (m1, s1) = ws.normalize_any_order();
                ws.norm_valid = false;
                let mut plain = 0.0f64;
                for c in &canon[..keep] {
                    plain += exp_f32(c.z - m) as f64;
                }
                let (m2, s2) = ws.normalize();
                assert_eq!(s2.to_bits(), plain.to_bits());
                assert_eq!((m1.to_bits(), s1.to_bits()), (m2.to_bits(), s2.to_bits()));
            }
            // min-p
            for alpha in [0.01, 0.1, 0.5] {
                let mut ws = Workspace::new(n);
                ws.kernel_level = Some(level);
                ws.load(&row, false).unwrap();
                ws.min_p(alpha, 1);
                let lz = math::ln_f64(alpha) as f32 - 1e-3;
                let mut want: Vec<Cand> = finite
                    .iter()
                    .copied()
                    .filter(|c| c.z - m >= lz && exp_f32(c.z - m) as f64 >= alpha)
                    .collect();
                if want.is_empty() {
                    want.push(canon[0]);
                }
                let mut got = ws.cands.clone();
                got.sort_by_key(|c| c.id);
                want.sort_by_key(|c| c.id);
                assert_eq!(got, want, "level {level:?}, min-p {alpha}");
            }
        }
    }
}

/// An attached workspace reads the raw row in place: the same count, maximum and block bounds
/// as a copying load, no copy until the first edit, then a copy that carries the edit; a call
/// that ends before any edit leaves no processed logits behind.
#[test]
fn attached_row_is_read_in_place_and_copied_on_first_edit() {
    const NAME: &str = "attached_row_is_read_in_place_and_copied_on_first_edit";
    for level in levels(NAME) {
        for row in rows() {
            let n = row.len();
            let mut loaded = Workspace::new(n);
            loaded.kernel_level = Some(level);
            loaded.load(&row, false).unwrap();
            assert_eq!(loaded.processed_logits().map(bits), Some(bits(&row)));

            let mut ws = Workspace::new(n);
            ws.kernel_level = Some(level);
            ws.with_attached(&row, false, |at| {
                assert!(at.buf.is_borrowed());
                assert_eq!(bits(&at.buf), bits(&row));
                assert_eq!(at.dense_count, loaded.dense_count, "level {level:?}");
                assert_eq!(at.max_cache.to_bits(), loaded.max_cache.to_bits());
                assert_eq!(bits(&at.bmax), bits(&loaded.bmax), "level {level:?}");
                // reads do not copy
                let _ = at.dense_max();
                assert!(at.buf.is_borrowed());
                // a clone is an owned copy
                let c = at.clone();
                assert!(!c.buf.is_borrowed());
                assert_eq!(bits(&c.buf), bits(&row));
            })
            .unwrap();
            // the call ended before any edit: nothing is left to read
            assert_eq!(ws.processed_logits(), None);
            // (an edit of a masked token writes nothing)
            let Some(i) = row.iter().rposition(|z| *z > f32::NEG_INFINITY) else {
                continue;
            };
            ws.with_attached(&row, false, |at| {
                at.edit_buf(i as u32, |x| x - 1.5);
                assert!(!at.buf.is_borrowed());
                let mut want = row.clone();
                want[i] -= 1.5;
                assert_eq!(bits(&at.buf), bits(&want));
            })
            .unwrap();
            // copied: the processed logits stay
            assert!(ws.processed_logits().is_some());
            // a load after an attached call copies again
            ws.load(&row, false).unwrap();
            assert_eq!(ws.processed_logits().map(bits), Some(bits(&row)));
        }
    }
}

/// A row that fails validation is not attached and leaves no support.
#[test]
fn attach_rejects_what_load_rejects() {
    let mut ws = Workspace::new(70);
    for bad in [f32::NAN, f32::INFINITY] {
        let mut row = vec![0.5f32; 70];
        row[66] = bad;
        let e = ws
            .with_attached(&row, false, |_| panic!("not attached"))
            .expect_err("rejected");
        assert!(e.to_string().contains("66"), "{e}");
        assert_eq!(ws.support_len(), 0);
    }
    assert!(ws.with_attached(&[0.0; 69], false, |_| ()).is_err());
}

/// A closure that panics still ends the borrow of the raw row: nothing is left to read.
#[test]
fn attached_row_ends_when_the_closure_panics() {
    let row = vec![0.5f32; 70];
    let mut ws = Workspace::new(70);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ws.with_attached(&row, false, |at| {
            assert!(at.buf.is_borrowed());
            panic!("the closure panics");
        })
    }));
    assert!(r.is_err());
    assert!(!ws.buf.is_borrowed());
    assert_eq!(ws.processed_logits(), None);
}
