//! AVX-512 kernels (F/BW/VL, and VNNI where the CPU has it), x86-64, selected at run time.
//!
//! Every kernel computes exactly the operations of [`super::scalar`] for its format (the order
//! is spelled out in the [module docs](super)); only the exact integer parts are computed
//! differently:
//!
//! * **Q5_K**: one register holds two 32-value groups of one super-block (`vpmaddubsw`, then
//!   `vpmaddwd` by the groups' scales); the two halves are added at the end of the
//!   super-block, which leaves every lane sum exact. With VNNI, tiles of several activation
//!   rows fuse the scale multiply and the add (`vpdpwssd`); the float part of a (row,
//!   activation) pair is one register (see `kq5`).
//! * **F16, BF16, F32** and the tile shapes the K-quant kernels lack run the AVX2 code.
//!
//! (The other formats run in bands of sixteen rows: `band` and the format modules.)
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

    use super::super::avx2k::{kq5_result, ld};
    use super::super::{Acts, Chunk, MatFormat, QMatrix};
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
        vnni::dot_tile(w, r0, nr, a, b0, n)
    }

    /// `lo` in every 16-bit lane of the low 256 bits, `hi` in every lane of the high 256.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    #[inline]
    fn halves16(lo: i16, hi: i16) -> __m512i {
        _mm512_inserti64x4::<1>(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi))
    }

    /// The tile dispatch, compiled once per instruction set (`$feat`).
    macro_rules! kernels {
        ($feat:tt) => {
            /// See [`super::dot_tile`]. Q5_K runs as tiles of 1×n, 2×n and 4×1; everything
            /// else on the AVX2 code (the same bits).
            #[target_feature(enable = $feat)]
            pub(super) fn dot_tile(
                w: &QMatrix,
                r0: usize,
                nr: usize,
                a: &Acts<'_>,
                b0: usize,
                n: usize,
            ) -> [[f32; 4]; 4] {
                if w.format == MatFormat::Q5_K {
                    if let Some(res) = kq::dot_tile(w, r0, nr, a, b0, n) {
                        return res;
                    }
                }
                // the AVX2 tiles (the same bits)
                crate::kernels::avx2k::dot_tile(w, r0, nr, a, b0, n)
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
                        MatFormat::Q5_K => kq_shapes!(nr, n, w, r0, a, b0, kq5),
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

                /// Q5_K × Q8_K for weight rows `r0..r0 + R` and activation rows `b0..b0 + N`
                /// (Q4_K is kept in bands: [`super::super::q4k`]): groups `2j` (low half) and
                /// `2j + 1` (high half) of a super-block in one register. Bounds as in the AVX2 kernel: `vpmaddubsw` pairs
                /// below `2 · 31 · 127`, every lane below `8 · 63 · 4 · 31 · 127 < 2^24`.
                ///
                /// The float part of each (row, activation) pair lives in one register: lanes 0–7 are
                /// `acc`, lane 8 `summs`, and one fused multiply-add
                /// per super-block updates them all, each lane computing exactly the operation the
                /// [module docs](super::super) name for it (`−(d_a · dmin_w)` is `d_a · (−dmin_w)`).
                /// The per-row and per-activation parts of that step are computed once per super-block.
                #[target_feature(enable = $feat)]
                #[inline(never)]
                fn kq5<const R: usize, const N: usize>(
                    w: &QMatrix,
                    r0: usize,
                    a: &Acts<'_>,
                    b0: usize,
                ) -> [[f32; 4]; 4] {
                    let nb = w.nb;
                    assert!(a.knb == nb && b0 + N <= a.n && r0 + R <= w.rows);
                    assert!(w.qs.len() >= w.rows * w.qchunks && w.qchunks >= 5 * nb);
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
                    // Lanes 0–7 take `d_w`, lane 8 `−dmin_w`, the others zero.
                    let didx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
                    let dmask: __mmask16 = 0x01FF;
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
                            let h = _mm512_broadcast_i64x4(ld(unsafe { &*qs[ri].add(5 * k + 4) }));
                            hb[ri] = _mm512_srlv_epi16(h, hsh);
                        }
                        for j in 0..4 {
                            // Scale `2j` in the low half, `2j + 1` in the high half.
                            let sidx = _mm512_add_epi16(hsh, _mm512_set1_epi16(2 * j as i16));
                            let mut wv = [_mm512_setzero_si512(); R];
                            let mut sv = [_mm512_setzero_si512(); R];
                            for ri in 0..R {
                                let c =
                                    _mm512_broadcast_i64x4(ld(unsafe { &*qs[ri].add(5 * k + j) }));
                                wv[ri] = _mm512_and_si512(_mm512_srlv_epi16(c, nsh), mask);
                                let h = _mm512_and_si512(hb[ri], one);
                                wv[ri] = _mm512_or_si512(wv[ri], _mm512_slli_epi16::<4>(h));
                                hb[ri] = _mm512_srli_epi16::<2>(hb[ri]);
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
                                let s = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
                                let prod = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
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
                            res[ri][bi] = kq5_result(lo, _mm_cvtss_f32(hi));
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
    }
}
