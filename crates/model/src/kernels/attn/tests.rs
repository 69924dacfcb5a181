use super::*;

/// Deterministic values with a wide spread of magnitudes and both signs.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let m = ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
            let e = ((x >> 8) % 9) as i32 - 4;
            m * 2f32.powi(e)
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

thread_local! {
    /// Set by these tests: the AVX-512 levels run the AVX-512 kernels whatever the register
    /// width in use (each test runs on its own thread).
    pub(super) static FORCE_512: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The levels this CPU runs, the AVX-512 ones with their own kernels (see [`FORCE_512`]); says
/// which it lacks (those are not compared here).
fn levels() -> Vec<Level> {
    FORCE_512.with(|f| f.set(true));
    crate::kernels::tests::levels()
}

#[test]
fn every_level_gives_the_scalar_bits() {
    let levels = levels();
    for hd in [8, 16, 24, 32, 40, 64, 128] {
        for rep in [1, 2, 3, 4, 6, 7] {
            for here in (1..=17).chain([24, 31, 40]) {
                let q = values(rep * hd, (hd * 100 + rep * 10 + here) as u64);
                let k = values(here * hd, (hd * 7 + here) as u64);
                let (stride, off) = (here + 5, 3);
                let mut a = vec![0f32; rep * stride];
                scores(Level::Scalar, &q, &k, hd, 0.125, &mut a, stride, off);
                let w = values(rep * stride, here as u64 + 99);
                let mut oa = values(rep * hd, 5);
                accumulate(Level::Scalar, &w, stride, off, &k, hd, &mut oa);
                for &level in &levels {
                    let mut b = vec![0f32; rep * stride];
                    scores(level, &q, &k, hd, 0.125, &mut b, stride, off);
                    assert_eq!(
                        bits(&a),
                        bits(&b),
                        "{level:?} scores hd {hd} rep {rep} here {here}"
                    );
                    let mut ob = values(rep * hd, 5);
                    accumulate(level, &w, stride, off, &k, hd, &mut ob);
                    assert_eq!(
                        bits(&oa),
                        bits(&ob),
                        "{level:?} accumulate hd {hd} rep {rep} here {here}"
                    );
                }
                // from `f16` values (here `k` rounded), all columns or the last 16 of
                // each position: the same bits as from their `f32` conversions
                let kh: Vec<half::f16> = k.iter().map(|&x| half::f16::from_f32(x)).collect();
                let kf: Vec<f32> = kh.iter().map(|x| x.to_f32()).collect();
                let mut want = values(rep * hd, 5);
                accumulate(Level::Scalar, &w, stride, off, &kf, hd, &mut want);
                let width = if hd % 16 == 0 { 16 } else { hd };
                let cols = |o: &[f32]| -> Vec<u32> {
                    o.chunks_exact(hd)
                        .flat_map(|o| o[hd - width..].iter().map(|v| v.to_bits()))
                        .collect()
                };
                for &level in &levels {
                    let mut all = values(rep * hd, 5);
                    accumulate_kv(
                        level,
                        &w,
                        stride,
                        off,
                        KvRun::F16(&kh),
                        hd,
                        here,
                        hd,
                        &mut all,
                    );
                    assert_eq!(bits(&want), bits(&all), "f16 hd {hd} rep {rep} here {here}");
                    let mut part: Vec<f32> = values(rep * hd, 5)
                        .chunks_exact(hd)
                        .flat_map(|o| o[hd - width..].to_vec())
                        .collect();
                    let v = &kh[hd - width..];
                    accumulate_kv(
                        level,
                        &w,
                        stride,
                        off,
                        KvRun::F16(v),
                        hd,
                        here,
                        width,
                        &mut part,
                    );
                    assert_eq!(cols(&want), bits(&part), "f16 columns hd {hd} here {here}");
                }
            }
        }
    }
}

#[test]
fn scores_from_f16_keys_give_the_bits_of_converted_keys() {
    let levels = levels();
    for hd in [8, 24, 64, 72, 256] {
        for rep in 1..=7 {
            for here in [1, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 40] {
                let q = values(rep * hd, (hd * 31 + rep * 7 + here) as u64);
                let kh: Vec<half::f16> = values(here * hd, (hd + here * 3) as u64)
                    .iter()
                    .map(|&x| half::f16::from_f32(x))
                    .collect();
                let kf: Vec<f32> = kh.iter().map(|x| x.to_f32()).collect();
                let (stride, off) = (here + 3, 2);
                let mut want = vec![0f32; rep * stride];
                scores(Level::Scalar, &q, &kf, hd, 0.125, &mut want, stride, off);
                for &level in &levels {
                    let mut got = vec![0f32; rep * stride];
                    scores_kv(level, &q, KvRun::F16(&kh), hd, 0.125, &mut got, stride, off);
                    assert_eq!(
                        bits(&want),
                        bits(&got),
                        "{level:?} hd {hd} rep {rep} here {here}"
                    );
                }
            }
        }
    }
}

/// `x` quantised as a `q8_0` cache holds it: its quants, scales and exact values.
fn q8(x: &[f32]) -> (Vec<i8>, Vec<f32>, Vec<f32>) {
    let mut q = vec![0i8; x.len()];
    let d: Vec<f32> = x
        .chunks_exact(Q8_COLUMNS)
        .zip(q.chunks_exact_mut(Q8_COLUMNS))
        .map(|(x, q)| crate::kv::quantize_q8_0(x, q))
        .collect();
    let f = q
        .iter()
        .enumerate()
        .map(|(i, &q)| f32::from(q) * d[i / Q8_COLUMNS])
        .collect();
    (q, d, f)
}

#[test]
fn q8_0_keys_and_values_give_the_bits_of_their_values() {
    let levels = levels();
    for hd in [32, 64, 96, 128, 256] {
        for rep in 1..=7 {
            for here in [1, 3, 4, 5, 8, 9, 15, 16, 17, 24, 33] {
                let q = values(rep * hd, (hd * 13 + rep * 5 + here) as u64);
                let (kq, kd, kf) = q8(&values(here * hd, (hd + here * 11) as u64));
                let k = KvRun::Q8 { q: &kq, d: &kd };
                let (stride, off) = (here + 3, 2);
                let mut want = vec![0f32; rep * stride];
                scores(Level::Scalar, &q, &kf, hd, 0.125, &mut want, stride, off);
                let w = values(rep * stride, here as u64 + 7);
                let mut want_out = values(rep * hd, 3);
                accumulate(Level::Scalar, &w, stride, off, &kf, hd, &mut want_out);
                for &level in &levels {
                    let mut got = vec![0f32; rep * stride];
                    scores_kv(level, &q, k, hd, 0.125, &mut got, stride, off);
                    assert_eq!(
                        bits(&want),
                        bits(&got),
                        "{level:?} scores hd {hd} rep {rep} here {here}"
                    );
                    let mut out = values(rep * hd, 3);
                    accumulate_kv(level, &w, stride, off, k, hd, here, hd, &mut out);
                    assert_eq!(
                        bits(&want_out),
                        bits(&out),
                        "{level:?} values hd {hd} rep {rep} here {here}"
                    );
                }
            }
        }
    }
}

#[test]
fn q8_0_quantisation_follows_ggml() {
    // m = 2.54: d = f16(0.02), q = round_ties_even(x · 127 / m)
    let mut x = [0f32; Q8_COLUMNS];
    x[0] = 2.54;
    x[1] = -1.27;
    x[2] = 0.01; // 0.5 quants: ties to even, 0
    x[3] = 0.03; // 1.5: 2
    x[4] = -0.05; // -2.5: -2
    let mut q = [0i8; Q8_COLUMNS];
    let d = crate::kv::quantize_q8_0(&x, &mut q);
    assert_eq!(d, half::f16::from_f32(2.54 / 127.0).to_f32());
    assert_eq!(&q[..5], &[127, -64, 0, 2, -2]);
    let zero = crate::kv::quantize_q8_0(&[0.0; Q8_COLUMNS], &mut q);
    assert_eq!((zero, q), (0.0, [0i8; Q8_COLUMNS]));
}

#[test]
fn scores_follow_the_lane_tree() {
    // Written out for one key: lanes l = i % 8, fused multiply-adds, the fixed tree.
    let q = values(16, 1);
    let k = values(16, 2);
    let mut acc = [0f32; 8];
    for i in 0..16 {
        acc[i % 8] = q[i].mul_add(k[i], acc[i % 8]);
    }
    let want =
        (((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))) * 0.5;
    for level in levels() {
        let mut s = [0f32; 1];
        scores(level, &q, &k, 16, 0.5, &mut s, 1, 0);
        assert_eq!(s[0].to_bits(), want.to_bits());
    }
}
