//! Directed reproductions from the review of the connect hedge and the passive side that keeps
//! older connections: the hedge lost when its delay grows, a message sent while the peer's new
//! connection is being accepted failing on the old dead one, stale double-reject evidence
//! switching the race order back, and (below) a connection on probation letting new messages
//! overtake older ones.

use lnd::engine::{EndpointConfig, RaceOrder, RacePolicy, Tunables};
use lnd::sim::{NodeId, SimConfig, World};
use lnd::time::Duration;
use lnd::wire::{LnetBody, LnetHdr};
use ulnet_tests::send_put;

use testkit::nid;

/// A world of `seed` whose CM takes `cm_delay` per step, with two nodes configured as given.
fn slow_cm_pair(
    seed: u64,
    cm_delay: Duration,
    a: EndpointConfig,
    b: EndpointConfig,
) -> (World, NodeId, NodeId) {
    let mut w = World::new(SimConfig::with_seed(seed));
    w.cm_delay(cm_delay);
    let (a, b) = (w.add_node(a), w.add_node(b));
    (w, a, b)
}

/// Review finding: the hedge timer is armed once, at `created + hedge_delay()` as it was when
/// the connect started. If connects to another peer raise `connect_srtt` before it fires,
/// `maybe_hedge` sees `now < created + hedge_delay()` and returns without re-arming: the stuck
/// connect gets no second attempt and waits out its whole deadline (12.5 s), although the
/// (grown) hedge delay is at most 4 x 0.8 s here.
#[test]
fn hedge_is_lost_when_the_delay_grows_before_its_timer() {
    let mut bad = Vec::new();
    let mut tested = 0;
    for seed in 0..40u64 {
        let mut w = World::new(SimConfig::with_seed(seed));
        w.cm_delay(Duration::from_millis(400));
        let a = w.add_node(EndpointConfig::new(nid("10.0.0.1@o2ib"), 11));
        let b = w.add_node(EndpointConfig::new(nid("10.0.0.2@o2ib"), 22));
        let c = w.add_node(EndpointConfig::new(nid("10.0.0.3@o2ib"), 33));
        w.stuck_next_connect(a, w.nid_of(b));
        let t0 = w.now();
        let to_b = send_put(&mut w, a, b, 1);
        let to_c = send_put(&mut w, a, c, 2);
        w.run_for(Duration::from_millis(999));
        // Only the seeds where A's connect to C finished before the hedge timer and made the
        // learned delay exceed 1 s are interesting.
        let Some((at_c, _)) = w.outcome(to_c) else {
            continue;
        };
        let took_c = at_c - t0;
        if took_c * 4 <= Duration::from_secs(1) {
            continue;
        }
        tested += 1;
        w.run_for(Duration::from_secs(30));
        let (at, o) = w.outcome(to_b).expect("an outcome");
        assert!(o.is_delivered(), "{o:?}");
        let took = at - t0;
        // Generous: the grown hedge delay (4 x srtt <= 4 x 0.8 s) plus one more connect.
        if took > Duration::from_secs(5) {
            bad.push((
                seed,
                took_c,
                took,
                w.endpoint(a).unwrap().stats().connect_hedges,
            ));
        }
    }
    assert!(tested > 0, "no seed exercised the case");
    assert!(
        bad.is_empty(),
        "{} of {tested} seeds: the stuck connect got no hedge ((seed, A->C took, A->B took, hedges)): {bad:?}",
        bad.len()
    );
}

/// Review finding (d80d939's probation, and worse at 8bde059): B kept its end of a connection
/// whose far end A destroyed during a partition (A's Disconnect lost). After the heal A connects
/// again (same incarnation). A message B sends after A's request has arrived but before the new
/// connection is established at B goes onto the dead connection (the only established one, on
/// probation) and fails after the fabric's retry horizon. At 0425e3c the dead connection was
/// closed at the request and the message waited for the new one and was delivered.
#[test]
fn message_sent_while_the_new_connection_is_being_accepted_fails_on_the_dead_one() {
    const A: &str = "10.0.0.1@o2ib";
    const B: &str = "10.0.0.2@o2ib";
    let mut failed = Vec::new();
    for seed in 0..20u64 {
        let mut w = World::new(SimConfig::with_seed(seed));
        let a = w.add_node(EndpointConfig::new(nid(A), 11));
        let b = w.add_node(EndpointConfig::new(nid(B), 22));
        let first = send_put(&mut w, a, b, 0);
        w.run_for(Duration::from_millis(50));
        assert!(w.outcome(first).is_some_and(|(_, o)| o.is_delivered()));
        let timeout = w.endpoint(a).unwrap().config().tunables.timeout;
        let part = w.partition(&[a], &[b]);
        send_put(&mut w, a, b, 1);
        w.run_for(timeout + Duration::from_secs(5));
        let view = |w: &World| w.endpoint(b).unwrap().peer(nid(A)).unwrap();
        assert_eq!(view(&w).established, 1, "B kept its end");
        w.heal_partition(part);
        // Slow CM (RTU up to 200 ms), so that there is a window between request and RTU.
        w.cm_delay(Duration::from_millis(200));
        send_put(&mut w, a, b, 2);
        // Until B has accepted A's new request (a handshake pending, the old one still up).
        let end = w.now() + Duration::from_secs(2);
        while w.now() < end && !view(&w).connecting {
            w.run_for(Duration::from_micros(100));
        }
        assert!(view(&w).connecting);
        let c = send_put(&mut w, b, a, 3);
        assert!(w.run_until_idle(w.now() + Duration::from_secs(60)));
        let (_, o) = w.outcome(c).unwrap();
        if !o.is_delivered() {
            failed.push((seed, o));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 20 seeds: {failed:?}",
        failed.len()
    );
}

/// Review finding: `accepting` keeps a handshake of a peer's previous incarnation after the new
/// incarnation's request (close_peer_conns only closes established ones; 0425e3c superseded the
/// pending accept). If the old one is then established (its RTU was in flight when A crashed),
/// `established()` closes the connections whose stamp differs from *it*: the new instance's
/// good connection is closed, and the dead one to the old instance is kept and used.
#[test]
fn stale_double_reject_evidence_switches_the_order_back() {
    let (lo, hi) = (nid("10.0.0.2@o2ib"), nid("10.0.1.1@o2ib"));
    let mut bad = Vec::new();
    for seed in 0..30u64 {
        let ulnet = EndpointConfig {
            race_order: RaceOrder::NidHash,
            ..EndpointConfig::new(lo, 1)
        };
        let kernel = EndpointConfig {
            race_order: RaceOrder::Nid,
            race_policy: RacePolicy::Lu17480,
            ..EndpointConfig::new(hi, 2)
        };
        let (mut w, u, k) = slow_cm_pair(seed, Duration::from_millis(1500), ulnet, kernel);
        for _round in 0..4 {
            for i in 0..3 {
                send_put(&mut w, u, k, i);
                send_put(&mut w, k, u, i);
            }
            w.run_for(Duration::from_secs(60));
            let part = w.partition(&[u], &[k]);
            send_put(&mut w, u, k, 99);
            send_put(&mut w, k, u, 99);
            w.run_for(Duration::from_secs(200));
            w.heal_partition(part);
        }
        let adoptions = w.endpoint(u).unwrap().stats().race_order_adoptions;
        if adoptions != 1 {
            bad.push((seed, adoptions));
        }
    }
    assert!(
        bad.is_empty(),
        "(seed, adoptions by the ulnet node): {bad:?}"
    );
}

#[test]
fn probation_reorders_messages_of_one_pair() {
    let (an, bn) = (nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib"));
    let t = Tunables {
        peer_credits: 2,
        ..Tunables::default()
    };
    let cfg = |n, incarnation| EndpointConfig {
        tunables: t.clone(),
        ..EndpointConfig::new(n, incarnation)
    };
    let mut bad = Vec::new();
    for seed in 0..300u64 {
        let (mut w, a, b) = slow_cm_pair(seed, Duration::from_millis(2), cfg(an, 1), cfg(bn, 2));
        w.set_recv_delay(a, Duration::from_millis(20));
        w.set_recv_delay(b, Duration::from_millis(20));
        let mut seq = 0u64;
        let mut seqb = 1000u64;
        for _ in 0..200 {
            seq += 1;
            w.send(a, bn, LnetHdr::put(an, bn, 8, 4, seq), vec![1; 8]);
            seqb += 1;
            w.send(b, an, LnetHdr::put(bn, an, 8, 4, seqb), vec![1; 8]);
            w.run_for(Duration::from_micros(100));
        }
        w.run_for(Duration::from_secs(30));
        for (n, from) in [(b, an), (a, bn)] {
            let mut last = 0;
            for m in w.received(n) {
                if m.from != from {
                    continue;
                }
                if let LnetBody::Put { match_bits, .. } = m.hdr.body {
                    if match_bits < last {
                        bad.push((seed, from, last, match_bits));
                        break;
                    }
                    last = match_bits;
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} reorders (seed, from, previous, then): {:?}",
        bad.len(),
        &bad[..bad.len().min(6)]
    );
}
