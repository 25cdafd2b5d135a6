//! One thread per NI: a daemon with two NIs (o2ib and o2ib1) runs each NI's loop on its own
//! thread beside the control thread, answers pings on both nets, and keeps answering on one NI
//! while the other NI's peer is frozen with traffic queued for it. Loopback only; every process
//! is killed by its guard; every daemon listens on a port the OS assigned.

mod common;

use common::*;
use router::control::Request;

const R0: &str = "10.0.0.1@o2ib";
const R1: &str = "10.1.0.1@o2ib1";
const B: &str = "10.0.0.2@o2ib";
const C: &str = "10.1.0.2@o2ib1";

/// One NI `nid` on net `net`, on a port the OS assigns, knowing no peer's address (R connects
/// to it; it answers over R's connection).
fn one_ni(nid: &str, net: &str) -> String {
    format!(
        "net:\n    - net type: {net}\n      fabric: tcp\n      local NI(s):\n        - nid: {nid}\n          listen: 127.0.0.1:0\n          lnd tunables:\n              timeout: {LND_TIMEOUT}\n              keepalive: {LND_KEEPALIVE}\n"
    )
}

/// R0's LND timeout, seconds: the pings queued for the frozen B wait until B runs again (or
/// this long), however slowly a loaded machine runs the pings of C meanwhile.
const R0_TIMEOUT: u64 = 60;

#[test]
fn two_ni_daemon_answers_on_both_nets_while_one_peer_is_frozen() {
    let dir = Scratch::new("nithreads");
    // B and C first, on ports the OS assigns; R, which connects to both, is given them.
    let b = start_yaml(&dir.0, "b", &one_ni(B, "o2ib"), Opts::default());
    let c = start_yaml(&dir.0, "c", &one_ni(C, "o2ib1"), Opts::default());
    let (pb, pc) = (listen_port(&b, B), listen_port(&c, C));
    let r_yaml = format!(
        "net:\n    - net type: o2ib\n      fabric: tcp\n      local NI(s):\n        - nid: {R0}\n          listen: 127.0.0.1:0\n          lnd tunables:\n              timeout: {R0_TIMEOUT}\n              keepalive: {LND_KEEPALIVE}\n    - net type: o2ib1\n      fabric: tcp\n      local NI(s):\n        - nid: {R1}\n          listen: 127.0.0.1:0\n          lnd tunables:\n              timeout: {LND_TIMEOUT}\n              keepalive: {LND_KEEPALIVE}\npeers:\n    - nid: {B}\n      address: 127.0.0.1:{pb}\n    - nid: {C}\n      address: 127.0.0.1:{pc}\n"
    );
    let r = start_yaml(&dir.0, "r", &r_yaml, Opts::default());
    // Both NIs listen, each on its own port.
    assert_ne!(listen_port(&r, R0), listen_port(&r, R1));

    // One thread per NI, named after it, beside the control thread.
    let names = thread_names(&r);
    for want in ["ni 10.0.0.1@o2i", "ni 10.1.0.1@o2i", "control"] {
        assert!(
            names.iter().any(|n| n == want),
            "no thread {want:?}: {names:?}"
        );
    }

    // Both nets answer, each through its own NI; our own NIDs answer in memory and list both.
    ping_until_ok(&r, B, WAIT);
    ping_until_ok(&r, C, WAIT);
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
            timeout_secs: Some(R0_TIMEOUT),
            source: None,
        });
    });
    // Ten pings of C while the pings of B wait on NI 0 (each bounded by its own timeout).
    for i in 0..10 {
        let p = ping(&r, C, 10);
        assert_eq!(p.ping.len(), 1, "ping {i} on the other NI failed: {p:?}");
    }
    assert!(
        !stuck.is_finished(),
        "the pings of the frozen B ended before the pings of C: nothing was waiting"
    );
    // Every thread has allocated by now (one allocator arena each): the allocator purges with
    // one background thread, not one per arena up to the CPU count.
    let names = thread_names(&r);
    let purgers = names.iter().filter(|n| n.starts_with("jemalloc")).count();
    assert!(purgers <= 1, "{purgers} allocator threads: {names:?}");
    // B runs again: the queued pings complete (or fail), and the thread ends.
    b.signal("-CONT");
    let _ = stuck.join();
    drop(c);
}
