//! One sequence from prompt to finish: PrefixLM prefill, sampled decode, EOS and stop strings.

pub mod constrain;
pub mod sampler;

use crate::engine::{Engine, EngineError, Rows};
use crate::generate::sampler::{Sampler, SamplingParams};
use crate::text::{StreamDecoder, Tokenizer, TokenizerError};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("{0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("prompt ({prompt} tokens) + max tokens ({max_tokens}) = {} exceeds the context length {limit}", prompt + max_tokens)]
    TooLong { prompt: usize, max_tokens: usize, limit: usize },
    #[error("invalid sampling parameters: {0}")]
    Sampling(String),
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
    if req.prompt.len() + req.max_tokens > limit {
        return Err(GenerateError::TooLong { prompt: req.prompt.len(), max_tokens: req.max_tokens, limit });
    }
    req.sampling.validate(engine.hparams().n_vocab as usize).map_err(GenerateError::Sampling)?;
    let types = req.token_types.clone().unwrap_or_else(|| vec![1; req.prompt.len()]);
    let t0 = Instant::now();
    let mut logits = engine.prefill(0, &req.prompt, Some(&types), Rows::Last)?.pop().expect("one row");
    let prefill = t0.elapsed();
    let t1 = Instant::now();
    let mut sampler = Sampler::new(req.sampling.clone());
    let mut dec = StreamDecoder::new();
    let mut tokens = vec![];
    let mut text = String::new();
    let mut finish = Finish::Length;
    let result = (|| {
        while tokens.len() < req.max_tokens {
            let c = sampler.sample(&mut logits);
            if !req.ignore_eos && tok.is_eos(c.token) {
                finish = Finish::Stop;
                break;
            }
            sampler.accept(c.token);
            tokens.push(c.token);
            dec.push(tok, c.token)?;
            let (piece, hit) = dec.next_piece(&req.stops);
            text.push_str(&piece);
            on_piece(&piece);
            if hit.is_some() {
                finish = Finish::Stop;
                return Ok(());
            }
            if tokens.len() == req.max_tokens {
                break;
            }
            logits = engine.decode(&[(0, c.token)])?.pop().expect("one row");
        }
        let rest = dec.flush(tok, &req.stops)?;
        text.push_str(&rest);
        on_piece(&rest);
        Ok::<(), GenerateError>(())
    })();
    engine.release(0);
    result?;
    Ok(Output { text, tokens, finish, prompt_tokens: req.prompt.len(), prefill, decode: t1.elapsed() })
}
