//! Arbitrary bytes as a chat request body: parse and validate as the server does, then render
//! the messages (and tools) through frigg's chat template and tokenize them as the server does
//! (client text spelling special tokens escaped). Must return errors, never crash.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const TEMPLATE: &str = include_str!("../../tests/fixtures/tokenizer/chat_template.jinja");
const TOKENIZER: &str = include_str!("../../tests/fixtures/tokenizer/tokenizer.json");

fn tools() -> &'static (frigg::text::chat::ChatTemplate, frigg::text::Tokenizer) {
    static T: OnceLock<(frigg::text::chat::ChatTemplate, frigg::text::Tokenizer)> = OnceLock::new();
    T.get_or_init(|| {
        (
            frigg::text::chat::ChatTemplate::new(TEMPLATE, "<bos>", "<eos>").unwrap(),
            frigg::text::Tokenizer::from_json(TOKENIZER, Some(2), vec![1, 106], false, false).unwrap(),
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let (tmpl, tok) = tools();
    if let Ok(p) = frigg::serve::api::parse(data, frigg::serve::api::Kind::Chat, 1280) {
        let tools = (!p.tools.is_empty()).then_some(p.tools.as_slice());
        let _ = tmpl.encode(tok, p.messages.as_deref().unwrap_or_default(), tools, true);
    }
});
