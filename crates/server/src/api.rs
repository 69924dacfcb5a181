//! From an OpenAI request body to the engine's [`GenerateRequest`]: OpenAI's parameter names and
//! meanings, vLLM's extra parameters and structured outputs, and nextok's own options under a
//! `nextok` object (or as `nextok_*` fields). Every invalid field is an [`ApiError`] naming it.

use std::collections::BTreeMap;

use nextok_constraint::{PropertyOrder, SchemaMode};
use nextok_core::pipeline::resolve::{self, resolve};
use nextok_core::pipeline::GrammarPolicy;
use nextok_core::{Layer, PipelineConfig, Preset, SamplingParams};
use nextok_engine::speculative::{Acceptance, SpecOptions};
use nextok_engine::{ConstraintSpec, GenerateRequest, LogprobOptions, PipelineChoice, Prompt};
use nextok_model::chat::Message;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
}

/// Candidates every trace record keeps.
pub const TRACE_CANDIDATES: usize = 8;

/// A parsed generation request.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The `model` field, if given.
    pub model: Option<String>,
    /// What the engine runs.
    pub gen: GenerateRequest,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Whether logprobs were asked for (chat `logprobs: true`, completions `logprobs: N`).
    pub logprobs: bool,
    /// The layer logprobs come from.
    pub layer: Layer,
    /// `nextok.trace`.
    pub trace: bool,
    /// `nextok.trace_logits`: the trace stores every step's raw logits.
    pub trace_logits: bool,
    /// The pipeline's source, as the trace header records it (a preset name or `inline`).
    pub pipeline_source: String,
    /// The request field the constraint came from.
    pub constraint_param: String,
    /// The request field `max_tokens` came from.
    pub max_tokens_param: &'static str,
    /// How the request named nextok's options: `nextok.` or `nextok_`.
    pub nextok_prefix: &'static str,
    /// `nextok.speculative` when the request set it (`Some(None)`: `"off"`); else the
    /// server's default applies.
    pub speculative: Option<Option<SpecOptions>>,
    /// `nextok.resume`: the answer continues one that was cut off.
    pub resume: Option<Resume>,
}

/// `nextok.resume`: continue an answer that was cut off (its connection, or the replica that
/// served it, lost) from the token ids its sequences had produced. With the first answer's
/// `seed` (the request's `seed` field), the continuation is exactly what the uninterrupted
/// answer would have sent after those tokens: a stream sends no role chunk and no text for the
/// resumed tokens, keeps the first answer's `id` and `created` when given, and counts the
/// resumed tokens in `usage.completion_tokens`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// Each sequence's token ids so far (`n` lists).
    pub tokens: Vec<Vec<u32>>,
    /// The first answer's `id`.
    #[serde(default)]
    pub id: Option<String>,
    /// The first answer's `created`.
    #[serde(default)]
    pub created: Option<u64>,
    /// Sequences whose end (`finish_reason`) the client already received: it is not sent
    /// again.
    #[serde(default)]
    pub finished: Vec<usize>,
}

impl ApiRequest {
    /// The request's name for an engine field.
    pub fn param(&self, field: &str) -> String {
        let head = field.split(['[', '.']).next().unwrap_or(field);
        if head == "processors" {
            // a processor of the pipeline: a preset's is built from the request's parameters
            // (`processors[1].logit_bias[9]` is `logit_bias[9]`); an inline one is the
            // request's own pipeline
            return match (&self.gen.pipeline, field.split_once("].")) {
                (PipelineChoice::Preset(_), Some((_, param))) => param.to_string(),
                _ => format!("{}pipeline.{field}", self.nextok_prefix),
            };
        }
        let rest = &field[head.len()..];
        let renamed = match (head, self.endpoint) {
            ("constraint", _) => self.constraint_param.clone(),
            ("max_tokens", _) => self.max_tokens_param.to_string(),
            ("prompt", Endpoint::Chat) => "messages".to_string(),
            ("top_logprobs", Endpoint::Completions) => "logprobs".to_string(),
            ("pipeline", _) => format!("{}pipeline", self.nextok_prefix),
            ("grammar_policy", _) => format!("{}grammar_policy", self.nextok_prefix),
            ("trace_logits", _) => format!("{}trace_logits", self.nextok_prefix),
            // the options as a whole came from one string
            ("speculative", _) => return format!("{}speculative", self.nextok_prefix),
            ("resume", _) => format!("{}resume.tokens", self.nextok_prefix),
            _ => head.to_string(),
        };
        format!("{renamed}{rest}")
    }
}

const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "stream",
    "stream_options",
    "user",
    "response_format",
    // vLLM
    "top_k",
    "min_p",
    "typical_p",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    // nextok
    "nextok",
    "nextok_pipeline",
    "nextok_logprob_layer",
    "nextok_grammar_policy",
    "nextok_trace",
    "nextok_trace_logits",
    "nextok_speculative",
    "nextok_spec_acceptance",
    "nextok_schema_mode",
    "nextok_property_order",
    "nextok_resume",
];
const CHAT_ONLY: &[&str] = &["messages", "max_completion_tokens", "top_logprobs"];
const COMPLETIONS_ONLY: &[&str] = &["prompt", "echo", "suffix", "best_of"];

/// A body's fields, read one at a time, each error naming its field.
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    /// The fields of `obj`.
    pub fn new(obj: &'a Map<String, Value>) -> Fields<'a> {
        Fields { obj }
    }

    /// Field `key` as `T` (`null` and absence are `None`).
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ApiError> {
        get(self.obj, key, key)
    }

    /// Whether `key` is present and not `null`.
    pub fn has(&self, key: &str) -> bool {
        self.obj.get(key).is_some_and(|v| !v.is_null())
    }
}

/// Field `key` of `obj` as `T`, errors named `{name}` plus the path inside the value.
fn get<T: DeserializeOwned>(
    obj: &Map<String, Value>,
    key: &str,
    name: &str,
) -> Result<Option<T>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let r: Result<T, _> = serde_path_to_error::deserialize(v.clone());
            r.map(Some).map_err(|e| {
                let path = e.path().to_string();
                let param = if path.is_empty() || path == "." {
                    name.to_string()
                } else if path.starts_with('[') {
                    format!("{name}{path}")
                } else {
                    format!("{name}.{path}")
                };
                ApiError::invalid(param, format!("invalid value: {}", e.into_inner()))
            })
        }
    }
}

/// One string or a list of strings.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A chat message's content: a string or a list of parts.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Map<String, Value>>),
}

/// Parses the body of `endpoint` (a JSON object).
pub fn parse(endpoint: Endpoint, body: &Value) -> Result<ApiRequest, ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::bad_body("the request body must be a JSON object"))?;
    let own = match endpoint {
        Endpoint::Chat => CHAT_ONLY,
        Endpoint::Completions => COMPLETIONS_ONLY,
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str()))
    {
        return Err(ApiError::invalid(
            k.clone(),
            format!("unrecognized or unsupported request argument `{k}`"),
        ));
    }
    let f = Fields::new(obj);
    let model: Option<String> = f.get("model")?;

    // the prompt
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat(messages(obj)?),
        Endpoint::Completions => completion_prompt(obj)?,
    };
    if endpoint == Endpoint::Completions {
        if f.get::<bool>("echo")?.unwrap_or(false) {
            return Err(ApiError::invalid("echo", "`echo` is not supported"));
        }
        if f.has("suffix") {
            return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
        }
    }

    // nextok's own options
    let nx = nextok_options(obj)?;

    let mut params = SamplingParams {
        temperature: f.get("temperature")?,
        top_k: f.get("top_k")?,
        top_p: f.get("top_p")?,
        min_p: f.get("min_p")?,
        typical_p: f.get("typical_p")?,
        presence_penalty: f.get("presence_penalty")?,
        frequency_penalty: f.get("frequency_penalty")?,
        repetition_penalty: f.get("repetition_penalty")?,
        min_tokens: f.get("min_tokens")?,
        stop_token_ids: f.get("stop_token_ids")?.unwrap_or_default(),
        ignore_eos: f.get("ignore_eos")?.unwrap_or(false),
        include_stop_str_in_output: f.get("include_stop_str_in_output")?.unwrap_or(false),
        skip_special_tokens: f.get("skip_special_tokens")?,
        grammar_policy: nx.grammar_policy,
        ..Default::default()
    };
    // max_tokens / max_completion_tokens
    let mut max_tokens_param = "max_tokens";
    params.max_tokens = f.get("max_tokens")?;
    if endpoint == Endpoint::Chat {
        if let Some(m) = f.get::<u64>("max_completion_tokens")? {
            if params.max_tokens.is_some_and(|t| t != m) {
                return Err(ApiError::invalid(
                    "max_completion_tokens",
                    "differs from `max_tokens`; give one of them",
                ));
            }
            params.max_tokens = Some(m);
            max_tokens_param = "max_completion_tokens";
        }
    }
    params.stop = match f.get::<OneOrMany>("stop")? {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    };
    // OpenAI's seed is a signed 64-bit integer
    params.seed = match obj.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(s), _) => Some(s),
            (None, Some(_)) => {
                return Err(ApiError::invalid("seed", "must be a non-negative integer"))
            }
            _ => return Err(ApiError::invalid("seed", "must be an integer")),
        },
    };
    if let Some(bias) = f.get::<BTreeMap<String, f32>>("logit_bias")? {
        for (k, v) in bias {
            let id: u32 = k.trim().parse().map_err(|_| {
                ApiError::invalid(
                    format!("logit_bias.{k}"),
                    format!("`{k}` is not a token id"),
                )
            })?;
            params.logit_bias.insert(id, v);
        }
    }

    let n: usize = f.get("n")?.unwrap_or(1);
    if endpoint == Endpoint::Completions {
        if let Some(b) = f.get::<usize>("best_of")? {
            if b != n {
                return Err(ApiError::invalid(
                    "best_of",
                    "only `best_of` equal to `n` is supported",
                ));
            }
        }
    }

    // logprobs
    let top = match endpoint {
        Endpoint::Chat => {
            let on: bool = f.get("logprobs")?.unwrap_or(false);
            let top: Option<usize> = f.get("top_logprobs")?;
            match (on, top) {
                (false, Some(_)) => {
                    return Err(ApiError::invalid("top_logprobs", "needs `logprobs: true`"))
                }
                (false, None) => None,
                (true, t) => Some(t.unwrap_or(0)),
            }
        }
        Endpoint::Completions => f.get::<usize>("logprobs")?,
    };
    let layer = nx.logprob_layer.unwrap_or(Layer::Raw);

    // stream
    let stream: bool = f.get("stream")?.unwrap_or(false);
    let include_usage = match f.get::<Map<String, Value>>("stream_options")? {
        None => false,
        Some(o) => {
            if !stream {
                return Err(ApiError::invalid(
                    "stream_options",
                    "only allowed with `stream: true`",
                ));
            }
            if let Some(k) = o.keys().find(|k| k.as_str() != "include_usage") {
                return Err(ApiError::invalid(
                    format!("stream_options.{k}"),
                    format!("unsupported stream option `{k}`"),
                ));
            }
            get::<bool>(&o, "include_usage", "stream_options.include_usage")?.unwrap_or(false)
        }
    };

    // the constraint: one source at most
    let (mut constraint, constraint_param) = constraint(obj)?;
    for (field, set) in [
        ("schema_mode", nx.schema_mode.is_some()),
        ("property_order", nx.property_order.is_some()),
    ] {
        if !set {
            continue;
        }
        match &mut constraint {
            Some(ConstraintSpec::JsonSchema { options, .. }) => {
                if let Some(mode) = nx.schema_mode {
                    options.schema_mode = mode;
                }
                if let Some(order) = nx.property_order {
                    options.property_order = Some(order);
                }
            }
            _ => {
                return Err(ApiError::invalid(
                    format!("{}{field}", nx.prefix),
                    "applies to a JSON-schema constraint (response_format json_schema, \
                     structured_outputs.json, guided_json), and the request has none",
                ))
            }
        }
    }

    // the pipeline
    let (pipeline, pipeline_source) = match nx.pipeline.clone() {
        None => (
            PipelineChoice::Preset(Preset::Reference),
            "reference".into(),
        ),
        Some(Value::String(name)) => {
            let p: Preset = name.parse().map_err(|_| {
                ApiError::invalid(
                    format!("{}pipeline", nx.prefix),
                    format!("unknown preset `{name}` (expected reference, hf, vllm or llama.cpp)"),
                )
            })?;
            (PipelineChoice::Preset(p), name)
        }
        Some(v @ Value::Object(_)) => {
            let cfg = PipelineConfig::from_json(&v.to_string()).map_err(|e| {
                let path = e.field().map(|f| format!(".{f}")).unwrap_or_default();
                ApiError::invalid(format!("{}pipeline{path}", nx.prefix), e.to_string())
            })?;
            (PipelineChoice::Config(cfg), "inline".into())
        }
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{}pipeline", nx.prefix),
                "must be a preset name or a pipeline object",
            ))
        }
    };

    // field by field: the engine's defaults for whatever else a request may hold
    let mut gen = GenerateRequest::new(prompt);
    params.constraint = constraint;
    gen.params = params;
    gen.pipeline = pipeline;
    gen.n = n;
    gen.logprobs = top.map(|top| LogprobOptions { top, layer });
    gen.records = nx.trace.then_some(TRACE_CANDIDATES);
    gen.trace_logits = nx.trace_logits;
    if let Some(res) = &nx.resume {
        if nx.trace {
            return Err(ApiError::invalid(
                format!("{}resume", nx.prefix),
                "a resumed answer cannot be traced (its trace would lack the resumed steps)",
            ));
        }
        if let Some(id) = &res.id {
            let ok = !id.is_empty()
                && id.len() <= 64
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                return Err(ApiError::invalid(
                    format!("{}resume.id", nx.prefix),
                    "must be 1 to 64 letters, digits, `-` or `_` (the first answer's id)",
                ));
            }
        }
        if let Some(i) = res.finished.iter().position(|&f| f >= n) {
            return Err(ApiError::invalid(
                format!("{}resume.finished[{i}]", nx.prefix),
                format!("sequence {} does not exist (n = {n})", res.finished[i]),
            ));
        }
        gen.resume = Some(res.tokens.clone());
    }
    let r = ApiRequest {
        endpoint,
        model,
        gen,
        stream,
        include_usage,
        logprobs: top.is_some(),
        layer,
        trace: nx.trace,
        trace_logits: nx.trace_logits,
        pipeline_source,
        constraint_param,
        max_tokens_param,
        nextok_prefix: nx.prefix,
        speculative: nx.speculative,
        resume: nx.resume,
    };
    // every rule about the decoding side, once, errors under the request's names
    resolve(&resolve::Request {
        params: &r.gen.params,
        pipeline: &r.gen.pipeline,
        n: r.gen.n,
        top_logprobs: r.gen.logprobs.map(|l| l.top),
    })
    .map_err(|e| ApiError::from_core(e, |f| r.param(f)))?;
    Ok(r)
}

fn messages(obj: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    let Some(list) = get::<Vec<Map<String, Value>>>(obj, "messages", "messages")? else {
        return Err(ApiError::invalid("messages", "`messages` is required"));
    };
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "must not be empty"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = |k: &str| format!("messages[{i}].{k}");
        if let Some(k) = m
            .keys()
            .find(|k| !["role", "content", "name"].contains(&k.as_str()))
        {
            return Err(ApiError::invalid(
                at(k),
                format!("unsupported message field `{k}`"),
            ));
        }
        let role: String = get(m, "role", &at("role"))?
            .ok_or_else(|| ApiError::invalid(at("role"), "`role` is required"))?;
        let role = match role.as_str() {
            "system" | "user" | "assistant" => role,
            "developer" => "system".to_string(),
            other => {
                return Err(ApiError::invalid(
                    at("role"),
                    format!("unsupported role `{other}` (system, developer, user, assistant)"),
                ))
            }
        };
        let content = match get::<Content>(m, "content", &at("content"))? {
            None => return Err(ApiError::invalid(at("content"), "`content` is required")),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut t = String::new();
                for (j, p) in parts.iter().enumerate() {
                    let pat = |k: &str| format!("messages[{i}].content[{j}].{k}");
                    let ty: Option<String> = get(p, "type", &pat("type"))?;
                    if ty.as_deref() != Some("text") {
                        return Err(ApiError::invalid(
                            pat("type"),
                            "only text content parts are supported",
                        ));
                    }
                    let text: String = get(p, "text", &pat("text"))?
                        .ok_or_else(|| ApiError::invalid(pat("text"), "`text` is required"))?;
                    t.push_str(&text);
                }
                t
            }
        };
        out.push(Message::new(role, content));
    }
    Ok(out)
}

fn completion_prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum P {
        Text(String),
        Texts(Vec<String>),
        Ids(Vec<u32>),
        IdLists(Vec<Vec<u32>>),
    }
    let one = || {
        ApiError::invalid(
            "prompt",
            "one prompt per request (a string or a list of token ids)",
        )
    };
    match get::<P>(obj, "prompt", "prompt")? {
        None => Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(P::Text(t)) => Ok(Prompt::Text(t)),
        Some(P::Ids(ids)) => Ok(Prompt::Ids(ids)),
        Some(P::Texts(mut v)) if v.len() == 1 => Ok(Prompt::Text(v.remove(0))),
        Some(P::IdLists(mut v)) if v.len() == 1 => Ok(Prompt::Ids(v.remove(0))),
        Some(_) => Err(one()),
    }
}

/// nextok's options.
#[derive(Default)]
struct NextokOptions {
    pipeline: Option<Value>,
    logprob_layer: Option<Layer>,
    grammar_policy: Option<GrammarPolicy>,
    trace: bool,
    trace_logits: bool,
    speculative: Option<Option<SpecOptions>>,
    /// `strict` or `relaxed`, for a JSON-schema constraint.
    schema_mode: Option<SchemaMode>,
    /// `schema` or `any`, for a JSON-schema constraint.
    property_order: Option<PropertyOrder>,
    /// `nextok.` or `nextok_`, as the request named them.
    prefix: &'static str,
    /// `resume`.
    resume: Option<Resume>,
}

/// nextok's option names (in the `nextok` object, or with a `nextok_` prefix).
const NEXTOK_OPTIONS: [&str; 10] = [
    "pipeline",
    "logprob_layer",
    "grammar_policy",
    "trace",
    "trace_logits",
    "speculative",
    "spec_acceptance",
    "schema_mode",
    "property_order",
    "resume",
];

fn nextok_options(obj: &Map<String, Value>) -> Result<NextokOptions, ApiError> {
    let flat = NEXTOK_OPTIONS.iter().any(|k| {
        obj.get(&format!("nextok_{k}"))
            .is_some_and(|v| !v.is_null())
    });
    let nested: Option<Map<String, Value>> = get(obj, "nextok", "nextok")?;
    let (src, prefix): (Map<String, Value>, &'static str) = match (nested, flat) {
        (Some(_), true) => {
            return Err(ApiError::invalid(
                "nextok",
                "give nextok's options either in the `nextok` object or as `nextok_*` fields",
            ))
        }
        (Some(m), false) => {
            if let Some(k) = m.keys().find(|k| !NEXTOK_OPTIONS.contains(&k.as_str())) {
                return Err(ApiError::invalid(
                    format!("nextok.{k}"),
                    format!(
                        "unknown nextok option `{k}` ({})",
                        NEXTOK_OPTIONS.join(", ")
                    ),
                ));
            }
            (m, "nextok.")
        }
        (None, true) => (
            obj.iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix("nextok_")
                        .map(|k| (k.to_string(), v.clone()))
                })
                .collect(),
            "nextok_",
        ),
        (None, false) => (Map::new(), "nextok."),
    };
    let name = |k: &str| format!("{prefix}{k}");
    let acceptance: Option<String> = get(&src, "spec_acceptance", &name("spec_acceptance"))?;
    let acceptance = match acceptance {
        None => None,
        Some(a) => Some(
            a.parse::<Acceptance>()
                .map_err(|e| ApiError::invalid(name("spec_acceptance"), e))?,
        ),
    };
    let speculative = match get::<String>(&src, "speculative", &name("speculative"))? {
        None => {
            if acceptance.is_some() {
                return Err(ApiError::invalid(
                    name("spec_acceptance"),
                    format!("needs `{}` (for example \"ngram:5\")", name("speculative")),
                ));
            }
            None
        }
        Some(t) if t == "off" => Some(None),
        Some(t) => Some(Some(
            SpecOptions::parse(&t, acceptance.unwrap_or_default())
                .map_err(|e| ApiError::invalid(name("speculative"), e))?,
        )),
    };
    Ok(NextokOptions {
        resume: get(&src, "resume", &name("resume"))?,
        speculative,
        pipeline: src.get("pipeline").filter(|v| !v.is_null()).cloned(),
        logprob_layer: get(&src, "logprob_layer", &name("logprob_layer"))?,
        grammar_policy: get(&src, "grammar_policy", &name("grammar_policy"))?,
        trace: get(&src, "trace", &name("trace"))?.unwrap_or(false),
        trace_logits: get(&src, "trace_logits", &name("trace_logits"))?.unwrap_or(false),
        schema_mode: match get::<String>(&src, "schema_mode", &name("schema_mode"))? {
            Some(m) => Some(
                m.parse()
                    .map_err(|e: String| ApiError::invalid(name("schema_mode"), e))?,
            ),
            None => None,
        },
        property_order: match get::<String>(&src, "property_order", &name("property_order"))? {
            Some(m) => Some(
                m.parse()
                    .map_err(|e: String| ApiError::invalid(name("property_order"), e))?,
            ),
            None => None,
        },
        prefix,
    })
}

/// A schema given as an object or as JSON text.
fn schema_value(v: Value, param: &str) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => serde_json::from_str(&s)
            .map_err(|e| ApiError::invalid(param, format!("not a JSON schema: {e}"))),
        v @ (Value::Object(_) | Value::Bool(_)) => Ok(v),
        _ => Err(ApiError::invalid(
            param,
            "must be a JSON schema (an object)",
        )),
    }
}

/// A grammar: llama.cpp GBNF when it defines rules with `::=`, else Lark.
fn grammar(text: String) -> ConstraintSpec {
    if text.contains("::=") {
        ConstraintSpec::Gbnf { gbnf: text }
    } else {
        ConstraintSpec::Grammar { lark: text }
    }
}

fn choices(v: Vec<String>, param: &str) -> Result<ConstraintSpec, ApiError> {
    if v.is_empty() {
        return Err(ApiError::invalid(param, "must list at least one choice"));
    }
    Ok(ConstraintSpec::Choice { choices: v })
}

/// The request's structured-output constraint and the field it came from.
fn constraint(obj: &Map<String, Value>) -> Result<(Option<ConstraintSpec>, String), ApiError> {
    let mut found: Vec<(ConstraintSpec, String)> = Vec::new();
    // OpenAI's response_format
    if let Some(rf) = get::<Map<String, Value>>(obj, "response_format", "response_format")? {
        let ty: String = get(&rf, "type", "response_format.type")?
            .ok_or_else(|| ApiError::invalid("response_format.type", "`type` is required"))?;
        match ty.as_str() {
            "text" => {}
            "json_object" => found.push((
                ConstraintSpec::Json {
                    options: Default::default(),
                },
                "response_format".into(),
            )),
            "json_schema" => {
                let js: Map<String, Value> =
                    get(&rf, "json_schema", "response_format.json_schema")?.ok_or_else(|| {
                        ApiError::invalid("response_format.json_schema", "is required")
                    })?;
                // `strict` is accepted either way: the schema is always enforced
                let _: Option<bool> = get(&js, "strict", "response_format.json_schema.strict")?;
                let _: Option<String> = get(&js, "name", "response_format.json_schema.name")?;
                let schema = js.get("schema").cloned().ok_or_else(|| {
                    ApiError::invalid("response_format.json_schema.schema", "is required")
                })?;
                let schema = schema_value(schema, "response_format.json_schema.schema")?;
                found.push((
                    ConstraintSpec::JsonSchema {
                        schema,
                        options: Default::default(),
                    },
                    "response_format.json_schema.schema".into(),
                ));
            }
            other => {
                return Err(ApiError::invalid(
                    "response_format.type",
                    format!("unknown type `{other}` (text, json_object, json_schema)"),
                ))
            }
        }
    }
    // vLLM's structured_outputs
    if let Some(so) = get::<Map<String, Value>>(obj, "structured_outputs", "structured_outputs")? {
        for (k, v) in &so {
            if v.is_null() {
                continue;
            }
            let param = format!("structured_outputs.{k}");
            let spec = match k.as_str() {
                "json" => ConstraintSpec::JsonSchema {
                    schema: schema_value(v.clone(), &param)?,
                    options: Default::default(),
                },
                "json_object" => match v {
                    Value::Bool(true) => ConstraintSpec::Json {
                        options: Default::default(),
                    },
                    Value::Bool(false) => continue,
                    _ => return Err(ApiError::invalid(param, "must be a boolean")),
                },
                "regex" => ConstraintSpec::Regex {
                    pattern: get(&so, k, &param)?.unwrap_or_default(),
                },
                "choice" => choices(get(&so, k, &param)?.unwrap_or_default(), &param)?,
                "grammar" => grammar(get(&so, k, &param)?.unwrap_or_default()),
                other => {
                    return Err(ApiError::invalid(
                        param,
                        format!(
                            "unsupported structured output `{other}` (json, json_object, regex, choice, grammar)"
                        ),
                    ))
                }
            };
            found.push((spec, param));
        }
    }
    // vLLM's older guided_* fields
    if let Some(v) = obj.get("guided_json").filter(|v| !v.is_null()) {
        found.push((
            ConstraintSpec::JsonSchema {
                schema: schema_value(v.clone(), "guided_json")?,
                options: Default::default(),
            },
            "guided_json".into(),
        ));
    }
    if let Some(p) = get::<String>(obj, "guided_regex", "guided_regex")? {
        found.push((ConstraintSpec::Regex { pattern: p }, "guided_regex".into()));
    }
    if let Some(c) = get::<Vec<String>>(obj, "guided_choice", "guided_choice")? {
        found.push((choices(c, "guided_choice")?, "guided_choice".into()));
    }
    if let Some(g) = get::<String>(obj, "guided_grammar", "guided_grammar")? {
        found.push((grammar(g), "guided_grammar".into()));
    }
    let _: Option<String> = get(obj, "guided_decoding_backend", "guided_decoding_backend")?;
    if found.len() > 1 {
        return Err(ApiError::invalid(
            found[1].1.clone(),
            format!(
                "a request takes one structured-output constraint; `{}` already gives one",
                found[0].1
            ),
        ));
    }
    Ok(match found.pop() {
        Some((s, p)) => (Some(s), p),
        None => (None, "response_format".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(endpoint: Endpoint, body: Value) -> ApiError {
        parse(endpoint, &body).expect_err("must fail")
    }

    #[test]
    fn chat_maps_openai_and_vllm_names() {
        let r = parse(
            Endpoint::Chat,
            &json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "temperature": 0.5, "top_p": 0.9, "max_completion_tokens": 7, "seed": 3,
                "stop": "x", "logit_bias": {"5": -100}, "top_k": 4, "min_p": 0.1, "n": 2,
                "logprobs": true, "top_logprobs": 3, "stream": true,
                "stream_options": {"include_usage": true},
                "nextok": {"logprob_layer": "processed", "trace": true}}),
        )
        .unwrap();
        let p = &r.gen.params;
        assert_eq!(p.temperature, Some(0.5));
        assert_eq!(p.max_tokens, Some(7));
        assert_eq!(p.seed, Some(3));
        assert_eq!(p.stop, vec!["x".to_string()]);
        assert_eq!(p.logit_bias.get(&5), Some(&-100.0));
        assert_eq!(p.top_k, Some(4));
        assert_eq!(r.gen.n, 2);
        assert_eq!(
            r.gen.logprobs,
            Some(LogprobOptions {
                top: 3,
                layer: Layer::Processed
            })
        );
        assert!(r.stream && r.include_usage && r.trace);
        assert_eq!(r.gen.records, Some(TRACE_CANDIDATES));
        assert_eq!(r.param("max_tokens"), "max_completion_tokens");
    }

    #[test]
    fn each_bad_field_is_named() {
        let m = json!([{"role": "user", "content": "hi"}]);
        let cases = [
            (json!({"messages": m, "temperature": "hot"}), "temperature"),
            (json!({"messages": m, "n": 0}), "n"),
            (json!({"messages": m, "seed": -1}), "seed"),
            (
                json!({"messages": m, "logit_bias": {"x": 1}}),
                "logit_bias.x",
            ),
            (json!({"messages": m, "top_logprobs": 2}), "top_logprobs"),
            (
                json!({"messages": m, "logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (
                json!({"messages": m, "stream_options": {}}),
                "stream_options",
            ),
            (json!({"messages": m, "frobnicate": 1}), "frobnicate"),
            (
                json!({"messages": [{"role": "robot", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "user", "content": 5}]}),
                "messages[0].content",
            ),
            (json!({"messages": []}), "messages"),
            (json!({}), "messages"),
            (
                json!({"messages": m, "response_format": {"type": "yaml"}}),
                "response_format.type",
            ),
            (
                json!({"messages": m, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"messages": m, "guided_regex": "a", "guided_choice": ["b"]}),
                "guided_choice",
            ),
            (
                json!({"messages": m, "structured_outputs": {"choice": []}}),
                "structured_outputs.choice",
            ),
            (
                json!({"messages": m, "nextok": {"pipeline": "fast"}}),
                "nextok.pipeline",
            ),
            (
                json!({"messages": m, "nextok_logprob_layer": "final"}),
                "nextok_logprob_layer",
            ),
            (json!({"messages": m, "max_tokens": 0}), "max_tokens"),
            (json!({"messages": m, "stop": ["a", ""]}), "stop[1]"),
        ];
        for (body, param) in cases {
            let e = err(Endpoint::Chat, body.clone());
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
        let e = err(Endpoint::Completions, json!({"prompt": ["a", "b"]}));
        assert_eq!(e.param.as_deref(), Some("prompt"));
        let e = err(Endpoint::Completions, json!({"prompt": "a", "echo": true}));
        assert_eq!(e.param.as_deref(), Some("echo"));
        let e = err(
            Endpoint::Completions,
            json!({"prompt": "a", "messages": []}),
        );
        assert_eq!(e.param.as_deref(), Some("messages"));
    }

    #[test]
    fn structured_outputs_in_every_spelling() {
        let base = json!({"prompt": "p"});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            parse(Endpoint::Completions, &b).unwrap()
        };
        let r = with("structured_outputs", json!({"regex": "[0-9]+"}));
        assert_eq!(
            r.gen.params.constraint,
            Some(ConstraintSpec::Regex {
                pattern: "[0-9]+".into()
            })
        );
        let r = with("guided_choice", json!(["yes", "no"]));
        assert!(matches!(
            r.gen.params.constraint,
            Some(ConstraintSpec::Choice { .. })
        ));
        let r = with("guided_json", json!("{\"type\": \"object\"}"));
        assert!(matches!(
            r.gen.params.constraint,
            Some(ConstraintSpec::JsonSchema { .. })
        ));
        let r = with("guided_grammar", json!("root ::= \"a\""));
        assert!(matches!(
            r.gen.params.constraint,
            Some(ConstraintSpec::Gbnf { .. })
        ));
        let r = with("structured_outputs", json!({"grammar": "start: \"a\""}));
        assert!(matches!(
            r.gen.params.constraint,
            Some(ConstraintSpec::Grammar { .. })
        ));
        assert_eq!(r.param("constraint"), "structured_outputs.grammar");
        let r = with("response_format", json!({"type": "json_object"}));
        assert!(matches!(
            r.gen.params.constraint,
            Some(ConstraintSpec::Json { .. })
        ));
    }

    /// The resolver's rules apply at parse time, under the request's own names.
    #[test]
    fn the_resolver_names_the_request_field() {
        let m = json!([{"role": "user", "content": "hi"}]);
        for (endpoint, body, param) in [
            (
                Endpoint::Chat,
                json!({"messages": m, "top_p": 2.0}),
                "top_p",
            ),
            (
                Endpoint::Chat,
                json!({"messages": m, "max_completion_tokens": 0}),
                "max_completion_tokens",
            ),
            (
                Endpoint::Completions,
                json!({"prompt": "p", "logprobs": 21}),
                "logprobs",
            ),
            (
                Endpoint::Completions,
                json!({"prompt": "p", "stop": ["a", ""]}),
                "stop[1]",
            ),
            (
                Endpoint::Completions,
                json!({"prompt": "p", "logit_bias": {"7": 101}}),
                "logit_bias[7]",
            ),
        ] {
            let e = err(endpoint, body);
            assert_eq!(e.param.as_deref(), Some(param), "{e}");
            assert!(e.message.contains(&format!("`{param}`")), "{e}");
        }
    }

    #[test]
    fn an_inline_pipeline_refuses_loose_sampling_parameters() {
        let pipeline = json!({"format_version": 1, "processors": [{"type": "top_k", "top_k": 2}], "selector": {"type": "categorical"}});
        let e = err(
            Endpoint::Completions,
            json!({"prompt": "p", "temperature": 0.3, "nextok": {"pipeline": pipeline}}),
        );
        assert_eq!(e.param.as_deref(), Some("temperature"));
    }
}
