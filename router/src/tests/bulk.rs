//! Bulk data through LNet on the unit-test fabric (which has memory): PUTs into posted sinks
//! and GETs from posted sources by the LND's RDMA rendezvous, MD matching, truncation, and what
//! a router does with bulk it cannot carry.

use lnd::engine::TxError;
use lnd::fabric::Registration;
use lnd::wire::errno::{ENODATA, EPROTO};

use super::*;

const A: &str = "10.0.0.1@o2ib";
const B: &str = "10.0.0.2@o2ib";
const PORTAL: u32 = 16;
const MIB: usize = 1 << 20;

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect()
}

fn buf(ni: usize, reg: &Registration, offset: u64, len: u32) -> BulkBuf {
    BulkBuf::new(NiIndex(ni), reg, offset, len).expect("inside the registration")
}

fn pair() -> Fabric {
    Fabric::new(&[&[A], &[B]])
}

/// `want` at `off` of node `n`'s region `reg`, the 0xee fill everywhere else.
fn assert_landed(f: &Fabric, n: usize, reg: &Registration, off: usize, want: &[u8]) {
    let got = &f.region(n, reg);
    assert!(
        got[off..off + want.len()] == *want,
        "{} bytes at {off} differ",
        want.len()
    );
    assert!(got[..off].iter().all(|&x| x == 0xee), "touched before");
    assert!(
        got[off + want.len()..].iter().all(|&x| x == 0xee),
        "touched after"
    );
}

fn bulk_puts(evs: &[(Instant, LnetEvent)]) -> Vec<(MdId, u64, Result<u32, LnetError>)> {
    picked(evs, |e| match e {
        LnetEvent::BulkPut {
            md,
            match_bits,
            result,
            ..
        } => Some((*md, *match_bits, *result)),
        _ => None,
    })
}

fn put_done(evs: &[(Instant, LnetEvent)], id: MsgId) -> Vec<Result<(), LnetError>> {
    picked(evs, |e| match e {
        LnetEvent::PutDone { id: i, result } if *i == id => Some(*result),
        _ => None,
    })
}

fn get_done(evs: &[(Instant, LnetEvent)], id: MsgId) -> Vec<Result<u32, LnetError>> {
    picked(evs, |e| match e {
        LnetEvent::GetDone { id: i, result } if *i == id => Some(*result),
        _ => None,
    })
}

const SIZES: [u32; 9] = [
    1,
    7,
    3976,
    3977,
    4096,
    65_537,
    300_001,
    MIB as u32 - 1,
    MIB as u32,
];

/// A PUT of each size, from a non-zero offset into a posted sink at a non-zero offset: the
/// sender's PUT ends `Ok` once, the sink's MD reports the length once, and the bytes are exact.
#[test]
fn bulk_puts_land_in_posted_sinks_at_every_size() {
    let mut f = pair();
    let (a, b) = (nid(A), nid(B));
    let src_bytes = pattern(MIB + 100, 1);
    let src = f.register(0, src_bytes.clone());
    for (i, &len) in SIZES.iter().enumerate() {
        let sink = f.register(1, vec![0xee; MIB + 100]);
        let (src_off, sink_off) = (1 + 3 * i, 2 + 5 * i);
        let mb = 0x100 + i as u64;
        let md = f.nodes[1].post_sink(PORTAL, mb, buf(0, &sink, sink_off as u64, len));
        let now = f.now;
        let id = f.nodes[0]
            .send_put_bulk(now, b, PORTAL, mb, buf(0, &src, src_off as u64, len))
            .unwrap();
        f.run_for(Duration::from_secs(5));
        let (ea, eb) = (f.take_events(0), f.take_events(1));
        assert_eq!(put_done(&ea, id), vec![Ok(())], "size {len}");
        assert_eq!(bulk_puts(&eb), vec![(md, mb, Ok(len))], "size {len}");
        let from = eb.iter().find_map(|(_, e)| match e {
            LnetEvent::BulkPut { from, .. } => Some(*from),
            _ => None,
        });
        assert_eq!(from, Some(a));
        assert_landed(
            &f,
            1,
            &sink,
            sink_off,
            &src_bytes[src_off..src_off + len as usize],
        );
    }
    let (sa, sb) = (f.nodes[0].stats().clone(), f.nodes[1].stats().clone());
    let total: u64 = SIZES.iter().map(|&n| u64::from(n)).sum();
    assert_eq!(sa.send_length, total);
    assert_eq!(sb.recv_length, total);
    assert_eq!(sb.recv_count, SIZES.len() as u64);
    assert_eq!(
        (sa.msgs_alloc, sb.msgs_alloc),
        (0, 0),
        "no message left allocated"
    );
    assert_eq!(f.nodes[1].posted_mds(), 0, "every sink was used once");
}

/// A GET of each size from a posted source into the requester's buffer: the requester's GET
/// ends with the length, the source's MD reports it served, the bytes are exact.
#[test]
fn bulk_gets_read_posted_sources_at_every_size() {
    let mut f = pair();
    let b = nid(B);
    let src_bytes = pattern(MIB + 100, 2);
    let src = f.register(1, src_bytes.clone());
    for (i, &len) in SIZES.iter().enumerate() {
        let sink = f.register(0, vec![0xee; MIB + 100]);
        let (src_off, sink_off) = (7 + i, 3 + 2 * i);
        let mb = 0x200 + i as u64;
        let md = f.nodes[1].post_source(PORTAL, mb, buf(0, &src, src_off as u64, len));
        let now = f.now;
        let id = f.nodes[0]
            .send_get_bulk(now, b, PORTAL, mb, buf(0, &sink, sink_off as u64, len))
            .unwrap();
        f.run_for(Duration::from_secs(5));
        let (ea, eb) = (f.take_events(0), f.take_events(1));
        assert_eq!(get_done(&ea, id), vec![Ok(len)], "size {len}");
        let served: Vec<_> = picked(&eb, |e| match e {
            LnetEvent::BulkGetServed { md, result, .. } => Some((*md, *result)),
            _ => None,
        });
        assert_eq!(served, vec![(md, Ok(len))], "size {len}");
        assert_landed(
            &f,
            0,
            &sink,
            sink_off,
            &src_bytes[src_off..src_off + len as usize],
        );
    }
    let (sa, sb) = (f.nodes[0].stats().clone(), f.nodes[1].stats().clone());
    assert_eq!((sa.msgs_alloc, sb.msgs_alloc), (0, 0));
}

/// LNet matching: sinks are taken oldest first on (portal, match bits) and used once; an
/// unlinked one is never used; a PUT longer than the sink fills the sink (truncated); a PUT
/// nothing matches is dropped and counted (its sender's PUT still ends `Ok`: LNet PUTs are
/// not acknowledged); a GET nothing matches fails with -ENODATA.
#[test]
fn bulk_mds_match_once_in_order_and_truncate() {
    let mut f = pair();
    let b = nid(B);
    let src_bytes = pattern(64 * 1024, 3);
    let src = f.register(0, src_bytes.clone());
    let sinks: Vec<Registration> = (0..3).map(|_| f.register(1, vec![0xee; 16384])).collect();
    let first = f.nodes[1].post_sink(PORTAL, 7, buf(0, &sinks[0], 0, 10_000));
    let second = f.nodes[1].post_sink(PORTAL, 7, buf(0, &sinks[1], 0, 10_000));
    let other_bits = f.nodes[1].post_sink(PORTAL, 8, buf(0, &sinks[2], 0, 10_000));
    assert!(f.nodes[1].unlink_md(other_bits));
    assert!(!f.nodes[1].unlink_md(other_bits), "gone already");
    let send = |f: &mut Fabric, mb: u64, len: u32| {
        let now = f.now;
        f.nodes[0]
            .send_put_bulk(now, b, PORTAL, mb, buf(0, &src, 0, len))
            .unwrap()
    };
    // 12,000 bytes into the first 10,000-byte sink: truncated to it.
    let p1 = send(&mut f, 7, 12_000);
    f.run_for(Duration::from_secs(5));
    let p2 = send(&mut f, 7, 5_000);
    f.run_for(Duration::from_secs(5));
    // Match bits 8 were unlinked, and 7's sinks are used up: both dropped.
    let p3 = send(&mut f, 8, 5_000);
    let p4 = send(&mut f, 7, 5_000);
    f.run_for(Duration::from_secs(5));
    let (ea, eb) = (f.take_events(0), f.take_events(1));
    for id in [p1, p2, p3, p4] {
        assert_eq!(put_done(&ea, id), vec![Ok(())]);
    }
    assert_eq!(
        bulk_puts(&eb),
        vec![(first, 7, Ok(10_000)), (second, 7, Ok(5_000))]
    );
    assert_landed(&f, 1, &sinks[0], 0, &src_bytes[..10_000]);
    assert_landed(&f, 1, &sinks[1], 0, &src_bytes[..5_000]);
    assert!(f.region(1, &sinks[2]).iter().all(|&x| x == 0xee));
    let sb = f.nodes[1].stats().clone();
    assert_eq!(sb.drop_count, 2);
    assert_eq!(sb.drop_length, 10_000);
    assert_eq!(sb.msgs_alloc, 0);
    // A GET nothing matches.
    let sink = f.register(0, vec![0xee; 8192]);
    let now = f.now;
    let g = f.nodes[0]
        .send_get_bulk(now, b, PORTAL, 99, buf(0, &sink, 0, 8192))
        .unwrap();
    f.run_for(Duration::from_secs(5));
    let ea = f.take_events(0);
    assert_eq!(
        get_done(&ea, g),
        vec![Err(LnetError::Lnd(TxError::Rdma(-ENODATA)))]
    );
    assert!(f.region(0, &sink).iter().all(|&x| x == 0xee));
    assert_eq!(f.nodes[0].stats().remote_error_count, 1);
}

/// What bulk calls refuse on the spot: memory of another NI than the one the message leaves
/// by, bulk to ourselves, a range outside the registration.
#[test]
fn bulk_calls_refuse_what_they_cannot_do() {
    let mut f = Fabric::new(&[&[A, "10.1.0.1@o2ib1"], &[B]]);
    let reg = f.register(0, vec![0; 8192]);
    assert!(BulkBuf::new(NiIndex(0), &reg, 4096, 4097).is_none());
    assert!(BulkBuf::new(NiIndex(0), &reg, 0, 0).is_none());
    let now = f.now;
    let wrong_ni = buf(1, &reg, 0, 100);
    assert!(matches!(
        f.nodes[0].send_put_bulk(now, nid(B), PORTAL, 1, wrong_ni),
        Err(LnetError::BulkUnsupported(_))
    ));
    assert!(matches!(
        f.nodes[0].send_put_bulk(now, nid(A), PORTAL, 1, buf(0, &reg, 0, 100)),
        Err(LnetError::BulkUnsupported(_))
    ));
    assert!(matches!(
        f.nodes[0].send_get_bulk(now, nid("10.9.0.1@o2ib9"), PORTAL, 1, buf(0, &reg, 0, 100)),
        Err(LnetError::NoRoute(_))
    ));
    assert_eq!(f.nodes[0].stats().msgs_alloc, 0);
    let _ = EPROTO;
}

/// An inline PUT (IMMEDIATE, as a kernel o2iblnd sends small PUTs and ksocklnd all of them)
/// matching a posted sink takes that MD, cut to its length (lnet_parse_put), and goes up as
/// `BulkPutInline` for the user to copy; a PUT on bits no sink holds is still a plain `Put`.
#[test]
fn an_inline_put_matching_a_posted_sink_is_handed_over_for_that_sink() {
    let mut f = pair();
    let sink = f.register(1, vec![0; 4096]);
    let md = f.nodes[1].post_sink(PORTAL, 0x77, buf(0, &sink, 100, 50));
    let now = f.now;
    let b = nid(B);
    f.nodes[0]
        .send_put(now, b, PORTAL, 0x77, pattern(80, 3))
        .unwrap();
    f.nodes[0]
        .send_put(now, b, PORTAL, 0x77, pattern(20, 4))
        .unwrap();
    f.run_for(Duration::from_secs(1));
    let eb = f.take_events(1);
    let inline: Vec<_> = picked(&eb, |e| match e {
        LnetEvent::BulkPutInline {
            md,
            match_bits,
            payload,
            ..
        } => Some((*md, *match_bits, payload.clone())),
        _ => None,
    });
    assert_eq!(inline, vec![(md, 0x77, pattern(80, 3)[..50].to_vec())]);
    let plain = eb
        .iter()
        .filter(|(_, e)| {
            matches!(
                e,
                LnetEvent::Put {
                    match_bits: 0x77,
                    ..
                }
            )
        })
        .count();
    assert_eq!(plain, 1, "the second PUT found no sink: {eb:?}");
    assert_eq!(f.nodes[1].posted_mds(), 0);
}
