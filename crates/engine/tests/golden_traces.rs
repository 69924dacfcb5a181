//! Golden traces: the requests of `testdata/golden/traces/requests.json` (the default model and
//! every family's tiny model: plain, constrained, penalties, `n > 1`, Q8_0 re-quantised, a
//! `q8_0` KV cache, speculative), recorded on the CPUs the team has worked on
//! (`testdata/golden/traces/<cpu>/<name>.jsonl`, each carrying its raw logits), replayed here
//! bit for bit at every kernel level and register width this CPU has, and their sampler
//! replayed alone on the stored logits.
//!
//! A change of bits fails this test until it is declared: the part of the numerics identifier
//! it touches bumped (`nextok_model::numerics`, `nextok_core::numerics`), the traces
//! re-recorded (`scripts/record-golden.sh`, which runs this file with `NEXTOK_RECORD_GOLDEN=1`)
//! and a line added to the numerics history of `docs/semantics.md`. The ledger
//! (`testdata/golden/traces/numerics.json`) keeps, for every numerics identifier, the
//! fingerprint of each request's steps: a recording whose bits differ under an identifier the
//! ledger already knows is refused, so re-recording cannot hide an undeclared change.
//!
//! Traces recorded under older numerics (on a CPU no one has re-recorded on since) are kept:
//! their sampler is still replayed on their stored logits, and the test names them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nextok_core::cpu::{with_max_level, Level};
use nextok_core::SamplingParams;
use nextok_engine::speculative::SpecOptions;
use nextok_engine::trace::{self, TraceHeader};
use nextok_engine::{Engine, EngineConfig, GenerateRequest, Prompt};
use nextok_model::chat::Message;
use nextok_model::kernels::{set_register_width, RegisterWidth};
use nextok_model::{KvCacheType, Model, Requant};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Candidates each golden record keeps.
const CANDIDATES: usize = 8;

/// One golden request with the hash of its definition (the ledger keeps it beside the
/// fingerprint, so a request whose definition changed is recorded anew).
#[derive(Debug, Clone)]
struct Golden {
    spec: Spec,
    hash: String,
}

/// One golden request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    name: String,
    /// `default`, or a file of `testdata/tiny-quant/`.
    model: String,
    #[serde(default)]
    requant: Option<String>,
    #[serde(default)]
    kv_cache: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    prompt_repeat: Option<usize>,
    #[serde(default)]
    prompt_ids: Option<Vec<u32>>,
    #[serde(default)]
    chat: bool,
    #[serde(default)]
    n: Option<usize>,
    params: SamplingParams,
    #[serde(default)]
    speculative: Option<SpecOptions>,
    #[serde(default = "yes")]
    trace_logits: bool,
}

fn yes() -> bool {
    true
}

fn golden_dir() -> PathBuf {
    nextok_testdata::repo_root().join("testdata/golden/traces")
}

fn requests() -> Vec<Golden> {
    let text = std::fs::read_to_string(golden_dir().join("requests.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["requests"]
        .as_array()
        .expect("requests.json: `requests`")
        .iter()
        .map(|r| Golden {
            spec: serde_json::from_value(r.clone())
                .unwrap_or_else(|e| panic!("requests.json: {e}: {r}")),
            hash: sha256(r.to_string().as_bytes())[..16].to_string(),
        })
        .collect()
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The ledger: numerics identifier → request name → `<definition hash>:<fingerprint>`.
type Ledger = BTreeMap<String, BTreeMap<String, String>>;

fn ledger_path() -> PathBuf {
    golden_dir().join("numerics.json")
}

fn read_ledger() -> Ledger {
    let text = std::fs::read_to_string(ledger_path()).unwrap_or_else(|_| "{}".into());
    let v: Value = serde_json::from_str(&text).expect("numerics.json is JSON");
    serde_json::from_value(v.get("ledger").cloned().unwrap_or(Value::Null)).unwrap_or_default()
}

fn write_ledger(l: &Ledger) {
    let v = serde_json::json!({
        "about": "For each numerics identifier, each golden request's `<hash of its definition in requests.json>:<fingerprint>` (the SHA-256 of its trace's step lines without their stored raw logits). Written by scripts/record-golden.sh, which refuses a recording of the same request whose steps differ under an identifier listed here: a change of bits needs a new identifier.",
        "ledger": l,
    });
    std::fs::write(
        ledger_path(),
        serde_json::to_string_pretty(&v).unwrap() + "\n",
    )
    .unwrap();
}

/// The fingerprint of a trace's step lines: what every step decided, without the stored
/// logits (their digest is in each line).
fn fingerprint(lines: &[Value]) -> String {
    let mut text = String::new();
    for l in lines {
        let mut l = l.clone();
        if let Value::Object(m) = &mut l {
            m.remove("raw_logits");
        }
        text.push_str(&l.to_string());
        text.push('\n');
    }
    sha256(text.as_bytes())
}

/// This CPU's kind as the golden directories are named: `intel-family6-model207`.
fn cpu_name() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        let v = __cpuid(0);
        let mut vendor = Vec::new();
        for r in [v.ebx, v.edx, v.ecx] {
            vendor.extend_from_slice(&r.to_le_bytes());
        }
        let vendor = match vendor.as_slice() {
            b"GenuineIntel" => "intel".to_string(),
            b"AuthenticAMD" => "amd".to_string(),
            other => String::from_utf8_lossy(other).to_ascii_lowercase(),
        };
        let f = __cpuid(1).eax;
        let base = (f >> 8) & 0xF;
        let family = if base == 0xF {
            base + ((f >> 20) & 0xFF)
        } else {
            base
        };
        let mut model = (f >> 4) & 0xF;
        if base == 0x6 || base == 0xF {
            model |= ((f >> 16) & 0xF) << 4;
        }
        format!("{vendor}-family{family}-model{model}")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

/// The model file of a request, or `None` (after a notice) when the default model is absent
/// outside CI.
fn model_file(spec_model: &str) -> Option<PathBuf> {
    if spec_model == "default" {
        nextok_testdata::require(nextok_testdata::SMOLLM2)
    } else {
        let p = nextok_testdata::repo_root()
            .join("testdata/tiny-quant")
            .join(spec_model);
        assert!(p.is_file(), "{}: no such tiny model", p.display());
        Some(p)
    }
}

/// Loaded models and their engines, by (file, requant, kv cache).
#[derive(Default)]
struct Engines {
    models: BTreeMap<(PathBuf, &'static str), Arc<Model>>,
    engines: BTreeMap<(PathBuf, &'static str, &'static str), Arc<Engine>>,
}

impl Engines {
    fn get(&mut self, file: &Path, requant: Requant, kv: KvCacheType) -> Arc<Engine> {
        let m = self
            .models
            .entry((file.to_path_buf(), requant.name()))
            .or_insert_with(|| Arc::new(Model::load(file, requant).expect("model loads")))
            .clone();
        self.engines
            .entry((file.to_path_buf(), requant.name(), kv.name()))
            .or_insert_with(|| {
                Arc::new(
                    Engine::new(
                        m,
                        EngineConfig {
                            kv_cache_type: kv,
                            ..EngineConfig::default()
                        },
                    )
                    .expect("engine"),
                )
            })
            .clone()
    }
}

fn requant_of(s: &Option<String>) -> Requant {
    match s.as_deref() {
        None | Some("keep") => Requant::Keep,
        Some("q8_0") => Requant::Q8_0,
        Some(o) => panic!("requant `{o}`"),
    }
}

fn kv_of(s: &Option<String>) -> KvCacheType {
    s.as_deref()
        .map_or(KvCacheType::F16, |n| KvCacheType::from_name(n).expect("kv"))
}

fn request(spec: &Spec) -> GenerateRequest {
    let prompt = match (&spec.prompt_ids, &spec.prompt) {
        (Some(ids), _) => Prompt::Ids(ids.clone()),
        (None, Some(p)) if spec.chat => Prompt::Chat(vec![Message::new("user", p.clone())]),
        (None, Some(p)) => Prompt::Text(p.repeat(spec.prompt_repeat.unwrap_or(1))),
        (None, None) => panic!("{}: no prompt", spec.name),
    };
    let mut r = GenerateRequest::new(prompt);
    r.params = spec.params.clone();
    r.n = spec.n.unwrap_or(1);
    r.records = Some(CANDIDATES);
    r.trace_logits = spec.trace_logits;
    r.speculative = spec.speculative;
    r
}

/// Records every golden request on this machine (`NEXTOK_RECORD_GOLDEN=1`, through
/// `scripts/record-golden.sh`).
fn record_all() {
    let dir = golden_dir().join(cpu_name());
    std::fs::create_dir_all(&dir).unwrap();
    let mut ledger = read_ledger();
    let mut engines = Engines::default();
    for Golden { spec, hash } in requests() {
        let file = model_file(&spec.model).expect("the default model (scripts/fetch-testdata.sh)");
        let engine = engines.get(&file, requant_of(&spec.requant), kv_of(&spec.kv_cache));
        let c = engine
            .generate(request(&spec))
            .expect("golden request runs");
        let header = TraceHeader::new(&c.info, engine.model(), "reference", CANDIDATES)
            .with_raw_logits(spec.trace_logits);
        let text = trace::text(&header, c.sequences.iter().map(|s| s.records.as_slice()));
        let (_, lines) = trace::parse(&text).unwrap();
        let fp = format!("{hash}:{}", fingerprint(&lines));
        let id = header.numerics.clone().unwrap();
        let entry = ledger.entry(id.clone()).or_default();
        match entry.get(&spec.name) {
            // the same definition, other steps, the same numerics: refused
            Some(old) if old.starts_with(&format!("{hash}:")) && *old != fp => panic!(
                "{}: its steps differ from those recorded before under numerics `{id}`: the bits moved without the identifier; bump the part that changed (nextok_model::numerics / nextok_core::numerics) and add a line to the numerics history in docs/semantics.md",
                spec.name
            ),
            _ => {
                entry.insert(spec.name.clone(), fp);
            }
        }
        std::fs::write(dir.join(format!("{}.jsonl", spec.name)), text).unwrap();
        nextok_testdata::notice(&format!(
            "recorded {} ({} steps) into {}",
            spec.name,
            lines.len(),
            dir.display()
        ));
    }
    write_ledger(&ledger);
}

/// The level / width pairs this CPU runs: every supported level, the AVX-512 ones at both
/// register widths.
fn kernel_settings() -> Vec<(Level, RegisterWidth)> {
    let mut out = Vec::new();
    for l in Level::ALL {
        if !l.supported() {
            nextok_testdata::notice(&format!(
                "golden traces: this CPU lacks the {} kernel level: not replayed at it here",
                l.name()
            ));
            continue;
        }
        if l >= Level::Avx512 {
            out.push((l, RegisterWidth::Bits256));
            out.push((l, RegisterWidth::Bits512));
        } else {
            out.push((l, RegisterWidth::Auto));
        }
    }
    out
}

#[test]
fn golden_traces_replay_at_every_level_and_their_sampler_alone() {
    if std::env::var_os("NEXTOK_RECORD_GOLDEN").is_some() {
        record_all();
    }
    let specs: BTreeMap<String, Golden> = requests()
        .into_iter()
        .map(|g| (g.spec.name.clone(), g))
        .collect();
    let ledger = read_ledger();
    let settings = kernel_settings();
    let this_cpu = cpu_name();
    let mut engines = Engines::default();
    // request name → whether some trace of it replayed under this build's numerics
    let mut current: BTreeMap<String, bool> = specs.keys().map(|k| (k.clone(), false)).collect();
    let mut skipped_default = false;
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no golden traces recorded");
    let mut full = 0usize;
    let mut stale = Vec::new();
    // wall time at each kernel setting, reported (never asserted: machines differ in speed)
    let mut took = vec![std::time::Duration::ZERO; settings.len()];
    for dir in &dirs {
        let cpu = dir.file_name().unwrap().to_string_lossy().to_string();
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        files.sort();
        for f in files {
            let name = f.file_stem().unwrap().to_string_lossy().to_string();
            let Golden { spec, hash } = specs
                .get(&name)
                .unwrap_or_else(|| panic!("{}: no such request in requests.json", f.display()));
            let text = std::fs::read_to_string(&f).unwrap();
            let (header, lines) = trace::parse(&text).unwrap();
            let id = header
                .numerics
                .clone()
                .unwrap_or_else(|| panic!("{}: a golden trace names its numerics", f.display()));
            // the ledger knows these bits under this identifier
            let known = ledger.get(&id).and_then(|m| m.get(&name));
            assert_eq!(
                known.map(String::as_str),
                Some(format!("{hash}:{}", fingerprint(&lines)).as_str()),
                "{cpu}/{name}: its steps are not the ledger's for numerics `{id}` (record traces with scripts/record-golden.sh, never by hand)"
            );
            let Some(file) = model_file(&spec.model) else {
                skipped_default = true;
                continue;
            };
            let engine = engines.get(&file, header.requant().unwrap(), header.kv_cache().unwrap());
            assert_eq!(
                engine.model().sha256,
                header.model_sha256,
                "{cpu}/{name}: model"
            );
            let now = engine.numerics();
            let req = trace::replay_request(&header).unwrap();
            // the sampler alone on the stored logits: the same steps, whatever the model's numerics
            let mut sreq = req.clone();
            sreq.speculative = None;
            let prepared = engine.prepare(&sreq).unwrap();
            let vocab = engine.model().weights.config.vocab_size;
            match trace::check_numerics(&header, &now, true) {
                Ok(()) if !header.raw_logits => {}
                Ok(()) => assert_eq!(
                    trace::replay_sampler(&header, &now, &lines, &prepared, vocab),
                    Ok(lines.len()),
                    "{cpu}/{name}: sampler replay"
                ),
                Err(r) => panic!("{cpu}/{name}: {r} (the sampler's numerics moved: re-record)"),
            }
            if let Err(r) = trace::check_numerics(&header, &now, false) {
                stale.push(format!("{cpu}/{name} ({})", r.differences.join(", ")));
                continue;
            }
            for (k, &(level, width)) in settings.iter().enumerate() {
                let t = std::time::Instant::now();
                let run = with_max_level(level, || {
                    set_register_width(width);
                    let run = engine.generate(req.clone());
                    set_register_width(RegisterWidth::Auto);
                    run
                })
                .unwrap();
                assert_eq!(
                    trace::compare(&header, &now, &lines, &run),
                    Ok(lines.len()),
                    "{cpu}/{name} at {} {width:?}",
                    level.name()
                );
                took[k] += t.elapsed();
                full += 1;
            }
            current.insert(name.clone(), true);
        }
    }
    nextok_testdata::notice(&format!(
        "golden traces: {full} full replays (every trace of this build's numerics at {} kernel settings: {}), this CPU is `{this_cpu}`",
        settings.len(),
        settings
            .iter()
            .zip(&took)
            .map(|((l, w), t)| format!("{}/{w:?} {:.1} s", l.name(), t.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if !stale.is_empty() {
        nextok_testdata::notice(&format!(
            "golden traces recorded under other numerics (their sampler replayed; re-record them on their CPU): {}",
            stale.join("; ")
        ));
    }
    if !dirs.iter().any(|d| d.ends_with(&this_cpu)) {
        nextok_testdata::notice(&format!(
            "golden traces: none recorded on this CPU kind (`{this_cpu}`) yet: run scripts/record-golden.sh and commit them"
        ));
    }
    for (name, ok) in current {
        if skipped_default && specs[&name].spec.model == "default" {
            continue;
        }
        assert!(
            ok,
            "{name}: no golden trace of this build's numerics: the bits moved? declare it (bump the identifier's part, re-record with scripts/record-golden.sh, add a line to the numerics history in docs/semantics.md)"
        );
    }
}

/// A trace of other numerics is refused before any model call, in one line naming both
/// builds; a trace from before versioned numerics whose raw logits differ says so.
#[test]
fn a_trace_of_other_numerics_is_refused_and_an_old_one_explained() {
    let file = nextok_testdata::repo_root().join("testdata/tiny-quant/llama-q4_0.gguf");
    let m = Arc::new(Model::load(&file, Requant::Keep).unwrap());
    let engine = Engine::new(m, EngineConfig::default()).unwrap();
    let mut req = GenerateRequest::new(Prompt::Ids(vec![1, 17, 45, 98]));
    req.params = SamplingParams {
        temperature: Some(0.9),
        seed: Some(3),
        max_tokens: Some(4),
        ignore_eos: true,
        ..Default::default()
    };
    req.records = Some(4);
    let c = engine.generate(req).unwrap();
    let now = engine.numerics();
    let header = TraceHeader::new(&c.info, engine.model(), "reference", 4);
    assert_eq!(header.numerics.as_deref(), Some(now.as_str()));
    assert_eq!(
        header.nextok_version.as_deref(),
        Some(nextok_engine::VERSION)
    );
    let text = trace::text(&header, c.sequences.iter().map(|s| s.records.as_slice()));
    let (h, lines) = trace::parse(&text).unwrap();
    assert!(trace::check_numerics(&h, &now, false).is_ok());

    // another build's graph: refused, naming both versions and the part that moved
    let mut other = h.clone();
    other.numerics = Some(now.replace("graph.llama=", "graph.llama=9"));
    other.nextok_version = Some("0.0.9+gdeadbeef".into());
    let r = trace::check_numerics(&other, &now, false).unwrap_err();
    let msg = r.to_string();
    assert!(!msg.contains('\n'), "{msg}");
    for part in [
        "0.0.9+gdeadbeef",
        nextok_engine::VERSION,
        "graph.llama: 9",
        "--sampler-only",
    ] {
        assert!(msg.contains(part), "`{part}` in {msg}");
    }
    assert_eq!(r.to_json()["reason"], "numerics");
    assert_eq!(r.to_json()["recorded"]["version"], "0.0.9+gdeadbeef");
    // the sampler alone needs only the sampler's part
    assert!(trace::check_numerics(&other, &now, true).is_ok());
    let mut sampler_moved = h.clone();
    sampler_moved.numerics = Some(now.replace("sampler=", "sampler=7"));
    assert!(trace::check_numerics(&sampler_moved, &now, true).is_err());

    // a trace from before versioned numerics whose first raw logits differ
    let mut old = h.clone();
    old.numerics = None;
    old.nextok_version = None;
    assert!(trace::check_numerics(&old, &now, false).is_ok());
    let mut changed = lines.clone();
    changed[0]["raw_logits_digest"] = Value::from("x64:0000000000000000");
    let run = engine
        .generate(trace::replay_request(&old).unwrap())
        .unwrap();
    let d = trace::compare(&old, &now, &changed, &run).unwrap_err();
    assert_eq!((d.sequence, d.step, d.line), (0, Some(0), 2));
    assert_eq!(d.field, "raw_logits_digest");
    assert_eq!(d.recorded, Value::from("x64:0000000000000000"));
    assert_eq!(d.now, lines[0]["raw_logits_digest"]);
    assert!(
        d.message.contains("predates versioned numerics"),
        "{}",
        d.message
    );
    assert!(d.message.contains(&now), "{}", d.message);
    assert_eq!(d.to_json()["field"], "raw_logits_digest");
    // the same difference under this build's own numerics is an undeclared change
    let d = trace::compare(&h, &now, &changed, &run).unwrap_err();
    assert!(d.message.contains("not declared"), "{}", d.message);
}

/// The sampler alone replays a trace that carries its logits, and notices a stored logit
/// that is not the recorded one (its digest) and a trace without logits.
#[test]
fn the_sampler_replays_on_stored_logits_and_notices_an_edited_one() {
    let file = nextok_testdata::repo_root().join("testdata/tiny-quant/qwen3-q8_0.gguf");
    let m = Arc::new(Model::load(&file, Requant::Keep).unwrap());
    let engine = Engine::new(m, EngineConfig::default()).unwrap();
    let mut req = GenerateRequest::new(Prompt::Ids(vec![5, 17, 45, 98]));
    req.params = SamplingParams {
        temperature: Some(0.9),
        top_p: Some(0.9),
        seed: Some(4),
        max_tokens: Some(6),
        ignore_eos: true,
        ..Default::default()
    };
    req.n = 2;
    req.records = Some(3);
    req.trace_logits = true;
    let c = engine.generate(req.clone()).unwrap();
    let header = TraceHeader::new(&c.info, engine.model(), "reference", 3).with_raw_logits(true);
    let text = trace::text(&header, c.sequences.iter().map(|s| s.records.as_slice()));
    let (h, lines) = trace::parse(&text).unwrap();
    assert!(h.raw_logits);
    let now = engine.numerics();
    let vocab = engine.model().weights.config.vocab_size;
    let p = engine.prepare(&trace::replay_request(&h).unwrap()).unwrap();
    assert_eq!(trace::replay_sampler(&h, &now, &lines, &p, vocab), Ok(12));
    // the full replay compares everything but the stored rows
    let run = engine.generate(trace::replay_request(&h).unwrap()).unwrap();
    assert_eq!(trace::compare(&h, &now, &lines, &run), Ok(12));

    // one stored logit edited: the row's digest is no longer the recorded one
    let rec: nextok_core::StepRecord = serde_json::from_value(lines[3].clone()).unwrap();
    let mut row = rec.raw_logits.unwrap().unpack(vocab).unwrap();
    row[7] += 1.0;
    let mut edited = lines.clone();
    edited[3]["raw_logits"] = serde_json::to_value(nextok_core::PackedLogits::pack(&row)).unwrap();
    let d = trace::replay_sampler(&h, &now, &edited, &p, vocab).unwrap_err();
    assert_eq!(
        (d.sequence, d.line, d.field.as_str()),
        (0, 5, "raw_logits_digest")
    );

    // packed rows are checked before anything is sized by them
    let mut huge = lines.clone();
    huge[0]["raw_logits"]["len"] = Value::from(1u64 << 40);
    let d = trace::replay_sampler(&h, &now, &huge, &p, vocab).unwrap_err();
    assert!(d.message.contains("raw_logits.len"), "{}", d.message);
    let mut garbled = lines.clone();
    garbled[0]["raw_logits"]["data"] = Value::from("!!!");
    let d = trace::replay_sampler(&h, &now, &garbled, &p, vocab).unwrap_err();
    assert!(d.message.contains("raw_logits.data"), "{}", d.message);

    // a trace without logits cannot replay its sampler alone
    let plain = TraceHeader::new(&c.info, engine.model(), "reference", 3);
    let d = trace::replay_sampler(&plain, &now, &lines, &p, vocab).unwrap_err();
    assert_eq!(d.field, "raw_logits");
}
