//! `lnet_perf --attackers`: hostile nodes that take every grant of a real `lnet-router` and
//! never fill it, while a legitimate client streams routed 1 MiB bulk PUTs. lnet_perf fails
//! unless every legitimate transfer ended `Ok`, the server counted as many as the client and
//! the router's books balance; here, the attack must also have happened as modelled (the
//! attackers' PUTs ended, the router reclaimed their grants, struck and refused them) and the
//! legitimate stream must have gone on during it. The rate kept is `benches/attack.sh`'s to
//! report.

mod common;

use common::lnet_perf_via_router;

/// The `name=value` pairs of the first `FIGURE <figure>` line.
fn pairs(stdout: &str, figure: &str) -> Vec<(String, f64)> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("FIGURE {figure} ")))
        .unwrap_or_else(|| panic!("no {figure} figure in:\n{stdout}"));
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

fn get(p: &[(String, f64)], k: &str) -> f64 {
    p.iter()
        .find(|(n, _)| n == k)
        .unwrap_or_else(|| panic!("no {k} in {p:?}"))
        .1
}

#[test]
fn hoarding_attackers_are_reclaimed_and_refused_while_a_routed_stream_goes_on() {
    let stdout = lnet_perf_via_router(
        "--bulk-put 4 --warmup 20 --attackers 8 --attack-after 1 --router-large 16",
    );
    let a = pairs(&stdout, "attackers");
    assert_eq!(get(&a, "n"), 8.0, "{stdout}");
    // Every attacker started a PUT, and PUTs of theirs ended refused or reclaimed.
    assert!(get(&a, "puts_sent") >= 8.0, "{stdout}");
    assert!(get(&a, "ended_failed") >= 1.0, "{stdout}");
    let r = pairs(&stdout, "router_attack_counters");
    assert!(get(&r, "grants_reclaimed") >= 1.0, "{stdout}");
    assert!(get(&r, "bulk_stalled") >= 1.0, "{stdout}");
    assert!(get(&r, "bulk_refused") >= 1.0, "{stdout}");
    // Legitimate PUTs completed during the attack.
    let during = pairs(&stdout, "ulnet_bulk_put_under_attack");
    assert!(get(&during, "value") > 0.0, "{stdout}");
}
