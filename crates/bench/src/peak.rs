//! The CPU's int8 multiply-add peak, measured: what a batched decode pass, which reads the
//! weights once for many rows and so becomes compute-bound, is set beside.
//!
//! Every thread runs twelve independent accumulator chains of the widest int8 dot-product
//! instruction the CPU has — `vpdpbusd` on 512-bit registers with AVX-512 VNNI (64
//! multiply-adds each), on 256-bit ones with AVX-VNNI (32), else `vpmaddubsw` on 256-bit ones
//! with AVX2 (32, summed in pairs into `i16`) — on registers only, no memory. The instruction is
//! written in assembly: compilers may split the intrinsic into two instructions for a generic
//! target. The fastest of five passes counts.

use std::time::Instant;

/// Iterations of the twelve-chain block per pass (12 · 64 · 2²² ≈ 3.2 G multiply-adds a thread
/// with AVX-512 VNNI).
const ITERS: u64 = 1 << 22;

/// Passes; the fastest counts.
const PASSES: usize = 5;

/// The instruction measured and its G multiply-adds a second over `threads` threads, or `None`
/// on a CPU without AVX2 (or not x86-64).
pub(crate) fn int8_madd_gmacs(threads: usize) -> Option<(&'static str, f64)> {
    #[cfg(target_arch = "x86_64")]
    {
        let (name, per_iter, run): (&'static str, u64, fn(u64)) =
            if std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512f")
            {
                ("vpdpbusd zmm (AVX-512 VNNI)", 12 * 64, x86::dpbusd_zmm)
            } else if std::arch::is_x86_feature_detected!("avxvnni") {
                ("vpdpbusd ymm (AVX-VNNI)", 12 * 32, x86::dpbusd_ymm)
            } else if std::arch::is_x86_feature_detected!("avx2") {
                ("vpmaddubsw ymm (AVX2)", 12 * 32, x86::maddubs_ymm)
            } else {
                return None;
            };
        let threads = threads.max(1);
        let mut best = f64::INFINITY;
        for _ in 0..PASSES {
            let t = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| run(ITERS));
                }
            });
            best = best.min(t.elapsed().as_secs_f64());
        }
        let macs = (threads as u64 * ITERS * per_iter) as f64;
        Some((name, macs / best / 1e9))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = threads;
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

    /// Twelve chains of `vpdpbusd` on zmm registers, `n` times.
    pub(super) fn dpbusd_zmm(n: u64) {
        if !(std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512f"))
        {
            return;
        }
        // SAFETY: the CPU has AVX-512 F and VNNI (checked above); the block touches registers
        // only (zmm0–zmm13, declared clobbered) and the counter.
        unsafe { dpbusd_zmm_block(n) }
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    fn dpbusd_zmm_block(n: u64) {
        // SAFETY: registers only, each declared clobbered, and the counter.
        unsafe {
            asm!(
                "vpternlogd zmm12, zmm12, zmm12, 0xff",
                "vpabsb zmm13, zmm12",
                "2:",
                "vpdpbusd zmm0, zmm12, zmm13",
                "vpdpbusd zmm1, zmm12, zmm13",
                "vpdpbusd zmm2, zmm12, zmm13",
                "vpdpbusd zmm3, zmm12, zmm13",
                "vpdpbusd zmm4, zmm12, zmm13",
                "vpdpbusd zmm5, zmm12, zmm13",
                "vpdpbusd zmm6, zmm12, zmm13",
                "vpdpbusd zmm7, zmm12, zmm13",
                "vpdpbusd zmm8, zmm12, zmm13",
                "vpdpbusd zmm9, zmm12, zmm13",
                "vpdpbusd zmm10, zmm12, zmm13",
                "vpdpbusd zmm11, zmm12, zmm13",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) n => _,
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _,
                options(nostack, nomem),
            );
        }
    }

    /// Twelve chains of `vpdpbusd` on ymm registers (the VEX form of AVX-VNNI), `n` times.
    pub(super) fn dpbusd_ymm(n: u64) {
        if !std::arch::is_x86_feature_detected!("avxvnni") {
            return;
        }
        // SAFETY: the CPU has AVX-VNNI (checked above); registers only (ymm0–ymm13, declared
        // clobbered) and the counter.
        unsafe { dpbusd_ymm_block(n) }
    }

    #[target_feature(enable = "avx,avxvnni")]
    fn dpbusd_ymm_block(n: u64) {
        // SAFETY: registers only, each declared clobbered, and the counter.
        unsafe {
            asm!(
                "vpcmpeqd ymm12, ymm12, ymm12",
                "vpabsb ymm13, ymm12",
                "2:",
                "{{vex}} vpdpbusd ymm0, ymm12, ymm13",
                "{{vex}} vpdpbusd ymm1, ymm12, ymm13",
                "{{vex}} vpdpbusd ymm2, ymm12, ymm13",
                "{{vex}} vpdpbusd ymm3, ymm12, ymm13",
                "{{vex}} vpdpbusd ymm4, ymm12, ymm13",
                "{{vex}} vpdpbusd ymm5, ymm12, ymm13",
                "{{vex}} vpdpbusd ymm6, ymm12, ymm13",
                "{{vex}} vpdpbusd ymm7, ymm12, ymm13",
                "{{vex}} vpdpbusd ymm8, ymm12, ymm13",
                "{{vex}} vpdpbusd ymm9, ymm12, ymm13",
                "{{vex}} vpdpbusd ymm10, ymm12, ymm13",
                "{{vex}} vpdpbusd ymm11, ymm12, ymm13",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) n => _,
                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
                out("ymm12") _, out("ymm13") _,
                options(nostack, nomem),
            );
        }
    }

    /// Twelve independent `vpmaddubsw` on ymm registers, `n` times (each result is written
    /// fresh, so the chains never wait on one another).
    pub(super) fn maddubs_ymm(n: u64) {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        // SAFETY: the CPU has AVX2 (checked above); registers only (ymm0–ymm13, declared
        // clobbered) and the counter.
        unsafe { maddubs_ymm_block(n) }
    }

    #[target_feature(enable = "avx,avx2")]
    fn maddubs_ymm_block(n: u64) {
        // SAFETY: registers only, each declared clobbered, and the counter.
        unsafe {
            asm!(
                "vpcmpeqd ymm12, ymm12, ymm12",
                "vpabsb ymm13, ymm12",
                "2:",
                "vpmaddubsw ymm0, ymm12, ymm13",
                "vpmaddubsw ymm1, ymm12, ymm13",
                "vpmaddubsw ymm2, ymm12, ymm13",
                "vpmaddubsw ymm3, ymm12, ymm13",
                "vpmaddubsw ymm4, ymm12, ymm13",
                "vpmaddubsw ymm5, ymm12, ymm13",
                "vpmaddubsw ymm6, ymm12, ymm13",
                "vpmaddubsw ymm7, ymm12, ymm13",
                "vpmaddubsw ymm8, ymm12, ymm13",
                "vpmaddubsw ymm9, ymm12, ymm13",
                "vpmaddubsw ymm10, ymm12, ymm13",
                "vpmaddubsw ymm11, ymm12, ymm13",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) n => _,
                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
                out("ymm12") _, out("ymm13") _,
                options(nostack, nomem),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_peak_is_measured_where_the_cpu_has_an_int8_instruction() {
        match super::int8_madd_gmacs(1) {
            Some((name, g)) => {
                assert!(g.is_finite() && g > 0.0, "{name}: {g}");
                eprintln!("int8 multiply-add peak on one thread: {g:.0} G/s ({name})");
            }
            None => eprintln!("SKIPPED: no AVX2 on this CPU: the int8 peak is not measured"),
        }
    }
}
