//! A minimal two-endpoint driver with instant, lossless delivery: the engine's own unit tests.
//! The full simulator with faults and thousands of nodes is `crate::sim`.

use std::collections::{HashMap, VecDeque};

use super::handshake::encode_private;
use super::*;
use crate::iface::Lnd;

struct Pair {
    eps: [Endpoint; 2],
    now: Instant,
    /// (to endpoint, work)
    queue: VecDeque<(usize, Work)>,
    /// (endpoint, conn) -> (other endpoint, other conn)
    links: HashMap<(usize, ConnId), (usize, ConnId)>,
    pending_connects: HashMap<u64, (usize, ConnId)>,
    next_req: u64,
    received: [Vec<LndEvent>; 2],
    done: [Vec<LndEvent>; 2],
    /// When set, the passive side's ESTABLISHED is kept here instead of queued (its RTU late).
    held_rtu: Option<Vec<(usize, Work)>>,
}

enum Work {
    Request(RequestId, PrivateData),
    Established(ConnId, PrivateData),
    Failed(ConnId, ConnectFailure),
    Recv(ConnId, Vec<u8>),
    SendDone(ConnId, WrId, WcStatus),
    Disconnected(ConnId, DisconnectReason),
}

use testkit::nid;

fn hdr(from: Nid, to: Nid, len: usize) -> LnetHdr {
    LnetHdr::put(from, to, len as u32, 4, 7)
}

impl Pair {
    fn new(a: &str, b: &str) -> Pair {
        let now = Instant::from_secs(1);
        Pair {
            eps: [
                Endpoint::new(EndpointConfig::new(nid(a), 100), now),
                Endpoint::new(EndpointConfig::new(nid(b), 200), now),
            ],
            now,
            queue: VecDeque::new(),
            links: HashMap::new(),
            pending_connects: HashMap::new(),
            next_req: 0,
            received: [Vec::new(), Vec::new()],
            done: [Vec::new(), Vec::new()],
            held_rtu: None,
        }
    }

    fn drain(&mut self) {
        for i in 0..2 {
            while let Some(a) = self.eps[i].poll_action() {
                match a {
                    FabricAction::Connect {
                        conn,
                        peer,
                        private,
                        ..
                    } => {
                        let to = usize::from(self.eps[1].nid() == peer);
                        self.next_req += 1;
                        self.pending_connects.insert(self.next_req, (i, conn));
                        self.queue
                            .push_back((to, Work::Request(RequestId(self.next_req), private)));
                    }
                    FabricAction::Accept {
                        req, conn, private, ..
                    } => {
                        let (from, fconn) = self.pending_connects.remove(&req.0).unwrap();
                        self.links.insert((from, fconn), (i, conn));
                        self.links.insert((i, conn), (from, fconn));
                        self.queue
                            .push_back((from, Work::Established(fconn, private)));
                        let rtu = (i, Work::Established(conn, PrivateData::EMPTY));
                        match self.held_rtu.as_mut() {
                            Some(held) => held.push(rtu),
                            None => self.queue.push_back(rtu),
                        }
                    }
                    FabricAction::Reject { req, private } => {
                        let (from, fconn) = self.pending_connects.remove(&req.0).unwrap();
                        self.queue.push_back((
                            from,
                            Work::Failed(fconn, ConnectFailure::Rejected(private)),
                        ));
                    }
                    FabricAction::Send { conn, wr, bytes } => {
                        let (to, tconn) = self.links[&(i, conn)];
                        self.queue.push_back((to, Work::Recv(tconn, bytes)));
                        self.queue
                            .push_back((i, Work::SendDone(conn, wr, WcStatus::Success)));
                    }
                    FabricAction::Disconnect { conn } => {
                        if let Some(&(to, tconn)) = self.links.get(&(i, conn)) {
                            let closed = Work::Disconnected(tconn, DisconnectReason::Closed);
                            self.queue.push_back((to, closed));
                        }
                        let closed = Work::Disconnected(conn, DisconnectReason::Closed);
                        self.queue.push_back((i, closed));
                    }
                    FabricAction::PostRecv { .. }
                    | FabricAction::GrantWrites { .. }
                    | FabricAction::RevokeWrites { .. } => {}
                    FabricAction::RdmaWrite { conn, wr, .. } => {
                        // No memory here: a write just completes (the simulator moves bytes).
                        self.queue
                            .push_back((i, Work::SendDone(conn, wr, WcStatus::Success)));
                    }
                    FabricAction::Destroy { conn } => {
                        self.links.remove(&(i, conn));
                    }
                }
            }
            while let Some(e) = self.eps[i].poll_event() {
                match e {
                    LndEvent::Received { rx, .. } => {
                        self.eps[i].recv_done(self.now, rx);
                        self.received[i].push(e);
                    }
                    other => self.done[i].push(other),
                }
            }
        }
    }

    fn run(&mut self) {
        for _ in 0..100_000 {
            self.drain();
            let Some((i, w)) = self.queue.pop_front() else {
                // Nothing in flight: let time pass to the next timer.
                let next = self.eps.iter().filter_map(|e| e.poll_timeout()).min();
                match next {
                    Some(t) if t <= self.now + Duration::from_secs(1) => {
                        self.now = self.now.max(t);
                        for e in &mut self.eps {
                            e.handle_timeout(self.now);
                        }
                        self.drain();
                        if self.queue.is_empty()
                            && self.eps.iter().all(|e| {
                                e.poll_timeout()
                                    .is_none_or(|t| t > self.now + Duration::from_secs(1))
                            })
                        {
                            return;
                        }
                        continue;
                    }
                    _ => return,
                }
            };
            let now = self.now;
            let ep = &mut self.eps[i];
            match w {
                Work::Request(req, p) => ep.handle_connect_request(now, req, p.as_bytes()),
                Work::Established(c, p) => ep.handle_established(now, c, p.as_bytes()),
                Work::Failed(c, why) => ep.handle_connect_failed(now, c, why),
                Work::Recv(c, b) => ep.handle_recv(now, c, 0, &b),
                Work::SendDone(c, wr, st) => ep.handle_send_complete(now, c, wr, st),
                Work::Disconnected(c, why) => ep.handle_disconnected(now, c, why),
            }
        }
        panic!("did not settle");
    }
}

#[test]
fn two_endpoints_exchange_messages() {
    let mut p = Pair::new("10.0.0.1@o2ib", "10.0.0.2@o2ib");
    let (a, b) = (p.eps[0].nid(), p.eps[1].nid());
    for i in 0..100u64 {
        p.eps[0]
            .send(p.now, b, hdr(a, b, 10), vec![1; 10], i)
            .unwrap();
        p.eps[1]
            .send(p.now, a, hdr(b, a, 20), vec![2; 20], 1000 + i)
            .unwrap();
    }
    p.run();
    assert_eq!(p.received[1].len(), 100);
    assert_eq!(p.received[0].len(), 100);
    let ok = |evs: &[LndEvent]| {
        evs.iter()
            .filter(|e| matches!(e, LndEvent::SendDone { result: Ok(()), .. }))
            .count()
    };
    assert_eq!(ok(&p.done[0]), 100);
    assert_eq!(ok(&p.done[1]), 100);
    // Both connected at once: one race reject, one connection each way at most.
    let races = p.eps[0].stats().races + p.eps[1].stats().races;
    assert!(races <= 1, "{races}");
    for e in &p.eps {
        for c in e.conns() {
            assert!(c.credits <= c.queue_depth);
        }
    }
    // Credits flowed back: more than queue-depth messages went each way.
    assert!(p.eps[0].stats().msgs_sent >= 100);
}

/// LU-8303: the active side sends as soon as the CONNACK arrives; what reaches the passive side
/// before its ESTABLISHED is kept (kiblnd's ibc_early_rxs) and delivered, in order, once it
/// comes. (The fabrics now establish the passive side at the first message, COMM_EST, so this
/// path is reached only when a driver reports data first.)
#[test]
fn messages_before_the_passive_established_are_kept_for_it() {
    let mut p = Pair::new("10.0.0.1@o2ib", "10.0.0.2@o2ib");
    let (a, b) = (p.eps[0].nid(), p.eps[1].nid());
    p.held_rtu = Some(Vec::new());
    for i in 0..3u64 {
        p.eps[0]
            .send(p.now, b, LnetHdr::put(a, b, 4, 4, i), vec![i as u8; 4], i)
            .unwrap();
    }
    p.run();
    assert!(p.received[1].is_empty(), "delivered before ESTABLISHED");
    let held = p.held_rtu.take().unwrap();
    assert_eq!(held.len(), 1);
    p.queue.extend(held);
    p.run();
    let bits: Vec<u64> = p.received[1]
        .iter()
        .map(|e| match e {
            LndEvent::Received { hdr, .. } => match hdr.body {
                crate::wire::LnetBody::Put { match_bits, .. } => match_bits,
                _ => u64::MAX,
            },
            _ => u64::MAX,
        })
        .collect();
    assert_eq!(bits, vec![0, 1, 2]);
}

#[test]
fn self_connect_is_accepted() {
    let mut p = Pair::new("10.0.0.1@o2ib", "10.0.0.2@o2ib");
    let a = p.eps[0].nid();
    // Route "to self" through the pair's fabric: endpoint 0 connects to its own NID.
    for i in 0..50u64 {
        p.eps[0]
            .send(p.now, a, hdr(a, a, 8), vec![3; 8], i)
            .unwrap();
    }
    // Patch the pair so Connect to own NID lands on endpoint 0.
    p.run();
    assert_eq!(p.eps[0].stats().races, 0);
    assert_eq!(p.received[0].len(), 50);
}

#[test]
fn graceful_shutdown_closes_both_sides() {
    let (mut p, ..) = connected_by_one_message();
    assert_eq!(p.eps[0].conns().count(), 1);
    p.eps[0].shutdown(p.now);
    p.run();
    assert!(p.eps[0].is_shut_down());
    assert_eq!(p.eps[1].conns().count(), 0, "the peer dropped its side");
    assert_eq!(p.eps[0].stats().graceful_closes, 1);
    assert!(p.done[1].iter().any(|e| matches!(
        e,
        LndEvent::PeerDown {
            reason: DownReason::Closed,
            ..
        }
    )));
}

/// The hostile-peer audit's F6: how the fabric says an established connection ended decides how
/// connd counts it. Only the close handshake is graceful; a protocol error the fabric found or a
/// transport failure loses the connection, is counted by type, and names its cause when the peer
/// goes down (a peer that vanished must not look like one that closed: 3FS #426).
#[test]
fn connd_counts_a_fabric_disconnect_by_its_reason() {
    let cases = [
        (DisconnectReason::Closed, DownReason::Closed),
        (DisconnectReason::ProtocolError, DownReason::ProtocolError),
        (DisconnectReason::TransportError, DownReason::ConnectionLost),
    ];
    for (why, down) in cases {
        let mut p = Pair::new("10.0.0.1@o2ib", "10.0.0.2@o2ib");
        let (a, b) = (p.eps[0].nid(), p.eps[1].nid());
        p.eps[0].send(p.now, b, hdr(a, b, 1), vec![0], 1).unwrap();
        p.run();
        let conn = p.eps[1].conns().next().expect("connected").id;
        p.queue.push_back((1, Work::Disconnected(conn, why)));
        p.run();
        let s = p.eps[1].stats();
        assert_eq!(p.eps[1].conns().count(), 0, "{why:?}");
        let graceful = why == DisconnectReason::Closed;
        assert_eq!(s.graceful_closes, u64::from(graceful), "{why:?}: {s:?}");
        assert_eq!(s.conns_lost, u64::from(!graceful), "{why:?}: {s:?}");
        assert_eq!(
            s.fabric_protocol_errors,
            u64::from(why == DisconnectReason::ProtocolError),
            "{why:?}"
        );
        assert_eq!(
            s.fabric_transport_errors,
            u64::from(why == DisconnectReason::TransportError),
            "{why:?}"
        );
        let downs: Vec<DownReason> = p.done[1]
            .iter()
            .filter_map(|e| match e {
                LndEvent::PeerDown { nid, reason } if *nid == a => Some(*reason),
                _ => None,
            })
            .collect();
        assert_eq!(downs, vec![down], "{why:?}");
        // The confirmation of a close already under way counts nothing more.
        let mut q = Pair::new("10.0.0.1@o2ib", "10.0.0.2@o2ib");
        q.eps[0].send(q.now, b, hdr(a, b, 1), vec![0], 1).unwrap();
        q.run();
        let conn = q.eps[1].conns().next().expect("connected").id;
        q.eps[1].close_conn(conn, None);
        q.eps[1].handle_disconnected(q.now, conn, why);
        q.run();
        let s = q.eps[1].stats();
        assert_eq!((s.graceful_closes, s.conns_lost), (1, 0), "{why:?}: {s:?}");
        assert_eq!(s.fabric_protocol_errors + s.fabric_transport_errors, 0);
    }
}

/// The buffer pool keeps message-sized buffers for reuse and refuses others (a big buffer
/// handed back would stay pinned), and what it gives out is empty.
#[test]
fn buffer_pool_reuses_message_sized_buffers_only() {
    let mut ep = Endpoint::new(EndpointConfig::new(nid("10.0.0.1@o2ib"), 1), Instant::ZERO);
    let mut b = ep.take_buffer();
    assert!(b.capacity() >= MSG_SIZE && b.is_empty());
    b.extend_from_slice(&[7; 100]);
    let ptr = b.as_ptr();
    ep.recycle(b);
    let again = ep.take_buffer();
    assert_eq!(again.as_ptr(), ptr, "the same allocation comes back");
    assert!(again.is_empty(), "and comes back empty");
    ep.recycle(Vec::with_capacity(1 << 20));
    ep.recycle(Vec::with_capacity(16));
    let fresh = ep.take_buffer();
    assert!(
        (MSG_SIZE..=2 * MSG_SIZE).contains(&fresh.capacity()),
        "neither the 1 MiB nor the 16-byte buffer was kept: {}",
        fresh.capacity()
    );
}

impl Pair {
    /// Completes every send endpoint `i` asked its fabric for (delivering none of them); the
    /// cookie `pick` finds in one of them.
    fn complete_sends(
        &mut self,
        i: usize,
        now: Instant,
        mut pick: impl FnMut(&KibBody<'_>) -> Option<u64>,
    ) -> Option<u64> {
        let mut found = None;
        while let Some(act) = self.eps[i].poll_action() {
            if let FabricAction::Send { conn, wr, bytes } = act {
                if let Some(c) = pick(&KibMsg::parse(&bytes).unwrap().0.body) {
                    found = Some(c);
                }
                self.eps[i].handle_send_complete(now, conn, wr, WcStatus::Success);
            }
        }
        found
    }

    /// The result of endpoint `i`'s bulk transfer `cookie`: its `BulkDone`, which must be there.
    fn bulk_result(&mut self, i: usize, cookie: u64) -> Result<u32, TxError> {
        let ev = std::iter::from_fn(|| self.eps[i].poll_event())
            .find(|e| matches!(e, LndEvent::BulkDone { cookie: c, .. } if *c == cookie))
            .unwrap_or_else(|| panic!("bulk transfer {cookie} did not end"));
        let LndEvent::BulkDone { result, .. } = ev else {
            unreachable!()
        };
        result
    }

    /// Endpoint `i`'s connection (the first the fabric linked, when there are more).
    fn conn(&self, i: usize) -> ConnId {
        self.links
            .keys()
            .find(|(j, _)| *j == i)
            .map(|&(_, c)| c)
            .unwrap()
    }

    /// `body` as endpoint `to`'s peer puts it on their connection (from its NID and stamp to
    /// ours, the incarnations `Pair::new` gives): what a lying or forging peer sends.
    fn peer_msg(&self, to: usize, body: KibBody<'_>) -> Vec<u8> {
        let stamp = |i: usize| [100, 200][i];
        let (from, to_nid) = (self.eps[1 - to].nid(), self.eps[to].nid());
        raw_msg(from, stamp(1 - to), to_nid, stamp(to), body)
    }

    fn with(a: EndpointConfig, b: EndpointConfig) -> Pair {
        let mut p = Pair::new("10.0.0.1@o2ib", "10.0.0.2@o2ib");
        p.eps = [Endpoint::new(a, p.now), Endpoint::new(b, p.now)];
        p
    }
}

/// The checksum field of a captured kib message, and the flavour it verifies in.
fn carried_cksum(bytes: &[u8]) -> (u32, Option<CksumFlavour>) {
    let (_, framing) = KibMsg::parse(bytes).expect("what we emit parses");
    match framing.cksum {
        None => (0, None),
        Some(c) => (c.value, c.flavour),
    }
}

/// With checksums on, each side sends none until it has seen the peer's flavour (or its
/// configured default), then exactly the peer's flavour; what it receives in either flavour
/// verifies.
#[test]
fn checksums_follow_each_peers_flavour() {
    let mut ca = EndpointConfig::new(nid("10.0.0.1@o2ib"), 100);
    ca.checksum = ChecksumConfig {
        emit: true,
        default_flavour: None,
    };
    let mut cb = EndpointConfig::new(nid("10.0.0.2@o2ib"), 200);
    cb.checksum = ChecksumConfig {
        emit: true,
        default_flavour: Some(CksumFlavour::Signed),
    };
    let mut p = Pair::with(ca, cb);
    p.eps[0].set_capture(true);
    p.eps[1].set_capture(true);
    let (a, b) = (p.eps[0].nid(), p.eps[1].nid());
    for i in 0..3 {
        p.eps[0]
            .send(p.now, b, hdr(a, b, 16), vec![0x90; 16], i)
            .unwrap();
    }
    p.run();
    assert_eq!(p.received[1].len(), 3);
    let sent_by = |p: &mut Pair, i: usize| {
        let mut v = Vec::new();
        while let Some(c) = p.eps[i].poll_captured() {
            if c.dir == CaptureDir::Sent {
                v.push((
                    KibMsg::parse(&c.bytes).unwrap().0.msg_type(),
                    carried_cksum(&c.bytes),
                ));
            }
        }
        v
    };
    let a_sent = sent_by(&mut p, 0);
    let b_sent = sent_by(&mut p, 1);
    // A knows nothing of B at first: its CONNREQ carries no checksum.
    assert_eq!(a_sent[0], (KibMsgType::ConnReq, (0, None)), "{a_sent:?}");
    // B has not seen A's flavour either: its CONNACK is in B's default, signed.
    assert_eq!(b_sent[0].0, KibMsgType::ConnAck, "{b_sent:?}");
    assert_eq!(b_sent[0].1 .1, Some(CksumFlavour::Signed), "{b_sent:?}");
    // A learned signed from the CONNACK: everything after it is signed.
    let after: Vec<_> = a_sent[1..].iter().map(|(_, (_, f))| *f).collect();
    assert!(!after.is_empty());
    assert!(
        after.iter().all(|f| *f == Some(CksumFlavour::Signed)),
        "{a_sent:?}"
    );
    assert_eq!(p.eps[0].stats().cksum_signed_peers, 1);
    assert_eq!(
        p.eps[1].stats().cksum_signed_peers,
        1,
        "B learned A's (signed) flavour"
    );
    assert_eq!(p.eps[0].stats().bad_msgs + p.eps[1].stats().bad_msgs, 0);
}

/// Checksums off (the default, as o2iblnd's cksum=0): nothing we send carries one.
#[test]
fn checksums_off_by_default() {
    let mut p = Pair::new("10.0.0.1@o2ib", "10.0.0.2@o2ib");
    p.eps[0].set_capture(true);
    let (a, b) = (p.eps[0].nid(), p.eps[1].nid());
    p.eps[0]
        .send(p.now, b, hdr(a, b, 16), vec![0x90; 16], 1)
        .unwrap();
    p.run();
    let mut n = 0;
    while let Some(c) = p.eps[0].poll_captured() {
        assert_eq!(carried_cksum(&c.bytes).0, 0);
        n += 1;
    }
    assert!(n >= 2);
}

/// A V2 message from `from` (instance `from_stamp`) to `to` (instance `to_stamp`), as a peer
/// (or a forger) puts it on the wire.
fn raw_msg(from: Nid, from_stamp: u64, to: Nid, to_stamp: u64, body: KibBody<'_>) -> Vec<u8> {
    let msg = KibMsg::v2((from, from_stamp), (to, to_stamp), body);
    let mut bytes = vec![0u8; msg.wire_len()];
    msg.emit(&mut bytes, EmitOpts::default()).unwrap();
    bytes
}

fn forged_connreq(from: Nid, to: Nid, stamp: u64) -> PrivateData {
    let msg = KibMsg::v2(
        (from, stamp),
        (to, 0),
        KibBody::ConnReq(ConnParams {
            queue_depth: 8,
            max_frags: 257,
            max_msg_size: MSG_SIZE as u32,
        }),
    );
    encode_private(&msg, EmitOpts::default())
}

/// A flood of connect requests from distinct NIDs that never complete: the peer table stops at
/// its limit (the excess refused NO_RESOURCES and counted), and once the handshakes time out the
/// peers are forgotten, so the table is back to empty and new peers are accepted again.
#[test]
fn idle_peers_are_forgotten_and_the_table_is_bounded() {
    let me = nid("10.0.0.1@o2ib");
    let mut cfg = EndpointConfig::new(me, 1);
    cfg.peer_limit = 3;
    let mut now = Instant::from_secs(1);
    let mut ep = Endpoint::new(cfg, now);
    let forged = |i: u32| Nid::new(me.net(), 0x0b00_0000 + i);
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..5 {
        ep.handle_connect_request(
            now,
            RequestId(u64::from(i)),
            forged_connreq(forged(i), me, 7).as_bytes(),
        );
        while let Some(a) = ep.poll_action() {
            match a {
                FabricAction::Accept { .. } => accepted += 1,
                FabricAction::Reject { private, .. } => {
                    let (rej, _) = KibRej::parse(private.as_bytes()).unwrap();
                    assert_eq!(rej.why, RejectReason::NoResources);
                    refused += 1;
                }
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!((accepted, refused), (3, 2));
    assert_eq!(ep.peer_count(), 3);
    assert_eq!(ep.stats().peer_table_full, 2);
    assert_eq!(
        ep.send(now, forged(9), hdr(me, forged(9), 1), vec![0], 1),
        Err(SendError::PeerTableFull(forged(9)))
    );
    // None of them completes the handshake: the passive deadline ends each, connd reaps them,
    // and the idle peers go.
    now = now + ep.config().tunables.connect_timeout() + Duration::from_secs(1);
    ep.handle_timeout(now);
    while ep.poll_action().is_some() {}
    ep.handle_timeout(now);
    while ep.poll_action().is_some() {}
    assert_eq!(ep.conns().count(), 0);
    assert_eq!(ep.peer_count(), 0, "idle peers were not forgotten");
    assert_eq!(ep.stats().peers_forgotten, 3);
    ep.handle_connect_request(
        now,
        RequestId(99),
        forged_connreq(forged(4), me, 7).as_bytes(),
    );
    assert!(matches!(
        ep.poll_action(),
        Some(FabricAction::Accept { .. })
    ));
}

/// A peer we talk to stays while it has a connection, and is forgotten once it is closed and
/// reaped with nothing queued.
#[test]
fn a_closed_peer_is_forgotten_after_its_reap() {
    let (mut p, ..) = connected_by_one_message();
    assert_eq!((p.eps[0].peer_count(), p.eps[1].peer_count()), (1, 1));
    p.eps[0].shutdown(p.now);
    p.run();
    assert_eq!(p.eps[1].peer_count(), 0, "B kept A after the close");
    assert_eq!(p.eps[1].stats().peers_forgotten, 1);
}

/// A pair connected by one 8-byte message from A to B: the pair, A's and B's NIDs, and B's
/// connection to A.
fn connected_by_one_message() -> (Pair, Nid, Nid, ConnId) {
    let mut p = Pair::new("10.0.0.1@o2ib", "10.0.0.2@o2ib");
    let (a, b) = (p.eps[0].nid(), p.eps[1].nid());
    p.eps[0]
        .send(p.now, b, hdr(a, b, 8), vec![1; 8], 1)
        .unwrap();
    p.run();
    assert_eq!(p.received[1].len(), 1);
    let conn_b = p.conn(1);
    (p, a, b, conn_b)
}

/// `done`, a completion matching nothing endpoint 1 started, arrives on its connection
/// `conn_b` (slot 3): counted, and the connection closed (EPROTO).
#[track_caller]
fn assert_unmatched_completion_closes(p: &mut Pair, conn_b: ConnId, done: &[u8]) {
    let now = p.now;
    p.eps[1].handle_recv(now, conn_b, 3, done);
    assert_eq!(p.eps[1].stats().unmatched_completions, 1);
    assert!(p.eps[1]
        .conns()
        .find(|c| c.id == conn_b)
        .is_none_or(|c| c.state != ConnState::Established));
}

/// A peer's PUT_REQ or GET_REQ reaches LNet as a rendezvous request and is answered once, as
/// o2iblnd's kiblnd_recv answers: when LNet matched nothing (`recv_done`) with PUT_NAK 0 or
/// GET_DONE -ENODATA, when it refuses (`refuse_rdma`) with its errno; either way carrying the
/// sender's cookie, without a credit, the request's slot reposted with its credit. Only that
/// message is answered; the connection stays up and traffic goes on. A completion for a
/// rendezvous we never started closes the connection (EPROTO).
#[test]
fn rdma_requests_nobody_wants_are_answered_one_message_at_a_time() {
    use crate::wire::errno::{ENODATA, EPROTO};
    use crate::wire::kib::RdmaFrag;
    use crate::wire::RdmaDesc;
    let (mut p, a, b, conn_b) = connected_by_one_message();
    let frags = [RdmaFrag {
        nob: 1 << 20,
        addr: 0x1000,
    }];
    let raw = |body: KibBody<'_>| raw_msg(a, 100, b, 200, body);
    let put = |cookie| {
        raw(KibBody::PutReq {
            hdr: hdr(a, b, 1 << 20),
            cookie,
        })
    };
    let get = |cookie| {
        raw(KibBody::GetReq {
            hdr: hdr(a, b, 0),
            cookie,
            rd: RdmaDesc::new(0x77, &frags),
        })
    };
    // (request, LNet refuses with this errno or declines, answer type, cookie, status)
    let requests = [
        (put(0xc0_0c1e), None, KibMsgType::PutNak, 0xc0_0c1e, 0),
        (
            get(0xc0_0c1f),
            None,
            KibMsgType::GetDone,
            0xc0_0c1f,
            -ENODATA,
        ),
        (
            put(0xc0_0c20),
            Some(EPROTO),
            KibMsgType::PutNak,
            0xc0_0c20,
            -EPROTO,
        ),
        (
            get(0xc0_0c21),
            Some(EPROTO),
            KibMsgType::GetDone,
            0xc0_0c21,
            -EPROTO,
        ),
    ];
    for (n, (bytes, refuse, want, cookie, status)) in requests.iter().enumerate() {
        let now = p.now;
        let before = p.eps[1].conns().find(|c| c.id == conn_b).unwrap();
        let (credits_before, owed_before) = (before.credits, before.outstanding_credits);
        p.eps[1].handle_recv(now, conn_b, 3, bytes);
        assert!(
            p.eps[1].poll_action().is_none(),
            "nothing goes out before LNet answers"
        );
        let rx = match p.eps[1].poll_event() {
            Some(LndEvent::BulkRequest { from, op, rx, .. }) => {
                assert_eq!(from, a);
                let want_op = if *want == KibMsgType::PutNak {
                    BulkOp::Put
                } else {
                    BulkOp::Get { sink_len: 1 << 20 }
                };
                assert_eq!(op, want_op);
                rx
            }
            other => panic!("expected a rendezvous request, got {other:?}"),
        };
        match refuse {
            Some(errno) => p.eps[1].refuse_rdma(now, rx, *errno),
            None => p.eps[1].recv_done(now, rx),
        }
        let (mut reposted, mut answer) = (false, None);
        while let Some(act) = p.eps[1].poll_action() {
            match act {
                FabricAction::PostRecv { conn, slot } => {
                    assert_eq!((conn, slot), (conn_b, 3));
                    reposted = true;
                }
                FabricAction::Send { conn, wr, bytes } => {
                    assert_eq!(conn, conn_b);
                    let (m, _) = KibMsg::parse(&bytes).unwrap();
                    let done = match m.body {
                        KibBody::PutNak(d) | KibBody::GetDone(d) => Some(d),
                        _ => None,
                    };
                    answer = Some((m.body.msg_type(), done, m.credits));
                    p.eps[1].handle_send_complete(now, conn, wr, WcStatus::Success);
                }
                other => panic!("unexpected action {other:?}"),
            }
        }
        assert!(reposted, "the request's slot goes back");
        let (kind, done, returned) = answer.expect("an answer");
        assert_eq!(kind, *want);
        assert_eq!(done.map(|d| (d.cookie, d.status)), Some((*cookie, *status)));
        assert_eq!(
            u16::from(returned),
            owed_before + 1,
            "the request's credit rides back on the answer"
        );
        let c = p.eps[1].conns().find(|c| c.id == conn_b).unwrap();
        assert_eq!(c.state, ConnState::Established);
        assert_eq!(c.credits, credits_before, "the answer took no credit");
        assert_eq!(p.eps[1].stats().rdma_refused, n as u64 + 1);
        assert!(p.eps[1].poll_event().is_none(), "LNet is told nothing more");
    }
    // The connection carries traffic on.
    p.eps[0]
        .send(p.now, b, hdr(a, b, 8), vec![2; 8], 2)
        .unwrap();
    p.run();
    assert_eq!(p.received[1].len(), 2);
    assert_eq!(p.eps[1].stats().unmatched_completions, 0);

    // A PUT_DONE matching nothing we sent closes the connection.
    let done = raw(KibBody::PutDone(Completion {
        cookie: 9,
        status: 0,
    }));
    assert_unmatched_completion_closes(&mut p, conn_b, &done);
}

/// Rendezvous completions are matched by (cookie, type, waiting, connection), as
/// kiblnd_handle_completion does: a PUT_ACK naming no PUT_REQ of ours, a PUT_ACK for a PUT_REQ
/// already answered, and a PUT_ACK whose descriptor has 258 fragments each close the
/// connection, counted; the PUT in question ends once (failed, unless its data had already
/// gone).
#[test]
fn hostile_rendezvous_completions_close_the_connection() {
    use crate::fabric::{LocalFrag, RegionId};
    use crate::wire::kib::RdmaFrag;
    use crate::wire::RdmaDesc;

    // (what b injects into a's connection, counter that must move)
    #[derive(Debug)]
    enum Forgery {
        UnknownCookie,
        AckedTwice,
        TooManyFrags,
    }
    for forgery in [
        Forgery::UnknownCookie,
        Forgery::AckedTwice,
        Forgery::TooManyFrags,
    ] {
        let (mut p, a, b, _) = connected_by_one_message();
        let conn_a = p.conn(0);
        // a starts a PUT by rendezvous; b's LND gets the PUT_REQ and its LNet holds it.
        let src = vec![LocalFrag {
            region: RegionId(1),
            offset: 0,
            len: 5000,
        }];
        p.eps[0]
            .send_put_rdma(p.now, b, hdr(a, b, 5000), src, 77)
            .unwrap();
        let now = p.now;
        let put_req_cookie = p.complete_sends(0, now, |b| match b {
            KibBody::PutReq { cookie, .. } => Some(*cookie),
            _ => None,
        });
        let cookie = put_req_cookie.expect("a PUT_REQ went out");
        let frags: Vec<RdmaFrag> = (0..258)
            .map(|k| RdmaFrag {
                nob: 4,
                addr: 0x1000 + 4 * k,
            })
            .collect();
        let ack = |src_cookie: u64, n: usize| {
            let rd = RdmaDesc::new(0x55, &frags[..n.min(257)]);
            let body = KibBody::PutAck {
                src_cookie,
                dst_cookie: 5,
                rd,
            };
            let mut bytes = raw_msg(b, 200, a, 100, body);
            if n > 257 {
                // One more fragment than a descriptor may carry, with the lengths to match.
                let len = bytes.len();
                let nfrags_at = 48 + 16 + 4;
                bytes[nfrags_at..nfrags_at + 4].copy_from_slice(&(n as u32).to_le_bytes());
                bytes[8..12].copy_from_slice(&((len + 12) as u32).to_le_bytes());
                bytes.resize(len + 12, 0);
            }
            bytes
        };
        let now = p.now;
        match forgery {
            Forgery::UnknownCookie => p.eps[0].handle_recv(now, conn_a, 5, &ack(cookie ^ 1, 1)),
            Forgery::AckedTwice => {
                // The first PUT_ACK is real (a 5000-byte sink): a writes and sends PUT_DONE.
                let good = (0..1)
                    .map(|_| RdmaFrag {
                        nob: 5000,
                        addr: 0x9000,
                    })
                    .collect::<Vec<_>>();
                let rd = RdmaDesc::new(0x55, &good);
                let body = KibBody::PutAck {
                    src_cookie: cookie,
                    dst_cookie: 5,
                    rd,
                };
                p.eps[0].handle_recv(now, conn_a, 4, &raw_msg(b, 200, a, 100, body));
                assert_eq!(p.eps[0].stats().unmatched_completions, 0);
                p.eps[0].handle_recv(now, conn_a, 5, &ack(cookie, 1));
            }
            Forgery::TooManyFrags => p.eps[0].handle_recv(now, conn_a, 5, &ack(cookie, 258)),
        }
        let st = p.eps[0].stats().clone();
        match forgery {
            Forgery::UnknownCookie | Forgery::AckedTwice => {
                assert_eq!(st.unmatched_completions, 1, "{forgery:?}")
            }
            Forgery::TooManyFrags => assert_eq!(st.bad_msgs, 1, "{forgery:?}"),
        }
        let c = p.eps[0].conns().find(|c| c.id == conn_a);
        assert!(
            c.is_none_or(|c| c.state != ConnState::Established),
            "{forgery:?}: the connection is closed"
        );
        p.run();
        let outcomes: Vec<_> = p.done[0]
            .iter()
            .filter(|e| matches!(e, LndEvent::SendDone { cookie: 77, .. }))
            .collect();
        assert_eq!(
            outcomes.len(),
            1,
            "{forgery:?}: the PUT ends once: {outcomes:?}"
        );
        // Acked twice, the PUT's write and PUT_DONE were already posted when the forgery came:
        // it may end either way. Otherwise it never got a sink.
        if !matches!(forgery, Forgery::AckedTwice) {
            assert!(
                matches!(outcomes[0], LndEvent::SendDone { result: Err(_), .. }),
                "{forgery:?}: {outcomes:?}"
            );
        }
    }
}

/// a completion's byte count cannot exceed the sink we advertised: a PUT_DONE or
/// GET_DONE claiming more than our sink holds is the peer lying (o2iblnd LASSERTs on it in
/// lnet_set_reply_msg_len); it must not reach LNet as Ok(bytes > sink).
#[test]
fn a_completion_claiming_more_than_the_sink_fails_the_transfer() {
    let (mut p, a, b, conn_b) = connected_by_one_message();
    let conn_a = p.conn(0);
    // Endpoint `i` hands its rendezvous message (whose cookie `pick` finds) to the fabric, and
    // its peer answers on `conn` with a `done` completion claiming 1 MB: transfer `cookie`'s
    // result.
    fn lied_to(
        p: &mut Pair,
        i: usize,
        conn: ConnId,
        pick: fn(&KibBody<'_>) -> Option<u64>,
        done: fn(Completion) -> KibBody<'static>,
        cookie: u64,
    ) -> Result<u32, TxError> {
        let now = p.now;
        let claim = Completion {
            cookie: p.complete_sends(i, now, pick).unwrap(),
            status: 1_000_000,
        };
        let msg = p.peer_msg(i, done(claim));
        p.eps[i].handle_recv(now, conn, 4, &msg);
        p.bulk_result(i, cookie)
    }
    let sink = RdmaSink {
        key: 1,
        frags: vec![crate::wire::RdmaFrag {
            nob: 100,
            addr: 0x1000,
        }],
    };
    let now = p.now;

    // Sink side of a PUT: b accepts a's PUT_REQ into 100 bytes; a claims 1 MB in PUT_DONE.
    let req = p.peer_msg(
        1,
        KibBody::PutReq {
            hdr: hdr(a, b, 5000),
            cookie: 0xabc,
        },
    );
    p.eps[1].handle_recv(now, conn_b, 3, &req);
    let Some(LndEvent::BulkRequest { rx, .. }) = p.eps[1].poll_event() else {
        panic!("no request")
    };
    p.eps[1].accept_put_rdma(now, rx, sink.clone(), 9);
    let put_ack = |b: &KibBody<'_>| match b {
        KibBody::PutAck { dst_cookie, .. } => Some(*dst_cookie),
        _ => None,
    };
    let put_result = lied_to(&mut p, 1, conn_b, put_ack, KibBody::PutDone, 9);

    // Requester side of a GET: a GETs into 100 bytes; b claims 1 MB in GET_DONE.
    p.eps[0]
        .send_get_rdma(now, b, hdr(a, b, 0), sink, 10)
        .unwrap();
    let get_req = |b: &KibBody<'_>| match b {
        KibBody::GetReq { cookie, .. } => Some(*cookie),
        _ => None,
    };
    let get_result = lied_to(&mut p, 0, conn_a, get_req, KibBody::GetDone, 10);
    assert_eq!(put_result, Err(TxError::Rdma(-EPROTO)));
    assert_eq!(get_result, Err(TxError::Rdma(-EPROTO)));
    assert_eq!(p.eps[0].stats().rdma_bad_descs, 1);
    assert_eq!(p.eps[1].stats().rdma_bad_descs, 1);
}

/// A GET_REQ's descriptor is checked as a PUT_ACK's is (`RdmaSink::is_valid`): unchecked, an
/// empty or wrapping fragment would reach the fabric as a malformed write, which the driver
/// refuses with WcStatus::Error, and the connection is closed as if the peer were unreachable.
#[test]
fn a_get_req_with_a_malformed_descriptor_is_not_written() {
    use crate::fabric::{check_rdma_write, LocalFrag, RegionId};
    use crate::wire::kib::RdmaFrag;
    use crate::wire::RdmaDesc;
    let (mut p, a, b, conn_b) = connected_by_one_message();
    let frags = [
        RdmaFrag {
            nob: 0,
            addr: 0x1000,
        },
        RdmaFrag {
            nob: 100,
            addr: 0x2000,
        },
    ];
    let body = KibBody::GetReq {
        hdr: hdr(a, b, 0),
        cookie: 0xabc,
        rd: RdmaDesc::new(7, &frags),
    };
    let bytes = raw_msg(a, 100, b, 200, body);
    let now = p.now;
    p.eps[1].handle_recv(now, conn_b, 3, &bytes);
    let Some(LndEvent::BulkRequest { rx, .. }) = p.eps[1].poll_event() else {
        panic!("no request")
    };
    let src = vec![LocalFrag {
        region: RegionId(1),
        offset: 0,
        len: 100,
    }];
    p.eps[1].reply_get_rdma(now, rx, src, 9);
    let mut answer = None;
    while let Some(act) = p.eps[1].poll_action() {
        match act {
            FabricAction::RdmaWrite { local, remote, .. } => {
                assert_eq!(
                    check_rdma_write(&local, &remote).map(|_| ()),
                    Ok(()),
                    "the engine asked the fabric for a malformed write: {remote:?}"
                );
            }
            FabricAction::Send { conn, wr, bytes } => {
                if let KibBody::GetDone(d) = KibMsg::parse(&bytes).unwrap().0.body {
                    answer = Some(d);
                }
                p.eps[1].handle_send_complete(now, conn, wr, WcStatus::Success);
            }
            _ => {}
        }
    }
    // Answered GET_DONE -EPROTO, nothing written, the connection kept.
    assert_eq!(answer.map(|d| (d.cookie, d.status)), Some((0xabc, -EPROTO)));
    let done: Vec<LndEvent> = std::iter::from_fn(|| p.eps[1].poll_event()).collect();
    assert!(
        done.iter().any(|e| matches!(
            e,
            LndEvent::SendDone {
                cookie: 9,
                result: Err(TxError::Rdma(s)),
                ..
            } if *s == -EPROTO
        )),
        "{done:?}"
    );
    assert_eq!(p.eps[1].stats().rdma_bad_descs, 1);
    let c = p.eps[1].conns().find(|c| c.id == conn_b).unwrap();
    assert_eq!(c.state, ConnState::Established);
}

/// A GET_DONE naming no GET_REQ of ours closes the connection (EPROTO), counted, as a
/// PUT_DONE does (kiblnd_handle_completion finds no tx). The acceptance review broke the
/// GET_DONE branch (reposting the slot instead) and no test noticed.
#[test]
fn a_get_done_for_no_get_of_ours_closes_the_connection() {
    use crate::wire::kib::Completion;
    let (mut p, _, _, conn_b) = connected_by_one_message();
    let done = p.peer_msg(
        1,
        KibBody::GetDone(Completion {
            cookie: 0x1234,
            status: 0,
        }),
    );
    assert_unmatched_completion_closes(&mut p, conn_b, &done);
}

/// The hostile-peer audit (F9): connections claiming our own NID skipped the per-peer cap
/// (300 accepted and kept), and each new connect from a NID put every connection it had on
/// probation with a NOOP of its own (n connects, n x min(n, 127) NOOPs). The cap now holds for
/// our own NID too, and a connection already on probation is not probed again.
#[test]
fn connects_claiming_our_own_nid_are_capped_and_probed_once() {
    for src in ["10.0.0.7@o2ib", "10.0.0.1@o2ib"] {
        let me = nid("10.0.0.1@o2ib");
        let src = nid(src);
        let now = Instant::from_secs(1);
        let mut ep = Endpoint::new(EndpointConfig::new(me, 1), now);
        for i in 0..300u64 {
            ep.handle_connect_request(now, RequestId(i), forged_connreq(src, me, 7).as_bytes());
            while let Some(a) = ep.poll_action() {
                if let FabricAction::Accept { conn, .. } = a {
                    ep.handle_established(now, conn, &[]);
                }
            }
        }
        // The oldest beyond the cap are closed (zombies until the fabric confirms).
        let s = ep.stats();
        let open = s.established - s.conns_lost;
        assert!(
            open <= MAX_CONNS_PER_PEER as u64,
            "{src}: {open} connections kept"
        );
        let noops = ep.stats().keepalives;
        assert!(noops <= 300, "{src}: {noops} NOOPs for 300 connects");
    }
}
