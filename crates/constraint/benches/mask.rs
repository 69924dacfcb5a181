//! Mask speed: per-token mask time through nextok's wrapper and through llguidance directly,
//! in the same process, on the same schemas and token sequences.
//!
//! * criterion benchmarks: one mask step for `choice`, a small regex (nextok's own engines vs
//!   llguidance on the same constraint) and a JSON schema (wrapper vs llguidance);
//! * `NEXTOK_MASK_SUMMARY=1` prints a summary table (mean, p50, p99, max per-token mask time and
//!   time to first mask) over the maskbench subset beside the repository (`../shared/
//!   maskbench-dev`), feeding each valid instance token by token. Needs the Llama-3 tokenizer
//!   from `scripts/fetch-testdata.sh`. It also compares `property_order: any` with schema order
//!   and llguidance directly on the schemas where `any` lowers objects.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use nextok_constraint::{
    CompiledConstraint, ConstraintEngine, ConstraintSpec, ConstraintVocab, JsonOptions, Limits,
    LlguidanceBaseline, PropertyOrder, SequenceState,
};
use nextok_core::constraint::{bitset_words, ConstraintState};
use nextok_vocab::encode::Encoder;
use nextok_vocab::{LoadOptions, Vocabulary};

fn root() -> PathBuf {
    nextok_testdata::repo_root()
}

fn load() -> Option<(Arc<ConstraintEngine>, Encoder)> {
    let p = nextok_testdata::optional(nextok_testdata::LLAMA3)?;
    let v = Vocabulary::from_tokenizer_json_file(&p, &LoadOptions::default()).ok()?;
    let cv = ConstraintVocab::new(&v.bytes, &v.info).ok()?;
    let e = ConstraintEngine::new(Arc::new(cv)).ok()?;
    Some((Arc::new(e), Encoder::from_tokenizer_json_file(&p).ok()?))
}

/// A direct llguidance matcher for `spec` (the baseline).
fn direct(engine: &ConstraintEngine, spec: &ConstraintSpec) -> Option<LlguidanceBaseline> {
    engine.llguidance_baseline(spec).ok()
}

/// `spec` compiled and its first mask computed, with the time both took.
fn first_mask(
    engine: &ConstraintEngine,
    spec: &ConstraintSpec,
) -> Option<(Arc<CompiledConstraint>, Duration)> {
    let t0 = Instant::now();
    let c = engine.compile(spec).ok()?;
    let mut mask = vec![0u64; bitset_words(engine.vocab().vocab_size())];
    c.start().fill_mask(&mut mask).ok()?;
    Some((c, t0.elapsed()))
}

/// Per-token mask times for the wrapper and for llguidance, interleaved token by token.
fn time_sequence(
    engine: &ConstraintEngine,
    spec: &ConstraintSpec,
    ids: &[u32],
    wrap: &mut Vec<Duration>,
    base: &mut Vec<Duration>,
    first: &mut (Vec<Duration>, Vec<Duration>),
) -> bool {
    let Some((c, t)) = first_mask(engine, spec) else {
        return false;
    };
    first.0.push(t);
    let mut mask = vec![0u64; bitset_words(engine.vocab().vocab_size())];
    let t1 = Instant::now();
    let Some(mut m0) = direct(engine, spec) else {
        return false;
    };
    if m0.compute_mask().is_err() {
        return false;
    }
    first.1.push(t1.elapsed());
    // Both run from a prototype whose first mask was computed (clones share lexer caches).
    let mut s = c.start();
    let mut m = m0.clone();
    step_all(&mut s, &mut m, ids, &mut mask, wrap, base)
}

/// Feeds `ids` to both, timing each mask; the order of the two alternates token by token so
/// that neither always runs with the other's data in the CPU caches.
fn step_all(
    s: &mut SequenceState,
    m: &mut LlguidanceBaseline,
    ids: &[u32],
    mask: &mut [u64],
    wrap: &mut Vec<Duration>,
    base: &mut Vec<Duration>,
) -> bool {
    for (i, &t) in ids.iter().enumerate() {
        mask.fill(0);
        let (ok, ok2);
        if i % 2 == 0 {
            let a = Instant::now();
            ok = s.fill_mask(mask).is_ok();
            wrap.push(a.elapsed());
            let b = Instant::now();
            ok2 = m.compute_mask().is_ok();
            base.push(b.elapsed());
        } else {
            let b = Instant::now();
            ok2 = m.compute_mask().is_ok();
            base.push(b.elapsed());
            let a = Instant::now();
            ok = s.fill_mask(mask).is_ok();
            wrap.push(a.elapsed());
        }
        if !ok || !ok2 || s.commit(t).is_err() || m.consume(t).is_err() {
            return false;
        }
    }
    true
}

fn stats(v: &mut [Duration]) -> String {
    if v.is_empty() {
        return "| – | – | – | – |".into();
    }
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mean = v.iter().map(|&d| us(d)).sum::<f64>() / v.len() as f64;
    let p = |q: f64| us(v[((v.len() - 1) as f64 * q).round() as usize]);
    format!(
        "| {mean:.1} | {:.1} | {:.1} | {:.1} |",
        p(0.5),
        p(0.99),
        us(v[v.len() - 1])
    )
}

fn summary(engine: &ConstraintEngine, enc: &Encoder) {
    let dir = root().join("../shared/maskbench-dev");
    if !dir.exists() {
        eprintln!("notice: {} absent; no summary", dir.display());
        return;
    }
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    paths.sort();
    let (mut w, mut b, mut f) = (Vec::new(), Vec::new(), (Vec::new(), Vec::new()));
    let mut schemas = 0;
    for p in &paths {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&std::fs::read(p).unwrap()) else {
            continue;
        };
        let spec = ConstraintSpec::JsonSchema {
            schema: v["schema"].clone(),
            options: JsonOptions::default(),
        };
        let Some(t) = v["tests"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["valid"] == true))
        else {
            continue;
        };
        let ids = enc
            .encode(&serde_json::to_string(&t["data"]).unwrap(), false)
            .unwrap();
        let (mut w1, mut b1, mut f1) = (Vec::new(), Vec::new(), (Vec::new(), Vec::new()));
        if time_sequence(engine, &spec, &ids, &mut w1, &mut b1, &mut f1) {
            schemas += 1;
            w.extend(w1);
            b.extend(b1);
            f.0.extend(f1.0);
            f.1.extend(f1.1);
        }
    }
    println!(
        "maskbench-dev: {schemas} schemas, {} tokens (Llama-3 tokenizer)",
        w.len()
    );
    println!("| path | mean µs | p50 µs | p99 µs | max µs |");
    println!("|---|---|---|---|---|");
    println!("| nextok wrapper, per-token mask {}", stats(&mut w));
    println!("| llguidance direct, per-token mask {}", stats(&mut b));
    println!(
        "| nextok wrapper, time to first mask (compile + mask) {}",
        stats(&mut f.0)
    );
    println!(
        "| llguidance direct, time to first mask {}",
        stats(&mut f.1)
    );
    any_order_summary(engine, enc, &paths);
    // Small constraints: nextok's own engines against llguidance on the same constraint.
    let small = [
        ConstraintSpec::Choice {
            choices: vec![r#"{"ok":true}"#.into(), r#"{"ok":false}"#.into()],
        },
        ConstraintSpec::Choice {
            choices: ["red", "green", "blue", "yellow", "cyan", "magenta"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        },
        ConstraintSpec::Regex {
            pattern: r"[0-9]{4}-[0-9]{2}-[0-9]{2}".into(),
        },
        ConstraintSpec::Regex {
            pattern: r"(yes|no|maybe)".into(),
        },
        ConstraintSpec::Regex {
            pattern: r"[a-z]+@[a-z]+\.(com|org)".into(),
        },
    ];
    let texts = [
        r#"{"ok":false}"#,
        "magenta",
        "2024-11-30",
        "maybe",
        "ada@example.org",
    ];
    println!();
    println!("Small constraints, compiled once, 50 sequences:");
    println!();
    println!("| constraint | engine | mean µs | p50 µs | p99 µs | max µs | first mask µs |");
    println!("|---|---|---|---|---|---|---|");
    for (spec, text) in small.iter().zip(texts) {
        let ids = enc.encode(text, false).unwrap();
        // Compiled once (both sides), then 50 sequences, as a server reuses a constraint.
        let (mut w, mut b) = (Vec::new(), Vec::new());
        let mut mask = vec![0u64; bitset_words(engine.vocab().vocab_size())];
        let (c, first_own) = first_mask(engine, spec).unwrap();
        let t1 = Instant::now();
        let mut m0 = direct(engine, spec).unwrap();
        m0.compute_mask().unwrap();
        let first_llg = t1.elapsed();
        for _ in 0..50 {
            let mut s = c.start();
            let mut m = m0.clone();
            assert!(step_all(&mut s, &mut m, &ids, &mut mask, &mut w, &mut b));
        }
        let label = serde_json::to_string(spec).unwrap();
        let label: String = label.chars().take(60).collect();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "| `{label}` | nextok {} {:.0} |",
            stats(&mut w),
            us(first_own)
        );
        println!(
            "| `{label}` | llguidance {} {:.0} |",
            stats(&mut b),
            us(first_llg)
        );
    }
}

/// Per-token mask of `spec` alone along `ids` (compiled once; the first mask timed with it).
fn time_alone(
    engine: &ConstraintEngine,
    spec: &ConstraintSpec,
    ids: &[u32],
    out: &mut Vec<Duration>,
    first: &mut Vec<Duration>,
) -> bool {
    let Some((c, t)) = first_mask(engine, spec) else {
        return false;
    };
    first.push(t);
    let mut mask = vec![0u64; bitset_words(engine.vocab().vocab_size())];
    let mut s = c.start();
    for &t in ids {
        mask.fill(0);
        let a = Instant::now();
        let ok = s.fill_mask(&mut mask).is_ok();
        out.push(a.elapsed());
        if !ok || s.commit(t).is_err() {
            return false;
        }
    }
    true
}

/// `property_order: any` against schema order and llguidance directly, on the schemas where
/// `any` lowered at least one object, each valid instance written in schema order (which both
/// orders accept) and in reverse key order (which only `any` accepts).
fn any_order_summary(engine: &ConstraintEngine, enc: &Encoder, paths: &[PathBuf]) {
    let (mut ordered, mut any, mut base, mut reversed) = (vec![], vec![], vec![], vec![]);
    let (mut f_ordered, mut f_any, mut f_base) = (vec![], vec![], vec![]);
    let mut schemas = 0;
    let mut objects = 0;
    for p in paths {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&std::fs::read(p).unwrap()) else {
            continue;
        };
        let spec = |order| ConstraintSpec::JsonSchema {
            schema: v["schema"].clone(),
            options: JsonOptions {
                property_order: Some(order),
                ..Default::default()
            },
        };
        let (so, sa) = (spec(PropertyOrder::Schema), spec(PropertyOrder::Any));
        let Ok(c) = engine.compile(&sa) else {
            continue;
        };
        let report = c.schema_report().expect("json_schema");
        if report.objects_any_order == 0 {
            continue;
        }
        let Some(t) = v["tests"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["valid"] == true))
        else {
            continue;
        };
        let text = serde_json::to_string(&t["data"]).unwrap();
        let ids = enc.encode(&text, false).unwrap();
        let rev = enc.encode(&reverse_keys(&t["data"]), false).unwrap();
        let (mut o1, mut a1, mut b1, mut r1) = (vec![], vec![], vec![], vec![]);
        let (mut fo, mut fa, mut fb) = (vec![], vec![], vec![]);
        let mut scratch = (vec![], vec![]);
        let ok = time_alone(engine, &so, &ids, &mut o1, &mut fo)
            && time_alone(engine, &sa, &ids, &mut a1, &mut fa)
            && time_sequence(engine, &so, &ids, &mut vec![], &mut b1, &mut scratch)
            && time_alone(engine, &sa, &rev, &mut r1, &mut vec![]);
        if !ok {
            continue;
        }
        fb.extend(scratch.1);
        schemas += 1;
        objects += report.objects_any_order;
        ordered.extend(o1);
        any.extend(a1);
        base.extend(b1);
        reversed.extend(r1);
        f_ordered.extend(fo);
        f_any.extend(fa);
        f_base.extend(fb);
    }
    println!();
    println!(
        "Property order (strict mode): {schemas} schemas where `any` lowered objects ({objects} \
         objects), {} tokens in schema order, {} in reverse key order:",
        any.len(),
        reversed.len()
    );
    println!();
    println!("| path | mean µs | p50 µs | p99 µs | max µs |");
    println!("|---|---|---|---|---|");
    println!("| `schema` order, per-token mask {}", stats(&mut ordered));
    println!("| `any` order, per-token mask {}", stats(&mut any));
    println!(
        "| `any` order, reverse key order, per-token mask {}",
        stats(&mut reversed)
    );
    println!(
        "| llguidance direct (schema order), per-token mask {}",
        stats(&mut base)
    );
    println!(
        "| `schema` order, time to first mask {}",
        stats(&mut f_ordered)
    );
    println!("| `any` order, time to first mask {}", stats(&mut f_any));
    println!(
        "| llguidance direct, time to first mask {}",
        stats(&mut f_base)
    );
}

/// `v` as compact JSON with every object's keys in reverse order.
fn reverse_keys(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Object(m) => {
            let parts: Vec<String> = m
                .iter()
                .rev()
                .map(|(k, x)| {
                    format!(
                        "{}:{}",
                        serde_json::Value::String(k.clone()),
                        reverse_keys(x)
                    )
                })
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        serde_json::Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(reverse_keys).collect();
            format!("[{}]", parts.join(","))
        }
        _ => v.to_string(),
    }
}

fn benches(c: &mut Criterion) {
    let Some((engine, enc)) = load() else {
        return;
    };
    if std::env::var_os("NEXTOK_MASK_SUMMARY").is_some() {
        summary(&engine, &enc);
    }
    let n = engine.vocab().vocab_size();
    let cases = [
        (
            "choice_ok",
            ConstraintSpec::Choice {
                choices: vec![r#"{"ok":true}"#.into(), r#"{"ok":false}"#.into()],
            },
        ),
        (
            "regex_date",
            ConstraintSpec::Regex {
                pattern: r"[0-9]{4}-[0-9]{2}-[0-9]{2}".into(),
            },
        ),
        (
            "json_schema_object",
            ConstraintSpec::JsonSchema {
                schema: serde_json::json!({"type": "object",
                    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                    "required": ["name", "age"]}),
                options: JsonOptions::default(),
            },
        ),
    ];
    let mut g = c.benchmark_group("mask_first_step");
    for (name, spec) in &cases {
        let compiled = engine.compile(spec).unwrap();
        let mut mask = vec![0u64; bitset_words(n)];
        g.bench_function(format!("{name}/nextok"), |bch| {
            let mut s = compiled.start();
            bch.iter(|| {
                mask.fill(0);
                s.fill_mask(&mut mask).unwrap();
            })
        });
        if let Some(mut m) = direct(&engine, spec) {
            g.bench_function(format!("{name}/llguidance"), |bch| {
                bch.iter(|| m.compute_mask().unwrap())
            });
        }
    }
    g.finish();
    let _ = Limits::default();
}

criterion_group!(mask, benches);

fn main() {
    mask();
    Criterion::default().configure_from_args().final_summary();
}
