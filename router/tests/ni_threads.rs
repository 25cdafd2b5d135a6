//! One thread per NI: a daemon with two NIs (o2ib and o2ib1) runs each NI's loop on its own
//! thread beside the control thread, answers pings on both nets, and keeps answering on one NI
//! while the other NI's peer is frozen with traffic queued for it. Loopback only; every process
//! is killed by its guard.

mod common;

use std::time::Duration;

use common::*;
use router::control::Request;

const R0: &str = "10.0.0.1@o2ib";
const R1: &str = "10.1.0.1@o2ib1";
const B: &str = "10.0.0.2@o2ib";
const C: &str = "10.1.0.2@o2ib1";

fn one_ni(nid: &str, net: &str, port: u16, peer: &str, peer_port: u16) -> String {
    format!(
        "net:\n    - net type: {net}\n      fabric: tcp\n      local NI(s):\n        - nid: {nid}\n          listen: 127.0.0.1:{port}\n          lnd tunables:\n              timeout: {LND_TIMEOUT}\n              keepalive: {LND_KEEPALIVE}\npeers:\n    - nid: {peer}\n      address: 127.0.0.1:{peer_port}\n"
    )
}

/// The names of the daemon's threads (`comm`, at most 15 bytes each).
fn thread_names(d: &Daemon) -> Vec<String> {
    let dir = format!("/proc/{}/task", d.pid());
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                .map(|s| s.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn two_ni_daemon_answers_on_both_nets_while_one_peer_is_frozen() {
    let dir = Scratch::new("nithreads");
    let (pr0, pr1, pb, pc) = (free_port(), free_port(), free_port(), free_port());
    let r_yaml = format!(
        "net:\n    - net type: o2ib\n      fabric: tcp\n      local NI(s):\n        - nid: {R0}\n          listen: 127.0.0.1:{pr0}\n          lnd tunables:\n              timeout: {LND_TIMEOUT}\n              keepalive: {LND_KEEPALIVE}\n    - net type: o2ib1\n      fabric: tcp\n      local NI(s):\n        - nid: {R1}\n          listen: 127.0.0.1:{pr1}\n          lnd tunables:\n              timeout: {LND_TIMEOUT}\n              keepalive: {LND_KEEPALIVE}\npeers:\n    - nid: {B}\n      address: 127.0.0.1:{pb}\n    - nid: {C}\n      address: 127.0.0.1:{pc}\n"
    );
    let r = start_yaml(&dir.0, "r", &r_yaml, Opts::default());
    let b = start_yaml(
        &dir.0,
        "b",
        &one_ni(B, "o2ib", pb, R0, pr0),
        Opts::default(),
    );
    let c = start_yaml(
        &dir.0,
        "c",
        &one_ni(C, "o2ib1", pc, R1, pr1),
        Opts::default(),
    );

    // One thread per NI, named after it, beside the control thread.
    let names = thread_names(&r);
    for want in ["ni 10.0.0.1@o2i", "ni 10.1.0.1@o2i", "control"] {
        assert!(
            names.iter().any(|n| n == want),
            "no thread {want:?}: {names:?}"
        );
    }

    // Both nets answer, each through its own NI; our own NIDs answer in memory and list both.
    ping_until_ok(&r, B, Duration::from_secs(5));
    ping_until_ok(&r, C, Duration::from_secs(5));
    let p = ping(&r, R1, 2);
    assert_eq!(p.ping.len(), 1, "{p:?}");
    assert_eq!(p.ping[0].peer_ni, vec![R0.to_string(), R1.to_string()]);
    let nets = ni_entry(&r, R1);
    assert_eq!(nets.nid, R1);
    assert!(conns_to(&r, B).len() == 1 && conns_to(&r, C).len() == 1);

    // B frozen, with pings to it queued beyond its credits: NI 0's loop waits on B; NI 1's
    // loop keeps answering C, and the control thread keeps answering.
    b.signal("-STOP");
    let socket = r.socket.clone();
    let stuck = std::thread::spawn(move || {
        let mut cl = router::control::ControlClient::connect(&socket).expect("connect");
        let _ = cl.call(&Request::Ping {
            nids: vec![B.to_string(); 12],
            timeout_secs: Some(5),
            source: None,
        });
    });
    // Ten pings of C while the pings of B wait on NI 0 (each bounded by its own timeout).
    for i in 0..10 {
        let p = ping(&r, C, 2);
        assert_eq!(p.ping.len(), 1, "ping {i} on the other NI failed: {p:?}");
    }
    assert!(
        !stuck.is_finished(),
        "the pings of the frozen B ended before the pings of C: nothing was waiting"
    );
    let _ = stuck.join();
    b.signal("-CONT");
    drop(c);
}
