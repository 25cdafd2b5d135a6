//! A slow consumer behind a router: `lnet_perf --via-router --stall-server` stops the server
//! (SIGSTOP) under a PUT stream through a real `lnet-router` daemon. Upstream, the clients must
//! be throttled by credits (what they see complete stops growing), the router must hold a
//! bounded number of messages, and afterwards everything flows again, nothing is lost (lnet_perf
//! checks that the server received every PUT the clients saw complete) and the router's books
//! reconcile. The RSS figures it prints are reported by `benches/routed.sh`, not asserted here.

mod common;

use common::lnet_perf_via_router;

/// The value of `key=` in `line`.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

#[test]
fn a_stopped_server_throttles_its_senders_and_nothing_is_lost() {
    let stdout = lnet_perf_via_router("--put-rate 1 --clients 2 --stall-server 3");

    // Once the credits are used up (well within the first second), nothing more completes
    // and the router holds a fixed set of messages until the server continues.
    let samples: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("SAMPLE stall"))
        .collect();
    assert!(samples.len() >= 8, "{stdout}");
    let settled: Vec<&&str> = samples
        .iter()
        .filter(|l| {
            let t: f64 = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("t="))
                .and_then(|v| v.parse().ok())
                .unwrap();
            t >= 1.0
        })
        .collect();
    assert!(settled.len() >= 4, "{stdout}");
    for key in ["client_completed", "received", "in_flight"] {
        let first = field(settled[0], key);
        assert!(
            settled.iter().all(|l| field(l, key) == first),
            "{key} moved while the server was stopped:\n{stdout}"
        );
    }
    let held = field(settled[0], "in_flight");
    assert!(held > 0, "the router held nothing:\n{stdout}");

    // Afterwards the stream ran again and the books reconcile with nothing left inside.
    let books = stdout
        .lines()
        .find(|l| l.starts_with("FIGURE router_books"))
        .unwrap_or_else(|| panic!("no books:\n{stdout}"));
    assert_eq!(field(books, "in_flight"), 0, "{books}");
    assert_eq!(field(books, "dropped"), 0, "{books}");
    assert_eq!(
        field(books, "received"),
        field(books, "forwarded"),
        "{books}"
    );
    assert!(
        field(books, "received") > field(settled[0], "received"),
        "nothing was forwarded after the stall: {books}"
    );
}
