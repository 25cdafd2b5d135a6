//! Bare socklnd engines in the world, each scenario named after the failure it reproduces:
//! the world plays LNet above them and the stream network below, with its faults.

use super::*;
use crate::iface::{BulkMem, BulkOp, BulkSend, Lnd};
use crate::mem::SharedMem;
use crate::wire::LnetBody;

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 4, 0, last)
}

fn nid(last: u8) -> Nid {
    format!("{}@tcp", ip(last)).parse().unwrap()
}

fn sock_cfg(last: u8, incarnation: u64) -> SockConfig {
    SockConfig::new(nid(last), incarnation)
}

fn world(seed: u64, nodes: &[u8]) -> (World<SockEngine>, Vec<NodeId>) {
    let mut w: World<SockEngine> = World::hosting(SimConfig::with_seed(seed));
    let ids = nodes
        .iter()
        .map(|&last| w.add_node(sock_cfg(last, 1000 + u64::from(last))))
        .collect();
    (w, ids)
}

fn limit(w: &World<SockEngine>, secs: u64) -> Instant {
    w.now() + Duration::from_secs(secs)
}

/// `from` PUTs `len` inline bytes to `to`, numbered `seq` (the match bits).
fn put(w: &mut World<SockEngine>, from: NodeId, to: NodeId, len: usize, seq: u64) -> u64 {
    let (src, dst) = (w.nid_of(from), w.nid_of(to));
    w.send(from, dst, put_hdr(src, dst, len, seq), vec![seq as u8; len])
}

/// LNet's memory `mem` as a bulk source or sink: `len` bytes from its start, shared with the
/// LND (no fabric registration: socklnd streams it).
fn lnet_mem(mem: SharedMem, len: u32) -> BulkMem {
    BulkMem {
        region: crate::fabric::RegionId(0),
        key: 0,
        addr: 0,
        offset: 0,
        len,
        mem: Some(mem),
    }
}

/// `from` PUTs all of `src` (LNet's memory) to `to` by bulk, numbered `seq`.
fn put_bulk(w: &mut World<SockEngine>, from: NodeId, to: NodeId, src: SharedMem, seq: u64) -> u64 {
    let (sf, st) = (w.nid_of(from), w.nid_of(to));
    let len = src.len();
    let hdr = put_hdr(sf, st, len, seq);
    w.send_bulk(from, st, hdr, BulkSend::Put(lnet_mem(src, len as u32)))
}

/// Nodes 1 and 2, connected by a first small PUT from 1 to 2, delivered.
fn connected_pair(seed: u64) -> (World<SockEngine>, NodeId, NodeId) {
    let (mut w, ids) = world(seed, &[1, 2]);
    let (a, b) = (ids[0], ids[1]);
    put(&mut w, a, b, 8, 1);
    assert!(w.run_until_idle(limit(&w, 10)));
    (w, a, b)
}

/// Two minutes after a fault ended, a new PUT from `a` to `b` is delivered (on new connections).
#[track_caller]
fn assert_flows_again(w: &mut World<SockEngine>, a: NodeId, b: NodeId) {
    w.run_for(Duration::from_secs(120));
    let again = put(w, a, b, 8, 100);
    assert!(w.run_until_idle(limit(w, 120)));
    assert_eq!(w.outcome(again).map(|o| o.1), Some(SendOutcome::Delivered));
}

/// Every one of `cookies` ended failed.
#[track_caller]
fn assert_all_failed(w: &World<SockEngine>, cookies: &[u64]) {
    for c in cookies {
        assert!(
            matches!(w.outcome(*c).map(|o| o.1), Some(SendOutcome::Failed(_))),
            "cookie {c}: {:?}",
            w.outcome(*c)
        );
    }
}

fn match_bits(hdr: &LnetHdr) -> u64 {
    match hdr.body {
        LnetBody::Put { match_bits, .. } => match_bits,
        _ => u64::MAX,
    }
}

/// Established connections of node `n` to `peer`, by type name, sorted.
fn typed(w: &World<SockEngine>, n: NodeId, peer: NodeId) -> Vec<&'static str> {
    let pn = w.nid_of(peer);
    let mut v: Vec<&'static str> = w
        .node(n)
        .map(|e| {
            e.conn_views()
                .into_iter()
                .filter(|c| c.peer == Some(pn) && c.state == "established")
                .map(|c| c.ctype)
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

const TYPED_SET: [&str; 3] = ["bulk_in", "bulk_out", "control"];

/// Node `n`'s engine and the stream network agree on its connections, and none of them is a
/// zombie (an open connection whose other end is gone).
fn assert_no_zombie(w: &World<SockEngine>, n: NodeId) {
    let h = w.stream_host(n).unwrap();
    let held = w.node(n).map_or(0, |e| e.conn_views().len());
    assert_eq!(held, w.stream_ends_of(n), "node {n:?}: engine vs network");
    assert_eq!(
        w.streams().orphan_ends(h),
        0,
        "node {n:?}: zombie connections"
    );
}

/// LNet's side of bulk PUTs: each new `BulkRequest` at node `n` (from `seen` on) gets a sink
/// of its length; returns how many it answered.
fn play_lnet(
    w: &mut World<SockEngine>,
    n: NodeId,
    seen: &mut usize,
    sinks: &mut Vec<(Nid, u64, SharedMem)>,
) -> usize {
    let evs = w.node_events(n);
    let new: Vec<(Nid, LnetHdr, RxToken)> = evs[*seen..]
        .iter()
        .filter_map(|(_, e)| match e {
            LndEvent::BulkRequest {
                from,
                hdr,
                op: BulkOp::Put,
                rx,
            } => Some((*from, *hdr, *rx)),
            _ => None,
        })
        .collect();
    *seen = evs.len();
    for (from, hdr, rx) in &new {
        let len = hdr.payload_length;
        let sink = SharedMem::new(len as usize);
        let cookie = 1_000_000 + sinks.len() as u64;
        let mem = lnet_mem(sink.clone(), len);
        w.with_node(n, |e, now| e.accept_bulk(now, *rx, mem, cookie));
        sinks.push((*from, match_bits(hdr), sink));
    }
    new.len()
}

/// Two engines connect: the dialer opens the whole typed set (CONTROL, BULK_IN, BULK_OUT),
/// both sides see all three (each with its own view of the types), both report the peer up
/// once, and the way back uses the same connections (the kernel never dials back a peer whose
/// connections are up).
#[test]
fn two_engines_connect_with_the_typed_set_both_ways() {
    let (mut w, ids) = world(1, &[1, 2]);
    let (a, b) = (ids[0], ids[1]);
    let c1 = put(&mut w, a, b, 16, 1);
    assert!(w.run_until_idle(limit(&w, 10)));
    assert_eq!(w.outcome(c1).map(|o| o.1), Some(SendOutcome::Delivered));
    assert_eq!(w.received(b).len(), 1);
    assert_eq!(typed(&w, a, b), TYPED_SET);
    assert_eq!(typed(&w, b, a), TYPED_SET);
    assert!(w.node(a).unwrap().conn_views().iter().all(|c| c.active));
    assert!(w.node(b).unwrap().conn_views().iter().all(|c| !c.active));
    // A's BULK_IN is B's BULK_OUT: the same three connections seen from both ends.
    assert_eq!(w.stream_ends_of(a), 3);
    assert_eq!(w.stream_ends_of(b), 3);
    let ups = |n| w.peer_events(n).iter().filter(|p| p.down.is_none()).count();
    assert_eq!((ups(a), ups(b)), (1, 1));
    let c2 = put(&mut w, b, a, 16, 2);
    assert!(w.run_until_idle(limit(&w, 10)));
    assert_eq!(w.outcome(c2).map(|o| o.1), Some(SendOutcome::Delivered));
    assert_eq!(w.node(b).unwrap().stats().connects, 0, "B dialled nothing");
    assert_eq!(w.streams().stats().dials, 3);
    assert_no_zombie(&w, a);
    assert_no_zombie(&w, b);
}

/// LU-7646: two nodes dial each other at (nearly) the same instant, at every phase of the
/// handshake. The race rule (the higher NID's connections win) converges: every message is
/// delivered, each side holds exactly the typed set, the dials are bounded, and nothing
/// redials afterwards (a race that repeated would show as more dials).
#[test]
fn simultaneous_dials_converge_within_a_bound_lu_7646() {
    for seed in 0..16u64 {
        let (mut w, ids) = world(seed, &[1, 2]);
        let (a, b) = (ids[0], ids[1]);
        let c1 = put(&mut w, a, b, 8, 1);
        // B's send comes 0..200 µs later: its dials meet A's at a different step each seed.
        let lag = Duration::from_micros(w.rng().below(200));
        w.run_for(lag);
        let c2 = put(&mut w, b, a, 8, 2);
        assert!(w.run_until_idle(limit(&w, 60)), "seed {seed}");
        for c in [c1, c2] {
            assert_eq!(
                w.outcome(c).map(|o| o.1),
                Some(SendOutcome::Delivered),
                "seed {seed}"
            );
        }
        w.run_for(Duration::from_secs(300));
        assert_eq!(typed(&w, a, b), TYPED_SET, "seed {seed}");
        assert_eq!(typed(&w, b, a), TYPED_SET, "seed {seed}");
        let dials = w.streams().stats().dials;
        assert!(dials <= 6, "seed {seed}: {dials} dials");
        // The higher NID's (B's) connections are the ones kept.
        assert!(
            w.node(b).unwrap().conn_views().iter().all(|c| c.active)
                || w.node(a).unwrap().stats().refused_race == 0,
            "seed {seed}"
        );
        assert_no_zombie(&w, a);
        assert_no_zombie(&w, b);
        // Quiet: no dial after convergence.
        w.run_for(Duration::from_secs(300));
        assert_eq!(w.streams().stats().dials, dials, "seed {seed}: redialled");
    }
}

/// Four nodes all send to each other in the same instant: every pair converges on one typed
/// set, every message is delivered, dials bounded.
#[test]
fn an_all_to_all_dial_storm_converges() {
    let (mut w, ids) = world(3, &[1, 2, 3, 4]);
    let mut cookies = Vec::new();
    for &x in &ids {
        for &y in &ids {
            if x != y {
                cookies.push(put(&mut w, x, y, 32, u64::from(x.0 * 10 + y.0)));
            }
        }
    }
    assert!(w.run_until_idle(limit(&w, 60)));
    for c in &cookies {
        assert_eq!(w.outcome(*c).map(|o| o.1), Some(SendOutcome::Delivered));
    }
    for &x in &ids {
        assert_eq!(w.received(x).len(), 3);
        for &y in &ids {
            if x != y {
                assert_eq!(typed(&w, x, y), TYPED_SET);
            }
        }
        assert_no_zombie(&w, x);
    }
    // 6 pairs, one set of 3 each kept; races may cost at most one lost set per pair.
    assert!(
        w.streams().stats().dials <= 6 * 6,
        "{:?}",
        w.streams().stats()
    );
}

/// A reboot storm: one node of five reboots again and again with new incarnations (once for
/// longer than the peers' keepalive) while traffic flows both ways. Every message is
/// accounted for: it ends (delivered, or failed with a reason), nothing stays pending; none is
/// received twice; each one received was reported delivered by its sender; every message to a
/// node that never crashed and reported delivered was received (only bytes in the sockets of
/// a crashed host are lost, as with the kernel's socklnd, where LNet's own timeouts take
/// over). Afterwards the connections converge on the last incarnation (the typed set with each
/// peer, the same from both ends) and no node keeps a zombie connection to an old one.
#[test]
fn a_reboot_storm_accounts_for_every_message_and_leaves_no_zombie() {
    for seed in [5u64, 6] {
        let (mut w, ids) = world(seed, &[3, 1, 2, 4, 5]);
        let hub = ids[0];
        let others = &ids[1..];
        // (from, to, seq, cookie) of every message.
        let mut msgs: Vec<(NodeId, NodeId, u64, u64)> = Vec::new();
        let send = |w: &mut World<SockEngine>, msgs: &mut Vec<_>, from, to| {
            let seq = msgs.len() as u64 + 1;
            let c = put(w, from, to, 64, seq);
            msgs.push((from, to, seq, c));
        };
        for round in 0..6u64 {
            for &o in others {
                for _ in 0..3 {
                    send(&mut w, &mut msgs, o, hub);
                }
                send(&mut w, &mut msgs, hub, o);
            }
            let up_for = Duration::from_millis(200 + w.rng().below(2000));
            w.run_for(up_for);
            // Mostly short reboots; one outlives the peers' keepalive.
            let down_for = if round == 3 {
                Duration::from_secs(70)
            } else {
                Duration::from_millis(500 + w.rng().below(2500))
            };
            w.reboot(hub, down_for, 2000 + round);
            // Traffic toward it while it is down.
            for &o in others {
                send(&mut w, &mut msgs, o, hub);
            }
            // Back (a fresh incarnation) before the next round's traffic.
            w.run_for(down_for + Duration::from_millis(1));
        }
        // Let every deadline run out, then a last round must go through.
        w.run_for(Duration::from_secs(200));
        let first_last = msgs.len();
        for &o in others {
            send(&mut w, &mut msgs, o, hub);
            send(&mut w, &mut msgs, hub, o);
        }
        assert!(w.run_until_idle(limit(&w, 120)), "seed {seed}");
        assert_eq!(w.pending_sends(), 0, "seed {seed}");
        let received_once = |w: &World<SockEngine>, from: NodeId, to: NodeId, s: u64| {
            w.received(to)
                .iter()
                .filter(|m| m.from == w.nid_of(from) && match_bits(&m.hdr) == s)
                .count()
        };
        let (mut delivered, mut lost) = (0, 0);
        for (i, &(from, to, s, c)) in msgs.iter().enumerate() {
            let outcome = w.outcome(c).map(|o| o.1);
            let got = received_once(&w, from, to, s);
            assert!(got <= 1, "seed {seed}: message {s} received {got} times");
            match outcome {
                Some(SendOutcome::Delivered) => {
                    delivered += 1;
                    if got == 0 {
                        lost += 1;
                        assert_eq!(to, hub, "seed {seed}: {s} lost, not in a crash");
                    }
                }
                // Failed with a reason, lost with the node that sent it, or sent while that
                // node was down.
                Some(SendOutcome::Failed(_) | SendOutcome::LostInCrash | SendOutcome::NodeDown) => {
                    assert_eq!(got, 0, "seed {seed}: {s} failed yet received")
                }
                other => panic!("seed {seed}: message {s}: {other:?}"),
            }
            if i >= first_last {
                assert_eq!(outcome, Some(SendOutcome::Delivered), "seed {seed}");
                assert_eq!(got, 1, "seed {seed}: message {s} of the last round");
            }
        }
        let received: u64 = ids.iter().map(|&n| w.received_count(n)).sum();
        assert_eq!(
            received,
            delivered - lost,
            "seed {seed}: nothing unaccounted"
        );
        assert!(lost > 0, "seed {seed}: the storm cost nothing: not a storm");
        w.run_for(Duration::from_secs(120));
        for &o in others {
            assert_eq!(typed(&w, o, hub), TYPED_SET, "seed {seed}");
            assert_eq!(typed(&w, hub, o), TYPED_SET, "seed {seed}");
        }
        for &n in &ids {
            assert_no_zombie(&w, n);
        }
        // Each client saw the hub go down, and ends with it up.
        for &o in others {
            let ev: Vec<bool> = w
                .peer_events(o)
                .iter()
                .filter(|p| p.nid == w.nid_of(hub))
                .map(|p| p.down.is_none())
                .collect();
            assert!(ev.iter().filter(|up| !**up).count() >= 1, "seed {seed}");
            assert_eq!(ev.last(), Some(&true), "seed {seed}");
        }
        assert_eq!(w.stats().restarts, 6, "seed {seed}");
    }
}

/// A peer that crashes and stays down is found by keepalive (TCP's, and the LND's NOOP into a
/// dead host), long before a stack without keepalive would give up (15 minutes): the peer goes
/// down and nothing is kept for it. A message sent just after the crash went into a socket that
/// still looked fine (socklnd completes a send once its bytes are in the socket, as the kernel
/// does without zero-copy ACKs): it ends, not pending. One sent once the peer is down fails
/// with a reason: its dial finds nobody.
#[test]
fn a_crashed_peer_is_found_by_keepalive() {
    let (mut w, a, b) = connected_pair(7);
    let crashed_at = w.now();
    w.crash(b);
    let late = put(&mut w, a, b, 8, 2);
    w.run_for(Duration::from_secs(200));
    let down = w
        .peer_events(a)
        .iter()
        .find(|p| p.nid == w.nid_of(b) && p.down.is_some())
        .copied()
        .expect("B seen down");
    assert!(
        down.at < crashed_at + w.config().streams.retransmit_limit,
        "found by keepalive, not by the retransmission limit"
    );
    assert!(
        w.outcome(late).is_some(),
        "the send into the dead socket ended"
    );
    let after = put(&mut w, a, b, 8, 3);
    w.run_for(Duration::from_secs(120));
    assert!(matches!(
        w.outcome(after).map(|o| o.1),
        Some(SendOutcome::Failed(_))
    ));
    assert_eq!(w.pending_sends(), 0);
    assert_eq!(w.stream_ends_of(a), 0);
    assert_eq!(w.node(a).unwrap().conn_views().len(), 0);
    assert!(w.streams().stats().timeouts >= 1);
}

/// A peer that stops ACKing (its direction stalled: a send never leaves the window) holds
/// nothing for ever: the sender's TX-progress deadline closes the connections and fails what
/// was on them with a reason; once the stall ends, traffic flows again on new connections.
#[test]
fn a_peer_that_never_acks_is_bounded() {
    let (mut w, a, b) = connected_pair(8);
    w.stall_streams(a, b);
    let stuck: Vec<u64> = (0..10).map(|i| put(&mut w, a, b, 3000, 10 + i)).collect();
    let bulk = put_bulk(&mut w, a, b, SharedMem::new(1 << 20), 99);
    let timeout = w.node(a).unwrap().config().timeout;
    w.run_for(timeout * 3);
    assert_eq!(w.pending_sends(), 0, "everything finished");
    assert_all_failed(&w, &[stuck, vec![bulk]].concat());
    let st = w.node(a).unwrap().stats().clone();
    assert!(st.tx_stalls + w.streams().stats().timeouts >= 1, "{st:?}");
    w.unstall_streams(a, b);
    assert_flows_again(&mut w, a, b);
}

/// A peer that never reads (its process hung, its stack alive: windows fill, no TCP timeout
/// fires) holds nothing for ever: what is sent to it, a 1 MiB PUT and small messages behind
/// it, fails with a reason within the TX-progress deadline, and once it reads again traffic
/// flows on new connections.
#[test]
fn a_peer_that_never_reads_is_bounded() {
    let (mut w, a, b) = connected_pair(12);
    w.stop_reading(b, true);
    let mut cookies = vec![put_bulk(&mut w, a, b, SharedMem::new(1 << 20), 2)];
    cookies.extend((0..5).map(|i| put(&mut w, a, b, 2000, 10 + i)));
    let timeout = w.node(a).unwrap().config().timeout;
    w.run_for(timeout * 3);
    assert_eq!(w.pending_sends(), 0);
    assert_all_failed(&w, &cookies);
    assert!(w.node(a).unwrap().stats().tx_stalls >= 1);
    assert_eq!(
        w.streams().stats().timeouts,
        0,
        "no TCP timeout: the stack ACKs"
    );
    w.stop_reading(b, false);
    assert_flows_again(&mut w, a, b);
    assert_no_zombie(&w, a);
    assert_no_zombie(&w, b);
}

/// Partial reads and writes everywhere: 1 MiB PUTs both ways, interleaved with small
/// messages, land byte-exact in the memory LNet lends, each completion once with the right
/// length, and every small message comes up whole.
#[test]
fn partial_reads_and_writes_deliver_1mib_payloads_byte_exact() {
    const MIB: u32 = 1 << 20;
    let (mut w, ids) = world(9, &[1, 2]);
    w.stream_partial_io(0.5);
    let (a, b) = (ids[0], ids[1]);
    let mut sources = Vec::new();
    let mut small = Vec::new();
    for i in 0..3u64 {
        for (from, to) in [(a, b), (b, a)] {
            let src = SharedMem::new(MIB as usize);
            src.with(|m| {
                for (j, x) in m.iter_mut().enumerate() {
                    *x = (j as u64 * 131 + i * 7 + u64::from(from.0) * 3 + (j as u64 >> 12)) as u8;
                }
            });
            let seq = 100 * u64::from(from.0) + i;
            let c = put_bulk(&mut w, from, to, src.clone(), seq);
            sources.push((w.nid_of(from), seq, src, c));
            small.push(put(&mut w, from, to, 100 + i as usize * 900, 1000 + seq));
        }
    }
    let (mut seen, mut sinks) = ([0usize; 2], Vec::new());
    let end = limit(&w, 60);
    while w.now() < end {
        let got = play_lnet(&mut w, a, &mut seen[0], &mut sinks)
            + play_lnet(&mut w, b, &mut seen[1], &mut sinks);
        if got == 0 && w.is_idle() {
            break;
        }
        let step = w.now() + Duration::from_millis(5);
        w.run_until_idle(step);
    }
    assert!(w.is_idle());
    assert_eq!(sinks.len(), 6);
    for (from, seq, src, c) in &sources {
        assert_eq!(w.outcome(*c).map(|o| o.1), Some(SendOutcome::Delivered));
        let sink = sinks
            .iter()
            .find(|(f, s, _)| f == from && s == seq)
            .map(|(_, _, m)| m)
            .expect("a sink for each PUT");
        assert!(sink.to_vec() == src.to_vec(), "PUT {seq} byte-exact");
    }
    for &n in &[a, b] {
        let done: Vec<Result<u32, TxError>> = w
            .node_events(n)
            .iter()
            .filter_map(|(_, e)| match e {
                LndEvent::BulkDone { result, .. } => Some(*result),
                _ => None,
            })
            .collect();
        assert_eq!(done, vec![Ok(MIB); 3]);
        assert_eq!(w.received(n).len(), 3);
        for m in w.received(n) {
            assert_eq!(m.len as u32, m.hdr.payload_length);
        }
    }
    for c in small {
        assert_eq!(w.outcome(c).map(|o| o.1), Some(SendOutcome::Delivered));
    }
    assert!(w.streams().stats().bytes_delivered > 6 * u64::from(MIB));
}

/// A message to one's own NID never makes a connection (a self-connection would have to dodge
/// the race and duplicate rules): it is delivered locally, inline and bulk, at once.
#[test]
fn a_send_to_self_is_delivered_without_a_connection() {
    let (mut w, ids) = world(10, &[1]);
    let a = ids[0];
    let c1 = put(&mut w, a, a, 16, 1);
    let src = SharedMem::new(8192);
    src.with(|m| m.fill(0x5a));
    let c2 = put_bulk(&mut w, a, a, src, 2);
    let (mut seen, mut sinks) = (0, Vec::new());
    w.run_for(Duration::from_millis(1));
    play_lnet(&mut w, a, &mut seen, &mut sinks);
    assert!(w.run_until_idle(limit(&w, 10)));
    assert_eq!(w.outcome(c1).map(|o| o.1), Some(SendOutcome::Delivered));
    assert_eq!(w.outcome(c2).map(|o| o.1), Some(SendOutcome::Delivered));
    assert_eq!(w.received(a).len(), 1);
    assert_eq!(sinks.len(), 1);
    assert!(sinks[0].2.to_vec().iter().all(|x| *x == 0x5a));
    assert_eq!(w.streams().stats().dials, 0);
    assert_eq!(w.stream_ends_of(a), 0);
}

/// A graceful shutdown is seen by the peer at once (FIN at a message boundary: the peer goes
/// down as closed, not by timeout), and leaves no connection on either host.
#[test]
fn a_graceful_shutdown_is_seen_by_the_peer_at_once() {
    let (mut w, a, b) = connected_pair(11);
    w.shutdown(b);
    w.run_for(Duration::from_millis(10));
    assert_eq!(w.node_state(b), NodeState::Stopped);
    let down: Vec<DownReason> = w.peer_events(a).iter().filter_map(|p| p.down).collect();
    assert_eq!(down, vec![DownReason::Closed]);
    w.run_for(Duration::from_secs(3));
    assert_eq!(w.stream_ends_of(a) + w.stream_ends_of(b), 0);
    assert_eq!(w.node(a).unwrap().conn_views().len(), 0);
}

/// A world of socklnd engines replays from its seed: a short storm with partial I/O run twice
/// gives the same outcomes at the same times and the same counters; another seed another run.
#[test]
fn a_socklnd_world_is_a_function_of_its_seed() {
    let run = |seed: u64| {
        let (mut w, ids) = world(seed, &[2, 1, 3]);
        w.stream_partial_io(0.3);
        let mut cookies = Vec::new();
        for i in 0..20u64 {
            let (from, to) = (ids[(i % 3) as usize], ids[((i + 1) % 3) as usize]);
            cookies.push(put(&mut w, from, to, 100 + 500 * i as usize, i));
            let d = Duration::from_micros(w.rng().below(300));
            w.run_for(d);
            if i == 10 {
                w.reboot(ids[0], Duration::from_millis(500), 7);
            }
        }
        assert!(w.run_until_idle(limit(&w, 120)));
        let outcomes: Vec<_> = cookies.iter().map(|c| w.outcome(*c)).collect();
        (outcomes, w.stats().clone(), w.streams().stats().clone())
    };
    let a = run(21);
    assert_eq!(a, run(21));
    assert_ne!(a.0, run(22).0);
}
