//! AVX-512 kernels (F/BW/VL, and VNNI where the CPU has it), x86-64, selected at run time.
//!
//! Every kernel computes exactly the operations of [`super::scalar`] for its format (the order
//! is spelled out in the [module docs](super)); only the exact integer parts are computed
//! differently:
//!
//! * **32-value formats** (Q4_0, Q5_0, Q5_1, Q8_0): one 512-bit register holds block `k`
//!   of two weight rows (row `2p` in the low 256 bits, row `2p + 1` in the high), against the
//!   activation block broadcast to both halves, so one instruction stream serves two rows and
//!   each row keeps its own chain of fused multiply-adds over the blocks, in order. The weight
//!   quants are taken unsigned, `u = w + o` (`o` = 8 for Q4_0, 16 for Q5_0, 128 for Q8_0, 0 for
//!   Q5_1), and the lane sum is `Σ u·a − o·Σ a`, both exact. With VNNI the offset part is
//!   computed once per activation block, negated, and each row's sum is one `vpdpbusd` that
//!   starts from it; without it `vpmaddubsw` + `vpmaddwd` (Q8_0 keeps the sign trick there,
//!   since `u` up to 255 could saturate `vpmaddubsw`).
//! * **K-quants** (Q4_K, Q5_K, Q6_K): one register holds two 32-value groups of one super-block
//!   (`vpmaddubsw`, then `vpmaddwd` by the groups' scales); the two halves are added at the end
//!   of the super-block, which leaves every lane sum exact. With VNNI, tiles of several
//!   activation rows fuse the scale multiply and the add (`vpdpwssd`); the float part of a
//!   (row, activation) pair is one register (see `kq45`).
//! * **Q4_1, F16, BF16, F32** and single weight rows run the AVX2 code (Q4_1's row pairs were
//!   not faster than its AVX2 tiles).
//!
//! Callers must hold an effective level ([`Level::effective`](super::Level::effective)) of
//! [`Level::Avx512`](super::Level::Avx512) or above: the CPU has AVX-512 F/BW/VL with AVX2,
//! FMA and F16C; and [`Level::Avx512Vnni`](super::Level::Avx512Vnni) for the VNNI entry
//! point. On other architectures no such level is effective, and the entry points forward to
//! the scalar code.

#[cfg(target_arch = "x86_64")]
pub(super) use imp::*;

#[cfg(not(target_arch = "x86_64"))]
pub(super) use fallback::*;

#[cfg(not(target_arch = "x86_64"))]
mod fallback {
    use super::super::{scalar, Acts, QMatrix};

    /// Forwards to the scalar code.
    ///
    /// # Safety
    /// None needed; `unsafe` only mirrors the x86-64 signature.
    pub(in super::super) unsafe fn dot_tile(
        w: &QMatrix,
        r0: usize,
        nr: usize,
        a: &Acts<'_>,
        b0: usize,
        n: usize,
    ) -> [[f32; 4]; 4] {
        scalar::dot_tile(w, r0, nr, a, b0, n)
    }

    /// Forwards to the scalar code.
    ///
    /// # Safety
    /// None needed; `unsafe` only mirrors the x86-64 signature.
    pub(in super::super) unsafe fn dot_tile_vnni(
        w: &QMatrix,
        r0: usize,
        nr: usize,
        a: &Acts<'_>,
        b0: usize,
        n: usize,
    ) -> [[f32; 4]; 4] {
        scalar::dot_tile(w, r0, nr, a, b0, n)
    }
}

// Register tiles are indexed by pair / row and activation (`acc[p][bi]`); index loops read best.
#[allow(clippy::needless_range_loop)]
#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    use super::super::avx2k::{h2f, hsum8, kq45_result, ld};
    use super::super::{avx2, Acts, Chunk, MatFormat, QMatrix};
    use crate::kernels::array;

    /// The dots of weight rows `r0..r0 + nr` with activation rows `b0..b0 + n` (`1 ≤ nr, n ≤ 4`,
    /// `b0 % 4 == 0`): `res[ri][bi]`, without VNNI.
    ///
    /// # Safety
    /// [`Level::Avx512`](super::super::Level::Avx512) must be effective (the CPU has AVX-512
    /// F/BW/VL, AVX2, FMA and F16C).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    #[inline(never)]
    pub(in super::super) unsafe fn dot_tile(
        w: &QMatrix,
        r0: usize,
        nr: usize,
        a: &Acts<'_>,
        b0: usize,
        n: usize,
    ) -> [[f32; 4]; 4] {
        bw::dot_tile(w, r0, nr, a, b0, n)
    }

    /// As [`dot_tile`], with VNNI.
    ///
    /// # Safety
    /// [`Level::Avx512Vnni`](super::super::Level::Avx512Vnni) must be effective (as for
    /// [`dot_tile`], and AVX-512 VNNI).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline(never)]
    pub(in super::super) unsafe fn dot_tile_vnni(
        w: &QMatrix,
        r0: usize,
        nr: usize,
        a: &Acts<'_>,
        b0: usize,
        n: usize,
    ) -> [[f32; 4]; 4] {
        // 256-bit tiles where the CPU splits 512-bit operations (see `super::bits_256`)
        if super::super::bits_256() {
            macro_rules! narrow {
                ($c:expr) => {
                    match (nr, n) {
                        (2, 1) => return vnni::b32y::<{ $c }, 2, 1>(w, r0, a, b0),
                        (2, 2) => return vnni::b32y::<{ $c }, 2, 2>(w, r0, a, b0),
                        (2, 3) => return vnni::b32y::<{ $c }, 2, 3>(w, r0, a, b0),
                        (2, 4) => return vnni::b32y::<{ $c }, 2, 4>(w, r0, a, b0),
                        (4, 1) => return vnni::b32y::<{ $c }, 4, 1>(w, r0, a, b0),
                        (4, 2) => return vnni::b32y::<{ $c }, 4, 2>(w, r0, a, b0),
                        (4, 3) => return vnni::b32y::<{ $c }, 4, 3>(w, r0, a, b0),
                        (4, 4) => return vnni::b32y::<{ $c }, 4, 4>(w, r0, a, b0),
                        _ => {}
                    }
                };
            }
            match w.format {
                MatFormat::Q4_0 => narrow!(Q4_0),
                // one activation row of Q4_1 runs faster on its AVX2 tiles
                MatFormat::Q4_1 if n > 1 => narrow!(Q4_1),
                MatFormat::Q5_0 => narrow!(Q5_0),
                MatFormat::Q5_1 => narrow!(Q5_1),
                _ => {}
            }
        }
        vnni::dot_tile(w, r0, nr, a, b0, n)
    }

    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q5_0: u8 = 2;
    const Q5_1: u8 = 3;
    const Q8_0: u8 = 4;

    /// `lo` in every 16-bit lane of the low 256 bits, `hi` in every lane of the high 256.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    #[inline]
    fn halves16(lo: i16, hi: i16) -> __m512i {
        _mm512_inserti64x4::<1>(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi))
    }

    /// The 32-value kernels, the tile dispatch and the shared helpers, compiled once per
    /// instruction set (`$feat`); the enclosing module supplies the integer dots `dot_u`,
    /// `dot_q8`, `corr_q8`, `corr_u` and `dot_corr`.
    macro_rules! kernels {
        ($feat:tt) => {
            /// See [`super::dot_tile`]. Even row counts of the 32-value formats run as
            /// register tiles of one or two row pairs × `n`; K-quants as tiles of 1×n, 2×n
            /// and 4×1; everything else on the AVX2 code (the same bits).
            #[target_feature(enable = $feat)]
            pub(super) fn dot_tile(
                w: &QMatrix,
                r0: usize,
                nr: usize,
                a: &Acts<'_>,
                b0: usize,
                n: usize,
            ) -> [[f32; 4]; 4] {
                macro_rules! go {
                    ($c:expr) => {
                        match (nr, n) {
                            (2, 1) => return b32::<{ $c }, 1, 1>(w, r0, a, b0),
                            (2, 2) => return b32::<{ $c }, 1, 2>(w, r0, a, b0),
                            (2, 3) => return b32::<{ $c }, 1, 3>(w, r0, a, b0),
                            (2, 4) => return b32::<{ $c }, 1, 4>(w, r0, a, b0),
                            (4, 1) => return b32::<{ $c }, 2, 1>(w, r0, a, b0),
                            (4, 2) => return b32::<{ $c }, 2, 2>(w, r0, a, b0),
                            (4, 3) => return b32::<{ $c }, 2, 3>(w, r0, a, b0),
                            (4, 4) => return b32::<{ $c }, 2, 4>(w, r0, a, b0),
                            _ => {}
                        }
                    };
                }
                match w.format {
                    MatFormat::Q4_0 => go!(Q4_0),
                    MatFormat::Q5_0 => go!(Q5_0),
                    MatFormat::Q5_1 => go!(Q5_1),
                    MatFormat::Q5_K | MatFormat::Q6_K => {
                        if let Some(res) = kq::dot_tile(w, r0, nr, a, b0, n) {
                            return res;
                        }
                    }
                    // Q4_1's row pairs measured 0.85–1.0× its AVX2 tiles (see `run_rows`);
                    // Q4_K and Q8_0 run in bands (`band`).
                    MatFormat::Q4_1
                    | MatFormat::Q4_K
                    | MatFormat::Q8_0
                    | MatFormat::F16
                    | MatFormat::BF16
                    | MatFormat::F32 => {}
                }
                // the AVX2 code compiled with these registers (`avx2::vl`)
                avx2::vl::dot_tile(w, r0, nr, a, b0, n)
            }

            /// One chunk of row `ra` in the low half and of row `rb` in the high half.
            #[target_feature(enable = $feat)]
            #[inline]
            fn pair(lo: &Chunk, hi: &Chunk) -> __m512i {
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld(lo)), ld(hi))
            }

            /// Q4_0, Q5_0, Q5_1 and Q8_0 for weight rows `r0..r0 + 2P` (as `P` pairs)
            /// and activation rows `b0..b0 + N`.
            // One function per tile shape: inlined into the dispatch, the kernels spill.
            #[target_feature(enable = $feat)]
            #[inline(never)]
            fn b32<const F: u8, const P: usize, const N: usize>(
                w: &QMatrix,
                r0: usize,
                a: &Acts<'_>,
                b0: usize,
            ) -> [[f32; 4]; 4] {
                let nb = w.nb;
                let has_min = F == Q5_1;
                assert!(a.nb == nb && b0 + N <= a.n && r0 + 2 * P <= w.rows && P <= 2);
                // `s[k · np4 + b0..][..4]` lies inside `s` (len `nb · np4`) for every block `k`:
                // `b0 % 4 == 0`, `np4 % 4 == 0` and `b0 < np4`.
                assert!(
                    !has_min
                        || (b0.is_multiple_of(4)
                            && a.np4.is_multiple_of(4)
                            && b0 < a.np4
                            && a.s.len() == nb * a.np4)
                );
                let rows = 2 * P;
                let wq: [&[Chunk]; 4] = crate::kernels::array(|i| {
                    let r = r0 + i.min(rows - 1);
                    &w.qs[r * w.qchunks..(r + 1) * w.qchunks]
                });
                let wd: [&[u16]; 4] = crate::kernels::array(|i| {
                    let r = r0 + i.min(rows - 1);
                    &w.d[r * w.nbp..(r + 1) * w.nbp]
                });
                let wm: [&[u16]; 4] = crate::kernels::array(|i| {
                    let r = r0 + i.min(rows - 1);
                    if has_min {
                        &w.m[r * w.nbp..(r + 1) * w.nbp]
                    } else {
                        &[]
                    }
                });
                let aq: [&[Chunk]; N] =
                    crate::kernels::array(|i| &a.q[(b0 + i) * nb..(b0 + i + 1) * nb]);
                let ad: [&[f32]; N] =
                    crate::kernels::array(|i| &a.d[(b0 + i) * a.nbp..(b0 + i + 1) * a.nbp]);
                let lo4 = _mm512_set1_epi8(0x0F);
                let sixteen = _mm512_set1_epi8(16);
                let off: i8 = match F {
                    Q4_0 => 8,
                    Q5_0 => 16,
                    _ => 0,
                };
                let offv = _mm512_set1_epi8(off);
                // Lane `l < 8` takes scale `kk` of the low row, lane `8 + l` scale `kk` of the
                // high row (`8 + kk` in `sc`).
                let idx0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8);
                let mut acc = [[_mm512_setzero_ps(); N]; P];
                let mut summ = [_mm_setzero_ps(); 4];
                let mut sc = [[_mm512_setzero_ps(); N]; P];
                let mut mm = [[0f32; 8]; 4];
                let mut base = 0;
                while base < nb {
                    // SAFETY (all loads of this block): `base < nb ≤ nbp` and `nbp % 8 == 0`,
                    // so `base + 8 ≤ nbp`, the length of every `wd`, `wm` (when used) and `ad`
                    // slice; `mm[ri]` has eight `f32`s.
                    for p in 0..P {
                        let dw = unsafe {
                            _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
                                _mm256_castsi128_si256(_mm_loadu_si128(
                                    wd[2 * p].as_ptr().add(base).cast(),
                                )),
                                _mm_loadu_si128(wd[2 * p + 1].as_ptr().add(base).cast()),
                            ))
                        };
                        for bi in 0..N {
                            let da = unsafe { _mm256_loadu_ps(ad[bi].as_ptr().add(base)) };
                            let da = _mm512_castsi512_ps(_mm512_broadcast_i64x4(
                                _mm256_castps_si256(da),
                            ));
                            sc[p][bi] = _mm512_mul_ps(dw, da);
                        }
                    }
                    if has_min {
                        for ri in 0..rows {
                            unsafe {
                                let m8 = _mm256_cvtph_ps(_mm_loadu_si128(
                                    wm[ri].as_ptr().add(base).cast(),
                                ));
                                _mm256_storeu_ps(mm[ri].as_mut_ptr(), m8);
                            }
                        }
                    }
                    let kend = (nb - base).min(8);
                    for kk in 0..kend {
                        let k = base + kk;
                        let sh = _mm_cvtsi32_si128(((k & 1) * 4) as i32);
                        let mut u = [_mm512_setzero_si512(); P];
                        for p in 0..P {
                            let (ra, rb) = (r0 + 2 * p, r0 + 2 * p + 1);
                            u[p] = if F == Q8_0 {
                                pair(&wq[2 * p][k], &wq[2 * p + 1][k])
                            } else {
                                let c = pair(&wq[2 * p][k / 2], &wq[2 * p + 1][k / 2]);
                                let nib = _mm512_and_si512(_mm512_srl_epi16(c, sh), lo4);
                                if F == Q5_0 || F == Q5_1 {
                                    let hb =
                                        w.qh[ra * nb + k] as u64 | (w.qh[rb * nb + k] as u64) << 32;
                                    _mm512_mask_add_epi8(nib, hb, nib, sixteen)
                                } else {
                                    nib
                                }
                            };
                        }
                        let idx = _mm512_add_epi32(idx0, _mm512_set1_epi32(kk as i32));
                        for bi in 0..N {
                            let av = _mm512_broadcast_i64x4(ld(&aq[bi][k]));
                            let corr = if F == Q8_0 {
                                corr_q8(av)
                            } else if off != 0 {
                                corr_u(offv, av)
                            } else {
                                _mm512_setzero_si512()
                            };
                            for p in 0..P {
                                let isum = if F == Q8_0 {
                                    dot_q8(u[p], av, corr)
                                } else if off != 0 {
                                    dot_corr(u[p], av, corr)
                                } else {
                                    dot_u(u[p], av)
                                };
                                acc[p][bi] = _mm512_fmadd_ps(
                                    _mm512_permutexvar_ps(idx, sc[p][bi]),
                                    _mm512_cvtepi32_ps(isum),
                                    acc[p][bi],
                                );
                            }
                        }
                        if has_min {
                            // SAFETY: see the assertion above.
                            let sv = unsafe { _mm_loadu_ps(a.s.as_ptr().add(k * a.np4 + b0)) };
                            for ri in 0..rows {
                                summ[ri] = _mm_fmadd_ps(_mm_set1_ps(mm[ri][kk]), sv, summ[ri]);
                            }
                        }
                    }
                    base += 8;
                }
                let mut res = [[0f32; 4]; 4];
                for p in 0..P {
                    let mut sm = [[0f32; 4]; 2];
                    if has_min {
                        for h in 0..2 {
                            // SAFETY: `sm[h]` has four `f32`s.
                            unsafe { _mm_storeu_ps(sm[h].as_mut_ptr(), summ[2 * p + h]) };
                        }
                    }
                    for bi in 0..N {
                        let x = acc[p][bi];
                        let lo = _mm512_castps512_ps256(x);
                        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
                        let (l, h) = (hsum8(lo), hsum8(hi));
                        res[2 * p][bi] = if has_min { l + sm[0][bi] } else { l };
                        res[2 * p + 1][bi] = if has_min { h + sm[1][bi] } else { h };
                    }
                }
                res
            }
        };
    }

    /// The tile shapes of the K-quant kernels: `$f::<[$c,] R, N>` for `(nr, n)`, else `None`.
    macro_rules! kq_shapes {
        ($nr:expr, $n:expr, $w:expr, $r0:expr, $a:expr, $b0:expr, $f:ident $(, $c:expr)?) => {
            match ($nr, $n) {
                (1, 1) => $f::<$($c,)? 1, 1>($w, $r0, $a, $b0),
                (1, 2) => $f::<$($c,)? 1, 2>($w, $r0, $a, $b0),
                (1, 3) => $f::<$($c,)? 1, 3>($w, $r0, $a, $b0),
                (1, 4) => $f::<$($c,)? 1, 4>($w, $r0, $a, $b0),
                (2, 1) => $f::<$($c,)? 2, 1>($w, $r0, $a, $b0),
                (2, 2) => $f::<$($c,)? 2, 2>($w, $r0, $a, $b0),
                (2, 3) => $f::<$($c,)? 2, 3>($w, $r0, $a, $b0),
                (2, 4) => $f::<$($c,)? 2, 4>($w, $r0, $a, $b0),
                (4, 1) => $f::<$($c,)? 4, 1>($w, $r0, $a, $b0),
                _ => return None,
            }
        };
    }

    /// The K-quant kernels, compiled once per AVX-512 level (`$feat`); the enclosing module
    /// supplies `madd_acc(acc, s, p)`, `acc + vpmaddwd(s, p)`.
    macro_rules! kq_kernels {
        ($feat:tt) => {
            mod kq {
                use super::*;

                /// The K-quant dots of a 1×n, 2×n or 4×1 tile, `None` for other shapes.
                #[target_feature(enable = $feat)]
                pub(super) fn dot_tile(
                    w: &QMatrix,
                    r0: usize,
                    nr: usize,
                    a: &Acts<'_>,
                    b0: usize,
                    n: usize,
                ) -> Option<[[f32; 4]; 4]> {
                    Some(match w.format {
                        MatFormat::Q5_K => kq_shapes!(nr, n, w, r0, a, b0, kq45, true),
                        MatFormat::Q6_K => kq_shapes!(nr, n, w, r0, a, b0, q6k),
                        _ => return None,
                    })
                }

                /// `acc + vpmaddwd(s, p)`: [`madd_acc`] in tiles of several activation rows;
                /// with one, whose few accumulator chains would wait on a fused instruction's
                /// latency, a separate multiply and add (measured 16 % faster there).
                #[target_feature(enable = $feat)]
                #[inline]
                fn acc_tile<const N: usize>(acc: __m512i, s: __m512i, p: __m512i) -> __m512i {
                    if N > 1 {
                        madd_acc(acc, s, p)
                    } else {
                        _mm512_add_epi32(acc, _mm512_madd_epi16(s, p))
                    }
                }

                /// The low and high 256 bits of `x` added (exact `i32` lanes).
                #[target_feature(enable = $feat)]
                #[inline]
                fn fold(x: __m512i) -> __m256i {
                    _mm256_add_epi32(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64::<1>(x))
                }

                /// Q4_K (`K5 = false`) and Q5_K (`K5 = true`) × Q8_K for weight rows `r0..r0 + R` and
                /// activation rows `b0..b0 + N`: groups `2j` (low half) and `2j + 1` (high half) of
                /// a super-block in one register. Bounds as in the AVX2 kernel: `vpmaddubsw` pairs
                /// below `2 · 31 · 127`, every lane below `8 · 63 · 4 · 31 · 127 < 2^24`.
                ///
                /// The float part of each (row, activation) pair lives in one register: lanes 0–7 are
                /// `acc`, lanes 8–11 Q4_K's `accm` (lane 8 Q5_K's `summs`), and one fused multiply-add
                /// per super-block updates them all, each lane computing exactly the operation the
                /// [module docs](super::super) name for it (`−(d_a · dmin_w)` is `d_a · (−dmin_w)`).
                /// The per-row and per-activation parts of that step are computed once per super-block.
                #[target_feature(enable = $feat)]
                #[inline(never)]
                fn kq45<const K5: bool, const R: usize, const N: usize>(
                    w: &QMatrix,
                    r0: usize,
                    a: &Acts<'_>,
                    b0: usize,
                ) -> [[f32; 4]; 4] {
                    let nb = w.nb;
                    let per = if K5 { 5 } else { 4 };
                    assert!(a.knb == nb && b0 + N <= a.n && r0 + R <= w.rows);
                    assert!(w.qs.len() >= w.rows * w.qchunks && w.qchunks >= per * nb);
                    assert!(w.sc.len() >= w.rows * nb);
                    assert!(
                        w.d.len() >= w.rows * w.nbp && w.m.len() >= w.rows * w.nbp && w.nbp >= nb
                    );
                    assert!(a.kq.len() >= a.n * nb * 8 && a.kd.len() >= a.n * nb);
                    assert!(a.kbs.len() >= a.n * nb);
                    let mask = _mm512_set1_epi8(0x0F);
                    let one = _mm512_set1_epi8(1);
                    // Nibble shift per half: low nibbles for group 2j, high for 2j + 1.
                    let nsh = halves16(0, 4);
                    // High-bit shift per half: bit 2j for group 2j, 2j + 1 for 2j + 1 (then 2 per j).
                    let hsh = halves16(0, 1);
                    // Lanes 0–7 take `d_w`, lanes 8–11 (Q5_K: lane 8) `−dmin_w`, the others zero.
                    let didx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
                    let dmask: __mmask16 = if K5 { 0x01FF } else { 0x0FFF };
                    let negm = _mm_castsi128_ps(_mm_setr_epi32(0, i32::MIN, 0, 0));
                    // Row and activation bases (all in bounds by the checks above).
                    let qs: [*const Chunk; R] = array(|ri| w.qs[(r0 + ri) * w.qchunks..].as_ptr());
                    let scp: [*const [u8; 16]; R] = array(|ri| w.sc[(r0 + ri) * nb..].as_ptr());
                    let dp: [*const u16; R] = array(|ri| w.d[(r0 + ri) * w.nbp..].as_ptr());
                    let mp: [*const u16; R] = array(|ri| w.m[(r0 + ri) * w.nbp..].as_ptr());
                    let kq: [*const Chunk; N] = array(|bi| a.kq[(b0 + bi) * nb * 8..].as_ptr());
                    let kd: [*const f32; N] = array(|bi| a.kd[(b0 + bi) * nb..].as_ptr());
                    let kbs: [*const [i16; 16]; N] = array(|bi| a.kbs[(b0 + bi) * nb..].as_ptr());
                    let mut acc = [[_mm512_setzero_ps(); N]; R];
                    for k in 0..nb {
                        let mut sumi = [[_mm512_setzero_si512(); N]; R];
                        let mut sc16 = [_mm512_setzero_si512(); R];
                        let mut hb = [_mm512_setzero_si512(); R];
                        // SAFETY (every access below): `k < nb`, `j < 4`, `ri < R`, `bi < N`, and the
                        // bases cover `nb` super-blocks of their row (checked above).
                        for ri in 0..R {
                            let s8 = unsafe { _mm_loadu_si128(scp[ri].add(k).cast()) };
                            sc16[ri] = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(s8));
                            if K5 {
                                let h =
                                    _mm512_broadcast_i64x4(ld(unsafe { &*qs[ri].add(5 * k + 4) }));
                                hb[ri] = _mm512_srlv_epi16(h, hsh);
                            }
                        }
                        for j in 0..4 {
                            // Scale `2j` in the low half, `2j + 1` in the high half.
                            let sidx = _mm512_add_epi16(hsh, _mm512_set1_epi16(2 * j as i16));
                            let mut wv = [_mm512_setzero_si512(); R];
                            let mut sv = [_mm512_setzero_si512(); R];
                            for ri in 0..R {
                                let c = _mm512_broadcast_i64x4(ld(unsafe {
                                    &*qs[ri].add(per * k + j)
                                }));
                                wv[ri] = _mm512_and_si512(_mm512_srlv_epi16(c, nsh), mask);
                                if K5 {
                                    let h = _mm512_and_si512(hb[ri], one);
                                    wv[ri] = _mm512_or_si512(wv[ri], _mm512_slli_epi16::<4>(h));
                                    hb[ri] = _mm512_srli_epi16::<2>(hb[ri]);
                                }
                                sv[ri] = _mm512_permutexvar_epi16(sidx, sc16[ri]);
                            }
                            for bi in 0..N {
                                let y =
                                    unsafe { _mm512_loadu_si512(kq[bi].add(8 * k + 2 * j).cast()) };
                                for ri in 0..R {
                                    let p = _mm512_maddubs_epi16(wv[ri], y);
                                    sumi[ri][bi] = acc_tile::<N>(sumi[ri][bi], sv[ri], p);
                                }
                            }
                        }
                        // The float step: per row `[d_w ×8, −dmin_w ×4]` and the mins, per activation
                        // `d_a` and its 32-value sums, then one multiply and one fused multiply-add.
                        let mut dv = [_mm512_setzero_ps(); R];
                        let mut mins = [_mm_setzero_si128(); R];
                        for ri in 0..R {
                            let (d, m) = unsafe { (*dp[ri].add(k), *mp[ri].add(k)) };
                            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(
                                (d as u32 | (m as u32) << 16) as i32,
                            ));
                            let dm = _mm512_castps128_ps512(_mm_xor_ps(dm, negm));
                            dv[ri] = _mm512_maskz_permutexvar_ps(dmask, didx, dm);
                            let sc = unsafe { &*scp[ri].add(k) };
                            mins[ri] = _mm_cvtepu8_epi16(unsafe {
                                _mm_loadl_epi64(sc[8..].as_ptr().cast())
                            });
                        }
                        for bi in 0..N {
                            let da = _mm512_set1_ps(unsafe { *kd[bi].add(k) });
                            let bs = unsafe { &*kbs[bi].add(k) };
                            let (b_lo, b_hi) = unsafe {
                                (
                                    _mm_loadu_si128(bs.as_ptr().cast()),
                                    _mm_loadu_si128(bs.as_ptr().add(8).cast()),
                                )
                            };
                            let bsh = _mm_hadd_epi16(b_lo, b_hi);
                            for ri in 0..R {
                                let prod = _mm_madd_epi16(mins[ri], bsh);
                                let prod = if K5 {
                                    let s = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
                                    _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s))
                                } else {
                                    prod
                                };
                                let x = _mm512_inserti32x4::<2>(
                                    _mm512_zextsi256_si512(fold(sumi[ri][bi])),
                                    prod,
                                );
                                acc[ri][bi] = _mm512_fmadd_ps(
                                    _mm512_mul_ps(da, dv[ri]),
                                    _mm512_cvtepi32_ps(x),
                                    acc[ri][bi],
                                );
                            }
                        }
                    }
                    let mut res = [[0f32; 4]; 4];
                    for ri in 0..R {
                        for bi in 0..N {
                            let lo = _mm512_castps512_ps256(acc[ri][bi]);
                            let hi = _mm512_extractf32x4_ps::<2>(acc[ri][bi]);
                            res[ri][bi] = kq45_result::<K5>(lo, hi, _mm_cvtss_f32(hi));
                        }
                    }
                    res
                }

                /// Q6_K × Q8_K for weight rows `r0..r0 + R` and activation rows `b0..b0 + N`: groups
                /// `g` and `g + 1` of a super-block in one register. Bounds as in the AVX2 kernel.
                #[target_feature(enable = $feat)]
                #[inline(never)]
                fn q6k<const R: usize, const N: usize>(
                    w: &QMatrix,
                    r0: usize,
                    a: &Acts<'_>,
                    b0: usize,
                ) -> [[f32; 4]; 4] {
                    let nb = w.nb;
                    assert!(a.knb == nb && b0 + N <= a.n && r0 + R <= w.rows);
                    assert!(w.qs.len() >= w.rows * w.qchunks && w.qchunks >= 6 * nb);
                    assert!(
                        w.sc.len() >= w.rows * nb && w.d.len() >= w.rows * w.nbp && w.nbp >= nb
                    );
                    assert!(a.kq.len() >= a.n * nb * 8 && a.kd.len() >= a.n * nb);
                    let m4 = _mm512_set1_epi8(0x0F);
                    let m3 = _mm512_set1_epi8(3);
                    let m32 = _mm512_set1_epi8(32);
                    // High-bit pair shifts: groups 4h + 0 / 4h + 1 take bits 0–1 / 2–3 of `qh`,
                    // groups 4h + 2 / 4h + 3 bits 4–5 / 6–7.
                    let s01 = halves16(0, 2);
                    let s23 = _mm512_add_epi16(s01, _mm512_set1_epi16(4));
                    // Scale indices of groups `g`, `g + 1`: one per 16-value quarter, `2g + quarter`.
                    let qidx = _mm512_setr_epi64(
                        0,
                        0,
                        0x0001_0001_0001_0001,
                        0x0001_0001_0001_0001,
                        0x0002_0002_0002_0002,
                        0x0002_0002_0002_0002,
                        0x0003_0003_0003_0003,
                        0x0003_0003_0003_0003,
                    );
                    // Row and activation bases (all in bounds by the checks above).
                    let qs: [*const Chunk; R] = array(|ri| w.qs[(r0 + ri) * w.qchunks..].as_ptr());
                    let scp: [*const [u8; 16]; R] = array(|ri| w.sc[(r0 + ri) * nb..].as_ptr());
                    let dp: [*const u16; R] = array(|ri| w.d[(r0 + ri) * w.nbp..].as_ptr());
                    let kq: [*const Chunk; N] = array(|bi| a.kq[(b0 + bi) * nb * 8..].as_ptr());
                    let kd: [*const f32; N] = array(|bi| a.kd[(b0 + bi) * nb..].as_ptr());
                    let mut acc = [[_mm256_setzero_ps(); N]; R];
                    for k in 0..nb {
                        let mut sumi = [[_mm512_setzero_si512(); N]; R];
                        let mut sc16 = [_mm512_setzero_si512(); R];
                        // SAFETY (every access below): `k < nb`, `h < 2`, `ri < R`, `bi < N`, and the
                        // bases cover `nb` super-blocks of their row (checked above).
                        for ri in 0..R {
                            let s8 = unsafe { _mm_loadu_si128(scp[ri].add(k).cast()) };
                            sc16[ri] = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(s8));
                        }
                        for h in 0..2 {
                            let mut q = [[_mm512_setzero_si512(); 2]; R];
                            let mut sv = [[_mm512_setzero_si512(); 2]; R];
                            for ri in 0..R {
                                let base = unsafe { qs[ri].add(6 * k) };
                                let l = unsafe { _mm512_loadu_si512(base.add(2 * h).cast()) };
                                let qh = _mm512_broadcast_i64x4(ld(unsafe { &*base.add(4 + h) }));
                                let h01 = _mm512_and_si512(_mm512_srlv_epi16(qh, s01), m3);
                                let h23 = _mm512_and_si512(_mm512_srlv_epi16(qh, s23), m3);
                                q[ri][0] = _mm512_or_si512(
                                    _mm512_and_si512(l, m4),
                                    _mm512_slli_epi16::<4>(h01),
                                );
                                q[ri][1] = _mm512_or_si512(
                                    _mm512_and_si512(_mm512_srli_epi16::<4>(l), m4),
                                    _mm512_slli_epi16::<4>(h23),
                                );
                                for t in 0..2 {
                                    // groups 4h + 2t and 4h + 2t + 1: scales 8h + 4t + quarter
                                    let g2 = (8 * h + 4 * t) as i16;
                                    let idx = _mm512_add_epi16(qidx, _mm512_set1_epi16(g2));
                                    sv[ri][t] = _mm512_permutexvar_epi16(idx, sc16[ri]);
                                }
                            }
                            for bi in 0..N {
                                for t in 0..2 {
                                    let g = 4 * h + 2 * t;
                                    let y =
                                        unsafe { _mm512_loadu_si512(kq[bi].add(8 * k + g).cast()) };
                                    let ys = _mm512_maddubs_epi16(m32, y);
                                    for ri in 0..R {
                                        let p =
                                            _mm512_sub_epi16(_mm512_maddubs_epi16(q[ri][t], y), ys);
                                        sumi[ri][bi] = acc_tile::<N>(sumi[ri][bi], sv[ri][t], p);
                                    }
                                }
                            }
                        }
                        for ri in 0..R {
                            let dw = h2f(unsafe { *dp[ri].add(k) });
                            for bi in 0..N {
                                let da = unsafe { *kd[bi].add(k) };
                                acc[ri][bi] = _mm256_fmadd_ps(
                                    _mm256_set1_ps(da * dw),
                                    _mm256_cvtepi32_ps(fold(sumi[ri][bi])),
                                    acc[ri][bi],
                                );
                            }
                        }
                    }
                    let mut res = [[0f32; 4]; 4];
                    for ri in 0..R {
                        for bi in 0..N {
                            res[ri][bi] = hsum8(acc[ri][bi]);
                        }
                    }
                    res
                }
            }
        };
    }

    /// Without VNNI: `vpmaddubsw` + `vpmaddwd`.
    mod bw {
        use super::*;

        /// `Σ u·a` over each four bytes: `u` unsigned and at most 31 (or an offset of at most
        /// 16), `a` in `−127..=127`; `vpmaddubsw` pairs stay below `2 · 31 · 127`.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        #[inline]
        fn dot_u(u: __m512i, a: __m512i) -> __m512i {
            _mm512_madd_epi16(_mm512_maddubs_epi16(u, a), _mm512_set1_epi16(1))
        }

        /// `Σ w·a` over each four bytes, `w` signed: `vpmaddubsw(|w|, sign(a, w))`, whose
        /// pairs stay within `2 · 128 · 127 ≤ 32767` (a weight of −128 is the byte 128).
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        #[inline]
        fn dot_q8(w: __m512i, a: __m512i, _corr: __m512i) -> __m512i {
            let neg = _mm512_movepi8_mask(w);
            let sy = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
            dot_u(_mm512_abs_epi8(w), sy)
        }

        /// Unused without VNNI.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        #[inline]
        fn corr_q8(_a: __m512i) -> __m512i {
            _mm512_setzero_si512()
        }

        /// The offset's part `Σ o·a` over each four bytes, for [`dot_corr`].
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        #[inline]
        fn corr_u(o: __m512i, a: __m512i) -> __m512i {
            dot_u(o, a)
        }

        /// `Σ u·a − corr` over each four bytes.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        #[inline]
        fn dot_corr(u: __m512i, a: __m512i, corr: __m512i) -> __m512i {
            _mm512_sub_epi32(dot_u(u, a), corr)
        }

        /// `acc + vpmaddwd(s, p)` (exact `i32` lanes).
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        #[inline]
        fn madd_acc(acc: __m512i, s: __m512i, p: __m512i) -> __m512i {
            _mm512_add_epi32(acc, _mm512_madd_epi16(s, p))
        }

        kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl");
        kq_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl");
    }

    /// With VNNI: `vpdpbusd`.
    mod vnni {
        use super::*;

        /// `Σ u·a` over each four bytes (`u` unsigned, exact in `i32`).
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn dot_u(u: __m512i, a: __m512i) -> __m512i {
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a)
        }

        /// `Σ w·a` over each four bytes, `w` signed: `Σ (w + 128)·a − 128·Σ a`, with
        /// `corr = −128·Σ a` from [`corr_q8`] as the accumulator `vpdpbusd` starts from; every
        /// sum is exact in `i32`.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn dot_q8(w: __m512i, a: __m512i, corr: __m512i) -> __m512i {
            let u = _mm512_xor_si512(w, _mm512_set1_epi8(i8::MIN));
            _mm512_dpbusd_epi32(corr, u, a)
        }

        /// `−128·Σ a` over each four bytes (once per activation block, for every weight row).
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn corr_q8(a: __m512i) -> __m512i {
            corr_u(_mm512_set1_epi8(i8::MIN), a)
        }

        /// The offset's part, negated: `−Σ o·a` over each four bytes, for [`dot_corr`].
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn corr_u(o: __m512i, a: __m512i) -> __m512i {
            _mm512_sub_epi32(_mm512_setzero_si512(), dot_u(o, a))
        }

        /// `Σ u·a − Σ o·a` over each four bytes: one `vpdpbusd` from the negated offset part.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn dot_corr(u: __m512i, a: __m512i, corr: __m512i) -> __m512i {
            _mm512_dpbusd_epi32(corr, u, a)
        }

        /// `acc + vpmaddwd(s, p)` as one `vpdpwssd` (exact `i32` lanes: no product pair of an
        /// `i16` scale and a `vpmaddubsw` sum reaches 2^31). Written as assembly: the compiler
        /// otherwise splits it back into `vpmaddwd` + `vpaddd` for a generic x86-64 target.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        fn madd_acc(mut acc: __m512i, s: __m512i, p: __m512i) -> __m512i {
            // SAFETY: `vpdpwssd` on registers only; the level guarantees AVX-512 VNNI.
            unsafe {
                std::arch::asm!(
                    "vpdpwssd {acc}, {s}, {p}",
                    acc = inout(zmm_reg) acc,
                    s = in(zmm_reg) s,
                    p = in(zmm_reg) p,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
            acc
        }

        kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
        kq_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");

        /// The 32-value formats for weight rows `r0..r0 + R` and activation rows `b0..b0 + N`
        /// on 256-bit vectors: one row's eight lane sums per register, so each block's scale
        /// `dw · da` is one value, broadcast from memory by the FMA, where the 512-bit kernels
        /// ([`b32`]) hold two rows per register and permute a pair of scales into place.
        /// Q4_1 and Q5_1 add the minimum's part `m · s` per block, four activation rows in one
        /// 128-bit FMA chain per weight row.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline(never)]
        pub(super) fn b32y<const F: u8, const R: usize, const N: usize>(
            w: &QMatrix,
            r0: usize,
            a: &Acts<'_>,
            b0: usize,
        ) -> [[f32; 4]; 4] {
            let nb = w.nb;
            assert!(a.nb == nb && b0 + N <= a.n && r0 + R <= w.rows && R <= 4 && N <= 4);
            let has_min = F == Q4_1 || F == Q5_1;
            // `s[k · np4 + b0..][..4]` lies inside `s` (len `nb · np4`) for every block `k`
            assert!(
                !has_min
                    || (b0.is_multiple_of(4)
                        && a.np4.is_multiple_of(4)
                        && b0 < a.np4
                        && a.s.len() == nb * a.np4)
            );
            let wq: [&[Chunk]; R] =
                crate::kernels::array(|i| &w.qs[(r0 + i) * w.qchunks..(r0 + i + 1) * w.qchunks]);
            let wd: [&[u16]; R] =
                crate::kernels::array(|i| &w.d[(r0 + i) * w.nbp..(r0 + i + 1) * w.nbp]);
            let wm: [&[u16]; R] = crate::kernels::array(|i| {
                if has_min {
                    &w.m[(r0 + i) * w.nbp..(r0 + i + 1) * w.nbp]
                } else {
                    &[]
                }
            });
            let aq: [&[Chunk]; N] =
                crate::kernels::array(|i| &a.q[(b0 + i) * nb..(b0 + i + 1) * nb]);
            let ad: [&[f32]; N] =
                crate::kernels::array(|i| &a.d[(b0 + i) * a.nbp..(b0 + i + 1) * a.nbp]);
            let lo4 = _mm256_set1_epi8(0x0F);
            let sixteen = _mm256_set1_epi8(16);
            let flip = _mm256_set1_epi8(i8::MIN);
            let off: i8 = match F {
                Q4_0 => 8,
                Q5_0 => 16,
                Q8_0 => i8::MIN,
                _ => 0,
            };
            let offv = _mm256_set1_epi8(off);
            let mut acc = [[_mm256_setzero_ps(); N]; R];
            let mut summ = [_mm_setzero_ps(); R];
            let mut mm = [[0f32; 8]; R];
            // `dw · da` of eight blocks for every (row, activation row)
            let mut sc = [[[0f32; 8]; N]; R];
            let mut base = 0;
            while base < nb {
                for ri in 0..R {
                    // SAFETY: `base + 8 ≤ nbp`, the length of every `wd`, `wm` (when used) and
                    // `ad` slice (`nbp % 8 == 0`); `sc[ri][bi]` and `mm[ri]` have eight `f32`s.
                    unsafe {
                        if has_min {
                            let m8 =
                                _mm256_cvtph_ps(_mm_loadu_si128(wm[ri].as_ptr().add(base).cast()));
                            _mm256_storeu_ps(mm[ri].as_mut_ptr(), m8);
                        }
                        let dw = _mm256_cvtph_ps(_mm_loadu_si128(wd[ri].as_ptr().add(base).cast()));
                        for bi in 0..N {
                            let da = _mm256_loadu_ps(ad[bi].as_ptr().add(base));
                            _mm256_storeu_ps(sc[ri][bi].as_mut_ptr(), _mm256_mul_ps(dw, da));
                        }
                    }
                }
                let kend = (nb - base).min(8);
                for kk in 0..kend {
                    let k = base + kk;
                    let av: [__m256i; N] = crate::kernels::array(|bi| ld(&aq[bi][k]));
                    // `−off · Σ a` over each four bytes, where each weight sum starts
                    let corr: [__m256i; N] = crate::kernels::array(|bi| {
                        if off == 0 {
                            _mm256_setzero_si256()
                        } else {
                            _mm256_sub_epi32(
                                _mm256_setzero_si256(),
                                _mm256_dpbusd_epi32(_mm256_setzero_si256(), offv, av[bi]),
                            )
                        }
                    });
                    let sh = _mm_cvtsi32_si128(((k & 1) * 4) as i32);
                    for ri in 0..R {
                        let u = if F == Q8_0 {
                            _mm256_xor_si256(ld(&wq[ri][k]), flip)
                        } else {
                            let nib =
                                _mm256_and_si256(_mm256_srl_epi16(ld(&wq[ri][k / 2]), sh), lo4);
                            if F == Q5_0 || F == Q5_1 {
                                _mm256_mask_add_epi8(nib, w.qh[(r0 + ri) * nb + k], nib, sixteen)
                            } else {
                                nib
                            }
                        };
                        for bi in 0..N {
                            let isum = _mm256_dpbusd_epi32(corr[bi], u, av[bi]);
                            acc[ri][bi] = _mm256_fmadd_ps(
                                _mm256_set1_ps(sc[ri][bi][kk]),
                                _mm256_cvtepi32_ps(isum),
                                acc[ri][bi],
                            );
                        }
                    }
                    if has_min {
                        // SAFETY: see the assertion above.
                        let sv = unsafe { _mm_loadu_ps(a.s.as_ptr().add(k * a.np4 + b0)) };
                        for ri in 0..R {
                            summ[ri] = _mm_fmadd_ps(_mm_set1_ps(mm[ri][kk]), sv, summ[ri]);
                        }
                    }
                }
                base += 8;
            }
            let mut res = [[0f32; 4]; 4];
            for ri in 0..R {
                let mut sm = [0f32; 4];
                // SAFETY: `sm` has four `f32`s.
                unsafe { _mm_storeu_ps(sm.as_mut_ptr(), summ[ri]) };
                for bi in 0..N {
                    let h = hsum8(acc[ri][bi]);
                    res[ri][bi] = if has_min { h + sm[bi] } else { h };
                }
            }
            res
        }
    }
}
