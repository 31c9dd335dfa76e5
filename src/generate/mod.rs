//! One sequence from prompt to finish: PrefixLM prefill, sampled decode, EOS and stop strings.

pub mod constrain;
pub mod sampler;
pub mod sequence;

use crate::engine::{Engine, EngineError, Rows, StreamId, TokenId};
use crate::generate::sampler::SamplingParams;
use crate::text::{Tokenizer, TokenizerError};
use sequence::{Sequence, SequenceParams};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("{0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("prompt ({prompt} tokens) + max tokens ({max_tokens}) = {} exceeds the context length {limit}", *prompt as u128 + *max_tokens as u128)]
    TooLong { prompt: usize, max_tokens: usize, limit: usize },
    #[error("invalid sampling parameters: {0}")]
    Sampling(String),
    #[error("{0}")]
    Sequence(String),
}

#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// The prompt's token types: None = all ones (the PrefixLM prompt, as Mimir was trained);
    /// `--causal-prompt` passes zeros to measure what ignoring the mask costs.
    pub token_types: Option<Vec<i32>>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stops: Vec<String>,
    pub ignore_eos: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    Stop,
    Length,
    /// The turn ended after tool calls (OpenAI's `tool_calls`).
    ToolCalls,
}

#[derive(Debug, Clone)]
pub struct Output {
    pub text: String,
    pub tokens: Vec<u32>,
    pub finish: Finish,
    pub prompt_tokens: usize,
    pub prefill: Duration,
    pub decode: Duration,
}

/// Generates on stream 0 of `engine`, calling `on_piece` with each piece of text as soon as it
/// is final (stop strings held back, whole characters only).
pub fn generate(engine: &mut Engine, tok: &Tokenizer, req: &Request, mut on_piece: impl FnMut(&str)) -> Result<Output, GenerateError> {
    let limit = engine.n_ctx();
    if req.prompt.len().checked_add(req.max_tokens).is_none_or(|n| n > limit) {
        return Err(GenerateError::TooLong { prompt: req.prompt.len(), max_tokens: req.max_tokens, limit });
    }
    req.sampling.validate(engine.hparams().n_vocab as usize).map_err(GenerateError::Sampling)?;
    let types = req.token_types.clone().unwrap_or_else(|| vec![1; req.prompt.len()]);
    let t0 = Instant::now();
    let stream = StreamId(0);
    let mut logits = engine.prefill(stream, TokenId::slice(&req.prompt), Some(&types), Rows::Last)?.row(0).to_vec();
    let prefill = t0.elapsed();
    let t1 = Instant::now();
    let params = SequenceParams { sampling: req.sampling.clone(), stops: req.stops.clone(), ignore_eos: req.ignore_eos, max_tokens: req.max_tokens, logprobs: None };
    let mut seq = Sequence::new(params, None, None);
    let mut text = String::new();
    let mut out = vec![];
    let mut emit = |out: &mut Vec<sequence::Output>| {
        for o in out.drain(..) {
            if let sequence::Output::Text { text: piece, .. } = o {
                text.push_str(&piece);
                on_piece(&piece);
            }
        }
    };
    let result = (|| {
        while let Some(token) = seq.advance(tok, &mut logits, &mut out).map_err(GenerateError::Sequence)? {
            emit(&mut out);
            engine.decode(&[(stream, TokenId(token))])?.copy_row_to(0, &mut logits);
        }
        emit(&mut out);
        Ok::<(), GenerateError>(())
    })();
    engine.release(stream);
    result?;
    let finish = seq.finish().expect("the loop runs until the sequence ends");
    Ok(Output { text, tokens: seq.tokens().to_vec(), finish, prompt_tokens: req.prompt.len(), prefill, decode: t1.elapsed() })
}
