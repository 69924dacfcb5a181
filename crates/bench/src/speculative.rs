//! `nextok bench speculative`: plain decoding against speculative decoding (prompt lookup,
//! `exact` acceptance) on the real model, in one run, the two alternating.
//!
//! Tasks:
//! * **copy** — extract fields of a ~300-token JSON record given in the prompt, under a JSON
//!   schema of those fields as a structured-output user would send (the answer copies long runs
//!   of the record), greedy and sampled (temperature 0.7);
//! * **chat** — free writing (temperature 0.8), where prompt lookup rarely guesses right: the
//!   adaptive draft length must keep speculation from costing time.
//!
//! With a draft model: the default model re-quantised to Q8_0 as the target, drafted by the
//! same model as shipped (Q4_1), greedy drafts.
//!
//! Every `exact` run must return exactly the plain run's tokens (checked); the sampled tasks
//! also run in `rejection` mode (its own tokens, distributed as plain decoding's). The report
//! gives decode tokens/s of both (medians over the repetitions), the speed-up (the median of
//! the per-repetition ratios: each plain run is paired with the speculative run right after
//! it), the acceptance rate and the mean accepted draft length.

use std::sync::Arc;

use nextok_core::SamplingParams;
use nextok_engine::solo::{run_sequence_drafted, SoloOutput};
use nextok_engine::speculative::{Acceptance, ModelDrafter, SpecOptions};
use nextok_engine::{ConstraintSpec, Engine, EngineConfig, GenerateRequest, Prompt};
use nextok_model::{LogitsSource, Model, Requant};
use serde::Serialize;

use crate::sampler::median;
use crate::ModelArgs;

/// Arguments of `nextok bench speculative`.
#[derive(clap::Args, Debug, Clone)]
pub struct SpeculativeArgs {
    /// `--model`, `--kernels`.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Tokens per run (fewer than 8 count as 8).
    #[arg(long, default_value_t = 96)]
    pub max_tokens: u64,
    /// Repetitions of each task (a plain run, then the speculative run paired with it).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// The most tokens one draft may hold (default: the engine's default).
    #[arg(long)]
    pub max_draft: Option<usize>,
    /// Draft only the drafter's guess, not first the bytes the constraint forces (the copy
    /// tasks' JSON schema): shows what drafting from the constraint adds.
    #[arg(long)]
    pub no_constraint_drafts: bool,
    /// Only these tasks (`copy_greedy`, `copy_sampled`, `chat`), comma-separated (default:
    /// all).
    #[arg(long, value_delimiter = ',')]
    pub tasks: Vec<String>,
    /// Print one JSON array of the rows instead of one line per row.
    #[arg(long)]
    pub json: bool,
}

const RECORD: &str = r#"{"id": 48213, "name": "Harbour Light Desk Lamp", "sku": "HL-2207-BR", "brand": "Keeper & Co.", "category": "Home / Lighting / Desk lamps", "price": {"amount": 74.5, "currency": "EUR"}, "description": "A brass desk lamp modelled on the lamps of old harbour lighthouses, with a weighted base, an adjustable arm and a warm 2700 K LED module rated for 25,000 hours.", "features": ["brushed brass finish", "touch dimmer with four levels", "USB-C charging port in the base", "replaceable LED module"], "dimensions": {"height_cm": 46, "base_diameter_cm": 15, "weight_kg": 1.8}, "shipping": {"ships_from": "Rotterdam", "days": "2-4", "free_over": 50}, "stock": 132, "rating": 4.6, "reviews": 218}"#;

#[derive(Serialize)]
struct Row {
    task: String,
    acceptance: String,
    quant: String,
    tokens: usize,
    plain_tokens_per_s: f64,
    speculative_tokens_per_s: f64,
    speedup: f64,
    identical: bool,
    acceptance_rate: f64,
    mean_accepted: f64,
    verifications: usize,
    /// Tokens drafted in those verifications.
    drafted: usize,
    /// Forward passes of the speculative run after the prompt (each yields its accepted draft
    /// tokens and one more).
    passes: usize,
    /// Per generated token, medians over the repetitions (ms): model calls and sampler steps
    /// of the plain run, then of the speculative run (the plain run prepares a constraint's
    /// mask on the other thread while the model runs; the speculative run steps its rows one
    /// after another, each mask on the critical path).
    plain_model_ms: f64,
    plain_sample_ms: f64,
    speculative_model_ms: f64,
    speculative_sample_ms: f64,
}

fn task(name: &str, max_tokens: u64) -> GenerateRequest {
    let (prompt, temperature) = match name {
        "copy_greedy" | "copy_sampled" => (
            format!("<|im_start|>user\nHere is a product record:\n{RECORD}\nReturn a JSON object with the fields name, sku, description, features and shipping copied exactly from it.<|im_end|>\n<|im_start|>assistant\n"),
            if name == "copy_greedy" { 0.0 } else { 0.7 },
        ),
        _ => (
            "<|im_start|>user\nWrite a short story about a lighthouse keeper who finds a message in a bottle.<|im_end|>\n<|im_start|>assistant\n".to_string(),
            0.8,
        ),
    };
    let mut r = GenerateRequest::new(Prompt::Text(prompt));
    if name != "chat" {
        // what a structured-output user sends: the fields asked for, as a JSON schema
        let text = serde_json::json!({"type": "string"});
        r.params.constraint = Some(ConstraintSpec::JsonSchema {
            schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "name": text, "sku": text, "description": text,
                    "features": {"type": "array", "items": text},
                    "shipping": {
                        "type": "object",
                        "properties": {
                            "ships_from": text, "days": text, "free_over": {"type": "number"}
                        },
                        "required": ["ships_from", "days", "free_over"],
                        "additionalProperties": false
                    }
                },
                "required": ["name", "sku", "description", "features", "shipping"],
                "additionalProperties": false
            }),
            options: Default::default(),
        });
    }
    r.params = SamplingParams {
        temperature: Some(temperature),
        top_p: Some(0.95),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        seed: Some(11),
        constraint: r.params.constraint.take(),
        ..Default::default()
    };
    r
}

fn once(
    engine: &Engine,
    model: &Model,
    req: &GenerateRequest,
    spec: Option<SpecOptions>,
    draft: Option<&Model>,
) -> Result<SoloOutput, String> {
    let p = engine.prepare(req).map_err(|e| e.to_string())?;
    let mut src = model.source();
    let row = src.prefill(&p.info.prompt_ids).map_err(|e| e.to_string())?;
    let o = p.solo_options(None, true, spec);
    match (draft, spec) {
        (Some(d), Some(spec)) => {
            let mut drafter = ModelDrafter::new(d, model).map_err(|e| e.to_string())?;
            let (prompt, seed) = (&p.info.prompt_ids, p.info.seeds[0]);
            run_sequence_drafted(
                model,
                &p.sampler,
                src,
                prompt,
                row,
                seed,
                &o,
                spec,
                &mut drafter,
            )
        }
        _ => p.run_prefilled(model, src, row, &o),
    }
    .map_err(|e| e.to_string())
}

/// Runs `nextok bench speculative`.
pub fn run(args: &SpeculativeArgs) -> Result<(), String> {
    if let Some(bad) = args
        .tasks
        .iter()
        .find(|t| !["copy_greedy", "copy_sampled", "chat"].contains(&t.as_str()))
    {
        return Err(format!(
            "--tasks: no task `{bad}` (copy_greedy, copy_sampled, chat)"
        ));
    }
    let path = args.model.path()?;
    let mut rows = Vec::new();
    let q4 = Arc::new(crate::load_model(&path, Requant::Keep)?);
    let q8 = Arc::new(crate::load_model(&path, Requant::Q8_0)?);
    // (label, target, draft model: None for prompt lookup)
    let setups: [(&str, &Arc<Model>, Option<&Model>); 3] = [
        ("q4_1", &q4, None),
        ("q8_0", &q8, None),
        ("q8_0+draft_q4_1", &q8, Some(&q4)),
    ];
    for (quant, model, draft) in setups {
        let engine =
            Engine::new(model.clone(), EngineConfig::default()).map_err(|e| e.to_string())?;
        let mut cases = vec![
            ("copy_greedy", Acceptance::Exact),
            ("copy_sampled", Acceptance::Exact),
            ("chat", Acceptance::Exact),
        ];
        if draft.is_none() {
            cases.push(("copy_sampled", Acceptance::Rejection));
            cases.push(("chat", Acceptance::Rejection));
        }
        cases.retain(|(name, _)| args.tasks.is_empty() || args.tasks.iter().any(|t| t == name));
        for (name, acceptance) in cases {
            let req = task(name, args.max_tokens.max(8));
            let options = SpecOptions {
                acceptance,
                max_draft: args.max_draft.unwrap_or(SpecOptions::default().max_draft),
                constraint_drafts: !args.no_constraint_drafts,
                ..SpecOptions::default()
            };
            options.check().map_err(|e| format!("--max-draft: {e}"))?;
            // plain and speculative alternate; each pair runs back to back, so its ratio sees
            // one state of a shared machine: the report gives medians over the pairs
            let (mut plain_s, mut spec_s, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            let (mut pm, mut ps, mut sm, mut ss) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut identical = true;
            let mut last = None;
            let mut tokens = 0;
            for _ in 0..args.reps.max(1) {
                let plain = once(&engine, model, &req, None, None)?;
                let spec = once(&engine, model, &req, Some(options), draft)?;
                identical &= plain.tokens == spec.tokens && plain.finish == spec.finish;
                let (p, s) = (
                    plain.time.total.as_secs_f64(),
                    spec.time.total.as_secs_f64(),
                );
                plain_s.push(p);
                spec_s.push(s);
                let per =
                    |d: std::time::Duration| d.as_secs_f64() * 1e3 / plain.tokens.len() as f64;
                pm.push(per(plain.time.model));
                ps.push(per(plain.time.sample));
                sm.push(per(spec.time.model));
                ss.push(per(spec.time.sample));
                ratios.push(p / s);
                tokens = plain.tokens.len();
                last = Some(spec.spec);
            }
            let st = last.unwrap_or_default();
            let n = tokens.saturating_sub(1).max(1) as f64;
            let row = Row {
                task: name.into(),
                acceptance: acceptance.name().into(),
                quant: quant.into(),
                tokens,
                plain_tokens_per_s: n / median(&mut plain_s),
                speculative_tokens_per_s: n / median(&mut spec_s),
                speedup: median(&mut ratios),
                identical,
                acceptance_rate: st.acceptance_rate(),
                mean_accepted: st.mean_accepted(),
                verifications: st.verifications,
                drafted: st.drafted,
                passes: tokens.saturating_sub(1 + st.accepted),
                plain_model_ms: median(&mut pm),
                plain_sample_ms: median(&mut ps),
                speculative_model_ms: median(&mut sm),
                speculative_sample_ms: median(&mut ss),
            };
            if !args.json {
                println!(
                    "{:<15} {:<13} {:<9} {:>4} tokens  plain {:>6.1} tok/s  speculative {:>6.1} tok/s  x{:.2}  identical {}  acceptance {:.2}  mean accepted {:.2} ({} drafts, {} drafted, {} passes)  ms/token model+sample: plain {:.2}+{:.2}, speculative {:.2}+{:.2}",
                    row.quant,
                    row.task,
                    row.acceptance,
                    row.tokens,
                    row.plain_tokens_per_s,
                    row.speculative_tokens_per_s,
                    row.speedup,
                    row.identical,
                    row.acceptance_rate,
                    row.mean_accepted,
                    row.verifications,
                    row.drafted,
                    row.passes,
                    row.plain_model_ms,
                    row.plain_sample_ms,
                    row.speculative_model_ms,
                    row.speculative_sample_ms,
                );
            }
            if !identical && acceptance == Acceptance::Exact {
                return Err(format!(
                    "{quant} {name}: speculative decoding changed the tokens"
                ));
            }
            rows.push(row);
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
    }
    Ok(())
}
