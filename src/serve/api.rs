//! OpenAI request parsing. Every parameter is either implemented, accepted because it has no
//! effect here (`model`, `user`), or refused with 400 naming it — never silently ignored (a
//! server that accepted sampling parameters and ignored them gave fluent, wrong behaviour).
//! Stock clients' default values are accepted.
//!
//! The wire types are serde structs with `deny_unknown_fields`: an unknown key, a value of the
//! wrong type (`"include_usage": "yes"`) or a missing required field is a 400 whose `param`
//! is the field's path. An explicit `null` is the default, as in OpenAI's API.

use crate::generate::sampler::SamplingParams;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// A 4xx/5xx answer in OpenAI's error shape.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError { status: 400, kind: "invalid_request_error", message: message.into(), param: param.map(str::to_string), code: None }
    }

    pub fn unsupported(param: &str, why: &str) -> Self {
        ApiError {
            status: 400,
            kind: "invalid_request_error",
            message: format!("parameter `{param}` is not supported by frigg: {why}"),
            param: Some(param.to_string()),
            code: Some("unsupported_parameter"),
        }
    }

    pub fn server(status: u16, message: impl Into<String>) -> Self {
        ApiError { status, kind: "server_error", message: message.into(), param: None, code: None }
    }

    pub fn body(&self) -> super::openai::ErrorBody<'_> {
        super::openai::ErrorBody { error: super::openai::ErrorDetail { message: &self.message, kind: self.kind, param: self.param.as_deref(), code: self.code } }
    }
}

/// What a chat or completion request asks the engine for, after validation.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub prompt_text: Option<String>,
    pub prompt_ids: Option<Vec<u32>>,
    /// Chat messages as the template reads them (tool-call arguments parsed into objects).
    pub messages: Option<Vec<Value>>,
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub n: usize,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: Option<usize>,
    /// Extension (as vLLM's): keep generating past end-of-turn tokens.
    pub ignore_eos: bool,
    /// Declared tools (OpenAI shape), rendered into the prompt unless `tool_choice` is none.
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoiceParam,
    pub parallel_tool_calls: bool,
    /// `response_format` beyond text: json_object, json_schema, and frigg's regex and grammar.
    pub format: Option<Format>,
    /// Each tool's name, schema and strictness, for the call grammar.
    pub tool_decls: Vec<crate::generate::constrain::ToolDecl>,
}

/// A constrained `response_format`.
#[derive(Debug, Clone)]
pub enum Format {
    JsonObject,
    JsonSchema(Value),
    Regex(String),
    Grammar(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoiceParam {
    None,
    Auto,
    Required,
    Named(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// Every parameter of both routes; `parse` refuses those the route does not have.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    model: Option<String>,
    user: Option<String>,
    messages: Option<Vec<WireMessage>>,
    prompt: Option<Value>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u64>,
    min_p: Option<f32>,
    seed: Option<i64>,
    repetition_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    logit_bias: Option<BTreeMap<String, f32>>,
    n: Option<u64>,
    stop: Option<Value>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    /// A boolean on the chat route, the number of alternatives on the completions route.
    logprobs: Option<Value>,
    top_logprobs: Option<u64>,
    response_format: Option<ResponseFormat>,
    tools: Option<Vec<WireTool>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    ignore_eos: Option<bool>,
    echo: Option<bool>,
    best_of: Option<u64>,
    store: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
    /// frigg's extension (as vLLM's structured outputs): the reply matches the regex.
    Regex { regex: String },
    /// frigg's extension: the reply is in the Lark grammar (llguidance's syntax).
    Grammar { grammar: String },
}

/// OpenAI's `json_schema` format. The schema is always enforced; `strict: false` asks for
/// less than that and gets it too.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonSchemaFormat {
    name: String,
    #[serde(default)]
    description: Option<String>,
    schema: Option<Value>,
    #[serde(default)]
    strict: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

/// One chat message. `name`, `reasoning` and `reasoning_content` reach the chat template as
/// given (Mimir's template renders reasoning before tool calls and tool names from `name`).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct WireMessage {
    role: Role,
    #[serde(default, deserialize_with = "content", skip_serializing_if = "Option::is_none")]
    content: Option<Content>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<WireToolCall>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
}

/// Message content: a string, or a list of text parts (HRM-Text reads text only).
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<TextPart>),
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct TextPart {
    #[serde(rename = "type")]
    kind: String,
    text: String,
}

/// `content`: null, a string, or text parts; anything else names what it got.
fn content<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Content>, D::Error> {
    use serde::de::Error;
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(Content::Text(s))),
        Value::Array(parts) => {
            let mut out = Vec::with_capacity(parts.len());
            for (i, p) in parts.into_iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("").to_string();
                if kind != "text" {
                    return Err(D::Error::custom(format!("part {i} has type {kind:?}: only text parts are supported (HRM-Text is a text model)")));
                }
                let part: TextPart = serde_json::from_value(p).map_err(|e| D::Error::custom(format!("part {i}: {e}")))?;
                out.push(part);
            }
            Ok(Some(Content::Parts(out)))
        }
        other => Err(D::Error::custom(format!("must be a string or a list of text parts, not {}", json_kind(&other)))),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct WireToolCall {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    kind: String,
    function: WireCall,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct WireCall {
    name: String,
    /// A JSON object's text on the wire (or the object itself); the template reads an object.
    #[serde(default)]
    arguments: Value,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct WireTool {
    #[serde(rename = "type")]
    kind: String,
    function: WireFunction,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct WireFunction {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
    /// Arguments are held to `parameters` unless this is false (`ToolDecl::strict`).
    #[serde(skip_serializing)]
    strict: Option<bool>,
}

/// Parses and validates a request body (the raw bytes of a JSON object).
pub fn parse(body: &[u8], kind: Kind, n_vocab: usize) -> Result<Parsed, ApiError> {
    let w: Wire = decode(body)?;
    refuse_what_the_route_lacks(&w, kind)?;
    let _ = (&w.model, &w.user); // no effect: one model per server, no per-user state
    let stream = w.stream.unwrap_or(false);
    let include_usage = match &w.stream_options {
        Some(_) if !stream => return Err(ApiError::invalid("`stream_options` is only allowed when `stream` is true", Some("stream_options"))),
        Some(o) => o.include_usage.unwrap_or(false),
        None => false,
    };
    let mut p = Parsed {
        prompt_text: None,
        prompt_ids: None,
        messages: None,
        max_tokens: max_tokens(&w)?,
        sampling: sampling(&w)?,
        n: match w.n {
            None => 1,
            Some(n @ 1..=8) => n as usize,
            Some(_) => return Err(ApiError::invalid("`n` must be between 1 and 8", Some("n"))),
        },
        stops: stops(w.stop.as_ref())?,
        stream,
        include_usage,
        logprobs: logprobs(&w, kind)?,
        ignore_eos: w.ignore_eos.unwrap_or(false),
        tools: vec![],
        tool_choice: ToolChoiceParam::Auto,
        parallel_tool_calls: w.parallel_tool_calls.unwrap_or(true),
        format: response_format(w.response_format)?,
        tool_decls: vec![],
    };
    if let Some(msgs) = w.messages {
        p.messages = Some(messages(msgs)?);
    }
    if let Some(prompt) = &w.prompt {
        match prompt {
            Value::String(s) => p.prompt_text = Some(s.clone()),
            Value::Array(a) if a.len() == 1 && a[0].is_string() => p.prompt_text = a[0].as_str().map(str::to_string),
            Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_number) => p.prompt_ids = Some(token_ids(a, n_vocab, "prompt")?),
            _ => return Err(ApiError::unsupported("prompt", "give one string or one list of token ids (batched prompts: send one request each)")),
        }
    }
    if p.format.is_some() && !p.stops.is_empty() {
        // A stop string inside the constrained reply would cut it into text the format rejects.
        return Err(ApiError::invalid("`stop` cannot be combined with a constrained `response_format`: the reply is complete in its format", Some("stop")));
    }
    if let Some(tools) = w.tools {
        p.tool_decls = tools.iter().map(|t| crate::generate::constrain::ToolDecl { name: t.function.name.clone(), parameters: t.function.parameters.clone(), strict: t.function.strict != Some(false) }).collect();
        p.tools = parse_tools(tools)?;
    }
    p.tool_choice = tool_choice(w.tool_choice.as_ref(), &p.tools)?;
    if p.format.is_some() && p.tool_choice != ToolChoiceParam::None {
        return Err(ApiError::invalid("a constrained `response_format` and tool calls cannot be combined", Some("response_format")));
    }
    match kind {
        Kind::Chat if p.messages.is_none() => return Err(ApiError::invalid("`messages` is required", Some("messages"))),
        Kind::Completion if p.prompt_text.is_none() && p.prompt_ids.is_none() => return Err(ApiError::invalid("`prompt` is required", Some("prompt"))),
        _ => {}
    }
    p.sampling.validate(n_vocab).map_err(|m| {
        let param = m.split_whitespace().next().map(str::to_string);
        ApiError { status: 400, kind: "invalid_request_error", message: m, param, code: None }
    })?;
    Ok(p)
}

/// Refuses the other route's parameters, and those accepted only at their defaults.
fn refuse_what_the_route_lacks(w: &Wire, kind: Kind) -> Result<(), ApiError> {
    let chat = kind == Kind::Chat;
    let route = if chat { "/v1/chat/completions" } else { "/v1/completions" };
    for (present, name, on_chat) in [
        (w.messages.is_some(), "messages", true),
        (w.tools.is_some(), "tools", true),
        (w.tool_choice.is_some(), "tool_choice", true),
        (w.parallel_tool_calls.is_some(), "parallel_tool_calls", true),
        (w.top_logprobs.is_some(), "top_logprobs", true),
        (w.max_completion_tokens.is_some(), "max_completion_tokens", true),
        (w.store.is_some(), "store", true),
        (w.prompt.is_some(), "prompt", false),
        (w.echo.is_some(), "echo", false),
        (w.best_of.is_some(), "best_of", false),
    ] {
        if present && on_chat != chat {
            return Err(ApiError::unsupported(name, &format!("{route} has no such parameter")));
        }
    }
    if w.echo == Some(true) {
        return Err(ApiError::unsupported("echo", "the prompt is not echoed back"));
    }
    if w.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::unsupported("best_of", "only best_of = 1 (use n for several choices)"));
    }
    if w.store == Some(true) {
        return Err(ApiError::unsupported("store", "frigg stores nothing"));
    }
    Ok(())
}

/// `max_tokens` or `max_completion_tokens` (not both; at least 1).
fn max_tokens(w: &Wire) -> Result<Option<usize>, ApiError> {
    let given = match (w.max_tokens, w.max_completion_tokens) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("give `max_tokens` or `max_completion_tokens`, not both", Some("max_completion_tokens"))),
        (a, b) => a.map(|v| (v, "max_tokens")).or(b.map(|v| (v, "max_completion_tokens"))),
    };
    match given {
        Some((0, name)) => Err(ApiError::invalid(format!("`{name}` must be at least 1"), Some(name))),
        Some((v, _)) => Ok(Some(usize::try_from(v).unwrap_or(usize::MAX))),
        None => Ok(None),
    }
}

/// The sampling parameters (OpenAI's defaults where absent: temperature 1, top_p 1);
/// ranges are checked by `SamplingParams::validate`.
fn sampling(w: &Wire) -> Result<SamplingParams, ApiError> {
    let mut s = SamplingParams {
        temperature: w.temperature.unwrap_or(1.0),
        top_p: w.top_p.unwrap_or(1.0),
        top_k: w.top_k.map_or(0, |k| usize::try_from(k).unwrap_or(usize::MAX)),
        min_p: w.min_p.unwrap_or(0.0),
        seed: w.seed.map(|x| x as u64),
        repetition_penalty: w.repetition_penalty.unwrap_or(1.0),
        frequency_penalty: w.frequency_penalty.unwrap_or(0.0),
        presence_penalty: w.presence_penalty.unwrap_or(0.0),
        logit_bias: vec![],
    };
    for (id, bias) in w.logit_bias.iter().flatten() {
        let token = if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) { id.parse::<u32>().ok() } else { None };
        let Some(token) = token else {
            return Err(ApiError::invalid(format!("logit_bias key {id:?} is not a token id (decimal digits only)"), Some("logit_bias")));
        };
        s.logit_bias.push((token, *bias));
    }
    Ok(s)
}

/// `stop`: a string or up to 4 (empty ones dropped).
fn stops(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let mut stops = match stop {
        None => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 && a.iter().all(Value::is_string) => a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect(),
        Some(_) => return Err(ApiError::invalid("`stop` must be a string or a list of up to 4 strings", Some("stop"))),
    };
    stops.retain(|s| !s.is_empty());
    Ok(stops)
}

/// Alternatives to report per token, or None for no logprobs: chat's `logprobs: true` with
/// `top_logprobs`, or the legacy route's `logprobs: k`.
fn logprobs(w: &Wire, kind: Kind) -> Result<Option<usize>, ApiError> {
    let (want, top) = match (&w.logprobs, kind) {
        (None, _) => (false, w.top_logprobs.unwrap_or(0)),
        (Some(Value::Bool(b)), Kind::Chat) => (*b, w.top_logprobs.unwrap_or(0)),
        (Some(_), Kind::Chat) => return Err(ApiError::invalid("`logprobs` must be a boolean", Some("logprobs"))),
        (Some(v), Kind::Completion) => match v.as_u64() {
            Some(k) => (true, k),
            None => return Err(ApiError::invalid("`logprobs` must be a non-negative integer (the alternatives per token)", Some("logprobs"))),
        },
    };
    if !want {
        if top > 0 {
            return Err(ApiError::invalid("`top_logprobs` requires `logprobs: true`", Some("top_logprobs")));
        }
        return Ok(None);
    }
    if top > 20 {
        let name = if kind == Kind::Chat { "top_logprobs" } else { "logprobs" };
        return Err(ApiError::invalid(format!("`{name}` must be at most 20"), Some(name)));
    }
    Ok(Some(top as usize))
}

/// `response_format`: None for plain text.
fn response_format(f: Option<ResponseFormat>) -> Result<Option<Format>, ApiError> {
    Ok(match f {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(Format::JsonObject),
        Some(ResponseFormat::JsonSchema { json_schema: f }) => {
            let _ = (&f.description, f.strict);
            let ok = !f.name.is_empty() && f.name.len() <= 64 && f.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b));
            if !ok {
                return Err(ApiError::invalid("`response_format.json_schema.name` must be 1-64 letters, digits, _ or -", Some("response_format.json_schema.name")));
            }
            Some(Format::JsonSchema(f.schema.unwrap_or_else(|| serde_json::json!({}))))
        }
        Some(ResponseFormat::Regex { regex }) => Some(Format::Regex(regex)),
        Some(ResponseFormat::Grammar { grammar }) => Some(Format::Grammar(grammar)),
    })
}

/// `tool_choice` against the declared `tools` (OpenAI's default: auto with tools, none without).
fn tool_choice(choice: Option<&Value>, tools: &[Value]) -> Result<ToolChoiceParam, ApiError> {
    let choice = choice.map(parse_tool_choice).transpose()?;
    match (choice, tools.is_empty()) {
        (Some(ToolChoiceParam::None) | None, true) => Ok(ToolChoiceParam::None),
        (Some(_), true) => Err(ApiError::invalid("`tool_choice` needs `tools`", Some("tool_choice"))),
        (Some(ToolChoiceParam::Named(n)), false) if !tools.iter().any(|t| t["function"]["name"] == n.as_str()) => {
            Err(ApiError::invalid(format!("`tool_choice` names `{n}`, which is not among `tools`"), Some("tool_choice")))
        }
        (Some(c), false) => Ok(c),
        (None, false) => Ok(ToolChoiceParam::Auto),
    }
}

/// Deserializes a request body; a wrong type, an unknown or a missing field names its path.
pub fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let w: T = match serde_path_to_error::deserialize(&mut de) {
        Ok(w) => w,
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                return Err(ApiError::invalid(format!("malformed JSON: {inner}"), None));
            }
            let msg = inner.to_string();
            if let Some(field) = msg.strip_prefix("unknown field `").and_then(|r| r.split('`').next()) {
                // the path ends with the unknown field's own name
                let param = if path == "." || path.is_empty() { field.to_string() } else { path.clone() };
                return Err(ApiError::unsupported(&param, "unknown or unimplemented parameter"));
            }
            if path == "." {
                return Err(ApiError::invalid(format!("the request body must be a JSON object with the request's parameters: {msg}"), None));
            }
            return Err(ApiError::invalid(format!("`{path}`: {msg}"), Some(&path)));
        }
    };
    de.end().map_err(|e| ApiError::invalid(format!("malformed JSON: {e}"), None))?;
    Ok(w)
}

/// Token ids from JSON numbers: each must be an integer inside the vocabulary.
pub fn token_ids(values: &[Value], n_vocab: usize, param: &str) -> Result<Vec<u32>, ApiError> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(id) if id < n_vocab as u64 => Ok(id as u32),
            Some(id) => Err(ApiError::invalid(format!("{param}[{i}]: token id {id} is outside the vocabulary ({n_vocab})"), Some(param))),
            None => Err(ApiError::invalid(format!("{param}[{i}]: {v} is not a token id (a non-negative integer)"), Some(param))),
        })
        .collect()
}

fn parse_tool_choice(v: &Value) -> Result<ToolChoiceParam, ApiError> {
    let bad = || ApiError::invalid("`tool_choice` must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}", Some("tool_choice"));
    match v {
        Value::String(s) if s == "none" => Ok(ToolChoiceParam::None),
        Value::String(s) if s == "auto" => Ok(ToolChoiceParam::Auto),
        Value::String(s) if s == "required" => Ok(ToolChoiceParam::Required),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            if let Some(k) = o.keys().find(|k| !["type", "function"].contains(&k.as_str())) {
                return Err(ApiError::unsupported(&format!("tool_choice.{k}"), "unknown or unimplemented parameter"));
            }
            let f = o.get("function").and_then(Value::as_object).ok_or_else(bad)?;
            if let Some(k) = f.keys().find(|k| k.as_str() != "name") {
                return Err(ApiError::unsupported(&format!("tool_choice.function.{k}"), "unknown or unimplemented parameter"));
            }
            match f.get("name").and_then(Value::as_str) {
                Some(n) => Ok(ToolChoiceParam::Named(n.to_string())),
                None => Err(ApiError::invalid("`tool_choice.function.name` is required", Some("tool_choice"))),
            }
        }
        _ => Err(bad()),
    }
}

/// Validates `tools`: functions with distinct names the call grammar can match (letters,
/// digits, `_`, `-`, `.`) and JSON Schema objects as parameters.
fn parse_tools(list: Vec<WireTool>) -> Result<Vec<Value>, ApiError> {
    let bad = |m: String| ApiError::invalid(m, Some("tools"));
    let mut names = std::collections::HashSet::new();
    for (i, t) in list.iter().enumerate() {
        if t.kind != "function" {
            return Err(bad(format!("tools[{i}].type must be \"function\"")));
        }
        let name = t.function.name.as_str();
        let ok = !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !ok {
            return Err(bad(format!("tools[{i}].function.name {name:?} must be 1-64 letters, digits, _, - or .")));
        }
        if !names.insert(name) {
            return Err(bad(format!("tools[{i}].function.name `{name}` is declared twice")));
        }
        if t.function.parameters.as_ref().is_some_and(|p| !p.is_object()) {
            return Err(bad(format!("tools[{i}].function.parameters must be a JSON Schema object")));
        }
    }
    list.iter().map(|t| serde_json::to_value(t).map_err(|e| bad(e.to_string()))).collect()
}

/// Checks a conversation (content present where the role needs it, tool answers matching
/// earlier calls) and parses each assistant tool call's `arguments` (a JSON string on the
/// wire) into an object, as the chat template renders mappings.
fn messages(msgs: Vec<WireMessage>) -> Result<Vec<Value>, ApiError> {
    let bad = |m: String| ApiError::invalid(m, Some("messages"));
    if msgs.is_empty() {
        return Err(bad("`messages` must not be empty".into()));
    }
    let mut call_ids = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(msgs.len());
    for (i, mut m) in msgs.into_iter().enumerate() {
        if m.content.is_none() && !(m.role == Role::Assistant && m.tool_calls.is_some()) {
            return Err(bad(format!("messages[{i}].content is required for a {} message", serde_json::to_value(m.role).unwrap_or_default().as_str().unwrap_or(""))));
        }
        if let Some(calls) = &mut m.tool_calls {
            if m.role != Role::Assistant {
                return Err(bad(format!("messages[{i}]: only assistant messages carry tool_calls")));
            }
            for (j, c) in calls.iter_mut().enumerate() {
                if c.kind != "function" {
                    return Err(bad(format!("messages[{i}].tool_calls[{j}].type must be \"function\"")));
                }
                let args = match std::mem::take(&mut c.function.arguments) {
                    Value::String(s) if s.trim().is_empty() => Value::Object(Default::default()),
                    Value::String(s) => serde_json::from_str(&s).map_err(|e| bad(format!("messages[{i}].tool_calls[{j}].function.arguments is not valid JSON: {e}")))?,
                    Value::Null => Value::Object(Default::default()),
                    v => v,
                };
                if !args.is_object() {
                    return Err(bad(format!("messages[{i}].tool_calls[{j}].function.arguments must be a JSON object (or its text)")));
                }
                c.function.arguments = args;
                if let Some(id) = &c.id {
                    call_ids.insert(id.clone());
                }
            }
        }
        if m.role == Role::Tool {
            let id = m.tool_call_id.as_deref().unwrap_or("");
            if !call_ids.contains(id) {
                return Err(bad(format!("messages[{i}]: tool message answers tool_call_id {id:?}, which no earlier assistant tool call has")));
            }
        }
        out.push(serde_json::to_value(&m).map_err(|e| bad(e.to_string()))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_chat(body: Value) -> Result<Parsed, ApiError> {
        parse(body.to_string().as_bytes(), Kind::Chat, 1000)
    }

    fn refused(body: Value) -> ApiError {
        parse_chat(body).expect_err("must be refused")
    }

    const HI: &str = r#"[{"role":"user","content":"Hi"}]"#;

    fn with(extra: Value) -> Value {
        let mut b = serde_json::json!({"messages": serde_json::from_str::<Value>(HI).unwrap()});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    }

    #[test]
    fn wrong_types_and_unknown_fields_name_their_path() {
        let e = refused(with(serde_json::json!({"stream": true, "stream_options": {"include_usage": "yes"}})));
        assert_eq!(e.param.as_deref(), Some("stream_options.include_usage"), "{e:?}");
        let e = refused(with(serde_json::json!({"mirostat": 2})));
        assert_eq!((e.param.as_deref(), e.code), (Some("mirostat"), Some("unsupported_parameter")));
        let e = refused(with(serde_json::json!({"stream": true, "stream_options": {"x": 1}})));
        assert_eq!(e.param.as_deref(), Some("stream_options.x"), "{e:?}");
        let e = refused(with(serde_json::json!({"parallel_tool_calls": "yes"})));
        assert_eq!(e.param.as_deref(), Some("parallel_tool_calls"));
        let e = refused(with(serde_json::json!({"stream_options": {"include_usage": true}})));
        assert_eq!(e.param.as_deref(), Some("stream_options"), "stream_options without stream");
    }

    #[test]
    fn message_content_must_be_text() {
        for (content, what) in [(serde_json::json!(5), "a number"), (serde_json::json!({"a": 1}), "an object")] {
            let e = refused(serde_json::json!({"messages": [{"role": "user", "content": content}]}));
            assert!(e.message.contains(what) && e.param.as_deref() == Some("messages[0].content"), "{e:?}");
        }
        let e = refused(serde_json::json!({"messages": [{"role": "user"}]}));
        assert!(e.message.contains("content is required"), "{e:?}");
        let e = refused(serde_json::json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}));
        assert!(e.message.contains("text"), "{e:?}");
        let e = refused(serde_json::json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}));
        assert!(e.message.contains("only text parts"), "{e:?}");
        assert!(parse_chat(serde_json::json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "a", "content": "ok"}]})).is_ok());
    }

    #[test]
    fn limits_and_defaults() {
        assert_eq!(refused(with(serde_json::json!({"max_tokens": 0}))).param.as_deref(), Some("max_tokens"));
        assert_eq!(parse_chat(with(serde_json::json!({"max_tokens": u64::MAX}))).unwrap().max_tokens, Some(usize::MAX));
        assert_eq!(refused(with(serde_json::json!({"logit_bias": {"+5": 1}}))).param.as_deref(), Some("logit_bias"));
        assert_eq!(parse_chat(with(serde_json::json!({"logit_bias": {"5": 1}}))).unwrap().sampling.logit_bias, vec![(5, 1.0)]);
        assert_eq!(refused(with(serde_json::json!({"response_format": {"type": "json_object"}, "stop": "}"}))).param.as_deref(), Some("stop"));
        let p = parse_chat(with(serde_json::json!({"temperature": null, "n": null}))).unwrap();
        assert_eq!((p.sampling.temperature, p.n), (1.0, 1));
        let e = parse(br#"{"prompt":[914, 4294968210]}"#, Kind::Completion, 1000).unwrap_err();
        assert!(e.message.contains("4294968210"), "{e:?}");
        let e = parse(br#"{"prompt":[914, 1.5]}"#, Kind::Completion, 1000).unwrap_err();
        assert!(e.message.contains("prompt[1]"), "{e:?}");
        assert!(parse(br#"{"prompt":"x","messages":[]}"#, Kind::Completion, 1000).unwrap_err().message.contains("messages"));
    }
}
