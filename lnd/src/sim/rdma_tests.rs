//! Bulk data by RDMA rendezvous between two simulated endpoints: the bytes that land, the
//! statuses each side reports, the credits afterwards, and what a wrong or hostile sink gets.
//! The test plays LNet on both sides: it answers each `LndEvent::BulkRequest` as told.

use super::*;
use crate::engine::{BulkOp, ConnState, EndpointConfig, RdmaSink, TxError};
use crate::fabric::{LocalFrag, Registration, Registry};
use crate::wire::errno::{ENODATA, EPROTO};
use crate::wire::{LnetBody, RdmaFrag, WireHandle};

const MIB: usize = 1 << 20;

use testkit::nid;

/// Bytes that differ at every position and from one buffer to the next.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// How the test's LNet answers a rendezvous request.
#[derive(Clone)]
enum Answer {
    /// PUT_ACK with this sink.
    Accept(RdmaSink),
    /// Write these fragments for a GET.
    Reply(Vec<LocalFrag>),
    /// Nothing matched.
    Decline,
    /// PUT_ACK with this sink, then the peer crashes at once (before its write lands).
    AcceptThenPeerCrashes(RdmaSink),
    /// This node crashes with the request in hand.
    Crash,
}

struct Pair {
    w: World,
    a: NodeId,
    b: NodeId,
    /// Events of each node already looked at.
    seen: [usize; 2],
    /// What each node answers to its next requests, in order.
    answers: [VecDeque<Answer>; 2],
    /// BulkDone per node: (cookie, result).
    rdma_done: [Vec<(u64, Result<u32, TxError>)>; 2],
    next_cookie: u64,
}

/// What a fresh sink holds before anything is written into it.
const FILL: u8 = 0xee;

impl Pair {
    fn new(seed: u64) -> Pair {
        let mut w = World::new(SimConfig::with_seed(seed));
        let a = w.add_node(EndpointConfig::new(nid("10.0.0.1@o2ib"), 1));
        let b = w.add_node(EndpointConfig::new(nid("10.0.0.2@o2ib"), 2));
        Pair {
            w,
            a,
            b,
            seen: [0, 0],
            answers: [VecDeque::new(), VecDeque::new()],
            rdma_done: [Vec::new(), Vec::new()],
            next_cookie: 1 << 40,
        }
    }

    fn side(&self, n: NodeId) -> usize {
        usize::from(n == self.b)
    }

    fn register(&mut self, n: NodeId, bytes: Vec<u8>) -> Registration {
        self.w.registry(n).register(bytes).unwrap()
    }

    /// A region of `len` bytes on `n` for a write to land in, every byte [`FILL`] so that what
    /// the write touched shows.
    fn sink(&mut self, n: NodeId, len: usize) -> Registration {
        self.register(n, vec![FILL; len])
    }

    /// Whether nothing wrote into `reg` on `n` (every byte still [`FILL`]).
    fn untouched(&self, n: NodeId, reg: &Registration) -> bool {
        self.w.region(n, reg).unwrap().iter().all(|&x| x == FILL)
    }

    /// Answers what the endpoints asked; true if anything was.
    fn serve(&mut self) -> bool {
        let mut any = false;
        for n in [self.a, self.b] {
            let i = self.side(n);
            let evs: Vec<LndEvent> = self.w.node_events(n)[self.seen[i]..]
                .iter()
                .map(|(_, e)| e.clone())
                .collect();
            self.seen[i] += evs.len();
            for ev in evs {
                any = true;
                match ev {
                    LndEvent::BulkRequest { rx, op, .. } => {
                        let answer = self.answers[i].pop_front().unwrap_or(Answer::Decline);
                        let cookie = self.next_cookie;
                        self.next_cookie += 1;
                        let other = if n == self.a { self.b } else { self.a };
                        match answer {
                            Answer::Crash => {
                                self.w.crash(n);
                                continue;
                            }
                            Answer::AcceptThenPeerCrashes(sink) => {
                                self.w.with_endpoint(n, |ep, now| {
                                    ep.accept_put_rdma(now, rx, sink, cookie)
                                });
                                self.w.crash(other);
                                continue;
                            }
                            _ => {}
                        }
                        self.w.with_endpoint(n, |ep, now| match answer {
                            Answer::Crash | Answer::AcceptThenPeerCrashes(_) => {}
                            Answer::Accept(sink) => {
                                assert_eq!(op, BulkOp::Put);
                                ep.accept_put_rdma(now, rx, sink, cookie)
                            }
                            Answer::Reply(src) => {
                                assert!(matches!(op, BulkOp::Get { .. }));
                                ep.reply_get_rdma(now, rx, src, cookie)
                            }
                            Answer::Decline => ep.recv_done(now, rx),
                        });
                    }
                    LndEvent::BulkDone { cookie, result, .. } => {
                        self.rdma_done[i].push((cookie, result))
                    }
                    _ => {}
                }
            }
        }
        any
    }

    /// Runs until nothing is left to do or `secs` of virtual time pass.
    fn run(&mut self, secs: u64) {
        let until = self.w.now() + Duration::from_secs(secs);
        loop {
            let served = self.serve();
            if self.w.now() >= until {
                return;
            }
            let pending = self.w.pending_sends() > 0
                || [self.a, self.b]
                    .iter()
                    .any(|&n| self.w.endpoint(n).is_some_and(|e| e.pending_sends() > 0));
            if !served && !pending && self.w.in_flight() == 0 {
                return;
            }
            if !self.w.step() && !self.serve() {
                return;
            }
        }
    }

    fn put_hdr(&self, len: u32) -> LnetHdr {
        put_hdr(
            self.w.nid_of(self.a),
            self.w.nid_of(self.b),
            len as usize,
            7,
        )
    }

    fn get_hdr(&self, len: u32) -> LnetHdr {
        LnetHdr {
            dest_nid: self.w.nid_of(self.b),
            src_nid: self.w.nid_of(self.a),
            dest_pid: 12345,
            src_pid: 12345,
            payload_length: 0,
            body: LnetBody::Get {
                return_wmd: WireHandle {
                    interface_cookie: 1,
                    object_cookie: 2,
                },
                match_bits: 9,
                ptl_index: 4,
                src_offset: 0,
                sink_length: len,
            },
        }
    }

    /// Once quiet, everything is given back: each side's reserved credits are whole, every
    /// credit is either ours or owed back to us by the peer, and no message is left.
    fn assert_credits_home(&self) {
        // (A race may leave one connection each way: the books balance over all of them.)
        let conns = |n: NodeId, peer: NodeId| -> Vec<crate::engine::ConnView> {
            let ep = self.w.endpoint(n).unwrap();
            ep.conns()
                .filter(|c| c.peer == self.w.nid_of(peer) && c.state == ConnState::Established)
                .collect()
        };
        for (n, peer) in [(self.a, self.b), (self.b, self.a)] {
            let (mine, theirs) = (conns(n, peer), conns(peer, n));
            assert!(!mine.is_empty() && mine.len() == theirs.len());
            let held: u32 = mine.iter().map(|c| u32::from(c.credits)).sum();
            let owed: u32 = theirs
                .iter()
                .map(|c| u32::from(c.outstanding_credits))
                .sum();
            let depth: u32 = mine.iter().map(|c| u32::from(c.queue_depth)).sum();
            for c in &mine {
                assert_eq!(
                    c.reserved_credits, c.queue_depth,
                    "reserved credits on {n:?}"
                );
            }
            assert_eq!(
                held + owed,
                depth,
                "credits of {n:?}: {held} held + {owed} owed"
            );
            let ep = self.w.endpoint(n).unwrap();
            assert_eq!(ep.pending_sends(), 0, "messages left on {n:?}");
        }
    }
}

fn outcome(w: &World, cookie: u64) -> Option<SendOutcome> {
    w.outcome(cookie).map(|(_, o)| o)
}

/// PUTs of every awkward size from 1 byte to 1 MiB, from and into non-zero offsets, land byte
/// for byte, and nothing around the sink's range is touched: the source's PUT ends `Ok` once
/// its PUT_DONE is sent, the sink's with the length written; the credits all come home.
#[test]
fn rendezvous_puts_land_byte_exact_at_every_size() {
    let mut p = Pair::new(11);
    let src_bytes = pattern(MIB + 64, 1);
    let src = p.register(p.a, src_bytes.clone());
    for (i, &len) in SIZES.iter().enumerate() {
        let (src_off, sink_off) = (13 + i as u64, 5 + 3 * i as u64);
        let sink = p.sink(p.b, MIB + 64);
        p.answers[1].push_back(Answer::Accept(RdmaSink::of(&sink, sink_off, len)));
        let hdr = p.put_hdr(len);
        let (a, to) = (p.a, p.w.nid_of(p.b));
        let cookie =
            p.w.send_put_rdma(a, to, hdr, vec![src.local_frag(src_off, len)]);
        p.run(60);
        assert_eq!(
            outcome(&p.w, cookie),
            Some(SendOutcome::Delivered),
            "size {len}"
        );
        let (_, got) = *p.rdma_done[1].last().expect("the sink's side finished");
        assert_eq!(got, Ok(len), "size {len}");
        assert_eq!(p.rdma_done[1].len(), i + 1, "one outcome per PUT");
        let want = &src_bytes[src_off as usize..(src_off + u64::from(len)) as usize];
        assert_landed(&p.w, p.b, &sink, sink_off, want);
        p.assert_credits_home();
    }
    let st = p.w.endpoint(p.a).unwrap().stats().clone();
    assert_eq!(st.rdma_puts_sent, SIZES.len() as u64);
    let total: u64 = SIZES.iter().map(|&n| u64::from(n)).sum();
    assert_eq!(st.rdma_bytes_sent, total);
    assert_eq!(
        p.w.endpoint(p.b).unwrap().stats().rdma_bytes_received,
        total
    );
}

const SIZES: [u32; 10] = [
    1,
    7,
    8,
    3975,
    3976,
    3977,
    4096,
    65_537,
    MIB as u32 - 1,
    MIB as u32,
];

/// `want` is at `off` in `reg` on node `n`, and every other byte is still the sink's [`FILL`].
fn assert_landed(w: &World, n: NodeId, reg: &Registration, off: u64, want: &[u8]) {
    let lands = w.region(n, reg).unwrap();
    let range = off as usize..off as usize + want.len();
    assert!(
        lands[range.clone()] == *want,
        "{} bytes at {off}: differ",
        want.len()
    );
    assert!(
        lands[..range.start].iter().all(|&x| x == FILL),
        "touched before"
    );
    assert!(
        lands[range.end..].iter().all(|&x| x == FILL),
        "touched after"
    );
}

/// GETs of every size: the requester's sink receives the target's bytes, the requester's GET
/// ends with the length (GET_DONE), the target's reply with `Ok`.
#[test]
fn rendezvous_gets_land_byte_exact_at_every_size() {
    let mut p = Pair::new(12);
    let src_bytes = pattern(MIB + 128, 2);
    let src = p.register(p.b, src_bytes.clone());
    for (i, &len) in SIZES.iter().enumerate() {
        let (src_off, sink_off) = (3 + 7 * i as u64, 11 + i as u64);
        let sink = p.sink(p.a, MIB + 64);
        p.answers[1].push_back(Answer::Reply(vec![src.local_frag(src_off, len)]));
        let hdr = p.get_hdr(len);
        let (a, to) = (p.a, p.w.nid_of(p.b));
        let cookie = 7000 + i as u64;
        let advertised = RdmaSink::of(&sink, sink_off, len);
        p.w.with_endpoint(a, |ep, now| {
            ep.send_get_rdma(now, to, hdr, advertised, cookie)
        })
        .unwrap()
        .unwrap();
        p.run(60);
        assert_eq!(
            p.rdma_done[0].last(),
            Some(&(cookie, Ok(len))),
            "size {len}"
        );
        // (The target's own outcome is booked by the world as a send it did not start: count it.)
        let served = p.w.endpoint(p.b).unwrap().stats().rdma_gets_served;
        assert_eq!(served, i as u64 + 1, "size {len}");
        let want = &src_bytes[src_off as usize..(src_off + u64::from(len)) as usize];
        assert_landed(&p.w, p.a, &sink, sink_off, want);
        p.assert_credits_home();
    }
    let st = p.w.endpoint(p.b).unwrap().stats().clone();
    assert_eq!(st.rdma_gets_served, SIZES.len() as u64);
    assert_eq!(
        p.w.endpoint(p.a).unwrap().stats().rdma_gets_received,
        SIZES.len() as u64
    );
}

/// A source and a sink split into many fragments (up to 257, unaligned) still carry the bytes
/// in order, as long as the write takes at most the connection's fragment limit (257 work
/// requests); one that needs more fails that PUT with -EMSGSIZE (kiblnd_init_rdma) and the
/// connection goes on.
#[test]
fn fragmented_sources_and_sinks_keep_the_bytes_in_order() {
    let mut p = Pair::new(13);
    let len = MIB as u32;
    let src_bytes = pattern(2 * MIB, 3);
    let src = p.register(p.a, src_bytes.clone());
    // The source: 257 pieces of a 2 MiB buffer with gaps between them.
    let mut local = Vec::new();
    let mut want = Vec::new();
    let (mut off, mut left) = (100u64, len);
    for k in 0..257u32 {
        let n = if k == 256 {
            left
        } else {
            (len / 257).min(left)
        };
        local.push(src.local_frag(off, n));
        want.extend_from_slice(&src_bytes[off as usize..off as usize + n as usize]);
        off += u64::from(n) + 17;
        left -= n;
    }
    assert_eq!(left, 0);
    let split = |sink: &Registration, pieces: u32| RdmaSink {
        key: sink.key(),
        frags: (0..pieces)
            .map(|k| {
                let piece = len / pieces;
                RdmaFrag {
                    nob: if k == pieces - 1 {
                        len - piece * k
                    } else {
                        piece
                    },
                    addr: sink.addr() + 9 + u64::from(k * piece),
                }
            })
            .collect(),
    };
    let (a, to) = (p.a, p.w.nid_of(p.b));
    // 257 source pieces into one sink fragment, then one source fragment into 257 sink pieces.
    let whole = src.local_frag(100, len);
    let cases = [
        (local.clone(), 1, want.clone()),
        (vec![whole], 257, src_bytes[100..100 + MIB].to_vec()),
    ];
    for (src_frags, sink_pieces, want) in cases {
        let sink = p.sink(p.b, 2 * MIB);
        p.answers[1].push_back(Answer::Accept(split(&sink, sink_pieces)));
        let hdr = p.put_hdr(len);
        let cookie = p.w.send_put_rdma(a, to, hdr, src_frags);
        p.run(60);
        assert_eq!(
            outcome(&p.w, cookie),
            Some(SendOutcome::Delivered),
            "{sink_pieces} sink pieces"
        );
        assert_eq!(p.rdma_done[1].last().unwrap().1, Ok(len));
        assert_landed(&p.w, p.b, &sink, 9, &want);
    }
    // 257 pieces each side, boundaries apart: about 450 writes, more than the connection takes.
    let sink = p.sink(p.b, 2 * MIB);
    p.answers[1].push_back(Answer::Accept(split(&sink, 200)));
    let hdr = p.put_hdr(len);
    let cookie = p.w.send_put_rdma(a, to, hdr, local);
    p.run(60);
    assert_eq!(
        outcome(&p.w, cookie),
        Some(SendOutcome::Failed(TxError::Rdma(
            -crate::wire::errno::EMSGSIZE
        )))
    );
    assert!(p.untouched(p.b, &sink));
    p.assert_credits_home();
}

/// A sink smaller than the PUT takes what it advertises (the sink truncating, as LNet does for
/// an MD shorter than the PUT); a sink larger than the PUT fails that PUT on both sides with
/// -EPROTO and nothing written, and the connection carries the next PUT.
#[test]
fn a_smaller_sink_truncates_and_a_larger_one_fails_only_that_put() {
    let mut p = Pair::new(14);
    let src_bytes = pattern(8192, 4);
    let src = p.register(p.a, src_bytes.clone());
    let (a, to) = (p.a, p.w.nid_of(p.b));

    let small = p.sink(p.b, 8192);
    p.answers[1].push_back(Answer::Accept(RdmaSink::of(&small, 0, 600)));
    let hdr = p.put_hdr(5000);
    let c1 = p.w.send_put_rdma(a, to, hdr, vec![src.local_frag(0, 5000)]);
    p.run(60);
    assert_eq!(outcome(&p.w, c1), Some(SendOutcome::Delivered));
    assert_eq!(p.rdma_done[1][0].1, Ok(600));
    assert_landed(&p.w, p.b, &small, 0, &src_bytes[..600]);

    let big = p.sink(p.b, 8192);
    p.answers[1].push_back(Answer::Accept(RdmaSink::of(&big, 0, 6000)));
    let hdr = p.put_hdr(5000);
    let c2 = p.w.send_put_rdma(a, to, hdr, vec![src.local_frag(0, 5000)]);
    p.run(60);
    assert_eq!(
        outcome(&p.w, c2),
        Some(SendOutcome::Failed(TxError::Rdma(-EPROTO)))
    );
    assert_eq!(p.rdma_done[1][1].1, Err(TxError::Rdma(-EPROTO)));
    assert!(p.untouched(p.b, &big));
    assert_eq!(p.w.endpoint(p.a).unwrap().stats().rdma_bad_sinks, 1);

    // The same connection takes the next one.
    let conns = p.w.endpoint(p.a).unwrap().stats().established;
    let ok = p.sink(p.b, 8192);
    p.answers[1].push_back(Answer::Accept(RdmaSink::of(&ok, 0, 5000)));
    let hdr = p.put_hdr(5000);
    let c3 = p.w.send_put_rdma(a, to, hdr, vec![src.local_frag(0, 5000)]);
    p.run(60);
    assert_eq!(outcome(&p.w, c3), Some(SendOutcome::Delivered));
    assert_landed(&p.w, p.b, &ok, 0, &src_bytes[..5000]);
    assert_eq!(p.w.endpoint(p.a).unwrap().stats().established, conns);
    p.assert_credits_home();
}

/// Nothing matched: a PUT gets PUT_NAK 0 (done, as an unwanted LNet PUT is), a GET GET_DONE
/// -ENODATA (it fails); nothing is written and the credits come home.
#[test]
fn unmatched_rendezvous_requests_end_without_data() {
    let mut p = Pair::new(15);
    let src = p.register(p.a, pattern(8192, 5));
    let sink = p.sink(p.a, 8192);
    let (a, to) = (p.a, p.w.nid_of(p.b));
    let hdr = p.put_hdr(5000);
    let c = p.w.send_put_rdma(a, to, hdr, vec![src.local_frag(0, 5000)]);
    let hdr = p.get_hdr(5000);
    let advertised = RdmaSink::of(&sink, 0, 5000);
    p.w.with_endpoint(a, |ep, now| ep.send_get_rdma(now, to, hdr, advertised, 99))
        .unwrap()
        .unwrap();
    p.run(60);
    assert_eq!(outcome(&p.w, c), Some(SendOutcome::Delivered));
    assert_eq!(p.rdma_done[0], vec![(99, Err(TxError::Rdma(-ENODATA)))]);
    assert!(p.untouched(p.a, &sink));
    assert_eq!(p.w.endpoint(p.b).unwrap().stats().rdma_refused, 2);
    p.assert_credits_home();
}

/// Many PUTs and GETs at once, more than the queue depth, both ways: every one ends once, with
/// its bytes in place, and the reserved credits (which bound the requests in flight) all come
/// back.
#[test]
fn many_rendezvous_at_once_share_the_credits() {
    let mut p = Pair::new(16);
    let len = 70_000u32;
    let n = 40usize;
    let whole = pattern(n * len as usize, 6);
    let a_src = p.register(p.a, whole.clone());
    let b_put_sink = p.sink(p.b, n * len as usize);
    let b_get_sink = p.sink(p.b, n * len as usize);
    let (a, b) = (p.a, p.b);
    let (na, nb) = (p.w.nid_of(a), p.w.nid_of(b));
    let mut puts = Vec::new();
    for k in 0..n as u64 {
        let off = k * u64::from(len);
        // a PUTs slice k into b's PUT sink...
        p.answers[1].push_back(Answer::Accept(RdmaSink::of(&b_put_sink, off, len)));
        let hdr = p.put_hdr(len);
        puts.push(p.w.send_put_rdma(a, nb, hdr, vec![a_src.local_frag(off, len)]));
        // ...and b GETs slice k into its GET sink, at the same time.
        p.answers[0].push_back(Answer::Reply(vec![a_src.local_frag(off, len)]));
        let mut hdr = p.get_hdr(len);
        (hdr.src_nid, hdr.dest_nid) = (nb, na);
        let into = RdmaSink::of(&b_get_sink, off, len);
        p.w.with_endpoint(b, |ep, now| ep.send_get_rdma(now, na, hdr, into, 500 + k))
            .unwrap()
            .unwrap();
    }
    p.run(120);
    for c in &puts {
        assert_eq!(outcome(&p.w, *c), Some(SendOutcome::Delivered));
    }
    assert_eq!(
        p.rdma_done[1].len(),
        2 * n,
        "every PUT and GET into b ended once"
    );
    assert!(p.rdma_done[1].iter().all(|(_, r)| *r == Ok(len)));
    assert!(p.w.region(b, &b_put_sink).unwrap() == &whole[..]);
    assert!(p.w.region(b, &b_get_sink).unwrap() == &whole[..]);
    p.assert_credits_home();
}

/// A sink whose memory range lies outside what it registered (a buggy or hostile peer): the
/// source's write fails at the fabric before a byte lands (IBV_WC_REM_ACCESS_ERR), which costs
/// the source that connection and the PUT; the sink's memory is unchanged, and a third node's
/// traffic with the source is unaffected.
#[test]
fn a_sink_outside_its_registration_costs_the_writer_that_put_and_nothing_lands() {
    let mut p = Pair::new(17);
    let c = p.w.add_node(EndpointConfig::new(nid("10.0.0.3@o2ib"), 3));
    let src = p.register(p.a, pattern(8192, 8));
    let sink = p.sink(p.b, 4096);
    // 5000 bytes advertised from a 4096-byte registration.
    p.answers[1].push_back(Answer::Accept(RdmaSink::of(&sink, 0, 5000)));
    let (a, to) = (p.a, p.w.nid_of(p.b));
    let hdr = p.put_hdr(5000);
    let cookie = p.w.send_put_rdma(a, to, hdr, vec![src.local_frag(0, 5000)]);
    let (na, nc) = (p.w.nid_of(a), p.w.nid_of(c));
    let side = p.w.send(c, na, put_hdr(nc, na, 100, 1), vec![3; 100]);
    p.run(60);
    assert!(matches!(
        outcome(&p.w, cookie),
        Some(SendOutcome::Failed(_))
    ));
    assert!(p.untouched(p.b, &sink));
    assert_eq!(p.rdma_done[1].len(), 1, "the sink's side ended too");
    assert!(p.rdma_done[1][0].1.is_err());
    assert_eq!(outcome(&p.w, side), Some(SendOutcome::Delivered));
    let more = p.w.send(c, na, put_hdr(nc, na, 100, 2), vec![4; 100]);
    p.run(60);
    assert_eq!(outcome(&p.w, more), Some(SendOutcome::Delivered));
}

/// A sink that dies holding the PUT_REQ, and a source that dies after the PUT_ACK: each PUT
/// still ends exactly once on the side that lives, within the LND's bounds.
#[test]
fn a_rendezvous_whose_peer_dies_ends_once_on_the_side_that_lives() {
    // The sink dies before answering: the source's PUT fails.
    let mut p = Pair::new(18);
    let src = p.register(p.a, pattern(8192, 9));
    p.answers[1].push_back(Answer::Crash);
    let (a, to) = (p.a, p.w.nid_of(p.b));
    let hdr = p.put_hdr(5000);
    let cookie = p.w.send_put_rdma(a, to, hdr, vec![src.local_frag(0, 5000)]);
    p.run(120);
    assert!(
        matches!(outcome(&p.w, cookie), Some(SendOutcome::Failed(_))),
        "{:?}",
        outcome(&p.w, cookie)
    );
    assert_eq!(p.w.endpoint(p.a).unwrap().pending_sends(), 0);

    // The source dies after the sink's PUT_ACK: the sink's transfer fails.
    let mut p = Pair::new(19);
    let src = p.register(p.a, pattern(8192, 10));
    let sink = p.sink(p.b, 8192);
    p.answers[1].push_back(Answer::AcceptThenPeerCrashes(RdmaSink::of(&sink, 0, 5000)));
    let (a, to) = (p.a, p.w.nid_of(p.b));
    let hdr = p.put_hdr(5000);
    p.w.send_put_rdma(a, to, hdr, vec![src.local_frag(0, 5000)]);
    p.run(120);
    assert_eq!(p.rdma_done[1].len(), 1);
    assert!(p.rdma_done[1][0].1.is_err(), "{:?}", p.rdma_done[1]);
    assert_eq!(p.w.endpoint(p.b).unwrap().pending_sends(), 0);
}

/// A slow sink throttles its source through credits: while the sink's LNet holds the PUT_REQs
/// it got (no buffer to take them into yet), no more reach it than the connection's credits
/// allow, the rest waiting at the source; nothing is lost, and once the sink answers, every
/// PUT lands.
#[test]
fn a_slow_sink_holds_its_source_to_the_credits() {
    let mut p = Pair::new(20);
    let len = 100_000u32;
    let n = 40u64;
    let src = p.register(p.a, pattern(len as usize, 11));
    let sink = p.sink(p.b, n as usize * len as usize);
    let (a, to) = (p.a, p.w.nid_of(p.b));
    let cookies: Vec<u64> = (0..n)
        .map(|_| {
            let hdr = p.put_hdr(len);
            p.w.send_put_rdma(a, to, hdr, vec![src.local_frag(0, len)])
        })
        .collect();
    // B's LNet answers nothing for a while: collect the requests without answering.
    let until = p.w.now() + Duration::from_secs(5);
    let mut held = Vec::new();
    while p.w.now() < until && p.w.step() {
        let evs: Vec<LndEvent> = p.w.node_events(p.b)[p.seen[1]..]
            .iter()
            .map(|(_, e)| e.clone())
            .collect();
        p.seen[1] += evs.len();
        held.extend(evs.into_iter().filter_map(|e| match e {
            LndEvent::BulkRequest { rx, .. } => Some(rx),
            _ => None,
        }));
    }
    let qd =
        p.w.endpoint(p.a)
            .unwrap()
            .conns()
            .map(|c| c.queue_depth)
            .max()
            .unwrap();
    assert!(
        !held.is_empty() && held.len() <= usize::from(qd),
        "{} requests reached the stalled sink with {qd} credits",
        held.len()
    );
    assert!(
        cookies.iter().all(|&c| outcome(&p.w, c).is_none()),
        "nothing ended meanwhile"
    );
    let waiting = p.w.endpoint(p.a).unwrap().pending_sends();
    assert_eq!(waiting, n as usize, "the rest wait at the source");
    // B answers them, and the ones still to come as they come, each into its own slot.
    let first = held.len() as u64;
    for (k, rx) in held.into_iter().enumerate() {
        let s = RdmaSink::of(&sink, k as u64 * u64::from(len), len);
        p.w.with_endpoint(p.b, |ep, now| {
            ep.accept_put_rdma(now, rx, s, 9000 + k as u64)
        });
    }
    for k in first..n {
        let s = RdmaSink::of(&sink, k * u64::from(len), len);
        p.answers[1].push_back(Answer::Accept(s));
    }
    p.run(120);
    for c in &cookies {
        assert_eq!(outcome(&p.w, *c), Some(SendOutcome::Delivered));
    }
    let want = pattern(len as usize, 11);
    let got = p.w.region(p.b, &sink).unwrap();
    for k in 0..n as usize {
        assert!(
            got[k * len as usize..(k + 1) * len as usize] == want[..],
            "slot {k}"
        );
    }
    p.assert_credits_home();
}
