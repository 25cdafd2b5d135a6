//! o2iblnd's conns_per_peer: an NI opens that many connections to a peer, one after another,
//! and spreads messages over their credits. From the review of the change: the reproduction of
//! its finding (extra connections never opened after a hedged first connect) and the checks
//! that found nothing (storms of faults with conns_per_peer on one or both sides, kernel race
//! policies among them; no connect loop against a peer capping our connections; back to
//! conns_per_peer after a reboot and a partition). `NSEEDS=N` runs more storm seeds.
//!
//! As in o2iblnd, the extra connections are opened only by an NI whose own connect came up:
//! one that the peer connected to first uses the peer's connections and opens none of its own.

use std::collections::HashSet;
use ulnet_tests::{send_put, undelivered};

use lnd::engine::{ConnState, EndpointConfig, RacePolicy, Tunables};
use lnd::sim::{NodeId, SendOutcome, SimConfig, World};
use lnd::time::Duration;
use lnd::wire::LnetBody;

const A: &str = "10.0.0.1@o2ib";
const B: &str = "10.0.0.2@o2ib";

use testkit::nid;

fn tun(cpp: u16) -> Tunables {
    Tunables {
        conns_per_peer: cpp,
        ..Tunables::default()
    }
}

fn node(w: &mut World, s: &str, inc: u64, cpp: u16, policy: RacePolicy) -> NodeId {
    node_with(w, s, inc, tun(cpp), policy)
}

fn node_with(w: &mut World, s: &str, inc: u64, tunables: Tunables, policy: RacePolicy) -> NodeId {
    w.add_node(EndpointConfig {
        tunables,
        race_policy: policy,
        ..EndpointConfig::new(nid(s), inc)
    })
}

/// Fails the test with the first dozen of the `problems` the seeds found, if any.
fn assert_no_problems(problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{} problems: {:#?}",
        problems.len(),
        &problems[..problems.len().min(12)]
    );
}

/// Established connections `n` opened itself to `to`.
fn ours(w: &World, n: NodeId, to: NodeId) -> usize {
    let to = w.nid_of(to);
    w.endpoint(n).map_or(0, |e| {
        e.conns()
            .filter(|c| c.peer == to && c.active && c.state == ConnState::Established)
            .count()
    })
}

/// Review finding: a first connect that needed the hedge leaves a zombie (the loser of the
/// pair) at the moment the winner is established, and `maybe_add_conn` returns on
/// `zombies > 0`. Nothing calls it again when the zombie is reaped, so the NI stays at one
/// connection to the peer for as long as that one lives.
#[test]
fn hedged_first_connect_never_opens_the_extra_connections() {
    let mut w = World::new(SimConfig::with_seed(3));
    let a = node(&mut w, A, 11, 3, RacePolicy::Ulnet);
    let b = node(&mut w, B, 22, 1, RacePolicy::Ulnet);
    w.stuck_next_connect(a, nid(B));
    let c = send_put(&mut w, a, b, 1);
    w.run_for(Duration::from_secs(3));
    assert_eq!(w.outcome(c).map(|(_, o)| o), Some(SendOutcome::Delivered));
    for i in 0..50 {
        send_put(&mut w, a, b, 100 + i);
    }
    w.run_for(Duration::from_secs(30));
    assert_eq!(ours(&w, a, b), 3, "conns_per_peer 3 after a hedged connect");
}

/// Checked, not a finding: the extra connect sits in `peer.active`; if it is stuck when the
/// first connection goes, the reap of that connection's zombie calls `maybe_hedge`, which
/// starts a second connect at once, so new messages do not wait for the stuck one's deadline.
#[test]
fn stuck_extra_connect_does_not_delay_the_reconnect() {
    for cpp in [1u16, 2] {
        let mut w = World::new(SimConfig::with_seed(5));
        let a = node(&mut w, A, 11, cpp, RacePolicy::Ulnet);
        let b = node(&mut w, B, 22, 1, RacePolicy::Ulnet);
        let c = send_put(&mut w, a, b, 1);
        // A's connect #1 is already under way: the next one (the extra) is stuck.
        w.stuck_next_connect(a, nid(B));
        w.run_for(Duration::from_millis(10));
        assert!(w.outcome(c).unwrap().1.is_delivered());
        w.run_for(Duration::from_secs(2));
        // A's first connection goes (a protocol error on it, say).
        w.with_endpoint(a, |ep, now| {
            let conn = ep
                .conns()
                .find(|c| c.state == ConnState::Established && c.active)
                .expect("connected")
                .id;
            ep.handle_recv(now, conn, 0, &[0u8; 8]);
        });
        let t0 = w.now();
        let m = send_put(&mut w, a, b, 2);
        w.run_for(Duration::from_secs(30));
        let (at, o) = w.outcome(m).expect("an outcome");
        eprintln!("cpp {cpp}: {o:?} after {:?}", at - t0);
        assert!(o.is_delivered(), "cpp {cpp}: {o:?}");
        assert!(
            at - t0 < Duration::from_secs(3),
            "cpp {cpp}: a message after losing the connection took {:?}",
            at - t0
        );
    }
}

/// A storm of faults between two nodes, both with conns_per_peer: every message has an
/// outcome, every one counted delivered was received, no more than conns_per_peer of ours.
fn storm(seed: u64, cpa: u16, cpb: u16, pa: RacePolicy, pb: RacePolicy) -> Vec<String> {
    let stuck = [pa, pb]
        .iter()
        .all(|p| matches!(p, RacePolicy::Ulnet | RacePolicy::Lu17480));
    let mut bad = Vec::new();
    let mut w = World::new(SimConfig::with_seed(seed));
    w.cm_delay(Duration::from_millis(3));
    let a = node(&mut w, A, 11, cpa, pa);
    let b = node(&mut w, B, 22, cpb, pb);
    let mut sent: Vec<(u64, NodeId, u64)> = Vec::new();
    let mut bits = 0u64;
    let mut inc = 100u64;
    let mut max_ours = (0usize, 0usize);
    let mut log: Vec<String> = Vec::new();
    let mut crashes: Vec<(NodeId, lnd::time::Instant)> = Vec::new();
    // LOSSY=1 adds cm_loss, which drops RTUs too: the known early-data loss of a passive
    // connection whose RTU is lost (no COMM_EST modelled; see CONTRIBUTING.md) would then show.
    let lossy = std::env::var("LOSSY").is_ok();
    let mut cuts: Vec<lnd::time::Instant> = Vec::new();
    for round in 0..400u32 {
        let r = w.rng().below(100);
        match r {
            0 => {
                let p = w.partition(&[a], &[b]);
                let d = Duration::from_millis(200 + w.rng().below(2500));
                log.push(format!("{} partition {:?} bits {bits}", w.now(), d));
                cuts.push(w.now());
                w.run_for(d);
                w.heal_partition(p);
            }
            1 => {
                inc += 1;
                let n = if w.rng().below(2) == 0 { a } else { b };
                let d = Duration::from_millis(w.rng().below(300));
                log.push(format!(
                    "{} reboot {:?} for {:?} bits {bits}",
                    w.now(),
                    n,
                    d
                ));
                crashes.push((n, w.now()));
                cuts.push(w.now());
                w.reboot(n, d, inc);
            }
            // Stuck connects wedge Lustre28/Lu7646 by design (LU-7646), whatever conns_per_peer.
            2 if stuck => {
                let n = if w.rng().below(2) == 0 { a } else { b };
                let to = if n == a { nid(B) } else { nid(A) };
                log.push(format!("{} stuck {:?} bits {bits}", w.now(), n));
                w.stuck_next_connect(n, to);
            }
            3 if lossy => {
                log.push(format!("{} cmloss on bits {bits}", w.now()));
                w.cm_loss(0.2)
            }
            4 => {
                log.push(format!("{} cmloss off bits {bits}", w.now()));
                w.cm_loss(0.0)
            }
            _ => {}
        }
        let k = w.rng().below(12);
        for _ in 0..k {
            bits += 1;
            let (f, t) = if w.rng().below(2) == 0 {
                (a, b)
            } else {
                (b, a)
            };
            let c = send_put(&mut w, f, t, bits);
            sent.push((c, t, bits));
        }
        let d = Duration::from_micros(w.rng().below(20_000));
        w.run_for(d);
        max_ours.0 = max_ours.0.max(ours(&w, a, b));
        max_ours.1 = max_ours.1.max(ours(&w, b, a));
        let _ = round;
    }
    w.cm_loss(0.0);
    w.heal();
    w.run_for(Duration::from_secs(120));
    if w.pending_sends() != 0 {
        bad.push(format!(
            "seed {seed}: {} sends without outcome",
            w.pending_sends()
        ));
    }
    if w.invalid_transitions() != 0 {
        bad.push(format!("seed {seed}: invalid transitions"));
    }
    if w.stats().unexpected_send_done != 0 {
        bad.push(format!("seed {seed}: unexpected send done"));
    }
    let got = |n: NodeId| -> HashSet<u64> {
        w.received(n)
            .iter()
            .filter_map(|m| match m.hdr.body {
                LnetBody::Put { match_bits, .. } => Some(match_bits),
                _ => None,
            })
            .collect()
    };
    let (ga, gb) = (got(a), got(b));
    let mut lost = Vec::new();
    for &(c, t, bits) in &sent {
        if let Some((at, SendOutcome::Delivered)) = w.outcome(c) {
            let g = if t == a { &ga } else { &gb };
            // The receiver crashing after the delivery loses what its LND had not handed up.
            let crashed = crashes.iter().any(|&(n, ct)| {
                n == t && ct >= at - Duration::from_millis(1) && ct <= at + Duration::from_secs(15)
            });
            // Known and older than this change: data that beats the passive side's ESTABLISHED
            // is dropped with the handshake if the RTU is then cut (a partition or a crash).
            let cut = std::env::var("STRICT").is_err()
                && cuts.iter().any(|&ct| {
                    ct + Duration::from_millis(1100) >= at && ct <= at + Duration::from_millis(10)
                });
            if !g.contains(&bits) && !crashed && !cut {
                lost.push(bits);
            }
        }
    }
    if !lost.is_empty() && std::env::var("DBG").is_ok() {
        for l in &log {
            eprintln!("{l}");
        }
        for &(c, t, bits2) in &sent {
            if lost.contains(&bits2) {
                let r = w.send_record(c).unwrap();
                eprintln!(
                    "lost {bits2} to {t:?} queued {} done {:?}",
                    r.queued_at, r.done
                );
            }
        }
    }
    if !lost.is_empty() {
        bad.push(format!(
            "seed {seed}: {} delivered but never received: {:?}",
            lost.len(),
            &lost[..lost.len().min(5)]
        ));
    }
    if max_ours.0 > usize::from(cpa) || max_ours.1 > usize::from(cpb) {
        bad.push(format!("seed {seed}: ours peaked at {max_ours:?}"));
    }
    // After quiet traffic at the end, both can still talk.
    let c1 = send_put(&mut w, a, b, 1 << 40);
    let c2 = send_put(&mut w, b, a, 1 << 41);
    w.run_for(Duration::from_secs(60));
    for c in [c1, c2] {
        let o = w.outcome(c).map(|(_, o)| o);
        if o != Some(SendOutcome::Delivered) {
            bad.push(format!("seed {seed}: final message {o:?}"));
        }
    }
    let connects = w.endpoint(a).map_or(0, |e| e.stats().connects)
        + w.endpoint(b).map_or(0, |e| e.stats().connects);
    if connects > 2000 {
        bad.push(format!("seed {seed}: {connects} connects"));
    }
    bad
}

fn run_storms(cpa: u16, cpb: u16, pa: RacePolicy, pb: RacePolicy, seeds: std::ops::Range<u64>) {
    let n: u64 = std::env::var("NSEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seeds.end);
    let seeds = seeds.start..n;
    let mut bad = Vec::new();
    for seed in seeds {
        bad.extend(storm(seed, cpa, cpb, pa, pb));
    }
    assert_no_problems(&bad);
}

/// One storm test per row: conns_per_peer of A and B, A's and B's race policies; seeds 0..8
/// (`NSEEDS` for more).
macro_rules! storms {
    ($($name:ident: $cpa:expr, $cpb:expr, $pa:ident, $pb:ident;)*) => {$(
        #[test]
        fn $name() {
            run_storms($cpa, $cpb, RacePolicy::$pa, RacePolicy::$pb, 0..8);
        }
    )*};
}

storms! {
    storm_cpp1_baseline: 1, 1, Ulnet, Ulnet;
    storm_cpp3_one_side: 3, 1, Ulnet, Ulnet;
    storm_cpp_both_sides: 3, 4, Ulnet, Ulnet;
    storm_cpp_both_sides_kernel_peer: 4, 2, Ulnet, Lu17480;
    storm_cpp_lustre28_peer: 3, 1, Ulnet, Lustre28;
    storm_cpp_both_lu7646: 2, 3, Lu7646, Lu7646;
    storm_cpp_max: 127, 127, Ulnet, Ulnet;
    storm_cpp1_lustre28_peer: 1, 1, Ulnet, Lustre28;
    storm_cpp1_both_lu7646: 1, 1, Lu7646, Lu7646;
}

/// No faults, both sides with conns_per_peer, small credits and slow upper layers so that
/// probation holds happen: every message delivered, no timeouts, bounded connects.
#[test]
fn no_faults_probation_heavy_everything_delivered() {
    let mut bad = Vec::new();
    for seed in 0..40u64 {
        for (cpa, cpb, pa, pb) in [
            (3u16, 4u16, RacePolicy::Ulnet, RacePolicy::Ulnet),
            (4, 1, RacePolicy::Ulnet, RacePolicy::Lu17480),
            (2, 2, RacePolicy::Lu17480, RacePolicy::Lu17480),
            (1, 1, RacePolicy::Ulnet, RacePolicy::Ulnet),
        ] {
            let mut w = World::new(SimConfig::with_seed(seed));
            w.cm_delay(Duration::from_millis(2));
            let t = |cpp| Tunables {
                peer_credits: 2,
                conns_per_peer: cpp,
                ..Tunables::default()
            };
            let a = node_with(&mut w, A, 11, t(cpa), pa);
            let b = node_with(&mut w, B, 22, t(cpb), pb);
            w.set_recv_delay(a, Duration::from_millis(20));
            w.set_recv_delay(b, Duration::from_millis(20));
            let mut cookies = Vec::new();
            for i in 0..300u64 {
                cookies.push(send_put(&mut w, a, b, i));
                cookies.push(send_put(&mut w, b, a, 10_000 + i));
                let d = Duration::from_micros(w.rng().below(300));
                w.run_for(d);
            }
            w.run_for(Duration::from_secs(60));
            let ctx = format!("seed {seed} cpp {cpa}/{cpb} {pa:?}/{pb:?}");
            let failed = cookies
                .iter()
                .filter(|&&c| w.outcome(c).map(|(_, o)| o) != Some(SendOutcome::Delivered))
                .count();
            if failed > 0 {
                let ex = cookies
                    .iter()
                    .find_map(|&c| w.outcome(c).filter(|(_, o)| !o.is_delivered()));
                bad.push(format!("{ctx}: {failed} not delivered, e.g. {ex:?}"));
            }
            let (ra, rb) = (w.received_count(a), w.received_count(b));
            if ra != 300 || rb != 300 {
                bad.push(format!("{ctx}: received {ra}/{rb}"));
            }
            let ca = w.endpoint(a).unwrap().stats().connects;
            let cb = w.endpoint(b).unwrap().stats().connects;
            if ca + cb > u64::from(cpa + cpb) + 6 {
                bad.push(format!("{ctx}: connects {ca}+{cb}"));
            }
            if ours(&w, a, b) > usize::from(cpa) || ours(&w, b, a) > usize::from(cpb) {
                bad.push(format!("{ctx}: ours {} {}", ours(&w, a, b), ours(&w, b, a)));
            }
            if std::env::var("SHOW").is_ok() {
                eprintln!(
                    "{ctx}: ours {} {} connects {ca} {cb}",
                    ours(&w, a, b),
                    ours(&w, b, a)
                );
            }
        }
    }
    assert_no_problems(&bad);
}

/// After a peer reboot or a partition, the NI gets back to conns_per_peer of its own.
#[test]
fn back_to_cpp_after_reboot_and_partition() {
    let mut bad = Vec::new();
    for seed in 0..50u64 {
        for what in ["reboot", "partition", "mq"] {
            let mut w = World::new(SimConfig::with_seed(seed));
            let ta = Tunables {
                conns_per_peer: 3,
                peer_credits: if what == "mq" { 16 } else { 8 },
                ..Tunables::default()
            };
            let a = w.add_node(EndpointConfig {
                tunables: ta,
                ..EndpointConfig::new(nid(A), 11)
            });
            let b = w.add_node(EndpointConfig::new(nid(B), 22));
            for i in 0..20 {
                send_put(&mut w, a, b, i);
            }
            w.run_for(Duration::from_secs(1));
            let before = ours(&w, a, b);
            match what {
                "reboot" => w.reboot(b, Duration::from_millis(50), 23),
                "partition" => {
                    let p = w.partition(&[a], &[b]);
                    for i in 0..20 {
                        send_put(&mut w, a, b, 100 + i);
                    }
                    w.run_for(Duration::from_secs(3));
                    w.heal_partition(p);
                }
                _ => {}
            }
            // Messages onto the connections still believed up find them dead (and fail).
            for i in 0..10 {
                send_put(&mut w, a, b, 500 + i);
            }
            w.run_for(Duration::from_secs(5));
            let mut cs = Vec::new();
            for i in 0..50 {
                cs.push(send_put(&mut w, a, b, 1000 + i));
            }
            w.run_for(Duration::from_secs(60));
            let after = ours(&w, a, b);
            let und = undelivered(&w, &cs);
            let pb = w.endpoint(b).unwrap().peer(nid(A)).map(|p| p.established);
            if before != 3 || after != 3 || und > 0 {
                bad.push(format!("seed {seed} {what}: ours before {before} after {after}, B has {pb:?}, {und} undelivered"));
            }
        }
    }
    assert_no_problems(&bad);
}

/// Checked, not a finding: a peer that keeps fewer of our connections than we want (B's
/// MAX_CONNS_PER_PEER 127 against conns_per_peer 130 set through the API, as a ulnet peer from
/// main, which keeps 8, against 9..=127) closes our oldest for each new one; the loop this could
/// make stops because the closed connection's zombie makes `maybe_add_conn` return.
#[test]
fn peer_capping_our_connections_does_not_loop() {
    let mut bad = Vec::new();
    for seed in 0..4u64 {
        let mut w = World::new(SimConfig::with_seed(seed));
        if seed % 2 == 1 {
            w.cm_delay(Duration::from_micros(100));
        }
        let a = node(&mut w, A, 11, 130, RacePolicy::Ulnet);
        let b = node(&mut w, B, 22, 1, RacePolicy::Ulnet);
        let mut cs = Vec::new();
        for i in 0..2000u64 {
            cs.push(send_put(&mut w, a, b, i));
            w.run_for(Duration::from_millis(5));
        }
        w.run_for(Duration::from_secs(5));
        let connects = w.endpoint(a).unwrap().stats().connects;
        let failed = undelivered(&w, &cs);
        let pb = w.endpoint(b).unwrap().peer(nid(A)).map(|p| p.established);
        eprintln!(
            "seed {seed}: A connects {connects}, failed {failed}, ours {} B has {pb:?}",
            ours(&w, a, b)
        );
        if connects > 130 || failed > 0 {
            bad.push((seed, connects, failed));
        }
    }
    assert!(bad.is_empty(), "(seed, connects in 15 s, failed): {bad:?}");
}
