// The decoding ledger page: five sections, each drawing what nextok answers.
//  1. the distribution ledger      POST /v1/explain/cases (a step request: logits given as data)
//  2. constraints                  POST /v1/explain/cases (the same vocabulary, four fixed cases)
//  3. beam search                  POST /v1/explain/beam
//  4. random streams               POST /v1/explain/streams
//  5. the real model               POST /v1/explain (a prompt: the model's next step)

import {
  post, explainCases, explainStep, latest, prob, logit, num, showToken, h, probCell, yesNo, errorText, toast, slider,
  debounce, stages,
} from "./util.js";

const COLORS = {
  raw: "var(--bar-raw)", proc: "var(--bar-proc)", kept: "var(--bar-kept)", final: "var(--bar-final)",
};

// ---------------------------------------------------------------- 1. the distribution ledger

/** The page's vocabularies (the seeds' data: 002 §01, 004's six tokens, 000 §3.9). */
const VOCABS = {
  teach: {
    tokens: ['{"ok":', "true", "false", "}", "<eos>", " "],
    logits: [1.0, 2.0, 0.5, 0.3, 3.0, 2.5],
    eos: [4], special: [4], constraint: true, prefix: [],
    defaults: { temp: 1, topk: 0, topp: 1, u: 0.5 },
  },
  six: {
    tokens: ["A", "B", "C", "D", "E", "F"],
    logits: [-0.584705, -1.584843, -2.084736, -2.585346, -3.583828, -4.57845],
    eos: [], special: [], constraint: false, prefix: [],
    defaults: { temp: 1, topk: 0, topp: 1, u: 0.5 },
  },
  hand: {
    tokens: ["A", "B", "C"],
    logits: [2.0, 1.5, 0.5],
    eos: [], special: [], constraint: false, prefix: [0, 0, 1],
    params: { presence_penalty: 0.1, frequency_penalty: 0.2 },
    defaults: { temp: 0.8, topk: 0, topp: 0.8, u: 0.63 },
  },
};

const CHOICES = ['{"ok":true}', '{"ok":false}'];

const dist = {
  vocab: "teach",
  prefix: [],
  last: null,
};

const $ = (id) => document.getElementById(id);

let temp, topk, topp, u;

function distRequest(v) {
  const params = { ...(v.params || {}) };
  params.temperature = temp.value;
  if (topk.value > 0) params.top_k = topk.value;
  if (topp.value < 1) params.top_p = topp.value;
  if (v.constraint && $("constraint").checked) {
    params.constraint = { type: "choice", choices: CHOICES };
  }
  return {
    logits: v.logits,
    tokens: v.tokens,
    eos_token_ids: v.eos,
    special_token_ids: v.special,
    pipeline: "reference",
    params,
    selected_ids: dist.prefix,
    selector: { u: u.value },
  };
}

/** The processors of `pipeline` in the order the control asks for, or an explanation why not. */
function reorder(pipeline, order) {
  const ps = pipeline.processors.slice();
  const at = (t) => ps.findIndex((p) => p.type === t);
  if (order === "p_then_k") {
    const k = at("top_k"), p = at("top_p");
    if (k < 0 || p < 0) return { why: "set both top-k and top-p to see their order matter" };
    [ps[k], ps[p]] = [ps[p], ps[k]];
  } else if (order === "k_before_mask") {
    const k = at("top_k"), m = at("grammar_mask");
    if (k < 0 || m < 0) return { why: "set top-k and turn the constraint on to see this order" };
    const [tk] = ps.splice(k, 1);
    ps.splice(m, 0, tk);
  }
  return { pipeline: { ...pipeline, processors: ps } };
}

const runDist = latest(async () => {
  const v = VOCABS[dist.vocab];
  const req = distRequest(v);
  const order = $("order").value;
  let note = null;
  try {
    let out = await explainStep(req);
    if (order !== "reference") {
      const r = reorder(out.pipeline, order);
      if (r.why) {
        note = r.why;
      } else {
        const custom = { ...req, pipeline: r.pipeline, params: req.params.constraint ? { constraint: req.params.constraint } : {} };
        out = await explainStep(custom);
      }
    }
    return { out, note };
  } catch (e) {
    return { error: e, note };
  }
});

function renderPrefix() {
  const v = VOCABS[dist.vocab];
  const el = $("prefix");
  el.replaceChildren();
  if (!dist.prefix.length) el.append(h("span", { class: "muted", text: "(empty)" }));
  dist.prefix.forEach((id, i) => {
    el.append(h("button", {
      type: "button", class: "chip", "data-testid": "prefix-chip",
      title: "Step back to before this token",
      "aria-label": `Step back to before token ${i + 1}, ${v.tokens[id]}`,
      onclick: () => { dist.prefix = dist.prefix.slice(0, i); refreshDist(); },
    }, showToken(v.tokens[id])));
  });
}

function layerChart(title, rows, value, color, testid) {
  return h("div", { class: "layer", "data-testid": testid },
    h("h4", { text: title }),
    rows.map((r) => h("div", { class: "row" },
      h("span", { class: "name", text: showToken(r.token) }),
      h("span", { class: "track", "aria-hidden": "true" },
        h("span", { style: { width: `${(Math.max(0, Math.min(1, value(r))) * 100).toFixed(1)}%`, background: color } })),
      h("span", { class: "v", text: prob(value(r)) }))));
}

function renderDist(res) {
  const tbody = $("dist-table").querySelector("tbody");
  const sum = $("dist-summary");
  tbody.replaceChildren();
  sum.replaceChildren();
  $("dist-layers").replaceChildren();
  $("dist-stages").replaceChildren();
  if (res.note) sum.append(h("span", { class: "item note", "data-testid": "order-note", text: `Order unchanged: ${res.note}.` }));
  if (res.error) {
    dist.last = null;
    $("prefix-accept").disabled = true;
    sum.append(h("span", { class: "item error", "data-testid": "dist-error", text: `Error — ${errorText(res.error)}` }));
    return;
  }
  const out = res.out;
  dist.last = out;
  $("prefix-accept").disabled = false;
  const rows = out.tokens;
  // the greedy candidate: the highest final probability (ties → the lower id), as nextok ranks
  let greedy = null;
  for (const r of rows) {
    if (r.kept && (greedy === null || r.selection_prob > greedy.selection_prob)) greedy = r;
  }
  sum.append(
    h("span", { class: "item" }, "Greedy candidate: ", h("b", { "data-testid": "greedy", text: greedy ? showToken(greedy.token) : "—" })),
    h("span", { class: "item" }, "Selected by u = ", h("b", { text: out.u === null || out.u === undefined ? "—" : num(out.u).toFixed(3) }), ": ",
      h("b", { "data-testid": "selected", text: showToken(out.selected_token) })),
    h("span", { class: "item" }, "Support size: ", h("b", { "data-testid": "support-size", text: out.support.length })),
    h("span", { class: "item" }, "Pipeline: ", h("b", { "data-testid": "pipeline-order", text: out.pipeline.processors.map((p) => p.type).join(" → ") })),
  );
  stages($("dist-stages"), out.record);
  for (const r of rows) {
    const masked = num(r.processed_logit) === -Infinity;
    const tr = h("tr", {
      "data-token": r.token,
      class: [r.selected ? "selected" : "", greedy && r.id === greedy.id ? "greedy" : ""].join(" ").trim() || null,
    },
    h("td", { class: "tok", text: showToken(r.token) }),
    h("td", { class: "n", "data-testid": "logit" }, logit(r.raw_logit),
      masked ? h("span", { class: "minus-inf", title: "processed logit" }, " → −∞") : null),
    yesNo(r.allowed),
    probCell(r.initial_prob, COLORS.proc, "initial"),
    yesNo(r.kept),
    probCell(r.selection_prob, COLORS.final, "final"));
    tbody.append(tr);
  }
  $("dist-layers").append(
    layerChart("Raw (softmax of the logits)", rows, (r) => Math.exp(num(r.raw_logprob)), COLORS.raw, "layer-raw"),
    layerChart("Processed (masks, penalties, temperature)", rows, (r) => r.initial_prob, COLORS.proc, "layer-processed"),
    layerChart("Candidate support (kept, before renormalising)", rows, (r) => (r.kept ? r.initial_prob : 0), COLORS.kept, "layer-support"),
    layerChart("Selection (renormalised over the support)", rows, (r) => r.selection_prob, COLORS.final, "layer-selection"),
  );
}

async function refreshDist() {
  renderPrefix();
  const res = await runDist();
  if (res) renderDist(res);
}
const refreshDistSoon = debounce(refreshDist, 60);

function setVocab(name, keepSliders = false) {
  dist.vocab = name;
  const v = VOCABS[name];
  $("vocab").value = name;
  dist.prefix = v.prefix.slice();
  topk.el.max = String(v.tokens.length);
  if (!keepSliders) {
    temp.value = v.defaults.temp; topk.value = v.defaults.topk; topp.value = v.defaults.topp; u.value = v.defaults.u;
  }
  $("constraint").disabled = !v.constraint;
  $("constraint").closest("label").classList.toggle("muted", !v.constraint);
}

function initDistribution() {
  temp = slider("temp", (x) => x.toFixed(2), refreshDistSoon);
  topk = slider("topk", (x) => (x === 0 ? "off" : String(x)), refreshDistSoon);
  topp = slider("topp", (x) => (x >= 1 ? "off (1.00)" : x.toFixed(2)), refreshDistSoon);
  u = slider("u", (x) => x.toFixed(3), refreshDistSoon);
  $("vocab").addEventListener("change", () => { setVocab($("vocab").value); $("order").value = "reference"; refreshDist(); });
  $("order").addEventListener("change", refreshDist);
  $("constraint").addEventListener("change", () => { dist.prefix = []; refreshDist(); });
  $("prefix-accept").addEventListener("click", () => {
    if (dist.last) { dist.prefix = [...dist.prefix, dist.last.selected]; refreshDist(); }
  });
  $("prefix-clear").addEventListener("click", () => { dist.prefix = []; refreshDist(); });
  const preset004 = (order) => {
    setVocab("six");
    topk.value = 2; topp.value = 0.6;
    $("order").value = order;
    refreshDist();
  };
  $("preset-kp").addEventListener("click", () => preset004("reference"));
  $("preset-pk").addEventListener("click", () => preset004("p_then_k"));
  $("preset-hand").addEventListener("click", () => { setVocab("hand"); $("order").value = "reference"; refreshDist(); });
  setVocab("teach");
  refreshDist();
}

// ---------------------------------------------------------------- 2. constraints

function teachRequest(extra) {
  const v = VOCABS.teach;
  return {
    logits: v.logits, tokens: v.tokens, eos_token_ids: v.eos, special_token_ids: v.special,
    params: { constraint: { type: "choice", choices: CHOICES } },
    selector: { u: 0.5 },
    ...extra,
  };
}

const CON_CASES = [
  { name: "Empty prefix: only the opening may start", req: teachRequest({}) },
  { name: 'After {"ok": only true or false, renormalised', req: teachRequest({ selected_ids: [0], selector: { u: 0.9 } }) },
  { name: "After a complete object only EOS", req: teachRequest({ selected_ids: [0, 2, 3] }) },
  {
    name: "Top-k 1 before the grammar mask: nothing legal is left",
    req: teachRequest({
      pipeline: { format_version: 1, processors: [{ type: "top_k", top_k: 1 }, { type: "grammar_mask" }], selector: { type: "categorical" } },
    }),
  },
];

async function initConstraints() {
  const tbody = $("con-table").querySelector("tbody");
  const v = VOCABS.teach;
  // one call: each case is answered as /v1/explain answers it, the designed failure included
  let results;
  try {
    results = await explainCases(CON_CASES.map((c) => c.req));
  } catch (error) {
    results = CON_CASES.map(() => ({ error }));
  }
  tbody.replaceChildren();
  CON_CASES.forEach((c, i) => {
    const r = results[i];
    const prefix = (c.req.selected_ids || []).map((id) => v.tokens[id]).join("") || "(empty)";
    let allowed, support;
    if (r.error) {
      allowed = h("td", { text: "—" });
      support = h("td", { class: "error", "data-testid": "con-error", text: `Error — ${errorText(r.error)}` });
    } else {
      const out = r.out;
      allowed = h("td", { class: "tok", text: out.tokens.filter((t) => t.allowed).map((t) => showToken(t.token)).join("  ") });
      support = h("td", { "data-testid": "con-support" },
        out.tokens.filter((t) => t.kept).map((t) => `${showToken(t.token)} ${prob(t.selection_prob)}`).join(", "),
        h("br"), "selected: ", h("b", { class: "mono", text: showToken(out.selected_token) }));
    }
    tbody.append(h("tr", { "data-case": String(i) },
      h("td", { text: c.name }), h("td", { class: "tok", text: prefix }), allowed, support));
  });
}

// ---------------------------------------------------------------- 3. beam search

const TREE = [
  { token: "A", p: 0.6, children: [{ token: "x", p: 0.51 }, { token: "y", p: 0.49 }] },
  { token: "B", p: 0.4, children: [{ token: "x", p: 0.99 }, { token: "y", p: 0.01 }] },
];

const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs = {}, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function drawTree(out) {
  const svg = $("beam-svg");
  [...svg.querySelectorAll(":scope > :not(title)")].forEach((n) => n.remove());
  const kept = new Set(out.steps.filter((r) => r.kept).map((r) => r.path.join("·")));
  const best = out.best.length ? out.best[0].path : [];
  const bestKeys = new Set(best.map((_, i) => best.slice(0, i + 1).join("·")));
  const joint = new Map(out.steps.map((r) => [r.path.join("·"), r.joint_prob]));
  // leaves top to bottom, depth left to right
  const leaves = [];
  const walk = (nodes, path) => nodes.forEach((n) => {
    const p = [...path, n.token];
    if (n.children && n.children.length) walk(n.children, p); else leaves.push(p.join("·"));
  });
  walk(TREE, []);
  const depth = Math.max(...leaves.map((l) => l.split("·").length));
  const W = 420, H = 230, x0 = 24, dx = (W - 140) / depth;
  const ys = new Map();
  leaves.forEach((l, i) => ys.set(l, 22 + (i * (H - 44)) / Math.max(1, leaves.length - 1)));
  const yOf = (key) => {
    if (ys.has(key)) return ys.get(key);
    const kids = leaves.filter((l) => l.startsWith(`${key}·`)).map((l) => ys.get(l));
    const y = kids.reduce((a, b) => a + b, 0) / kids.length;
    ys.set(key, y);
    return y;
  };
  const edges = s("g"), nodes = s("g");
  const root = { x: x0, y: H / 2 };
  nodes.append(s("circle", { cx: root.x, cy: root.y, r: 7 }));
  const place = (list, path, px, py) => list.forEach((n) => {
    const p = [...path, n.token];
    const key = p.join("·");
    const x = x0 + p.length * dx, y = yOf(key);
    const cls = `edge${kept.has(key) ? " kept" : ""}${bestKeys.has(key) ? " best" : ""}`;
    edges.append(s("line", { x1: px, y1: py, x2: x, y2: y, class: cls }));
    edges.append(s("text", { x: (px + x) / 2, y: (py + y) / 2 - 5, class: "p", "text-anchor": "middle" }, n.p.toFixed(2)));
    nodes.append(s("circle", { cx: x, cy: y, r: 7, class: kept.has(key) ? "kept" : "" }));
    nodes.append(s("text", { x: x - 4, y: y - 11 }, n.token));
    if (n.children && n.children.length) place(n.children, p, x, y);
    else if (joint.has(key)) nodes.append(s("text", { x: x + 12, y: y + 4, class: "joint" }, `${key} ${prob(joint.get(key))}`));
    else nodes.append(s("text", { x: x + 12, y: y + 4, class: "joint p" }, `${key} —`));
  });
  place(TREE, [], root.x, root.y);
  svg.append(edges, nodes);
}

const runBeam = latest((width) => post("/v1/explain/beam", { tree: TREE, width }).then((out) => ({ out }), (error) => ({ error })));

async function refreshBeam(width) {
  const res = await runBeam(width);
  if (!res) return;
  const tbody = $("beam-table").querySelector("tbody");
  const best = $("beam-best");
  tbody.replaceChildren();
  best.replaceChildren();
  if (res.error) { best.append(h("span", { class: "error", text: errorText(res.error) })); return; }
  const out = res.out;
  for (const r of out.steps) {
    tbody.append(h("tr", { "data-path": r.path.join("·") },
      h("td", { class: "n", text: r.depth }),
      h("td", { class: "tok", text: r.path.join("·") }),
      h("td", { class: "n", "data-testid": "joint", text: prob(r.joint_prob) }),
      yesNo(r.kept)));
  }
  const b = out.best[0];
  best.append(h("span", { class: "item" }, `Best complete sequence at width ${out.width}: `,
    h("b", { "data-testid": "beam-best-path", text: b.path.join("·") }), ", joint probability ",
    h("b", { "data-testid": "beam-best-prob", text: b.joint_prob.toFixed(3) })));
  if (out.width === 1) best.append(h("span", { class: "item note", text: "Width 1 is greedy: it commits to A (0.6) and never sees B·x." }));
  drawTree(out);
}

function initBeam() {
  const w = slider("beam-width", (x) => String(x), () => refreshBeam(w.value));
  refreshBeam(w.value);
}

// ---------------------------------------------------------------- 4. random streams

const STREAM_REQS = [
  { name: "A", probs: [0.2, 0.3, 0.5], u: [0.12, 0.66, 0.23], seed: 1 },
  { name: "B", probs: [0.5, 0.25, 0.25], u: [0.87, 0.49, 0.72], seed: 2 },
  { name: "C", probs: [0.1, 0.2, 0.7], u: [0.34, 0.91, 0.05], seed: 3 },
];
const GLOBAL_U = [0.12, 0.87, 0.34, 0.66, 0.49, 0.91, 0.23, 0.72, 0.05];
const PERMS = ["ABC", "ACB", "BAC", "BCA", "CAB", "CBA"];

function streamBody(ownership, orders, pause, onResume) {
  const body = {
    tokens: ["x", "y", "z"], requests: STREAM_REQS, global_u: GLOBAL_U, draws: 3,
    orders: orders.map((o) => o.split("")), ownership, on_resume: onResume,
  };
  if (pause > 0) body.pause = { request: "B", after: pause };
  return body;
}

function streamControls() {
  return {
    own: document.querySelector('input[name="own"]:checked').value,
    orders: [$("ord1").value, $("ord2").value, $("ord3").value],
    pause: Number($("pause").value),
    onResume: $("onresume").value,
  };
}

function outputsOf(out) {
  return new Map(out.outputs.map(([name, toks]) => [name, toks.map((t) => t ?? "—")]));
}

function renderDraws(tbody, out) {
  tbody.replaceChildren();
  let round = 0;
  for (const d of out.draws) {
    const tr = h("tr", { "data-request": d.request, class: d.round !== round && round !== 0 ? "round-start" : null },
      h("td", { class: "n", text: d.round }),
      h("td", { class: "n", text: d.slot }),
      h("td", { text: d.request }),
      h("td", { class: "n", text: d.draw }),
      h("td", { class: "mono" }, d.stream, d.note ? h("span", { class: "note", text: ` (${d.note})` }) : null),
      h("td", { class: "n", "data-testid": "draw-u", text: d.u === null ? "list exhausted" : (Number.isInteger(d.u * 100) ? d.u.toFixed(2) : d.u.toFixed(4)) }),
      h("td", { class: "tok", "data-testid": "draw-token", text: d.token ?? "—" }));
    round = d.round;
    tbody.append(tr);
  }
}

function renderOutputs(el, out, base, baseLabel) {
  el.replaceChildren();
  const mine = outputsOf(out), ref = outputsOf(base);
  for (const [name, toks] of mine) {
    const r = ref.get(name) || [];
    const same = toks.join(" ") === r.join(" ");
    el.append(h("span", { class: "item", "data-testid": `out-${name}` },
      `${name} → `,
      toks.map((t, i) => h("b", { class: t !== r[i] ? "diff" : null, text: `${t} ` })),
      h("span", { class: same ? "yes" : "no", "data-testid": `same-${name}`, text: same ? `same as ${baseLabel}` : `differs from ${baseLabel}` })));
  }
}

const runStreams = latest(async (c) => {
  try {
    const [out, base, ph, phBase] = await Promise.all([
      post("/v1/explain/streams", streamBody(c.own, c.orders, c.pause, c.onResume)),
      post("/v1/explain/streams", streamBody("request", ["ABC"], 0, "resume")),
      post("/v1/explain/streams", streamBody("philox", c.orders, c.pause, c.onResume)),
      post("/v1/explain/streams", streamBody("philox", ["ABC"], 0, "resume")),
    ]);
    return { out, base, ph, phBase };
  } catch (error) {
    return { error };
  }
});

async function refreshStreams() {
  const res = await runStreams(streamControls());
  if (!res) return;
  if (res.error) { $("streams-out").replaceChildren(h("span", { class: "error", text: errorText(res.error) })); return; }
  renderOutputs($("streams-out"), res.out, res.base, "its own list");
  renderDraws($("streams-table").querySelector("tbody"), res.out);
  renderOutputs($("philox-out"), res.ph, res.phBase, "in A-B-C order");
  renderDraws($("philox-table").querySelector("tbody"), res.ph);
}

function initStreams() {
  const spec = $("streams-spec").querySelector("tbody");
  for (const r of STREAM_REQS) {
    spec.append(h("tr", {}, h("td", { text: r.name }), h("td", { class: "n", text: r.probs.map((p) => p.toFixed(2)).join(", ") }),
      h("td", { class: "n", text: r.u.map((x) => x.toFixed(2)).join(", ") })));
  }
  $("global-list").textContent = `Global list: ${GLOBAL_U.map((x) => x.toFixed(2)).join(", ")}. Per slot, slots 0/1/2 use the lists of A/B/C; when a request leaves, the batch compacts and the requests after it move up a slot.`;
  for (const id of ["ord1", "ord2", "ord3"]) {
    const sel = $(id);
    for (const p of PERMS) sel.append(h("option", { value: p, text: p.split("").join(" → ") }));
  }
  document.querySelectorAll("#stream-controls input, #stream-controls select").forEach((el) => el.addEventListener("change", refreshStreams));
  refreshStreams();
}

// ---------------------------------------------------------------- 5. the real model

const model = { accepted: [], last: null, ended: null };

function modelBody() {
  const body = {
    temperature: Number($("m-temp").value),
    top_p: Number($("m-topp").value),
    seed: Math.max(0, Math.floor(Number($("m-seed").value) || 0)),
  };
  const k = Number($("m-topk").value);
  if (k > 0) body.top_k = k;
  const con = $("m-con").value;
  const text = $("m-con-text").value;
  if (con === "choice") {
    body.structured_outputs = { choice: text.split("\n").map((x) => x.trim()).filter(Boolean) };
  } else if (con === "schema") {
    let schema;
    try { schema = JSON.parse(text); } catch (e) { throw new Error(`the JSON schema is not JSON: ${e.message}`); }
    body.structured_outputs = { json: schema };
  }
  if ($("m-mode").value === "chat") {
    body.messages = [{ role: "user", content: $("m-prompt").value }];
  } else {
    body.prompt = $("m-prompt").value;
  }
  // the output so far: the model reads it after the prompt, the sampler has committed it
  body.accepted = model.accepted.map((a) => a.id);
  return body;
}

function renderAccepted() {
  const el = $("m-accepted");
  el.replaceChildren();
  if (!model.accepted.length) { el.textContent = "none yet"; return; }
  model.accepted.forEach((a) => el.append(h("span", { class: "chip", "data-testid": "accepted-chip", title: `id ${a.id}` }, showToken(a.name))));
}

const runModel = latest(async (body) => post("/v1/explain", body).then((out) => ({ out }), (error) => ({ error })));

async function refreshModel() {
  const sum = $("m-summary");
  let body;
  try { body = modelBody(); } catch (e) { sum.replaceChildren(h("span", { class: "error", text: e.message })); return; }
  $("m-run").disabled = true;
  sum.replaceChildren(h("span", { class: "item note", text: "The model is computing the step…" }));
  const res = await runModel(body);
  $("m-run").disabled = false;
  if (!res) return;
  const tbody = $("m-table").querySelector("tbody");
  tbody.replaceChildren();
  sum.replaceChildren();
  $("m-stages").replaceChildren();
  if (res.error) {
    model.last = null;
    $("m-accept").disabled = true;
    sum.append(h("span", { class: "error", "data-testid": "m-error", text: `Error — ${errorText(res.error)}` }));
    return;
  }
  const out = res.out;
  model.last = out;
  $("m-accept").disabled = false;
  const fin = out.selected_finishes;
  $("m-accept").textContent = fin ? `Accept the selected token (it ends the sequence: ${fin.reason.replace(/_/g, " ")})` : "Accept the selected token";
  sum.append(
    h("span", { class: "item" }, "Prompt tokens: ", h("b", { "data-testid": "m-prompt-tokens", text: out.prompt_tokens })),
    h("span", { class: "item" }, "Step: ", h("b", { "data-testid": "m-step", text: out.record.step })),
    h("span", { class: "item" }, "Seed: ", h("b", { text: out.seed })),
    h("span", { class: "item" }, "u = ", h("b", { "data-testid": "m-u", text: out.u === null || out.u === undefined ? "— (greedy)" : num(out.u).toFixed(4) })),
    h("span", { class: "item" }, "Selected: ", h("b", { "data-testid": "m-selected", "data-id": out.selected, text: `${showToken(out.selected_token)} (id ${out.selected})` })),
    h("span", { class: "item" }, "Support: ", h("b", { "data-testid": "m-support-size", text: out.support.length }), " of 49,152-token vocabulary"),
  );
  stages($("m-stages"), out.record);
  let outsideHeader = false;
  for (const r of out.tokens) {
    if (!r.kept && !outsideHeader) {
      outsideHeader = true;
      tbody.append(h("tr", { class: "outside" }, h("td", { colspan: "7", text: "Best tokens outside the support, by raw logit:" })));
    }
    tbody.append(h("tr", { class: [r.selected ? "selected" : "", r.kept ? "" : "outside"].join(" ").trim() || null, "data-id": r.id },
      h("td", { class: "tok", text: showToken(r.token) }),
      h("td", { class: "n", text: r.id }),
      h("td", { class: "n" }, logit(r.raw_logit), num(r.processed_logit) === -Infinity ? h("span", { class: "minus-inf" }, " → −∞") : null),
      yesNo(r.allowed),
      probCell(r.initial_prob, COLORS.proc, "m-initial"),
      yesNo(r.kept),
      probCell(r.selection_prob, COLORS.final, "m-final")));
  }
  $("m-record").textContent = JSON.stringify(out.record, null, 2);
}

function initModel() {
  slider("m-temp", (x) => (x === 0 ? "0 (greedy)" : x.toFixed(2)), () => {});
  slider("m-topk", (x) => (x === 0 ? "off" : String(x)), () => {});
  slider("m-topp", (x) => (x >= 1 ? "off (1.00)" : x.toFixed(2)), () => {});
  $("m-con").addEventListener("change", () => {
    const c = $("m-con").value;
    $("m-con-box").hidden = c === "none";
    if (c === "choice") $("m-con-text").value = "Paris\nLyon\nMarseille";
    if (c === "schema") $("m-con-text").value = JSON.stringify({ type: "object", properties: { city: { type: "string" } }, required: ["city"] }, null, 1);
  });
  $("m-run").addEventListener("click", refreshModel);
  const restart = () => { model.accepted = []; model.ended = null; renderAccepted(); };
  $("m-reset").addEventListener("click", () => { restart(); refreshModel(); });
  $("m-prompt").addEventListener("change", restart);
  $("m-mode").addEventListener("change", restart);
  $("m-con").addEventListener("change", restart);
  $("m-con-text").addEventListener("change", restart);
  $("m-accept").addEventListener("click", () => {
    if (!model.last) return;
    model.accepted.push({ id: model.last.selected, name: model.last.selected_token });
    $("m-accept").disabled = true;
    renderAccepted();
    const fin = model.last.selected_finishes;
    if (fin) {
      // nothing comes after the last token: show the end instead of asking for a next step
      model.ended = fin;
      $("m-accept").textContent = "Accept the selected token";
      $("m-summary").replaceChildren(h("span", { class: "item", "data-testid": "m-ended" },
        "The sequence has ended: ", h("b", { text: fin.reason.replace(/_/g, " ") }), ". Start again from the prompt to explore another path."));
      $("m-table").querySelector("tbody").replaceChildren();
      $("m-stages").replaceChildren();
      return;
    }
    refreshModel();
  });
  $("m-record-toggle").addEventListener("click", () => {
    const pre = $("m-record");
    pre.hidden = !pre.hidden;
    $("m-record-toggle").setAttribute("aria-expanded", String(!pre.hidden));
    $("m-record-toggle").textContent = pre.hidden ? "Show the step's trace record" : "Hide the step's trace record";
  });
  renderAccepted();
  refreshModel();
}

// ---------------------------------------------------------------- start

window.addEventListener("unhandledrejection", (ev) => toast(ev.reason || new Error("unknown error")));
initDistribution();
initConstraints();
initBeam();
initStreams();
initModel();
document.body.dataset.ready = "1";
