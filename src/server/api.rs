//! OpenAI request parsing. Every parameter is either implemented, accepted because it has no
//! effect here (`user`), or refused with 400 naming it — never silently ignored (seed 000,
//! Finding 10). Stock clients' default values are accepted.

use crate::sampler::SamplingParams;
use serde_json::{Map, Value};

/// A 4xx answer in OpenAI's error shape.
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

    pub fn body(&self) -> Value {
        serde_json::json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// What a chat or completion request asks the engine for, after validation.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub prompt_text: Option<String>,
    pub prompt_ids: Option<Vec<u32>>,
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
    /// `response_format: json_object`.
    pub json_object: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoiceParam {
    None,
    Auto,
    Required,
    Named(String),
}

pub enum Kind {
    Chat,
    Completion,
}

fn num(v: &Value, name: &str) -> Result<f64, ApiError> {
    v.as_f64().ok_or_else(|| ApiError::invalid(format!("`{name}` must be a number"), Some(name)))
}

fn uint(v: &Value, name: &str) -> Result<usize, ApiError> {
    v.as_u64().map(|x| x as usize).ok_or_else(|| ApiError::invalid(format!("`{name}` must be a non-negative integer"), Some(name)))
}

/// Parses and validates a request body.
pub fn parse(body: &Map<String, Value>, kind: Kind, n_vocab: usize) -> Result<Parsed, ApiError> {
    let mut p = Parsed {
        prompt_text: None,
        prompt_ids: None,
        messages: None,
        max_tokens: None,
        sampling: SamplingParams { temperature: 1.0, ..Default::default() },
        n: 1,
        stops: vec![],
        stream: false,
        include_usage: false,
        logprobs: None,
        ignore_eos: false,
        tools: vec![],
        tool_choice: ToolChoiceParam::Auto,
        parallel_tool_calls: true,
        json_object: false,
    };
    let mut tool_choice: Option<ToolChoiceParam> = None;
    let mut want_logprobs = false;
    let mut top_logprobs = 0usize;
    for (k, v) in body {
        if v.is_null() {
            continue; // an explicit null is the default
        }
        match (k.as_str(), &kind) {
            ("model" | "user", _) => {}
            ("messages", Kind::Chat) => {
                let msgs = v.as_array().ok_or_else(|| ApiError::invalid("`messages` must be an array", Some("messages")))?;
                if msgs.is_empty() {
                    return Err(ApiError::invalid("`messages` must not be empty", Some("messages")));
                }
                for (i, m) in msgs.iter().enumerate() {
                    let role = m.get("role").and_then(Value::as_str).unwrap_or("");
                    if !["system", "developer", "user", "assistant", "tool"].contains(&role) {
                        return Err(ApiError::invalid(format!("messages[{i}].role `{role}` is not one of system, developer, user, assistant, tool"), Some("messages")));
                    }
                    if let Some(Value::Array(parts)) = m.get("content") {
                        for part in parts {
                            if part.get("type").and_then(Value::as_str) != Some("text") {
                                return Err(ApiError::unsupported("messages", "only text content parts are supported (HRM-Text is a text model)"));
                            }
                        }
                    }
                }
                p.messages = Some(tool_history(msgs)?);
            }
            ("prompt", Kind::Completion) => match v {
                Value::String(s) => p.prompt_text = Some(s.clone()),
                Value::Array(a) if a.len() == 1 && a[0].is_string() => p.prompt_text = a[0].as_str().map(str::to_string),
                Value::Array(a) if a.iter().all(Value::is_u64) => {
                    let ids: Vec<u32> = a.iter().map(|x| x.as_u64().unwrap_or(0) as u32).collect();
                    if let Some(bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                        return Err(ApiError::invalid(format!("token id {bad} is outside the vocabulary ({n_vocab})"), Some("prompt")));
                    }
                    p.prompt_ids = Some(ids);
                }
                _ => return Err(ApiError::unsupported("prompt", "give one string or one list of token ids (batched prompts: send one request each)")),
            },
            ("max_tokens" | "max_completion_tokens", _) => p.max_tokens = Some(uint(v, k)?),
            ("temperature", _) => p.sampling.temperature = num(v, k)? as f32,
            ("top_p", _) => p.sampling.top_p = num(v, k)? as f32,
            ("top_k", _) => p.sampling.top_k = uint(v, k)?,
            ("min_p", _) => p.sampling.min_p = num(v, k)? as f32,
            ("seed", _) => p.sampling.seed = Some(v.as_i64().ok_or_else(|| ApiError::invalid("`seed` must be an integer", Some("seed")))? as u64),
            ("repetition_penalty", _) => p.sampling.repetition_penalty = num(v, k)? as f32,
            ("frequency_penalty", _) => p.sampling.frequency_penalty = num(v, k)? as f32,
            ("presence_penalty", _) => p.sampling.presence_penalty = num(v, k)? as f32,
            ("logit_bias", _) => {
                let o = v.as_object().ok_or_else(|| ApiError::invalid("`logit_bias` must map token ids to numbers", Some("logit_bias")))?;
                for (id, b) in o {
                    let id: u32 = id.parse().map_err(|_| ApiError::invalid(format!("logit_bias key {id:?} is not a token id"), Some("logit_bias")))?;
                    p.sampling.logit_bias.push((id, num(b, "logit_bias")? as f32));
                }
            }
            ("n", _) => {
                p.n = uint(v, k)?;
                if !(1..=8).contains(&p.n) {
                    return Err(ApiError::invalid("`n` must be between 1 and 8", Some("n")));
                }
            }
            ("stop", _) => {
                p.stops = match v {
                    Value::String(s) => vec![s.clone()],
                    Value::Array(a) if a.len() <= 4 && a.iter().all(Value::is_string) => a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect(),
                    _ => return Err(ApiError::invalid("`stop` must be a string or a list of up to 4 strings", Some("stop"))),
                };
                p.stops.retain(|s| !s.is_empty());
            }
            ("stream", _) => p.stream = v.as_bool().ok_or_else(|| ApiError::invalid("`stream` must be a boolean", Some("stream")))?,
            ("stream_options", _) => {
                let o = v.as_object().ok_or_else(|| ApiError::invalid("`stream_options` must be an object", Some("stream_options")))?;
                for (sk, sv) in o {
                    match sk.as_str() {
                        "include_usage" => p.include_usage = sv.as_bool().unwrap_or(false),
                        other => return Err(ApiError::unsupported(&format!("stream_options.{other}"), "only include_usage is implemented")),
                    }
                }
            }
            ("logprobs", Kind::Chat) => want_logprobs = v.as_bool().ok_or_else(|| ApiError::invalid("`logprobs` must be a boolean", Some("logprobs")))?,
            ("top_logprobs", Kind::Chat) => top_logprobs = uint(v, k)?,
            ("logprobs", Kind::Completion) => {
                want_logprobs = true;
                top_logprobs = uint(v, k)?;
            }
            ("response_format", _) => match v.get("type").and_then(Value::as_str) {
                Some("text") => {}
                Some("json_object") => p.json_object = true,
                Some("json_schema") => return Err(ApiError::unsupported("response_format", "json_schema is not enforced by frigg (json_object is); refused rather than ignored")),
                _ => return Err(ApiError::invalid("`response_format.type` must be text, json_object or json_schema", Some("response_format"))),
            },
            ("tools", Kind::Chat) => p.tools = parse_tools(v)?,
            ("tool_choice", Kind::Chat) => {
                tool_choice = Some(match v {
                    Value::String(s) if s == "none" => ToolChoiceParam::None,
                    Value::String(s) if s == "auto" => ToolChoiceParam::Auto,
                    Value::String(s) if s == "required" => ToolChoiceParam::Required,
                    Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                        match o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
                            Some(n) => ToolChoiceParam::Named(n.to_string()),
                            None => return Err(ApiError::invalid("`tool_choice.function.name` is required", Some("tool_choice"))),
                        }
                    }
                    _ => return Err(ApiError::invalid("`tool_choice` must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}", Some("tool_choice"))),
                })
            }
            ("parallel_tool_calls", Kind::Chat) => p.parallel_tool_calls = v.as_bool().ok_or_else(|| ApiError::invalid("`parallel_tool_calls` must be a boolean", Some("parallel_tool_calls")))?,
            ("ignore_eos", _) => p.ignore_eos = v.as_bool().ok_or_else(|| ApiError::invalid("`ignore_eos` must be a boolean", Some("ignore_eos")))?,
            ("echo", Kind::Completion) if v == &Value::Bool(false) => {}
            ("best_of", Kind::Completion) if v.as_u64() == Some(1) => {}
            ("store", Kind::Chat) if v == &Value::Bool(false) => {}
            (other, _) => return Err(ApiError::unsupported(other, "unknown or unimplemented parameter")),
        }
    }
    if want_logprobs {
        if top_logprobs > 20 {
            return Err(ApiError::invalid("`top_logprobs` must be at most 20", Some("top_logprobs")));
        }
        p.logprobs = Some(top_logprobs);
    } else if top_logprobs > 0 && matches!(kind, Kind::Chat) {
        return Err(ApiError::invalid("`top_logprobs` requires `logprobs: true`", Some("top_logprobs")));
    }
    match (tool_choice, p.tools.is_empty()) {
        (Some(ToolChoiceParam::None) | None, true) => p.tool_choice = ToolChoiceParam::None,
        (Some(_), true) => return Err(ApiError::invalid("`tool_choice` needs `tools`", Some("tool_choice"))),
        (Some(ToolChoiceParam::Named(n)), false) if !p.tools.iter().any(|t| t["function"]["name"] == n.as_str()) => {
            return Err(ApiError::invalid(format!("`tool_choice` names `{n}`, which is not among `tools`"), Some("tool_choice")));
        }
        (Some(c), false) => p.tool_choice = c,
        (None, false) => p.tool_choice = ToolChoiceParam::Auto,
    }
    if p.json_object && p.tool_choice != ToolChoiceParam::None {
        return Err(ApiError::invalid("`response_format: json_object` and tool calls cannot be combined", Some("response_format")));
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

/// Validates `tools`: a list of `{"type": "function", "function": {"name", "description",
/// "parameters"}}` with distinct names the call grammar can match (letters, digits, `_`, `-`, `.`).
fn parse_tools(v: &Value) -> Result<Vec<Value>, ApiError> {
    let bad = |m: String| ApiError::invalid(m, Some("tools"));
    let list = v.as_array().ok_or_else(|| bad("`tools` must be a list".into()))?;
    let mut names = std::collections::HashSet::new();
    for (i, t) in list.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(format!("tools[{i}].type must be \"function\"")));
        }
        let name = t.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or("");
        let ok = !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !ok {
            return Err(bad(format!("tools[{i}].function.name {name:?} must be 1-64 letters, digits, _, - or .")));
        }
        if !names.insert(name) {
            return Err(bad(format!("tools[{i}].function.name `{name}` is declared twice")));
        }
        if let Some(params) = t["function"].get("parameters") {
            if !params.is_object() && !params.is_null() {
                return Err(bad(format!("tools[{i}].function.parameters must be a JSON Schema object")));
            }
        }
    }
    Ok(list.clone())
}

/// Checks a conversation's tool history and parses each assistant tool call's `arguments`
/// (a JSON string on the wire) into an object, as the chat template renders mappings.
/// A `tool` message must answer a call made earlier in the conversation.
fn tool_history(msgs: &[Value]) -> Result<Vec<Value>, ApiError> {
    let bad = |m: String| ApiError::invalid(m, Some("messages"));
    let mut call_ids = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let mut m = m.clone();
        let role = m.get("role").and_then(Value::as_str).unwrap_or("").to_string();
        if let Some(calls) = m.get_mut("tool_calls").filter(|c| !c.is_null()) {
            if role != "assistant" {
                return Err(bad(format!("messages[{i}]: only assistant messages carry tool_calls")));
            }
            let calls = calls.as_array_mut().ok_or_else(|| bad(format!("messages[{i}].tool_calls must be a list")))?;
            for (j, c) in calls.iter_mut().enumerate() {
                let f = c.get_mut("function").filter(|f| f.is_object()).ok_or_else(|| bad(format!("messages[{i}].tool_calls[{j}].function is required")))?;
                if !f.get("name").is_some_and(Value::is_string) {
                    return Err(bad(format!("messages[{i}].tool_calls[{j}].function.name is required")));
                }
                let args = match f.get("arguments") {
                    Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Default::default()),
                    Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| bad(format!("messages[{i}].tool_calls[{j}].function.arguments is not valid JSON: {e}")))?,
                    Some(v @ Value::Object(_)) => v.clone(),
                    None | Some(Value::Null) => Value::Object(Default::default()),
                    Some(_) => return Err(bad(format!("messages[{i}].tool_calls[{j}].function.arguments must be a JSON object (or its text)"))),
                };
                if !args.is_object() {
                    return Err(bad(format!("messages[{i}].tool_calls[{j}].function.arguments must be a JSON object")));
                }
                f["arguments"] = args;
                if let Some(id) = c.get("id").and_then(Value::as_str) {
                    call_ids.insert(id.to_string());
                }
            }
        }
        if role == "tool" {
            let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
            if !call_ids.contains(id) {
                return Err(bad(format!("messages[{i}]: tool message answers tool_call_id {id:?}, which no earlier assistant tool call has")));
            }
        }
        out.push(m);
    }
    Ok(out)
}
