//! Text in and out: the tokenizer (and the streaming detokenizer) and the chat template.

pub mod chat;
pub mod tokenizer;

pub use chat::ChatTemplate;
pub use tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
