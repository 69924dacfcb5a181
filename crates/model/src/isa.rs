//! Element-wise code compiled for the instruction set the kernels run at.
//!
//! The crate is built for the x86-64 baseline, so that one binary or wheel starts on every
//! x86-64 CPU, and its matrix and attention kernels choose AVX2, AVX-512 or VNNI code when the
//! process runs ([`crate::kernels::Level`]). The forward pass's other loops (norms, rotary
//! embedding, activations, residual adds, `f16` rounding) are plain Rust: built for the baseline
//! they would run on SSE2, call a software fused multiply-add for every `mul_add` and convert
//! `f16` in software. [`with_isa!`] runs such a loop from a copy of it compiled with AVX2, FMA
//! and F16C enabled when the level allows, and from the baseline copy otherwise.
//!
//! Both copies compute the same bits: Rust never reassociates or contracts floating-point
//! operations, `mul_add` is one rounding in hardware and in software, and `f16` conversions are
//! exact or round to nearest even either way. What the features change is only which
//! instructions do it (wider vectors, `vfmadd`, `vcvtps2ph`).

/// Evaluates `$body` (an expression, typically a call of an `#[inline(always)]` function) from a
/// copy compiled with AVX2, FMA and F16C when `$level` (a [`crate::kernels::Level`]) is at least
/// AVX2 on this CPU, and as written otherwise. The same bits either way (see the module docs).
///
/// The body sits in a closure that has this one call site, inside a function with those target
/// features: the closure is inlined into it, and the functions it calls must be
/// `#[inline(always)]` (or small enough to be inlined) for their code to get the features too.
macro_rules! with_isa {
    ($level:expr, $body:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if $level.effective() >= $crate::kernels::Level::Avx2 {
                #[target_feature(enable = "avx2,fma,f16c")]
                #[inline]
                unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
                    f()
                }
                // SAFETY: `effective` checked that this CPU has AVX2, FMA and F16C.
                unsafe { run(|| $body) }
            } else {
                $body
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = $level;
            $body
        }
    }};
}
