//! Arbitrary bytes as the tokens of a tool reply and as a call's arguments: the call tracker
//! follows any token sequence, and `args_to_json` parses or refuses any bytes, never crashing
//! (the grammar guarantees well-formed calls; these two must not trust it).
#![no_main]
use frigg::generate::constrain::gemma::{args_to_json, CallTracker, ToolTokens};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = args_to_json(data);
    let ids = ToolTokens { call_open: 48, call_close: 49, response_open: 50, quote: 52 };
    let mut t = CallTracker::new(ids);
    for chunk in data.chunks(3) {
        let token = 46 + u32::from(chunk[0] % 8);
        t.advance(token, &chunk[1..]);
    }
});
