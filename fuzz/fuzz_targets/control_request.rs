//! The control protocol's request decoder, as the daemon runs it on every line a client sends
//! (`router::control::decode_request_bytes`): never panics; whatever decodes re-encodes (the
//! client's encoder) to one line that decodes to the same request; a refusal is typed (EMSGSIZE
//! over the cap, EPROTONOSUPPORT for an envelope of another protocol version, EPROTO
//! otherwise) with a short message, whatever the input's size.
//!
//! Seed corpus: `router/tests/corpus/control_request/` (replayed by `router/tests/control_corpus.rs`
//! in CI): `cargo fuzz run control_request ../router/tests/corpus/control_request`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../checks/control_request.rs"]
mod checks;

fuzz_target!(|data: &[u8]| {
    let _ = checks::check(data);
});
