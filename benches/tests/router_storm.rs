//! The router reboot storm with real processes, small: a swarm of clients and a server in one
//! process ping each other through a real `lnet-router`, which is SIGKILLed with pings in flight
//! and restarted.
//! `router_storm` exits 1 if a client does not recover, a ping is never accounted for, a race
//! count reaches the limit, a peer has more than one zombie or the router's books do not
//! reconcile; this test also reads its figures. (`benches/`: the same with 1,000 clients.)

mod common;

use std::process::Command;

use common::{router_bin, stdout_of_success};

/// The value of `key=` on the `FIGURE name` line.
fn figure(out: &str, name: &str, key: &str) -> String {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("FIGURE {name} ")))
        .unwrap_or_else(|| panic!("no FIGURE {name} in\n{out}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
        .to_string()
}

fn num(out: &str, name: &str, key: &str) -> u64 {
    figure(out, name, key).parse().unwrap()
}

#[test]
fn every_client_resumes_after_the_router_is_killed_and_restarted() {
    // The clients and the router need a few descriptors each: raise the soft limit in a shell
    // that then becomes the storm (root may raise the hard limit too).
    let stdout = stdout_of_success(
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -n 4096 2>/dev/null || ulimit -n \"$(ulimit -Hn)\"; exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_router_storm"))
            .args(["--clients", "200", "--interval-ms", "0", "--depth", "2"])
            .args(["--bound-secs", "60", "--router"])
            .arg(router_bin(env!("CARGO_BIN_EXE_router_storm"))),
    );
    assert!(
        num(&stdout, "storm_router_restart", "pings_outstanding_at_kill") > 0,
        "{stdout}"
    );
    assert_eq!(num(&stdout, "storm_recovery", "unrecovered"), 0, "{stdout}");
    assert_eq!(num(&stdout, "storm_pings", "outstanding"), 0, "{stdout}");
    let started = num(&stdout, "storm_pings", "started");
    let ok = num(&stdout, "storm_pings", "ok");
    let failed = num(&stdout, "storm_pings", "failed");
    assert_eq!(started, ok + failed, "{stdout}");
    assert!(ok > 0 && failed > 0, "the kill failed nothing?\n{stdout}");
    assert!(num(&stdout, "storm_conns", "max_conns_per_peer_in_swarm") <= 2);
    assert!(num(&stdout, "storm_conns", "max_conns_per_peer_at_router") <= 2);
    assert!(num(&stdout, "storm_races", "max_races_per_node") < 20);
    let (r, f) = (
        num(&stdout, "storm_router_books", "received"),
        num(&stdout, "storm_router_books", "forwarded"),
    );
    assert!(r > 0 && r >= f, "{stdout}");
}
