//! S7: credits under random send / receive / repost schedules. No deadlock, credits never exceed
//! the queue depth, messages arrive in order or fail with a status, and credits are conserved.

use lnd::engine::{ConnState, EndpointConfig, Tunables};
use lnd::sim::{NodeId, SendOutcome, SimConfig, World};
use lnd::time::Duration;
use lnd::wire::{LnetBody, LnetHdr, Nid};
use proptest::prelude::*;

fn hdr(from: Nid, to: Nid, seq: u64, len: usize) -> LnetHdr {
    LnetHdr::put(from, to, len as u32, 4, seq)
}

fn check_credit_bounds(w: &World, nodes: &[NodeId], seed: u64) {
    for &n in nodes {
        if let Some(e) = w.endpoint(n) {
            for c in e.conns() {
                assert!(c.credits <= c.queue_depth, "seed {seed}: {c:?}");
                assert!(
                    c.outstanding_credits <= 2 * c.queue_depth + 2,
                    "seed {seed}: {c:?}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn credits_random_schedules(
        seed in any::<u64>(),
        peer_credits in 2u16..12,
        nodes_n in 2usize..5,
        msgs in prop::collection::vec((0usize..5, 0usize..5, 0usize..600, 0u8..4), 1..300),
        recv_delay_us in prop::collection::vec(0u64..20_000, 5),
        cm_delay_us in 0u64..200,
    ) {
        let mut w = World::new(SimConfig::with_seed(seed));
        w.cm_delay(Duration::from_micros(cm_delay_us));
        let tunables = Tunables { peer_credits, ..Tunables::default() };
        let nodes: Vec<NodeId> = (0..nodes_n)
            .map(|i| {
                let nid = Nid::new("10.0.0.0@o2ib".parse::<Nid>().unwrap().net(), 0x0a00_0001 + i as u32);
                w.add_node(EndpointConfig { tunables: tunables.clone(), ..EndpointConfig::new(nid, 100 + i as u64) })
            })
            .collect();
        for (i, &n) in nodes.iter().enumerate() {
            // Slow receivers hold slots: the back-pressure path.
            w.set_recv_delay(n, Duration::from_micros(recv_delay_us[i]));
        }
        let mut seqs = std::collections::HashMap::new();
        let mut cookies = Vec::new();
        for (from, to, len, pause) in msgs {
            let (from, to) = (nodes[from % nodes_n], nodes[to % nodes_n]);
            let (fnid, tnid) = (w.nid_of(from), w.nid_of(to));
            let seq = seqs.entry((from, to)).or_insert(0u64);
            *seq += 1;
            cookies.push(w.send(from, tnid, hdr(fnid, tnid, *seq, len), vec![0xa5; len]));
            if pause > 0 {
                w.run_for(Duration::from_micros(u64::from(pause) * 50));
                check_credit_bounds(&w, &nodes, seed);
            }
        }
        // Run in slices, checking the bounds as it goes.
        for _ in 0..200 {
            w.run_for(Duration::from_millis(10));
            check_credit_bounds(&w, &nodes, seed);
        }
        w.run_for(Duration::from_secs(5));
        // No deadlock: everything was delivered.
        for c in &cookies {
            prop_assert_eq!(w.outcome(*c).map(|(_, o)| o), Some(SendOutcome::Delivered), "seed {}", seed);
        }
        prop_assert_eq!(w.stats().rnr, 0, "seed {}: a send found no receive slot", seed);
        prop_assert_eq!(w.invalid_transitions(), 0, "seed {}: invalid transitions", seed);
        // In order per sender/receiver pair (match bits carry the sequence).
        for &n in &nodes {
            let mut last = std::collections::HashMap::new();
            for m in w.received(n) {
                if let LnetBody::Put { match_bits, .. } = m.hdr.body {
                    let prev = last.insert(m.from, match_bits).unwrap_or(0);
                    prop_assert!(match_bits > prev, "seed {}: out of order from {}", seed, m.from);
                }
            }
        }
        // Conserved: at rest, my credits plus the peer's unreturned credits make the queue depth.
        for &a in &nodes {
            for &b in &nodes {
                if a >= b {
                    continue;
                }
                let (ea, eb) = (w.endpoint(a).unwrap(), w.endpoint(b).unwrap());
                let ca: Vec<_> = ea.conns().filter(|c| c.peer == eb.nid() && c.state == ConnState::Established).collect();
                let cb: Vec<_> = eb.conns().filter(|c| c.peer == ea.nid() && c.state == ConnState::Established).collect();
                if ca.len() == 1 && cb.len() == 1 {
                    prop_assert_eq!(ca[0].credits + cb[0].outstanding_credits, ca[0].queue_depth, "seed {}", seed);
                    prop_assert_eq!(cb[0].credits + ca[0].outstanding_credits, cb[0].queue_depth, "seed {}", seed);
                }
            }
        }
    }
}

/// The proptest case that found it (seed 5829289380477399085), as a plain test. 10.0.0.2 connects
/// to 10.0.0.1 and 10.0.0.1 to it at about the same time; 10.0.0.1 accepts (it is the lower NID)
/// and 10.0.0.2's own connect has already completed when 10.0.0.1's request arrives, so it
/// accepts too: two connections. 10.0.0.1's passive end comes up first and takes its queued
/// PUTs 1 and 2, which use both credits (queue depth 2, slow receiver); PUT 3 waits there for a
/// credit. Its active end then comes up, and PUT 4 must not take it and overtake PUT 3.
#[test]
fn out_of_order_from_10_0_0_1_after_both_sides_accept() {
    let seed = 5_829_289_380_477_399_085;
    let mut w = World::new(SimConfig::with_seed(seed));
    w.cm_delay(Duration::from_micros(99));
    let tunables = Tunables {
        peer_credits: 2,
        ..Tunables::default()
    };
    let net = "10.0.0.0@o2ib".parse::<Nid>().unwrap().net();
    let nodes: Vec<NodeId> = (0..2u32)
        .map(|i| {
            let nid = Nid::new(net, 0x0a00_0001 + i);
            w.add_node(EndpointConfig {
                tunables: tunables.clone(),
                ..EndpointConfig::new(nid, 100 + u64::from(i))
            })
        })
        .collect();
    w.set_recv_delay(nodes[0], Duration::from_micros(11_890));
    w.set_recv_delay(nodes[1], Duration::from_micros(17_927));
    // (from, to, len, pause in 50 us): a self-send twice, 1 -> 0, then 0 -> 1 four times.
    let msgs: [(usize, usize, usize, u64); 7] = [
        (1, 1, 0, 0),
        (1, 1, 0, 3),
        (1, 0, 0, 1),
        (0, 1, 0, 1),
        (0, 1, 27, 2),
        (0, 1, 489, 2),
        (0, 1, 165, 2),
    ];
    let mut seqs = std::collections::HashMap::new();
    let mut cookies = Vec::new();
    for (from, to, len, pause) in msgs {
        let (from, to) = (nodes[from], nodes[to]);
        let (fnid, tnid) = (w.nid_of(from), w.nid_of(to));
        let seq = seqs.entry((from, to)).or_insert(0u64);
        *seq += 1;
        if (from, to, *seq) == (nodes[0], nodes[1], 4) {
            // The situation: two established connections to the peer, PUT 3 queued on one.
            let e = w.endpoint(from).unwrap();
            let conns: Vec<_> = e
                .conns()
                .filter(|c| c.peer == tnid && c.state == ConnState::Established)
                .collect();
            assert_eq!(conns.len(), 2, "{conns:?}");
            assert!(
                conns
                    .iter()
                    .any(|c| !c.active && c.queued == 1 && c.credits == 0),
                "{conns:?}"
            );
        }
        cookies.push(w.send(from, tnid, hdr(fnid, tnid, *seq, len), vec![0xa5; len]));
        w.run_for(Duration::from_micros(pause * 50));
    }
    w.run_for(Duration::from_secs(5));
    for c in &cookies {
        assert_eq!(w.outcome(*c).map(|(_, o)| o), Some(SendOutcome::Delivered));
    }
    let from0: Vec<u64> = w
        .received(nodes[1])
        .iter()
        .filter(|m| m.from == w.nid_of(nodes[0]))
        .filter_map(|m| match m.hdr.body {
            LnetBody::Put { match_bits, .. } => Some(match_bits),
            _ => None,
        })
        .collect();
    assert_eq!(from0, [1, 2, 3, 4]);
}
