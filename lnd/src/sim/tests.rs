//! The simulator's own tests: determinism, faults, and what the world records.

use super::*;
use crate::engine::{EndpointConfig, RacePolicy};
use crate::fabric::RemoteRegion;

use testkit::nid;

fn world(seed: u64) -> World {
    World::new(SimConfig::with_seed(seed))
}

fn node(w: &mut World, addr: &str, inc: u64) -> NodeId {
    w.add_node(EndpointConfig::new(nid(addr), inc))
}

/// A world of two nodes, 10.0.0.1 (incarnation 1) and 10.0.0.2 (2).
fn pair(seed: u64) -> (World, NodeId, NodeId) {
    let mut w = world(seed);
    let a = node(&mut w, "10.0.0.1@o2ib", 1);
    let b = node(&mut w, "10.0.0.2@o2ib", 2);
    (w, a, b)
}

/// Whether every one of `cookies` ended delivered.
fn all_delivered(w: &World, cookies: &[u64]) -> bool {
    cookies
        .iter()
        .all(|&c| w.outcome(c).is_some_and(|(_, o)| o.is_delivered()))
}

/// Whether `a` heard news of `b` whose down reason (`None`: up) passes `test`.
fn heard_of(w: &World, a: NodeId, b: NodeId, test: impl Fn(Option<DownReason>) -> bool) -> bool {
    w.peer_events(a)
        .iter()
        .any(|e| e.nid == w.nid_of(b) && test(e.down))
}

fn send_n(w: &mut World, from: NodeId, to: NodeId, n: u64, len: usize) -> Vec<u64> {
    let (src, dst) = (w.nid_of(from), w.nid_of(to));
    (0..n)
        .map(|i| w.send(from, dst, put_hdr(src, dst, len, i), vec![i as u8; len]))
        .collect()
}

fn limit(w: &World, secs: u64) -> Instant {
    w.now() + Duration::from_secs(secs)
}

/// Audit F5: a burst of messages queued behind credits (to a healthy peer, delivered) or
/// behind a connection that never comes (to a crashed peer, failed) used to leave every table
/// and queue at its peak for good. Once it is over, the trim gives the room back within a
/// few intervals, even while light traffic goes on (which the burst's highest slab keys
/// would otherwise keep busy).
#[test]
fn a_burst_leaves_no_peak_capacity_behind() {
    use crate::trim::{TRIM_FLOOR, TRIM_INTERVAL};
    const BURST: u64 = 50_000;
    for crashed in [false, true] {
        let (mut w, a, b) = pair(7);
        if crashed {
            w.crash(b);
        }
        let cookies = send_n(&mut w, a, b, BURST, 64);
        let peak = w.endpoint(a).unwrap().capacities();
        let txs = peak.iter().find(|c| c.name == "txs").unwrap();
        assert!(txs.capacity >= BURST as usize, "{peak:?}");
        assert!(w.run_until_idle(limit(&w, 600)), "crashed {crashed}");
        let failed = cookies
            .iter()
            .filter(|c| !w.outcome(**c).is_some_and(|(_, o)| o.is_delivered()))
            .count();
        assert_eq!(failed == BURST as usize, crashed, "{failed} failed");
        // A little traffic afterwards, to the peer if it is up.
        let (src, dst) = (w.nid_of(a), w.nid_of(b));
        for i in 0..100 {
            if !crashed {
                w.send(a, dst, put_hdr(src, dst, 64, i), vec![0; 64]);
            }
            w.run_for(Duration::from_nanos(TRIM_INTERVAL.as_nanos() / 5));
        }
        w.run_for(TRIM_INTERVAL * 3);
        let after = w.endpoint(a).unwrap().capacities();
        for c in &after {
            assert!(
                c.capacity <= 2 * TRIM_FLOOR,
                "crashed {crashed}: {} keeps {} after the burst: {after:?}",
                c.name,
                c.capacity
            );
        }
        let ep = w.endpoint(a).unwrap();
        assert!(
            ep.state_bytes() < 1 << 20,
            "{} bytes kept",
            ep.state_bytes()
        );
    }
}

/// The per-pair counter sees each CONN_RACE reject once, whichever side sends it, and
/// nothing else.
#[test]
fn race_rejects_counted_per_unordered_pair() {
    for seed in 0..10 {
        let (mut w, a, b) = pair(seed);
        let c = node(&mut w, "10.0.0.3@o2ib", 3);
        // a and b connect to each other in the same instant: b (higher) refuses a once.
        send_n(&mut w, a, b, 1, 8);
        send_n(&mut w, b, a, 1, 8);
        // c connects alone: no race.
        send_n(&mut w, c, a, 1, 8);
        assert!(w.run_until_idle(limit(&w, 10)), "seed {seed}");
        let races = w.endpoint(b).unwrap().stats().races;
        assert_eq!(races, 1, "seed {seed}");
        assert_eq!(w.race_rejects_between(a, b), races, "seed {seed}");
        assert_eq!(w.race_rejects_between(b, a), races, "seed {seed}");
        assert_eq!(w.race_rejects_between(a, c), 0, "seed {seed}");
        let pairs: Vec<_> = w.race_rejects_by_pair().collect();
        assert_eq!(pairs, vec![((a, b), 1)], "seed {seed}");
    }
}

#[test]
fn slot_set_lowest_first() {
    let mut s = SlotSet::with_first(3);
    assert_eq!(s.len(), 3);
    assert!(!s.insert(1));
    assert_eq!(s.take_lowest(), Some(0));
    assert_eq!(s.take_lowest(), Some(1));
    assert!(s.insert(200));
    assert!(s.insert(0));
    assert_eq!(s.take_lowest(), Some(0));
    assert_eq!(s.take_lowest(), Some(2));
    assert_eq!(s.take_lowest(), Some(200));
    assert_eq!(s.take_lowest(), None);
    assert_eq!(s.len(), 0);
}

#[test]
fn rng_is_seeded_and_bounded() {
    let mut a = SimRng::new(7);
    let mut b = SimRng::new(7);
    for _ in 0..100 {
        assert_eq!(a.next_u64(), b.next_u64());
    }
    assert!(!a.chance(0.0));
    assert!(a.chance(1.0));
    let hits = (0..10_000).filter(|_| a.chance(0.25)).count();
    assert!((2_000..3_000).contains(&hits), "{hits}");
    for _ in 0..1000 {
        assert!(a.duration_up_to(Duration::from_micros(5)) <= Duration::from_micros(5));
        assert!(a.below(3) < 3);
    }
}

#[test]
fn event_order_is_time_then_sequence() {
    let mut h = BinaryHeap::new();
    for (seq, t) in [(0, 5), (1, 3), (2, 5), (3, 1)] {
        h.push(Scheduled {
            at: Instant::from_nanos(t),
            seq,
            ev: Ev::Pump { end: seq },
        });
    }
    let order: Vec<u64> = std::iter::from_fn(|| h.pop().map(|s| s.seq)).collect();
    assert_eq!(order, vec![3, 1, 0, 2]);
}

#[test]
fn partitions_block_both_ways_and_heal() {
    let (mut w, a, b) = pair(1);
    let c = node(&mut w, "10.0.0.3@o2ib", 3);
    let p = w.partition(&[a], &[b]);
    assert!(w.blocked(a, b) && w.blocked(b, a));
    assert!(!w.blocked(a, c) && !w.blocked(b, c) && !w.blocked(a, a));
    let q = w.partition(&[c], &[a, b]);
    w.heal_partition(p);
    assert!(!w.blocked(a, b));
    assert!(w.blocked(c, b));
    let _ = q;
    w.heal();
    assert!(!w.blocked(c, b));
}

#[test]
fn exchange_100_messages_both_ways() {
    let mut w = world(42);
    let a = node(&mut w, "10.0.0.1@o2ib", 100);
    let b = node(&mut w, "10.0.0.2@o2ib", 200);
    let mut cookies = send_n(&mut w, a, b, 100, 512);
    cookies.extend(send_n(&mut w, b, a, 100, 1000));
    assert!(w.run_until_idle(limit(&w, 10)), "not idle: {:?}", w.stats());
    for c in &cookies {
        assert_eq!(w.outcome(*c).map(|(_, o)| o), Some(SendOutcome::Delivered));
    }
    for (n, from) in [(a, b), (b, a)] {
        let got = w.received(n);
        assert_eq!(got.len(), 100);
        assert!(got.iter().all(|m| m.from == w.nid_of(from)));
        let bits: Vec<u64> = got
            .iter()
            .map(|m| match m.hdr.body {
                crate::wire::LnetBody::Put { match_bits, .. } => match_bits,
                _ => u64::MAX,
            })
            .collect();
        assert_eq!(bits, (0..100).collect::<Vec<_>>(), "in order");
    }
    let s = w.stats();
    assert_eq!(s.rnr, 0);
    assert_eq!(s.orphaned, 0);
    assert_eq!(s.unexpected_send_done, 0);
    assert_eq!(s.double_posts, 0);
    assert_eq!(s.premature_sends, 0);
    assert_eq!(s.sends_delivered, 200);
    assert_eq!(
        w.connect_log(a).len() + w.connect_log(b).len(),
        2,
        "one connect each way"
    );
    assert!(heard_of(&w, a, b, |down| down.is_none()));
}

#[test]
fn crash_makes_queued_messages_fail() {
    let mut w = world(7);
    let a = node(&mut w, "10.0.0.1@o2ib", 100);
    let b = node(&mut w, "10.0.0.2@o2ib", 200);
    send_n(&mut w, a, b, 1, 64);
    assert!(w.run_until_idle(limit(&w, 10)));
    w.crash(b);
    assert_eq!(w.node_state(b), NodeState::Crashed);
    assert_eq!(w.ends_of(b), 0);
    assert_eq!(
        w.leaked_conns(b),
        1,
        "the crashed endpoint owned one connection"
    );
    let cookies = send_n(&mut w, a, b, 50, 64);
    assert!(
        w.run_until_idle(limit(&w, 300)),
        "messages to a crashed node hang: {} pending, {:?}",
        w.pending_sends(),
        w.stats()
    );
    for c in cookies {
        match w.outcome(c) {
            Some((_, SendOutcome::Failed(_))) => {}
            other => panic!("cookie {c}: {other:?}"),
        }
    }
    assert!(w.stats().retry_exceeded > 0);
    assert!(heard_of(&w, a, b, |down| down.is_some()));
}

/// The same seed gives the same run, event for event.
#[test]
fn runs_replay_from_the_seed() {
    let run = |seed: u64| {
        let mut w = world(seed);
        w.cm_delay(Duration::from_micros(200));
        let ids: Vec<NodeId> = (1..=6)
            .map(|i| node(&mut w, &format!("10.0.0.{i}@o2ib"), 1000 + i))
            .collect();
        for &x in &ids {
            w.set_recv_delay(x, Duration::from_micros(50));
        }
        for i in 0..60u64 {
            let from = ids[(i % 6) as usize];
            let to = ids[((i * 7 + 1) % 6) as usize];
            send_n(&mut w, from, to, 3, 100 + i as usize);
            w.run_for(Duration::from_micros(30));
        }
        w.crash(ids[5]);
        assert!(w.run_until_idle(limit(&w, 300)));
        let log: Vec<(Instant, Nid, usize)> = ids
            .iter()
            .flat_map(|&n| w.received(n).iter().map(|m| (m.at, m.from, m.len)))
            .collect();
        (w.stats().clone(), log, w.now())
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3).1, run(4).1, "the seed matters (cm delays)");
}

#[test]
fn simultaneous_connects_race_and_settle() {
    for policy in RacePolicy::ALL {
        let mut w = world(11);
        let mut cfg = EndpointConfig::new(nid("10.0.0.1@o2ib"), 1);
        cfg.race_policy = policy;
        let a = w.add_node(cfg);
        let mut cfg = EndpointConfig::new(nid("10.0.0.2@o2ib"), 2);
        cfg.race_policy = policy;
        let b = w.add_node(cfg);
        let mut cookies = send_n(&mut w, a, b, 10, 64);
        cookies.extend(send_n(&mut w, b, a, 10, 64));
        assert!(w.run_until_idle(limit(&w, 60)), "{policy:?}");
        assert!(all_delivered(&w, &cookies), "{policy:?}");
        assert_eq!(w.stats().rnr, 0);
    }
}

#[test]
fn graceful_shutdown_tells_the_peer() {
    let (mut w, a, b) = pair(5);
    send_n(&mut w, a, b, 5, 64);
    send_n(&mut w, b, a, 5, 64);
    assert!(w.run_until_idle(limit(&w, 10)));
    w.shutdown(b);
    w.run_for(Duration::from_secs(5));
    assert_eq!(w.node_state(b), NodeState::Stopped);
    assert!(w.endpoint(b).is_none());
    assert_eq!(w.leaked_conns(b), 0);
    assert_eq!(w.stats().orphaned, 0);
    assert_eq!(w.ends_of(b), 0);
    assert!(heard_of(&w, a, b, |down| down == Some(DownReason::Closed)));
    // The host is up, nothing listens: a new message fails quickly, not after timeouts.
    let t0 = w.now();
    let c = send_n(&mut w, a, b, 1, 64)[0];
    assert!(w.run_until_idle(limit(&w, 60)));
    let (at, o) = w.outcome(c).unwrap();
    assert!(matches!(o, SendOutcome::Failed(_)), "{o:?}");
    assert!(at - t0 < Duration::from_secs(1), "took {:?}", at - t0);
    // Sending from the stopped node is refused.
    let c = send_n(&mut w, b, a, 1, 64)[0];
    assert_eq!(w.outcome(c).map(|(_, o)| o), Some(SendOutcome::NodeDown));
}

#[test]
fn reboot_then_messages_reach_the_new_instance() {
    let (mut w, a, b) = pair(9);
    send_n(&mut w, a, b, 3, 64);
    assert!(w.run_until_idle(limit(&w, 10)));
    w.reboot(b, Duration::from_secs(2), 3);
    w.run_for(Duration::from_secs(3));
    assert_eq!(w.node_state(b), NodeState::Up);
    assert_eq!(w.endpoint(b).unwrap().incarnation(), 3);
    // The first messages may die with the old connection; later ones must get through.
    let mut delivered = false;
    for _ in 0..20 {
        let c = send_n(&mut w, a, b, 1, 64)[0];
        assert!(w.run_until_idle(limit(&w, 120)), "{:?}", w.stats());
        if w.outcome(c).unwrap().1.is_delivered() {
            delivered = true;
            break;
        }
    }
    assert!(
        delivered,
        "never reached the rebooted node: {:?}",
        w.stats()
    );
    assert!(w.received(b).iter().any(|m| m.from == w.nid_of(a)));
}

/// Without a second attempt beside it (`connect_hedge` 0, as kernel Lustre), a connect
/// that never completes holds the message until its deadline ends it.
#[test]
fn stuck_connect_is_ended_by_the_connect_deadline() {
    let mut w = world(13);
    let mut cfg = EndpointConfig::new(nid("10.0.0.1@o2ib"), 1);
    cfg.tunables.connect_hedge = Duration::ZERO;
    let a = w.add_node(cfg);
    let b = node(&mut w, "10.0.0.2@o2ib", 2);
    w.stuck_next_connect(a, w.nid_of(b));
    let c = send_n(&mut w, a, b, 1, 64)[0];
    assert!(w.run_until_idle(limit(&w, 120)), "{:?}", w.stats());
    assert_eq!(w.stats().stuck_connects, 1);
    let (at, o) = w.outcome(c).unwrap();
    assert!(o.is_delivered(), "{o:?}");
    assert!(
        at >= Instant::from_secs(5),
        "delivered at {at} despite the stuck connect"
    );
    assert_eq!(w.live_ends(), 2, "the stuck attempt was destroyed");
}

/// LU-7646's stuck active connect costs `connect_hedge`, not a connect deadline: a second
/// attempt starts beside the unanswered one and carries the message. When the second is
/// stuck too, the first is given up once the second has waited twice the hedge delay, and
/// a third starts; each further pair waits twice as long (at most half the deadline). So k
/// stuck in a row cost 1 + 2 + 4 + ... hedge delays, far below a deadline each (before:
/// two stuck cost a whole deadline, 12.5 s, and a storm's unlucky pairs 14 s). Never more
/// than two attempts, one connection and one zombie for the pair.
#[test]
fn a_stuck_connect_gets_a_second_attempt_beside_it() {
    for stuck in 1..=4u64 {
        let (mut w, a, b) = pair(13 + stuck);
        for _ in 0..stuck {
            w.stuck_next_connect(a, w.nid_of(b));
        }
        let t0 = w.now();
        let c = send_n(&mut w, a, b, 1, 64)[0];
        let (mut peak_zombies, mut peak_conns) = (0, 0);
        let end = limit(&w, 120);
        while w.now() < end && w.outcome(c).is_none() {
            w.run_for(Duration::from_millis(50));
            let ep = w.node(a).unwrap();
            let v = ep.peer(w.nid_of(b)).unwrap();
            peak_zombies = peak_zombies.max(v.zombies);
            peak_conns = peak_conns.max(ep.conns().filter(|c| c.active).count());
        }
        let (at, o) = w.outcome(c).unwrap();
        assert!(o.is_delivered(), "{o:?}");
        let took = at - t0;
        let deadline = crate::engine::Tunables::default().connect_timeout();
        let hedge = crate::engine::Tunables::default().connect_hedge;
        // The hedge, then each pair's wait: 2, 4, ... hedges, capped at half the deadline.
        let cap = Duration::from_nanos(deadline.as_nanos() / 2);
        let bound = (1..stuck).fold(hedge, |t, k| t + hedge.saturating_mul(1 << k).min(cap))
            + Duration::from_millis(100);
        assert!(bound < deadline + hedge, "{stuck} stuck: {bound}");
        assert!(took <= bound, "{stuck} stuck: delivered after {took}");
        assert!(peak_zombies <= 1, "{stuck} stuck: {peak_zombies} zombies");
        assert!(peak_conns <= 2, "{stuck} stuck: {peak_conns} active ends");
        assert!(w.run_until_idle(limit(&w, 120)), "{:?}", w.stats());
        let ep = w.node(a).unwrap();
        assert_eq!(w.stats().stuck_connects, stuck);
        assert_eq!(ep.stats().connect_hedges, stuck);
        assert_eq!(ep.stats().hedge_abandons, stuck - 1);
        assert_eq!(ep.conns().count(), 1, "one connection left");
        assert_eq!(w.live_ends(), 2, "every stuck attempt was destroyed");
        assert_eq!(w.invalid_transitions(), 0);
    }
}

/// Connects that are only slow (CM messages late by up to 3 s, longer than
/// `connect_hedge`): every message still arrives once, a pair never holds more than two
/// connections, and the hedge delay learns what connects take, so that after the first
/// connects a slow fabric is not sent every request twice.
#[test]
fn slow_connects_teach_the_hedge_delay_and_lose_nothing() {
    let mut w = world(29);
    w.cm_delay(Duration::from_secs(3));
    let a = node(&mut w, "10.0.0.1@o2ib", 1);
    let peers: Vec<NodeId> = (2..10)
        .map(|i| node(&mut w, &format!("10.0.0.{i}@o2ib"), i))
        .collect();
    let mut cookies = Vec::new();
    for &b in &peers {
        cookies.extend(send_n(&mut w, a, b, 5, 64));
        let end = limit(&w, 60);
        while w.now() < end && cookies.iter().any(|&c| w.outcome(c).is_none()) {
            w.run_for(Duration::from_millis(100));
            for &x in &peers {
                let per_pair = w
                    .node(a)
                    .unwrap()
                    .conns()
                    .filter(|c| c.peer == w.nid_of(x))
                    .count();
                assert!(per_pair <= 2, "{per_pair} connections to one peer");
            }
        }
    }
    assert!(w.run_until_idle(limit(&w, 120)), "{:?}", w.stats());
    assert!(all_delivered(&w, &cookies));
    let hedges = w.node(a).unwrap().stats().connect_hedges;
    assert!(hedges <= 2, "{hedges} hedges for {} peers", peers.len());
    assert_eq!(w.invalid_transitions(), 0);
}

#[test]
fn partition_healed_within_the_retry_horizon_loses_nothing() {
    let (mut w, a, b) = pair(17);
    send_n(&mut w, a, b, 1, 64);
    assert!(w.run_until_idle(limit(&w, 10)));
    let p = w.partition(&[a], &[b]);
    let cookies = send_n(&mut w, a, b, 3, 64);
    w.run_for(Duration::from_millis(400));
    assert_eq!(w.pending_sends(), 3);
    w.heal_partition(p);
    assert!(w.run_until_idle(limit(&w, 10)));
    assert!(all_delivered(&w, &cookies));
    assert_eq!(w.stats().retry_exceeded, 0);
}

#[test]
fn long_partition_fails_with_a_status() {
    let (mut w, a, b) = pair(19);
    send_n(&mut w, a, b, 1, 64);
    assert!(w.run_until_idle(limit(&w, 10)));
    w.partition(&[a], &[b]);
    let cookies = send_n(&mut w, a, b, 5, 64);
    assert!(w.run_until_idle(limit(&w, 300)), "{:?}", w.stats());
    assert!(cookies
        .iter()
        .all(|&c| matches!(w.outcome(c).unwrap().1, SendOutcome::Failed(_))));
    assert!(w.stats().retry_exceeded >= 1);
}

/// Random repost delays never make a sender overrun the receiver's posted slots: credits work.
#[test]
fn delayed_reposts_never_cause_rnr() {
    let (mut w, a, b) = pair(23);
    w.set_recv_delay(b, Duration::from_micros(300));
    w.set_recv_delay(a, Duration::from_micros(100));
    let mut cookies = Vec::new();
    for _ in 0..20 {
        cookies.extend(send_n(&mut w, a, b, 100, 2000));
        cookies.extend(send_n(&mut w, b, a, 10, 100));
        w.run_for(Duration::from_micros(500));
    }
    assert!(w.run_until_idle(limit(&w, 60)), "{:?}", w.stats());
    assert_eq!(w.stats().rnr, 0);
    assert!(all_delivered(&w, &cookies));
    assert_eq!(w.received_count(b), 2000);
}

#[test]
fn lossy_and_slow_connection_manager_still_ends_every_message() {
    let mut w = world(29);
    w.cm_loss(0.3);
    w.cm_delay(Duration::from_millis(2));
    let ids: Vec<NodeId> = (1..=4)
        .map(|i| node(&mut w, &format!("10.0.0.{i}@o2ib"), i))
        .collect();
    let mut cookies = Vec::new();
    for &x in &ids {
        for &y in &ids {
            if x != y {
                cookies.extend(send_n(&mut w, x, y, 5, 64));
            }
        }
    }
    assert!(w.run_until_idle(limit(&w, 600)), "{:?}", w.stats());
    assert!(w.stats().cm_lost > 0);
    assert!(cookies.iter().all(|&c| w.outcome(c).is_some()));
}

/// One server (10.1.0.1@o2ib) and `n` clients (10.2.x.y@o2ib), no logs kept, seed 31.
fn server_and_clients(n: u32) -> (World, NodeId, Vec<NodeId>) {
    let mut w = World::new(SimConfig {
        keep_logs: false,
        ..SimConfig::with_seed(31)
    });
    let server = node(&mut w, "10.1.0.1@o2ib", 1);
    let clients = (0..n)
        .map(|i| {
            let addr = format!("10.2.{}.{}@o2ib", i / 250, i % 250 + 1);
            node(&mut w, &addr, 10 + u64::from(i))
        })
        .collect();
    (w, server, clients)
}

#[test]
fn many_clients_one_server() {
    let (mut w, server, clients) = server_and_clients(300);
    for &c in &clients {
        send_n(&mut w, c, server, 4, 256);
    }
    send_n(&mut w, server, clients[7], 4, 256);
    assert!(w.run_until_idle(limit(&w, 60)), "{:?}", w.stats());
    let s = w.stats();
    assert_eq!(s.sends_delivered, 1204, "{s:?}");
    assert_eq!(w.received_count(server), 1200);
    assert_eq!(s.rnr, 0);
}

/// Every fault at once on a handful of nodes: every message ends with a status, no engine
/// contract violation shows at the fabric, and afterwards the fabric holds exactly the
/// connections the endpoints hold.
#[test]
fn chaos_every_message_ends() {
    for seed in 0..20u64 {
        let mut w = world(seed);
        w.cm_loss(0.1);
        w.cm_delay(Duration::from_micros(300));
        let ids: Vec<NodeId> = (1..=5)
            .map(|i| node(&mut w, &format!("10.0.0.{i}@o2ib"), i))
            .collect();
        for &x in &ids {
            w.stuck_connects(x, 0.1);
            w.set_recv_delay(x, Duration::from_micros(20));
        }
        for r in 0..50u64 {
            let x = ids[w.rng().below(5) as usize];
            let y = ids[w.rng().below(5) as usize];
            send_n(&mut w, x, y, 3, 100);
            match r {
                10 => w.crash(ids[1]),
                15 => assert!(w.restart(ids[1], 77)),
                20 => w.reboot(ids[2], Duration::from_millis(10), 88),
                30 => w.shutdown(ids[3]),
                35 => {
                    w.partition(&[ids[0]], &[ids[4]]);
                }
                40 => w.heal(),
                _ => {}
            }
            w.run_for(Duration::from_millis(3));
        }
        assert!(
            w.run_until_idle(limit(&w, 600)),
            "seed {seed}: {:?}",
            w.stats()
        );
        w.run_for(Duration::from_secs(400));
        let s = w.stats();
        assert_eq!(
            s.sends,
            s.sends_delivered + s.sends_failed + s.sends_refused + s.sends_lost
        );
        assert_eq!(s.rnr, 0, "seed {seed}");
        assert_eq!(s.unexpected_send_done, 0, "seed {seed}");
        assert_eq!(s.double_posts, 0, "seed {seed}");
        assert_eq!(s.premature_sends, 0, "seed {seed}");
        assert_eq!(s.unknown_actions, 0, "seed {seed}");
        for &n in &ids {
            let held = w.endpoint(n).map_or(0, |ep| ep.conns().count());
            assert_eq!(held, w.ends_of(n), "seed {seed}, node {n:?}");
        }
    }
}

/// 10,000 clients and one server (run with `--ignored --release`).
#[test]
#[ignore]
fn scale_10k_clients_one_server() {
    let (mut w, server, clients) = server_and_clients(10_000);
    for _ in 0..10 {
        for &c in &clients {
            send_n(&mut w, c, server, 1, 256);
        }
        w.run_for(Duration::from_millis(1));
    }
    assert!(w.run_until_idle(limit(&w, 60)), "{:?}", w.stats());
    w.run_for(Duration::from_secs(300));
    let s = w.stats();
    assert_eq!(s.sends_delivered, 100_000);
    assert_eq!(s.rnr, 0);
}

#[test]
fn connect_to_an_unknown_nid_fails_unreachable() {
    let mut w = world(37);
    let a = node(&mut w, "10.0.0.1@o2ib", 1);
    let dst = nid("10.9.9.9@o2ib");
    let c = w.send(a, dst, put_hdr(w.nid_of(a), dst, 8, 0), vec![0; 8]);
    assert!(w.run_until_idle(limit(&w, 120)));
    assert!(matches!(w.outcome(c).unwrap().1, SendOutcome::Failed(_)));
    // Idle means no message pending; the failed attempt is reaped on the endpoint's next tick.
    w.run_for(Duration::from_secs(1));
    assert_eq!(w.live_ends(), 0);
}

// ------------------------------------------------------------------ RDMA writes

const MIB: usize = 1 << 20;

/// Two nodes with a connection a -> b (one message sent to establish it), a 1 MiB source region
/// on `a` filled with a pattern and a zeroed 1 MiB sink region on `b`.
struct Bulk {
    w: World,
    a: NodeId,
    b: NodeId,
    conn: ConnId,
    src: Registration,
    sink: Registration,
    remote: RemoteRegion,
}

impl Bulk {
    /// A bad write `wr` from `a`, and a send `c` queued behind it: once idle, the write failed
    /// and wrote nothing into `b`'s sink, and the send was flushed with it.
    #[track_caller]
    fn assert_write_failed(&mut self, wr: WrId, c: u64, what: &str) {
        let (a, b) = (self.a, self.b);
        assert!(self.w.run_until_idle(limit(&self.w, 10)), "{what}");
        assert_eq!(self.w.rdma_status(a, wr), Some(WcStatus::Error), "{what}");
        assert!(
            self.w
                .region(b, &self.sink)
                .unwrap()
                .iter()
                .all(|&x| x == 0),
            "{what}"
        );
        assert!(
            matches!(self.w.outcome(c).unwrap().1, SendOutcome::Failed(_)),
            "{what}"
        );
    }
}

/// Node `from` writes `len` bytes at `off` of `src` to `remote`: one fragment each side.
fn write1(
    w: &mut World,
    from: NodeId,
    conn: ConnId,
    src: &Registration,
    off: u64,
    remote: RemoteRegion,
    len: u32,
) -> WrId {
    w.rdma_write(
        from,
        conn,
        vec![src.local_frag(off, len)],
        vec![remote.frag(len)],
    )
}

fn bulk(seed: u64) -> Bulk {
    let (mut w, a, b) = pair(seed);
    send_n(&mut w, a, b, 1, 64);
    assert!(w.run_until_idle(limit(&w, 10)));
    let conn = w
        .endpoint(a)
        .unwrap()
        .conns()
        .find(|c| c.peer == w.nid_of(b))
        .expect("a is connected to b")
        .id;
    let pattern: Vec<u8> = (0..MIB)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    let src = w.registry(a).register(pattern).unwrap();
    let sink = w.registry(b).register(vec![0; MIB]).unwrap();
    let remote = sink.remote();
    Bulk {
        w,
        a,
        b,
        conn,
        src,
        sink,
        remote,
    }
}

#[test]
fn rdma_write_257_fragments_copies_the_region_then_a_send_follows() {
    let mut t = bulk(41);
    let (a, b) = (t.a, t.b);
    let frags = testkit::frags_257();
    assert_eq!(frags.len(), 257);
    assert_eq!(
        frags.iter().map(|f| u64::from(f.1)).sum::<u64>(),
        MIB as u64
    );
    let t0 = t.w.now();
    let received_before = t.w.received_count(b);
    let wrs: Vec<WrId> = frags
        .iter()
        .map(|&(off, len)| write1(&mut t.w, a, t.conn, &t.src, off, t.remote.at(off), len))
        .collect();
    assert!(wrs
        .iter()
        .all(|wr| wr.0 >> 63 == 1 && wr.0 as u32 == u32::MAX));
    // A message posted behind the writes (PUT_DONE-like) on the same connection.
    let c = send_n(&mut t.w, a, b, 1, 64)[0];
    assert!(t.w.run_until_idle(limit(&t.w, 10)), "{:?}", t.w.stats());
    for wr in &wrs {
        assert_eq!(t.w.rdma_status(a, *wr), Some(WcStatus::Success), "{wr:?}");
        assert_eq!(t.w.rdma_status(b, *wr), None, "not b's write");
    }
    assert_eq!(t.w.region(b, &t.sink), t.w.region(a, &t.src));
    assert!(t.w.outcome(c).unwrap().1.is_delivered());
    // RC ordering: the message arrives only after all the data is in place, which at
    // 12.5 GB/s takes ~84 µs (a lone send takes 2 µs).
    let arrived = t.w.received(b).last().unwrap().at;
    assert_eq!(t.w.received_count(b), received_before + 1);
    let wire = Duration::from_nanos((MIB as u64 * 1_000_000_000).div_ceil(12_500_000_000));
    assert!(
        arrived >= t0 + wire + t.w.config().latency,
        "arrived {:?} after the start",
        arrived - t0
    );
    let s = t.w.stats();
    assert_eq!(
        (s.rdma_writes, s.rdma_bytes, s.rdma_errors),
        (257, MIB as u64, 0)
    );
    assert_eq!((s.flushed, s.retry_exceeded, s.unknown_actions), (0, 0, 0));
    // The engine ignored the completions it did not know: nothing is left posted.
    let view = t.w.endpoint(a).unwrap().conns().next().unwrap();
    assert_eq!(view.sends_posted, 0);
    assert_eq!(view.id, t.conn);
}

#[test]
fn rdma_write_outside_the_region_fails_and_writes_nothing() {
    type Aim = fn(RemoteRegion) -> RemoteRegion;
    let cases: [(&str, Aim, u64, u32); 5] = [
        (
            "wrong key",
            |r| RemoteRegion {
                key: r.key ^ 1,
                ..r
            },
            0,
            4096,
        ),
        ("past the end", |r| r.at(MIB as u64 - 100), 0, 4096),
        (
            "below the start",
            |r| RemoteRegion {
                addr: r.addr - 1,
                ..r
            },
            0,
            4096,
        ),
        ("huge length", |r| r, 0, u32::MAX),
        ("outside the local region", |r| r, MIB as u64 - 8, 4096),
    ];
    for (what, target, local_offset, len) in cases {
        let mut t = bulk(43);
        let (a, b) = (t.a, t.b);
        let received_before = t.w.received_count(b);
        let wr = write1(
            &mut t.w,
            a,
            t.conn,
            &t.src,
            local_offset,
            target(t.remote),
            len,
        );
        // Queued behind the bad write: flushed when the queue pair goes to error.
        let c = send_n(&mut t.w, a, b, 1, 64)[0];
        t.assert_write_failed(wr, c, what);
        assert_eq!(t.w.received_count(b), received_before, "{what}");
        let s = t.w.stats();
        assert_eq!(
            (s.rdma_errors, s.rdma_writes, s.flushed),
            (1, 0, 1),
            "{what}"
        );
    }
}

#[test]
fn rdma_write_to_a_deregistered_region_fails() {
    let mut t = bulk(45);
    let (a, b) = (t.a, t.b);
    let ghost = Registration::new(t.sink.id(), t.sink.key(), t.sink.addr(), t.sink.len());
    let buf = t.w.registry(b).deregister(t.sink).unwrap();
    assert_eq!(buf.len(), MIB);
    assert!(t.w.region(b, &ghost).is_none());
    assert!(t.w.registry(b).deregister(ghost).is_none());
    let wr = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote, 4096);
    assert!(t.w.run_until_idle(limit(&t.w, 10)));
    assert_eq!(t.w.rdma_status(a, wr), Some(WcStatus::Error));
    assert_eq!(t.w.stats().rdma_errors, 1);
}

#[test]
fn rdma_write_to_a_crashed_peer_exceeds_retries_after_the_horizon() {
    let mut t = bulk(47);
    let (a, b) = (t.a, t.b);
    t.w.crash(b);
    assert!(
        t.w.region(b, &t.sink).is_none(),
        "a crash drops the node's regions"
    );
    let wr = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote, 4096);
    let horizon = t.w.config().retry_horizon;
    t.w.run_for(horizon - Duration::from_millis(10));
    assert_eq!(t.w.rdma_status(a, wr), None, "still retrying");
    t.w.run_for(Duration::from_millis(20));
    assert_eq!(t.w.rdma_status(a, wr), Some(WcStatus::RetryExceeded));
    let s = t.w.stats();
    assert_eq!((s.retry_exceeded, s.rdma_errors, s.rdma_writes), (1, 0, 0));
    // The restarted node has no regions; its old key names nothing.
    assert!(t.w.restart(b, 3));
    assert!(t.w.region(b, &t.sink).is_none());
    assert!(t.w.registry(b).deregister(t.sink).is_none());
}

#[test]
fn rdma_writes_queued_behind_a_disconnect_are_flushed() {
    let mut t = bulk(53);
    let (a, b) = (t.a, t.b);
    // Two 1 MiB writes take ~170 µs on the link; the peer's DREQ arrives after 20 µs.
    let w1 = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote, MIB as u32);
    let w2 = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote, MIB as u32);
    t.w.shutdown(b);
    t.w.run_for(Duration::from_secs(5));
    assert_eq!(t.w.node_state(b), NodeState::Stopped);
    assert_eq!(t.w.rdma_status(a, w1), Some(WcStatus::Flushed));
    assert_eq!(t.w.rdma_status(a, w2), Some(WcStatus::Flushed));
    let s = t.w.stats();
    assert_eq!((s.rdma_writes, s.rdma_bytes, s.rdma_errors), (0, 0, 0));
    assert!(s.flushed >= 2);
    assert!(
        t.w.region(b, &t.sink).is_none(),
        "shutdown drops the node's regions"
    );
    // A write posted on an end already in error flushes at once.
    let mut t = bulk(59);
    let (a, b) = (t.a, t.b);
    let wr = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote.at(8), 8);
    // A bad write first: the queue pair is in error, but the engine still holds the end.
    let bad = write1(
        &mut t.w,
        a,
        t.conn,
        &t.src,
        0,
        RemoteRegion { key: 0, ..t.remote },
        8,
    );
    assert!(t.w.run_until_idle(limit(&t.w, 1)));
    assert_eq!(t.w.rdma_status(a, wr), Some(WcStatus::Success));
    assert_eq!(t.w.rdma_status(a, bad), Some(WcStatus::Error));
    let late = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote, 8);
    assert!(t.w.run_until_idle(limit(&t.w, 1)));
    assert_eq!(t.w.rdma_status(a, late), Some(WcStatus::Flushed));
    assert_eq!(&t.w.region(b, &t.sink).unwrap()[..24], {
        let mut v = [0u8; 24];
        v[8..16].copy_from_slice(&t.w.region(a, &t.src).unwrap()[..8]);
        v
    });
}

#[test]
fn rdma_write_bandwidth_is_configurable() {
    for (bw, wire_ns) in [(0u64, 0u64), (1_000_000_000, 1_048_576)] {
        let mut w = World::new(SimConfig {
            bandwidth: bw,
            ..SimConfig::with_seed(61)
        });
        let a = node(&mut w, "10.0.0.1@o2ib", 1);
        let b = node(&mut w, "10.0.0.2@o2ib", 2);
        send_n(&mut w, a, b, 1, 64);
        assert!(w.run_until_idle(limit(&w, 10)));
        let conn = w.endpoint(a).unwrap().conns().next().unwrap().id;
        let src = w.registry(a).register(vec![7; MIB]).unwrap();
        let sink = w.registry(b).register(vec![0; MIB]).unwrap();
        let t0 = w.now();
        let wr = write1(&mut w, a, conn, &src, 0, sink.remote(), MIB as u32);
        let mut done = None;
        while done.is_none() && w.step() {
            if w.rdma_status(a, wr).is_some() {
                done = Some(w.now());
            }
        }
        let took = done.expect("completed") - t0;
        // Data on the wire, one latency there and one back for the ack.
        assert_eq!(
            took,
            Duration::from_nanos(wire_ns + 4_000),
            "bandwidth {bw}"
        );
        assert_eq!(w.region(b, &sink), w.region(a, &src));
    }
}

#[test]
fn rdma_write_fragment_lists_land_byte_exact() {
    let mut t = bulk(67);
    let (a, b) = (t.a, t.b);
    let src = t.w.region(a, &t.src).unwrap().to_vec();
    // 3 local fragments (out of order), 4 remote ones (with gaps), odd lengths: 150_001 bytes.
    let local = vec![
        t.src.local_frag(100_003, 70_001),
        t.src.local_frag(7, 13),
        t.src.local_frag(1_000, 79_987),
    ];
    let remote = vec![
        t.sink.remote_frag(5, 33),
        t.sink.remote_frag(1_001, 65_537),
        t.sink.remote_frag(80_000, 84_430),
        t.sink.remote_frag(200_001, 1),
    ];
    let want = crate::fabric::expected_sink(&src, MIB, t.sink.addr(), &local, &remote);
    assert!(rdma_pieces(&local, &remote).count() >= 6);
    let wr = t.w.rdma_write(a, t.conn, local, remote);
    // 257 fragments each side, with other boundaries, onto a second sink.
    let sink2 = t.w.registry(b).register(vec![0; 257 * 8192]).unwrap();
    let local2: Vec<LocalFrag> = testkit::frags_257()
        .iter()
        .map(|&(off, len)| t.src.local_frag(off, len))
        .collect();
    let mut lens = vec![1000u32];
    lens.extend(std::iter::repeat_n(4096, 255));
    lens.push(MIB as u32 - 1000 - 255 * 4096);
    let remote2: Vec<RemoteFrag> = lens
        .iter()
        .enumerate()
        .map(|(k, &len)| sink2.remote_frag(k as u64 * 8192, len))
        .collect();
    assert_eq!((local2.len(), remote2.len()), (257, 257));
    let want2 = crate::fabric::expected_sink(&src, 257 * 8192, sink2.addr(), &local2, &remote2);
    let wr2 = t.w.rdma_write(a, t.conn, local2, remote2);
    assert!(t.w.run_until_idle(limit(&t.w, 10)), "{:?}", t.w.stats());
    assert_eq!(t.w.rdma_status(a, wr), Some(WcStatus::Success));
    assert_eq!(t.w.rdma_status(a, wr2), Some(WcStatus::Success));
    assert!(t.w.region(b, &t.sink).unwrap() == &want[..]);
    assert!(t.w.registry(b).contents(&sink2).unwrap() == want2);
    let s = t.w.stats();
    assert_eq!(
        (s.rdma_writes, s.rdma_bytes, s.rdma_errors),
        (2, 150_001 + MIB as u64, 0)
    );
}

#[test]
fn malformed_rdma_writes_fail_and_write_nothing() {
    type Frags = (Vec<LocalFrag>, Vec<RemoteFrag>);
    type Make = fn(&Registration, &Registration) -> Frags;
    let cases: [(&str, Make); 5] = [
        ("258 fragments a side", |s, r| {
            (
                (0..258).map(|i| s.local_frag(i * 8, 8)).collect(),
                (0..258).map(|i| r.remote_frag(i * 16, 8)).collect(),
            )
        }),
        ("totals differ", |s, r| {
            (
                vec![s.local_frag(0, 100), s.local_frag(100, 100)],
                vec![r.remote_frag(0, 150), r.remote_frag(1000, 49)],
            )
        }),
        ("a later local fragment outside its region", |s, r| {
            (
                vec![s.local_frag(0, 100), s.local_frag(MIB as u64 - 50, 100)],
                vec![r.remote_frag(0, 200)],
            )
        }),
        ("a later remote fragment outside its region", |s, r| {
            (
                vec![s.local_frag(0, 200)],
                vec![r.remote_frag(0, 100), r.remote_frag(MIB as u64 - 50, 100)],
            )
        }),
        ("no fragments", |_, _| (vec![], vec![])),
    ];
    for (what, make) in cases {
        let mut t = bulk(71);
        let (a, b) = (t.a, t.b);
        let (local, remote) = make(&t.src, &t.sink);
        let wr = t.w.rdma_write(a, t.conn, local, remote);
        let c = send_n(&mut t.w, a, b, 1, 64)[0];
        t.assert_write_failed(wr, c, what);
        let s = t.w.stats();
        assert_eq!((s.rdma_errors, s.rdma_writes), (1, 0), "{what}");
    }
}
