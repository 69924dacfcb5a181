//! A team of threads for one forward pass: the pool's other threads wait spinning between the
//! pass's parallel steps instead of going to sleep.
//!
//! A decode step of a small model is a few hundred short parallel steps (each matrix, each
//! layer's attention), a few to a few hundred microseconds each, with a little serial work in
//! between (norms, rotary embeddings, quantising the activations). Run as rayon jobs, the idle
//! thread yields and falls asleep between them, and a step pays for waking it (a futex wake and
//! a context switch, or the tail of a yield), as llama.cpp's thread pool avoids by spinning on
//! an atomic between the operations of a graph.
//!
//! [`with_team`] runs a pass on the calling thread and lends it the rest of the current rayon
//! pool: one helper job per other thread, spawned in a rayon scope, which spins on a shared word
//! until the pass ends. [`for_each`] inside the pass publishes a job there; the caller and the
//! helpers claim its tasks one at a time (so a helper that is late, or busy with other rayon work
//! such as computing a grammar mask beside the pass, only means the caller runs more tasks
//! itself) and the caller waits for the last one. Which thread runs a task never changes what
//! it computes, so results are the same bits with any number of threads.
//!
//! Outside a pass [`for_each`] uses rayon, and inside a task it runs serially: a thread that
//! owns a team never blocks in rayon, so it can never pick up (and spin in) its own helper job.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Tasks in one job at most (the claim word holds the count and the next index in 16 bits each).
const MAX_TASKS: usize = u16::MAX as usize;

/// Spins between yields while a helper waits for work (a yield lets another thread of the
/// process run if the machine is oversubscribed).
const SPINS_PER_YIELD: u32 = 1 << 14;

/// One published job: the tasks' function and how many of them have finished.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    done: AtomicUsize,
}

/// What the caller and its helpers share during one pass.
struct Shared {
    /// `generation << 32 | tasks << 16 | next task`; a new generation publishes a new job.
    claim: AtomicU64,
    /// The current generation's job (valid while any of its tasks is unfinished).
    job: AtomicPtr<Job<'static>>,
    /// Set when the pass ends: the helpers return.
    stop: AtomicBool,
    /// A helper's task panicked: its payload, for the caller to resume.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    panicked: AtomicBool,
    /// The last generation published (only the caller writes it).
    generation: AtomicU64,
}

fn pack(generation: u64, tasks: usize, next: usize) -> u64 {
    (generation << 32) | ((tasks as u64) << 16) | next as u64
}

fn unpack(c: u64) -> (u64, usize, usize) {
    (
        c >> 32,
        ((c >> 16) & 0xffff) as usize,
        (c & 0xffff) as usize,
    )
}

impl Shared {
    /// Claims the next task of the job `c` shows, if it has one left; returns the job (valid
    /// until the claimed task is marked done) and the task, or the claim word as it now is.
    /// The job pointer is dereferenced only after a successful claim: a job outlives its
    /// unfinished tasks.
    fn claim(&self, c: u64) -> Result<Option<(&Job<'static>, usize)>, u64> {
        let (_, tasks, next) = unpack(c);
        if next >= tasks {
            return Ok(None);
        }
        // read before the claim: if the claim succeeds, this generation was current at the
        // claim, so the pointer read after seeing it is this generation's job
        let job = self.job.load(Ordering::Acquire);
        match self
            .claim
            .compare_exchange_weak(c, c + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            // SAFETY: the claimed task is unfinished, so its job is alive (see `for_each`)
            Ok(_) => Ok(Some((unsafe { &*job }, next))),
            Err(now) => Err(now),
        }
    }

    /// Runs a claimed task, catching a panic (a helper must always mark its task done, or the
    /// caller would wait for ever).
    fn run(&self, job: &Job<'_>, task: usize) {
        if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| (job.f)(task))) {
            if let Ok(mut slot) = self.panic.lock() {
                slot.get_or_insert(p);
            }
            self.panicked.store(true, Ordering::Release);
        }
        job.done.fetch_add(1, Ordering::Release);
    }

    /// A helper: claims tasks until the pass ends.
    fn help(&self) {
        let mut seen = u64::MAX;
        let mut spins = 0u32;
        loop {
            let c = self.claim.load(Ordering::Acquire);
            if c == seen {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                spins += 1;
                if spins == SPINS_PER_YIELD {
                    spins = 0;
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            match self.claim(c) {
                Ok(Some((job, task))) => self.run(job, task),
                Ok(None) => seen = c,
                Err(_) => {}
            }
        }
    }
}

/// What [`for_each`] does on this thread.
#[derive(Clone, Copy)]
enum Mode {
    /// No pass: rayon.
    Rayon,
    /// A pass owns a team (the pointer is valid while the mode is set).
    Team(*const Shared),
    /// Inside a task: serial.
    Serial,
}

thread_local! {
    static MODE: Cell<Mode> = const { Cell::new(Mode::Rayon) };
}

/// Sets the mode for a scope and restores the previous one on exit (also on unwinding).
struct ModeGuard(Mode);

impl ModeGuard {
    fn set(mode: Mode) -> Self {
        ModeGuard(MODE.with(|m| m.replace(mode)))
    }
}

impl Drop for ModeGuard {
    fn drop(&mut self) {
        MODE.with(|m| m.set(self.0));
    }
}

/// Runs `body` on this thread with the other threads of the current rayon pool as its team
/// (see the module's docs). With one thread, or nested in another team's pass, it just runs
/// `body`.
pub(crate) fn with_team<R: Send>(body: impl FnOnce() -> R + Send) -> R {
    let threads = rayon::current_num_threads();
    if threads <= 1 || !matches!(MODE.with(Cell::get), Mode::Rayon) {
        return body();
    }
    let shared = Shared {
        claim: AtomicU64::new(pack(0, 0, 0)),
        job: AtomicPtr::new(std::ptr::null_mut()),
        stop: AtomicBool::new(false),
        panic: Mutex::new(None),
        panicked: AtomicBool::new(false),
        generation: AtomicU64::new(0),
    };
    let shared = &shared;
    rayon::scope(|s| {
        for _ in 1..threads {
            s.spawn(move |_| shared.help());
        }
        // stop the helpers however `body` ends
        struct Stop<'a>(&'a Shared);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.stop.store(true, Ordering::Release);
            }
        }
        let _stop = Stop(shared);
        let _mode = ModeGuard::set(Mode::Team(shared));
        body()
    })
}

/// The threads [`for_each`] can use here: the current rayon pool's, or one inside a task.
pub(crate) fn threads() -> usize {
    match MODE.with(Cell::get) {
        Mode::Serial => 1,
        _ => rayon::current_num_threads(),
    }
}

/// Runs `f(0), …, f(tasks − 1)`, in parallel when it can (see the module's docs); returns when
/// all have run. Each task must write only what no other task touches.
pub(crate) fn for_each(tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    match MODE.with(Cell::get) {
        _ if tasks <= 1 => (0..tasks).for_each(f),
        Mode::Serial => (0..tasks).for_each(f),
        Mode::Rayon => {
            use rayon::prelude::*;
            (0..tasks).into_par_iter().for_each(f);
        }
        Mode::Team(shared) => {
            // SAFETY: the mode holds the team's pointer only inside `with_team`'s scope
            let shared = unsafe { &*shared };
            let _serial = ModeGuard::set(Mode::Serial);
            for start in (0..tasks).step_by(MAX_TASKS) {
                let n = (tasks - start).min(MAX_TASKS);
                let shifted = move |t: usize| f(start + t);
                run_job(shared, n, &shifted);
            }
        }
    }
}

/// Values one task of row-wise work takes at least: below it the hand-off costs more than the
/// work (a decode step's norms and activations stay on the calling thread).
const ROW_TASK_MIN_VALUES: usize = 4 * 1024;

/// What [`for_rows2`] runs on each run of rows: `f(first_row, a_run, b_run)`.
pub(crate) type RowsFn<'a, A, B> = dyn Fn(usize, &mut [A], &mut [B]) + Sync + 'a;

#[cfg(test)]
thread_local! {
    /// Calls of [`for_rows2`] on this thread that split their rows among tasks (for tests).
    pub(crate) static ROW_SPLITS: Cell<u64> = const { Cell::new(0) };
}

/// Row-wise work in parallel: `a` and `b` hold the same number of rows (`a_row` and `b_row`
/// elements wide; `b` may be empty with `b_row` 0), cut into runs of whole rows, one run per
/// task, each run at least [`ROW_TASK_MIN_VALUES`] values of work when a row is `row_work`
/// values; `f(first_row, a_run, b_run)` must depend only on its own rows, so the result is the
/// same bits however the rows are split. Small batches, and calls outside a team's pass, run as
/// one call on this thread.
pub(crate) fn for_rows2<A: Send, B: Send>(
    a: &mut [A],
    a_row: usize,
    b: &mut [B],
    b_row: usize,
    row_work: usize,
    f: &RowsFn<'_, A, B>,
) {
    let rows = a.len().checked_div(a_row).unwrap_or(0);
    debug_assert!(a.len() == rows * a_row && b.len() == rows * b_row);
    let values = rows.saturating_mul(row_work);
    // Only a team's pass splits row-wise work: on rayon, a thread waiting for its share could
    // pick up another job that needs a lock its caller holds (an activation conversion).
    let threads = match MODE.with(Cell::get) {
        Mode::Team(_) => rayon::current_num_threads(),
        _ => 1,
    };
    let tasks = (threads * 2)
        .min(values / ROW_TASK_MIN_VALUES)
        .min(rows)
        .max(1);
    if tasks == 1 {
        f(0, a, b);
        return;
    }
    #[cfg(test)]
    ROW_SPLITS.with(|c| c.set(c.get() + 1));
    let (pa, pb) = (SharedMut::new(a), SharedMut::new(b));
    let (pa, pb) = (&pa, &pb);
    for_each(tasks, &|t| {
        let (r0, r1) = (rows * t / tasks, rows * (t + 1) / tasks);
        // SAFETY: the runs `r0..r1` of different tasks are disjoint and lie inside `a` and `b`
        // (`r1 ≤ rows`), which this call borrows mutably.
        let (ra, rb) = unsafe {
            (
                pa.slice(r0 * a_row, (r1 - r0) * a_row),
                pb.slice(r0 * b_row, (r1 - r0) * b_row),
            )
        };
        f(r0, ra, rb);
    });
}

/// A mutable slice shared by the tasks of one parallel step, each of which takes parts of it
/// that no other task touches.
pub(crate) struct SharedMut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: tasks reach the slice only through `slice`, whose contract keeps their parts disjoint;
// the slice's owner is borrowed mutably for as long as this lives.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// Shares `s` (borrowed mutably for the life of the result's uses).
    pub(crate) fn new(s: &mut [T]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    /// `s[start..start + len]`.
    ///
    /// # Safety
    /// The slice shared must still be borrowed by the caller, and no two live results may
    /// overlap.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "a part outside the slice"
        );
        // SAFETY: in bounds (checked above); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// [`for_rows2`] over one slice, a row's work being its `a_row` values.
pub(crate) fn for_rows<A: Send>(a: &mut [A], a_row: usize, f: &(dyn Fn(usize, &mut [A]) + Sync)) {
    for_rows2::<A, u8>(a, a_row, &mut [], 0, a_row, &|r0, ra, _| f(r0, ra));
}

/// Publishes a job of `n ≤ MAX_TASKS` tasks, claims tasks beside the helpers, and waits for
/// the last one.
fn run_job(shared: &Shared, n: usize, f: &(dyn Fn(usize) + Sync)) {
    // a new generation for every job: a helper's claim read before it can never succeed
    let generation = shared.generation.load(Ordering::Relaxed) + 1;
    shared.generation.store(generation, Ordering::Relaxed);
    let job = Job {
        f,
        done: AtomicUsize::new(0),
    };
    // SAFETY (of the lifetime extension): helpers dereference the pointer only after claiming
    // one of its tasks, and this function returns only after every task is done.
    shared.job.store(
        &job as *const Job<'_> as *mut Job<'static>,
        Ordering::Release,
    );
    let mut c = pack(generation, n, 0);
    shared.claim.store(c, Ordering::Release);
    loop {
        match shared.claim(c) {
            Ok(Some((job, task))) => {
                // (a panic is caught: the helpers may still be running this job's tasks)
                shared.run(job, task);
                c = shared.claim.load(Ordering::Acquire);
            }
            Ok(None) => break,
            Err(now) => c = now,
        }
    }
    while job.done.load(Ordering::Acquire) < n {
        std::hint::spin_loop();
    }
    shared.job.store(std::ptr::null_mut(), Ordering::Relaxed);
    if shared.panicked.load(Ordering::Acquire) {
        let payload = shared.panic.lock().ok().and_then(|mut p| p.take());
        shared.panicked.store(false, Ordering::Relaxed);
        if let Some(p) = payload {
            panic::resume_unwind(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a pool")
    }

    #[test]
    fn every_task_runs_once_with_any_team_size() {
        for threads in [1, 2, 3, 4] {
            pool(threads).install(|| {
                with_team(|| {
                    for tasks in [0, 1, 2, 3, 7, 64, 1000] {
                        let hits: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
                        for _ in 0..50 {
                            for_each(tasks, &|t| {
                                hits[t].fetch_add(1, Ordering::Relaxed);
                            });
                        }
                        assert!(
                            hits.iter().all(|h| h.load(Ordering::Relaxed) == 50),
                            "{threads} threads, {tasks} tasks"
                        );
                    }
                })
            });
        }
    }

    #[test]
    fn jobs_larger_than_the_claim_word_are_split() {
        pool(2).install(|| {
            with_team(|| {
                let n = MAX_TASKS * 2 + 5;
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                for_each(n, &|t| {
                    hits[t].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            })
        });
    }

    #[test]
    fn a_nested_call_runs_serially_and_a_panic_reaches_the_caller() {
        pool(2).install(|| {
            let total = AtomicU32::new(0);
            with_team(|| {
                for_each(4, &|_| {
                    for_each(3, &|_| {
                        total.fetch_add(1, Ordering::Relaxed);
                    });
                });
            });
            assert_eq!(total.load(Ordering::Relaxed), 12);
            let r = panic::catch_unwind(AssertUnwindSafe(|| {
                with_team(|| {
                    for_each(64, &|t| {
                        if t == 63 {
                            panic!("task 63");
                        }
                    })
                })
            }));
            assert!(r.is_err());
            // the pool is usable afterwards, and a new pass works
            let n = AtomicU32::new(0);
            with_team(|| {
                for_each(10, &|_| {
                    n.fetch_add(1, Ordering::Relaxed);
                })
            });
            assert_eq!(n.load(Ordering::Relaxed), 10);
        });
    }
}
