//! OpenAI's response shapes, as serde types: errors, chat completions and their chunks, legacy
//! completions and theirs, usage and logprobs. (Requests are parsed in `api`.)

use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
}

#[derive(Debug, Serialize)]
pub struct ErrorDetail<'a> {
    pub message: &'a str,
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub param: Option<&'a str>,
    pub code: Option<&'a str>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens }
    }
}

/// What a response or chunk of one request repeats.
#[derive(Debug, Clone, Serialize)]
pub struct Head<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
}

/// A non-streamed reply: `chat.completion` or `text_completion`.
#[derive(Debug, Serialize)]
pub struct Response<'a, C> {
    #[serde(flatten)]
    pub head: Head<'a>,
    pub choices: Vec<C>,
    pub usage: Usage,
}

/// One streamed chunk; the last one, when usage is asked for, has no choices.
#[derive(Debug, Serialize)]
pub struct Chunk<'a, C> {
    #[serde(flatten)]
    pub head: Head<'a>,
    pub choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: Message,
    pub logprobs: Option<Logprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct Message {
    pub role: &'static str,
    /// None when the reply is tool calls only.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// A JSON object's text.
    pub arguments: String,
}

#[derive(Debug, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<Logprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A tool call's first chunk carries its id, type and name; later ones its arguments.
#[derive(Debug, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// `text_completion`'s choice, in a response and in a chunk.
#[derive(Debug, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<Logprobs>,
    pub finish_reason: Option<&'static str>,
}

/// Logprobs in the route's shape.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Logprobs {
    /// Chat: `{"content": [...]}`.
    Chat { content: Vec<TokenLogprob> },
    /// Legacy completions: parallel lists, `text_offset` in characters of the choice's text.
    Legacy { tokens: Vec<String>, token_logprobs: Vec<f32>, top_logprobs: Vec<serde_json::Map<String, serde_json::Value>>, text_offset: Vec<usize> },
}

impl Logprobs {
    /// Appends `more` (of the same shape) after this one's tokens.
    pub fn extend(&mut self, more: Logprobs) {
        match (self, more) {
            (Logprobs::Chat { content }, Logprobs::Chat { content: c }) => content.extend(c),
            (Logprobs::Legacy { tokens, token_logprobs, top_logprobs, text_offset }, Logprobs::Legacy { tokens: t, token_logprobs: l, top_logprobs: p, text_offset: o }) => {
                tokens.extend(t);
                token_logprobs.extend(l);
                top_logprobs.extend(p);
                text_offset.extend(o);
            }
            _ => unreachable!("one request's logprobs have one shape"),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<TokenLogprob>>,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize)]
pub struct ModelList<'a> {
    pub object: &'static str,
    pub data: Vec<Model<'a>>,
}

#[derive(Debug, Serialize)]
pub struct Model<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}
