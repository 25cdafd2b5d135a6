//! The control-request check, written once for its two runners: the `control_request` fuzz
//! target (`fuzz/fuzz_targets/control_request.rs`) and the corpus replay CI runs without
//! cargo-fuzz (`router/tests/control_corpus.rs`). Each includes this file with `#[path]`, so
//! a check added here holds in both.

use router::control::{decode_request_bytes, encode_request, errno, Request, MAX_REQUEST};

/// What the daemon's request decoder must do with any input: never panic; a request re-encodes
/// (the client's encoder) to one line within the cap that decodes to the same request; a refusal
/// is typed (EMSGSIZE over the cap, EPROTONOSUPPORT for an envelope of another protocol version,
/// EPROTO otherwise) with a short message, whatever the input's size. Returns the request or
/// the refusal's errno.
pub fn check(data: &[u8]) -> Result<Request, i32> {
    match decode_request_bytes(data) {
        Ok(req) => {
            let line = encode_request(&req).expect("a request encodes");
            assert_eq!(line.matches('\n').count(), 1, "{line:?}");
            assert!(line.len() <= MAX_REQUEST);
            assert_eq!(decode_request_bytes(line.as_bytes()), Ok(req.clone()));
            Ok(req)
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
            assert!(
                e.message.chars().count() <= 300,
                "{} chars",
                e.message.len()
            );
            Err(e.errno)
        }
    }
}
