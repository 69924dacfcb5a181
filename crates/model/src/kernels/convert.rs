//! `f16` conversions of whole slices at the kernels' level: F16C eight values at a time when the
//! level has it, `half`'s scalar code otherwise. Both are exact from `f16` and round to nearest
//! even into `f16` (the same bits). Built for the x86-64 baseline, `half`'s scalar conversions
//! run in software, and its slice conversions ask the CPU on every call; these take the level
//! the caller already holds.

use half::f16;

use super::Level;

/// `dst[i] = src[i]` as `f32` (exact). `dst.len() == src.len()`.
pub fn f16_to_f32(level: Level, src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if level.effective() >= Level::Avx2 {
        // SAFETY: `effective` checked that the CPU has AVX2, FMA and F16C.
        unsafe { x86::f16_to_f32(src, dst) };
        return;
    }
    let _ = level;
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// `dst[i] = src[i]` rounded to `f16` (to nearest, ties to even). `dst.len() == src.len()`.
pub fn f32_to_f16(level: Level, src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if level.effective() >= Level::Avx2 {
        // SAFETY: as above.
        unsafe { x86::f32_to_f16(src, dst) };
        return;
    }
    let _ = level;
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(*s);
    }
}

/// Every value rounded to `f16` and back, in place.
pub fn f16_round(level: Level, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if level.effective() >= Level::Avx2 {
        // SAFETY: as above.
        unsafe { x86::f16_round(x) };
        return;
    }
    let _ = level;
    for v in x {
        *v = f16::from_f32(*v).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// Round to nearest even (`_mm256_cvtps_ph`'s rounding argument).
    const RNE: i32 = _MM_FROUND_TO_NEAREST_INT;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
        let n = src.len() / 8 * 8;
        for i in (0..n).step_by(8) {
            // SAFETY: `i + 8 ≤ n ≤ len` of both slices.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
        }
        for i in n..src.len() {
            dst[i] = src[i].to_f32();
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
        let n = src.len() / 8 * 8;
        for i in (0..n).step_by(8) {
            // SAFETY: `i + 8 ≤ n ≤ len` of both slices.
            unsafe {
                let h = _mm256_cvtps_ph::<RNE>(_mm256_loadu_ps(src.as_ptr().add(i)));
                _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
            }
        }
        for i in n..src.len() {
            dst[i] = f16::from_f32(src[i]);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f16_round(x: &mut [f32]) {
        let n = x.len() / 8 * 8;
        for i in (0..n).step_by(8) {
            // SAFETY: `i + 8 ≤ n ≤ len`.
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let h = _mm256_cvtps_ph::<RNE>(_mm256_loadu_ps(p));
                _mm256_storeu_ps(p, _mm256_cvtph_ps(h));
            }
        }
        for v in &mut x[n..] {
            *v = f16::from_f32(*v).to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every level gives `half`'s bits on values that round every way: halfway cases, the
    /// subnormal range, overflow to infinity, NaN, signed zeros; lengths with tails.
    #[test]
    fn every_level_converts_as_half_does() {
        let mut xs: Vec<f32> = vec![0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 1e9, -1e9];
        xs.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            6.0e-8,
            3.0e-8,
            1.0e-8,
        ]);
        // every f16 and the points halfway between neighbours
        for b in 0..=u16::MAX {
            let h = f16::from_bits(b);
            if h.is_finite() {
                let x = h.to_f32();
                xs.push(x);
                let next = f16::from_bits(b.wrapping_add(1));
                if next.is_finite() && (b & 0x7fff) != 0x7bff {
                    xs.push((x + next.to_f32()) / 2.0);
                }
            }
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for len in [xs.len(), 7, 8, 9, 15, 17] {
            let src = &xs[..len];
            let want16: Vec<f16> = src.iter().map(|&x| f16::from_f32(x)).collect();
            let want32: Vec<f32> = want16.iter().map(|h| h.to_f32()).collect();
            for level in Level::ALL.into_iter().filter(|l| l.supported()) {
                let mut h = vec![f16::ZERO; len];
                f32_to_f16(level, src, &mut h);
                assert_eq!(
                    h.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want16.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{level:?}"
                );
                let mut back = vec![0f32; len];
                f16_to_f32(level, &h, &mut back);
                assert_eq!(bits(&back), bits(&want32), "{level:?}");
                let mut r = src.to_vec();
                f16_round(level, &mut r);
                assert_eq!(bits(&r), bits(&want32), "{level:?}");
            }
        }
    }
}
