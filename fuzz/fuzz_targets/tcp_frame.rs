//! The tcp fabric's frame stream (`lnd::driver::tcp::frame`): splitting never panics, every frame
//! that parses re-encodes to the same bytes, and a bad head is refused before its body.
//! Seed corpus: `lnd/tests/corpus/tcp_frame/` (replayed by `lnd/tests/tcp_frame_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lnd::driver::tcp::frame;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let mut out = Vec::new();
    while let Ok(Some((head, body, after))) = frame::split_frame(rest) {
        assert!(head.kind.body_range().contains(&body.len()));
        out.clear();
        frame::push_parsed(&mut out, head, body);
        assert_eq!(out, &rest[..head.frame_len()]);
        rest = after;
    }
    // What the head says about the rest does not depend on its body.
    if let Some(h) = rest.get(..frame::HEAD_LEN) {
        assert_eq!(frame::parse_head(rest), frame::parse_head(h));
    }
});
