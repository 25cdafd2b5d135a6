//! The o2iblnd protocol rules one at a time, on the simulator: what a peer that breaks them gets,
//! what each reject makes the rejected side do, keepalives and credit NOOPs.

use lnd::engine::{ConnState, DownReason, EndpointConfig, LndStats, RacePolicy, Tunables, TxError};
use lnd::fabric::RequestId;
use lnd::sim::{NodeId, SendOutcome, SimConfig, World};
use lnd::time::Duration;
use lnd::wire::kib::{EmitOpts, VERSION_2};
use lnd::wire::{KibBody, KibMsg, RejectReason};
use ulnet_tests::put_hdr;

const A: &str = "10.0.0.1@o2ib";
const B: &str = "10.0.0.2@o2ib";

use testkit::nid;

/// A's configuration at its defaults: NID `A`, incarnation 11.
fn node_a() -> EndpointConfig {
    EndpointConfig::new(nid(A), 11)
}

/// B's configuration at its defaults: NID `B`, incarnation 22.
fn node_b() -> EndpointConfig {
    EndpointConfig::new(nid(B), 22)
}

/// A world of `seed` with the nodes A and B configured as given.
fn pair_of(seed: u64, a: EndpointConfig, b: EndpointConfig) -> (World, NodeId, NodeId) {
    let mut w = World::new(SimConfig::with_seed(seed));
    let (a, b) = (w.add_node(a), w.add_node(b));
    (w, a, b)
}

fn pair(ta: Tunables, tb: Tunables) -> (World, NodeId, NodeId) {
    let a = EndpointConfig {
        tunables: ta,
        ..node_a()
    };
    let b = EndpointConfig {
        tunables: tb,
        ..node_b()
    };
    pair_of(1, a, b)
}

fn connected() -> (World, NodeId, NodeId) {
    let (mut w, a, b) = pair(Tunables::default(), Tunables::default());
    let c = w.send(a, nid(B), put_hdr(nid(A), nid(B), 8), vec![0; 8]);
    w.run_for(Duration::from_millis(10));
    assert_eq!(w.outcome(c).map(|(_, o)| o), Some(SendOutcome::Delivered));
    (w, a, b)
}

fn stats(w: &World, n: NodeId) -> LndStats {
    w.endpoint(n).expect("up").stats().clone()
}

/// Injects raw bytes into `at`'s established connection, as if its peer had sent them.
fn inject(w: &mut World, at: NodeId, bytes: &[u8]) {
    w.with_endpoint(at, |ep, now| {
        let conn = ep
            .conns()
            .find(|c| c.state == ConnState::Established)
            .expect("connected")
            .id;
        ep.handle_recv(now, conn, 0, bytes);
    });
    w.run_for(Duration::from_millis(10));
}

fn noop_from_b(credits: u8, src_stamp: u64) -> Vec<u8> {
    let msg = KibMsg {
        version: VERSION_2,
        credits,
        src_nid: nid(B),
        src_stamp,
        dst_nid: nid(A),
        dst_stamp: 11,
        body: KibBody::Noop,
    };
    let mut b = vec![0u8; 48];
    msg.emit(&mut b, EmitOpts::default()).expect("fits");
    b
}

#[test]
fn credit_overflow_is_a_protocol_error() {
    let (mut w, a, _) = connected();
    // The queue depth is 8 and A holds its credits: returning 8 more overflows.
    inject(&mut w, a, &noop_from_b(8, 22));
    let s = stats(&w, a);
    assert_eq!(s.credit_overflows, 1);
    assert_eq!(s.conns_lost, 1);
    assert!(w
        .endpoint(a)
        .unwrap()
        .conns()
        .all(|c| c.state != ConnState::Established));
    assert!(w
        .peer_events(a)
        .iter()
        .any(|e| e.down == Some(DownReason::ProtocolError)));
}

#[test]
fn stale_stamps_close_the_connection() {
    let (mut w, a, _) = connected();
    inject(&mut w, a, &noop_from_b(0, 23)); // an instance A never connected to
    assert_eq!(stats(&w, a).stale_rx, 1);
    assert!(w
        .endpoint(a)
        .unwrap()
        .conns()
        .all(|c| c.state != ConnState::Established));
}

#[test]
fn garbage_closes_only_that_connection_and_is_counted() {
    let (mut w, a, b) = connected();
    inject(
        &mut w,
        a,
        b"\x00\x01garbage that is no o2iblnd message at all",
    );
    assert_eq!(stats(&w, a).bad_msgs, 1);
    // Traffic recovers on a new connection.
    let c = w.send(b, nid(A), put_hdr(nid(B), nid(A), 8), vec![1; 8]);
    w.run_for(Duration::from_secs(3));
    assert_eq!(w.outcome(c).map(|(_, o)| o), Some(SendOutcome::Delivered));
}

#[test]
fn bad_connect_requests_are_refused_fatal_and_counted() {
    let (mut w, _, b) = connected();
    w.with_endpoint(b, |ep, now| {
        ep.handle_connect_request(now, RequestId(9999), b"junk")
    });
    let s = stats(&w, b);
    assert_eq!(s.bad_connreqs, 1);
    assert_eq!(s.rejects_sent[RejectReason::Fatal.code() as usize], 1);
}

#[test]
fn msg_queue_size_reject_adopts_the_smaller_depth() {
    let big = Tunables {
        peer_credits: 16,
        ..Tunables::default()
    };
    let (mut w, a, b) = pair(big, Tunables::default());
    let c = w.send(a, nid(B), put_hdr(nid(A), nid(B), 8), vec![0; 8]);
    w.run_for(Duration::from_secs(1));
    assert_eq!(w.outcome(c).map(|(_, o)| o), Some(SendOutcome::Delivered));
    assert_eq!(
        stats(&w, b).rejects_sent[RejectReason::MsgQueueSize.code() as usize],
        1
    );
    assert_eq!(
        stats(&w, a).rejects_received[RejectReason::MsgQueueSize.code() as usize],
        1
    );
    let conn = w
        .endpoint(a)
        .unwrap()
        .conns()
        .find(|c| c.state == ConnState::Established)
        .unwrap();
    assert_eq!(conn.queue_depth, 8);
}

#[test]
fn no_listener_fails_without_retrying() {
    let (mut w, a, b) = pair(Tunables::default(), Tunables::default());
    w.shutdown(b);
    w.run_for(Duration::from_millis(10));
    let c = w.send(a, nid(B), put_hdr(nid(A), nid(B), 8), vec![0; 8]);
    w.run_for(Duration::from_secs(5));
    assert_eq!(
        w.outcome(c).map(|(_, o)| o),
        Some(SendOutcome::Failed(TxError::ConnectRefused)),
        "nothing listens: refused (ECONNREFUSED), not unreachable"
    );
    assert_eq!(
        stats(&w, a).connects,
        1,
        "LU-14536: no reconnect when nothing listens"
    );
}

/// LU-17480's deadline ends a stuck active connect (ours with its second attempt turned off,
/// `connect_hedge: 0`, to see the deadline alone).
#[test]
fn a_stuck_connect_is_bounded_by_its_deadline() {
    for policy in [RacePolicy::Lu17480, RacePolicy::Ulnet] {
        let mut cfg = EndpointConfig {
            race_policy: policy,
            ..node_a()
        };
        cfg.tunables.connect_hedge = Duration::ZERO;
        let (mut w, a, _b) = pair_of(3, cfg, node_b());
        w.stuck_next_connect(a, nid(B));
        let c = w.send(a, nid(B), put_hdr(nid(A), nid(B), 8), vec![0; 8]);
        let deadline = w.endpoint(a).unwrap().config().tunables.connect_timeout();
        assert_eq!(
            deadline,
            Duration::from_millis(12_500),
            "max(5 s, 50 s / 4)"
        );
        w.run_for(deadline + Duration::from_secs(2));
        assert_eq!(stats(&w, a).connect_timeouts, 1, "{policy:?}");
        // The attempt is abandoned and the retry connects.
        assert_eq!(
            w.outcome(c).map(|(_, o)| o),
            Some(SendOutcome::Delivered),
            "{policy:?}"
        );
    }
}

/// Ours by default: the stuck connect gets a second attempt beside it after `connect_hedge`
/// (1 s), which carries the message; the stuck one is aborted once the second is up.
#[test]
fn a_stuck_connect_costs_ours_one_hedge_delay() {
    let (mut w, a, _b) = pair_of(3, node_a(), node_b());
    w.stuck_next_connect(a, nid(B));
    let t0 = w.now();
    let c = w.send(a, nid(B), put_hdr(nid(A), nid(B), 8), vec![0; 8]);
    let hedge = w.endpoint(a).unwrap().config().tunables.connect_hedge;
    assert_eq!(hedge, Duration::from_secs(1));
    w.run_for(hedge + Duration::from_millis(100));
    let (at, o) = w.outcome(c).expect("delivered by the second attempt");
    assert_eq!(o, SendOutcome::Delivered);
    assert!(at - t0 >= hedge, "{}", at - t0);
    assert_eq!(stats(&w, a).connect_hedges, 1);
    assert_eq!(stats(&w, a).connect_timeouts, 0, "aborted, not timed out");
    assert_eq!(w.endpoint(a).unwrap().conns().count(), 1);
}

#[test]
fn idle_connections_send_keepalives() {
    let (mut w, a, b) = connected();
    let keepalive = w.endpoint(a).unwrap().config().tunables.keepalive;
    w.run_for(keepalive + Duration::from_secs(2));
    assert!(stats(&w, a).keepalives + stats(&w, b).keepalives >= 1);
    // Still connected: a keepalive to a live peer changes nothing.
    assert!(w
        .endpoint(a)
        .unwrap()
        .conns()
        .any(|c| c.state == ConnState::Established));
}

#[test]
fn credits_come_back_by_noop_at_the_high_water_mark() {
    let (mut w, a, b) = connected();
    let cookies: Vec<u64> = (0..100)
        .map(|_| w.send(a, nid(B), put_hdr(nid(A), nid(B), 8), vec![0; 8]))
        .collect();
    w.run_for(Duration::from_secs(1));
    for c in cookies {
        assert_eq!(w.outcome(c).map(|(_, o)| o), Some(SendOutcome::Delivered));
    }
    // B never sends anything of its own: every credit went back on a NOOP.
    assert!(
        stats(&w, b).credit_noops >= 100 / 8,
        "{}",
        stats(&w, b).credit_noops
    );
    assert_eq!(w.stats().rnr, 0);
}

mod hostile_input {
    use super::*;
    use lnd::fabric::{ConnectFailure, PrivateData};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Whatever a peer or the connection manager hands the engine, it does not panic, counts
        /// what it refused, and every message it had accepted still ends with a status.
        #[test]
        fn the_engine_survives_arbitrary_input(
            recv in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 0..8),
            reqs in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..80), 0..8),
            rejects in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..4),
        ) {
            let (mut w, a, b) = connected();
            let cookies: Vec<u64> = (0..20).map(|_| w.send(a, nid(B), put_hdr(nid(A), nid(B), 8), vec![0; 8])).collect();
            for bytes in &recv {
                w.with_endpoint(a, |ep, now| {
                    let conn = ep.conns().find(|c| c.state == ConnState::Established).map(|c| c.id);
                    if let Some(c) = conn {
                        ep.handle_recv(now, c, 0, bytes);
                    }
                });
            }
            for (i, bytes) in reqs.iter().enumerate() {
                w.with_endpoint(b, |ep, now| ep.handle_connect_request(now, RequestId(1_000_000 + i as u64), bytes));
            }
            // A connect in flight that gets rejected with arbitrary private data.
            for bytes in &rejects {
                w.with_endpoint(a, |ep, now| {
                    let conn = ep.conns().find(|c| c.state == ConnState::ActiveConnect).map(|c| c.id);
                    if let Some(c) = conn {
                        ep.handle_connect_failed(now, c, ConnectFailure::Rejected(PrivateData::new(bytes)));
                    }
                });
            }
            w.run_for(Duration::from_secs(120));
            for c in cookies {
                prop_assert!(w.outcome(c).is_some(), "a message never finished");
            }
            prop_assert_eq!(w.pending_sends(), 0);
            // Still usable afterwards.
            let c = w.send(b, nid(A), put_hdr(nid(B), nid(A), 8), vec![1; 8]);
            w.run_for(Duration::from_secs(5));
            prop_assert_eq!(w.outcome(c).map(|(_, o)| o), Some(SendOutcome::Delivered));
        }
    }
}

/// o2iblnd's `conns_per_peer`: A opens three connections to B, one after the other, B keeps all
/// three (as kiblnd_passive_connect does, ulnet or kernel rules), and a burst of 24 messages is
/// spread over them so that each connection's 8 credits are used at once, where one connection
/// would post 8 and queue 16. Every message arrives once.
#[test]
fn conns_per_peer_opens_that_many_and_spreads_messages_over_their_credits() {
    for (cpp, policy) in [
        (3u16, RacePolicy::Ulnet),
        (3, RacePolicy::Lu17480),
        (1, RacePolicy::Ulnet),
    ] {
        let mut a = node_a();
        a.tunables.conns_per_peer = cpp;
        let b = EndpointConfig {
            race_policy: policy,
            ..node_b()
        };
        let (mut w, a, b) = pair_of(5, a, b);
        let first = w.send(a, nid(B), put_hdr(nid(A), nid(B), 8), vec![0; 8]);
        w.run_for(Duration::from_millis(200));
        assert_eq!(
            w.outcome(first).map(|(_, o)| o),
            Some(SendOutcome::Delivered)
        );
        let ctx = format!("conns_per_peer {cpp}, B on {policy:?}");
        let ours = |w: &World| {
            w.endpoint(a)
                .unwrap()
                .conns()
                .filter(|c| c.active && c.state == ConnState::Established)
                .count()
        };
        assert_eq!(ours(&w), usize::from(cpp), "{ctx}");
        assert_eq!(
            w.endpoint(b).unwrap().peer(nid(A)).unwrap().established,
            usize::from(cpp),
            "{ctx}: B kept them all"
        );
        // How messages sit on A's connections: credits in use, and queued.
        let load = |w: &World| {
            w.endpoint(a)
                .unwrap()
                .conns()
                .filter(|c| c.state == ConnState::Established)
                .fold((0u16, 0usize), |(p, q), c| {
                    (p + (c.queue_depth - c.credits), q + c.queued)
                })
        };
        let (before, _) = load(&w);
        let cookies: Vec<u64> = (0..24)
            .map(|_| w.send(a, nid(B), put_hdr(nid(A), nid(B), 8), vec![1; 8]))
            .collect();
        // Before anything completes.
        let (after, queued) = load(&w);
        let free = 8 * cpp - before;
        assert_eq!(after - before, free.min(24), "{ctx}: credits used at once");
        assert_eq!(queued, 24 - usize::from(free.min(24)), "{ctx}: queued");
        w.run_for(Duration::from_secs(1));
        for c in cookies {
            assert_eq!(
                w.outcome(c).map(|(_, o)| o),
                Some(SendOutcome::Delivered),
                "{ctx}"
            );
        }
        assert_eq!(w.received_count(b), 25, "{ctx}");
        assert_eq!(stats(&w, a).connects, u64::from(cpp), "{ctx}: no churn");
        assert_eq!(w.invalid_transitions(), 0);
    }
}
