//! Scenario tests on the deterministic simulator, named after the failures they reproduce
//! (shared/seeds/). Each prints its seed on failure; rerun with the same seed to replay it.

use lnd::engine::{ConnState, DownReason, EndpointConfig, RaceOrder, RacePolicy, TxError};
use lnd::sim::{NodeId, SendOutcome, SimConfig, World};
use lnd::time::Duration;
use lnd::wire::Nid;
use ulnet_tests::{
    put_hdr, router_nid, router_reboot_storm, ClientOrders, StormConfig, ROUTER_NID_ORDERS_DISAGREE,
};

use testkit::nid;

fn world(seed: u64) -> World {
    World::new(SimConfig::with_seed(seed))
}

fn node(w: &mut World, s: &str, inc: u64) -> NodeId {
    w.add_node(EndpointConfig::new(nid(s), inc))
}

/// Every send of `cookies` was delivered (`ctx` says which case failed).
fn assert_delivered(w: &World, cookies: &[u64], ctx: &str) {
    for c in cookies {
        assert_eq!(
            w.outcome(*c).map(|(_, o)| o),
            Some(SendOutcome::Delivered),
            "{ctx}"
        );
    }
}

/// Every message handed to the world has a final status.
fn assert_all_accounted(w: &World, seed: u64) {
    assert_eq!(
        w.pending_sends(),
        0,
        "seed {seed}: messages without a status"
    );
    assert_eq!(
        w.stats().unexpected_send_done,
        0,
        "seed {seed}: SendDone not exactly once"
    );
    assert_eq!(
        w.invalid_transitions(),
        0,
        "seed {seed}: a connection state change outside the table"
    );
}

/// S1 (LU-7646): 1000 clients with higher NIDs than the router and traffic for it; the router
/// reboots; 10% of the clients' connects to it hang forever; the router comes back with traffic
/// for every client.
#[test]
fn lu7646_router_reboot_storm() {
    let seed = 7646;
    let r = router_reboot_storm(&StormConfig::new(1000, RacePolicy::Ulnet, seed));
    eprintln!("seed {seed}: {r:?}");
    // Within the connect deadline (max(5 s, 50 s / 4) = 12.5 s) plus 2 s of the router being back.
    let bound = Duration::from_millis(12_500 + 2_000);
    let recovery = r
        .recovery
        .unwrap_or_else(|| panic!("seed {seed}: {} clients never reconnected", r.unrecovered));
    assert!(recovery <= bound, "seed {seed}: recovery took {recovery}");
    assert!(
        r.max_races_per_peer <= 20,
        "seed {seed}: {} race rejects from one peer",
        r.max_races_per_peer
    );
    assert!(
        r.peak_zombies <= 1,
        "seed {seed}: {} zombies for one peer",
        r.peak_zombies
    );
    // Pacing: 10 fast reconnects, then at most one a second (one more may land in the window).
    assert!(
        r.max_attempts_per_second <= 11,
        "seed {seed}: {} connects in one second",
        r.max_attempts_per_second
    );
    assert_eq!(r.unaccounted, 0, "seed {seed}: messages without a status");
    assert_eq!(r.invalid_transitions, 0, "seed {seed}: invalid transitions");
    assert_eq!(r.rnr, 0, "seed {seed}: a send found no receive posted");
}

/// S1 under the four race policies: ours recovers at least as fast as each of Lustre's.
#[test]
fn lu7646_storm_policy_comparison() {
    let seed = 17480;
    let mut ours = None;
    let mut others = Vec::new();
    for policy in RacePolicy::ALL {
        let r = router_reboot_storm(&StormConfig::new(200, policy, seed));
        eprintln!(
            "seed {seed}: {policy:?}: recovery {:?}, attempts {}, races {}, peak zombies {}",
            r.recovery, r.connect_attempts, r.race_rejects, r.peak_zombies
        );
        if policy == RacePolicy::Ulnet {
            ours = Some(r);
        } else {
            others.push(r);
        }
    }
    let ours = ours.expect("ran ours");
    let ours_t = ours.recovery.expect("ours recovers");
    for r in &others {
        if let Some(t) = r.recovery {
            assert!(
                ours_t <= t,
                "seed {seed}: ours {ours_t} slower than {:?} {t}",
                r.policy
            );
        }
    }
    // The 2.8 rule alone never recovers from a stuck connect on the higher NID (the bug).
    let l28 = others
        .iter()
        .find(|r| r.policy == RacePolicy::Lustre28)
        .expect("ran 2.8");
    assert!(
        l28.recovery.is_none(),
        "seed {seed}: the 2.8 rule should stay wedged"
    );
}

/// S2 (the reverted LU-7646 patch): a node sends 1000 messages to its own NID through the LND.
#[test]
fn lu7646_revert_self_connect() {
    let seed = 2;
    let mut w = world(seed);
    let me = nid("10.0.0.5@o2ib");
    let n = node(&mut w, "10.0.0.5@o2ib", 1);
    let cookies: Vec<u64> = (0..1000)
        .map(|_| w.send(n, me, put_hdr(me, me, 32), vec![7; 32]))
        .collect();
    w.run_for(Duration::from_secs(10));
    assert_delivered(&w, &cookies, &format!("seed {seed}"));
    assert_eq!(w.received_count(n), 1000);
    let s = w.endpoint(n).expect("up").stats().clone();
    assert_eq!(
        s.races, 0,
        "seed {seed}: a self-connect was refused as a race"
    );
    assert_eq!(s.rejects_sent.iter().sum::<u64>(), 0);
    assert_all_accounted(&w, seed);
}

/// S3: two live peers connect to each other in the same tick: one connection survives the race,
/// no loop, traffic flows both ways.
#[test]
fn simultaneous_connect() {
    for seed in 0..20 {
        let mut w = world(seed);
        let (na, nb) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
        let a = node(&mut w, "10.0.0.1@o2ib", 1);
        let b = node(&mut w, "10.0.0.2@o2ib", 2);
        let mut cookies = Vec::new();
        for _ in 0..50 {
            cookies.push(w.send(a, nb, put_hdr(na, nb, 8), vec![1; 8]));
            cookies.push(w.send(b, na, put_hdr(nb, na, 8), vec![2; 8]));
        }
        w.run_for(Duration::from_secs(5));
        assert_delivered(&w, &cookies, &format!("seed {seed}"));
        let races = w.endpoint(a).unwrap().stats().races + w.endpoint(b).unwrap().stats().races;
        assert!(races <= 1, "seed {seed}: {races} races");
        // The lower NID lost the race: only the higher NID refuses.
        assert_eq!(w.endpoint(a).unwrap().stats().races, 0, "seed {seed}");
        let attempts =
            w.endpoint(a).unwrap().stats().connects + w.endpoint(b).unwrap().stats().connects;
        assert!(attempts <= 3, "seed {seed}: {attempts} connects");
        assert_all_accounted(&w, seed);
    }
}

/// S4: a peer reboots; the old instance's connections are closed, the CONN_STALE path converges,
/// traffic resumes.
#[test]
fn peer_reboot_conn_stale() {
    for policy in RacePolicy::ALL {
        let seed = 4;
        let mut w = world(seed);
        let (na, nb) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
        let a = w.add_node(EndpointConfig {
            race_policy: policy,
            ..EndpointConfig::new(na, 1)
        });
        let b = w.add_node(EndpointConfig {
            race_policy: policy,
            ..EndpointConfig::new(nb, 2)
        });
        w.send(a, nb, put_hdr(na, nb, 8), vec![0; 8]);
        w.run_for(Duration::from_secs(1));
        w.reboot(b, Duration::from_secs(2), 3);
        // Traffic from the survivor while the peer is away and after it is back.
        let mut late = Vec::new();
        for _ in 0..10 {
            w.send(a, nb, put_hdr(na, nb, 8), vec![1; 8]);
            w.run_for(Duration::from_millis(500));
        }
        w.run_for(Duration::from_secs(3));
        for _ in 0..10 {
            late.push(w.send(a, nb, put_hdr(na, nb, 8), vec![2; 8]));
        }
        w.run_for(Duration::from_secs(5));
        assert_delivered(&w, &late, &format!("seed {seed} {policy:?}"));
        let pa = w.endpoint(a).unwrap().peer(nb).unwrap();
        assert_eq!(
            pa.incarnation, 3,
            "{policy:?}: the survivor knows the new instance"
        );
        // The survivor kept traffic queued across the reboot, so it still named the old
        // instance: the new one refused it CONN_STALE and the retry went through.
        let code = usize::from(lnd::wire::RejectReason::ConnStale.code());
        assert!(
            w.endpoint(a).unwrap().stats().rejects_received[code] >= 1,
            "{policy:?}: no CONN_STALE on the way"
        );
        assert_eq!(pa.established, 1);
        assert!(w
            .endpoint(a)
            .unwrap()
            .conns()
            .all(|c| c.peer_incarnation == 3 || c.state != ConnState::Established));
        assert_all_accounted(&w, seed);
    }
}

/// S5 (3FS #426): shutting an endpoint down makes every peer drop its side within one round trip;
/// no connection is dropped without a close. A deliberately skipped close is counted.
#[test]
fn issue426_graceful_close() {
    let seed = 426;
    let mut w = world(seed);
    let sn = nid("10.0.0.1@o2ib");
    let server = node(&mut w, "10.0.0.1@o2ib", 1);
    let clients: Vec<NodeId> = (2..12)
        .map(|i| node(&mut w, &format!("10.0.0.{i}@o2ib"), i))
        .collect();
    for &c in &clients {
        let cn = w.nid_of(c);
        w.send(c, sn, put_hdr(cn, sn, 8), vec![0; 8]);
    }
    w.run_for(Duration::from_secs(1));
    assert_eq!(w.endpoint(server).unwrap().conns().count(), clients.len());
    let t = w.now();
    w.shutdown(clients[0]);
    // Within one round trip of the connection manager the server has dropped its side (no
    // longer established, the peer reported down); the reaper destroys it on its next tick.
    let rtt = w.config().cm_latency * 2;
    w.run_for(rtt);
    let c0 = w.nid_of(clients[0]);
    let server_ep = w.endpoint(server).unwrap();
    assert!(
        server_ep
            .conns()
            .all(|c| c.peer != c0 || c.state != ConnState::Established),
        "the server still uses a connection to a stopped client"
    );
    assert!(w
        .peer_events(server)
        .iter()
        .any(|e| e.nid == c0 && e.down == Some(DownReason::Closed) && e.at - t <= rtt));
    w.run_for(Duration::from_millis(2));
    assert!(w.endpoint(server).unwrap().conns().all(|c| c.peer != c0));
    assert_eq!(w.endpoint(server).unwrap().stats().ungraceful_drops, 0);
    // Shut everything down: no leaks, nothing orphaned.
    for &c in &clients[1..] {
        w.shutdown(c);
    }
    w.shutdown(server);
    w.run_for(Duration::from_secs(2));
    assert_eq!(w.stats().orphaned, 0, "seed {seed}");
    assert_eq!(w.stats().leaked_conns, 0, "seed {seed}");
    assert_eq!(
        w.live_ends(),
        0,
        "seed {seed}: connections left in the fabric"
    );

    // Now the failure itself: a process that drops its endpoint without closing.
    let mut w = world(seed);
    let server = node(&mut w, "10.0.0.1@o2ib", 1);
    let client = node(&mut w, "10.0.0.2@o2ib", 2);
    let cn = w.nid_of(client);
    w.send(client, sn, put_hdr(cn, sn, 8), vec![0; 8]);
    w.run_for(Duration::from_secs(1));
    let leaks = w.endpoint(client).unwrap().leak_counter();
    w.crash(client);
    assert_eq!(
        leaks.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the skipped close was not counted"
    );
    assert_eq!(w.leaked_conns(client), 1);
    let _ = server;
}

/// S6: a peer vanishes without closing; its peers declare it down within keepalive + timeout,
/// and every message queued for it completes with an error status.
#[test]
fn silent_crash_detected() {
    let seed = 6;
    let (mut w, a, b, na, nb) = connected_pair(seed);
    // Idle at first: only the keepalive can notice.
    let bound = crash_is_found_in_time(&mut w, a, b, seed);
    // Traffic to the dead peer, queued or in flight: every message ends with an error status.
    let cookies: Vec<u64> = (0..50)
        .map(|_| w.send(a, nb, put_hdr(na, nb, 8), vec![1; 8]))
        .collect();
    w.run_for(bound + Duration::from_secs(30));
    for c in &cookies {
        match w.outcome(*c).map(|(_, o)| o) {
            Some(SendOutcome::Failed(e)) => assert!(matches!(
                e,
                TxError::ConnectFailed
                    | TxError::ConnectRefused
                    | TxError::Timeout
                    | TxError::PeerUnreachable
                    | TxError::ConnAborted
                    | TxError::ConnTimedOut
                    | TxError::SendFailed
            )),
            other => panic!("seed {seed}: message ended {other:?}"),
        }
    }
    assert_all_accounted(&w, seed);
}

/// S6 with traffic in flight at the moment of the crash.
#[test]
fn silent_crash_with_traffic_in_flight() {
    let seed = 66;
    let (mut w, a, b, na, nb) = connected_pair(seed);
    let cookies: Vec<u64> = (0..200)
        .map(|_| w.send(a, nb, put_hdr(na, nb, 64), vec![1; 64]))
        .collect();
    w.crash(b);
    let tun = w.endpoint(a).unwrap().config().tunables.clone();
    w.run_for(tun.keepalive + tun.timeout + Duration::from_secs(30));
    for c in &cookies {
        assert!(
            w.outcome(*c).is_some(),
            "seed {seed}: a message never finished"
        );
    }
    assert!(w
        .peer_events(a)
        .iter()
        .any(|e| e.nid == nb && e.down.is_some()));
    assert_all_accounted(&w, seed);
}

/// Kernel interop, defect 2 (race order): a ulnet router reboots among clients of which half
/// order NIDs as Lustre 2.16 does (nidhash) and half as 2.15 does (raw NID), 10% of their
/// connects to it stuck. Every client recovers, no pair exchanges more than 3 CONN_RACE rejects
/// or keeps more than 2 connections, every message has a status. With the router on each order,
/// at the usual router NID (lower than every client under both orders: they agree on every pair)
/// and at one where the orders disagree (double rejects with the clients on the other order, or
/// double accepts: two connections).
#[test]
fn mixed_race_orders_storm_settles_within_three_rejects_per_pair() {
    let seed = 17743;
    // The usual layout (the router lower under both orders, so the orders agree on every pair),
    // then a router NID on which the orders disagree with the clients (double rejects).
    let layouts = [
        (router_nid(), RaceOrder::NidHash),
        (router_nid(), RaceOrder::Nid),
        (nid(ROUTER_NID_ORDERS_DISAGREE), RaceOrder::NidHash),
        (nid(ROUTER_NID_ORDERS_DISAGREE), RaceOrder::Nid),
    ];
    for (router, router_order) in layouts {
        let cfg = StormConfig {
            router_nid: router,
            router_order,
            client_orders: ClientOrders::Alternating,
            ..StormConfig::new(1000, RacePolicy::Ulnet, seed)
        };
        let r = router_reboot_storm(&cfg);
        eprintln!("seed {seed}: router {router} on {router_order:?}: {r:?}");
        let router_order = (router, router_order);
        let recovery = r.recovery.unwrap_or_else(|| {
            panic!(
                "seed {seed} {router_order:?}: {} clients never reconnected",
                r.unrecovered
            )
        });
        // As the single-order storm: the connect deadline plus 2 s.
        assert!(
            recovery <= Duration::from_millis(12_500 + 2_000),
            "seed {seed} {router_order:?}: recovery took {recovery}"
        );
        assert!(
            r.max_race_rejects_per_pair <= 3,
            "seed {seed} {router_order:?}: {} CONN_RACE rejects between the router and one client",
            r.max_race_rejects_per_pair
        );
        assert!(
            (1..=2).contains(&r.max_conns_per_pair),
            "seed {seed} {router_order:?}: {} connections between the router and one client",
            r.max_conns_per_pair
        );
        assert_eq!(
            r.unaccounted, 0,
            "seed {seed} {router_order:?}: messages without a status"
        );
        assert_eq!(r.invalid_transitions, 0, "seed {seed} {router_order:?}");
        assert_eq!(r.rnr, 0, "seed {seed} {router_order:?}");
    }
}

/// Per-node counters of the order learning, summed over both nodes.
fn order_stats(w: &World, nodes: &[NodeId]) -> (u64, u64) {
    nodes.iter().fold((0, 0), |(d, a), &n| {
        let s = w.endpoint(n).expect("up").stats();
        (d + s.race_order_disagreements, a + s.race_order_adoptions)
    })
}

/// Established connections each side holds to the other.
fn established_both(w: &World, a: NodeId, b: NodeId) -> (usize, usize) {
    let (na, nb) = (w.nid_of(a), w.nid_of(b));
    let at = |n: NodeId, peer: Nid| {
        w.endpoint(n)
            .and_then(|e| e.peer(peer))
            .map_or(0, |p| p.established)
    };
    (at(a, nb), at(b, na))
}

/// Kernel interop, defect 2: two ulnet nodes on different race orders whose raw and hash orders
/// disagree (10.0.0.2 is lower by raw NID, 10.0.1.1 by nidhash) connect to each other at the
/// same instant. Arranged one way both refuse (a double reject): exactly one side adopts the
/// other's order, at most 3 rejects, one connection. Arranged the other way both accept: two
/// connections, no reject, and nothing learned (a double accept looks the same as a slow request
/// accepted after the peer's own handshake, so it is no evidence; two connections are harmless,
/// as with o2iblnd's conns_per_peer). Then the connections are broken (a partition until the tx
/// deadline fails them) and both reconnect at the same instant again, several times: at most
/// one reject per round, and nobody switches again (no oscillation).
#[test]
fn two_ulnet_nodes_with_different_orders_never_oscillate() {
    let (lo, hi) = (nid("10.0.0.2@o2ib"), nid("10.0.1.1@o2ib"));
    assert!(RaceOrder::Nid.lower(lo, hi) && RaceOrder::NidHash.lower(hi, lo));
    // (lo's order, hi's order, whether both refuse).
    let arrangements = [
        (RaceOrder::NidHash, RaceOrder::Nid, true),
        (RaceOrder::Nid, RaceOrder::NidHash, false),
    ];
    for (lo_order, hi_order, double_reject) in arrangements {
        for seed in 0..100 {
            let ctx = format!("seed {seed}, {lo} on {lo_order:?}, {hi} on {hi_order:?}");
            let mut w = world(seed);
            let a = w.add_node(EndpointConfig {
                race_order: lo_order,
                ..EndpointConfig::new(lo, 1)
            });
            let b = w.add_node(EndpointConfig {
                race_order: hi_order,
                ..EndpointConfig::new(hi, 2)
            });
            let mut cookies = Vec::new();
            let exchange = |w: &mut World, cookies: &mut Vec<u64>| {
                for _ in 0..5 {
                    cookies.push(w.send(a, hi, put_hdr(lo, hi, 8), vec![1; 8]));
                    cookies.push(w.send(b, lo, put_hdr(hi, lo, 8), vec![2; 8]));
                }
            };
            exchange(&mut w, &mut cookies);
            w.run_for(Duration::from_secs(5));
            let rejects = w.race_rejects_between(a, b);
            let (ea, eb) = established_both(&w, a, b);
            let (disagreements, adoptions) = order_stats(&w, &[a, b]);
            assert!(rejects <= 3, "{ctx}: {rejects} CONN_RACE rejects");
            assert!(
                (1..=2).contains(&ea) && (1..=2).contains(&eb),
                "{ctx}: {ea}/{eb} connections"
            );
            if double_reject {
                assert!(rejects >= 2, "{ctx}: no double reject ({rejects})");
                assert_eq!(adoptions, 1, "{ctx}: {adoptions} adoptions");
                // The lower raw NID switched, at the first double reject.
                assert_eq!(
                    w.endpoint(a).unwrap().stats().race_order_adoptions,
                    1,
                    "{ctx}"
                );
                assert_eq!((ea, eb), (1, 1), "{ctx}: {ea}/{eb} connections");
            } else {
                assert_eq!(rejects, 0, "{ctx}: both sides accept, nobody refuses");
                assert_eq!(
                    (disagreements, adoptions),
                    (0, 0),
                    "{ctx}: a double accept taken as evidence"
                );
            }
            assert_delivered(&w, &cookies, &ctx);
            let adoptions_learned = adoptions;

            // Break and reconnect, simultaneously, a few times.
            for round in 0..4 {
                let part = w.partition(&[a], &[b]);
                // Traffic across the partition: the tx deadline fails the connections.
                let tun = w.endpoint(a).unwrap().config().tunables.clone();
                w.send(a, hi, put_hdr(lo, hi, 8), vec![3; 8]);
                w.send(b, lo, put_hdr(hi, lo, 8), vec![4; 8]);
                w.run_for(tun.timeout + tun.keepalive + Duration::from_secs(30));
                assert_eq!(
                    established_both(&w, a, b),
                    (0, 0),
                    "{ctx} round {round}: connections survived the partition"
                );
                w.heal_partition(part);
                let before = w.race_rejects_between(a, b);
                let mut cookies = Vec::new();
                exchange(&mut w, &mut cookies);
                w.run_for(Duration::from_secs(5));
                let rejects = w.race_rejects_between(a, b) - before;
                let (ea, eb) = established_both(&w, a, b);
                let (_, adoptions) = order_stats(&w, &[a, b]);
                assert!(
                    rejects <= 1,
                    "{ctx} round {round}: {rejects} CONN_RACE rejects after learning"
                );
                assert_eq!(
                    adoptions, adoptions_learned,
                    "{ctx} round {round}: an order switched again"
                );
                assert!(
                    (1..=2).contains(&ea) && (1..=2).contains(&eb),
                    "{ctx} round {round}: {ea}/{eb} connections"
                );
                if double_reject {
                    // Once learned, every race settles on one connection.
                    assert_eq!((ea, eb), (1, 1), "{ctx} round {round}");
                }
                assert_delivered(&w, &cookies, &format!("{ctx} round {round}"));
            }
            assert_all_accounted(&w, seed);
        }
    }
}

/// Two nodes, a (10.0.0.1) and b (10.0.0.2), connected by a first PUT from a.
fn connected_pair(seed: u64) -> (World, NodeId, NodeId, Nid, Nid) {
    let mut w = world(seed);
    let (na, nb) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
    let a = node(&mut w, "10.0.0.1@o2ib", 1);
    let b = node(&mut w, "10.0.0.2@o2ib", 2);
    w.send(a, nb, put_hdr(na, nb, 8), vec![0; 8]);
    w.run_for(Duration::from_secs(1));
    (w, a, b, na, nb)
}

/// Crashes `b` now and runs past `a`'s keepalive + timeout: `a` must have declared `b` down
/// within that bound. Returns the bound.
fn crash_is_found_in_time(w: &mut World, a: NodeId, b: NodeId, seed: u64) -> Duration {
    let nb = w.nid_of(b);
    let t = w.now();
    w.crash(b);
    let tun = w.endpoint(a).unwrap().config().tunables.clone();
    let bound = tun.keepalive + tun.timeout;
    w.run_for(bound + Duration::from_secs(1));
    let down = w
        .peer_events(a)
        .iter()
        .find(|e| e.nid == nb && e.down.is_some())
        .copied()
        .unwrap_or_else(|| panic!("seed {seed}: crashed peer never declared down"));
    assert!(
        down.at - t <= bound,
        "seed {seed}: down after {}",
        down.at - t
    );
    bound
}

/// Two nodes: a (10.0.0.1) at the default keepalive, b (10.0.0.2) sending none (keepalive 0,
/// as a kernel with `keepalive=0`).
fn with_silent_peer(seed: u64) -> (World, NodeId, NodeId, Nid, Nid) {
    let mut w = world(seed);
    let (na, nb) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
    let a = node(&mut w, "10.0.0.1@o2ib", 1);
    let mut cfg_b = EndpointConfig::new(nb, 2);
    cfg_b.tunables.keepalive = Duration::ZERO;
    let b = w.add_node(cfg_b);
    (w, a, b, na, nb)
}

/// Never close a healthy idle connection: a peer that sends no keepalives (keepalive = 0) and
/// a peer at the default keepalive stay idle for a week of virtual time; both keep the same
/// connection to the same peer instance, nothing is lost, nobody is declared silent.
#[test]
fn idle_peer_without_keepalives_keeps_its_connection_for_a_week() {
    let seed = 604_800;
    let (mut w, a, b, na, nb) = with_silent_peer(seed);
    let c = w.send(a, nb, put_hdr(na, nb, 8), vec![0; 8]);
    w.send(b, na, put_hdr(nb, na, 8), vec![0; 8]);
    w.run_for(Duration::from_secs(1));
    assert_eq!(w.outcome(c).map(|(_, o)| o), Some(SendOutcome::Delivered));
    let conns = |w: &World, n: NodeId| {
        let mut v: Vec<_> = w
            .endpoint(n)
            .unwrap()
            .conns()
            .filter(|c| c.state == ConnState::Established)
            .map(|c| (c.id, c.peer, c.peer_incarnation))
            .collect();
        v.sort_by_key(|c| c.0);
        v
    };
    let (before_a, before_b) = (conns(&w, a), conns(&w, b));
    assert_eq!(before_a.len(), 1, "{before_a:?}");
    assert_eq!(before_b.len(), 1, "{before_b:?}");
    let events_before = (w.peer_events(a).len(), w.peer_events(b).len());

    w.run_for(Duration::from_secs(7 * 24 * 3600));

    assert_eq!(
        conns(&w, a),
        before_a,
        "seed {seed}: a's connection changed"
    );
    assert_eq!(
        conns(&w, b),
        before_b,
        "seed {seed}: b's connection changed"
    );
    for (n, peer, inc) in [(a, nb, 2), (b, na, 1)] {
        let e = w.endpoint(n).unwrap();
        let p = e.peer(peer).expect("peer kept");
        assert_eq!(p.incarnation, inc, "seed {seed}");
        assert_eq!(p.established, 1, "seed {seed}");
        assert!(p.up, "seed {seed}");
        let s = e.stats();
        assert_eq!(s.conns_lost, 0, "seed {seed}: {} lost", e.nid());
        assert_eq!(
            s.silent_peers,
            0,
            "seed {seed}: {} found a silent peer",
            e.nid()
        );
        assert_eq!(s.tx_timeouts, 0, "seed {seed}");
    }
    assert_eq!(
        (w.peer_events(a).len(), w.peer_events(b).len()),
        events_before,
        "seed {seed}: a peer went down or up during the week"
    );
    // The default side kept its keepalives going; the other sent none.
    assert!(
        w.endpoint(a).unwrap().stats().keepalives >= 6000,
        "seed {seed}"
    );
    assert_eq!(w.endpoint(b).unwrap().stats().keepalives, 0, "seed {seed}");
    // And the link still works.
    let c = w.send(b, na, put_hdr(nb, na, 8), vec![9; 8]);
    w.run_for(Duration::from_secs(1));
    assert_eq!(w.outcome(c).map(|(_, o)| o), Some(SendOutcome::Delivered));
    assert_all_accounted(&w, seed);
}

/// Deployment sanity: a ulnet router (nidhash) reboots among 2.15 kernel clients (LU-7646 rule,
/// raw NID order), 10% of their connects stuck: every client recovers within the horizon.
#[test]
fn ulnet_router_among_lu7646_kernel_clients_recovers_every_client() {
    let seed = 215;
    let cfg = StormConfig {
        client_policy: Some(RacePolicy::Lu7646),
        client_orders: ClientOrders::All(RaceOrder::Nid),
        ..StormConfig::new(1000, RacePolicy::Ulnet, seed)
    };
    let r = router_reboot_storm(&cfg);
    eprintln!("seed {seed}: {r:?}");
    let recovery = r.recovery.unwrap_or_else(|| {
        panic!(
            "seed {seed}: {} kernel clients never reconnected",
            r.unrecovered
        )
    });
    eprintln!("seed {seed}: every LU-7646 client back after {recovery}");
    assert!(recovery <= cfg.horizon, "seed {seed}: {recovery}");
    assert!(r.max_conns_per_pair <= 2, "seed {seed}");
    assert_eq!(r.unaccounted, 0, "seed {seed}: messages without a status");
    assert_eq!(r.invalid_transitions, 0, "seed {seed}: invalid transitions");
    // Kernel clients never learn an order, and the router agrees with them on this layout.
    assert_eq!(r.race_order_adoptions, 0, "seed {seed}");
}

/// Kernel interop, defect 2, against a kernel that never learns: a ulnet node and a kernel node
/// (each of Lustre's policies) on different orders, arranged so that both refuse (a double
/// reject), connect at the same instant. Whichever side has the lower raw NID, the ulnet node
/// adopts the kernel's order (the kernel never does), once, within at most 5 rejects (3 when it
/// is the lower side and adopts at the first double reject).
#[test]
fn ulnet_node_adopts_a_kernel_peers_order_whichever_side_is_lower() {
    let (lo, hi) = (nid("10.0.0.2@o2ib"), nid("10.0.1.1@o2ib"));
    for kernel in [
        RacePolicy::Lustre28,
        RacePolicy::Lu7646,
        RacePolicy::Lu17480,
    ] {
        for ulnet_is_lo in [true, false] {
            for seed in 0..20 {
                let ctx = format!("seed {seed}, kernel {kernel:?}, ulnet is lower: {ulnet_is_lo}");
                let mut w = world(seed);
                // lo on nidhash and hi on the raw order refuse each other.
                let policy = |is_ulnet: bool| if is_ulnet { RacePolicy::Ulnet } else { kernel };
                let a = w.add_node(EndpointConfig {
                    race_order: RaceOrder::NidHash,
                    race_policy: policy(ulnet_is_lo),
                    ..EndpointConfig::new(lo, 1)
                });
                let b = w.add_node(EndpointConfig {
                    race_order: RaceOrder::Nid,
                    race_policy: policy(!ulnet_is_lo),
                    ..EndpointConfig::new(hi, 2)
                });
                let (ulnet, kern) = if ulnet_is_lo { (a, b) } else { (b, a) };
                let mut cookies = Vec::new();
                let t0 = w.now();
                cookies.push(w.send(a, hi, put_hdr(lo, hi, 8), vec![1; 8]));
                cookies.push(w.send(b, lo, put_hdr(hi, lo, 8), vec![2; 8]));
                w.run_for(Duration::from_secs(10));
                let rejects = w.race_rejects_between(a, b);
                let done = cookies
                    .iter()
                    .filter_map(|c| w.outcome(*c))
                    .map(|(t, o)| {
                        assert_eq!(o, SendOutcome::Delivered, "{ctx}");
                        t - t0
                    })
                    .max();
                assert!(done.is_some(), "{ctx}: nothing delivered");
                eprintln!(
                    "{ctx}: rejects {rejects}, delivered after {:?}, conns {:?}",
                    done,
                    established_both(&w, a, b)
                );
                let bound = if ulnet_is_lo { 3 } else { 5 };
                assert!(rejects <= bound, "{ctx}: {rejects} CONN_RACE rejects");
                let stats = |n: NodeId| w.endpoint(n).unwrap().stats().clone();
                assert_eq!(stats(kern).race_order_adoptions, 0, "{ctx}");
                assert_eq!(stats(ulnet).race_order_adoptions, 1, "{ctx}");
                assert_all_accounted(&w, seed);
            }
        }
    }
}

/// The counterpart of the idle week: when the peer that sends no keepalives crashes while idle,
/// the side at the default keepalive still declares it down within keepalive + timeout.
#[test]
fn crashed_idle_peer_without_keepalives_is_still_found() {
    let seed = 100;
    let (mut w, a, b, na, nb) = with_silent_peer(seed);
    w.send(a, nb, put_hdr(na, nb, 8), vec![0; 8]);
    w.run_for(Duration::from_secs(3600));
    crash_is_found_in_time(&mut w, a, b, seed);
    assert_all_accounted(&w, seed);
}
