//! Arbitrary bytes as a JSON Schema, the way a request brings one: as `response_format`'s
//! schema (llguidance's compiler) and as a tool's `parameters` (frigg's translation into
//! Gemma's argument syntax, then llguidance's Lark compiler). Either a grammar or an error
//! comes back, never a crash or a hang (the compiler's work is bounded: `Grammars::new`).
#![no_main]
use frigg::generate::constrain::{Grammars, Spec, ToolChoice, ToolDecl, ToolTokens};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const TOKENIZER: &str = include_str!("../../tests/fixtures/tokenizer/tokenizer.json");

fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| {
        let tok = frigg::text::Tokenizer::from_json(TOKENIZER, Some(2), vec![1, 106], false, false).unwrap();
        Grammars::new(&tok.tok_env()).unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(schema) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let g = grammars();
    let _ = g.compile(&Spec::JsonSchema(schema.clone()));
    let ids = ToolTokens { call_open: 48, call_close: 49, response_open: 50, quote: 52 };
    let tools = vec![ToolDecl { name: "f".into(), parameters: Some(schema), strict: true }];
    let _ = g.compile(&Spec::Tools { tools, choice: ToolChoice::Required, parallel: true, ids });
});
