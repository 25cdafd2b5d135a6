//! Hostile senders of bulk PUTs through a router (issue 31): a peer that writes less than it
//! announced must never make the router pass on what a buffer's previous user left there, and
//! peers that take large buffers and never fill them must not stop other peers' bulk.
//!
//! This fabric cannot see writes land (as verbs), so the router scrubs its buffers here; the
//! tcp fabric's own check (a short PUT_DONE fails) is tested in lnd's tcp tests.

use super::routing::{give_bulk_buffers, node, route};
use super::*;
use crate::BulkScrub;

const A: &str = "10.0.0.1@o2ib";
const B: &str = "10.0.0.2@o2ib";
const SERVER: &str = "10.1.0.2@o2ib1";
const R_A: &str = "10.0.0.254@o2ib";
const R_B: &str = "10.1.0.254@o2ib1";
const MIB: usize = 1 << 20;

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8 ^ seed as u8)
        .collect()
}

/// The PUT results node `n` reported since the last look, by message.
fn done_puts(f: &mut Fabric, n: usize) -> Vec<(MsgId, Result<(), LnetError>)> {
    f.take_events(n)
        .into_iter()
        .filter_map(|(_, e)| match e {
            LnetEvent::PutDone { id, result } => Some((id, result)),
            _ => None,
        })
        .collect()
}

/// Client A, then client B, each PUT 1 MiB through a router with one large buffer; B writes
/// only the first half of its data (its PUT_DONE claims it all). What reaches the server for
/// B: its half, then what the router's buffer held after A, which is A's data unless scrubbed.
fn short_put_after_another(scrub: BulkScrub) -> (Vec<u8>, Vec<u8>, u64) {
    let cfgs = vec![
        node(&[A], &[route("o2ib1", R_A)], false, 10),
        node(&[B], &[route("o2ib1", R_A)], false, 20),
        node(&[SERVER], &[route("o2ib", R_B)], false, 30),
        {
            let mut r = node(&[R_A, R_B], &[], true, 40);
            r.routing.scrub = scrub;
            r
        },
    ];
    let mut f = Fabric::from_configs(cfgs);
    give_bulk_buffers(&mut f, &[3], 1);
    f.short_writes.push(1);
    let server = nid(SERVER);
    let a_bytes = pattern(0xa, MIB);
    let b_bytes = pattern(0xb, MIB);
    let a_src = f.register(0, a_bytes.clone());
    let b_src = f.register(1, b_bytes.clone());
    let sinks: Vec<_> = (0..2).map(|_| f.register(2, vec![0xee; MIB])).collect();
    for (i, s) in sinks.iter().enumerate() {
        let buf = BulkBuf::new(NiIndex(0), s, 0, MIB as u32).unwrap();
        f.nodes[2].post_sink(4, i as u64, buf);
    }
    for (n, src, bits) in [(0usize, &a_src, 0u64), (1, &b_src, 1)] {
        let now = f.now;
        let buf = BulkBuf::new(NiIndex(0), src, 0, MIB as u32).unwrap();
        f.nodes[n].send_put_bulk(now, server, 4, bits, buf).unwrap();
        f.run_for(Duration::from_secs(2));
        assert_eq!(
            done_puts(&mut f, n)
                .into_iter()
                .map(|d| d.1)
                .collect::<Vec<_>>(),
            vec![Ok(())],
            "client {n}'s PUT"
        );
    }
    assert_eq!(f.region(2, &sinks[0]), a_bytes, "A's PUT arrives whole");
    let b_landed = f.region(2, &sinks[1]);
    let scrubbed = f.nodes[3].routing_info().stats.scrubbed;
    (b_landed, a_bytes, scrubbed)
}

/// The router's buffer is scrubbed before B is lent it: what B did not write reaches the
/// server as zeros, never as A's bytes. Without scrubbing (on this fabric, which cannot see
/// writes) A's second half would reach the server as B's: what this guards against.
#[test]
fn a_short_written_put_never_carries_the_previous_users_bytes() {
    let (b_landed, a_bytes, scrubbed) = short_put_after_another(BulkScrub::Auto);
    let half = MIB / 2;
    assert_eq!(b_landed[..half], pattern(0xb, MIB)[..half], "B's own half");
    assert!(
        b_landed[half..].iter().all(|&x| x == 0),
        "what B did not write reaches the server as zeros"
    );
    assert!(scrubbed >= 1, "scrubbed {scrubbed}");

    let (b_landed, a_bytes_off, scrubbed) = short_put_after_another(BulkScrub::Off);
    assert_eq!(a_bytes, a_bytes_off);
    assert_eq!(scrubbed, 0);
    assert_eq!(
        b_landed[half..],
        a_bytes[half..],
        "without scrubbing, A's bytes go out as B's"
    );
}

/// What one side of the attack test saw.
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    ok: u64,
    failed: u64,
    /// PUTs that completed after the attack began.
    ok_under_attack: u64,
}

/// 64 fresh NIDs take every large buffer they are lent and never fill it, asking again after
/// every failure, while client A streams 256 KiB PUTs through the router; client B, a NID the
/// router has never seen, starts during the attack. Both keep moving data, every byte lands
/// as sent, and the router counts what it reclaimed and refused. Without the grant timeout,
/// strikes and the unproven share, the attackers pinned every buffer for the LND timeout
/// (50 s) and nothing else crossed.
#[test]
fn sixty_four_fresh_nids_pinning_large_buffers_do_not_stop_others_bulk() {
    const ATTACKERS: usize = 64;
    const BUFFERS: usize = 64;
    const LEN: usize = 64 * 1024;
    const WINDOW: usize = 4;
    let attacker_nids: Vec<String> = (0..ATTACKERS)
        .map(|i| format!("10.0.2.{}@o2ib", i + 1))
        .collect();
    let mut cfgs = vec![
        node(&[A], &[route("o2ib1", R_A)], false, 10),
        node(&[B], &[route("o2ib1", R_A)], false, 20),
        node(&[SERVER], &[route("o2ib", R_B)], false, 30),
        node(&[R_A, R_B], &[], true, 40),
    ];
    for (i, a) in attacker_nids.iter().enumerate() {
        cfgs.push(node(&[a], &[route("o2ib1", R_A)], false, 1000 + i as u64));
    }
    let mut f = Fabric::from_configs(cfgs);
    let router = 3;
    give_bulk_buffers(&mut f, &[router], BUFFERS);
    let attackers: Vec<usize> = (4..4 + ATTACKERS).collect();
    f.stalled_writes.extend(attackers.iter().copied());
    let server = nid(SERVER);

    // Sources: each legitimate client's pattern; each attacker a 1 MiB buffer.
    let want: Vec<Vec<u8>> = (0..2).map(|c| pattern(c as u32 + 1, LEN)).collect();
    let srcs: Vec<_> = (0..2).map(|c| f.register(c, want[c].clone())).collect();
    let attacker_src: Vec<_> = attackers
        .iter()
        .map(|&n| f.register(n, vec![0x66; MIB]))
        .collect();
    // The server's sinks, by match bits: (client, sink).
    let mut sinks: HashMap<u64, (usize, lnd::fabric::Registration)> = HashMap::new();
    let mut inflight: [Vec<MsgId>; 2] = [Vec::new(), Vec::new()];
    let mut tally = [Tally::default(), Tally::default()];
    let mut attacker_busy = [false; ATTACKERS];
    let mut next_bits = 0u64;
    let mut bad_bytes = 0u64;
    let mut attacks = 0u64;

    let start = f.now;
    let attack_at = start + Duration::from_secs(1);
    let b_at = start + Duration::from_secs(3);
    let end = start + Duration::from_secs(12);
    while f.now < end {
        let now = f.now;
        for c in 0..2 {
            if c == 1 && now < b_at {
                continue;
            }
            while inflight[c].len() < WINDOW {
                let sink = f.register(2, vec![0xee; LEN]);
                let bits = next_bits;
                next_bits += 1;
                let buf = BulkBuf::new(NiIndex(0), &sink, 0, LEN as u32).unwrap();
                f.nodes[2].post_sink(4, bits, buf);
                sinks.insert(bits, (c, sink));
                let src = BulkBuf::new(NiIndex(0), &srcs[c], 0, LEN as u32).unwrap();
                let id = f.nodes[c].send_put_bulk(now, server, 4, bits, src).unwrap();
                inflight[c].push(id);
                tally[c].sent += 1;
            }
        }
        if now >= attack_at {
            for (i, &n) in attackers.iter().enumerate() {
                if !attacker_busy[i] {
                    let src = BulkBuf::new(NiIndex(0), &attacker_src[i], 0, MIB as u32).unwrap();
                    // Matched by nothing at the server, should it ever get there. (Refused
                    // at once while its route is still being checked: tried again later.)
                    if f.nodes[n].send_put_bulk(now, server, 9, 0, src).is_ok() {
                        attacker_busy[i] = true;
                        attacks += 1;
                    }
                }
            }
        }
        f.run_for(Duration::from_millis(50));
        for c in 0..2 {
            for (id, result) in done_puts(&mut f, c) {
                inflight[c].retain(|&x| x != id);
                match result {
                    Ok(()) => {
                        tally[c].ok += 1;
                        if f.now > attack_at + Duration::from_secs(1) {
                            tally[c].ok_under_attack += 1;
                        }
                    }
                    Err(_) => tally[c].failed += 1,
                }
            }
        }
        for (i, &n) in attackers.iter().enumerate() {
            if !done_puts(&mut f, n).is_empty() {
                attacker_busy[i] = false;
            }
        }
        // Every PUT that reached the server holds exactly what its client sent.
        for (_, e) in f.take_events(2) {
            if let LnetEvent::BulkPut {
                match_bits, result, ..
            } = e
            {
                let (c, sink) = sinks.remove(&match_bits).expect("a sink of ours");
                assert_eq!(result, Ok(LEN as u32), "PUT {match_bits}");
                let got = f.region(2, &sink);
                bad_bytes += got.iter().zip(&want[c]).filter(|(x, y)| *x != *y).count() as u64;
            }
        }
    }
    let books = f.nodes[router].routing_info().stats;
    let reclaimed = f.nodes[router]
        .endpoint(NiIndex(0))
        .unwrap()
        .stats()
        .grants_reclaimed;
    let summary = format!("{tally:?}, {attacks} attacks, reclaimed {reclaimed}, books {books:?}");
    assert_eq!(bad_bytes, 0, "{summary}");
    assert_eq!(tally[0].failed + tally[1].failed, 0, "{summary}");
    // 18 s under attack: A kept moving, B got in.
    assert!(tally[0].ok_under_attack >= 100, "{summary}");
    assert!(tally[1].ok >= 50, "{summary}");
    assert!(reclaimed >= ATTACKERS as u64, "{summary}");
    assert!(
        books.dropped_for(FwdDrop::BulkStalled) >= ATTACKERS as u64,
        "{summary}"
    );
    assert!(books.dropped_for(FwdDrop::BulkRefused) > 0, "{summary}");
    assert!(books.waited_unproven > 0, "{summary}");
    assert!(books.reconciles(), "{summary}");
}

/// A sender that alternates whole PUTs with stalled ones keeps its strikes: a whole PUT takes
/// one strike away, not all, so after two stalls, a whole PUT and a third stall it is refused
/// for two grant timeouts (its second strike), not one: a PUT 1.5 s after the third reclaim is
/// refused. Had the whole PUT cleared every strike, it would be taken. (On this fabric, which
/// cannot see writes, a reclaim also closes the connection, so the sender's route through the
/// router is down until its next ping of the router: PUTs are retried until the route takes
/// them.)
#[test]
fn a_whole_put_takes_one_strike_away_not_all() {
    let cfgs = vec![
        node(&[A], &[route("o2ib1", R_A)], false, 10),
        node(&[SERVER], &[route("o2ib", R_B)], false, 30),
        node(&[R_A, R_B], &[], true, 40),
    ];
    let mut f = Fabric::from_configs(cfgs);
    give_bulk_buffers(&mut f, &[2], 4);
    let server = nid(SERVER);
    let src = f.register(0, pattern(7, 8192));
    let count = |f: &Fabric, why| f.nodes[2].routing_info().stats.dropped_for(why);
    // Steps virtual time until `cond` holds (at most 20 s).
    let until = |f: &mut Fabric, cond: &dyn Fn(&Fabric) -> bool| {
        for _ in 0..400 {
            if cond(f) {
                return;
            }
            f.run_for(Duration::from_millis(50));
        }
        panic!("not within 20 s");
    };
    let mut bits = 0u64;
    // Sends one PUT of A's, whole or stalled, once its route takes it.
    let mut put = |f: &mut Fabric, stalled: bool| {
        f.stalled_writes.retain(|&n| n != 0);
        if stalled {
            f.stalled_writes.push(0);
        }
        bits += 1;
        let b = f.bulk_buf(1, vec![0; 8192]);
        f.nodes[1].post_sink(4, bits, b);
        let b = BulkBuf::new(NiIndex(0), &src, 0, 8192).unwrap();
        for _ in 0..400 {
            let now = f.now;
            if f.nodes[0]
                .send_put_bulk(now, server, 4, bits, b.clone())
                .is_ok()
            {
                return;
            }
            f.run_for(Duration::from_millis(50));
        }
        panic!("the route never took PUT {bits}");
    };
    // Two stalls, each reclaimed (strikes 1 then 2); the second once the first's refusal
    // (1 s) is over.
    put(&mut f, true);
    until(&mut f, &|f| count(f, FwdDrop::BulkStalled) == 1);
    f.run_for(Duration::from_millis(1100));
    put(&mut f, true);
    until(&mut f, &|f| count(f, FwdDrop::BulkStalled) == 2);
    // Once the second's refusal (2 s) is over, a whole PUT: forwarded.
    f.run_for(Duration::from_millis(2100));
    let forwarded = f.nodes[2].routing_info().stats.forwarded;
    put(&mut f, false);
    until(&mut f, &|f| {
        f.nodes[2].routing_info().stats.forwarded > forwarded
    });
    assert_eq!(count(&f, FwdDrop::BulkRefused), 0);
    // A third stall: strikes 2 - 1 + 1 = 2, so refused for 2 s from its reclaim.
    put(&mut f, true);
    until(&mut f, &|f| count(f, FwdDrop::BulkStalled) == 3);
    f.run_for(Duration::from_millis(1500));
    put(&mut f, false);
    f.run_for(Duration::from_millis(200));
    assert_eq!(
        count(&f, FwdDrop::BulkRefused),
        1,
        "refused 1.5 s after the reclaim"
    );
    assert_eq!(count(&f, FwdDrop::BulkStalled), 3);
}
