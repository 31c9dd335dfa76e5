//! Arbitrary token ids and stop strings through the streaming detokenizer: pieces never
//! contain a stop string and concatenate to the one-shot decode cut at the first stop.
#![no_main]
use frigg::text::{StreamDecoder, Tokenizer};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const TOKENIZER: &str = include_str!("../../tests/fixtures/tokenizer/tokenizer.json");

fn tok() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_json(TOKENIZER, Some(2), vec![1, 106], false, false).unwrap())
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let n_stop = (data[0] % 8) as usize;
    let stop = String::from_utf8_lossy(&data[1..(1 + n_stop).min(data.len())]).into_owned();
    let ids: Vec<u32> = data[(1 + n_stop).min(data.len())..].chunks(2).map(|c| (c[0] as u32 | (*c.get(1).unwrap_or(&0) as u32) << 8) % 1280).collect();
    let t = tok();
    let stops: Vec<String> = if stop.is_empty() { vec![] } else { vec![stop] };
    let full = t.decode(&ids, true).unwrap();
    let mut d = StreamDecoder::new();
    let mut out = String::new();
    let mut hit = false;
    for &id in &ids {
        d.push(t, id).unwrap();
        let (piece, h) = d.next_piece(&stops);
        for s in &stops {
            assert!(!piece.contains(s.as_str()));
        }
        out.push_str(&piece);
        if h.is_some() {
            hit = true;
            break;
        }
    }
    if !hit {
        out.push_str(&d.flush(t, &stops).unwrap());
    }
    let want = match stops.iter().filter_map(|s| full.find(s.as_str())).min() {
        Some(at) => &full[..at],
        None => &full[..],
    };
    assert_eq!(out, want);
});
