//! The teaching demonstrations of the ledger page (002 §03 and §04), computed by nextok itself:
//!
//! * [`beam_tree`] — beam search on a small probability tree given as data (002's two-step
//!   tree), run by [`nextok_model::beam`] on a scripted logits source, with every step's
//!   proposals marked kept or dropped;
//! * [`schedule_streams`] — 002's random-stream scheduling: requests with fixed distributions
//!   drawn round by round in a chosen order, the random numbers owned by one global list, by
//!   batch slot, by request, or by nextok's own counter-based Philox stream per request; one
//!   request may run out of output budget (the batch compacts) and continue after the others,
//!   its stream resumed or reset. Every token comes from the core's selection (inverse CDF in
//!   token-id order for a fixed `u`; the sampler's own stream step for Philox).
//!
//! Both are pure functions of their input; errors name the field at fault.

use std::collections::HashMap;

use nextok_core::{Draw, Preset, Sampler, SamplingParams, VocabInfo};
use nextok_model::beam::{beam_search_traced, BeamConfig, BeamProposal, RawScorer};
use nextok_model::scripted::ScriptedSource;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// Most nodes of a beam tree.
pub const MAX_TREE_NODES: usize = 256;
/// Deepest beam tree.
pub const MAX_TREE_DEPTH: usize = 6;
/// Widest beam.
pub const MAX_BEAM_WIDTH: usize = 16;

/// A node of a probability tree: a token and its conditional probability given the path to it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreeNode {
    /// The token's name (the same name under different parents is the same token).
    pub token: String,
    /// `p(token | path)`, in `(0, 1]`.
    pub p: f64,
    /// The next step's tokens (none at the last step; every path has the same length).
    #[serde(default)]
    pub children: Vec<TreeNode>,
}

/// A beam search over a probability tree.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BeamTreeRequest {
    /// The first step's tokens; siblings' probabilities sum to 1.
    pub tree: Vec<TreeNode>,
    /// Beam width (1 = greedy).
    pub width: usize,
}

/// One proposal of one step.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BeamRow {
    /// The step (1-based).
    pub depth: usize,
    /// The path's token names.
    pub path: Vec<String>,
    /// The path's joint probability (`exp` of the summed raw-layer logprobs).
    pub joint_prob: f64,
    /// The summed logprob.
    pub logprob: f64,
    /// Whether the beam kept it.
    pub kept: bool,
}

/// A finished path.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BeamPath {
    /// Token names.
    pub path: Vec<String>,
    /// Joint probability.
    pub joint_prob: f64,
    /// Summed logprob.
    pub logprob: f64,
}

/// What [`beam_tree`] returns.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BeamTreeOutput {
    /// The width that ran.
    pub width: usize,
    /// Every step's proposals, step by step, best first within a step.
    pub steps: Vec<BeamRow>,
    /// The finished paths, best first.
    pub best: Vec<BeamPath>,
}

/// Runs beam search of width `req.width` on the tree: raw-layer logprobs, no EOS, no length
/// penalty (`α = 0`), as many steps as the tree is deep.
pub fn beam_tree(req: &BeamTreeRequest) -> Result<BeamTreeOutput> {
    if req.width == 0 || req.width > MAX_BEAM_WIDTH {
        return Err(EngineError::invalid(
            "width",
            format!("the beam width must be between 1 and {MAX_BEAM_WIDTH}"),
        ));
    }
    // token names → ids; the prompt is one more id after them
    let mut names: Vec<String> = Vec::new();
    let mut ids: HashMap<String, u32> = HashMap::new();
    // (path, the next step's (token, p)) per inner node
    type Row = (Vec<u32>, Vec<(u32, f64)>);
    let mut rows: Vec<Row> = Vec::new();
    let mut depth = None;
    let mut count = 0usize;
    // (path so far, siblings, field name)
    let mut todo: Vec<(Vec<u32>, &[TreeNode], String)> =
        vec![(Vec::new(), req.tree.as_slice(), "tree".to_string())];
    // depth first, in the tree's order
    while let Some((path, nodes, field)) = todo.pop() {
        if nodes.is_empty() {
            let d = path.len();
            match depth {
                None => depth = Some(d),
                Some(x) if x != d => {
                    return Err(EngineError::invalid(
                        field,
                        "every path must have the same length (the tree's leaves all at one depth)",
                    ))
                }
                _ => {}
            }
            continue;
        }
        if path.len() >= MAX_TREE_DEPTH {
            return Err(EngineError::invalid(
                field,
                format!("the tree is deeper than {MAX_TREE_DEPTH}"),
            ));
        }
        let mut row = Vec::with_capacity(nodes.len());
        let mut sum = 0.0;
        let mut next_todo = Vec::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            count += 1;
            if count > MAX_TREE_NODES {
                return Err(EngineError::invalid(
                    "tree",
                    format!("more than {MAX_TREE_NODES} nodes"),
                ));
            }
            let f = format!("{field}[{i}]");
            if !(n.p > 0.0 && n.p <= 1.0) {
                return Err(EngineError::invalid(
                    format!("{f}.p"),
                    format!("{} is not a probability in (0, 1]", n.p),
                ));
            }
            if n.token.is_empty() || n.token.len() > 64 {
                return Err(EngineError::invalid(
                    format!("{f}.token"),
                    "a token name has 1 to 64 bytes",
                ));
            }
            let next = names.len() as u32;
            let id = *ids.entry(n.token.clone()).or_insert_with(|| {
                names.push(n.token.clone());
                next
            });
            if row.iter().any(|&(t, _)| t == id) {
                return Err(EngineError::invalid(
                    format!("{f}.token"),
                    format!("`{}` appears twice among siblings", n.token),
                ));
            }
            sum += n.p;
            row.push((id, n.p));
            let mut p = path.clone();
            p.push(id);
            next_todo.push((p, n.children.as_slice(), format!("{f}.children")));
        }
        if (sum - 1.0).abs() > 1e-6 {
            return Err(EngineError::invalid(
                field,
                format!("siblings' probabilities sum to {sum}, not 1"),
            ));
        }
        rows.push((path, row));
        todo.extend(next_todo.into_iter().rev());
    }
    let depth = depth.unwrap_or(0);
    if depth == 0 {
        return Err(EngineError::invalid("tree", "the tree has no tokens"));
    }
    let prompt = names.len() as u32;
    let v = names.len() + 1;
    let mut table = HashMap::new();
    for (path, row) in rows {
        let mut logits = vec![f32::NEG_INFINITY; v];
        for (id, p) in row {
            logits[id as usize] = nextok_core::math::ln_f64(p) as f32;
        }
        let mut ctx = vec![prompt];
        ctx.extend(path);
        table.insert(ctx, logits);
    }
    let source = ScriptedSource::new(table, vec![0.0; v]);
    let cfg = BeamConfig {
        width: req.width,
        length_penalty: 0.0,
        max_tokens: depth,
        eos_token_ids: Vec::new(),
    };
    let scorer = RawScorer {
        eos_token_ids: Vec::new(),
    };
    let mut trace: Vec<BeamProposal> = Vec::new();
    let best = beam_search_traced(source, &[prompt], &cfg, &scorer, &mut trace)
        .map_err(EngineError::model)?;
    let named = |t: &[u32]| -> Vec<String> {
        t.iter()
            .map(|&i| names.get(i as usize).cloned().unwrap_or_default())
            .collect()
    };
    Ok(BeamTreeOutput {
        width: req.width,
        steps: trace
            .iter()
            .map(|p| BeamRow {
                depth: p.depth,
                path: named(&p.tokens),
                joint_prob: nextok_core::math::exp_f64(p.logprob),
                logprob: p.logprob,
                kept: p.kept,
            })
            .collect(),
        best: best
            .iter()
            .map(|h| BeamPath {
                path: named(&h.tokens),
                joint_prob: nextok_core::math::exp_f64(h.logprob),
                logprob: h.logprob,
            })
            .collect(),
    })
}

/// Most requests in a stream schedule.
pub const MAX_STREAM_REQUESTS: usize = 8;
/// Most draws per request.
pub const MAX_STREAM_DRAWS: usize = 16;
/// Most tokens of a stream schedule's vocabulary.
pub const MAX_STREAM_TOKENS: usize = 16;

/// Who owns the random numbers a draw uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ownership {
    /// One list for everyone, consumed in processing order.
    Global,
    /// One list per batch slot: slot `i` uses the `i`-th request's list; a request's slot is
    /// its position in the round's (compacted) batch.
    Slot,
    /// Each request its own list.
    Request,
    /// nextok's own stream: Philox4x32-10 keyed by the request's seed, counter (step, select,
    /// 0), drawn by the sampler's step.
    Philox,
}

/// What happens to the paused request's stream when it continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnResume {
    /// The saved position goes on.
    #[default]
    Resume,
    /// The stream starts again from its initial state (list position 0; Philox step 0).
    Reset,
}

/// One request of a stream schedule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamRequestSpec {
    /// Its name (`A`, `B`, …).
    pub name: String,
    /// Its fixed distribution over the vocabulary (sums to 1).
    pub probs: Vec<f64>,
    /// Its own list of `u` (used by `request` ownership, and as slot lists by `slot`).
    #[serde(default)]
    pub u: Vec<f64>,
    /// Its seed (used by `philox` ownership).
    #[serde(default)]
    pub seed: u64,
}

/// A request whose output budget ends early.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pause {
    /// The request's name.
    pub request: String,
    /// Draws it makes before its budget ends; it continues after the others have finished.
    pub after: usize,
}

/// A stream schedule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamScheduleRequest {
    /// Token names, in id order (the inverse CDF's order).
    pub tokens: Vec<String>,
    /// The requests.
    pub requests: Vec<StreamRequestSpec>,
    /// The global list (used by `global` ownership).
    #[serde(default)]
    pub global_u: Vec<f64>,
    /// Draws per request.
    pub draws: usize,
    /// The processing order of each round, by request name (each a permutation of the names);
    /// rounds past the list use its last order.
    pub orders: Vec<Vec<String>>,
    /// Who owns the random numbers.
    pub ownership: Ownership,
    /// A request whose budget ends early, if any.
    #[serde(default)]
    pub pause: Option<Pause>,
    /// What the paused request's stream does when it continues.
    #[serde(default)]
    pub on_resume: OnResume,
}

/// One draw of the ledger.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StreamDraw {
    /// The round (1-based).
    pub round: usize,
    /// The request's slot in this round's batch.
    pub slot: usize,
    /// The request's name.
    pub request: String,
    /// The request's draw number (1-based).
    pub draw: usize,
    /// Where the number came from: `global`, `slot 0`, `request A`, or `philox seed 1 step 0`.
    pub stream: String,
    /// Position in that list (Philox: the counter's step).
    pub index: usize,
    /// The `u` used (`None` when the list had no more numbers).
    pub u: Option<f64>,
    /// The selected token (`None` when there was no `u`).
    pub token: Option<String>,
    /// Set on the first draw after the paused request continues: `resumed` or `reset`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What [`schedule_streams`] returns.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StreamScheduleOutput {
    /// Every draw, in the order they happened.
    pub draws: Vec<StreamDraw>,
    /// Each request's tokens, by request, in the requests' order (`None`: no `u` left).
    pub outputs: Vec<(String, Vec<Option<String>>)>,
}

/// Runs the schedule (see the module docs).
pub fn schedule_streams(req: &StreamScheduleRequest) -> Result<StreamScheduleOutput> {
    let n = req.requests.len();
    let v = req.tokens.len();
    if v == 0 || v > MAX_STREAM_TOKENS {
        return Err(EngineError::invalid(
            "tokens",
            format!("between 1 and {MAX_STREAM_TOKENS} tokens"),
        ));
    }
    if n == 0 || n > MAX_STREAM_REQUESTS {
        return Err(EngineError::invalid(
            "requests",
            format!("between 1 and {MAX_STREAM_REQUESTS} requests"),
        ));
    }
    if req.draws == 0 || req.draws > MAX_STREAM_DRAWS {
        return Err(EngineError::invalid(
            "draws",
            format!("between 1 and {MAX_STREAM_DRAWS} draws per request"),
        ));
    }
    let check_u = |list: &[f64], field: &str| -> Result<()> {
        if list.len() > 4 * MAX_STREAM_REQUESTS * MAX_STREAM_DRAWS {
            return Err(EngineError::invalid(field, "the list is too long"));
        }
        for (i, &u) in list.iter().enumerate() {
            if !(0.0..1.0).contains(&u) {
                return Err(EngineError::invalid(
                    format!("{field}[{i}]"),
                    format!("{u} is not in [0, 1)"),
                ));
            }
        }
        Ok(())
    };
    check_u(&req.global_u, "global_u")?;
    let mut samplers = Vec::with_capacity(n);
    let mut logits = Vec::with_capacity(n);
    for (i, r) in req.requests.iter().enumerate() {
        if req.requests[..i].iter().any(|o| o.name == r.name) {
            return Err(EngineError::invalid(
                format!("requests[{i}].name"),
                format!("`{}` is used twice", r.name),
            ));
        }
        if r.probs.len() != v {
            return Err(EngineError::invalid(
                format!("requests[{i}].probs"),
                format!("{} probabilities for {v} tokens", r.probs.len()),
            ));
        }
        if r.probs.iter().any(|p| !(0.0..=1.0).contains(p))
            || (r.probs.iter().sum::<f64>() - 1.0).abs() > 1e-6
        {
            return Err(EngineError::invalid(
                format!("requests[{i}].probs"),
                "probabilities in [0, 1] that sum to 1",
            ));
        }
        check_u(&r.u, &format!("requests[{i}].u"))?;
        let vocab = VocabInfo {
            vocab_size: v,
            eos_token_ids: Vec::new(),
            special_token_ids: Vec::new(),
        };
        let sampler = Sampler::from_params(Preset::Reference, &SamplingParams::default(), vocab)
            .map_err(EngineError::core)?;
        samplers.push(sampler);
        logits.push(
            r.probs
                .iter()
                .map(|&p| {
                    if p > 0.0 {
                        nextok_core::math::ln_f64(p) as f32
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect::<Vec<f32>>(),
        );
    }
    let index_of = |name: &str| req.requests.iter().position(|r| r.name == name);
    if req.orders.is_empty() {
        return Err(EngineError::invalid("orders", "at least one round's order"));
    }
    let mut orders = Vec::with_capacity(req.orders.len());
    for (k, o) in req.orders.iter().enumerate() {
        let mut ix = Vec::with_capacity(n);
        for (j, name) in o.iter().enumerate() {
            match index_of(name) {
                Some(i) if !ix.contains(&i) => ix.push(i),
                Some(_) => {
                    return Err(EngineError::invalid(
                        format!("orders[{k}][{j}]"),
                        format!("`{name}` appears twice"),
                    ))
                }
                None => {
                    return Err(EngineError::invalid(
                        format!("orders[{k}][{j}]"),
                        format!("no request `{name}`"),
                    ))
                }
            }
        }
        if ix.len() != n {
            return Err(EngineError::invalid(
                format!("orders[{k}]"),
                "each order names every request once",
            ));
        }
        orders.push(ix);
    }
    let paused = match &req.pause {
        None => None,
        Some(p) => {
            let i = index_of(&p.request).ok_or_else(|| {
                EngineError::invalid("pause.request", format!("no request `{}`", p.request))
            })?;
            if p.after == 0 || p.after >= req.draws {
                return Err(EngineError::invalid(
                    "pause.after",
                    format!("between 1 and {} (fewer than `draws`)", req.draws - 1),
                ));
            }
            Some((i, p.after))
        }
    };

    let mut made = vec![0usize; n]; // draws made per request
    let mut outputs: Vec<Vec<Option<String>>> = vec![Vec::new(); n];
    let mut global_cursor = 0usize;
    let mut slot_cursor = vec![0usize; n];
    let mut req_cursor = vec![0usize; n];
    let mut states = Vec::with_capacity(n);
    for (i, r) in req.requests.iter().enumerate() {
        states.push(
            samplers[i]
                .new_state(&[], r.seed)
                .map_err(EngineError::core)?,
        );
    }
    let mut ws: Vec<_> = samplers.iter().map(|s| s.new_workspace()).collect();
    let mut draws = Vec::new();
    let mut resumed = false;
    let mut pending_note: Option<String> = None;
    // bounded: every round makes at least one draw, and there are n·draws of them
    for round in 1..=n * req.draws {
        let order = &orders[(round - 1).min(orders.len() - 1)];
        // the batch: requests with draws left, not paused (the paused one continues once every
        // other request has finished)
        let others_done = |made: &[usize]| {
            (0..n).all(|i| paused.is_some_and(|(p, _)| p == i) || made[i] >= req.draws)
        };
        let batch: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| made[i] < req.draws)
            .filter(|&i| match paused {
                Some((p, after)) if p == i && made[i] >= after => resumed || others_done(&made),
                _ => true,
            })
            .collect();
        if batch.is_empty() {
            break;
        }
        if let Some((p, after)) = paused {
            if !resumed && made[p] == after && batch.contains(&p) {
                resumed = true;
                let note = match req.on_resume {
                    OnResume::Resume => "resumed",
                    OnResume::Reset => "reset",
                };
                pending_note = Some(note.to_string());
                if req.on_resume == OnResume::Reset {
                    let slot = batch.iter().position(|&i| i == p).unwrap_or(0);
                    match req.ownership {
                        Ownership::Global => global_cursor = 0,
                        Ownership::Slot => slot_cursor[slot] = 0,
                        Ownership::Request => req_cursor[p] = 0,
                        Ownership::Philox => {
                            states[p] = samplers[p]
                                .new_state(&[], req.requests[p].seed)
                                .map_err(EngineError::core)?
                        }
                    }
                }
            }
        }
        for (slot, &i) in batch.iter().enumerate() {
            let note = if paused.is_some_and(|(p, _)| p == i) {
                pending_note.take()
            } else {
                None
            };
            let (stream, index, u, token) = match req.ownership {
                Ownership::Philox => {
                    let step = states[i].step();
                    let r = samplers[i]
                        .step(&logits[i], &mut states[i], &mut ws[i])
                        .map_err(EngineError::core)?;
                    (
                        format!("philox seed {} step {step}", req.requests[i].seed),
                        step as usize,
                        r.u,
                        Some(r.token),
                    )
                }
                own => {
                    let (list, cursor, stream): (&[f64], &mut usize, String) = match own {
                        Ownership::Global => {
                            (&req.global_u, &mut global_cursor, "global".to_string())
                        }
                        Ownership::Slot => (
                            req.requests.get(slot).map_or(&[][..], |r| &r.u[..]),
                            &mut slot_cursor[slot],
                            format!("slot {slot}"),
                        ),
                        _ => (
                            &req.requests[i].u[..],
                            &mut req_cursor[i],
                            format!("request {}", req.requests[i].name),
                        ),
                    };
                    let index = *cursor;
                    let u = list.get(index).copied();
                    if u.is_some() {
                        *cursor += 1;
                    }
                    let token = match u {
                        Some(u) => {
                            let ex = samplers[i]
                                .explain(&logits[i], &states[i], Draw::FixedU(u))
                                .map_err(EngineError::core)?;
                            Some(ex.record.selected)
                        }
                        None => None,
                    };
                    (stream, index, u, token)
                }
            };
            let name = token.and_then(|t| req.tokens.get(t as usize).cloned());
            made[i] += 1;
            outputs[i].push(name.clone());
            draws.push(StreamDraw {
                round,
                slot,
                request: req.requests[i].name.clone(),
                draw: made[i],
                stream,
                index,
                u,
                token: name,
                note,
            });
        }
    }
    Ok(StreamScheduleOutput {
        draws,
        outputs: req
            .requests
            .iter()
            .map(|r| r.name.clone())
            .zip(outputs)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tree() -> serde_json::Value {
        json!([
            {"token": "A", "p": 0.6, "children": [{"token": "x", "p": 0.51}, {"token": "y", "p": 0.49}]},
            {"token": "B", "p": 0.4, "children": [{"token": "x", "p": 0.99}, {"token": "y", "p": 0.01}]}
        ])
    }

    fn beam(width: usize) -> BeamTreeOutput {
        let r: BeamTreeRequest =
            serde_json::from_value(json!({"tree": tree(), "width": width})).unwrap();
        beam_tree(&r).unwrap()
    }

    #[test]
    fn greedy_keeps_a_x_and_width_two_b_x() {
        let g = beam(1);
        assert_eq!(g.best[0].path, ["A", "x"]);
        assert!((g.best[0].joint_prob - 0.306).abs() < 1e-6);
        let kept: Vec<_> = g.steps.iter().filter(|r| r.kept).map(|r| &r.path).collect();
        assert_eq!(kept, [&vec!["A"], &vec!["A", "x"]]);
        let w = beam(2);
        assert_eq!(w.best[0].path, ["B", "x"]);
        assert!((w.best[0].joint_prob - 0.396).abs() < 1e-6);
        let d2: Vec<_> = w.steps.iter().filter(|r| r.depth == 2).collect();
        assert_eq!(d2.len(), 4);
        assert_eq!(d2[0].path, ["B", "x"]);
        assert!(d2[0].kept && d2[1].kept && !d2[2].kept && !d2[3].kept);
    }

    #[test]
    fn bad_trees_name_the_field() {
        let bad = |t: serde_json::Value, w: usize| {
            let r: BeamTreeRequest =
                serde_json::from_value(json!({"tree": t, "width": w})).unwrap();
            beam_tree(&r).unwrap_err().field().unwrap_or("").to_string()
        };
        assert_eq!(bad(tree(), 0), "width");
        assert_eq!(
            bad(
                json!([{"token": "A", "p": 0.6}, {"token": "B", "p": 0.3}]),
                1
            ),
            "tree"
        );
        assert_eq!(bad(json!([{"token": "A", "p": 1.5}]), 1), "tree[0].p");
        assert_eq!(
            bad(
                json!([{"token": "A", "p": 0.5, "children": [{"token": "x", "p": 1.0}]}, {"token": "B", "p": 0.5}]),
                1
            ),
            "tree[1].children"
        );
    }

    fn schedule(
        ownership: &str,
        orders: serde_json::Value,
        pause: Option<(usize, &str)>,
    ) -> StreamScheduleOutput {
        let mut v = json!({
            "tokens": ["x", "y", "z"],
            "requests": [
                {"name": "A", "probs": [0.2, 0.3, 0.5], "u": [0.12, 0.66, 0.23], "seed": 1},
                {"name": "B", "probs": [0.5, 0.25, 0.25], "u": [0.87, 0.49, 0.72], "seed": 2},
                {"name": "C", "probs": [0.1, 0.2, 0.7], "u": [0.34, 0.91, 0.05], "seed": 3}
            ],
            "global_u": [0.12, 0.87, 0.34, 0.66, 0.49, 0.91, 0.23, 0.72, 0.05],
            "draws": 3,
            "orders": orders,
            "ownership": ownership
        });
        if let Some((after, on)) = pause {
            v["pause"] = json!({"request": "B", "after": after});
            v["on_resume"] = json!(on);
        }
        schedule_streams(&serde_json::from_value(v).unwrap()).unwrap()
    }

    fn out(o: &StreamScheduleOutput, name: &str) -> String {
        o.outputs
            .iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
            .iter()
            .map(|t| t.clone().unwrap_or("-".into()))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn per_request_lists_give_002s_draws_in_any_order() {
        for orders in [
            json!([["A", "B", "C"]]),
            json!([["C", "B", "A"], ["B", "A", "C"]]),
        ] {
            for pause in [None, Some((1, "resume")), Some((2, "resume"))] {
                let o = schedule("request", orders.clone(), pause);
                assert_eq!(out(&o, "A"), "x z y");
                assert_eq!(out(&o, "B"), "z x y");
                assert_eq!(out(&o, "C"), "z z x");
            }
        }
    }

    #[test]
    fn the_global_list_matches_in_abc_order_and_diverges_otherwise() {
        let o = schedule("global", json!([["A", "B", "C"]]), None);
        assert_eq!(out(&o, "A"), "x z y");
        assert_eq!(out(&o, "B"), "z x y");
        assert_eq!(out(&o, "C"), "z z x");
        assert_eq!(o.draws[1].u, Some(0.87));
        let o = schedule("global", json!([["C", "B", "A"]]), None);
        // C takes 0.12 → y; B 0.87 → z; A 0.34 → y
        assert_eq!(o.draws[0].request, "C");
        assert_eq!(o.draws[0].token.as_deref(), Some("y"));
        assert_ne!(out(&o, "A"), "x z y");
    }

    #[test]
    fn slots_compact_and_a_reset_replays_the_stream() {
        // B stops after one draw: in round 2 C moves to slot 1 and takes slot 1's list
        let o = schedule("slot", json!([["A", "B", "C"]]), Some((1, "resume")));
        let r2: Vec<_> = o.draws.iter().filter(|d| d.round == 2).collect();
        assert_eq!(r2.len(), 2);
        assert_eq!(
            (r2[1].request.as_str(), r2[1].slot, r2[1].u),
            ("C", 1, Some(0.49))
        );
        // per request: reset replays B's first u
        let o = schedule("request", json!([["A", "B", "C"]]), Some((1, "reset")));
        assert_eq!(out(&o, "B"), "z z x");
        let b: Vec<_> = o.draws.iter().filter(|d| d.request == "B").collect();
        assert_eq!(b[1].note.as_deref(), Some("reset"));
        assert!(b[1].round > 3);
    }

    #[test]
    fn philox_streams_ignore_the_order() {
        let a = schedule("philox", json!([["A", "B", "C"]]), None);
        let b = schedule(
            "philox",
            json!([["C", "A", "B"], ["B", "C", "A"]]),
            Some((1, "resume")),
        );
        assert_eq!(a.outputs, b.outputs);
        let ua: Vec<_> = a
            .draws
            .iter()
            .filter(|d| d.request == "B")
            .map(|d| d.u)
            .collect();
        let ub: Vec<_> = b
            .draws
            .iter()
            .filter(|d| d.request == "B")
            .map(|d| d.u)
            .collect();
        assert_eq!(ua, ub);
        // the u is the core's stream at (seed, step, select)
        let s = nextok_core::RngState::new(2);
        assert_eq!(
            ua[1],
            Some(s.uniform(1, nextok_core::rng::Purpose::Select, 0))
        );
        // a reset starts the stream again at step 0
        let r = schedule("philox", json!([["A", "B", "C"]]), Some((1, "reset")));
        let ur: Vec<_> = r
            .draws
            .iter()
            .filter(|d| d.request == "B")
            .map(|d| d.u)
            .collect();
        assert_eq!(ur[1], ur[0]);
    }

    #[test]
    fn bad_schedules_name_the_field() {
        let bad = |patch: serde_json::Value| {
            let mut v = json!({
                "tokens": ["x", "y"],
                "requests": [{"name": "A", "probs": [0.5, 0.5], "u": [0.1]}],
                "draws": 1, "orders": [["A"]], "ownership": "request"
            });
            for (k, x) in patch.as_object().unwrap() {
                v[k] = x.clone();
            }
            let r: StreamScheduleRequest = serde_json::from_value(v).unwrap();
            schedule_streams(&r)
                .unwrap_err()
                .field()
                .unwrap_or("")
                .to_string()
        };
        assert_eq!(bad(json!({"orders": [["B"]]})), "orders[0][0]");
        assert_eq!(bad(json!({"orders": [[]]})), "orders[0]");
        assert_eq!(bad(json!({"draws": 0})), "draws");
        assert_eq!(bad(json!({"global_u": [1.0]})), "global_u[0]");
        assert_eq!(
            bad(json!({"requests": [{"name": "A", "probs": [0.5]}]})),
            "requests[0].probs"
        );
        assert_eq!(
            bad(json!({"pause": {"request": "A", "after": 1}})),
            "pause.after"
        );
    }
}
