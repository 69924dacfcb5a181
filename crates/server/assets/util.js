// Helpers of the decoding ledger page: calls to the server, number formatting, small DOM
// builders and bars. Nothing here computes a probability: every number comes from the server.

/** An error answered by the server, in OpenAI's shape. */
export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || null;
    this.param = e.param || null;
  }
}

/** POSTs `body` as JSON to `path`; resolves to the parsed answer or rejects with ApiError. */
export async function post(path, body) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), 120000);
  try {
    const r = await fetch(path, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: ctl.signal,
    });
    const text = await r.text();
    let v = null;
    try { v = JSON.parse(text); } catch { v = { error: { message: text } }; }
    if (!r.ok) throw new ApiError(r.status, v);
    return v;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Step requests through `/v1/explain/cases`: one call, one answer per request, each what
 * `/v1/explain` answers for it alone. Resolves to `[{out} | {error}]`: a step the engine refuses
 * (a designed failure such as top-k before the grammar mask) is an ApiError in the list, not a
 * failed request. Rejects only when the call itself fails.
 */
export async function explainCases(reqs) {
  const res = await post("/v1/explain/cases", { cases: reqs });
  return res.cases.map((c) => (c.status === 200 ? { out: c.answer } : { error: new ApiError(c.status, c) }));
}

/** One step request through `explainCases`: resolves to its answer, rejects with its error. */
export async function explainStep(req) {
  const [r] = await explainCases([req]);
  if (r.error) throw r.error;
  return r.out;
}

/** Runs `fn` for the latest call only: earlier answers that arrive late are dropped. */
export function latest(fn) {
  let gen = 0;
  return async (...args) => {
    const mine = ++gen;
    const out = await fn(...args);
    return mine === gen ? out : undefined;
  };
}

const MINUS_INF = "−∞";

/** A value that may be the strings "-inf" / "inf" (nextok's JSON for infinities) or a number. */
export function num(v) {
  if (v === "-inf" || v === "-Infinity") return -Infinity;
  if (v === "inf" || v === "Infinity") return Infinity;
  return typeof v === "number" ? v : Number(v);
}

/** A probability to 4 places. */
export function prob(p) {
  return num(p).toFixed(4);
}

/** A logit or logprob to 3 places; −∞ as such. */
export function logit(z) {
  const v = num(z);
  if (v === -Infinity) return MINUS_INF;
  if (v === Infinity) return "+∞";
  return v.toFixed(3);
}

/** A token name shown with its spaces (·), newlines (↵) and tabs (→) visible. */
export function showToken(name) {
  // a middle dot for a space: every font has it
  return String(name).replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "→");
}

/** Creates an element: `h("td", {class: "n"}, "0.5")`. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "style") Object.assign(el.style, v); // CSSOM: allowed by the page's CSP
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** A horizontal bar of `p ∈ [0, 1]` in `color`. */
export function bar(p, color) {
  const w = Math.max(0, Math.min(1, num(p))) * 100;
  return h("span", { class: "bar", "aria-hidden": "true" },
    h("span", { style: { width: `${w.toFixed(1)}%`, background: color } }));
}

/** A table cell with a probability and its bar. */
export function probCell(p, color, testid) {
  return h("td", { class: "n", "data-testid": testid },
    h("span", { class: "cell-bar" }, bar(p, color), h("span", { text: prob(p) })));
}

/** ✓ / ✗ cell. */
export function yesNo(b) {
  return h("td", { class: b ? "yes" : "no" }, b ? "✓" : "✗", h("span", { class: "word", text: b ? " yes" : " no" }));
}

/** "code: message (field)" for an error. */
export function errorText(e) {
  const bits = [];
  if (e.code) bits.push(e.code);
  let s = e.message;
  if (e.param) s += ` (field: ${e.param})`;
  return bits.length ? `${bits.join(" ")}: ${s}` : s;
}

/** Shows `e` briefly at the bottom of the page. */
export function toast(e) {
  const el = document.getElementById("error-toast");
  el.textContent = errorText(e);
  el.hidden = false;
  clearTimeout(toast.t);
  toast.t = setTimeout(() => { el.hidden = true; }, 6000);
}

/** Binds a range input to its <output>, formatted by `fmt`; calls `on` on input. */
export function slider(id, fmt, on) {
  const input = document.getElementById(id);
  const out = document.getElementById(`${id}-v`);
  const show = () => { out.textContent = fmt(Number(input.value)); };
  input.addEventListener("input", () => { show(); on(); });
  show();
  return {
    get value() { return Number(input.value); },
    set value(v) { input.value = String(v); show(); },
    el: input,
  };
}

/** Calls `fn` at most once per `ms` burst (the last call wins). */
export function debounce(fn, ms) {
  let t = null;
  return (...args) => {
    clearTimeout(t);
    t = setTimeout(() => fn(...args), ms);
  };
}

/** The stages of a step record as "raw 6 → mask 1 → …" boxes. */
export function stages(el, record) {
  el.replaceChildren();
  const st = (record && record.stages) || [];
  el.append(h("span", { class: "label", text: "Support size after each stage:" }));
  st.forEach((s, i) => {
    if (i > 0) el.append(h("span", { class: "arrow", "aria-hidden": "true", text: "→" }));
    el.append(h("span", { class: "stage", "data-stage": s.stage },
      `${s.stage.replace(/_/g, " ")} `, h("b", { text: s.support_size })));
  });
}
