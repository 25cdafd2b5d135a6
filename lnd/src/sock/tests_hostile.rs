//! The acceptor's refusal rows (reference 2.4), HELLO refusals (3.4), and hostile peers:
//! floods of silent connections, bad headers, bogus ZC-ACKs, trickled payloads, a peer that
//! never reads. Each is refused or bounded, and counted.

use super::tests::*;
use super::*;
use crate::iface::Lnd;
use crate::mem::SharedMem;
use crate::wire::lnet::{LNET_MTU, LNET_PID_LUSTRE};
use crate::wire::sock::{
    acceptor_refusal, ConnReq, Hello, KsockType, ACCEPTOR_MAGIC, HELLO_V3_LEN, PROTO_MAGIC,
    V1_MAGIC,
};

const X: [u8; 4] = [192, 168, 1, 50];

fn from(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(X), port)
}

fn hello(src: Nid, dst: Nid, version: HelloVersion, ctype: i32) -> Vec<u8> {
    let mut b = Hello {
        version: HelloVersion::V3,
        src_nid: src,
        dst_nid: dst,
        src_pid: LNET_PID_LUSTRE,
        dst_pid: 0,
        src_incarnation: 77,
        dst_incarnation: 0,
        ctype,
        nips: 0,
    }
    .emit()
    .unwrap();
    b[4..8].copy_from_slice(&version_number(version).to_le_bytes());
    b
}

fn version_number(v: HelloVersion) -> u32 {
    v.number()
}

/// A raw peer (NID X) through the acceptor and HELLO of node 1 (B) on a CONTROL connection.
fn raw_peer(n: &mut Net) -> usize {
    let r = n.raw_connect(1, from(1000));
    n.raw_write(r, &ConnReq::new(nid(B)).emit());
    n.raw_write(r, &hello(nid(X), nid(B), HelloVersion::V3, 1));
    let (reply, closed) = n.raw_read(r);
    assert!(!closed);
    assert_eq!(reply.len(), HELLO_V3_LEN);
    assert_eq!(reply[48], 1, "CONTROL answered with CONTROL");
    r
}

/// The raw peer `r` sends `bytes`: B closes the connection and hands LNet nothing. B's counters
/// afterwards, for the test to say which error they counted.
fn closed_by(n: &mut Net, r: usize, bytes: &[u8]) -> crate::iface::sock::SockStats {
    n.raw_write(r, bytes);
    assert!(n.raw_read(r).1);
    let stats = n.nodes[1].e.stats().clone();
    assert!(n.received(1).is_empty());
    stats
}

/// The token of the rendezvous request B raised for what the raw peer sent (its other events
/// are dropped).
fn bulk_request(n: &mut Net) -> crate::iface::RxToken {
    let evs = n.take(1);
    let Some(LndEvent::BulkRequest { rx, .. }) = evs
        .iter()
        .find(|e| matches!(e, LndEvent::BulkRequest { .. }))
    else {
        panic!("{evs:?}")
    };
    *rx
}

fn lnet_msg(k: KsockHdr, hdr: LnetHdr, payload: &[u8]) -> Vec<u8> {
    let mut b = k.emit().to_vec();
    let mut h = [0u8; 72];
    hdr.emit(&mut h).unwrap();
    b.extend_from_slice(&h);
    b.extend_from_slice(payload);
    b
}

fn put_hdr(len: u32) -> LnetHdr {
    LnetHdr::put(nid(X), nid(B), len, 4, 1)
}

/// Every row of the acceptor table (2.4), in order: what is sent back, and whether the
/// connection is closed.
#[test]
fn acceptor_refusal_rows() {
    let mut n = pair();
    // accept=secure and a source port above 1023: refused before anything is read.
    let r = n.raw_connect(1, from(1024));
    assert!(!n.raw_adopted(r));
    assert_eq!(n.nodes[1].e.stats().refused_insecure_port, 1);
    // Ports below 512 pass.
    let r = n.raw_connect(1, from(100));
    assert!(n.raw_adopted(r));
    // A HELLO with no request (LNET_PROTO_MAGIC, either order): the 16-B reply, close.
    for magic in [PROTO_MAGIC.to_le_bytes(), PROTO_MAGIC.to_be_bytes()] {
        let r = n.raw_connect(1, from(1000));
        n.raw_write(r, &magic);
        assert_eq!(n.raw_read(r), (acceptor_refusal().to_vec(), true));
    }
    // V1 socknal magic, or anything else: closed, nothing sent.
    for magic in [V1_MAGIC.to_le_bytes(), *b"GET "] {
        let r = n.raw_connect(1, from(1000));
        n.raw_write(r, &magic);
        assert_eq!(n.raw_read(r), (vec![], true));
    }
    // An unknown request version: the 16-B reply.
    let r = n.raw_connect(1, from(1000));
    let mut req = ConnReq::new(nid(B)).emit();
    req[4] = 3;
    n.raw_write(r, &req);
    assert_eq!(n.raw_read(r), (acceptor_refusal().to_vec(), true));
    // A NID that is not ours: closed, nothing sent.
    let r = n.raw_connect(1, from(1000));
    n.raw_write(r, &ConnReq::new(nid(X)).emit());
    assert_eq!(n.raw_read(r), (vec![], true));
    // A v2 request (20-byte NID, IPv6): no such NI here.
    let r = n.raw_connect(1, from(1000));
    let mut v2 = ACCEPTOR_MAGIC.to_le_bytes().to_vec();
    v2.extend_from_slice(&2u32.to_le_bytes());
    v2.extend_from_slice(&[0x0c, 0x02, 0, 0, 0x20, 1, 0x0d, 0xb8]);
    v2.extend_from_slice(&[0; 11]);
    v2.push(1);
    n.raw_write(r, &v2);
    assert_eq!(n.raw_read(r), (vec![], true));
    // A byte-swapped request (flip): accepted, then the HELLO.
    let r = n.raw_connect(1, from(1000));
    let mut be = ACCEPTOR_MAGIC.to_be_bytes().to_vec();
    be.extend_from_slice(&1u32.to_be_bytes());
    be.extend_from_slice(&nid(B).raw().to_be_bytes());
    n.raw_write(r, &be);
    n.raw_write(r, &hello(nid(X), nid(B), HelloVersion::V3, 1));
    let (reply, closed) = n.raw_read(r);
    assert_eq!((reply.len(), closed), (HELLO_V3_LEN, false));
    // Silence: the magic (then the NID) not read within accept_timeout: closed.
    let r1 = n.raw_connect(1, from(1000));
    let r2 = n.raw_connect(1, from(1000));
    n.raw_write(r2, &ConnReq::new(nid(B)).emit()[..8]);
    n.advance(Duration::from_millis(4900));
    assert!(!n.raw_read(r1).1 && !n.raw_read(r2).1);
    n.advance(Duration::from_millis(200));
    assert!(n.raw_read(r1).1 && n.raw_read(r2).1);
    let s = n.nodes[1].e.stats().clone();
    assert_eq!(s.acceptor_refusals, 3, "{s:?}");
    assert_eq!(s.refused_no_ni, 2, "{s:?}");
    assert_eq!(s.bad_magic, 2, "{s:?}");
    assert!(s.handshake_timeouts >= 2, "{s:?}");
}

/// HELLOs the listener refuses: unknown versions get a V3 HELLO of ctype -1 naming us as
/// both ends (a 2.15 kernel's answer to V4), bad fields a silent close.
#[test]
fn hello_refusals() {
    let mut n = pair();
    let b = nid(B);
    let refusal = |reply: &[u8]| {
        assert_eq!(reply.len(), HELLO_V3_LEN);
        assert_eq!(reply[4], 3, "V3");
        assert_eq!(reply[8..16], b.raw().to_le_bytes(), "src: us");
        assert_eq!(reply[16..24], b.raw().to_le_bytes(), "dst: us");
        assert_eq!(reply[48..52], (-1i32).to_le_bytes());
    };
    // V4, an unknown version (5) and V1: the refusal after the first 8 bytes.
    for head in [
        [PROTO_MAGIC.to_le_bytes(), 4u32.to_le_bytes()].concat(),
        [PROTO_MAGIC.to_le_bytes(), 5u32.to_le_bytes()].concat(),
        [V1_MAGIC.to_le_bytes(), [1, 0, 0, 0]].concat(),
    ] {
        let r = n.raw_connect(1, from(1000));
        n.raw_write(r, &ConnReq::new(b).emit());
        n.raw_write(r, &head);
        let (reply, closed) = n.raw_read(r);
        refusal(&reply);
        assert!(closed);
    }
    assert_eq!(n.nodes[1].e.stats().refused_version, 3);
    // Bad fields: closed without a word.
    let mut any = hello(nid(X), b, HelloVersion::V3, 1);
    any[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut many_ips = hello(nid(X), b, HelloVersion::V3, 1);
    many_ips[52..56].copy_from_slice(&17u32.to_le_bytes());
    let mut zero_ip = hello(nid(X), b, HelloVersion::V3, 1);
    zero_ip[52..56].copy_from_slice(&1u32.to_le_bytes());
    zero_ip.extend_from_slice(&[0; 4]);
    let bad_magic = [
        &[1u8, 2, 3, 4][..],
        &hello(nid(X), b, HelloVersion::V3, 1)[4..],
    ]
    .concat();
    for bad in [
        any,
        many_ips,
        zero_ip,
        hello(nid(X), b, HelloVersion::V3, -1),
        hello(nid(X), b, HelloVersion::V3, 7),
        // Another net's NID.
        hello(
            Nid::new(crate::wire::Net::new(crate::wire::LndType::Tcp, 1), 5),
            b,
            HelloVersion::V3,
            1,
        ),
        bad_magic,
    ] {
        let r = n.raw_connect(1, from(1000));
        n.raw_write(r, &ConnReq::new(b).emit());
        n.raw_write(r, &bad);
        assert_eq!(n.raw_read(r), (vec![], true));
    }
    // The HELLO's rest not within accept_timeout: closed.
    let r = n.raw_connect(1, from(1000));
    n.raw_write(r, &ConnReq::new(b).emit());
    n.raw_write(r, &hello(nid(X), b, HelloVersion::V3, 1)[..20]);
    n.advance(Duration::from_secs(6));
    assert!(n.raw_read(r).1);
    let s = n.nodes[1].e.stats().clone();
    assert!(s.bad_hello >= 6, "{s:?}");
    assert_eq!(s.unauthenticated, 0);
    assert!(n.established(1).is_empty());
}

/// A V2 HELLO is answered in V2 and the connection runs.
#[test]
fn v2_hello_is_answered_in_v2() {
    let mut n = pair();
    let r = n.raw_connect(1, from(1000));
    n.raw_write(r, &ConnReq::new(nid(B)).emit());
    n.raw_write(r, &hello(nid(X), nid(B), HelloVersion::V2, 1));
    let (reply, closed) = n.raw_read(r);
    assert!(!closed);
    assert_eq!((reply[4], reply[48]), (2, 1));
    n.raw_write(r, &lnet_msg(KsockHdr::LNET, put_hdr(3), b"abc"));
    assert_eq!(n.received(1).len(), 1);
}

/// A flood of connections that never speak: at most `max_unauthenticated` are held (each
/// with a few bytes of ours), the rest refused at once, all gone after accept_timeout,
/// counted; an established peer keeps working throughout.
#[test]
fn silent_connection_flood_is_bounded() {
    let mut cb = cfg(nid(B), INC_B);
    cb.max_unauthenticated = 8;
    let mut n = Net::new(vec![cfg(nid(A), INC_A), cb]);
    connect(&mut n, 0, 1);
    let raws: Vec<usize> = (0..20).map(|i| n.raw_connect(1, from(600 + i))).collect();
    let adopted = raws.iter().filter(|&&r| n.raw_adopted(r)).count();
    assert_eq!(adopted, 8);
    let s = n.nodes[1].e.stats().clone();
    assert_eq!(
        (s.refused_unauthenticated_limit, s.unauthenticated),
        (12, 8)
    );
    assert!(n.nodes[1].e.carry_bytes() < 4096 * 8);
    // The established peer is not affected.
    let (a, b) = (nid(A), nid(B));
    n.send(0, b, ping_put(a, b, 1), vec![1], 9).unwrap();
    n.run();
    assert_eq!(n.received(1).len(), 1);
    n.advance(Duration::from_secs(6));
    let s = n.nodes[1].e.stats().clone();
    assert_eq!(s.unauthenticated, 0);
    assert_eq!(s.handshake_timeouts, 8);
    assert!(raws.iter().all(|&r| n.raw_read(r).1));
    assert_eq!(n.established(1).len(), 3);
}

/// Each unauthenticated connection holds less than 4 KiB of ours while its request and HELLO
/// trickle in (reads of exactly the bytes expected).
#[test]
fn memory_before_hello_is_small() {
    let mut n = pair();
    let r = n.raw_connect(1, from(1000));
    let mut all = ConnReq::new(nid(B)).emit().to_vec();
    all.extend_from_slice(&hello(nid(X), nid(B), HelloVersion::V3, 1)[..50]);
    for b in all {
        n.raw_write(r, &[b]);
        assert!(n.nodes[1].e.carry_bytes() < 4096);
    }
    let reads: Vec<u32> = n.nodes[1]
        .log
        .iter()
        .filter_map(|a| match a {
            StreamAction::Recv {
                target: crate::stream::RecvTarget::Bytes { max },
                ..
            } => Some(*max),
            _ => None,
        })
        .collect();
    assert!(reads.iter().all(|&m| m <= 48), "{reads:?}");
}

/// A payload above LNET_MTU is a protocol error: closed, counted, nothing goes up.
#[test]
fn payload_above_mtu_closes() {
    let mut n = pair();
    let r = raw_peer(&mut n);
    let mut m = lnet_msg(KsockHdr::LNET, put_hdr(8), b"");
    m[52..56].copy_from_slice(&(LNET_MTU + 1).to_le_bytes());
    assert_eq!(closed_by(&mut n, r, &m).protocol_errors, 1);
}

/// A ZC-ACK for a cookie we never asked (we never do): closed. A keepalive NOOP is fine.
#[test]
fn bogus_zc_ack_closes_keepalive_does_not() {
    let mut n = pair();
    let r = raw_peer(&mut n);
    n.raw_write(r, &KsockHdr::KEEPALIVE.emit());
    assert!(!n.raw_read(r).1);
    assert_eq!(n.nodes[1].e.stats().noops_received, 1);
    let ack = KsockHdr {
        kind: KsockType::Noop,
        csum: 0,
        zc_req: 0,
        zc_ack: 5,
    };
    n.raw_write(r, &ack.emit());
    assert!(n.raw_read(r).1);
    assert_eq!(n.nodes[1].e.stats().protocol_errors, 1);
}

/// A peer's zero-copy request is answered as soon as the payload is in, also when nothing
/// matched it.
#[test]
fn zc_requests_are_acked_at_once() {
    let mut n = pair();
    let r = raw_peer(&mut n);
    let k = KsockHdr {
        zc_req: 7,
        ..KsockHdr::LNET
    };
    n.raw_write(r, &lnet_msg(k, put_hdr(5), b"hello"));
    let (got, _) = n.raw_read(r);
    let ack = KsockHdr {
        kind: KsockType::Noop,
        csum: 0,
        zc_req: 0,
        zc_ack: 7,
    };
    assert_eq!(got, ack.emit().to_vec());
    assert_eq!(n.received(1).len(), 1);
    // A bulk one LNet drops: acked once the payload was read.
    let k = KsockHdr {
        zc_req: 8,
        ..KsockHdr::LNET
    };
    n.raw_write(r, &lnet_msg(k, put_hdr(10_000), &[3; 10_000]));
    assert!(n.raw_read(r).0.is_empty(), "not before LNet answered");
    let rx = bulk_request(&mut n);
    let now = n.now;
    n.nodes[1].e.recv_done(now, rx);
    n.run();
    let ack8 = KsockHdr { zc_ack: 8, ..ack };
    assert_eq!(n.raw_read(r).0, ack8.emit().to_vec());
    assert_eq!(n.nodes[1].e.conn_views()[0].zc_acks_sent, 2);
}

/// Checksums (5.4): a V3 sum over the payload is checked; a wrong one closes.
#[test]
fn checksums_checked_as_the_kernel_does() {
    let mut n = pair();
    let r = raw_peer(&mut n);
    let mut c = KsockCsum::new();
    c.update(b"payload");
    let good = KsockHdr {
        csum: c.value(),
        ..KsockHdr::LNET
    };
    n.raw_write(r, &lnet_msg(good, put_hdr(7), b"payload"));
    assert_eq!(n.received(1).len(), 1);
    let bad = KsockHdr {
        csum: c.value() ^ 1,
        ..KsockHdr::LNET
    };
    let m = lnet_msg(bad, put_hdr(7), b"payload");
    assert_eq!(closed_by(&mut n, r, &m).checksum_errors, 1);
}

/// A 1 MiB PUT trickled at a byte per 40 s holds the memory LNet lent no longer than
/// grant_timeout: the landing fails (GrantExpired), the connection closes, counted.
#[test]
fn trickled_bulk_is_cut_at_the_grant_bound() {
    let mut n = pair();
    let r = raw_peer(&mut n);
    n.raw_write(r, &lnet_msg(KsockHdr::LNET, put_hdr(1 << 20), &[1]));
    let rx = bulk_request(&mut n);
    let sink = SharedMem::new(1 << 20);
    let now = n.now;
    n.nodes[1]
        .e
        .accept_bulk(now, rx, bulk_mem(&sink, 0, 1 << 20), 5);
    n.run();
    for _ in 0..3 {
        n.advance(Duration::from_millis(300));
        n.raw_write(r, &[2]);
    }
    assert!(!n.raw_read(r).1);
    n.advance(Duration::from_millis(200));
    assert!(n.raw_read(r).1, "closed within grant_timeout of the grant");
    assert_eq!(
        n.take(1),
        vec![
            bulk_done(5, nid(X), Err(TxError::GrantExpired)),
            LndEvent::PeerDown {
                nid: nid(X),
                reason: DownReason::Timeout
            }
        ]
    );
    assert_eq!(n.nodes[1].e.stats().bulk_stalls, 1);
}

/// A message started and then silent for sock_timeout closes the connection (5.7).
#[test]
fn stalled_message_closes_after_sock_timeout() {
    let mut n = pair();
    let r = raw_peer(&mut n);
    n.raw_write(r, &lnet_msg(KsockHdr::LNET, put_hdr(100), &[0; 10]));
    n.advance(Duration::from_secs(48));
    assert!(!n.raw_read(r).1);
    n.advance(Duration::from_secs(2));
    assert!(n.raw_read(r).1);
    assert_eq!(n.nodes[1].e.stats().rx_stalls, 1);
}

/// A peer that never reads: our sends make no progress for sock_timeout, the connection and
/// its siblings close, the message fails once with a typed error, the peer is reported down.
#[test]
fn peer_that_never_reads_is_closed() {
    let mut n = pair();
    connect(&mut n, 0, 1);
    for e in n.ends.values_mut() {
        if matches!(e.other, Some(Owner::Node(1, _))) {
            e.stuck = true;
        }
    }
    let (a, b) = (nid(A), nid(B));
    n.send(0, b, ping_put(a, b, 10), vec![0; 10], 4).unwrap();
    n.run();
    n.advance(Duration::from_secs(48));
    assert!(send_done(&n.take(0)).is_empty());
    n.advance(Duration::from_secs(2));
    let evs = n.take(0);
    assert_eq!(send_done(&evs), vec![(4, Err(TxError::Timeout))]);
    assert!(evs.contains(&LndEvent::PeerDown {
        nid: b,
        reason: DownReason::Timeout
    }));
    assert_eq!(n.nodes[0].e.stats().tx_stalls, 1);
    assert!(n.established(0).is_empty(), "siblings closed together");
}

/// A dial whose HELLO is never answered ends at sock_timeout; what waited fails.
#[test]
fn unanswered_hello_has_a_deadline() {
    let mut cb = cfg(nid(B), INC_B);
    cb.timeout = Duration::from_secs(100);
    let mut n = Net::new(vec![cfg(nid(A), INC_A), cb]);
    // B's answers never reach A.
    let (a, b) = (nid(A), nid(B));
    let now = n.now;
    n.stuck_adopted = true;
    n.nodes[0]
        .e
        .send(now, b, ping_put(a, b, 1), vec![1], 6)
        .unwrap();
    n.run();
    n.advance(Duration::from_secs(50));
    let done = send_done(&n.take(0));
    assert_eq!(done.len(), 1);
    assert!(done[0].1.is_err());
    assert!(
        n.nodes[0].e.stats().handshake_timeouts >= 3,
        "{:?} {:?}",
        n.nodes[0].e.stats(),
        n.nodes[0].e.conn_views()
    );
    assert!(n.nodes[0]
        .e
        .conn_views()
        .iter()
        .all(|c| c.state != "hello_sent"));
}

/// Keepalive NOOPs (5.6): after `keepalive` with nothing received, one on our BULK_IN; the
/// peer counts it and answers nothing.
#[test]
fn keepalive_noops_on_bulk_in() {
    let mut ca = cfg(nid(A), INC_A);
    ca.keepalive = Duration::from_secs(30);
    let mut n = Net::new(vec![ca, cfg(nid(B), INC_B)]);
    connect(&mut n, 0, 1);
    n.advance(Duration::from_secs(29));
    assert_eq!(n.nodes[0].e.stats().keepalives_sent, 0);
    n.advance(Duration::from_secs(2));
    assert_eq!(n.nodes[0].e.stats().keepalives_sent, 1);
    assert_eq!(n.nodes[1].e.stats().noops_received, 1);
    let ka = n.sends(0).last().unwrap().1.clone();
    assert_eq!(ka, KsockHdr::KEEPALIVE.emit().to_vec());
}

/// With accept=all, a dialer from a high port is a userspace peer: its NID is its address on
/// our net, whatever its HELLO claims, and we never dial it.
#[test]
fn userspace_peer_identity_from_its_address() {
    let mut cb = cfg(nid(B), INC_B);
    cb.accept = AcceptMode::All;
    let mut n = Net::new(vec![cfg(nid(A), INC_A), cb]);
    let r = n.raw_connect(1, from(40000));
    n.raw_write(r, &ConnReq::new(nid(B)).emit());
    n.raw_write(r, &hello(nid([10, 9, 9, 9]), nid(B), HelloVersion::V3, 1));
    assert_eq!(n.raw_read(r).0.len(), HELLO_V3_LEN);
    n.raw_write(r, &lnet_msg(KsockHdr::LNET, put_hdr(1), b"x"));
    let got = n.received(1);
    assert_eq!(got[0].0, nid(X));
    assert!(n.nodes[1].e.peer_up(nid(X)));
}

/// A's dial to X (the test listening there): its request and HELLO, and the raw peer.
fn dial_raw(n: &mut Net, cookie: u64) -> Vec<usize> {
    n.raw_listeners.push(Ipv4Addr::from(X));
    let (a, x) = (nid(A), nid(X));
    n.send(0, x, LnetHdr::put(a, x, 1, 4, 1), vec![1], cookie)
        .unwrap();
    n.run();
    let rs = core::mem::take(&mut n.raw_accepted);
    for &r in &rs {
        let (b, closed) = n.raw_read(r);
        assert!(!closed);
        assert_eq!(b.len(), 16 + HELLO_V3_LEN);
        assert_eq!(b[..16], ConnReq::new(x).emit());
    }
    rs
}

fn answer(src: Nid, version: HelloVersion, ctype: i32) -> Vec<u8> {
    let mut h = hello(src, nid(A), version, ctype);
    h[32..40].copy_from_slice(&5u64.to_le_bytes());
    h
}

/// The dialer's checks of the answer (3.5): the NID and pid dialed, the inverse type; an
/// answer in V2 is run in V2.
#[test]
fn dialer_checks_the_answer() {
    let mut n = pair();
    let rs = dial_raw(&mut n, 1);
    assert_eq!(rs.len(), 3);
    // "Connected successfully to X, but they claimed they were Y": closed, backed off.
    n.raw_write(rs[0], &answer(nid([192, 168, 1, 51]), HelloVersion::V3, 1));
    assert!(n.raw_read(rs[0]).1);
    assert_eq!(n.nodes[0].e.stats().identity_mismatch, 1);
    // BULK_IN (ours, 2) answered as BULK_IN: not the inverse.
    n.raw_write(rs[1], &answer(nid(X), HelloVersion::V3, 2));
    assert!(n.raw_read(rs[1]).1);
    // BULK_OUT (ours, 3) answered in V2 as BULK_IN: accepted, runs V2.
    n.raw_write(rs[2], &answer(nid(X), HelloVersion::V2, 2));
    let (b, closed) = n.raw_read(rs[2]);
    assert!(!closed);
    let up: Vec<SockConnView> = n.established(0);
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].ctype, "bulk_out");
    // The waiting PUT took BULK_OUT, the only one up (a "may" for a small message).
    assert_eq!(b.len(), 24 + 72 + 1);
    assert_eq!(send_done(&n.take(0)), vec![(1, Ok(()))]);
}

/// A listener that refuses every dial (ctype -1 in our version: EALREADY): redialed after
/// min_reconnect, and given up after MAX_RACES refusals in a row; what waited fails once.
#[test]
fn endless_refusals_are_bounded() {
    let mut n = pair();
    let mut rs = dial_raw(&mut n, 1);
    let mut refusals = 0;
    for _ in 0..40 {
        for r in core::mem::take(&mut rs) {
            n.raw_write(r, &answer(nid(X), HelloVersion::V3, -1));
            assert!(n.raw_read(r).1);
            refusals += 1;
        }
        n.advance(Duration::from_millis(999));
        assert!(n.raw_accepted.is_empty(), "not before min_reconnect");
        n.advance(Duration::from_millis(2));
        rs = core::mem::take(&mut n.raw_accepted);
        for &r in &rs {
            n.raw_read(r);
        }
        if rs.is_empty() {
            break;
        }
    }
    let s = n.nodes[0].e.stats().clone();
    assert_eq!(s.race_giveups, 1, "{s:?}");
    // The round that reached MAX_RACES had its last dial in flight; nothing after it.
    assert!(
        refusals >= MAX_RACES as usize && refusals < MAX_RACES as usize + 3,
        "{s:?}"
    );
    assert_eq!(s.connects, refusals as u64);
    n.advance(Duration::from_secs(120));
    assert_eq!(n.nodes[0].e.stats().connects, refusals as u64);
    let done = send_done(&n.take(0));
    assert_eq!(done, vec![(1, Err(TxError::ConnectRefused))]);
}

/// A refusal in another version (EPROTO, 3.6) is redialed at once, not after min_reconnect.
#[test]
fn refusal_in_another_version_redials_at_once() {
    let mut n = pair();
    let rs = dial_raw(&mut n, 1);
    n.raw_write(rs[0], &answer(nid(X), HelloVersion::V2, -1));
    assert!(n.raw_read(rs[0]).1);
    assert_eq!(
        n.raw_accepted.len(),
        1,
        "the CONTROL connection again, at once"
    );
    assert_eq!(n.nodes[0].e.stats().connects, 4);
}

/// A dial the network never answers (no Connected, no failure) ends at sock_timeout: counted,
/// the message fails once, the peer is told down, the next dial waits for the backoff.
#[test]
fn unanswered_dial_has_a_deadline() {
    let mut n = pair();
    n.dial_blackhole = true;
    let (a, b) = (nid(A), nid(B));
    n.send(0, b, ping_put(a, b, 1), vec![1], 8).unwrap();
    n.run();
    n.advance(Duration::from_secs(48));
    assert!(n.take(0).is_empty());
    n.advance(Duration::from_secs(2));
    let evs = n.take(0);
    assert_eq!(send_done(&evs).len(), 1);
    assert!(send_done(&evs)[0].1.is_err());
    let s = n.nodes[0].e.stats().clone();
    assert_eq!((s.connects, s.handshake_timeouts), (3, 3), "{s:?}");
    assert!(n.nodes[0].e.conn_views().is_empty());
}
