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
