//! Replays the tcp fabric's frame corpus (`tests/corpus/tcp_frame/*.bin`, also the seed corpus of the
//! `tcp_frame` fuzz target) through the fabric's frame parser: every file is a byte stream as a
//! socket would deliver it. Frames that parse must re-encode to the same bytes through the
//! encoders the fabric sends with; each stream must end as this table says (cleanly, truncated,
//! or with its typed error after the frames before it). A file without an entry here, or an
//! entry without a file, fails the test.

mod common;

use lnd::driver::tcp::frame::{self, FrameError, FrameKind};

use FrameKind::{ConnAck, ConnReq, Disconnect, Msg, RdmaWrite, Reject};

/// How a stream ends after its whole frames.
type End = Result<(), FrameError>;

fn bad_length(kind: u8, len: u32) -> End {
    Err(FrameError::BadLength { kind, len })
}

/// Each corpus file: the kinds of its whole frames, in order, and how it ends.
fn expected() -> Vec<(&'static str, Vec<FrameKind>, End)> {
    vec![
        ("ok-connreq.bin", vec![ConnReq], Ok(())),
        ("ok-connreq-private-max.bin", vec![ConnReq], Ok(())),
        ("ok-connack.bin", vec![ConnAck], Ok(())),
        ("ok-connack-empty.bin", vec![ConnAck], Ok(())),
        ("ok-reject.bin", vec![Reject], Ok(())),
        ("ok-msg-min.bin", vec![Msg], Ok(())),
        ("ok-msg-max.bin", vec![Msg], Ok(())),
        ("ok-disconnect.bin", vec![Disconnect], Ok(())),
        ("ok-rdma-write.bin", vec![RdmaWrite], Ok(())),
        ("ok-rdma-write-no-data.bin", vec![RdmaWrite], Ok(())),
        (
            "ok-stream.bin",
            vec![ConnAck, Msg, RdmaWrite, Msg, Disconnect],
            Ok(()),
        ),
        ("bad-kind-0.bin", vec![], Err(FrameError::BadKind(0))),
        ("bad-kind-7.bin", vec![], Err(FrameError::BadKind(7))),
        ("bad-length-zero.bin", vec![], bad_length(1, 0)),
        ("bad-msg-empty.bin", vec![], bad_length(4, 1)),
        ("bad-msg-too-long.bin", vec![], bad_length(4, 4098)),
        ("bad-connreq-65.bin", vec![], bad_length(1, 66)),
        ("bad-disconnect-body.bin", vec![], bad_length(5, 2)),
        ("bad-rdma-write-short.bin", vec![], bad_length(6, 12)),
        ("bad-length-max.bin", vec![], bad_length(4, u32::MAX)),
        ("bad-after-good.bin", vec![Msg], Err(FrameError::BadKind(9))),
        ("truncated-msg.bin", vec![], Err(FrameError::Truncated)),
        (
            "truncated-head.bin",
            vec![Disconnect],
            Err(FrameError::Truncated),
        ),
    ]
}

/// Splits a whole stream into frames; checks that each re-encodes to its own bytes.
fn replay(name: &str, bytes: &[u8]) -> (Vec<FrameKind>, End) {
    let mut kinds = Vec::new();
    let mut rest = bytes;
    loop {
        match frame::split_frame(rest) {
            Ok(Some((head, body, after))) => {
                assert_eq!(head.frame_len(), rest.len() - after.len(), "{name}");
                assert!(head.kind.body_range().contains(&body.len()), "{name}");
                let mut out = Vec::new();
                frame::push_parsed(&mut out, head, body);
                assert_eq!(
                    out,
                    &rest[..head.frame_len()],
                    "{name}: frame {} re-encodes differently",
                    kinds.len()
                );
                kinds.push(head.kind);
                rest = after;
            }
            // Incomplete at the end of the stream: what the fabric counts as truncated.
            Ok(None) if rest.is_empty() => return (kinds, Ok(())),
            Ok(None) => return (kinds, Err(FrameError::Truncated)),
            Err(e) => return (kinds, Err(e)),
        }
    }
}

#[test]
fn tcp_frame_corpus_replays_as_expected() {
    let (dir, files) = common::corpus_bins("tcp_frame");
    let table = expected();
    let mut named: Vec<String> = table.iter().map(|(n, ..)| n.to_string()).collect();
    named.sort();
    assert_eq!(files, named, "corpus files and the expectations differ");

    let mut kinds_seen = std::collections::HashSet::new();
    for (name, kinds, end) in table {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let got = replay(name, &bytes);
        assert_eq!(got, (kinds, end), "{name}");
        kinds_seen.extend(got.0);
        // A good stream cut anywhere inside is incomplete, never an error.
        if got.1.is_ok() && bytes.len() > 1 {
            let cut = &bytes[..bytes.len() - 1];
            assert_eq!(replay(name, cut).1, Err(FrameError::Truncated), "{name}");
        }
    }
    assert_eq!(kinds_seen.len(), 6, "every frame kind is in the corpus");
}
