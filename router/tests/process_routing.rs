//! Routing between real daemons on the tcp fabric: a client on o2ib, one or two routers on
//! o2ib and o2ib1, a server on o2ib1, each NI on its own loopback address.
//!
//! Addresses: every daemon of a test listens on its own 127.a.b.c (a from the test, b from
//! this process's id) and the same port, so the three or four daemons know each other's
//! addresses before any starts, and a restarted router binds its address again. Nothing else
//! uses those addresses.

mod common;

use common::*;
use router::control::{Request, Response, RouteEntry, RoutingShow};
use testkit::topo::{R2_A, R2_B, R_A as R1_A, R_B as R1_B, SERVER};

const PORT: u16 = 9988;

/// The test across network namespaces: there every NI listens on its NID's own address.
const NETNS_TEST: u8 = 0;

/// Every NID of the topology, each on its own loopback address (its NID's own address in the
/// network namespaces test).
fn site(test: u8) -> Site {
    Site {
        all: &[CLIENT, SERVER, R1_A, R1_B, R2_A, R2_B],
        port: PORT,
        a: 100 + test,
        nid_addresses: test == NETNS_TEST,
        extra: |_| String::new(),
    }
}

/// A daemon's YAML: its NIs (NID, net), its routes (net, gateway), routing on or off, the
/// health settings small, the LND's tunables small, and every other NID's address.
fn yaml(test: u8, nis: &[&str], routes: &[(&str, &str)], routing: bool) -> String {
    site(test).yaml(nis, routes, routing)
}

fn routes(d: &Daemon) -> Vec<RouteEntry> {
    match call(
        d,
        Request::RouteShow {
            net: None,
            gateway: None,
            verbose: true,
        },
    ) {
        Response::Route(r) => r.route,
        other => panic!("{}: route show: {other:?}", d.name),
    }
}

fn routing(d: &Daemon) -> RoutingShow {
    match call(d, Request::RoutingShow) {
        Response::Routing(r) => r,
        other => panic!("{}: routing show: {other:?}", d.name),
    }
}

fn all_routes_up(d: &Daemon) -> bool {
    routes(d).iter().all(|r| r.state.as_deref() == Some("up"))
}

/// The books of a router: received = forwarded + dropped + in flight.
fn assert_books(r: &RoutingShow) {
    let f = &r.forwarding;
    assert_eq!(f.received, f.forwarded + f.dropped + f.in_flight, "{f:?}");
    let by_reason: u64 = f.dropped_by_reason.iter().map(|(_, n)| n).sum();
    assert_eq!(by_reason, f.dropped, "{f:?}");
}

#[test]
fn client_pings_server_through_a_router() {
    routed_ping(1, "per-ni");
}

/// The same with the router's two NIs on one thread: forwarded messages never cross threads.
#[test]
fn client_pings_server_through_a_router_running_its_nis_on_one_thread() {
    routed_ping(3, "shared");
}

/// The same with each daemon in a network namespace of its own, joined by veth pairs, each NI
/// on its NID's address: client 10.0.0.1 -- 10.0.0.254 router 10.1.0.254 -- 10.1.0.2 server.
/// Needs root (CI runs as root); elsewhere it says so and does nothing.
#[test]
fn client_pings_server_through_a_router_across_network_namespaces() {
    if !root_or_skip("network namespaces") {
        return;
    }
    let topo = Namespaces::create();
    routed_ping_in(
        NETNS_TEST,
        "per-ni",
        [
            Some(topo.names[0].clone()),
            Some(topo.names[1].clone()),
            Some(topo.names[2].clone()),
        ],
    );
    drop(topo);
}

/// Three namespaces (client, router, server) and two veth pairs, deleted on drop (a deleted
/// namespace takes its veth ends with it), whatever the test did.
struct Namespaces {
    names: [String; 3],
}

impl Namespaces {
    fn create() -> Namespaces {
        let tag = std::process::id() % 100_000;
        let names = ["c", "r", "s"].map(|r| format!("ulnet{r}{tag}"));
        let topo = Namespaces { names };
        let [c, r, s] = &topo.names;
        let mut cmds: Vec<Vec<String>> = Vec::new();
        for ns in &topo.names {
            cmds.push(vec!["netns".into(), "add".into(), ns.clone()]);
        }
        let link = |a: &str, na: &str, b: &str, nb: &str| -> Vec<String> {
            [
                "link", "add", a, "netns", na, "type", "veth", "peer", "name", b, "netns", nb,
            ]
            .map(String::from)
            .to_vec()
        };
        let (vc, vrc, vrs, vs) = (
            format!("ulc{tag}"),
            format!("ulrc{tag}"),
            format!("ulrs{tag}"),
            format!("uls{tag}"),
        );
        cmds.push(link(&vc, c, &vrc, r));
        cmds.push(link(&vs, s, &vrs, r));
        for (ns, dev, a) in [
            (c, &vc, "10.0.0.1/24"),
            (r, &vrc, "10.0.0.254/24"),
            (r, &vrs, "10.1.0.254/24"),
            (s, &vs, "10.1.0.2/24"),
        ] {
            cmds.push(
                ["-n", ns, "addr", "add", a, "dev", dev]
                    .map(String::from)
                    .to_vec(),
            );
            cmds.push(
                ["-n", ns, "link", "set", dev, "up"]
                    .map(String::from)
                    .to_vec(),
            );
        }
        for ns in &topo.names {
            cmds.push(
                ["-n", ns, "link", "set", "lo", "up"]
                    .map(String::from)
                    .to_vec(),
            );
        }
        for args in cmds {
            let out = std::process::Command::new("ip")
                .args(&args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        topo
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .output();
        }
    }
}

fn routed_ping(t: u8, ni_threads: &str) {
    routed_ping_in(t, ni_threads, [None, None, None]);
}

/// A client pings a server through a router; `netns`: the client's, router's and server's
/// network namespaces.
fn routed_ping_in(t: u8, ni_threads: &str, netns: [Option<String>; 3]) {
    let [ns_client, ns_router, ns_server] = netns;
    let s = Scratch::new(&format!("routed_ping_{t}_{ni_threads}"));
    let router = start_yaml(
        &s.0,
        "router",
        &yaml(t, &[R1_A, R1_B], &[], true),
        Opts {
            args: vec!["--ni-threads".into(), ni_threads.into()],
            netns: ns_router,
            ..Opts::default()
        },
    );
    // The control socket answers before the NI threads are spawned: wait for them.
    let want = if ni_threads == "shared" { 1 } else { 2 };
    let count = |d: &Daemon| {
        thread_names(d)
            .iter()
            .filter(|n| n.starts_with("ni ") || *n == "nis")
            .count()
    };
    wait_for(std::time::Duration::from_secs(10), || {
        count(&router) >= want
    });
    assert_eq!(count(&router), want, "{:?}", thread_names(&router));
    // The two ends: each on its net, routed through the router, in its own namespace.
    let end = |name, nid, route, netns| {
        let opts = Opts {
            netns,
            ..Opts::default()
        };
        start_yaml(&s.0, name, &yaml(t, &[nid], &[route], false), opts)
    };
    let server = end("server", SERVER, ("o2ib", R1_B), ns_server);
    let client = end("client", CLIENT, ("o2ib1", R1_A), ns_client);
    // The client's router pinger finds the router (a dead gateway is re-pinged after 1 s, 2 s,
    // ...); then the server answers through it.
    assert!(
        wait_for(WAIT, || all_routes_up(&client)).is_some(),
        "{:?}",
        routes(&client)
    );
    ping_until_ok(&client, SERVER, WAIT);
    for _ in 0..20 {
        let p = ping(&client, SERVER, 5);
        assert!(p.manage.is_empty(), "{p:?}");
        assert_eq!(p.ping[0].primary_nid, SERVER);
    }
    // The server pings the client back the same way.
    ping_until_ok(&server, CLIENT, WAIT);

    let r = routing(&router);
    assert_eq!(r.enable, 1);
    assert_eq!(r.cpts.len(), 2, "one CPT per NI");
    assert_books(&r);
    // 21+ pings each way: a GET and a REPLY forwarded per ping.
    assert!(r.forwarding.forwarded >= 2 * 22, "{:?}", r.forwarding);
    assert_eq!(r.forwarding.in_flight, 0);
    for c in &r.cpts {
        assert_eq!(c.tiny.credits, i64::from(c.tiny.nbuffers));
        assert_eq!(c.small.credits, i64::from(c.small.nbuffers));
        assert!(
            c.tiny.mincredits < i64::from(c.tiny.nbuffers),
            "GETs held tiny buffers"
        );
    }
    // lnetctl shows it as real lnetctl does (libyaml's layout, route_props_list's keys).
    let out = lnetctl(&client, &["route", "show", "-v"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for want in [
        "route:",
        "-     net: o2ib1",
        &format!("      gateway: {R1_A}"),
        "      hop: 1",
        "      state: up",
        "      type: single-hop",
    ] {
        assert!(text.lines().any(|l| l == want), "{want:?} not in\n{text}");
    }
    let out = lnetctl(&router, &["routing", "show"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "routing:",
        "    - cpt[0]:",
        "    - cpt[1]:",
        "    - enable: 1",
    ] {
        assert!(text.lines().any(|l| l == want), "{want:?} not in\n{text}");
    }
    let out = lnetctl(&router, &["peer", "show", "-v"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("available_rtr_credits: 8"), "{text}");
    // Routing off at runtime: pings through the router stop, the drops are counted; back on,
    // they work again.
    let out = lnetctl(&router, &["set", "routing", "0"]);
    assert!(out.status.success());
    let p = ping(&client, SERVER, 2);
    assert!(!p.manage.is_empty(), "{p:?}");
    let r = routing(&router);
    assert_eq!(r.enable, 0);
    assert_books(&r);
    assert!(
        r.forwarding
            .dropped_by_reason
            .iter()
            .any(|(why, n)| why == "routing_disabled" && *n >= 1),
        "{:?}",
        r.forwarding
    );
    let out = lnetctl(&router, &["set", "routing", "1"]);
    assert!(out.status.success());
    ping_until_ok(&client, SERVER, WAIT);
    drop((client, server, router));
}

#[test]
fn traffic_moves_to_the_other_router_when_one_is_killed_and_back_when_it_returns() {
    let t = 2;
    let s = Scratch::new("routed_failover");
    let r1_yaml = yaml(t, &[R1_A, R1_B], &[], true);
    let mut r1 = start_yaml(&s.0, "r1", &r1_yaml, Opts::default());
    let r2 = start_yaml(
        &s.0,
        "r2",
        &yaml(t, &[R2_A, R2_B], &[], true),
        Opts::default(),
    );
    let server = start_yaml(
        &s.0,
        "server",
        &yaml(t, &[SERVER], &[("o2ib", R1_B), ("o2ib", R2_B)], false),
        Opts::default(),
    );
    let client = start_yaml(
        &s.0,
        "client",
        &yaml(t, &[CLIENT], &[("o2ib1", R1_A), ("o2ib1", R2_A)], false),
        Opts::default(),
    );
    for d in [&client, &server] {
        assert!(
            wait_for(WAIT, || all_routes_up(d)).is_some(),
            "{:?}",
            routes(d)
        );
    }
    for _ in 0..10 {
        assert!(ping(&client, SERVER, 5).manage.is_empty());
    }
    let used = |d: &Daemon| routing(d).forwarding.forwarded;
    assert!(
        used(&r1) > 0 && used(&r2) > 0,
        "round robin over both routers"
    );

    // SIGKILL r1 with pings in flight: each ping ends (answered through r2, or failed with a
    // status by its timeout); within the health settings every ping goes through r2.
    r1.signal("-KILL");
    r1.wait_exit(WAIT);
    let gone = wait_for(WAIT, || {
        routes(&client)
            .iter()
            .any(|r| r.gateway == R1_A && r.state.as_deref() == Some("down"))
    });
    assert!(gone.is_some(), "{:?}", routes(&client));
    let before = used(&r2);
    for _ in 0..10 {
        let p = ping(&client, SERVER, 5);
        assert!(p.manage.is_empty(), "{p:?}");
    }
    assert!(used(&r2) >= before + 20, "every ping through r2");

    // r1 returns on the same addresses: the pinger finds it and it carries traffic again.
    let r1 = start_yaml(&s.0, "r1", &r1_yaml, Opts::default());
    assert!(
        wait_for(WAIT, || all_routes_up(&client) && all_routes_up(&server)).is_some(),
        "{:?} {:?}",
        routes(&client),
        routes(&server)
    );
    for _ in 0..10 {
        assert!(ping(&client, SERVER, 5).manage.is_empty());
    }
    assert!(used(&r1) > 0, "the returned router is used again");
    for d in [&r1, &r2] {
        assert_books(&routing(d));
    }
    drop((client, server, r1, r2));
}
