//! Routing on the unit-test fabric: a client on o2ib, a router on o2ib and o2ib1, a server on
//! o2ib1, in virtual time. The router runs as one node with both NIs, or split into one
//! runtime per NI (the daemon's shape) whose forwards cross as handovers.

use super::*;

use testkit::topo::{CLIENT, R2_A, R2_B, R_A, R_B, SERVER};

pub(super) fn route(net: &str, gw: &str) -> RouteConfig {
    RouteConfig {
        net: net.parse().unwrap(),
        gateway: nid(gw),
        hops: None,
        priority: 0,
    }
}

pub(super) fn node(nids: &[&str], routes: &[RouteConfig], routing: bool, inc: u64) -> NodeConfig {
    let nis = nids
        .iter()
        .enumerate()
        .map(|(i, s)| NiConfig::new(nid(s), inc + i as u64))
        .collect();
    let mut c = NodeConfig::new(nis);
    c.routes = routes.to_vec();
    c.routing.enabled = routing;
    c
}

/// The router split as the daemon runs it: one node per NI, each knowing both NIDs.
pub(super) fn split(c: NodeConfig) -> Vec<NodeConfig> {
    c.per_ni()
}

/// client, router (one node or one per NI), server; returns the fabric and the router nodes.
fn topology(split_router: bool, tweak_router: impl Fn(&mut NodeConfig)) -> (Fabric, Vec<usize>) {
    topology_with(split_router, |_| {}, tweak_router)
}

/// [`topology`] with `buffers` of the router's large buffers in registered memory.
fn bulk_topology(split_router: bool, buffers: usize) -> (Fabric, Vec<usize>) {
    let (mut f, routers) = topology(split_router, |_| {});
    give_bulk_buffers(&mut f, &routers, buffers);
    (f, routers)
}

/// [`bulk_topology`], [`warm_up`].
fn warm_bulk_topology(split_router: bool, buffers: usize) -> (Fabric, Vec<usize>) {
    let (mut f, routers) = bulk_topology(split_router, buffers);
    warm_up(&mut f);
    (f, routers)
}

/// The client pings the server through the router and the fabric runs 2 s: the connections
/// on the way are up before the test's own traffic.
fn warm_up(f: &mut Fabric) {
    let now = f.now;
    f.nodes[0]
        .ping(now, nid(SERVER), Duration::from_secs(5))
        .unwrap();
    f.run_for(Duration::from_secs(2));
}

/// [`topology`], with the client's configuration tweaked too.
fn topology_with(
    split_router: bool,
    tweak_client: impl Fn(&mut NodeConfig),
    tweak_router: impl Fn(&mut NodeConfig),
) -> (Fabric, Vec<usize>) {
    let mut client = node(&[CLIENT], &[route("o2ib1", R_A)], false, 10);
    tweak_client(&mut client);
    let server = node(&[SERVER], &[route("o2ib", R_B)], false, 20);
    let mut router = node(&[R_A, R_B], &[], true, 30);
    tweak_router(&mut router);
    let mut cfgs = vec![client, server];
    let routers = push_router(&mut cfgs, router, split_router);
    (Fabric::from_configs(cfgs), routers)
}

/// Adds router `r` to `cfgs`, as one node or split into one runtime per NI; returns its node
/// indices.
fn push_router(cfgs: &mut Vec<NodeConfig>, r: NodeConfig, split_router: bool) -> Vec<usize> {
    if split_router {
        let parts = split(r);
        let idx = (cfgs.len()..cfgs.len() + parts.len()).collect();
        cfgs.extend(parts);
        idx
    } else {
        cfgs.push(r);
        vec![cfgs.len() - 1]
    }
}

/// The client (node 0) sends `n` PUTs of `payload` (match bits 0..n) to `to` at once.
fn send_puts(f: &mut Fabric, to: Nid, portal: u32, n: u64, payload: &[u8]) {
    let now = f.now;
    for i in 0..n {
        f.nodes[0]
            .send_put(now, to, portal, i, payload.to_vec())
            .unwrap();
    }
}

/// The server (node 1) dies and the client sends it `n` PUTs through the router at once; after
/// `wait`, router node `r`'s routing info (what it holds for the dead server).
fn puts_to_a_dead_server(f: &mut Fabric, r: usize, n: u64, wait: Duration) -> RoutingInfo {
    f.kill(1);
    send_puts(f, nid(SERVER), 4, n, &[1; 100]);
    f.run_for(wait);
    f.nodes[r].routing_info()
}

/// A router runtime's books: `in_flight` held, `shutdown` dropped as a shutdown (failed back),
/// and they reconcile.
fn assert_books(s: &ForwardStats, in_flight: u64, shutdown: u64) {
    assert_eq!(s.in_flight, in_flight, "{s:?}");
    assert_eq!(s.dropped_for(FwdDrop::Shutdown), shutdown, "{s:?}");
    assert!(s.reconciles(), "{s:?}");
}

/// Every router buffer of node `r` is back in its pool.
fn assert_pools_full(f: &Fabric, r: usize) {
    for p in &f.nodes[r].routing_info().pools {
        assert_eq!(p.credits, i64::from(p.nbuffers), "router {r} {:?}", p.class);
    }
}

/// The client pings the server (through the router) and the answer comes within 1 s.
fn ping_the_server(f: &mut Fabric) {
    let pinged = ping_result(f, SERVER, Duration::from_secs(5), Duration::from_secs(1));
    assert!(pinged.is_ok());
}

/// The client pings `to` and the fabric runs `wait`: the ping's result.
fn ping_result(
    f: &mut Fabric,
    to: &str,
    timeout: Duration,
    wait: Duration,
) -> Result<PingReply, LnetError> {
    let now = f.now;
    f.nodes[0].ping(now, nid(to), timeout).unwrap();
    f.run_for(wait);
    let mut pings = ping_results(&f.take_events(0));
    assert!(!pings.is_empty(), "the ping ended");
    pings.remove(0).2
}

/// Runs the fabric until each of the client's `n` PUTs has ended and router node `r` holds
/// nothing in flight (an hour of virtual time at most); returns the PUTs' results.
fn every_put_ends(f: &mut Fabric, r: usize, n: u64) -> Vec<Result<(), LnetError>> {
    let mut results = put_results(&f.take_events(0));
    let start = f.now;
    while (results.len() < n as usize || f.nodes[r].routing_info().stats.in_flight > 0)
        && f.now < start + Duration::from_secs(3600)
    {
        f.run_for(Duration::from_secs(10));
        results.extend(put_results(&f.take_events(0)));
    }
    assert_eq!(results.len(), n as usize, "every PUT ends");
    results
}

pub(super) fn puts(evs: &[(Instant, LnetEvent)]) -> Vec<(Nid, u64, usize)> {
    picked(evs, |e| match e {
        LnetEvent::Put {
            from,
            match_bits,
            payload,
            ..
        } => Some((*from, *match_bits, payload.len())),
        _ => None,
    })
}

pub(super) fn put_results(evs: &[(Instant, LnetEvent)]) -> Vec<Result<(), LnetError>> {
    picked(evs, |e| match e {
        LnetEvent::PutDone { result, .. } => Some(*result),
        _ => None,
    })
}

/// The router's books over all its runtimes: received = forwarded + dropped + in flight, and
/// at quiescence nothing in flight, every buffer and router credit back.
pub(super) fn assert_router_quiescent(f: &Fabric, routers: &[usize]) -> ForwardStats {
    let mut total = ForwardStats::default();
    for &r in routers {
        let info = f.nodes[r].routing_info();
        let s = &info.stats;
        assert!(s.reconciles(), "router {r}: {s:?}");
        assert_eq!(s.in_flight, 0, "router {r}: {s:?}");
        assert_pools_full(f, r);
        for p in f.nodes[r].peers() {
            assert_eq!(p.available_rtr_credits, p.max_ni_tx_credits, "{}", p.nid);
            assert_eq!(p.available_tx_credits, p.max_ni_tx_credits, "{}", p.nid);
        }
        assert_eq!(f.nodes[r].messages_in_flight(), 0);
        total.received += s.received;
        total.forwarded += s.forwarded;
        total.in_flight += s.in_flight;
        for (t, d) in total.dropped.iter_mut().zip(s.dropped) {
            *t += d;
        }
    }
    total
}

fn routed_traffic(split_router: bool) {
    let (mut f, routers) = topology(split_router, |_| {});
    let now = f.now;
    let server = nid(SERVER);
    f.nodes[0]
        .ping(now, server, Duration::from_secs(5))
        .unwrap();
    for i in 0..50u64 {
        f.nodes[0]
            .send_put(now, server, 7, i, vec![i as u8; (i as usize * 61) % 4000])
            .unwrap();
    }
    f.run_for(Duration::from_secs(2));
    let client = f.take_events(0);
    let pings = ping_results(&client);
    assert_eq!(pings.len(), 1);
    let reply = pings[0].2.clone().expect("routed ping answered");
    assert_eq!(reply.nids, vec![server]);
    assert_eq!(put_results(&client), vec![Ok(()); 50]);
    let got = puts(&f.take_events(1));
    assert_eq!(got.len(), 50);
    for (i, (from, bits, len)) in got.iter().enumerate() {
        // In order, from the client itself (the router keeps src_nid), whole.
        assert_eq!(
            (*from, *bits, *len),
            (nid(CLIENT), i as u64, (i * 61) % 4000)
        );
    }
    let books = assert_router_quiescent(&f, &routers);
    // GET + REPLY + 50 PUTs, each forwarded once, nothing dropped; the router's own gateway
    // pings are not forwarded messages.
    assert_eq!(
        (books.received, books.forwarded, books.dropped()),
        (52, 52, 0)
    );
    let routed: u64 = routers
        .iter()
        .map(|&r| f.nodes[r].stats().route_count)
        .sum();
    assert_eq!(routed, 52);
    // The client and server never talked directly.
    assert!(f.nodes[0].peer(server).is_none());
    assert!(f.nodes[1].peer(nid(CLIENT)).is_none());
}

#[test]
fn routed_ping_and_puts_reach_the_server_through_a_router() {
    routed_traffic(false);
}

#[test]
fn routed_ping_and_puts_cross_between_the_runtimes_of_a_split_router() {
    routed_traffic(true);
}

/// The client hands the router (at R_A) a 3-byte PUT for `dst`, as if for it to forward.
fn send_raw_put_to_the_router(f: &mut Fabric, dst: &str) {
    let now = f.now;
    let hdr = LnetHdr::put(nid(CLIENT), nid(dst), 3, 4, 0);
    f.nodes[0].send_raw(now, NiIndex(0), nid(R_A), hdr, vec![1; 3]);
}

/// A client asks the router to forward to a peer on the very net it arrived on: Lustre drops
/// it with -EPROTO and closes the sender's connection; the books still balance.
#[test]
fn a_message_for_the_arrival_net_is_refused_and_the_connection_closed() {
    let (mut f, routers) = topology(false, |_| {});
    send_raw_put_to_the_router(&mut f, "10.0.0.77@o2ib");
    f.run_for(Duration::from_secs(1));
    let r = &f.nodes[routers[0]];
    let s = r.routing_info().stats;
    assert_eq!((s.received, s.dropped_for(FwdDrop::WrongNet)), (1, 1));
    assert!(s.reconciles());
    let ep = r.endpoint(NiIndex(0)).unwrap();
    assert_eq!(ep.stats().rx_refused, 1);
    assert_eq!(
        ep.stats().conns_lost,
        1,
        "the connection it came on is closed"
    );
}

/// The same for a message addressed to another of the router's own NIDs (lnet_parse: it
/// should have gone there directly; -EPROTO, the connection closed), inline and as a
/// rendezvous request. The acceptance review dropped the own-NID check and no test noticed.
#[test]
fn a_message_for_another_of_the_routers_own_nids_is_refused_and_the_connection_closed() {
    for bulk in [false, true] {
        let (mut f, routers) = topology(false, |_| {});
        if bulk {
            give_bulk_buffers(&mut f, &routers, 1);
            let b = f.bulk_buf(0, vec![7; 100_000]);
            // The client has a route to o2ib1 through R_A: its PUT_REQ for R_B goes there.
            let now = f.now;
            f.nodes[0].send_put_bulk(now, nid(R_B), 4, 1, b).unwrap();
        } else {
            send_raw_put_to_the_router(&mut f, R_B);
        }
        f.run_for(Duration::from_secs(1));
        let r = &f.nodes[routers[0]];
        let s = r.routing_info().stats;
        assert_eq!(
            (s.received, s.dropped_for(FwdDrop::WrongNet)),
            (1, 1),
            "bulk {bulk}"
        );
        assert!(s.reconciles());
        let ep = r.endpoint(NiIndex(0)).unwrap();
        assert_eq!(
            ep.stats().conns_lost,
            1,
            "bulk {bulk}: the connection is closed"
        );
    }
}

/// Routing off: a message to forward is a counted drop, and the connection stays.
#[test]
fn with_routing_off_a_message_to_forward_is_a_counted_drop() {
    let (mut f, routers) = topology(false, |c| c.routing.enabled = false);
    let now = f.now;
    let id = f.nodes[0]
        .send_put(now, nid(SERVER), 4, 1, vec![0; 10])
        .unwrap();
    f.run_for(Duration::from_secs(1));
    // The client's LND delivered it to the router: for the client the PUT is done.
    assert!(f
        .take_events(0)
        .iter()
        .any(|(_, e)| matches!(e, LnetEvent::PutDone { id: i, result: Ok(()) } if *i == id)));
    let s = f.nodes[routers[0]].routing_info().stats;
    assert_eq!(
        (s.received, s.dropped_for(FwdDrop::RoutingDisabled)),
        (1, 1)
    );
    assert!(puts(&f.take_events(1)).is_empty());
    let ep = f.nodes[routers[0]].endpoint(NiIndex(0)).unwrap();
    assert_eq!(ep.stats().rx_refused, 0);
    // Our ping reply says so, and a client's router pinger would stop using us.
    let reply = ping_results(&f.take_events(0));
    assert!(reply.is_empty());
}

/// No route onward from the router: dropped as no_route, books balance.
#[test]
fn a_message_the_router_cannot_route_is_dropped_as_no_route() {
    let (mut f, routers) = topology(false, |_| {});
    send_raw_put_to_the_router(&mut f, "10.7.0.7@o2ib7");
    f.run_for(Duration::from_secs(1));
    let s = f.nodes[routers[0]].routing_info().stats;
    assert_eq!((s.received, s.dropped_for(FwdDrop::NoRoute)), (1, 1));
    assert_router_quiescent(&f, &routers);
}

/// Back pressure: the server is gone, so forwarded messages sit in the router's egress until
/// the LND gives up. The router holds at most its buffers; the rest wait holding the client's
/// LND credits, then in the client's LNet queues. When the egress fails, every message ends
/// with a status, the books balance and every credit and buffer is back.
#[test]
fn a_dead_server_holds_router_buffers_and_throttles_the_client_then_everything_fails_cleanly() {
    let (mut f, routers) = topology(false, |c| {
        c.routing.buffers = BufferCounts {
            tiny: 4,
            small: 4,
            large: 4,
        };
    });
    let r = routers[0];
    let n = 40u64;
    let info = puts_to_a_dead_server(&mut f, r, n, Duration::from_secs(5));
    let small = info.pools[1];
    assert_eq!(small.nbuffers, 4);
    assert!(small.credits <= 0, "every small buffer in use: {small:?}");
    assert!(info.stats.in_flight <= 4 + 8, "{:?}", info.stats);
    assert!(info.stats.reconciles());
    // The rest are still with the client: in its LND (credits) or its LNet queue.
    assert!(f.nodes[0].messages_in_flight() > 0);
    // The router drains its buffers one LND timeout (or failed connect) at a time; in the
    // end every PUT ends.
    let results = every_put_ends(&mut f, r, n);
    let books = assert_router_quiescent(&f, &routers);
    assert_eq!(books.received, books.forwarded + books.dropped());
    assert_eq!(books.forwarded, 0);
    assert!(books.dropped_for(FwdDrop::SendFailed) > 0);
    // What the router accepted and what the client failed add up to what was sent.
    let failed_at_client = results.iter().filter(|r| r.is_err()).count() as u64;
    assert_eq!(books.received + failed_at_client, n);
}

/// Peer router credits come before a router buffer (lnet_post_routed_recv_locked): with
/// `peer_buffer_credits: 2`, a client with 8 PUTs in flight towards a dead server holds 2
/// router buffers and no more; the other 6 wait on its router credits (its LND slots held:
/// back pressure), not on the pool, though the pool has buffers to spare. In the end every
/// PUT ends and every credit and buffer is back.
#[test]
fn a_sender_waits_on_its_router_credits_before_a_buffer() {
    let (mut f, routers) = topology(false, |c| {
        for ni in &mut c.nis {
            ni.peer_buffer_credits = 2;
        }
    });
    let r = routers[0];
    let n = 10u64;
    let info = puts_to_a_dead_server(&mut f, r, n, Duration::from_secs(1));
    let small = info.pools[1];
    assert_eq!(
        i64::from(small.nbuffers) - small.min_credits,
        2,
        "two buffers taken, no more: {small:?}"
    );
    let client = f.nodes[r].peer(nid(CLIENT)).expect("the client as a peer");
    // The client's 8 LND credits: 2 with a buffer, 6 waiting on router credits.
    assert_eq!(
        (client.available_rtr_credits, client.min_rtr_credits),
        (-6, -6),
        "{client:?}"
    );
    assert_eq!(info.stats.waited_rtr_credit, 6, "{:?}", info.stats);
    assert_eq!(info.stats.in_flight, 8, "{:?}", info.stats);
    every_put_ends(&mut f, r, n);
    let info = f.nodes[r].routing_info();
    assert!(
        info.stats.reconciles() && info.stats.in_flight == 0,
        "{:?}",
        info.stats
    );
    assert_pools_full(&f, r);
    let client = f.nodes[r].peer(nid(CLIENT)).expect("the client as a peer");
    assert_eq!(client.available_rtr_credits, 2, "{client:?}");
}

/// lnet_check_message_drop: once the router's LND has reported the server down, messages for
/// it are dropped at once (counted as peer_down) instead of each
/// holding a router buffer until the LND gives up on it; one a second still goes to the LND,
/// which finds the server when it is back.
#[test]
fn a_router_drops_messages_for_a_next_hop_known_down_and_finds_it_when_it_returns() {
    for split_router in [false, true] {
        let (mut f, routers) = topology(split_router, |_| {});
        f.kill(1);
        let now = f.now;
        f.nodes[0]
            .send_put(now, nid(SERVER), 4, 0, vec![1; 100])
            .unwrap();
        // Until the router's LND fails the PUT to the silent server (its connect deadline).
        f.run_for(Duration::from_secs(30));
        let down_at_router = routers.iter().any(|&r| {
            f.nodes[r]
                .peers()
                .iter()
                .any(|p| p.nid == nid(SERVER) && p.state == PeerState::Down)
        });
        assert!(
            down_at_router,
            "the router never marked the server down: {:?}",
            routers
                .iter()
                .map(|&r| f.nodes[r].peers())
                .collect::<Vec<_>>()
        );
        let dropped = |f: &Fabric| -> u64 {
            routers
                .iter()
                .map(|&r| {
                    f.nodes[r]
                        .routing_info()
                        .stats
                        .dropped_for(FwdDrop::PeerDown)
                })
                .sum()
        };
        assert_eq!(dropped(&f), 0, "nothing was known down before");
        let _ = f.take_events(0);

        // A burst while it is down: all but one probe are dropped at once and hold nothing.
        let now = f.now;
        for i in 1..=20 {
            f.nodes[0]
                .send_put(now, nid(SERVER), 4, i, vec![1; 100])
                .unwrap();
        }
        f.run_for(Duration::from_millis(100));
        assert!(dropped(&f) >= 19, "split {split_router}: {}", dropped(&f));
        let held: u64 = routers
            .iter()
            .map(|&r| f.nodes[r].routing_info().stats.in_flight)
            .sum();
        assert!(held <= 1, "split {split_router}: {held} held");
        // (The client's PUTs completed when the router took them: a router's drop is counted
        // at the router, as in Lustre; a GET's sender finds out at its REPLY timeout.)
        let _ = f.take_events(0);

        // The server returns: within seconds a PUT reaches it again.
        f.restart(1, node(&[SERVER], &[route("o2ib", R_B)], false, 20), 400);
        let start = f.now;
        let mut k = 100;
        let through = loop {
            let now = f.now;
            f.nodes[0]
                .send_put(now, nid(SERVER), 4, k, vec![1; 100])
                .unwrap();
            k += 1;
            f.run_for(Duration::from_millis(500));
            if put_results(&f.take_events(0)).iter().any(|r| r.is_ok()) {
                break f.now - start;
            }
            assert!(
                f.now < start + Duration::from_secs(60),
                "split {split_router}: the server was never reached again"
            );
        };
        assert!(through <= Duration::from_secs(30), "{through}");
        f.run_for(Duration::from_secs(60));
        let books = assert_router_quiescent(&f, &routers);
        assert_eq!(
            books.received,
            books.forwarded + books.dropped(),
            "{books:?}"
        );
    }
}

/// Two routers to o2ib1. One dies under traffic: the client's router pinger (and its LND)
/// find it, traffic moves to the other, and every PUT ends with a status. It comes back: it is
/// used again.
/// Gateway health that finds a dead router within seconds.
const FAST_HEALTH: GatewayHealthConfig = GatewayHealthConfig {
    check_interval: Duration::from_secs(2),
    ping_timeout: Duration::from_secs(1),
    avoid_asym: true,
};

/// A client (node 0) and a server (node 1) with a route each way through two routers (nodes
/// 2 and 3), all on `health`; returns the fabric and router 2's configuration (to restart it).
fn two_routers(health: GatewayHealthConfig) -> (Fabric, NodeConfig) {
    // An end node routing `net` through both routers' NIs `gws`.
    let end = |me: &str, net: &str, gws: [&str; 2], inc: u64| {
        let mut c = node(&[me], &[route(net, gws[0]), route(net, gws[1])], false, inc);
        c.gateway_health = health;
        c
    };
    let client = end(CLIENT, "o2ib1", [R_A, R2_A], 10);
    let server = end(SERVER, "o2ib", [R_B, R2_B], 20);
    let r1 = node(&[R_A, R_B], &[], true, 30);
    let r2 = node(&[R2_A, R2_B], &[], true, 40);
    let f = Fabric::from_configs(vec![client, server, r1.clone(), r2]);
    (f, r1)
}

#[test]
fn traffic_moves_to_the_other_router_when_one_dies_and_back_when_it_returns() {
    let health = FAST_HEALTH;
    let (mut f, r1) = two_routers(health);
    f.run_for(Duration::from_secs(3));
    let send = |f: &mut Fabric, from: u64, n: u64| {
        let now = f.now;
        for i in from..from + n {
            f.nodes[0]
                .send_put(now, nid(SERVER), 4, i, vec![2; 64])
                .unwrap();
        }
    };
    send(&mut f, 0, 20);
    f.run_for(Duration::from_secs(1));
    let used = |f: &Fabric| {
        (
            f.nodes[2].routing_info().stats.forwarded,
            f.nodes[3].routing_info().stats.forwarded,
        )
    };
    let (a, b) = used(&f);
    assert!(a > 0 && b > 0, "round robin over both routers: {a} {b}");
    assert_eq!(put_results(&f.take_events(0)), vec![Ok(()); 20]);

    f.kill(2);
    let killed = f.now;
    send(&mut f, 100, 20);
    // Everything ends (those given to the dead router's LND fail at the LND timeout, 50 s),
    // and the dead router is known dead within a ping interval and timeout.
    f.run_for(Duration::from_secs(4));
    let gw = f.nodes[0].gateways();
    assert!(
        !gw.iter().find(|g| g.nid == nid(R_A)).unwrap().alive,
        "{gw:?}"
    );
    let mut results = put_results(&f.take_events(0));
    while results.len() < 20 && f.now < killed + Duration::from_secs(600) {
        f.run_for(Duration::from_secs(1));
        results.extend(put_results(&f.take_events(0)));
    }
    assert_eq!(results.len(), 20, "every PUT ends");
    let ended = f.now - killed;
    assert!(
        ended <= Duration::from_secs(60),
        "the last PUT ended {ended:?} after the kill"
    );
    let gw = f.nodes[0].gateways();
    let dead = gw.iter().find(|g| g.nid == nid(R_A)).unwrap();
    assert!(!dead.alive, "{gw:?}");
    let before = used(&f).1;
    send(&mut f, 200, 20);
    f.run_for(Duration::from_secs(1));
    assert_eq!(
        put_results(&f.take_events(0)),
        vec![Ok(()); 20],
        "all through the live router"
    );
    assert_eq!(used(&f).1, before + 20);

    // The dead router returns (a new instance): the pinger finds it, and it carries traffic.
    f.restart(2, r1, 50);
    let restarted = f.now;
    // The client's LND may be inside a connect the dead router never answered: that ends at
    // the connect deadline (12.5 s here), then the next ping finds the new instance.
    while !f.nodes[0].gateways().iter().all(|g| g.alive)
        && f.now < restarted + Duration::from_secs(60)
    {
        f.run_for(Duration::from_millis(500));
    }
    let back = f.now - restarted;
    let bound = Duration::from_millis(12_500) + health.check_interval + health.ping_timeout;
    assert!(
        back <= bound,
        "the returned router was seen alive {back:?} after its restart"
    );
    send(&mut f, 300, 20);
    f.run_for(Duration::from_secs(1));
    assert_eq!(put_results(&f.take_events(0)), vec![Ok(()); 20]);
    assert!(
        f.nodes[2].routing_info().stats.forwarded > 0,
        "the returned router is used"
    );
    // Everything sent while both routers were known alive arrived once; of what was sent as
    // one died, what the dead router had taken is lost (LNet does not resend without health
    // and resend, which we do not implement), the rest arrived.
    let got: Vec<u64> = puts(&f.take_events(1)).iter().map(|p| p.1).collect();
    let mut unique = got.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), got.len(), "no duplicates");
    for bits in (0..20).chain(200..220).chain(300..320) {
        assert!(got.contains(&bits), "PUT {bits} missing");
    }
    assert_router_quiescent(&f, &[3]);
}

/// A node never pings itself as a gateway: a route whose gateway is one of our NIDs is
/// refused when the node starts, so the pinger has nothing of ours to ping (LU-7646's
/// reverted patch deadlocked pinging its own NID).
#[test]
fn a_route_through_one_of_our_own_nids_is_refused_and_never_pinged() {
    let cfg = node(&[CLIENT], &[route("o2ib1", CLIENT)], false, 10);
    assert_eq!(
        cfg.check_routes().unwrap_err().1,
        RouteError::GatewayIsOwn(nid(CLIENT))
    );
    let mut f = Fabric::from_configs(vec![cfg]);
    f.run_for(Duration::from_secs(120));
    assert!(f.nodes[0].gateways().is_empty());
    assert!(f.nodes[0].routes().is_empty());
    assert_eq!(f.nodes[0].stats().send_count, 0);
}

/// Two routers that each route o2ib9 through the other (a configuration mistake no single
/// node can see): the second sends nothing back to the first; the message is dropped as a
/// loop there, once, and every buffer comes back.
#[test]
fn a_routing_loop_between_two_routers_is_cut_at_the_second() {
    let client = node(&[CLIENT], &[route("o2ib9", R_A)], false, 10);
    let r1 = node(&[R_A, R_B], &[route("o2ib9", R2_B)], true, 30);
    let r2 = node(
        &[R2_B, "10.2.0.253@o2ib2"],
        &[route("o2ib9", R_B)],
        true,
        40,
    );
    let mut f = Fabric::from_configs(vec![client, r1, r2]);
    send_puts(&mut f, nid("10.9.0.1@o2ib9"), 4, 5, &[0; 8]);
    f.run_for(Duration::from_secs(2));
    let s1 = f.nodes[1].routing_info().stats;
    let s2 = f.nodes[2].routing_info().stats;
    assert_eq!((s1.received, s1.forwarded), (5, 5), "{s1:?}");
    assert_eq!(
        (s2.received, s2.dropped_for(FwdDrop::Loop)),
        (5, 5),
        "{s2:?}"
    );
    assert_router_quiescent(&f, &[1, 2]);
}

fn hop_route(net: &str, gw: &str, hops: u8) -> RouteConfig {
    RouteConfig {
        hops: Some(hops),
        ..route(net, gw)
    }
}

/// Routers in a chain: router `i` has NIs on o2ib{i} and o2ib{i+1} ([`gw`]), and
/// `routes(i)` gives its routes. Returns the configurations, split into one runtime per NI
/// when asked, and each router's node indices (after the ones in `first`).
fn chain(
    first: Vec<NodeConfig>,
    routers: usize,
    routes: impl Fn(usize) -> Vec<RouteConfig>,
    split_router: bool,
) -> (Vec<NodeConfig>, Vec<Vec<usize>>) {
    let mut cfgs = first;
    let mut idx = Vec::new();
    for i in 0..routers {
        let r = node(
            &[&gw(i, i), &gw(i, i + 1)],
            &routes(i),
            true,
            100 + 10 * i as u64,
        );
        idx.push(push_router(&mut cfgs, r, split_router));
    }
    (cfgs, idx)
}

/// o2ib, o2ib1, o2ib2 ...: net `i`'s suffix.
fn net_suffix(i: usize) -> String {
    if i == 0 {
        String::new()
    } else {
        i.to_string()
    }
}

/// Router `i`'s NID on net `net` (o2ib{net}): 10.{net}.0.{254 - i}.
fn gw(i: usize, net: usize) -> String {
    format!("10.{net}.0.{}@o2ib{}", 254 - i, net_suffix(net))
}

/// Three routers in a ring, each routing o2ib9 through the next with `hop: 2` (a mistake no
/// single node can see, and one avoid_asym_router_failure does not catch: the routes are
/// multi-hop). Lustre has no TTL and forwards such a message around the ring for good (the
/// operator audit: 30,000 forwards a second per router, `loop` 0). The hop rule cuts it: a
/// message that has already crossed a router goes on only to its destination's net or to a
/// gateway that has an NI on that net, so the second router drops it, counted as a loop, and
/// every buffer comes back.
fn a_routing_loop_of_three_routers(split_router: bool) {
    // Router i sits on o2ib{i} and o2ib{i+1 mod 3}.
    let books = a_ring_of_three_routers(|i| (i, (i + 1) % 3), split_router);
    assert_eq!(
        (
            books[1].received,
            books[1].forwarded,
            books[1].dropped_for(FwdDrop::Loop)
        ),
        (5, 0, 5),
        "{books:?}"
    );
}

/// The client and three routers in a ring: router i has NIs on the nets `nets(i)` and routes
/// o2ib9 with `hop: 2` through the next router's NI on its first net. The client sends five
/// PUTs to o2ib9; returns each router's books, the first having passed all five on and the
/// third seen none (the second cut the loop: each test says how).
fn a_ring_of_three_routers(
    nets: impl Fn(usize) -> (usize, usize),
    split_router: bool,
) -> Vec<ForwardStats> {
    let client = node(
        &["10.0.0.1@o2ib"],
        &[hop_route("o2ib9", "10.0.0.254@o2ib", 3)],
        false,
        10,
    );
    let mut cfgs = vec![client];
    let mut idx: Vec<Vec<usize>> = Vec::new();
    for i in 0..3usize {
        let (a, b) = nets(i);
        let next = (i + 1) % 3;
        let r = node(
            &[&gw(i, a), &gw(i, b)],
            &[hop_route("o2ib9", &gw(next, nets(next).0), 2)],
            true,
            100 + 10 * i as u64,
        );
        idx.push(push_router(&mut cfgs, r, split_router));
    }
    let mut f = Fabric::from_configs(cfgs);
    send_puts(&mut f, nid("10.9.0.1@o2ib9"), 4, 5, &[0; 8]);
    f.run_for(Duration::from_secs(5));
    let books: Vec<ForwardStats> = idx.iter().map(|r| assert_router_quiescent(&f, r)).collect();
    assert_eq!((books[0].received, books[0].forwarded), (5, 5), "{books:?}");
    assert_eq!(books[2].received, 0, "{books:?}");
    books
}

#[test]
fn a_routing_loop_of_three_routers_is_cut_by_the_hop_rule() {
    a_routing_loop_of_three_routers(false);
}

#[test]
fn a_routing_loop_of_three_split_routers_is_cut_by_the_hop_rule() {
    a_routing_loop_of_three_routers(true);
}

/// The same loop on one net: three routers on o2ib each route o2ib9 through the next one on
/// o2ib. Every router receives the message on the client's own net, so only who handed it over
/// (a router, not its source) tells that it has crossed a router: the second router drops it.
#[test]
fn a_routing_loop_of_three_routers_on_one_net_is_cut_by_the_hop_rule() {
    // Router i's NIs: on o2ib and on o2ib5 (a net no route uses).
    let books = a_ring_of_three_routers(|_| (0, 5), false);
    assert_eq!(
        (books[1].received, books[1].dropped_for(FwdDrop::Loop)),
        (5, 5),
        "{books:?}"
    );
}

/// The hop rule's reach: a client on o2ib and a server on o2ib3 through three routers in a
/// chain (hop counts 3, 2, 1 as an admin writes them) ping and PUT both ways; with a fourth
/// router in the chain, the second router refuses to pass a message on to a gateway that is
/// not on the destination's net, counted as a loop, and the server never sees it.
fn a_chain_of_routers(routers: usize, split_router: bool) -> (Fabric, Vec<Vec<usize>>) {
    let (cfgs, idx) = chain_configs(routers, split_router, |i| (routers - 1 - i) as u8);
    (Fabric::from_configs(cfgs), idx)
}

/// [`a_chain_of_routers`]' configurations (client, server, then the routers), router `i`
/// routing the server's net with `hop: far_hops(i)`.
fn chain_configs(
    routers: usize,
    split_router: bool,
    far_hops: impl Fn(usize) -> u8,
) -> (Vec<NodeConfig>, Vec<Vec<usize>>) {
    let far = routers;
    let server_nid = format!("10.{far}.0.2@o2ib{far}");
    let far_net = format!("o2ib{far}");
    let client = node(
        &["10.0.0.1@o2ib"],
        &[hop_route(&far_net, &gw(0, 0), routers as u8)],
        false,
        10,
    );
    let server = node(
        &[&server_nid],
        &[hop_route("o2ib", &gw(routers - 1, far), routers as u8)],
        false,
        20,
    );
    chain(
        vec![client, server],
        routers,
        |i| {
            let mut r = Vec::new();
            // Toward the server: through router i+1, on net i+1.
            if i + 1 < routers {
                r.push(hop_route(&far_net, &gw(i + 1, i + 1), far_hops(i)));
            }
            // Toward the client: through router i-1, on net i.
            if i > 0 {
                r.push(hop_route("o2ib", &gw(i - 1, i), i as u8));
            }
            r
        },
        split_router,
    )
}

/// The client sends five PUTs to the server at the far end of a chain of three routers;
/// returns how many the server got and the middle router's books.
fn five_puts_through_a_chain_of_three(f: &mut Fabric, idx: &[Vec<usize>]) -> (usize, ForwardStats) {
    send_puts(f, nid("10.3.0.2@o2ib3"), 7, 5, &[1; 100]);
    f.run_for(Duration::from_secs(3));
    let got = puts(&f.take_events(1)).len();
    (got, assert_router_quiescent(f, &idx[1]))
}

#[test]
fn a_chain_of_three_routers_carries_pings_and_puts_both_ways() {
    for split_router in [false, true] {
        let (mut f, idx) = a_chain_of_routers(3, split_router);
        let now = f.now;
        let (client, server) = (nid("10.0.0.1@o2ib"), nid("10.3.0.2@o2ib3"));
        ping_both_ways(&mut f, client, server);
        for i in 0..20u64 {
            f.nodes[0]
                .send_put(now, server, 7, i, vec![i as u8; 100])
                .unwrap();
        }
        f.run_for(Duration::from_secs(3));
        let c = f.take_events(0);
        let s = f.take_events(1);
        for (who, evs, want) in [("client", &c, server), ("server", &s, client)] {
            let pings = ping_results(evs);
            assert_eq!(pings.len(), 1, "{who} split={split_router}");
            let reply = pings[0].2.clone().expect("pinged through three routers");
            assert_eq!(reply.nids, vec![want]);
        }
        assert_eq!(put_results(&c), vec![Ok(()); 20]);
        assert_eq!(puts(&s).len(), 20);
        for (i, r) in idx.iter().enumerate() {
            let b = assert_router_quiescent(&f, r);
            // 2 pings (GET + REPLY each) and 20 PUTs, each forwarded by every router.
            assert_eq!(
                (b.received, b.forwarded, b.dropped()),
                (24, 24, 0),
                "router {i}"
            );
        }
    }
}

#[test]
fn a_fourth_router_in_a_chain_is_past_the_hop_rule() {
    let (mut f, idx) = a_chain_of_routers(4, false);
    send_puts(&mut f, nid("10.4.0.2@o2ib4"), 7, 5, &[1; 100]);
    f.run_for(Duration::from_secs(3));
    assert!(puts(&f.take_events(1)).is_empty());
    let books: Vec<ForwardStats> = idx.iter().map(|r| assert_router_quiescent(&f, r)).collect();
    assert_eq!((books[0].received, books[0].forwarded), (5, 5));
    assert_eq!(
        (books[1].received, books[1].dropped_for(FwdDrop::Loop)),
        (5, 5)
    );
    assert_eq!(books[2].received + books[3].received, 0);
}

/// A router whose net has gone silent says so: once nothing has arrived on o2ib1 for
/// router_ping_timeout + alive_router_check_interval, its ping reply lists its o2ib1 NI DOWN
/// (router.c lnet_update_ni_status_locked), so a client routing through it to o2ib1 marks the
/// route down (avoid_asym_router_failure) and fails its sends at once instead of handing them
/// to a router that cannot deliver them; the first message on o2ib1 brings it back. Run with
/// the router as one node and split into one runtime per NI (the runtime on o2ib answers the
/// client's pings and reports its sibling's net, through the board they share).
fn a_router_reports_a_silent_net_down(split_router: bool) {
    let health = GatewayHealthConfig {
        check_interval: Duration::from_secs(2),
        ping_timeout: Duration::from_secs(1),
        avoid_asym: true,
    };
    // The client pings its gateway every 2 s; the server never does (default 60 s interval,
    // and it sends nothing): after the first exchange, o2ib1 is silent.
    let (mut f, routers) = topology_with(
        split_router,
        |c| c.gateway_health = health,
        |r| r.gateway_health = health,
    );
    let r_route = route("o2ib1", R_A);
    let ping_server = |f: &mut Fabric| {
        let now = f.now;
        let id = f.nodes[0].ping(now, nid(SERVER), Duration::from_secs(2));
        f.run_for(Duration::from_secs(2));
        let evs = f.take_events(0);
        (id, evs)
    };
    f.run_for(Duration::from_secs(1));
    let (id, evs) = ping_server(&mut f);
    assert!(id.is_ok());
    assert!(
        evs.iter()
            .any(|(_, e)| matches!(e, LnetEvent::PingDone { result: Ok(_), .. })),
        "{evs:?}"
    );
    let r = routers[0];
    assert!(f.nodes[r].silent_nids(f.now).is_empty());
    assert_eq!(f.nodes[0].route_state(&r_route), Some(true));

    // o2ib1 silent for more than 3 s (the client's pings keep o2ib alive).
    let quiet_from = f.now;
    f.run_for(Duration::from_secs(5));
    for &r in &routers {
        assert_eq!(f.nodes[r].silent_nids(f.now), vec![nid(R_B)], "router {r}");
        for ni in f.nodes[r].nets() {
            let want = if ni.nid == nid(R_B) { "down" } else { "up" };
            assert_eq!(ni.status, want, "router {r} {}", ni.nid);
        }
    }
    while f.nodes[0].route_state(&r_route) != Some(false)
        && f.now < quiet_from + Duration::from_secs(20)
    {
        f.run_for(Duration::from_millis(500));
    }
    assert_eq!(
        f.nodes[0].route_state(&r_route),
        Some(false),
        "the client took the route down from the router's ping reply"
    );
    let gw = f.nodes[0].gateways();
    assert!(gw[0].alive, "the gateway itself is alive: {gw:?}");
    let now = f.now;
    assert!(
        f.nodes[0]
            .ping(now, nid(SERVER), Duration::from_secs(2))
            .is_err(),
        "no usable route: the send fails at once"
    );

    // The server speaks on o2ib1 (a ping of the router): the net is alive again, the next
    // ping reply says so, and the client routes through the router again.
    let revived = f.now;
    f.nodes[1]
        .ping(revived, nid(R_B), Duration::from_secs(2))
        .unwrap();
    f.run_for(Duration::from_secs(1));
    for &r in &routers {
        assert!(f.nodes[r].silent_nids(f.now).is_empty(), "router {r}");
    }
    // The client learns it at its next gateway ping.
    while f.nodes[0].route_state(&r_route) != Some(true)
        && f.now < revived + Duration::from_secs(30)
    {
        f.run_for(Duration::from_millis(250));
    }
    assert_eq!(f.nodes[0].route_state(&r_route), Some(true));
    let back = f.now - revived;
    assert!(
        back <= health.check_interval + health.ping_timeout,
        "the route came back {back:?} after the net did"
    );
    f.take_events(0);
    let (_, evs) = ping_server(&mut f);
    assert!(
        evs.iter()
            .any(|(_, e)| matches!(e, LnetEvent::PingDone { result: Ok(_), .. })),
        "{evs:?}"
    );
}

#[test]
fn a_router_reports_a_silent_net_down_in_its_ping_reply() {
    a_router_reports_a_silent_net_down(false);
}

#[test]
fn a_split_router_reports_its_siblings_silent_net_down() {
    a_router_reports_a_silent_net_down(true);
}

/// A node that does not route never reports an NI down, however quiet its nets.
#[test]
fn a_node_that_does_not_route_reports_every_ni_up() {
    let (mut f, routers) = topology(false, |r| r.routing.enabled = false);
    f.run_for(Duration::from_secs(400));
    assert!(f.nodes[routers[0]].silent_nids(f.now).is_empty());
    let reply = ping_result(&mut f, R_A, Duration::from_secs(2), Duration::from_secs(1))
        .expect("the ping is answered");
    assert!(reply.down_nids.is_empty(), "{reply:?}");
    assert_eq!(reply.nids, vec![nid(R_A), nid(R_B)]);
}

/// A router's ping reply says whether it forwards (RTE_DISABLED clear while routing), and
/// `set routing` changes that at once, both ways (router.c lnet_rtrpools_enable/disable).
#[test]
fn set_routing_changes_what_the_ping_reply_says_at_once() {
    let (mut f, routers) = topology(false, |_| {});
    let r = routers[0];
    f.run_for(Duration::from_secs(1));
    let ping_router = |f: &mut Fabric| {
        let now = f.now;
        f.nodes[0]
            .ping(now, nid(R_A), Duration::from_secs(2))
            .unwrap();
        f.run_for(Duration::from_secs(1));
        f.take_events(0)
            .into_iter()
            .find_map(|(_, e)| match e {
                LnetEvent::PingDone { result: Ok(r), .. } => Some(r),
                _ => None,
            })
            .expect("the ping is answered")
    };
    assert!(
        !ping_router(&mut f).routing_disabled(),
        "routing from the start"
    );
    let now = f.now;
    f.nodes[r].set_routing(now, false);
    assert!(ping_router(&mut f).routing_disabled(), "routing turned off");
    let now = f.now;
    f.nodes[r].set_routing(now, true);
    let reply = ping_router(&mut f);
    assert!(!reply.routing_disabled(), "routing turned on again");
    assert!(reply.down_nids.is_empty(), "{reply:?}");
}

/// Bulk through a router that has no registered large buffers: a PUT by rendezvous is refused
/// with -EPROTO (its sender's PUT fails, rather than take PUT_NAK 0 for done), counted as
/// no_bulk_buffer, and the books balance; an optimized GET (GET_REQ) for another node closes
/// the sender's connection, as Lustre's lnet_parse does ("Bad optimized GET"), and the GET
/// fails; LNet itself never sends an optimized GET through a router. Routed small messages
/// still flow afterwards.
#[test]
fn bulk_through_a_router_without_bulk_buffers_fails_cleanly() {
    use lnd::engine::TxError;
    use lnd::wire::errno::EPROTO;
    for split_router in [false, true] {
        let (mut f, routers) = topology(split_router, |_| {});
        let server = nid(SERVER);
        let buf = f.bulk_buf(0, vec![7; 100_000]);
        let now = f.now;
        let put = f.nodes[0]
            .send_put_bulk(now, server, 4, 1, buf.clone())
            .unwrap();
        f.run_for(Duration::from_secs(5));
        let ev = f.take_events(0);
        let done: Vec<_> = picked(&ev, |e| match e {
            LnetEvent::PutDone { id, result } if *id == put => Some(*result),
            _ => None,
        });
        assert_eq!(done, vec![Err(LnetError::Lnd(TxError::Rdma(-EPROTO)))]);
        let books = assert_router_quiescent(&f, &routers);
        assert_eq!(books.dropped_for(FwdDrop::NoBulkBuffer), 1);

        // A forged optimized GET through the router.
        let before: u64 = routers
            .iter()
            .map(|&r| f.nodes[r].endpoint(NiIndex(0)).unwrap().stats().rx_refused)
            .sum();
        let hdr = LnetHdr {
            dest_nid: server,
            src_nid: nid(CLIENT),
            dest_pid: LNET_PID_LUSTRE,
            src_pid: LNET_PID_LUSTRE,
            payload_length: 0,
            body: LnetBody::Get {
                return_wmd: WireHandle::NONE,
                match_bits: 1,
                ptl_index: 4,
                src_offset: 0,
                sink_length: 100_000,
            },
        };
        let now = f.now;
        f.nodes[0].send_raw_bulk(now, NiIndex(0), nid(R_A), hdr, buf, true);
        f.run_for(Duration::from_secs(5));
        let after: u64 = routers
            .iter()
            .map(|&r| f.nodes[r].endpoint(NiIndex(0)).unwrap().stats().rx_refused)
            .sum();
        assert_eq!(after, before + 1, "the router refused the GET_REQ");
        let ev = f.take_events(0);
        assert!(ev
            .iter()
            .any(|(_, e)| matches!(e, LnetEvent::GetDone { result: Err(_), .. })));
        let books = assert_router_quiescent(&f, &routers);
        assert_eq!(books.dropped_for(FwdDrop::Malformed), 1);
        // The closed connection told the client its gateway was down; its pinger revives it
        // within the health settings, and small routed traffic goes on.
        f.run_for(Duration::from_secs(130));
        let now = f.now;
        let id = f.nodes[0]
            .send_put(now, server, 4, 2, vec![1; 100])
            .unwrap();
        f.run_for(Duration::from_secs(10));
        let ev = f.take_events(0);
        assert!(ev.iter().any(|(_, e)| matches!(
            e,
            LnetEvent::PutDone { id: i, result: Ok(()) } if *i == id
        )));
    }
}

/// A bulk PUT parked on a gateway's peer credits and rerouted when that gateway is
/// found dead (`reroute_queued`) must stay a bulk PUT. Every bulk PUT through a ulnet router
/// fails (-EPROTO: no bulk router buffers), so none may end Ok.
#[test]
fn a_rerouted_bulk_put_stays_a_bulk_put() {
    use crate::node::BulkBuf;
    use lnd::fabric::{RegionId, Registration};
    let (mut f, _) = two_routers(FAST_HEALTH);
    f.run_for(Duration::from_secs(3));
    let reg = Registration::new(RegionId(1), 0x77, 0x10_0000, 1 << 20);
    let buf = BulkBuf::new(NiIndex(0), &reg, 0, 8192).unwrap();
    f.kill(2);
    let now = f.now;
    for i in 0..30u64 {
        f.nodes[0]
            .send_put_bulk(now, nid(SERVER), 4, i, buf.clone())
            .unwrap();
    }
    let mut results = Vec::new();
    while results.len() < 30 && f.now < now + Duration::from_secs(600) {
        f.run_for(Duration::from_secs(1));
        results.extend(put_results(&f.take_events(0)));
    }
    assert_eq!(results.len(), 30, "every PUT ends");
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(
        ok, 0,
        "a bulk PUT ended Ok though no data moved: {results:?}"
    );
}

/// The router's large buffers in registered memory, shared by its runtimes' fabrics as the
/// daemon sets them up: `n` buffers of LNET_MTU, each registered on every router NI, split
/// between the runtimes.
pub(super) fn give_bulk_buffers(f: &mut Fabric, routers: &[usize], n: usize) {
    use lnd::fabric::SharedMem;
    let mut table = BulkBuffers::default();
    for _ in 0..n {
        let mem = SharedMem::new(lnd::wire::lnet::LNET_MTU as usize);
        let mut views = Vec::new();
        for &r in routers {
            for nid in f.nodes[r].nids() {
                let reg = f.register_shared(r, &mem);
                views.push((nid, BulkRegion::of(&reg)));
            }
        }
        table.bufs.push(views);
        table.mem.push(Some(mem));
    }
    let table = std::sync::Arc::new(table);
    let now = f.now;
    for (i, &r) in routers.iter().enumerate() {
        let owned = (0..n).filter(|k| k % routers.len() == i).collect();
        f.nodes[r].set_bulk_buffers(now, table.clone(), owned);
    }
}

const MIB: usize = 1 << 20;

/// 1 MiB + 64 bytes of a pattern (`shift` varies it) in which a byte out of place shows.
fn patterned(shift: u32) -> Vec<u8> {
    (0..MIB as u32 + 64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> shift) as u8)
        .collect()
}

/// `got`, a region filled with 0xee, holds `want` at `at` and nothing else: every byte landed
/// and none outside.
fn assert_landed(got: &[u8], at: usize, want: &[u8], what: &str) {
    assert!(got[at..at + want.len()] == *want, "{what}: bytes differ");
    assert!(got[..at].iter().all(|&x| x == 0xee), "{what}");
    assert!(got[at + want.len()..].iter().all(|&x| x == 0xee), "{what}");
}

/// A warmed [`bulk_topology`] with three router buffers, and [`patterned`]`(shift)` registered
/// on node `owner` as the bulk source: the fabric, the router nodes, the bytes and their
/// registration.
fn byte_exact_setup(
    split_router: bool,
    owner: usize,
    shift: u32,
) -> (Fabric, Vec<usize>, Vec<u8>, lnd::fabric::Registration) {
    let (mut f, routers) = warm_bulk_topology(split_router, 3);
    let bytes = patterned(shift);
    let src = f.register(owner, bytes.clone());
    (f, routers, bytes, src)
}

/// Bulk PUTs of 1 B to 1 MiB through a router with registered large buffers, one router node
/// or one runtime per NI: the client's PUT_REQ is written into a router buffer, which the
/// egress writes on into the server's posted sink from the same memory. Every byte lands,
/// every PUT ends once on both sides, the router's books balance with every buffer and credit
/// back; with fewer buffers than PUTs in flight the rest wait for one (back pressure) and all
/// still arrive.
#[test]
fn bulk_puts_cross_a_router_byte_exact() {
    for split_router in [false, true] {
        let (mut f, routers, bytes, src) = byte_exact_setup(split_router, 0, 7);
        let server = nid(SERVER);
        let sizes = [1u32, 3977, 65_537, 300_001, MIB as u32 - 5, MIB as u32];
        let mut sinks = Vec::new();
        let mut ids = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let sink = f.register(1, vec![0xee; MIB + 64]);
            let buf = BulkBuf::new(NiIndex(0), &sink, 7, len).unwrap();
            f.nodes[1].post_sink(4, 100 + i as u64, buf);
            sinks.push(sink);
        }
        // All at once: six PUTs, three router buffers.
        let now = f.now;
        for (i, &len) in sizes.iter().enumerate() {
            let b = BulkBuf::new(NiIndex(0), &src, 3 + i as u64, len).unwrap();
            ids.push(
                f.nodes[0]
                    .send_put_bulk(now, server, 4, 100 + i as u64, b)
                    .unwrap(),
            );
        }
        f.run_for(Duration::from_secs(10));
        let client = f.take_events(0);
        for id in &ids {
            let done: Vec<_> = picked(&client, |e| match e {
                LnetEvent::PutDone { id: i, result } if i == id => Some(*result),
                _ => None,
            });
            assert_eq!(done, vec![Ok(())], "split {split_router}");
        }
        let server_ev = f.take_events(1);
        let landed: Vec<(u64, Result<u32, LnetError>)> = picked(&server_ev, |e| match e {
            LnetEvent::BulkPut {
                match_bits, result, ..
            } => Some((*match_bits, *result)),
            _ => None,
        });
        assert_eq!(
            landed.len(),
            sizes.len(),
            "split {split_router}: {landed:?}"
        );
        for (i, &len) in sizes.iter().enumerate() {
            assert!(landed.contains(&(100 + i as u64, Ok(len))));
            let want = &bytes[3 + i..3 + i + len as usize];
            let what = format!("split {split_router}: size {len}");
            assert_landed(&f.region(1, &sinks[i]), 7, want, &what);
        }
        let books = assert_router_quiescent(&f, &routers);
        assert_eq!(
            books.forwarded,
            sizes.len() as u64 + 2,
            "split {split_router}: {books:?}"
        );
        assert_eq!(books.dropped(), 0);
        let waited: u64 = routers
            .iter()
            .map(|&r| f.nodes[r].routing_info().stats.waited_buffer)
            .sum();
        assert!(waited > 0, "six PUTs on three buffers: some waited");
    }
}

/// What the daemon's NI loops do with each round of its bulk pool (`crate::bulk_pool`), on
/// the split router's runtimes `members` (each its own loop, id = its node index): register
/// every buffer of the plan with the node's fabric (forgetting the retired ones), report them,
/// take the table and share, hand back what the node let go; until the plan settles.
fn pool_rounds(
    f: &mut Fabric,
    pool: &mut crate::bulk_pool::BulkPool,
    regs: &mut [HashMap<usize, BulkRegion>],
    members: &[usize],
    total: u32,
) {
    let ids: Vec<(u64, Nid)> = members
        .iter()
        .map(|&r| (r as u64, f.nodes[r].nids()[0]))
        .collect();
    let mut change = true;
    for _ in 0..4 {
        let Some(plan) = pool.plan(&ids, &[], true, total, change) else {
            break;
        };
        change = false;
        for &r in members {
            for (k, mem) in &plan.slots {
                if !regs[r].contains_key(k) {
                    let reg = f.register_shared(r, mem);
                    regs[r].insert(*k, BulkRegion::of(&reg));
                }
            }
            regs[r].retain(|k, _| plan.slots.iter().any(|(j, _)| j == k));
            pool.set_registered(r as u64, regs[r].clone(), false);
            let owned = plan.owned.get(&(r as u64)).cloned().unwrap_or_default();
            let now = f.now;
            f.nodes[r].set_bulk_buffers(now, plan.table.clone(), owned);
            let released = f.nodes[r].take_released_bulk();
            pool.release(r as u64, &released);
        }
    }
}

/// The router's pool of large buffers as the daemon runs it at run time, on the split router:
/// while only the ingress NI has them (its sibling added and not registered yet) a bulk PUT is
/// refused at its sender; once the egress has registered them every PUT crosses, some waiting
/// for one of the 2 buffers each NI lends; `set large_buffers` growing the pool to 12 lets 6
/// PUTs in at once (none waits); shrinking it to 2 while 6 PUTs hold the ingress's buffers (the
/// server died) takes back at once only what is free, and the rest only once their forwards
/// have ended, when they are retired.
#[test]
fn the_bulk_pool_follows_the_nis_and_large_buffers_and_retires_only_free_buffers() {
    use lnd::engine::TxError;
    use lnd::wire::errno::EPROTO;
    let (mut f, routers) = topology(true, |_| {});
    let (ingress, egress) = (routers[0], routers[1]);
    let mut pool = crate::bulk_pool::BulkPool::new(lnd::wire::lnet::LNET_MTU as usize);
    let mut regs = vec![HashMap::new(); f.nodes.len()];
    let server = nid(SERVER);
    warm_up(&mut f);
    let len = 200_000u32;
    let src = f.register(0, vec![0x5a; len as usize]);
    let mut next = 0u64;
    let mut send = |f: &mut Fabric, n: usize| {
        let now = f.now;
        for _ in 0..n {
            next += 1;
            let sink = f.register(1, vec![0; len as usize]);
            f.nodes[1].post_sink(4, next, BulkBuf::new(NiIndex(0), &sink, 0, len).unwrap());
            let b = BulkBuf::new(NiIndex(0), &src, 0, len).unwrap();
            f.nodes[0].send_put_bulk(now, server, 4, next, b).unwrap();
        }
    };
    let large = |f: &Fabric, r: usize| {
        f.nodes[r]
            .routing_info()
            .pools
            .iter()
            .find(|p| p.class == PoolClass::Large)
            .map(|p| p.nbuffers)
    };
    let waited = |f: &Fabric| f.nodes[ingress].routing_info().stats.waited_buffer;

    pool_rounds(&mut f, &mut pool, &mut regs, &[ingress], 4);
    send(&mut f, 1);
    f.run_for(Duration::from_secs(5));
    let results = put_results(&f.take_events(0));
    assert_eq!(results, vec![Err(LnetError::Lnd(TxError::Rdma(-EPROTO)))]);
    let books = assert_router_quiescent(&f, &routers);
    assert_eq!(books.dropped_for(FwdDrop::NoBulkBuffer), 1, "{books:?}");

    pool_rounds(&mut f, &mut pool, &mut regs, &[ingress, egress], 4);
    assert_eq!((large(&f, ingress), large(&f, egress)), (Some(2), Some(2)));
    let w0 = waited(&f);
    send(&mut f, 6);
    f.run_for(Duration::from_secs(10));
    assert_eq!(put_results(&f.take_events(0)), vec![Ok(()); 6]);
    assert!(waited(&f) > w0, "six PUTs on two buffers: some waited");

    pool_rounds(&mut f, &mut pool, &mut regs, &[ingress, egress], 12);
    assert_eq!((large(&f, ingress), large(&f, egress)), (Some(6), Some(6)));
    assert_eq!(pool.live(), 12);
    let w1 = waited(&f);
    send(&mut f, 6);
    f.run_for(Duration::from_secs(10));
    assert_eq!(put_results(&f.take_events(0)), vec![Ok(()); 6]);
    assert_eq!(waited(&f), w1, "six PUTs on six buffers: none waited");
    let books = assert_router_quiescent(&f, &routers);
    assert_eq!((books.forwarded, books.dropped()), (12 + 2, 1), "{books:?}");

    f.kill(1);
    send(&mut f, 6);
    f.run_for(Duration::from_secs(1));
    assert_eq!(f.nodes[ingress].bulk_held().len(), 6);
    pool_rounds(&mut f, &mut pool, &mut regs, &[ingress, egress], 2);
    assert_eq!((large(&f, ingress), large(&f, egress)), (Some(1), Some(1)));
    assert_eq!(
        pool.live(),
        7,
        "the egress's 5 idle ones retired, the ingress's 5 lent kept"
    );
    f.run_for(Duration::from_secs(300));
    assert_eq!(f.nodes[ingress].bulk_held().len(), 0);
    let released = f.nodes[ingress].take_released_bulk();
    assert_eq!(released.len(), 5);
    pool.release(ingress as u64, &released);
    pool_rounds(&mut f, &mut pool, &mut regs, &[ingress, egress], 2);
    assert_eq!(pool.live(), 2);
    assert_eq!((large(&f, ingress), large(&f, egress)), (Some(1), Some(1)));
    assert_router_quiescent(&f, &routers);
}

/// `set large_buffers` above the router buffers registered at start is capped to them: bulk
/// PUTs then wait for a buffer rather than fail.
#[test]
fn large_buffers_raised_above_the_registered_ones_make_bulk_puts_wait_not_fail() {
    let (mut f, routers) = warm_bulk_topology(false, 2);
    let server = nid(SERVER);
    let now = f.now;
    f.nodes[routers[0]].set_buffers(now, PoolClass::Large, 4);
    let large = |f: &Fabric| {
        f.nodes[routers[0]]
            .routing_info()
            .pools
            .iter()
            .find(|p| p.class == PoolClass::Large)
            .map(|p| p.nbuffers)
    };
    assert_eq!(large(&f), Some(2), "capped at what is registered");
    let len = 200_000u32;
    let src = f.register(0, vec![0x5a; len as usize]);
    for i in 0..4u64 {
        let sink = f.register(1, vec![0; len as usize]);
        f.nodes[1].post_sink(4, 100 + i, BulkBuf::new(NiIndex(0), &sink, 0, len).unwrap());
        let b = BulkBuf::new(NiIndex(0), &src, 0, len).unwrap();
        f.nodes[0]
            .send_put_bulk(now, server, 4, 100 + i, b)
            .unwrap();
    }
    f.run_for(Duration::from_secs(10));
    let results = put_results(&f.take_events(0));
    let books = assert_router_quiescent(&f, &routers);
    assert_eq!(books.dropped(), 0, "{results:?} {books:?}");
    assert_eq!(results, vec![Ok(()); 4]);
}

/// A bulk PUT refused because routing is off fails at its sender (-EPROTO), never PUT_NAK 0,
/// which its LNet would take for done.
#[test]
fn a_bulk_put_refused_for_routing_disabled_fails_at_its_sender() {
    let (mut f, routers) = warm_bulk_topology(false, 1);
    let server = nid(SERVER);
    let now = f.now;
    f.nodes[routers[0]].set_routing(now, false);
    let len = 100_000u32;
    let sink = f.register(1, vec![0; len as usize]);
    f.nodes[1].post_sink(4, 1, BulkBuf::new(NiIndex(0), &sink, 0, len).unwrap());
    let src = f.register(0, vec![7; len as usize]);
    let b = BulkBuf::new(NiIndex(0), &src, 0, len).unwrap();
    f.nodes[0].send_put_bulk(now, server, 4, 1, b).unwrap();
    f.run_for(Duration::from_secs(5));
    let results = put_results(&f.take_events(0));
    let books = assert_router_quiescent(&f, &routers);
    assert_eq!(books.dropped_for(FwdDrop::RoutingDisabled), 1);
    assert_eq!(results.len(), 1);
    assert!(
        results[0].is_err(),
        "dropped, yet the sender saw {results:?}"
    );
}

/// The hostile-peer audit: PUT_REQs to a net the router has no route to took a router credit
/// and a large buffer each (the route was looked up only once the data was in), so a peer that
/// never sent the data held the large pool until its LND timeout. Now they are refused before
/// a buffer is lent: the sender's PUT fails at once (EHOSTUNREACH), the large pool is never
/// touched, the drop is counted as no_route, and the books balance.
#[test]
fn a_bulk_put_to_a_net_without_a_route_takes_no_router_buffer() {
    let (mut f, routers) = topology_with(
        false,
        // Two hops: a gateway is not expected to have an NI on a net it reaches through
        // another router (its ping reply does not mark such a route down).
        |c| {
            c.routes.push(RouteConfig {
                hops: Some(2),
                ..route("o2ib9", R_A)
            })
        },
        |_| {},
    );
    give_bulk_buffers(&mut f, &routers, 2);
    let r = routers[0];
    warm_up(&mut f);
    let (no_route0, drops0) = (
        f.nodes[r].stats().local_no_route_count,
        f.nodes[r].stats().drop_count,
    );
    let len = 100_000u32;
    let src = f.register(0, vec![7; len as usize]);
    let now = f.now;
    for i in 0..6 {
        let b = BulkBuf::new(NiIndex(0), &src, 0, len).unwrap();
        f.nodes[0]
            .send_put_bulk(now, nid("10.9.0.1@o2ib9"), 4, i, b)
            .unwrap();
    }
    f.run_for(Duration::from_secs(2));
    let results = put_results(&f.take_events(0));
    assert_eq!(results.len(), 6, "every PUT failed at once: {results:?}");
    assert!(results.iter().all(|r| r.is_err()), "{results:?}");
    let large = f.nodes[r].routing_info().pools[PoolClass::Large.index()];
    assert_eq!(
        (large.credits, large.min_credits),
        (i64::from(large.nbuffers), i64::from(large.nbuffers)),
        "a large buffer was lent for a destination without a route"
    );
    let books = assert_router_quiescent(&f, &routers);
    assert_eq!(books.dropped_for(FwdDrop::NoRoute), 6);
    assert_eq!(f.nodes[r].stats().local_no_route_count - no_route0, 6);
    assert_eq!(f.nodes[r].stats().drop_count - drops0, 6);
}

/// A bulk PUT whose data never comes in (the sender's write fails) is one drop at the router,
/// counted once in LNet's, the NI's and the peer's counters; its buffer comes back.
#[test]
fn a_bulk_ingress_that_fails_is_counted_once() {
    let (mut f, routers) = warm_bulk_topology(false, 1);
    let server = nid(SERVER);
    let r = routers[0];
    let (ni0, st0) = (
        f.nodes[r].nets()[0].drop_count,
        f.nodes[r].stats().drop_count,
    );
    let len = 300_000u32;
    let src = f.register(0, vec![1; len as usize]);
    let b = BulkBuf::new(NiIndex(0), &src, 0, len).unwrap();
    let now = f.now;
    f.nodes[0].send_put_bulk(now, server, 4, 1, b).unwrap();
    // The client's memory goes away before its write: the write fails.
    f.mem[0].regions.remove(&src.id().0);
    f.run_for(Duration::from_secs(300));
    let books = assert_router_quiescent(&f, &routers);
    assert_eq!(books.dropped(), 1, "{books:?}");
    assert_eq!(
        f.nodes[r].nets()[0].drop_count - ni0,
        f.nodes[r].stats().drop_count - st0
    );
}

/// Bulk PUTs through two routers with registered large buffers, one of which dies with bulk in
/// flight and comes back: every PUT ends once at the client within the LND's bounds; what the
/// server got is byte for byte the client's data (nothing torn by the dead router); the live
/// router carries the traffic meanwhile, the returned one (its buffers registered anew) again
/// after; both routers' books balance with every buffer back.
#[test]
fn bulk_traffic_moves_to_the_other_router_when_one_dies_with_bulk_in_flight() {
    let (mut f, r1) = two_routers(FAST_HEALTH);
    give_bulk_buffers(&mut f, &[2], 4);
    give_bulk_buffers(&mut f, &[3], 4);
    f.run_for(Duration::from_secs(3));
    let len = 70_001u32;
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i.wrapping_mul(7919) >> 3) as u8)
        .collect();
    let src = f.register(0, bytes.clone());
    // The server's sinks: one per PUT, all on the same match bits, used oldest first.
    let sinks: Vec<_> = (0..80)
        .map(|_| {
            let s = f.register(1, vec![0xee; len as usize]);
            let b = BulkBuf::new(NiIndex(0), &s, 0, len).unwrap();
            f.nodes[1].post_sink(4, 7, b);
            s
        })
        .collect();
    let send = |f: &mut Fabric, n: usize| {
        let now = f.now;
        let b = BulkBuf::new(NiIndex(0), &src, 0, len).unwrap();
        for _ in 0..n {
            f.nodes[0]
                .send_put_bulk(now, nid(SERVER), 4, 7, b.clone())
                .unwrap();
        }
    };
    let ended = |f: &mut Fabric, n: usize, bound: Duration| {
        let t0 = f.now;
        let mut results = Vec::new();
        while results.len() < n && f.now < t0 + bound {
            f.run_for(Duration::from_millis(500));
            results.extend(put_results(&f.take_events(0)));
        }
        (results, f.now - t0)
    };
    send(&mut f, 10);
    let (results, _) = ended(&mut f, 10, Duration::from_secs(10));
    assert_eq!(results, vec![Ok(()); 10], "both routers up");
    let fwd = |f: &Fabric, r: usize| f.nodes[r].routing_info().stats.forwarded;
    assert!(fwd(&f, 2) > 0 && fwd(&f, 3) > 0, "both routers carry bulk");

    // Router 1 dies with PUTs on their way through it.
    send(&mut f, 10);
    f.kill(2);
    let (results, took) = ended(&mut f, 10, Duration::from_secs(300));
    assert_eq!(results.len(), 10, "every PUT ends once ({took:?})");
    assert!(
        took <= Duration::from_secs(60),
        "the last ended {took:?} after the kill"
    );
    send(&mut f, 10);
    let (results, _) = ended(&mut f, 10, Duration::from_secs(10));
    assert_eq!(results, vec![Ok(()); 10], "all through the live router");

    // It returns, a new instance with its buffers registered anew, and is used again.
    f.restart(2, r1, 50);
    give_bulk_buffers(&mut f, &[2], 4);
    let back = f.now;
    while !f.nodes[0].gateways().iter().all(|g| g.alive) && f.now < back + Duration::from_secs(60) {
        f.run_for(Duration::from_millis(500));
    }
    let before = fwd(&f, 2);
    send(&mut f, 10);
    let (results, _) = ended(&mut f, 10, Duration::from_secs(10));
    assert_eq!(results, vec![Ok(()); 10]);
    assert!(
        fwd(&f, 2) > before,
        "the returned router carries bulk again"
    );

    // What the server received is exactly the client's data; nothing else was touched.
    let landed = f
        .take_events(1)
        .iter()
        .filter(|(_, e)| matches!(e, LnetEvent::BulkPut { result: Ok(_), .. }))
        .count();
    assert!(landed >= 30, "{landed} PUTs landed");
    let mut full = 0;
    for s in &sinks {
        let got = f.region(1, s);
        if got.iter().all(|&x| x == 0xee) {
            continue;
        }
        assert!(
            got == bytes,
            "a sink holds something other than the client's data"
        );
        full += 1;
    }
    assert_eq!(full, landed, "every landed PUT filled one sink, whole");
    assert_router_quiescent(&f, &[2, 3]);
}

/// GETs into registered memory through a router, one router node or split runtimes: the GET
/// goes IMMEDIATE (never an optimized GET through a router), the server answers from a posted
/// source with a REPLY by rendezvous, which the router carries through its large buffers into
/// the client's memory. Sizes 1 B..1 MiB land byte for byte; a GET nothing matches ends at its
/// deadline (LNet drops it), and so does one whose REPLY the router cannot carry.
#[test]
fn bulk_gets_cross_a_router_byte_exact() {
    for split_router in [false, true] {
        let (mut f, routers, bytes, src) = byte_exact_setup(split_router, 1, 9);
        let server = nid(SERVER);
        let sizes = [1u32, 3977, 300_001, MIB as u32];
        let mut sinks = Vec::new();
        let mut ids = Vec::new();
        let now = f.now;
        for (i, &len) in sizes.iter().enumerate() {
            let b = BulkBuf::new(NiIndex(0), &src, 5 + i as u64, len).unwrap();
            f.nodes[1].post_source(4, 200 + i as u64, b);
            let sink = f.register(0, vec![0xee; MIB + 64]);
            let into = BulkBuf::new(NiIndex(0), &sink, 3, len).unwrap();
            ids.push(
                f.nodes[0]
                    .send_get_bulk(now, server, 4, 200 + i as u64, into)
                    .unwrap(),
            );
            sinks.push(sink);
        }
        // And one that matches nothing at the server.
        let nothing = f.register(0, vec![0xee; 4096]);
        let into = BulkBuf::new(NiIndex(0), &nothing, 0, 4096).unwrap();
        let lost = f.nodes[0].send_get_bulk(now, server, 4, 999, into).unwrap();
        f.run_for(Duration::from_secs(10));
        let done = get_dones(&f.take_events(0));
        for (i, &len) in sizes.iter().enumerate() {
            assert!(
                done.contains(&(ids[i], Ok(len))),
                "split {split_router}: size {len}: {done:?}"
            );
            let want = &bytes[5 + i..5 + i + len as usize];
            let what = format!("split {split_router}: size {len}");
            assert_landed(&f.region(0, &sinks[i]), 3, want, &what);
        }
        assert!(!done.iter().any(|d| d.0 == lost), "not ended yet");
        f.run_for(Duration::from_secs(100));
        let done = get_dones(&f.take_events(0));
        assert_eq!(
            done,
            vec![(lost, Err(LnetError::Timeout))],
            "split {split_router}"
        );
        assert!(f.region(0, &nothing).iter().all(|&x| x == 0xee));
        let books = assert_router_quiescent(&f, &routers);
        assert_eq!(books.dropped(), 0, "{books:?}");
    }
}

/// The routed GETs that ended among `evs`, with their results.
fn get_dones(evs: &[(Instant, LnetEvent)]) -> Vec<(MsgId, Result<u32, LnetError>)> {
    picked(evs, |e| match e {
        LnetEvent::GetDone { id, result } => Some((*id, *result)),
        _ => None,
    })
}

/// The client sends the server `n` routed bulk GETs (4 KiB) that nothing there matches: they
/// stay pending until their deadline.
fn unmatched_routed_gets(f: &mut Fabric, n: u64) -> Vec<MsgId> {
    let server = nid(SERVER);
    let now = f.now;
    (0..n)
        .map(|i| {
            let into = f.bulk_buf(0, vec![0; 4096]);
            f.nodes[0]
                .send_get_bulk(now, server, 4, 1000 + i, into)
                .unwrap()
        })
        .collect()
}

/// The server posts a source of `len` bytes (match bits 77) and the client GETs it through
/// the router by rendezvous; after 2 s, what the server says it served, and to whom.
fn a_served_routed_get(f: &mut Fabric, len: usize) -> Vec<(Nid, Result<u32, LnetError>)> {
    let b = f.bulk_buf(1, vec![7; len]);
    f.nodes[1].post_source(4, 77, b);
    let into = f.bulk_buf(0, vec![0; len]);
    let now = f.now;
    f.nodes[0]
        .send_get_bulk(now, nid(SERVER), 4, 77, into)
        .unwrap();
    f.run_for(Duration::from_secs(2));
    picked(&f.take_events(1), |e| match e {
        LnetEvent::BulkGetServed { to, result, .. } => Some((*to, *result)),
        _ => None,
    })
}

/// A ping's REPLY never answers a routed GET (pings and routed GETs draw their wire cookies
/// from one counter): neither the GET nor the ping is lost.
#[test]
fn a_ping_reply_does_not_kill_a_routed_bulk_get_with_the_same_cookie() {
    let (mut f, _) = bulk_topology(false, 2);
    let server = nid(SERVER);
    let now = f.now;
    // Unmatched routed GETs: MsgIds 1..=10 pending until their deadline.
    unmatched_routed_gets(&mut f, 10);
    let ping = f.nodes[0]
        .ping(now, server, Duration::from_secs(5))
        .unwrap();
    f.run_for(Duration::from_secs(6));
    let evs = f.take_events(0);
    let early = get_dones(&evs);
    let pinged: Vec<_> = picked(&evs, |e| match e {
        LnetEvent::PingDone { id, result, .. } if *id == ping => Some(result.is_ok()),
        _ => None,
    });
    assert_eq!(
        pinged,
        vec![true],
        "ping {ping:?} lost; GETs ended early: {early:?}"
    );
    assert!(
        early.is_empty(),
        "a routed GET ended before its deadline: {early:?}"
    );
}

/// A server answering a routed GET by a rendezvous REPLY counts that REPLY as sent once.
#[test]
fn serving_a_routed_get_counts_one_send() {
    let (mut f, _) = warm_bulk_topology(false, 2);
    let before = f.nodes[1].stats().clone();
    let served: Vec<_> = a_served_routed_get(&mut f, 300_000)
        .into_iter()
        .map(|(_, result)| result)
        .collect();
    let after = f.nodes[1].stats().clone();
    assert_eq!(served, vec![Ok(300_000)]);
    assert_eq!(after.send_count - before.send_count, 1, "sends");
    assert_eq!(
        after.send_length - before.send_length,
        300_000,
        "bytes sent"
    );
}

/// Nor does a gateway ping's REPLY answer a routed GET (its loss would mark the gateway
/// dead and stop routed traffic until a retry).
#[test]
fn a_gateway_ping_reply_does_not_kill_a_routed_bulk_get() {
    let (mut f, _) = bulk_topology(false, 2);
    unmatched_routed_gets(&mut f, 10);
    f.run_for(Duration::from_secs(6));
    let early = get_dones(&f.take_events(0));
    f.run_for(Duration::from_secs(120));
    let gws = f.nodes[0].gateways();
    assert!(
        gws.iter().all(|g| g.alive && g.ping_failures == 0),
        "{early:?} {gws:?}"
    );
    assert!(
        early.is_empty(),
        "routed GETs ended early: {early:?}; gateways {gws:?}"
    );
    assert!(
        gws.iter().all(|g| g.alive && g.ping_failures == 0),
        "{gws:?}"
    );
}

/// A routed GET whose GET message fails is counted as one error, as a PUT that fails so.
#[test]
fn a_routed_get_that_fails_to_send_counts_one_error() {
    let (mut f, routers) = warm_bulk_topology(false, 2);
    let server = nid(SERVER);
    f.take_events(0);
    f.kill(routers[0]);
    let before = f.nodes[0].stats().clone();
    let pf = |f: &Fabric| {
        f.nodes[0]
            .gateways()
            .iter()
            .map(|g| g.ping_failures)
            .sum::<u64>()
    };
    let pings_before = pf(&f);
    let into = f.bulk_buf(0, vec![0; 4096]);
    let now = f.now;
    let put = f.nodes[0]
        .send_put_bulk(now, server, 4, 1, into.clone())
        .unwrap();
    let get = f.nodes[0].send_get_bulk(now, server, 4, 1, into).unwrap();
    f.run_for(Duration::from_secs(200));
    let evs = f.take_events(0);
    let after = f.nodes[0].stats().clone();
    let ping_fails = pf(&f) - pings_before;
    let ended: Vec<_> = picked(&evs, |e| match e {
        LnetEvent::PutDone { id, result } if *id == put => Some(format!("put {result:?}")),
        LnetEvent::GetDone { id, result } if *id == get => Some(format!("get {result:?}")),
        _ => None,
    });
    assert_eq!(ended.len(), 2, "{ended:?}");
    assert_eq!(
        after.errors - before.errors,
        2 + ping_fails,
        "{ended:?} pings {ping_fails} {before:?} {after:?}"
    );
}

/// BulkGetServed for a GET answered by a rendezvous REPLY names the requester.
#[test]
fn a_get_served_by_reply_names_its_requester() {
    let (mut f, _) = bulk_topology(false, 2);
    let served = a_served_routed_get(&mut f, 5000);
    assert_eq!(served, vec![(nid(CLIENT), Ok(5000))]);
}

/// A REPLY by rendezvous is the answer to a routed GET only when it comes from the node the GET
/// went to: a peer forging one (right wire handle, wrong source) writes nothing into the
/// requester's memory, and the GET still ends, at its deadline.
#[test]
fn a_forged_reply_never_writes_into_a_routed_gets_memory() {
    let (mut f, _) = warm_bulk_topology(false, 2);
    let server = nid(SERVER);
    // The server posts nothing: the GET is dropped there, its REPLY never comes.
    let sink = f.register(0, vec![0xee; 8192]);
    let into = BulkBuf::new(NiIndex(0), &sink, 0, 8192).unwrap();
    let now = f.now;
    let id = f.nodes[0].send_get_bulk(now, server, 4, 77, into).unwrap();
    f.run_for(Duration::from_millis(100));
    // The wire handle the GET carried, as the router (which forwarded it) could read it.
    let wmd = f.nodes[0].pending_bulk_get_handle(id).expect("waiting");
    // The router, a directly connected peer, forges the REPLY in the server's stead... but
    // from its own NID, as it must to be delivered.
    let buf = f.bulk_buf(2, vec![0x66; 8192]);
    let hdr = LnetHdr {
        dest_nid: nid(CLIENT),
        src_nid: nid(R_A),
        dest_pid: LNET_PID_LUSTRE,
        src_pid: LNET_PID_LUSTRE,
        payload_length: 8192,
        body: LnetBody::Reply { dst_wmd: wmd },
    };
    let now = f.now;
    f.nodes[2].send_raw_bulk(now, NiIndex(0), nid(CLIENT), hdr, buf, false);
    f.run_for(Duration::from_secs(5));
    assert!(
        f.region(0, &sink).iter().all(|&x| x == 0xee),
        "nothing written"
    );
    let ev = f.take_events(0);
    assert!(
        !ev.iter()
            .any(|(_, e)| matches!(e, LnetEvent::GetDone { .. })),
        "{ev:?}"
    );
    f.run_for(Duration::from_secs(100));
    let ev = f.take_events(0);
    let done: Vec<_> = picked(&ev, |e| match e {
        LnetEvent::GetDone { id: i, result } if *i == id => Some(*result),
        _ => None,
    });
    assert_eq!(done, vec![Err(LnetError::Timeout)]);
}

/// `net del` of a router's egress NI whose peer does not take what it holds within the
/// shutdown bound: the daemon drops that runtime, so it first fails back every message it was
/// sending for its sibling (`abandon_forwards`). The ingress runtime gets its router buffers
/// and its sender's router credits back and counts the drops; nothing stays in flight there.
#[test]
fn a_removed_egress_runtime_fails_back_what_it_holds_for_its_sibling() {
    let (mut f, routers) = topology(true, |_| {});
    let (ingress, egress) = (routers[0], routers[1]);
    // The egress waits on its connect to the silent server, holding the three.
    let info = puts_to_a_dead_server(&mut f, ingress, 3, Duration::from_secs(1));
    assert_eq!(info.stats.in_flight, 3);
    assert_eq!(f.nodes[egress].messages_in_flight(), 3);
    f.nodes[egress].abandon_forwards();
    assert_eq!(f.nodes[egress].messages_in_flight(), 0);
    f.run_for(Duration::from_millis(10));
    assert_books(&f.nodes[ingress].routing_info().stats, 0, 3);
    assert_pools_full(&f, ingress);
    for p in f.nodes[ingress].peers() {
        assert_eq!(p.available_rtr_credits, p.max_ni_tx_credits, "{}", p.nid);
    }
    // Its own messages (none here) and those it received stay its own: a second call finds
    // nothing more to give back.
    f.nodes[egress].abandon_forwards();
    f.run_for(Duration::from_millis(10));
    assert_eq!(
        f.nodes[ingress]
            .routing_info()
            .stats
            .dropped_for(FwdDrop::Shutdown),
        3
    );
}

/// The review of the hostile-peer fixes: the no-route check before lending a router buffer calls `route()`, which
/// is not a pure lookup (it stamps `route_used`, the round-robin tie-breaker). A bulk PUT then
/// stamps two gateways: one at its PUT_REQ, another when its data is in (the one it really
/// takes). One bulk PUT at a time through a router with two equal gateways to the far net then
/// always leaves by the same gateway; small PUTs, which route once, alternate.
#[test]
fn bulk_puts_one_at_a_time_round_robin_over_two_gateways() {
    const FAR: &str = "10.2.0.2@o2ib2";
    const G1_B: &str = "10.1.0.11@o2ib1";
    const G1_C: &str = "10.2.0.11@o2ib2";
    const G2_B: &str = "10.1.0.12@o2ib1";
    const G2_C: &str = "10.2.0.12@o2ib2";
    let two_hops = |net: &str, gw: &str| RouteConfig {
        hops: Some(2),
        ..route(net, gw)
    };
    let client = node(
        &[CLIENT],
        &[route("o2ib1", R_A), two_hops("o2ib2", R_A)],
        false,
        10,
    );
    let far = node(
        &[FAR],
        &[route("o2ib1", G1_C), two_hops("o2ib", G1_C)],
        false,
        20,
    );
    let r = node(
        &[R_A, R_B],
        &[route("o2ib2", G1_B), route("o2ib2", G2_B)],
        true,
        30,
    );
    let g1 = node(&[G1_B, G1_C], &[route("o2ib", R_B)], true, 40);
    let g2 = node(&[G2_B, G2_C], &[route("o2ib", R_B)], true, 50);
    let mut f = Fabric::from_configs(vec![client, far, r, g1, g2]);
    for n in [2, 3, 4] {
        give_bulk_buffers(&mut f, &[n], 2);
    }
    f.run_for(Duration::from_secs(3));
    let fwd = |f: &Fabric| {
        (
            f.nodes[3].routing_info().stats.forwarded,
            f.nodes[4].routing_info().stats.forwarded,
        )
    };
    // Both gateways forwarded more than they had at `since`: their counts now.
    let both_used = |f: &Fabric, (a0, b0): (u64, u64), what: &str| {
        let (a, b) = fwd(f);
        assert!(a > a0 && b > b0, "{what}: g1 {} g2 {}", a - a0, b - b0);
        (a, b)
    };
    // Control: small PUTs, one at a time, alternate.
    let start = fwd(&f);
    for i in 0..6 {
        let now = f.now;
        f.nodes[0]
            .send_put(now, nid(FAR), 4, i, vec![1; 64])
            .unwrap();
        f.run_for(Duration::from_millis(500));
    }
    let after_small = both_used(&f, start, "small PUTs");
    // Bulk PUTs, one at a time.
    let len = 100_000u32;
    let src = f.register(0, vec![7; len as usize]);
    for i in 0..6u64 {
        let sink = f.register(1, vec![0; len as usize]);
        f.nodes[1].post_sink(4, 100 + i, BulkBuf::new(NiIndex(0), &sink, 0, len).unwrap());
        let now = f.now;
        let b = BulkBuf::new(NiIndex(0), &src, 0, len).unwrap();
        f.nodes[0]
            .send_put_bulk(now, nid(FAR), 4, 100 + i, b)
            .unwrap();
        f.run_for(Duration::from_millis(500));
    }
    let results = put_results(&f.take_events(0));
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    both_used(
        &f,
        after_small,
        "bulk PUTs one at a time all left by one gateway",
    );
}

/// The operator audit: after `net del` and `net add` of a router's egress NI, the new NI has
/// no registration of the router buffers, yet the ingress still took bulk PUTs for it (PUT_ACK:
/// its sender counted them delivered) and dropped them as `send_failed` once they were in.
/// The ingress now refuses a bulk PUT whose egress cannot send from router buffers before it
/// lends one (-EPROTO, `no_bulk_buffer`), so the sender's PUT fails; and a runtime forgets the
/// registrations of an NI that left the node, so an NI added again under the same NID is not
/// taken for the one that had them.
#[test]
fn a_bulk_put_whose_egress_has_no_router_buffers_fails_at_its_sender() {
    use lnd::engine::TxError;
    use lnd::wire::errno::EPROTO;
    let (mut f, routers) = topology(true, |_| {});
    let (ingress, egress) = (routers[0], routers[1]);
    give_bulk_buffers(&mut f, &routers, 4);
    let board = crate::alive::NetAlive::new(2);
    let now = f.now;
    // The egress leaves the node and comes back under the same NID.
    f.nodes[ingress].set_node_nids(vec![nid(R_A)], crate::alive::NetAlive::new(1));
    f.nodes[ingress].set_node_nids(vec![nid(R_A), nid(R_B)], board.clone());
    f.nodes[egress].set_node_nids(vec![nid(R_A), nid(R_B)], board);
    f.nodes[egress].set_bulk_buffers(now, Default::default(), Vec::new());
    let server = nid(SERVER);
    let sink = f.register(1, vec![0; 100_000]);
    let sink = BulkBuf::new(NiIndex(0), &sink, 0, 100_000).unwrap();
    f.nodes[1].post_sink(4, 1, sink);
    let buf = f.bulk_buf(0, vec![7; 100_000]);
    let put = f.nodes[0].send_put_bulk(now, server, 4, 1, buf).unwrap();
    f.run_for(Duration::from_secs(5));
    let done: Vec<_> = picked(&f.take_events(0), |e| match e {
        LnetEvent::PutDone { id, result } if *id == put => Some(*result),
        _ => None,
    });
    assert_eq!(done, vec![Err(LnetError::Lnd(TxError::Rdma(-EPROTO)))]);
    let books = assert_router_quiescent(&f, &routers);
    assert_eq!(
        (books.dropped_for(FwdDrop::NoBulkBuffer), books.dropped()),
        (1, 1),
        "{books:?}"
    );
}

/// A three-router chain whose middle router routes the far net with `hop: 2` through a
/// gateway that is in fact on it (hop counts used as a preference, or miscounted): its ping
/// reply lists an NI on the far net, so it is a last hop and the traffic goes through, with
/// the middle router as one node or split into one runtime per NI (the review of the hop
/// rule: the split router judged its sibling's gateway by the hop count alone and dropped
/// every message as a loop).
#[test]
fn a_last_hop_gateway_is_known_by_its_ping_reply_not_its_hop_count() {
    for split_router in [false, true] {
        let (cfgs, idx) = chain_configs(3, split_router, |_| 2);
        let mut f = Fabric::from_configs(cfgs);
        // The gateways' first pings answered.
        f.run_for(Duration::from_secs(1));
        let (got, books) = five_puts_through_a_chain_of_three(&mut f, &idx);
        assert_eq!(got, 5, "split={split_router}: {books:?}");
        assert_eq!(books.dropped(), 0, "split={split_router}: {books:?}");
    }
}

/// A gateway that reports its NI on the far net DOWN (nothing heard there for a while, as
/// routers report a silent net) still delivers there directly: with avoid_asym_router_failure
/// off its route is alive, and the hop rule must not take it for a loop (the review: every
/// message through three routers was dropped as `loop`, so the far net stayed silent, and
/// "down", for good).
#[test]
fn a_gateway_reporting_its_far_ni_down_is_still_a_last_hop() {
    let health = GatewayHealthConfig {
        check_interval: Duration::from_secs(2),
        ping_timeout: Duration::from_secs(1),
        avoid_asym: false,
    };
    let (mut cfgs, idx) = chain_configs(3, false, |i| (2 - i) as u8);
    for c in cfgs.iter_mut() {
        c.gateway_health = health;
    }
    // The server never pings its gateway: the far net goes silent.
    cfgs[1].gateway_health.check_interval = Duration::ZERO;
    let mut f = Fabric::from_configs(cfgs);
    // Router 2 now reports its o2ib3 NI down.
    f.run_for(Duration::from_secs(10));
    let (got, books) = five_puts_through_a_chain_of_three(&mut f, &idx);
    assert_eq!(got, 5, "middle router: {books:?}");
}

/// Passive revival (lnet_parse): a message forwarded to us by a gateway we hold dead marks it
/// alive at once, before our pinger's next try. The router goes silent for a few seconds, not
/// long enough for any LND to give up on a connection: the client's ping of it times out, so
/// the client holds it dead, with its connection still up (no LND news will revive it). The
/// router comes back and forwards the server's PUT (the server never pings: it trusts its
/// route) over that connection: the client holds the router alive again at once, with no ping
/// of its own in between.
#[test]
fn a_gateway_held_dead_is_revived_by_the_traffic_it_forwards() {
    let mut client = node(&[CLIENT], &[route("o2ib1", R_A)], false, 10);
    client.gateway_health = FAST_HEALTH;
    let mut server = node(&[SERVER], &[route("o2ib", R_B)], false, 20);
    server.gateway_health = GatewayHealthConfig {
        check_interval: Duration::ZERO,
        ..FAST_HEALTH
    };
    let router = node(&[R_A, R_B], &[], true, 30);
    let mut f = Fabric::from_configs(vec![client, server, router]);
    f.run_for(Duration::from_secs(1));
    // Both connections up: the server's through the router to the client.
    let now = f.now;
    f.nodes[1]
        .send_put(now, nid(CLIENT), 4, 1, vec![1; 64])
        .unwrap();
    f.run_for(Duration::from_secs(1));
    assert_eq!(puts(&f.take_events(0)).len(), 1);
    let r_a = |f: &Fabric| {
        f.nodes[0]
            .gateways()
            .into_iter()
            .find(|g| g.nid == nid(R_A))
            .unwrap()
    };
    assert!(r_a(&f).alive);
    f.kill(2);
    f.run_for(Duration::from_millis(3500));
    let before = r_a(&f);
    assert!(!before.alive, "its ping timed out: {before:?}");
    f.dead.retain(|&d| d != 2);
    let now = f.now;
    f.nodes[1]
        .send_put(now, nid(CLIENT), 4, 2, vec![2; 64])
        .unwrap();
    f.run_for(Duration::from_millis(20));
    assert_eq!(puts(&f.take_events(0)).len(), 1, "the server's PUT arrived");
    let after = r_a(&f);
    assert!(after.alive, "revived by the PUT it forwarded: {after:?}");
    assert_eq!(after.pings, before.pings, "no ping of ours revived it");
}

/// Failover with requests awaiting their REPLY: the client pings the server through two
/// routers (round robin), and one router dies with pings in flight. Every ping ends by its own
/// deadline, answered or failed, none hangs; once the client holds the dead router dead, every
/// ping goes through the other and is answered.
#[test]
fn requests_awaiting_a_reply_end_by_their_deadline_when_a_router_dies() {
    let (mut f, _) = two_routers(FAST_HEALTH);
    f.run_for(Duration::from_secs(3));
    let server = nid(SERVER);
    let timeout = Duration::from_secs(5);
    let now = f.now;
    for _ in 0..10 {
        f.nodes[0].ping(now, server, timeout).unwrap();
    }
    // Killed with the pings on their way to it (round robin: half of them).
    f.kill(2);
    f.run_for(timeout + Duration::from_secs(1));
    let pings = ping_results(&f.take_events(0));
    assert_eq!(pings.len(), 10, "every ping ended");
    for (at, _, r) in &pings {
        assert!(*at <= now + timeout, "ended by its deadline: {at:?} {r:?}");
    }
    assert!(
        pings.iter().any(|(_, _, r)| r.is_err()),
        "some were in the dead router: {pings:?}"
    );
    let now = f.now;
    for _ in 0..10 {
        f.nodes[0].ping(now, server, timeout).unwrap();
    }
    f.run_for(Duration::from_secs(2));
    let pings = ping_results(&f.take_events(0));
    assert_eq!(pings.len(), 10);
    assert!(pings.iter().all(|(_, _, r)| r.is_ok()), "{pings:?}");
}

/// A router NI whose fabric fails for good (its driver errs; o2iblnd's fatal HCA error) is
/// down, as Lustre reports an NI with ni_fatal_error_on, instead of the daemon stopping: what
/// its LND held fails back to the ingress (the books reconcile, every buffer and credit back),
/// its sibling's ping reply lists it DOWN (so the client can take the route down,
/// avoid_asym_router_failure), `net show` says `status: down`, and what comes for it later
/// fails at once.
#[test]
fn a_router_ni_whose_fabric_failed_is_reported_down_and_fails_what_it_held() {
    let (mut f, routers) = topology(true, |_| {});
    let (ingress, egress) = (routers[0], routers[1]);
    let server = nid(SERVER);
    ping_the_server(&mut f);
    // The server goes silent: the egress holds what it was given, waiting on the connection.
    let info = puts_to_a_dead_server(&mut f, ingress, 5, Duration::from_millis(500));
    assert_eq!(info.stats.in_flight, 5);
    let now = f.now;
    f.nodes[egress].fabric_lost(now);
    f.run_for(Duration::from_millis(100));
    let info = f.nodes[ingress].routing_info();
    assert_eq!(info.stats.in_flight, 0, "{:?}", info.stats);
    assert!(info.stats.reconciles(), "{:?}", info.stats);
    assert_eq!(info.stats.dropped(), 5, "{:?}", info.stats);
    assert_eq!(f.nodes[egress].messages_in_flight(), 0);
    for &r in &routers {
        assert_pools_full(&f, r);
    }
    assert_eq!(f.nodes[egress].nets()[0].status, "down");
    assert_eq!(f.nodes[ingress].nets()[0].status, "up");
    assert_eq!(f.nodes[ingress].silent_nids(f.now), vec![nid(R_B)]);
    // The client asks the router (through the live NI): R_B is DOWN.
    let reply = ping_result(&mut f, R_A, Duration::from_secs(5), Duration::from_secs(1))
        .expect("the live NI answers");
    assert_eq!(reply.down_nids, vec![nid(R_B)]);
    // Later traffic for the lost NI fails at once, counted.
    let now = f.now;
    f.nodes[0]
        .send_put(now, server, 4, 9, vec![1; 100])
        .unwrap();
    f.run_for(Duration::from_millis(100));
    let info = f.nodes[ingress].routing_info();
    assert_eq!(
        (info.stats.in_flight, info.stats.dropped()),
        (0, 6),
        "{:?}",
        info.stats
    );
}

/// What waits in a lost runtime for a router credit or a buffer is dropped at once, counted
/// (it came in on the lost fabric and can never be received), not left until the buffers
/// ahead of it come back; what is already with the egress ends when the egress ends it.
#[test]
fn a_lost_ingress_drops_what_waits_for_its_credits_at_once() {
    let (mut f, routers) = topology(true, |c| {
        for ni in &mut c.nis {
            ni.peer_buffer_credits = 2;
        }
    });
    let (ingress, egress) = (routers[0], routers[1]);
    let info = puts_to_a_dead_server(&mut f, ingress, 10, Duration::from_secs(1));
    assert_eq!(
        (info.stats.in_flight, info.stats.waited_rtr_credit),
        (8, 6),
        "{:?}",
        info.stats
    );
    let now = f.now;
    f.nodes[ingress].fabric_lost(now);
    assert_books(&f.nodes[ingress].routing_info().stats, 2, 6);
    // The two with the egress end as the egress gives up on the dead server.
    let start = f.now;
    while f.nodes[ingress].routing_info().stats.in_flight > 0
        && f.now < start + Duration::from_secs(3600)
    {
        f.run_for(Duration::from_secs(10));
    }
    let info = f.nodes[ingress].routing_info();
    assert!(
        info.stats.reconciles() && info.stats.in_flight == 0,
        "{:?}",
        info.stats
    );
    for r in [ingress, egress] {
        assert_pools_full(&f, r);
    }
}

/// The review of `fabric_lost`: the connections of a lost fabric end as lost (a transport
/// failure: `conns_lost`, `fabric_transport_errors`, ConnectionLost), not as graceful closes:
/// the LND's shutdown ran first and closed them gracefully.
#[test]
fn a_lost_fabric_ends_its_connections_as_lost_not_as_graceful_closes() {
    let (mut f, routers) = topology(true, |_| {});
    let egress = routers[1];
    ping_the_server(&mut f);
    let _ = f.take_events(egress);
    let now = f.now;
    f.nodes[egress].fabric_lost(now);
    let after = f.nodes[egress]
        .endpoint(NiIndex(0))
        .unwrap()
        .stats()
        .clone();
    let mut downs = Vec::new();
    while let Some(e) = f.nodes[egress].poll_event() {
        if let LnetEvent::PeerDown { reason, .. } = e {
            downs.push(reason);
        }
    }
    assert_eq!(after.graceful_closes, 0, "{after:?}");
    assert!(after.fabric_transport_errors > 0, "{after:?}");
    assert!(!downs.is_empty());
    assert!(
        downs
            .iter()
            .all(|r| *r == lnd::engine::DownReason::ConnectionLost),
        "{downs:?}"
    );
}

/// A driver with no fabric behind it, for the runtime's own tests: nothing to apply, and every
/// poll returns at once, `Ok`, or EIO if it `fails` (a driver that died).
pub(super) struct StubDriver {
    pub(super) fails: bool,
}

impl lnd::driver::Driver for StubDriver {
    fn apply(&mut self, _: Instant, _: lnd::fabric::FabricAction) {}
    fn poll(
        &mut self,
        _: Option<std::time::Duration>,
        _: &mut dyn lnd::fabric::FabricSink,
        _: &dyn Fn() -> Instant,
    ) -> std::io::Result<()> {
        if self.fails {
            Err(std::io::Error::from_raw_os_error(5))
        } else {
            Ok(())
        }
    }
    fn set_waker(&mut self, _: std::os::fd::RawFd) {}
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

/// The review of `lose_fabric`: a runtime whose driver failed must not keep a thread that
/// shares it with others from sleeping (the dead driver says it has queued work for good).
#[test]
fn a_lost_runtime_does_not_keep_a_shared_thread_from_sleeping() {
    use lnd::driver::MonotonicClock;
    let clock = MonotonicClock::new();
    let cfgs = split(node(&[R_A, R_B], &[], true, 30));
    let node = LnetNode::new(cfgs.into_iter().next().unwrap(), clock.now());
    let (mut rt, _wake) =
        crate::runtime::NiRuntime::new(node, StubDriver { fails: true }, clock).unwrap();
    assert!(rt.turn(std::time::Duration::from_millis(1)).is_err());
    rt.lose_fabric();
    assert!(rt.node().is_fabric_lost());
    rt.turn(std::time::Duration::from_millis(1)).unwrap();
    let hint = rt.wait_hint(std::time::Duration::from_secs(1));
    assert!(hint > std::time::Duration::ZERO, "wait_hint = {hint:?}");
}

/// A response of ours whose way back leaves by a sibling runtime's NI goes back through the
/// router that brought the request, as the kernel sends a REPLY through the gateway the GET
/// came from (a kernel-interop review: with an asymmetric route, a remote node's ping of the
/// router's other NID was dropped as "no route"). X on o2ib2 reaches o2ib1 through R2; the
/// router (split per NI) reaches o2ib2 through R2's o2ib NI, which its o2ib1 runtime cannot
/// send by.
#[test]
fn a_reply_whose_way_back_is_a_sibling_ni_goes_back_the_way_it_came() {
    const X: &str = "10.2.0.5@o2ib2";
    const R2_C: &str = "10.2.0.253@o2ib2";
    let x = node(&[X], &[route("o2ib1", R2_C)], false, 40);
    let r2 = node(&[R2_A, R2_B, R2_C], &[], true, 50);
    let r = node(&[R_A, R_B], &[route("o2ib2", R2_A)], true, 30);
    let mut cfgs = vec![x, r2];
    cfgs.extend(split(r));
    let mut f = Fabric::from_configs(cfgs);
    f.run_for(Duration::from_secs(2));
    let reply = ping_result(&mut f, R_B, Duration::from_secs(2), Duration::from_secs(3))
        .expect("the ping is answered");
    assert_eq!(reply.nids, vec![nid(R_A), nid(R_B)]);
    // It went back on R_B's NI, to R2_B: the o2ib1 runtime sent it, no drop for no route.
    let b = &f.nodes[3];
    assert_eq!(b.stats().local_no_route_count, 0, "{:?}", b.stats());
}

/// The relay of a split router (`crate::relay`, as the daemon runs it) whose egress runtime is
/// gone (its loop ended; here it never ran): a forward to the egress's net fails back at the
/// ingress as a shutdown, whose router buffer and its sender's credit come back and whose books
/// count it, instead of the forward being lost (the fabric's own relay before this one
/// panicked: it found no sibling).
#[test]
fn a_forward_whose_egress_runtime_is_gone_fails_back_at_the_ingress() {
    let client = node(&[CLIENT], &[route("o2ib1", R_A)], false, 10);
    let server = node(&[SERVER], &[route("o2ib", R_B)], false, 20);
    let router = node(&[R_A, R_B], &[], true, 30);
    // Only the ingress runtime (R_A) runs; it knows R_B as its sibling's.
    let ingress = split(router).remove(0);
    let mut f = Fabric::from_configs(vec![client, server, ingress]);
    send_puts(&mut f, nid(SERVER), 4, 3, &[1; 100]);
    f.run_for(Duration::from_secs(1));
    assert_books(&f.nodes[2].routing_info().stats, 0, 3);
    assert_pools_full(&f, 2);
}
