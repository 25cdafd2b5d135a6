//! Unit and property tests of the socklnd wire formats: one test per refusal (each bad field
//! gets its own [`SockError`]), emit -> parse identity in both byte orders, parsers that never
//! panic on arbitrary bytes, the ZC-ACK encoding, and the checksum.
//! Known-answer vectors are in `lnd/tests/sock_vectors.rs`.

use proptest::prelude::*;

use super::*;
use crate::wire::lnet::LNET_PID_LUSTRE;

const BE: ByteOrder = ByteOrder::Big;

fn nid(s: &str) -> Nid {
    s.parse().unwrap()
}

fn v3_hello() -> Hello {
    Hello::new(
        HelloVersion::V3,
        nid("192.168.1.2@tcp"),
        nid("192.168.1.1@tcp"),
        7,
        1,
    )
}

/// A V2/V3 HELLO encoded by hand in `order` (independent of `Hello::emit`, which is LE only),
/// with `nips` written as given.
fn encode_v3(h: &Hello, order: ByteOrder) -> [u8; HELLO_V3_LEN] {
    let mut b = [0u8; HELLO_V3_LEN];
    order.put_u32(&mut b, 0, PROTO_MAGIC);
    order.put_u32(&mut b, 4, h.version.number());
    order.put_u64(&mut b, 8, h.src_nid.raw());
    order.put_u64(&mut b, 16, h.dst_nid.raw());
    order.put_u32(&mut b, 24, h.src_pid);
    order.put_u32(&mut b, 28, h.dst_pid);
    order.put_u64(&mut b, 32, h.src_incarnation);
    order.put_u64(&mut b, 40, h.dst_incarnation);
    order.put_u32(&mut b, 48, h.ctype as u32);
    order.put_u32(&mut b, 52, h.nips);
    b
}

/// A V4 HELLO with the given 20-byte NIDs, little-endian.
fn encode_v4(src: WideNid, dst: WideNid, ctype: i32) -> [u8; HELLO_V4_LEN] {
    let mut b = [0u8; HELLO_V4_LEN];
    LE.put_u32(&mut b, 0, PROTO_MAGIC);
    LE.put_u32(&mut b, 4, 4);
    b[8..28].copy_from_slice(&src.0);
    b[28..48].copy_from_slice(&dst.0);
    LE.put_u32(&mut b, 48, LNET_PID_LUSTRE);
    LE.put_u64(&mut b, 56, 9);
    LE.put_u32(&mut b, 72, ctype as u32);
    LE.put_u32(&mut b, 76, 99); // ignored by V4
    b
}

/// A V1 HELLO (a nid4 LNet header), little-endian.
fn encode_v1(src: Nid, lnet_type: u32, ip_bytes: u32, ctype: i32) -> [u8; HELLO_V1_LEN] {
    let mut b = [0u8; HELLO_V1_LEN];
    LE.put_u32(&mut b, 0, V1_MAGIC);
    LE.put_u16(&mut b, 4, 1);
    LE.put_u16(&mut b, 6, 0);
    LE.put_u64(&mut b, 8, src.raw());
    LE.put_u32(&mut b, 20, LNET_PID_LUSTRE);
    LE.put_u32(&mut b, 24, lnet_type);
    LE.put_u32(&mut b, 28, ip_bytes);
    LE.put_u64(&mut b, 32, 5);
    LE.put_u32(&mut b, 40, ctype as u32);
    b
}

fn head_of(b: &[u8]) -> Result<HelloHead, SockError> {
    let mut h = [0u8; 8];
    h.copy_from_slice(&b[..8]);
    hello_head(&h)
}

fn parse(b: &[u8]) -> Result<Hello, SockError> {
    let h = head_of(b)?;
    Hello::parse_body(&h, &b[8..])
}

const V3_LE: HelloHead = HelloHead {
    version: HelloVersion::V3,
    order: ByteOrder::Little,
};

// ---------------------------------------------------------------------------------------------
// Every refusal
// ---------------------------------------------------------------------------------------------

#[test]
fn short_inputs() {
    let req = ConnReq::new(nid("10.0.0.1@tcp")).emit();
    assert_eq!(
        ConnReq::parse(LE, &req[..7]),
        Err(SockError::Short { need: 8, got: 7 })
    );
    assert_eq!(
        ConnReq::parse(LE, &req[..15]),
        Err(SockError::Short { need: 16, got: 15 })
    );
    let hello = v3_hello().emit().unwrap();
    assert_eq!(
        Hello::parse_body(&V3_LE, &hello[8..55]),
        Err(SockError::Short { need: 48, got: 47 })
    );
    let v4 = HelloHead {
        version: HelloVersion::V4,
        order: LE,
    };
    assert_eq!(
        Hello::parse_body(&v4, &[0; 71]),
        Err(SockError::Short { need: 72, got: 71 })
    );
    assert_eq!(
        KsockHdr::parse(&KsockHdr::LNET.emit()[..23]),
        Err(SockError::Short { need: 24, got: 23 })
    );
    assert_eq!(
        Hello::check_ips(&V3_LE, &[1, 2, 3, 4, 5]),
        Err(SockError::Short { need: 8, got: 5 })
    );
}

#[test]
fn bad_magics() {
    let mut req = ConnReq::new(nid("10.0.0.1@tcp")).emit();
    req[0] ^= 1;
    assert_eq!(
        ConnReq::parse(LE, &req),
        Err(SockError::BadMagic(ACCEPTOR_MAGIC ^ 1))
    );
    let mut hello = encode_v3(&v3_hello(), LE);
    hello[3] = 0;
    assert_eq!(
        parse(&hello),
        Err(SockError::BadMagic(PROTO_MAGIC & 0x00ff_ffff))
    );
    // The V1 magic byte-swapped: the kernel only knows it little-endian.
    let mut v1 = encode_v1(nid("10.0.0.1@tcp"), 4, 0, 1);
    v1[..4].copy_from_slice(&V1_MAGIC.to_be_bytes());
    assert_eq!(parse(&v1), Err(SockError::BadMagic(V1_MAGIC.swap_bytes())));
    // The acceptor's magic is not a HELLO's.
    assert_eq!(
        parse(&req),
        Err(SockError::BadMagic(u32::from_le_bytes([
            req[0], req[1], req[2], req[3]
        ])))
    );
}

#[test]
fn bad_versions() {
    let mut req = ConnReq::new(nid("10.0.0.1@tcp")).emit();
    for v in [0u32, 3, 0x100] {
        LE.put_u32(&mut req, 4, v);
        assert_eq!(ConnReq::parse(LE, &req), Err(SockError::BadVersion(v)));
    }
    for order in [LE, BE] {
        for v in [0u32, 1, 5, u32::MAX] {
            let mut hello = encode_v3(&v3_hello(), order);
            order.put_u32(&mut hello, 4, v);
            assert_eq!(head_of(&hello), Err(SockError::BadVersion(v)));
        }
    }
    // A V1 magic with another major/minor.
    let mut v1 = encode_v1(nid("10.0.0.1@tcp"), 4, 0, 1);
    LE.put_u16(&mut v1, 6, 1);
    assert_eq!(head_of(&v1), Err(SockError::BadVersion(0x0001_0001)));
}

#[test]
fn source_nid_any() {
    let any = Hello {
        src_nid: Nid::ANY,
        ..v3_hello()
    };
    for order in [LE, BE] {
        assert_eq!(parse(&encode_v3(&any, order)), Err(SockError::NidAny));
    }
    let dst = WideNid::from_nid(nid("10.0.0.1@tcp")).unwrap();
    assert_eq!(
        parse(&encode_v4(WideNid::ANY, dst, 1)),
        Err(SockError::NidAny)
    );
    // LNET_NID_ANY converted as lnet_nid4_to_nid converts it: the all-ones wide NID.
    assert_eq!(WideNid::from_nid(Nid::ANY), Some(WideNid::ANY));
    assert_eq!(WideNid::ANY.to_nid(), Some(Nid::ANY));
    assert_eq!(parse(&encode_v1(Nid::ANY, 4, 0, 1)), Err(SockError::NidAny));
    // A destination of ANY is nobody's business (the kernel does not check it).
    let dst_any = Hello {
        dst_nid: Nid::ANY,
        ..v3_hello()
    };
    assert_eq!(parse(&encode_v3(&dst_any, LE)), Ok(dst_any));
}

#[test]
fn too_many_ips() {
    let h = Hello {
        nips: 17,
        ..v3_hello()
    };
    assert_eq!(parse(&encode_v3(&h, BE)), Err(SockError::TooManyIps(17)));
    let h16 = Hello {
        nips: 16,
        ..v3_hello()
    };
    assert_eq!(parse(&encode_v3(&h16, LE)), Ok(h16));
    assert_eq!(
        parse(&encode_v1(nid("10.0.0.1@tcp"), 4, 17 * 4, 1)),
        Err(SockError::TooManyIps(17))
    );
    assert_eq!(
        Hello::check_ips(&V3_LE, &[1; 17 * 4]),
        Err(SockError::TooManyIps(17))
    );
}

#[test]
fn zero_ip() {
    let mut ips = [0u8; 12];
    LE.put_u32(&mut ips, 0, 0x0a00_0001);
    LE.put_u32(&mut ips, 8, 0x0a00_0002);
    assert_eq!(Hello::check_ips(&V3_LE, &ips), Err(SockError::ZeroIp));
    LE.put_u32(&mut ips, 4, 0x0a00_0003);
    assert_eq!(Hello::check_ips(&V3_LE, &ips), Ok(()));
    assert_eq!(Hello::check_ips(&V3_LE, &[]), Ok(()));
}

#[test]
fn bad_conn_types() {
    for ctype in [-2, 4, i32::MIN, i32::MAX] {
        let h = Hello {
            ctype,
            ..v3_hello()
        };
        assert_eq!(
            parse(&encode_v3(&h, LE)),
            Err(SockError::BadConnType(ctype))
        );
    }
    assert_eq!(
        parse(&encode_v1(nid("10.0.0.1@tcp"), 4, 0, 7)),
        Err(SockError::BadConnType(7))
    );
    let w = WideNid::from_nid(nid("10.0.0.1@tcp")).unwrap();
    assert_eq!(parse(&encode_v4(w, w, -5)), Err(SockError::BadConnType(-5)));
    for ctype in -1..=3 {
        let h = Hello {
            ctype,
            ..v3_hello()
        };
        assert_eq!(parse(&encode_v3(&h, LE)), Ok(h));
    }
}

#[test]
fn bad_ksock_types() {
    for t in [0u32, 0xbf, 0xc2, 0xc0_00_00_00] {
        let mut b = KsockHdr::LNET.emit();
        LE.put_u32(&mut b, 0, t);
        assert_eq!(KsockHdr::parse(&b), Err(SockError::BadMsgType(t)));
    }
    // A NOOP read in the wrong order is not a NOOP.
    assert_eq!(
        KsockHdr::parse_in(BE, &KsockHdr::KEEPALIVE.emit()),
        Err(SockError::BadMsgType(0xc000_0000))
    );
}

#[test]
fn v1_header_of_another_type() {
    for t in [0u32, 1, 2, 3, 5] {
        assert_eq!(
            parse(&encode_v1(nid("10.0.0.1@tcp"), t, 0, 1)),
            Err(SockError::V1NotHello(t))
        );
    }
}

#[test]
fn large_nids() {
    let mut w = WideNid::from_nid(nid("10.0.0.1@tcp")).unwrap();
    // Non-zero padding: the kernel would compare it, so it is not our 64-bit NID.
    w.0[19] = 1;
    let mut req = [0u8; CONNREQ_V2_LEN];
    LE.put_u32(&mut req, 0, ACCEPTOR_MAGIC);
    LE.put_u32(&mut req, 4, ACCEPTOR_V2);
    req[8..].copy_from_slice(&w.0);
    assert_eq!(ConnReq::parse(LE, &req), Err(SockError::LargeNid(w)));
    let mut w6 = [0u8; WIDE_NID_LEN];
    w6[0] = 12;
    w6[1] = 2;
    w6[4] = 0xfe;
    w6[5] = 0x80;
    w6[19] = 1;
    let w6 = WideNid(w6);
    assert_eq!(w6.to_string(), "fe80::1@tcp");
    let ok = WideNid::from_nid(nid("10.0.0.1@tcp")).unwrap();
    assert_eq!(parse(&encode_v4(w6, ok, 1)), Err(SockError::LargeNid(w6)));
    assert_eq!(parse(&encode_v4(ok, w6, 1)), Err(SockError::LargeNid(w6)));
    // Display never fails on odd bytes.
    let odd = WideNid([3; WIDE_NID_LEN]);
    assert!(odd.to_string().starts_with("<0303"));
    assert_eq!(WideNid::ANY.to_string(), "<?>");
}

#[test]
fn we_only_emit_v2_and_v3() {
    for (v, n) in [(HelloVersion::V1, 1), (HelloVersion::V4, 4)] {
        let h = Hello {
            version: v,
            ..v3_hello()
        };
        assert_eq!(h.emit(), Err(SockError::CannotEmit(n)));
    }
    assert_eq!(
        v3_hello().emit_into(&mut [0u8; 55]),
        Err(SockError::Short { need: 56, got: 55 })
    );
    // emit writes nips 0 whatever the struct says: we never send a list.
    let h = Hello {
        nips: 3,
        ..v3_hello()
    };
    assert_eq!(parse(&h.emit().unwrap()), Ok(v3_hello()));
}

#[test]
fn every_error_says_what_it_is() {
    let all = [
        SockError::Short { need: 8, got: 1 },
        SockError::BadMagic(1),
        SockError::BadVersion(9),
        SockError::NidAny,
        SockError::TooManyIps(17),
        SockError::ZeroIp,
        SockError::BadConnType(4),
        SockError::BadMsgType(0xc2),
        SockError::V1NotHello(1),
        SockError::LargeNid(WideNid::ANY),
        SockError::CannotEmit(4),
    ];
    let texts: Vec<String> = all.iter().map(ToString::to_string).collect();
    for (i, t) in texts.iter().enumerate() {
        assert!(!t.is_empty());
        assert!(!texts[..i].contains(t), "{t} twice");
    }
}

#[test]
fn conn_type_inverse_and_wire_values() {
    use ConnType::*;
    for (t, w, inv) in [
        (Any, 0, Any),
        (Control, 1, Control),
        (BulkIn, 2, BulkOut),
        (BulkOut, 3, BulkIn),
    ] {
        assert_eq!(t.to_wire(), w);
        assert_eq!(ConnType::from_wire(w), Some(t));
        assert_eq!(t.inverse(), inv);
        assert_eq!(t.inverse().inverse(), t);
    }
    assert_eq!(ConnType::from_wire(Hello::REFUSED), None);
    assert_eq!(ConnType::from_wire(4), None);
}

#[test]
fn classify_every_magic_in_both_orders() {
    for order in [LE, BE] {
        let mut b = [0u8; 4];
        order.put_u32(&mut b, 0, ACCEPTOR_MAGIC);
        assert_eq!(classify_acceptor(b), AcceptorMagic::Acceptor { order });
        order.put_u32(&mut b, 0, PROTO_MAGIC);
        assert_eq!(classify_acceptor(b), AcceptorMagic::LnetProto);
        order.put_u32(&mut b, 0, V1_MAGIC);
        assert_eq!(classify_acceptor(b), AcceptorMagic::V1Socknal);
    }
    assert_eq!(classify_acceptor([0; 4]), AcceptorMagic::Other(0));
}

// ---------------------------------------------------------------------------------------------
// Zero-copy ACKs
// ---------------------------------------------------------------------------------------------

fn noop(a: u64, b: u64) -> KsockHdr {
    KsockHdr {
        kind: KsockType::Noop,
        csum: 0,
        zc_req: a,
        zc_ack: b,
    }
}

#[test]
fn zc_ack_table_of_the_reference() {
    // LNET piggyback: cookies[0] is its own request, cookies[1] the ACK.
    let lnet = KsockHdr {
        zc_req: 9,
        zc_ack: 5,
        ..KsockHdr::LNET
    };
    assert_eq!(ZcAcks::from_hdr(&lnet), ZcAcks::One(5));
    assert_eq!(ZcAcks::from_hdr(&KsockHdr::LNET), ZcAcks::None);
    assert_eq!(
        ZcAcks::from_hdr(&KsockHdr {
            zc_ack: 1,
            ..KsockHdr::LNET
        }),
        ZcAcks::Keepalive
    );
    assert_eq!(ZcAcks::from_hdr(&noop(0, 5)), ZcAcks::One(5));
    assert_eq!(ZcAcks::from_hdr(&noop(5, 5)), ZcAcks::One(5));
    assert_eq!(ZcAcks::from_hdr(&noop(3, 7)), ZcAcks::Range(3, 7));
    assert_eq!(ZcAcks::from_hdr(&noop(9, 4)), ZcAcks::Pair(9, 4));
    assert_eq!(ZcAcks::from_hdr(&noop(0, 1)), ZcAcks::Keepalive);
    assert_eq!(ZcAcks::from_hdr(&noop(1, 1)), ZcAcks::Keepalive);
    assert_eq!(ZcAcks::from_hdr(&noop(7, 0)), ZcAcks::None);
    // Cookie 1 in a pair is never pending: two cookies acknowledged, one unknown.
    assert_eq!(ZcAcks::from_hdr(&noop(6, 1)), ZcAcks::Pair(6, 1));

    let r = ZcAcks::Range(3, 7);
    assert_eq!(r.count(), 5);
    assert!((3..=7).all(|c| r.contains(c)));
    assert!(!r.contains(2) && !r.contains(8));
    let p = ZcAcks::Pair(9, 4);
    assert_eq!(p.count(), 2);
    assert!(p.contains(9) && p.contains(4));
    assert!((5..=8).all(|c| !p.contains(c)));
    assert_eq!(ZcAcks::Keepalive.count(), 0);
    assert!(!ZcAcks::Keepalive.contains(1));
    assert_eq!(ZcAcks::Range(2, u64::MAX).count(), u64::MAX - 1);
    assert_eq!(ZcAcks::Keepalive.to_noop(), Some(KsockHdr::KEEPALIVE));
    assert_eq!(ZcAcks::None.to_noop(), None);
}

#[test]
fn zc_ack_noops_packs_runs_and_pairs() {
    let mut c = vec![10, 2, 3, 4, 20, 4, 0, 1, 30, 31, 40];
    let noops = zc_ack_noops(&mut c);
    assert!(c.is_empty());
    let sets: Vec<ZcAcks> = noops.iter().map(ZcAcks::from_hdr).collect();
    assert_eq!(
        sets,
        [
            ZcAcks::Range(2, 4),
            ZcAcks::Range(30, 31),
            ZcAcks::Pair(20, 10),
            ZcAcks::One(40)
        ]
    );
    assert!(zc_ack_noops(&mut vec![]).is_empty());
    assert!(zc_ack_noops(&mut vec![0, 1, 1]).is_empty());
    let top = zc_ack_noops(&mut vec![u64::MAX - 1, u64::MAX]);
    assert_eq!(
        top.iter().map(ZcAcks::from_hdr).collect::<Vec<_>>(),
        [ZcAcks::Range(u64::MAX - 1, u64::MAX)]
    );
}

// ---------------------------------------------------------------------------------------------
// Checksum
// ---------------------------------------------------------------------------------------------

/// Linux crc32_le, bit by bit (as socklnd-vectors.py's `_crc32_le_bitwise`).
fn crc32_le_bitwise(seed: u32, data: &[u8]) -> u32 {
    let mut crc = seed;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ if crc & 1 != 0 { 0xedb8_8320 } else { 0 };
        }
    }
    crc
}

#[test]
fn checksum_is_zlib_crc32_xor_ones() {
    // zlib.crc32 of these strings, from Python: the reference's rule is crc32 ^ 0xffffffff.
    for (s, zlib) in [
        (&b"123456789"[..], 0xcbf4_3926u32),
        (b"", 0),
        (b"a", 0xe8b7_be43),
        (b"The quick brown fox jumps over the lazy dog", 0x414f_a339),
    ] {
        let mut c = KsockCsum::new();
        c.update(s);
        assert_eq!(c.value(), zlib ^ 0xffff_ffff, "{s:?}");
        assert_eq!(c.value(), crc32_le_bitwise(!0, s));
    }
    assert_eq!(KsockCsum::default(), KsockCsum::new());
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

fn any_nid() -> impl Strategy<Value = Nid> {
    (0u64..u64::MAX).prop_map(Nid::from_raw)
}

fn any_hello() -> impl Strategy<Value = Hello> {
    (
        prop_oneof![Just(HelloVersion::V2), Just(HelloVersion::V3)],
        any_nid(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        -1i32..=3,
    )
        .prop_map(|(version, s, d, sp, dp, si, di, ctype)| Hello {
            version,
            src_nid: s,
            dst_nid: Nid::from_raw(d),
            src_pid: sp,
            dst_pid: dp,
            src_incarnation: si,
            dst_incarnation: di,
            ctype,
            nips: 0,
        })
}

fn any_ksock() -> impl Strategy<Value = KsockHdr> {
    (
        prop_oneof![Just(KsockType::Noop), Just(KsockType::Lnet)],
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(kind, csum, zc_req, zc_ack)| KsockHdr {
            kind,
            csum,
            zc_req,
            zc_ack,
        })
}

/// Cookies clustered so that runs, pairs and singles all occur, plus a few anywhere.
fn cookie_set() -> impl Strategy<Value = Vec<u64>> {
    (
        proptest::collection::vec(0u64..64, 0..40),
        proptest::collection::vec(any::<u64>(), 0..4),
    )
        .prop_map(|(mut a, b)| {
            a.extend(b);
            a
        })
}

fn every_parser(data: &[u8]) {
    let mut first4 = [0u8; 4];
    let n = data.len().min(4);
    first4[..n].copy_from_slice(&data[..n]);
    let _ = classify_acceptor(first4);
    for order in [LE, BE] {
        let _ = ConnReq::parse(order, data);
        let _ = KsockHdr::parse_in(order, data);
    }
    if data.len() >= 8 {
        let mut h = [0u8; 8];
        h.copy_from_slice(&data[..8]);
        if let Ok(head) = hello_head(&h) {
            let _ = Hello::parse_body(&head, &data[8..]);
        }
    }
    for version in [
        HelloVersion::V1,
        HelloVersion::V2,
        HelloVersion::V3,
        HelloVersion::V4,
    ] {
        for order in [LE, BE] {
            let head = HelloHead { version, order };
            if let Ok(h) = Hello::parse_body(&head, data) {
                let _ = h.conn_type();
                let _ = h.emit();
            }
            let _ = Hello::check_ips(&head, data);
        }
    }
    if let Ok(k) = KsockHdr::parse(data) {
        let z = ZcAcks::from_hdr(&k);
        let _ = (z.count(), z.contains(2), z.to_noop());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn connreq_round_trips(target in any_nid()) {
        let req = ConnReq::new(target);
        prop_assert_eq!(ConnReq::parse(LE, &req.emit()), Ok(req));
        // A big-endian dialer's request means the same.
        let mut be = [0u8; CONNREQ_LEN];
        BE.put_u32(&mut be, 0, ACCEPTOR_MAGIC);
        BE.put_u32(&mut be, 4, 1);
        BE.put_u64(&mut be, 8, target.raw());
        prop_assert_eq!(classify_acceptor([be[0], be[1], be[2], be[3]]), AcceptorMagic::Acceptor { order: BE });
        prop_assert_eq!(ConnReq::parse(BE, &be), Ok(req));
    }

    #[test]
    fn wide_nid_round_trips(raw in any::<u64>()) {
        let n = Nid::from_raw(raw);
        match WideNid::from_nid(n) {
            Some(w) => prop_assert_eq!(w.to_nid(), Some(n)),
            None => prop_assert!(n.net().lnd().number() > 255 && !n.is_any()),
        }
    }

    #[test]
    fn hello_round_trips(h in any_hello()) {
        let b = h.emit().unwrap();
        prop_assert_eq!(b.len(), HELLO_V3_LEN);
        prop_assert_eq!(parse(&b), Ok(h));
        prop_assert_eq!(&encode_v3(&h, LE)[..], &b[..]);
        // The same HELLO from a big-endian sender.
        prop_assert_eq!(parse(&encode_v3(&h, BE)), Ok(h));
    }

    #[test]
    fn ksock_hdr_round_trips(k in any_ksock()) {
        prop_assert_eq!(KsockHdr::parse(&k.emit()), Ok(k));
        prop_assert_eq!(KsockHdr::parse_in(BE, &k.emit_in(BE)), Ok(k));
    }

    #[test]
    fn parsers_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        every_parser(&data);
    }

    #[test]
    fn parsers_never_panic_on_near_valid_input(
        h in any_hello(),
        flips in proptest::collection::vec((0usize..HELLO_V3_LEN, any::<u8>()), 1..6),
        cut in 0usize..=HELLO_V3_LEN,
    ) {
        let mut b = h.emit().unwrap();
        for (at, x) in flips {
            b[at] ^= x;
        }
        every_parser(&b[..cut]);
        every_parser(&b);
    }

    /// Every set of cookies comes back whole from its NOOPs, each NOOP's set disjoint from the
    /// others, and no encoding uses more NOOPs than runs + ceil(singles / 2).
    #[test]
    fn zc_acks_round_trip(cookies in cookie_set()) {
        let mut want: Vec<u64> = cookies.iter().copied().filter(|&c| c > 1).collect();
        want.sort_unstable();
        want.dedup();
        let mut input = cookies.clone();
        let noops = zc_ack_noops(&mut input);
        prop_assert!(input.is_empty());
        let mut total = 0u64;
        for n in &noops {
            prop_assert_eq!(n.kind, KsockType::Noop);
            let set = ZcAcks::from_hdr(&KsockHdr::parse(&n.emit()).unwrap());
            prop_assert!(!matches!(set, ZcAcks::None | ZcAcks::Keepalive));
            if let ZcAcks::Pair(a, b) = set {
                prop_assert!(a > b);
                // Exactly a and b: nothing between.
                prop_assert!(b.checked_add(1).is_none_or(|m| m == a || !set.contains(m)));
            }
            total += set.count();
        }
        // Decoding: every wanted cookie in exactly one NOOP, nothing else anywhere.
        for &c in &want {
            let n = noops.iter().filter(|h| ZcAcks::from_hdr(h).contains(c)).count();
            prop_assert_eq!(n, 1, "cookie {} in {} NOOPs", c, n);
        }
        prop_assert_eq!(total, want.len() as u64);
        let runs = want.windows(2).filter(|w| w[1] != w[0] + 1).count() + usize::from(!want.is_empty());
        let singles = (0..want.len())
            .filter(|&i| {
                let prev = i > 0 && want[i - 1] + 1 == want[i];
                let next = want.get(i + 1).is_some_and(|&n| want[i].checked_add(1) == Some(n));
                !prev && !next
            })
            .count();
        prop_assert_eq!(noops.len(), runs - singles + singles.div_ceil(2));
    }

    #[test]
    fn checksum_matches_bitwise_and_is_incremental(
        data in proptest::collection::vec(any::<u8>(), 0..300),
        split in any::<prop::sample::Index>(),
    ) {
        let at = split.index(data.len() + 1);
        let mut c = KsockCsum::new();
        c.update(&data[..at]);
        c.update(&data[at..]);
        prop_assert_eq!(c.value(), crc32_le_bitwise(!0, &data));
    }
}
