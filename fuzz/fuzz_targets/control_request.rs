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
use router::control::{decode_request_bytes, encode_request, errno, MAX_REQUEST};

fuzz_target!(|data: &[u8]| {
    match decode_request_bytes(data) {
        Ok(req) => {
            let line = encode_request(&req).expect("a request encodes");
            assert_eq!(line.matches('\n').count(), 1, "{line:?}");
            assert_eq!(decode_request_bytes(line.as_bytes()), Ok(req));
        }
        Err(e) => {
            let want = if data.len() > MAX_REQUEST {
                errno::EMSGSIZE
            } else if e.errno == errno::EPROTONOSUPPORT {
                // An envelope whose version is not ours: the mismatch is named, not a
                // malformed line.
                assert!(e.message.contains("control protocol mismatch"), "{e:?}");
                errno::EPROTONOSUPPORT
            } else {
                errno::EPROTO
            };
            assert_eq!(e.errno, want, "{e:?}");
            assert!(e.message.chars().count() <= 300, "{}", e.message);
        }
    }
});
