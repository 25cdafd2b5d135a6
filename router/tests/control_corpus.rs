//! Replays the committed corpus of the `control_request` fuzz target
//! (`fuzz/fuzz_targets/control_request.rs`) through the daemon's request decoder, so that CI
//! runs it without cargo-fuzz: `tests/corpus/control_request/ok-*` are valid requests, which
//! must decode and round-trip through the client's encoder (and together cover every kind of
//! request; serde also takes a struct as the sequence of its fields, `ok-net-show-as-seq`);
//! `err-eproto-*` are malformed, and must be refused with EPROTO and a short message.
//! Generated cases add what would be too big to commit: a line over the 1 MiB cap (EMSGSIZE).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use router::control::{errno, Request, MAX_REQUEST};

/// The kind of each request and the list of every kind, from one table. No wildcard in the
/// generated `match`: a new kind of request fails to compile here until the table names it, and
/// then the corpus replay below fails until the corpus has an example of it.
macro_rules! request_kinds {
    ($($pat:pat => $name:literal,)*) => {
        fn kind(r: &Request) -> &'static str {
            match r {
                $($pat => $name,)*
            }
        }

        const EVERY_KIND: &[&str] = &[$($name),*];
    };
}

request_kinds! {
    Request::Ping { .. } => "ping",
    Request::NetShow { .. } => "net_show",
    Request::PeerShow { .. } => "peer_show",
    Request::ConnShow => "conn_show",
    Request::StatsShow => "stats_show",
    Request::StatsReset => "stats_reset",
    Request::GlobalShow => "global_show",
    Request::CaptureStart { .. } => "capture_start",
    Request::CaptureStop { .. } => "capture_stop",
    Request::RouteShow { .. } => "route_show",
    Request::RouteAdd { .. } => "route_add",
    Request::RouteDel { .. } => "route_del",
    Request::RoutingShow => "routing_show",
    Request::SetRouting { .. } => "set_routing",
    Request::SetBuffers { .. } => "set_buffers",
    Request::SetRouterChecks { .. } => "set_router_checks",
    Request::SetGlobals { .. } => "set_globals",
    Request::Import { .. } => "import",
    Request::DebugRecovery { .. } => "debug_recovery",
    Request::Selftest { .. } => "selftest",
    Request::NetDel { .. } => "net_del",
    Request::LnetConfigure { .. } => "lnet_configure",
}

/// The fuzz target's own check (see there): never a panic, requests round-trip, refusals typed.
#[path = "../../fuzz/checks/control_request.rs"]
mod checks;
use checks::check;

/// The committed corpus files, in name order.
fn corpus_paths() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/control_request");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    paths
}

#[test]
fn corpus_replays_through_the_decoder() {
    let mut kinds = BTreeSet::new();
    let (mut ok, mut bad) = (0, 0);
    for path in corpus_paths() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let data = std::fs::read(&path).unwrap();
        let got = check(&data);
        if name.starts_with("ok-") {
            let req = got.unwrap_or_else(|e| panic!("{name}: refused with errno {e}"));
            kinds.insert(kind(&req));
            ok += 1;
        } else if name.starts_with("err-eproto-") {
            assert_eq!(got, Err(errno::EPROTO), "{name}");
            bad += 1;
        } else if name.starts_with("err-eprotonosupport-") {
            assert_eq!(got, Err(errno::EPROTONOSUPPORT), "{name}");
            bad += 1;
        } else {
            panic!("{name}: corpus files are named ok-*, err-eproto-* or err-eprotonosupport-*");
        }
    }
    let every: BTreeSet<&str> = EVERY_KIND.iter().copied().collect();
    assert_eq!(
        kinds, every,
        "the corpus lacks a valid request of some kind"
    );
    assert!(
        ok >= EVERY_KIND.len() && bad >= 10,
        "{ok} valid, {bad} malformed"
    );
}

#[test]
fn specific_requests_decode_as_expected() {
    assert_eq!(
        check(b"{\"capture_stop\":{\"id\":7}}\n"),
        Ok(Request::CaptureStop { id: 7 })
    );
    assert_eq!(
        check(b"{\"net_show\":{}}"),
        Ok(Request::NetShow { verbose: false })
    );
    assert_eq!(
        check(b"{\"ping\":{\"nids\":[\"0@lo\"]}}"),
        Ok(Request::Ping {
            nids: vec!["0@lo".into()],
            timeout_secs: None,
            source: None
        })
    );
}

#[test]
fn the_size_cap_is_a_typed_error() {
    // Just over the cap: EMSGSIZE even though the content would be a valid request.
    let mut line = vec![b' '; MAX_REQUEST + 1 - b"\"conn_show\"".len()];
    line.extend_from_slice(b"\"conn_show\"");
    assert_eq!(line.len(), MAX_REQUEST + 1);
    assert_eq!(check(&line), Err(errno::EMSGSIZE));
    // At the cap it is read.
    assert_eq!(check(&line[1..]), Ok(Request::ConnShow));
    // A long unknown variant name is quoted as an excerpt only.
    let long = format!("{{\"{}\":{{}}}}", "b".repeat(MAX_REQUEST - 16));
    assert_eq!(check(long.as_bytes()), Err(errno::EPROTO));
}

/// Without cargo-fuzz, a little of what it does: the corpus entries with random edits (bytes
/// flipped, cut, inserted, repeated), through the same checks.
mod mutated {
    use super::*;
    use proptest::prelude::*;

    fn corpus() -> Vec<Vec<u8>> {
        let mut v: Vec<_> = corpus_paths()
            .into_iter()
            .map(|p| std::fs::read(p).unwrap())
            .filter(|d| d.len() < 4096)
            .collect();
        v.sort();
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
        #[test]
        fn edits_of_the_corpus_never_break_the_decoder(
            pick in any::<prop::sample::Index>(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..6),
        ) {
            let seeds = corpus();
            let mut data = pick.get(&seeds).clone();
            for (at, byte, op) in edits {
                let i = if data.is_empty() { 0 } else { at.index(data.len()) };
                match op {
                    0 if !data.is_empty() => data[i] = byte,
                    1 => data.truncate(i),
                    2 => data.insert(i, byte),
                    _ => {
                        let tail = data[i..].to_vec();
                        data.extend_from_slice(&tail);
                    }
                }
            }
            let _ = check(&data);
        }
    }
}
