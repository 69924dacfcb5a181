//! `nextok generate` and `nextok replay` end to end on SmolLM2-135M-Instruct (Q4_1, from
//! `scripts/fetch-testdata.sh`). Without the file these tests print a notice and pass — unless
//! `CI` is set, where they fail.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    nextok_testdata::repo_root()
}

fn model() -> Option<PathBuf> {
    nextok_testdata::require(nextok_testdata::SMOLLM2)
}

const CAPITAL: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France? Answer in two sentences.<|im_end|>\n<|im_start|>assistant\n";

fn nextok(model: &PathBuf, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nextok"))
        .args(args)
        .arg("--model")
        .arg(model)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nextok-generate-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Writes `lines` as a JSON Lines file (a trace edited by a test).
fn write_lines(p: &PathBuf, lines: &[Value]) {
    let body: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(p, body.join("\n") + "\n").unwrap();
}

fn trace_lines(p: &PathBuf) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn greedy_answers_and_stops_at_eos() {
    let Some(m) = model() else { return };
    let o = nextok(
        &m,
        &[
            "generate",
            CAPITAL,
            "--temperature",
            "0",
            "--max-tokens",
            "20",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout).trim_end(),
        "The capital of France is Paris."
    );
    assert!(
        text(&o.stderr).contains("finish: eos"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn chat_template_renders_the_reference_prompt() {
    let Some(m) = model() else { return };
    let t = tmp("chat.jsonl");
    let o = nextok(
        &m,
        &[
            "generate",
            "--chat",
            "What is the capital of France? Answer in two sentences.",
            "--temperature",
            "0",
            "--max-tokens",
            "3",
            "--trace",
            t.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let reference: Value = serde_json::from_slice(
        &std::fs::read(root().join("testdata/reference/smollm2-135m-q4_1.llamacpp.json")).unwrap(),
    )
    .unwrap();
    let lines = trace_lines(&t);
    assert_eq!(
        lines[0]["prompt_ids"],
        reference["prompts"]["capital"]["ids"]
    );
    assert_eq!(lines.len(), 1 + 3);
    assert!(
        text(&o.stderr).contains("finish: length"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn stop_string_cuts_the_stream() {
    let Some(m) = model() else { return };
    let o = nextok(
        &m,
        &[
            "generate",
            CAPITAL,
            "--temperature",
            "0",
            "--stop",
            " Paris",
            "--max-tokens",
            "20",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim_end(), "The capital of France is");
    assert!(
        text(&o.stderr).contains("finish: stop string \" Paris\""),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn logprobs_are_labelled_with_their_layer() {
    let Some(m) = model() else { return };
    let o = nextok(
        &m,
        &[
            "generate",
            CAPITAL,
            "--temperature",
            "0.7",
            "--top-k",
            "5",
            "--max-tokens",
            "2",
            "--logprobs",
            "3",
            "--logprob-layer",
            "raw",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert_eq!(err.matches("logprobs step ").count(), 2, "{err}");
    assert!(err.contains("[raw]"), "{err}");
}

#[test]
fn n_sequences_equal_single_runs() {
    let Some(m) = model() else { return };
    let both = tmp("both.jsonl");
    let single = tmp("single.jsonl");
    let common = [
        "generate",
        CAPITAL,
        "--temperature",
        "1.0",
        "--top-p",
        "0.95",
        "--max-tokens",
        "12",
    ];
    let mut a: Vec<&str> = common.to_vec();
    a.extend(["-n", "2", "--seed", "5", "--trace", both.to_str().unwrap()]);
    let o = nextok(&m, &a);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let mut b: Vec<&str> = common.to_vec();
    b.extend(["--seed", "6", "--trace", single.to_str().unwrap()]);
    let o = nextok(&m, &b);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let both = trace_lines(&both);
    let single = trace_lines(&single);
    assert_eq!(both[0]["seeds"], serde_json::json!([5, 6]));
    let second: Vec<&Value> = both[1..].iter().filter(|r| r["rng"]["seed"] == 6).collect();
    assert_eq!(second.len(), single.len() - 1);
    for (x, y) in second.iter().zip(&single[1..]) {
        assert_eq!(*x, y);
    }
}

#[test]
fn replay_checks_every_step_and_catches_an_edit() {
    let Some(m) = model() else { return };
    let t = tmp("replay.jsonl");
    let o = nextok(
        &m,
        &[
            "generate",
            CAPITAL,
            "--temperature",
            "0.9",
            "--min-p",
            "0.05",
            "--max-tokens",
            "6",
            "--presence-penalty",
            "0.5",
            "--logit-bias",
            "504=1.5",
            "--seed",
            "11",
            "-n",
            "2",
            "--trace",
            t.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = nextok(&m, &["replay", t.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("replay ok"), "{}", text(&o.stderr));

    // hand-edit the third line (sequence 0, step 1): one candidate's selection probability
    let mut lines: Vec<Value> = trace_lines(&t);
    let p = lines[2]["candidates"][0]["selection_prob"]
        .as_f64()
        .unwrap();
    lines[2]["candidates"][0]["selection_prob"] = serde_json::json!(p * 0.999);
    let edited = tmp("edited.jsonl");
    write_lines(&edited, &lines);
    let o = nextok(&m, &["replay", edited.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("sequence 0 step 1"), "{err}");
    assert!(err.contains("candidates[0].selection_prob"), "{err}");

    // a changed token is caught too
    let mut lines: Vec<Value> = trace_lines(&t);
    let was = lines[1]["selected"].as_u64().unwrap();
    lines[1]["selected"] = serde_json::json!(if was == 7026 { 7027 } else { 7026 });
    write_lines(&edited, &lines);
    let o = nextok(&m, &["replay", edited.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("step 0"), "{}", text(&o.stderr));
}

#[test]
fn a_q8_0_cache_is_recorded_and_replayed_with_its_trace() {
    let Some(m) = model() else { return };
    let t = tmp("q8.jsonl");
    let run = |cache: &str, trace: &std::path::Path| {
        let o = nextok(
            &m,
            &[
                "generate",
                CAPITAL,
                "--temperature",
                "0",
                "--max-tokens",
                "8",
                "--kv-cache-type",
                cache,
                "--trace",
                trace.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
    };
    run("q8_0", &t);
    let lines = trace_lines(&t);
    assert_eq!(lines[0]["kv_cache"], "q8_0");
    let o = nextok(&m, &["replay", t.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("replay ok"), "{}", text(&o.stderr));
    // the header edited to the f16 cache: its numerics are not what the f16 cache computes,
    // refused before any model call
    let mut edited_lines = lines.clone();
    edited_lines[0]["kv_cache"] = serde_json::json!("f16");
    let edited = tmp("q8-edited.jsonl");
    write_lines(&edited, &edited_lines);
    let o = nextok(&m, &["replay", edited.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("cannot replay") && err.contains("kv.f16"),
        "{err}"
    );
    // without the identifier (a trace from before versioned numerics) the raw logits differ
    // at the first step, and the message says why
    edited_lines[0].as_object_mut().unwrap().remove("numerics");
    write_lines(&edited, &edited_lines);
    let o = nextok(&m, &["replay", edited.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("step 0"), "{err}");
    assert!(err.contains("predates versioned numerics"), "{err}");
    // an unknown cache type is refused by name before any model is loaded
    edited_lines[0]["kv_cache"] = serde_json::json!("q4_0");
    write_lines(&edited, &edited_lines);
    let o = nextok(&m, &["replay", edited.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("kv_cache"), "{}", text(&o.stderr));
    // a trace of the f16 cache says so
    let f = tmp("f16.jsonl");
    run("f16", &f);
    assert_eq!(trace_lines(&f)[0]["kv_cache"], "f16");
}

#[test]
fn pipeline_file_and_beam_search_run() {
    let Some(m) = model() else { return };
    let pipeline = tmp("pipeline.json");
    std::fs::write(
        &pipeline,
        r#"{"format_version": 1, "processors": [{"type": "temperature", "version": 1, "temperature": 0}], "selector": {"type": "greedy"}}"#,
    )
    .unwrap();
    let o = nextok(
        &m,
        &[
            "generate",
            CAPITAL,
            "--pipeline",
            pipeline.to_str().unwrap(),
            "--max-tokens",
            "20",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout).trim_end(),
        "The capital of France is Paris."
    );
    let o = nextok(
        &m,
        &[
            "generate",
            CAPITAL,
            "--beam-width",
            "2",
            "--max-tokens",
            "12",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("beam 1:"), "{}", text(&o.stderr));
}

#[test]
fn bad_flags_fail_with_a_message() {
    let Some(m) = model() else { return };
    // the resolver's error, under the flag's name, before the model is loaded
    let o = nextok(&m, &["generate", "hi", "--top-p", "1.5"]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("error: invalid `--top-p`: 1.5 is outside (0, 1]"),
        "{}",
        text(&o.stderr)
    );
    for (args, flag) in [
        (&["-n", "0"][..], "`-n`"),
        (&["--max-tokens", "0"], "`--max-tokens`"),
        (&["--logprobs", "21"], "`--logprobs`"),
        (&["--stop", "a", "--stop", ""], "`--stop[1]`"),
        (&["--logit-bias", "5=101"], "`--logit-bias[5]`"),
    ] {
        let mut a = vec!["generate", "hi"];
        a.extend_from_slice(args);
        let o = nextok(&m, &a);
        assert!(!o.status.success());
        assert!(
            text(&o.stderr).contains(flag),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
    // a pipeline file carries its own processors: a sampling flag is refused, and a constraint
    // needs the file's grammar mask
    let pipe = tmp("greedy-pipeline.json");
    std::fs::write(
        &pipe,
        r#"{"format_version": 1, "processors": [], "selector": {"type": "greedy"}}"#,
    )
    .unwrap();
    let pipe = pipe.to_string_lossy().into_owned();
    for (flags, flag) in [
        (["--temperature", "0.5"], "`--temperature`"),
        (["--regex", "a"], "`--pipeline`"),
    ] {
        let mut a = vec!["generate", "hi", "--pipeline", &pipe];
        a.extend_from_slice(&flags);
        let o = nextok(&m, &a);
        assert!(!o.status.success());
        assert!(
            text(&o.stderr).contains(flag),
            "{flags:?}: {}",
            text(&o.stderr)
        );
    }
    let o = nextok(&m, &["generate", "hi", "--logit-bias", "nope"]);
    assert!(!o.status.success());
}

#[test]
fn an_unseeded_run_draws_prints_and_records_a_fresh_seed() {
    let Some(m) = model() else { return };
    let seed_of = |name: &str| {
        let t = tmp(name);
        let o = nextok(
            &m,
            &[
                "generate",
                "Hello",
                "--temperature",
                "1",
                "--max-tokens",
                "2",
                "--presence-penalty",
                "-0.5",
                "--trace",
                t.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        let err = text(&o.stderr);
        let printed: u64 = err
            .split("nextok: seed ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no seed printed: {err}"));
        assert_eq!(trace_lines(&t)[0]["seeds"][0], serde_json::json!(printed));
        printed
    };
    assert_ne!(seed_of("seed-a.jsonl"), seed_of("seed-b.jsonl"));
    // beam search refuses the flags it cannot honour
    let o = nextok(&m, &["generate", "hi", "--beam-width", "2", "-n", "2"]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("-n"), "{}", text(&o.stderr));
}

#[test]
fn the_readme_demo_answers_json_and_shows_the_ledger_of_one_step() {
    let Some(m) = model() else { return };
    let schema = root().join("examples/person.schema.json");
    let o = nextok(
        &m,
        &[
            "generate",
            "--chat",
            "Give me a person as JSON with name, age and city.",
            "--json-schema",
            schema.to_str().unwrap(),
            "--temperature",
            "0.7",
            "--top-p",
            "0.9",
            "--seed",
            "7",
            "--ledger",
            "0",
        ],
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    let v: Value = serde_json::from_str(text(&o.stdout).trim()).unwrap();
    let obj = v.as_object().unwrap();
    assert_eq!(obj.len(), 3, "{v}");
    assert!(obj["name"].is_string() && obj["age"].is_i64() && obj["city"].is_string());
    assert!(err.contains("finish: grammar accepted"), "{err}");
    // the schema report, and the output checked against the full schema on the finish line
    assert!(
        err.contains("nextok: schema mode strict; mask enforces: "),
        "{err}"
    );
    assert!(err.contains("; schema check: valid"), "{err}");
    // the ledger of step 0: the stages, and the constraint's effect on the model's favourite
    let ledger = &err[err.find("the ledger of step 0:").expect("a ledger")..];
    assert!(ledger.contains("grammar_mask v1"), "{ledger}");
    let row = |tok: &str| {
        ledger
            .lines()
            .find(|l| l.starts_with(tok))
            .unwrap_or_else(|| panic!("no row {tok}: {ledger}"))
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    // "```" has the highest raw logit, and JSON cannot start with it
    let fence = row("\"```\"");
    assert_eq!(fence[2], "no", "{ledger}");
    assert_eq!(fence[5], "-inf", "{ledger}");
    let brace = row("\"{\"");
    assert_eq!(brace[2], "yes", "{ledger}");
    assert!(fence[1].parse::<f64>().unwrap() > brace[1].parse::<f64>().unwrap());
    // the ledger's selected token is the first one the stream printed
    assert!(ledger.contains("selected \"{\" (id"), "{ledger}");
    assert!(text(&o.stdout).starts_with('{'));
}

#[test]
fn bench_sampler_runs_on_a_real_logits_row() {
    let Some(m) = model() else { return };
    let o = nextok(
        &m,
        &[
            "bench",
            "sampler",
            "--real",
            "--vocab",
            "1024",
            "--iters",
            "3",
            "--batch-iters",
            "1",
            "--no-flat",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let real: Vec<&Value> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["logits"] == "SmolLM2-135M-Instruct.Q4_1")
        .collect();
    assert_eq!(real.len(), 2, "{v}");
    for s in real {
        assert_eq!(s["vocab"], 49152);
        assert!(s["support"].as_u64().unwrap() >= 1);
        assert!(s["nextok_ns"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn speculative_decoding_prints_and_traces_what_plain_decoding_does() {
    let Some(m) = model() else { return };
    let prompt = "<|im_start|>user\nRepeat this list exactly, one item per line:\napple pie\nbanana bread\ncherry tart\ndate cake\nelderberry jam\nfig roll<|im_end|>\n<|im_start|>assistant\n";
    let run = |extra: &[&str], trace: &str| {
        let t = tmp(trace);
        let mut args = vec![
            "generate",
            prompt,
            "--temperature",
            "0.6",
            "--seed",
            "9",
            "--max-tokens",
            "40",
            "--trace",
            t.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = nextok(&m, &args);
        assert!(o.status.success(), "{}", text(&o.stderr));
        // the trace replays (with the same drafts)
        let r = nextok(&m, &["replay", t.to_str().unwrap()]);
        assert!(r.status.success(), "replay: {}", text(&r.stderr));
        let lines = trace_lines(&t);
        // step records apart from the header (which records the same request either way),
        // and the draft marks apart from the records
        let mut marks = Vec::new();
        let steps: Vec<Value> = lines[1..]
            .iter()
            .map(|l| {
                let mut l = l.clone();
                if let Some(d) = l.as_object_mut().and_then(|o| o.remove("draft")) {
                    marks.push(d);
                }
                l
            })
            .collect();
        (
            text(&o.stdout),
            steps,
            text(&o.stderr),
            lines[0].clone(),
            marks,
        )
    };
    let (plain, plain_steps, _, plain_header, plain_marks) = run(&[], "plain.jsonl");
    assert!(plain_header.get("speculative").is_none());
    assert!(plain_marks.is_empty());
    let (fast, fast_steps, err, header, marks) = run(&["--speculative", "ngram:4"], "spec.jsonl");
    assert_eq!(fast, plain);
    assert_eq!(fast_steps, plain_steps);
    assert!(err.contains("speculative:"), "{err}");
    assert_eq!(header["speculative"]["max_draft"], 4);
    assert_eq!(header["speculative"]["acceptance"], "exact");
    assert!(!marks.is_empty(), "the copied list drafts");
    assert!(marks.iter().all(|d| d["rule"] == "exact"));
    assert!(marks.iter().any(|d| d["accepted"] == true));
    // the rejection rule: its own tokens (distributed as plain decoding's), recorded and
    // replayed
    let (_, _, err, header, marks) = run(
        &["--speculative", "ngram", "--spec-acceptance", "rejection"],
        "rejection.jsonl",
    );
    assert!(err.contains("speculative:"), "{err}");
    assert_eq!(header["speculative"]["acceptance"], "rejection");
    assert!(!marks.is_empty());
    assert!(marks
        .iter()
        .all(|d| d["rule"] == "rejection" && d["accept_u"].is_f64()));
    let o = nextok(&m, &["generate", "hi", "--spec-acceptance", "rejection"]);
    assert!(!o.status.success(), "--spec-acceptance needs --speculative");
    let o = nextok(
        &m,
        &[
            "generate",
            "hi",
            "--speculative",
            "ngram",
            "--spec-acceptance",
            "maybe",
        ],
    );
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("--spec-acceptance"),
        "{}",
        text(&o.stderr)
    );
    for bad in ["lookahead", "ngram:0", "ngram:x"] {
        let o = nextok(&m, &["generate", "hi", "--speculative", bad]);
        assert!(!o.status.success());
        assert!(
            text(&o.stderr).contains("--speculative"),
            "{}",
            text(&o.stderr)
        );
    }
}

/// `replay --json` gives the outcome as data: success, the first divergence (sequence, step,
/// field, both values) or the numerics refusal (both builds), with exit status 1 on failure.
#[test]
fn replay_json_gives_the_first_divergence_and_the_refusal_as_data() {
    let Some(m) = model() else { return };
    let t = tmp("json.jsonl");
    let o = nextok(
        &m,
        &[
            "generate",
            CAPITAL,
            "--temperature",
            "0.8",
            "--max-tokens",
            "4",
            "--seed",
            "3",
            "--trace",
            t.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let lines = trace_lines(&t);
    assert!(lines[0]["nextok_version"]
        .as_str()
        .is_some_and(|v| v.starts_with("0.")));
    let id = lines[0]["numerics"].as_str().unwrap().to_string();
    assert!(id.starts_with("nx1 graph.llama="), "{id}");
    assert!(
        id.contains(" kv.f16=") && id.contains(" q4_1=") && id.contains(" sampler="),
        "{id}"
    );

    let o = nextok(&m, &["replay", "--json", t.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["steps"], 4);
    assert_eq!(v["numerics"], id.as_str());

    // an edited selection probability at sequence 0, step 2
    let mut edited = lines.clone();
    edited[3]["candidates"][0]["selection_prob"] = serde_json::json!(0.125);
    let e = tmp("json-edited.jsonl");
    write_lines(&e, &edited);
    let o = nextok(&m, &["replay", "--json", e.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["reason"], "divergence");
    assert_eq!(
        (v["sequence"].as_u64(), v["step"].as_u64()),
        (Some(0), Some(2))
    );
    assert_eq!(v["line"], 4);
    assert_eq!(v["field"], "candidates[0].selection_prob");
    assert_eq!(v["recorded"], 0.125);
    assert_eq!(v["now"], lines[3]["candidates"][0]["selection_prob"]);

    // another build's numerics: refused before any model call, as data and in one line
    let mut other = lines.clone();
    other[0]["numerics"] = serde_json::json!(id.replace("graph.llama=", "graph.llama=7"));
    other[0]["nextok_version"] = serde_json::json!("0.0.1+gfeedface");
    write_lines(&e, &other);
    let o = nextok(&m, &["replay", "--json", e.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["reason"], "numerics");
    assert_eq!(v["recorded"]["version"], "0.0.1+gfeedface");
    assert_eq!(v["now"]["numerics"], id.as_str());
    let o = nextok(&m, &["replay", e.to_str().unwrap()]);
    let err = text(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("0.0.1+gfeedface") && err.contains("graph.llama: 7"),
        "{err}"
    );
    assert!(
        !err.contains("replay mismatch"),
        "refused before running: {err}"
    );
}

/// `generate --trace-logits` stores every row; `replay --sampler-only` checks the sampler, the
/// constraint and the stop conditions on them without the model — also when the trace names
/// other model numerics — and refuses a trace without rows.
#[test]
fn the_sampler_replays_alone_on_a_trace_with_its_logits() {
    let Some(m) = model() else { return };
    let t = tmp("logits.jsonl");
    let o = nextok(
        &m,
        &[
            "generate",
            CAPITAL,
            "--temperature",
            "0.9",
            "--top-p",
            "0.9",
            "--max-tokens",
            "5",
            "--seed",
            "2",
            "-n",
            "2",
            "--choice",
            "Paris",
            "--choice",
            "Lyon",
            "--trace",
            t.to_str().unwrap(),
            "--trace-logits",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("--trace-logits:"),
        "{}",
        text(&o.stderr)
    );
    let lines = trace_lines(&t);
    assert_eq!(lines[0]["raw_logits"], true);
    assert_eq!(lines[1]["raw_logits"]["len"], 49152);
    let o = nextok(
        &m,
        &["replay", "--sampler-only", "--json", t.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["ok"].as_bool(), v["mode"].as_str()),
        (Some(true), Some("sampler"))
    );
    // the full replay ignores the stored rows and passes too
    let o = nextok(&m, &["replay", t.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));

    // other model numerics: the full replay is refused, the sampler alone still replays
    let mut other = lines.clone();
    let id = other[0]["numerics"]
        .as_str()
        .unwrap()
        .replace("q4_1=", "q4_1=5");
    other[0]["numerics"] = serde_json::json!(id);
    let e = tmp("logits-other.jsonl");
    write_lines(&e, &other);
    assert_eq!(
        nextok(&m, &["replay", e.to_str().unwrap()]).status.code(),
        Some(2)
    );
    let o = nextok(&m, &["replay", "--sampler-only", e.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("the model did not run"),
        "{}",
        text(&o.stderr)
    );

    // a trace without rows cannot
    let plain = tmp("plain.jsonl");
    let o = nextok(
        &m,
        &[
            "generate",
            CAPITAL,
            "--max-tokens",
            "2",
            "--seed",
            "1",
            "--trace",
            plain.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = nextok(&m, &["replay", "--sampler-only", plain.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("--trace-logits"),
        "{}",
        text(&o.stderr)
    );
}

/// The memory guard, as a user meets it: with less memory than the weights need
/// (`NEXTOK_MEMORY_LIMIT` caps what nextok may assume), loading is refused in one line naming
/// both sizes, before anything is allocated for the weights; with enough, the same run answers.
#[test]
fn a_model_that_does_not_fit_is_refused_at_load_in_one_line() {
    let Some(m) = model() else { return };
    let run = |limit: &str| {
        Command::new(env!("CARGO_BIN_EXE_nextok"))
            .args(["generate", "Hi", "--max-tokens", "2", "--temperature", "0"])
            .arg("--model")
            .arg(&m)
            .env("NEXTOK_MEMORY_LIMIT", limit)
            .output()
            .unwrap()
    };
    let o = run("64M");
    assert!(!o.status.success());
    let err = text(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("the weights need"))
        .unwrap_or_else(|| panic!("no memory line in: {err}"));
    assert!(
        line.contains("MiB of memory, and 64.0 MiB is available (NEXTOK_MEMORY_LIMIT)"),
        "{line}"
    );
    assert!(line.contains("SmolLM2"), "names the file: {line}");
    let o = run("8G");
    assert!(o.status.success(), "{}", text(&o.stderr));
}
