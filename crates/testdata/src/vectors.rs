//! One runner for the shared test vectors in `testdata/vectors/`, used by the core library's,
//! the CLI's and the server's tests.
//!
//! Each `*.json` file there holds `cases`, each a one-step request and what must come out (see
//! the directory's README). [`run`] (or [`run_async`]) loads every file, calls the check on every
//! case and then:
//!
//! * reports **every** failing case — a check's [`Outcome::Fail`], or a panic inside it (a
//!   failed `assert!`) with its message — and fails the test after the last case;
//! * lists the skipped cases ([`Outcome::Skip`]) with their reasons; they do not count toward
//!   [`Minimum::cases_run`];
//! * when the vector files are missing, fails the test when [`in_ci`](crate::in_ci), and
//!   otherwise reports the test as skipped on the terminal (past the test harness's output
//!   capture) — never a silent pass.

use std::fmt::Write as _;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use serde_json::Value;

/// The shared vectors' directory.
pub fn dir() -> PathBuf {
    crate::repo_root().join("testdata/vectors")
}

/// One case of a vector file.
#[derive(Debug, Clone)]
pub struct Case {
    /// The file's name (`failures.json`).
    pub file: String,
    /// The case's `name`.
    pub name: String,
    /// The whole case (`name`, `request`, `expect`, …).
    pub case: Value,
}

impl Case {
    /// The request (the input of `nextok explain`).
    pub fn request(&self) -> &Value {
        &self.case["request"]
    }

    /// What must come out.
    pub fn expect(&self) -> &Value {
        &self.case["expect"]
    }

    /// Whether the request declares a constraint (which needs a constraint engine).
    pub fn is_constrained(&self) -> bool {
        !self.request()["params"]["constraint"].is_null()
    }

    /// `file / name`, for messages.
    pub fn ctx(&self) -> String {
        format!("{} / {}", self.file, self.name)
    }
}

/// What a check made of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every expectation held.
    Pass,
    /// The case is not run here, for this reason (it does not count as run).
    Skip(String),
    /// An expectation failed, as this says.
    Fail(String),
}

/// At least how much a run must cover, or the test fails.
#[derive(Debug, Clone, Copy)]
pub struct Minimum {
    /// Vector files found.
    pub files: usize,
    /// Cases run (passed or failed; skipped cases do not count).
    pub cases_run: usize,
}

/// What a run covered (returned when no case failed and the minimum was met).
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Vector files found.
    pub files: usize,
    /// Cases that passed.
    pub passed: usize,
    /// Skipped cases (`file / name`) with their reasons.
    pub skipped: Vec<(String, String)>,
}

/// The numeric maps an `expect` may hold (token → value), as named in the explain output's
/// token rows.
pub const NUMERIC_KEYS: [&str; 5] = [
    "selection_prob",
    "initial_prob",
    "processed_logit",
    "raw_logprob",
    "processed_logprob",
];

/// The id a token reference of `expect` names: an id, or a name from the request's `tokens`
/// (an id written as a string when the request has none).
///
/// # Panics
///
/// When the reference names no token.
pub fn id_of(request: &Value, v: &Value) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().expect("id"),
        Value::String(s) => match request["tokens"].as_array() {
            Some(t) => t
                .iter()
                .position(|x| x == s)
                .unwrap_or_else(|| panic!("no token named {s}")) as u64,
            None => s.parse().expect("numeric id"),
        },
        other => panic!("bad token ref {other}"),
    }
}

/// `x` rounded half away from zero to `d` places.
pub fn round(x: f64, d: u32) -> f64 {
    let s = 10f64.powi(d as i32);
    (x * s).round() / s
}

/// A JSON number, or `"-inf"`.
///
/// # Panics
///
/// On anything else.
pub fn num(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().expect("f64"),
        Value::String(s) if s == "-inf" => f64::NEG_INFINITY,
        other => panic!("not a number: {other}"),
    }
}

/// Checks an explain output as JSON (`nextok explain --json`, `/v1/explain`) against the case's
/// `selected`, `support` and numeric maps (to `decimals` places, 3 by default).
///
/// # Panics
///
/// On the first expectation that fails (the runner records it as the case's failure).
pub fn check_explain_json(case: &Case, out: &Value) {
    let ctx = case.ctx();
    let (req, exp) = (case.request(), case.expect());
    if let Some(sel) = exp.get("selected") {
        assert_eq!(out["selected"].as_u64().unwrap(), id_of(req, sel), "{ctx}");
    }
    if let Some(sup) = exp.get("support") {
        let mut want: Vec<u64> = sup
            .as_array()
            .unwrap()
            .iter()
            .map(|v| id_of(req, v))
            .collect();
        want.sort_unstable();
        let got: Vec<u64> = out["support"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(got, want, "{ctx}: support");
    }
    let d = exp.get("decimals").and_then(Value::as_u64).unwrap_or(3) as u32;
    for key in NUMERIC_KEYS {
        if let Some(map) = exp.get(key).and_then(Value::as_object) {
            for (tok, want) in map {
                let id = id_of(req, &Value::String(tok.clone())) as usize;
                let got = num(&out["tokens"][id][key]);
                assert_eq!(
                    round(got, d),
                    round(want.as_f64().unwrap(), d),
                    "{ctx}: {key}[{tok}]"
                );
            }
        }
    }
}

/// Loads every case of every vector file in `dir`, in file-name order; `None` when there are
/// none (a notice, or a panic in CI).
///
/// # Panics
///
/// When a file cannot be read or parsed, or lacks a `cases` array; when no vector file is
/// found and [`in_ci`](crate::in_ci).
pub fn load(dir: &Path) -> Option<(usize, Vec<Case>)> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
        Err(_) => Vec::new(),
    };
    files.retain(|p| p.extension().is_some_and(|x| x == "json"));
    files.sort();
    if files.is_empty() {
        let what = format!("no test vectors in {}", dir.display());
        if crate::in_ci() {
            panic!("{what} (CI is set)");
        }
        crate::notice(&format!("SKIPPED: {what}"));
        return None;
    }
    let mut cases = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let doc: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let file = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(list) = doc["cases"].as_array() else {
            panic!("{}: no `cases` array", f.display());
        };
        for case in list {
            cases.push(Case {
                file: file.clone(),
                name: case["name"].as_str().unwrap_or("?").to_string(),
                case: case.clone(),
            });
        }
    }
    Some((files.len(), cases))
}

/// Runs `check` on every shared vector case; see the [module](self) for what it reports.
/// `None` when the vectors are missing outside CI (reported as skipped).
///
/// # Panics
///
/// After the last case when any case failed (listing them all), or when fewer than `min` files
/// were found or cases run; when the vectors are missing and [`in_ci`](crate::in_ci).
pub fn run(min: Minimum, mut check: impl FnMut(&Case) -> Outcome) -> Option<Report> {
    let (files, cases) = load(&dir())?;
    let mut tally = Tally::default();
    for case in &cases {
        let outcome = catch_unwind(AssertUnwindSafe(|| check(case)));
        tally.record(case, outcome);
    }
    Some(tally.finish(files, min))
}

/// [`run`] with an asynchronous check (a server driven in process).
///
/// # Panics
///
/// As [`run`].
pub async fn run_async<F, Fut>(min: Minimum, mut check: F) -> Option<Report>
where
    F: FnMut(Case) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let (files, cases) = load(&dir())?;
    let mut tally = Tally::default();
    for case in &cases {
        let outcome = CatchUnwind(Box::pin(check(case.clone()))).await;
        tally.record(case, outcome);
    }
    Some(tally.finish(files, min))
}

/// A future whose panics become `Err` (as [`catch_unwind`] for a closure).
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let fut = self.0.as_mut();
        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(o)) => Poll::Ready(Ok(o)),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

#[derive(Default)]
struct Tally {
    passed: usize,
    failed: Vec<(String, String)>,
    skipped: Vec<(String, String)>,
}

impl Tally {
    fn record(&mut self, case: &Case, outcome: std::thread::Result<Outcome>) {
        match outcome {
            Ok(Outcome::Pass) => self.passed += 1,
            Ok(Outcome::Skip(why)) => self.skipped.push((case.ctx(), why)),
            Ok(Outcome::Fail(why)) => self.failed.push((case.ctx(), why)),
            Err(payload) => {
                let why = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panicked".to_string());
                self.failed.push((case.ctx(), why));
            }
        }
    }

    fn finish(self, files: usize, min: Minimum) -> Report {
        let run = self.passed + self.failed.len();
        if !self.skipped.is_empty() {
            let mut s = format!("{} shared vector case(s) skipped:", self.skipped.len());
            for (ctx, why) in &self.skipped {
                let _ = write!(s, "\n  {ctx}: {why}");
            }
            crate::notice(&s);
        }
        let mut problems = String::new();
        if !self.failed.is_empty() {
            let _ = write!(
                problems,
                "{} of {run} shared vector cases failed:",
                self.failed.len()
            );
            for (ctx, why) in &self.failed {
                let _ = write!(problems, "\n  {ctx}: {}", why.replace('\n', "\n    "));
            }
        }
        if files < min.files {
            let _ = write!(
                problems,
                "\nonly {files} vector files (at least {} expected)",
                min.files
            );
        }
        if run < min.cases_run {
            let _ = write!(
                problems,
                "\nonly {run} cases ran ({} skipped; at least {} must run)",
                self.skipped.len(),
                min.cases_run
            );
        }
        if !problems.is_empty() {
            panic!("{}", problems.trim_start());
        }
        Report {
            files,
            passed: self.passed,
            skipped: self.skipped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(name: &str) -> Case {
        Case {
            file: "f.json".into(),
            name: name.into(),
            case: Value::Null,
        }
    }

    const MIN: Minimum = Minimum {
        files: 1,
        cases_run: 2,
    };

    #[test]
    fn every_failure_is_reported_not_just_the_first() {
        let mut t = Tally::default();
        t.record(&case("a"), Ok(Outcome::Fail("first".into())));
        t.record(&case("b"), Ok(Outcome::Pass));
        let p = catch_unwind(|| -> Outcome { panic!("second {}", 2) });
        t.record(&case("c"), p);
        let p = catch_unwind(|| -> Outcome { panic!("third") });
        t.record(&case("d"), p);
        let e = catch_unwind(AssertUnwindSafe(|| t.finish(1, MIN))).unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(
            msg.starts_with("3 of 4 shared vector cases failed"),
            "{msg}"
        );
        for want in [
            "f.json / a: first",
            "f.json / c: second 2",
            "f.json / d: third",
        ] {
            assert!(msg.contains(want), "{want} not in {msg}");
        }
    }

    #[test]
    fn skipped_cases_do_not_count_toward_the_minimum() {
        let mut t = Tally::default();
        t.record(&case("a"), Ok(Outcome::Pass));
        t.record(&case("b"), Ok(Outcome::Skip("needs x".into())));
        t.record(&case("c"), Ok(Outcome::Skip("needs y".into())));
        let e = catch_unwind(AssertUnwindSafe(|| t.finish(1, MIN))).unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(msg.contains("only 1 cases ran (2 skipped"), "{msg}");

        let mut t = Tally::default();
        t.record(&case("a"), Ok(Outcome::Pass));
        t.record(&case("b"), Ok(Outcome::Pass));
        t.record(&case("c"), Ok(Outcome::Skip("needs y".into())));
        let r = t.finish(1, MIN);
        assert_eq!(r.passed, 2);
        assert_eq!(
            r.skipped,
            vec![("f.json / c".to_string(), "needs y".to_string())]
        );
    }

    #[test]
    fn too_few_files_fail() {
        let mut t = Tally::default();
        t.record(&case("a"), Ok(Outcome::Pass));
        t.record(&case("b"), Ok(Outcome::Pass));
        let m = Minimum {
            files: 5,
            cases_run: 2,
        };
        assert!(catch_unwind(AssertUnwindSafe(|| t.finish(4, m))).is_err());
    }

    #[test]
    fn the_shared_vectors_load() {
        let (files, cases) = load(&dir()).expect("testdata/vectors is in the repository");
        assert!(files >= 5, "{files} files");
        assert!(cases.len() >= 40, "{} cases", cases.len());
        assert!(cases.iter().all(|c| c.request().is_object()));
    }

    #[test]
    fn an_empty_directory_is_missing_data() {
        let d = std::env::temp_dir().join(format!("nextok-vectors-empty-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let r = catch_unwind(|| load(&d));
        let _ = std::fs::remove_dir(&d);
        if crate::in_ci() {
            assert!(r.is_err(), "missing vectors must fail in CI");
        } else {
            assert!(r.unwrap().is_none());
        }
    }
}
