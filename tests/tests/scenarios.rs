//! Scenario tests on the deterministic simulator, named after the failures they reproduce
//! (shared/seeds/). Each prints its seed on failure; rerun with the same seed to replay it.

use lnd::engine::{ConnState, DownReason, EndpointConfig, RacePolicy, TxError};
use lnd::fabric::sim::{NodeId, SendOutcome, SimConfig, World};
use lnd::time::Duration;
use lnd::wire::Nid;
use ulnet_tests::{put_hdr, router_reboot_storm, StormConfig};

fn nid(s: &str) -> Nid {
    s.parse().expect("valid NID")
}

fn world(seed: u64) -> World {
    World::new(SimConfig::with_seed(seed))
}

fn node(w: &mut World, s: &str, inc: u64) -> NodeId {
    w.add_node(EndpointConfig::new(nid(s), inc))
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
    for c in &cookies {
        assert_eq!(
            w.outcome(*c).map(|(_, o)| o),
            Some(SendOutcome::Delivered),
            "seed {seed}"
        );
    }
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
        for c in &cookies {
            assert_eq!(
                w.outcome(*c).map(|(_, o)| o),
                Some(SendOutcome::Delivered),
                "seed {seed}"
            );
        }
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
        for c in &late {
            assert_eq!(
                w.outcome(*c).map(|(_, o)| o),
                Some(SendOutcome::Delivered),
                "seed {seed} {policy:?}"
            );
        }
        let pa = w.endpoint(a).unwrap().peer(nb).unwrap();
        assert_eq!(
            pa.incarnation, 3,
            "{policy:?}: the survivor knows the new instance"
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
    let mut w = world(seed);
    let (na, nb) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
    let a = node(&mut w, "10.0.0.1@o2ib", 1);
    let b = node(&mut w, "10.0.0.2@o2ib", 2);
    w.send(a, nb, put_hdr(na, nb, 8), vec![0; 8]);
    w.run_for(Duration::from_secs(1));
    let t = w.now();
    w.crash(b);
    // Idle at first: only the keepalive can notice.
    let tun = w.endpoint(a).unwrap().config().tunables.clone();
    let bound = tun.keepalive + tun.timeout;
    w.run_for(bound + Duration::from_secs(1));
    let down = w
        .peer_events(a)
        .iter()
        .find(|e| e.nid == nb && e.down.is_some())
        .copied()
        .unwrap_or_else(|| panic!("seed {seed}: peer never declared down"));
    assert!(
        down.at - t <= bound,
        "seed {seed}: down after {}",
        down.at - t
    );
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
                    | TxError::Timeout
                    | TxError::PeerUnreachable
                    | TxError::ConnAborted
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
    let mut w = world(seed);
    let (na, nb) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
    let a = node(&mut w, "10.0.0.1@o2ib", 1);
    let b = node(&mut w, "10.0.0.2@o2ib", 2);
    w.send(a, nb, put_hdr(na, nb, 8), vec![0; 8]);
    w.run_for(Duration::from_secs(1));
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
