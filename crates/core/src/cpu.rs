//! The one CPU-feature switch of the workspace: which instruction-set level every run-time
//! dispatched kernel uses — the sampler's slice kernels here in `nextok-core` and the model's
//! matrix and attention kernels in `nextok-model`.
//!
//! * [`Level`] — the levels, lowest first ([`Level::ALL`]), what this CPU supports
//!   ([`Level::detected`], [`Level::supported`]) and the level in use now ([`Level::current`]);
//! * [`set_max_level`] — one process-wide cap on [`Level::current`] (for benchmarks: every level
//!   gives the same bits, only the speed differs); [`with_max_level`] sets it for the length of a
//!   call, serialised against other such calls (for tests).
//!
//! Each consumer keeps its own use of the levels: the model's kernels have code for all four;
//! the sampler's kernels have none that needs VNNI, so they run their AVX-512 code at
//! [`Level::Avx512Vnni`].
//!
//! The CPU is asked once per process; the current level is one relaxed atomic load, so the
//! kernels may read it on every call.
//!
//! This module is a leaf: it uses nothing else from the crate.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// An instruction-set level of the run-time dispatched kernels. Every level gives the same bits;
/// each one includes everything the lower ones need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Portable scalar code (the reference), for the compilation target.
    Scalar,
    /// AVX2 + FMA + F16C (with BMI1 and POPCNT), x86-64.
    Avx2,
    /// AVX-512 F/BW/DQ/VL on top of [`Level::Avx2`]: the model kernels take the 32-value and
    /// K-quant formats two weight rows (or two sub-blocks) per register, and the others as
    /// [`Level::Avx2`].
    Avx512,
    /// [`Level::Avx512`] with AVX-512 VNNI: the model kernels take the integer lane sums of the
    /// 32-value formats by `vpdpbusd`.
    Avx512Vnni,
}

/// [`Level::detected`] as `level as u8 + 1`; 0 until the CPU has been asked.
static DETECTED: AtomicU8 = AtomicU8::new(0);
/// The cap of [`set_max_level`], as `level as u8` (`u8::MAX`: none).
static CAP: AtomicU8 = AtomicU8::new(u8::MAX);
/// [`Level::current`] as `level as u8 + 1`; 0 until computed (and again after
/// [`with_max_level`]).
static CURRENT: AtomicU8 = AtomicU8::new(0);
/// Held by [`with_max_level`] while the cap is changed.
static CAP_LOCK: Mutex<()> = Mutex::new(());

impl Level {
    /// Every level, lowest first.
    pub const ALL: [Level; 4] = [Level::Scalar, Level::Avx2, Level::Avx512, Level::Avx512Vnni];

    /// The level stored as `code` (`level as u8`); codes above the highest give the highest.
    #[inline]
    fn from_code(code: u8) -> Level {
        match code {
            0 => Level::Scalar,
            1 => Level::Avx2,
            2 => Level::Avx512,
            _ => Level::Avx512Vnni,
        }
    }

    /// The best level this CPU supports, whatever the cap (the CPU is asked once per process).
    #[inline]
    pub fn detected() -> Level {
        match DETECTED.load(Ordering::Relaxed) {
            0 => {
                let l = ask_cpu();
                DETECTED.store(l as u8 + 1, Ordering::Relaxed);
                l
            }
            c => Level::from_code(c - 1),
        }
    }

    /// Whether this CPU can run the level.
    #[inline]
    pub fn supported(self) -> bool {
        self <= Level::detected()
    }

    /// The level the kernels use now: the best one this CPU supports, at most the cap of
    /// [`set_max_level`]. One atomic load once known.
    #[inline]
    pub fn current() -> Level {
        match CURRENT.load(Ordering::Relaxed) {
            0 => {
                let l = Level::from_code(CAP.load(Ordering::Relaxed)).effective();
                // a cap set meanwhile has stored its own level: keep that one
                let _ =
                    CURRENT.compare_exchange(0, l as u8 + 1, Ordering::Relaxed, Ordering::Relaxed);
                l
            }
            c => Level::from_code(c - 1),
        }
    }

    /// `self`, or the best lower level this CPU can run: what a kernel asked to run at `self`
    /// runs.
    #[inline]
    pub fn effective(self) -> Level {
        self.min(Level::detected())
    }

    /// The level's name: `scalar`, `avx2`, `avx512`, `avx512-vnni`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
            Level::Avx512Vnni => "avx512-vnni",
        }
    }

    /// The level named `name` (see [`Level::name`]).
    pub fn from_name(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.name() == name)
    }
}

/// Whether this CPU runs 512-bit vector operations as two 256-bit halves (AMD Zen 4: family
/// 19h with AVX-512), so that a kernel gains nothing from 512-bit registers and may lose to
/// the shuffles they need. Asked once per process.
pub fn splits_512_bit_ops() -> bool {
    static SPLITS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SPLITS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::__cpuid;
            // leaves 0 and 1 exist on every x86-64 CPU
            let (v, f) = (__cpuid(0), __cpuid(1));
            let amd = (v.ebx, v.edx, v.ecx) == (0x6874_7541, 0x6974_6E65, 0x444D_4163);
            let family = ((f.eax >> 8) & 0xF) + ((f.eax >> 20) & 0xFF);
            amd && family == 0x19
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// The best level this CPU has every feature of.
fn ask_cpu() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c") && has!("bmi1") && has!("popcnt");
        let avx512 =
            avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl");
        if avx512 && has!("avx512vnni") {
            return Level::Avx512Vnni;
        }
        if avx512 {
            return Level::Avx512;
        }
        if avx2 {
            return Level::Avx2;
        }
    }
    Level::Scalar
}

/// Makes [`Level::current`] at most `level` from now on, process-wide (for benchmarks: results
/// do not change, only the speed). Tests that compare the levels pass a level explicitly
/// instead, or use [`with_max_level`].
pub fn set_max_level(level: Level) {
    CAP.store(level as u8, Ordering::Relaxed);
    CURRENT.store(level.effective() as u8 + 1, Ordering::Relaxed);
}

/// Runs `f` with the process-wide cap at `level`, then restores the previous cap (also when `f`
/// panics). Callers are serialised (one lock for the process), so two of them never change the
/// cap under each other; code that reads the level without this lock may still see either
/// value, which only changes its speed.
pub fn with_max_level<R>(level: Level, f: impl FnOnce() -> R) -> R {
    struct Restore(u8);
    impl Drop for Restore {
        fn drop(&mut self) {
            CAP.store(self.0, Ordering::Relaxed);
            CURRENT.store(0, Ordering::Relaxed);
        }
    }
    let _lock = CAP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let _restore = Restore(CAP.load(Ordering::Relaxed));
    set_max_level(level);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_order() {
        let names: Vec<&str> = Level::ALL.iter().map(|l| l.name()).collect();
        assert_eq!(names, ["scalar", "avx2", "avx512", "avx512-vnni"]);
        for l in Level::ALL {
            assert_eq!(Level::from_name(l.name()), Some(l));
            assert_eq!(Level::from_code(l as u8), l);
        }
        assert_eq!(Level::from_name("baseline"), None);
        assert!(Level::ALL.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn levels_never_exceed_the_cpu() {
        assert!(Level::Scalar.supported());
        for l in Level::ALL {
            assert_eq!(l.supported(), l <= Level::detected());
            assert!(l.effective() <= l && l.effective().supported());
        }
        assert!(Level::current().supported());
        for l in Level::ALL {
            with_max_level(l, || assert_eq!(Level::current(), l.effective()));
        }
    }
}
