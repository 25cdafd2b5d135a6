//! Bulk forwarding through a router whose NIs and settings change at run time: the router's
//! large buffers for bulk data follow its NIs (`net add`, `net del` then `net add`), `set
//! routing 1` and `set large_buffers`. A client and a far server on either side of the router,
//! real daemons on the tcp fabric, lnet_selftest's brw with check=full through it. Every daemon
//! listens on its own 127.a.b.c (a from the test, b from this process's id).

mod common;

use common::*;
use router::control::{Request, Response, RoutingShow};

const PORT: u16 = 9966;
const ALL: [&str; 4] = [CLIENT, R_A, R_B, FAR];

/// Every NID of the topology, each daemon on its own loopback address.
fn site(test: u8) -> Site {
    Site::loopback(&ALL, PORT, 210 + test, |_| {
        "buffers:\n    large: 16\nselftest:\n    enable: 1\n".into()
    })
}

/// A router running only `R_A` (routing on or off), a client routing o2ib1 through it and a far
/// server routing o2ib through `R_B`, which the router does not run yet.
struct Topo {
    s: Scratch,
    router: Daemon,
    client: Daemon,
    _far: Daemon,
}

fn topo(t: u8, name: &str, routing: bool) -> Topo {
    let s = Scratch::new(name);
    let router = site(t).start(&s.0, "router", &[R_A], &[], routing);
    let (far, client) = site(t).start_ends(&s.0);
    Topo {
        s,
        router,
        client,
        _far: far,
    }
}

fn routing(d: &Daemon) -> RoutingShow {
    match call(d, Request::RoutingShow) {
        Response::Routing(r) => r,
        other => panic!("{other:?}"),
    }
}

fn large_buffers(d: &Daemon) -> u32 {
    routing(d).cpts.iter().map(|c| c.large.nbuffers).sum()
}

/// The router said nothing about its pool going wrong: every NI registered the buffers, took
/// each change in time, and no buffer was left held by an NI that ended.
fn assert_pool_quiet(d: &Daemon) {
    let log = std::fs::read_to_string(&d.log).unwrap();
    for bad in [
        "cannot register the router buffers",
        "has not taken the daemon's change",
        "not lent again",
    ] {
        assert!(!log.contains(bad), "{bad:?} in the router's log:\n{log}");
    }
}

fn add_r_b(t: &Topo, test: u8) {
    let listen = site(test).address(R_B);
    lnetctl_ok(
        &t.router,
        &[
            "net", "add", "--nid", R_B, "--listen", &listen, "--fabric", "tcp",
        ],
    );
}

/// `units` brw writes of 1 MiB with check=full, `loops` each, from the client to the far
/// server through the router: every RPC completes, no brw error. Returns the router's
/// forwarding counts after it, which must show no drop (no `no_bulk_buffer` above all).
fn brw_through(t: &Topo, units: u32, loops: u32) -> router::control::ForwardingCounts {
    ping_until_ok(&t.client, FAR, WAIT);
    let before = routing(&t.router).forwarding;
    let out = brw_write_1m(&t.client, CLIENT, FAR, units, loops);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(&t.router.log).unwrap_or_default();
    assert!(
        out.status.success(),
        "{stdout}\n{}\nrouter log tail:\n{}",
        String::from_utf8_lossy(&out.stderr),
        log.lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
    let v = json_summary(&stdout);
    assert_eq!(v["brw_errors"], 0, "{v}");
    assert_eq!(
        v["latency"][0]["count"],
        u64::from(units * loops),
        "units x loops: {v}"
    );
    let after = routing(&t.router).forwarding;
    assert_eq!(after.dropped, 0, "{after:?}");
    // Each 1 MiB write crosses the router as a bulk PUT (the REPLY of the server's GET), beside
    // its RPC's small messages.
    assert!(
        after.forwarded >= before.forwarded + 2 * u64::from(units * loops),
        "{before:?} -> {after:?}"
    );
    assert!(
        after.forwarded_bytes >= before.forwarded_bytes + u64::from(units * loops) * (1 << 20),
        "{before:?} -> {after:?}"
    );
    after
}

/// A router started with one NI gains its second by `lnetctl net add`: the new NI registers the
/// router's large buffers with its fabric before the answer, so bulk crosses at once (before,
/// every routed bulk PUT was refused as `no_bulk_buffer`: buffers were registered at start
/// only, for a daemon of two NIs or more). Again after `net del` and `net add` of that NI (a new
/// fabric under the same NID), and `set large_buffers` grows the pool: `routing show` counts
/// the new buffers and bulk through them completes.
#[test]
fn an_ni_added_at_run_time_forwards_bulk_and_the_pool_follows_set_large_buffers() {
    let test = 1;
    let t = topo(test, "bulk_net_add", true);
    add_r_b(&t, test);
    assert_eq!(large_buffers(&t.router), 16, "8 on each of the two NIs");
    brw_through(&t, 2, 5);

    lnetctl_ok(&t.router, &["net", "del", "--nid", R_B]);
    assert_eq!(large_buffers(&t.router), 16, "all 16 on the NI left");
    add_r_b(&t, test);
    brw_through(&t, 2, 5);

    lnetctl_ok(&t.router, &["set", "large_buffers", "40"]);
    let r = routing(&t.router);
    let large: Vec<u32> = r.cpts.iter().map(|c| c.large.nbuffers).collect();
    assert_eq!(large, vec![20, 20], "{r:?}");
    // More bulk in flight at once than the router had buffers before.
    brw_through(&t, 24, 2);
    // Shrunk again: counted at once, bulk still crosses.
    lnetctl_ok(&t.router, &["set", "large_buffers", "4"]);
    assert_eq!(large_buffers(&t.router), 4);
    brw_through(&t, 4, 2);
    assert_pool_quiet(&t.router);
    drop(t.s);
}

/// A router started with one NI and routing off gains its second NI, then `lnetctl set routing
/// 1` (Lustre's lnet_rtrpools_enable allocates the router pools then): the buffers for bulk
/// data are registered on both NIs at that moment and bulk crosses.
#[test]
fn routing_turned_on_after_an_ni_was_added_forwards_bulk() {
    let test = 2;
    let t = topo(test, "bulk_routing_later", false);
    add_r_b(&t, test);
    lnetctl_ok(&t.router, &["set", "routing", "1"]);
    assert_eq!(large_buffers(&t.router), 16);
    brw_through(&t, 2, 5);
    assert_pool_quiet(&t.router);
}

/// lnet.service's flow on a router: the daemon starts with no NI (`--no-nis`), then `lnetctl
/// import` brings both its nets, routing on and its buffers; bulk crosses at once.
#[test]
fn a_router_configured_by_import_on_a_daemon_started_without_nis_forwards_bulk() {
    let test = 3;
    let s = Scratch::new("bulk_import");
    let router = start_without_nis(&s.0, "router");
    let (far, client) = site(test).start_ends(&s.0);
    // lnet_selftest starts with a daemon, not by import: the router needs none.
    let doc = site(test)
        .yaml(&[R_A, R_B], &[], true)
        .replace("selftest:\n    enable: 1\n", "");
    let file = s.0.join("lnet.conf");
    std::fs::write(&file, doc).unwrap();
    assert_eq!(
        out(&lnetctl(&router, &["import", file.to_str().unwrap()])),
        (Some(0), String::new(), String::new())
    );
    assert_eq!(large_buffers(&router), 16);
    let t = Topo {
        s,
        router,
        client,
        _far: far,
    };
    brw_through(&t, 2, 5);
    assert_pool_quiet(&t.router);
}
