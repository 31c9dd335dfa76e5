//! Arbitrary bytes fed to the constrained-decoding automata (JSON and Gemma tool arguments):
//! whatever prefix they accept must complete with `closing()` into text that parses.
#![no_main]
use frigg::constrain::{gemma_args_to_json, Dialect, ValueMachine};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let dialect = if mode % 2 == 0 { Dialect::Json } else { Dialect::GemmaArgs };
    let mut m = ValueMachine::new(dialect);
    let mut accepted = vec![];
    for &b in rest {
        match m.accepts(&[b]) {
            Some(next) => {
                m = next;
                accepted.push(b);
            }
            None => break,
        }
    }
    accepted.extend(m.closing());
    match dialect {
        Dialect::Json => {
            let v: serde_json::Value = serde_json::from_slice(&accepted).expect("accepted + closing is JSON");
            assert!(v.is_object());
        }
        Dialect::GemmaArgs => {
            gemma_args_to_json(&accepted).expect("accepted + closing parses");
        }
    }
});
