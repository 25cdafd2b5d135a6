//! Known-answer vectors for the LNet acceptor and ksocklnd (shared/reference/lustre-socklnd.md,
//! section 9, and what `socklnd-vectors.py` next to it prints). The worked example: 192.168.1.2@tcp
//! (A, the dialer) connects to 192.168.1.1@tcp (B). Vectors 1-5 and 7a/7b are copied from the
//! script's output (1-3 and 7 are byte-identical to the 2.16.1 uapi structs filled by a C
//! program; 4 and 5 were decoded by tshark); the rest (HELLO V2, V1, the refusals, the flipped
//! forms) were built by the same script's encoders with the arguments named beside each.
//!
//! Each vector is parsed field by field against the values the reference gives, and where it is
//! something we send, our encoder must reproduce it byte for byte.

use lnd::wire::lnet::{LNET_HDR_LEN, LNET_PID_LUSTRE};
use lnd::wire::sock::{
    acceptor_refusal, classify_acceptor, hello_head, zc_ack_noops, AcceptorMagic, ConnReq,
    ConnType, Hello, HelloHead, HelloVersion, KsockCsum, KsockHdr, KsockType, SockError, WideNid,
    ZcAcks, ACCEPTOR_MAGIC, CONNREQ_LEN, CONNREQ_V2_LEN, HELLO_HEAD_LEN, HELLO_V3_LEN,
    HELLO_V4_LEN, KSOCK_HDR_LEN, KSOCK_LNET_HDR_LEN, ZC_KEEPALIVE,
};
use lnd::wire::{ByteOrder, LnetBody, LnetHdr, Nid, WireHandle};

/// 1: acceptor request v1, A -> B (target NID = B).
const ACC_REQ_V1: &str = "0071ceac010000000101a8c000000200";
/// 2: HELLO V3, A -> B, ctype CONTROL.
const HELLO_V3_A: &str = "63697245030000000201a8c0000002000101a8c0000002003930000000000000158d5871058f0e1800000000000000000100000000000000";
/// 3: HELLO V3 answer, B -> A, ctype CONTROL (the inverse of CONTROL).
const HELLO_V3_B: &str = "63697245030000000101a8c0000002000201a8c0000002003930000000000000b1d8778ff78d0e1800000000000000000100000000000000";
/// 4: KSOCK_MSG_LNET + PUT with 8 payload bytes, A -> B.
const KSOCK_PUT: &str = "c100000000000000000000000000000000000000000000000101a8c0000002000201a8c0000002003930000039300000010000000800000088776655443322110904000000000000debc0a0000000000000000000000000032000000000000004c4e657450555421";
/// 5: KSOCK_MSG_NOOP keepalive, B -> A.
const KSOCK_NOOP_KEEPALIVE: &str = "c00000000000000000000000000000000100000000000000";
/// 6: the probe PUT: dest_pid 1, src_pid 2, zero-copy request cookie 2.
const KSOCK_PROBE_PUT: &str = "c100000000000000020000000000000000000000000000000101a8c0000002000201a8c0000002000100000002000000010000000800000088776655443322110904000000000000debc0a0000000000000000000000000032000000000000004c4e657450555421";
/// 7a: acceptor request v2, target 2001:db8::1@tcp.
const ACC_REQ_V2_IPV6: &str = "0071ceac020000000c02000020010db8000000000000000000000001";
/// 7b: HELLO V4, 2001:db8::2@tcp -> 2001:db8::1@tcp, ctype CONTROL, A's incarnation.
const HELLO_V4_IPV6: &str = "63697245040000000c02000020010db80000000000000000000000020c02000020010db80000000000000000000000013930000000000000158d5871058f0e1800000000000000000100000000000000";
/// `acceptor_req_v2(nid16("192.168.1.1"))`: a v2 request whose target is an IPv4 NID.
const ACC_REQ_V2_IPV4: &str = "0071ceac0200000000020000c0a80101000000000000000000000000";
/// `struct.pack(">IIQ", ACCEPTOR_MAGIC, 1, B)`: vector 1 from a big-endian dialer.
const ACC_REQ_V1_BE: &str = "acce71000000000100020000c0a80101";
/// `hello_v3(A, B, 12345, 0, A_INC, 0, CONTROL, version=2)`.
const HELLO_V2_A: &str = "63697245020000000201a8c0000002000101a8c0000002003930000000000000158d5871058f0e1800000000000000000100000000000000";
/// `struct.pack(">IIQQIIQQiI", ...)` of vector 2: a big-endian dialer's HELLO V3.
const HELLO_V3_A_BE: &str = "457269630000000300020000c0a8010200020000c0a801010000303900000000180e8f0571588d1500000000000000000000000100000000";
/// A V1 HELLO from A (an `lnet_hdr_nid4` with the V1 magicversion in dest_nid, type HELLO,
/// payload_length 8 = two IPs, incarnation A_INC, ctype CONTROL), little-endian.
const HELLO_V1_A: &str = "ed0dbcee010000000201a8c00000020000000000393000000400000008000000158d5871058f0e180100000000000000000000000000000000000000000000000000000000000000";
/// The two IPs after `HELLO_V1_A`: 192.168.1.2, 10.0.0.2 (LE u32s).
const HELLO_V1_IPS: &str = "0201a8c00200000a";
/// `hello_v3(B, B, 12345, 0, B_INC, 0, -1)`: B's answer to a version it does not speak (V1, V4,
/// unknown): its own NID as dst_nid, ctype NONE.
const HELLO_V3_REFUSAL_B: &str = "63697245030000000101a8c0000002000101a8c0000002003930000000000000b1d8778ff78d0e180000000000000000ffffffff00000000";
/// `struct.pack("<IIQ", ACCEPTOR_MAGIC, 1, 0)`: the acceptor's reply to a HELLO without a request.
const ACCEPTOR_REFUSAL: &str = "0071ceac010000000000000000000000";

const A_INC: u64 = 1_733_480_160_123_456_789;
const B_INC: u64 = 0x180e_8df7_8f77_d8b1;

use testkit::hex;

fn a() -> Nid {
    "192.168.1.2@tcp".parse().unwrap()
}

fn b() -> Nid {
    "192.168.1.1@tcp".parse().unwrap()
}

fn head(bytes: &[u8]) -> Result<HelloHead, SockError> {
    hello_head(bytes[..HELLO_HEAD_LEN].try_into().unwrap())
}

fn first4(bytes: &[u8]) -> [u8; 4] {
    bytes[..4].try_into().unwrap()
}

#[test]
fn nids_of_the_worked_example() {
    assert_eq!(a().raw(), 0x0002_0000_c0a8_0102);
    assert_eq!(b().raw(), 0x0002_0000_c0a8_0101);
    assert_eq!(A_INC, 0x180e_8f05_7158_8d15);
}

#[test]
fn vector_1_acceptor_request_v1() {
    let v = hex(ACC_REQ_V1);
    assert_eq!(v.len(), CONNREQ_LEN);
    assert_eq!(
        classify_acceptor(first4(&v)),
        AcceptorMagic::Acceptor {
            order: ByteOrder::Little
        }
    );
    assert_eq!(ConnReq::body_len(1), Some(8));
    let req = ConnReq::parse(ByteOrder::Little, &v).unwrap();
    assert_eq!(
        req,
        ConnReq {
            version: 1,
            target: b()
        }
    );
    assert_eq!(req.emit().as_slice(), v.as_slice());
    assert_eq!(ConnReq::new(b()).emit().as_slice(), v.as_slice());
}

#[test]
fn acceptor_request_v1_from_a_big_endian_dialer() {
    let v = hex(ACC_REQ_V1_BE);
    let order = match classify_acceptor(first4(&v)) {
        AcceptorMagic::Acceptor { order } => order,
        other => panic!("not an acceptor request: {other:?}"),
    };
    assert_eq!(order, ByteOrder::Big);
    // lnet_accept swaps the version and the v1 NID of a flipped request.
    assert_eq!(
        ConnReq::parse(order, &v),
        Ok(ConnReq {
            version: 1,
            target: b()
        })
    );
    // Read in the wrong order it is not a request at all.
    assert_eq!(
        ConnReq::parse(ByteOrder::Little, &v),
        Err(SockError::BadMagic(ACCEPTOR_MAGIC.swap_bytes()))
    );
}

#[test]
fn vector_7a_acceptor_request_v2_ipv6_is_a_large_nid() {
    let v = hex(ACC_REQ_V2_IPV6);
    assert_eq!(v.len(), CONNREQ_V2_LEN);
    assert_eq!(ConnReq::body_len(2), Some(20));
    let Err(SockError::LargeNid(w)) = ConnReq::parse(ByteOrder::Little, &v) else {
        panic!("an IPv6 target must be refused as a large NID");
    };
    assert_eq!(w.0.as_slice(), &v[8..]);
    assert_eq!(w.size(), 12);
    assert_eq!(w.to_string(), "2001:db8::1@tcp");
    // The 16-byte prefix is not enough for a v2 request.
    assert_eq!(
        ConnReq::parse(ByteOrder::Little, &v[..CONNREQ_LEN]),
        Err(SockError::Short { need: 28, got: 16 })
    );
}

#[test]
fn acceptor_request_v2_with_an_ipv4_target() {
    let v = hex(ACC_REQ_V2_IPV4);
    assert_eq!(
        ConnReq::parse(ByteOrder::Little, &v),
        Ok(ConnReq {
            version: 2,
            target: b()
        })
    );
    assert_eq!(WideNid::from_nid(b()).unwrap().0.as_slice(), &v[8..]);
}

#[test]
fn the_acceptor_refusal_reply() {
    assert_eq!(
        acceptor_refusal().as_slice(),
        hex(ACCEPTOR_REFUSAL).as_slice()
    );
    // What provokes it: a HELLO where the request should be, or an unknown request version.
    assert_eq!(
        classify_acceptor(first4(&hex(HELLO_V3_A))),
        AcceptorMagic::LnetProto
    );
    assert_eq!(
        classify_acceptor(first4(&hex(HELLO_V3_A_BE))),
        AcceptorMagic::LnetProto
    );
    let mut v3 = hex(ACC_REQ_V1);
    v3[4] = 3;
    assert_eq!(ConnReq::body_len(3), None);
    assert_eq!(
        ConnReq::parse(ByteOrder::Little, &v3),
        Err(SockError::BadVersion(3))
    );
    // The old socknal's magic and anything else are closed without a reply.
    assert_eq!(
        classify_acceptor(first4(&hex(HELLO_V1_A))),
        AcceptorMagic::V1Socknal
    );
    assert_eq!(
        classify_acceptor(*b"GET "),
        AcceptorMagic::Other(u32::from_le_bytes(*b"GET "))
    );
}

fn hello_a_to_b(version: HelloVersion) -> Hello {
    Hello::new(version, a(), b(), A_INC, ConnType::Control.to_wire())
}

/// Checks a HELLO's head: its version, its byte order and the body length it announces.
fn assert_head(h: &HelloHead, version: HelloVersion, order: ByteOrder, body_len: usize) {
    assert_eq!(*h, HelloHead { version, order });
    assert_eq!(h.body_len(), body_len);
}

fn parse_hello(v: &[u8]) -> (HelloHead, Hello) {
    let h = head(v).unwrap();
    let hello = Hello::parse_body(&h, &v[HELLO_HEAD_LEN..]).unwrap();
    (h, hello)
}

#[test]
fn vector_2_hello_v3_a_to_b() {
    let v = hex(HELLO_V3_A);
    assert_eq!(v.len(), HELLO_V3_LEN);
    let (h, hello) = parse_hello(&v);
    assert_head(&h, HelloVersion::V3, ByteOrder::Little, 48);
    assert_eq!(hello, hello_a_to_b(HelloVersion::V3));
    assert_eq!(hello.conn_type(), Some(ConnType::Control));
    assert!(!hello.is_refusal());
    assert_eq!(hello.emit().unwrap(), v);
}

#[test]
fn vector_3_hello_v3_answer_b_to_a() {
    let v = hex(HELLO_V3_B);
    let (_, hello) = parse_hello(&v);
    assert_eq!(hello.src_nid, b());
    assert_eq!(hello.dst_nid, a());
    assert_eq!(hello.src_pid, LNET_PID_LUSTRE);
    assert_eq!(hello.src_incarnation, B_INC);
    // B's type is the inverse of A's CONTROL: CONTROL.
    assert_eq!(hello.conn_type(), Some(ConnType::Control.inverse()));
    let answer = Hello {
        src_nid: b(),
        dst_nid: a(),
        src_incarnation: B_INC,
        ..hello_a_to_b(HelloVersion::V3)
    };
    assert_eq!(hello, answer);
    assert_eq!(answer.emit().unwrap(), v);
}

#[test]
fn hello_v2() {
    let v = hex(HELLO_V2_A);
    let (h, hello) = parse_hello(&v);
    assert_eq!(h.version, HelloVersion::V2);
    assert_eq!(hello, hello_a_to_b(HelloVersion::V2));
    assert_eq!(hello.emit().unwrap(), v);
}

#[test]
fn hello_v3_from_a_big_endian_dialer() {
    let v = hex(HELLO_V3_A_BE);
    let (h, hello) = parse_hello(&v);
    assert_head(&h, HelloVersion::V3, ByteOrder::Big, 48);
    // Every integer swapped back, NIDs included (module doc: kernels since 2.15 miss the NIDs).
    assert_eq!(hello, hello_a_to_b(HelloVersion::V3));
    // We answer little-endian, as any x86 kernel.
    assert_eq!(hello.emit().unwrap(), hex(HELLO_V3_A));
}

#[test]
fn hello_v1_parses_and_is_answered_with_a_v3_refusal() {
    let v = hex(HELLO_V1_A);
    assert_eq!(v.len(), 72);
    let h = head(&v).unwrap();
    assert_head(&h, HelloVersion::V1, ByteOrder::Little, 64);
    let hello = Hello::parse_body(&h, &v[8..]).unwrap();
    assert_eq!(
        hello,
        Hello {
            version: HelloVersion::V1,
            src_nid: a(),
            dst_nid: Nid::from_raw(0),
            src_pid: LNET_PID_LUSTRE,
            dst_pid: 0,
            src_incarnation: A_INC,
            dst_incarnation: 0,
            ctype: 1,
            nips: 2,
        }
    );
    let ips = hex(HELLO_V1_IPS);
    assert_eq!(ips.len(), 4 * hello.nips as usize);
    assert_eq!(Hello::check_ips(&h, &ips), Ok(()));
    assert!(!h.version.is_spoken());
    assert_eq!(hello.emit(), Err(SockError::CannotEmit(1)));
    // The answer: B's own V3 HELLO with ctype NONE, naming itself.
    let refusal = Hello::refusal(b(), b(), B_INC);
    assert_eq!(refusal.emit().unwrap(), hex(HELLO_V3_REFUSAL_B));
}

#[test]
fn vector_7b_hello_v4_is_read_far_enough_to_be_refused() {
    let v = hex(HELLO_V4_IPV6);
    assert_eq!(v.len(), HELLO_V4_LEN);
    let h = head(&v).unwrap();
    assert_head(&h, HelloVersion::V4, ByteOrder::Little, 72);
    assert!(!h.version.is_spoken());
    let Err(SockError::LargeNid(src)) = Hello::parse_body(&h, &v[8..]) else {
        panic!("IPv6 NIDs do not fit a 64-bit NID");
    };
    assert_eq!(src.to_string(), "2001:db8::2@tcp");
    // A V4 HELLO with IPv4 NIDs (the 20-byte form of A and B) parses whole.
    let mut v4 = v.clone();
    v4[8..28].copy_from_slice(&WideNid::from_nid(a()).unwrap().0);
    v4[28..48].copy_from_slice(&WideNid::from_nid(b()).unwrap().0);
    let hello = Hello::parse_body(&h, &v4[8..]).unwrap();
    assert_eq!(hello, hello_a_to_b(HelloVersion::V4));
    // Either way the answer is the V3 refusal.
    assert_eq!(
        Hello::refusal(b(), b(), B_INC).emit().unwrap(),
        hex(HELLO_V3_REFUSAL_B)
    );
}

#[test]
fn a_refused_hello_carries_ctype_none() {
    let refusal = hex(HELLO_V3_REFUSAL_B);
    assert_eq!(&refusal[0x30..0x34], &[0xff; 4]);
    let (_, hello) = parse_hello(&refusal);
    assert!(hello.is_refusal());
    assert_eq!(hello.ctype, Hello::REFUSED);
    assert_eq!(hello.conn_type(), None);
}

fn worked_put() -> LnetHdr {
    LnetHdr {
        dest_nid: b(),
        src_nid: a(),
        dest_pid: LNET_PID_LUSTRE,
        src_pid: LNET_PID_LUSTRE,
        payload_length: 8,
        body: LnetBody::Put {
            ack_wmd: WireHandle {
                interface_cookie: 0x1122_3344_5566_7788,
                object_cookie: 0x409,
            },
            match_bits: 0xabcde,
            hdr_data: 0,
            ptl_index: 50,
            offset: 0,
        },
    }
}

#[test]
fn vector_4_ksock_lnet_put() {
    let v = hex(KSOCK_PUT);
    assert_eq!(v.len(), 104);
    let k = KsockHdr::parse(&v).unwrap();
    assert_eq!(k, KsockHdr::LNET);
    assert_eq!(ZcAcks::from_hdr(&k), ZcAcks::None);
    let lnet = LnetHdr::parse(&v[KSOCK_HDR_LEN..]).unwrap();
    assert_eq!(lnet, worked_put());
    let payload = &v[KSOCK_LNET_HDR_LEN..];
    assert_eq!(payload.len(), lnet.payload_length as usize);
    assert_eq!(payload, b"LNetPUT!");

    let mut out = k.emit().to_vec();
    let mut l = [0u8; LNET_HDR_LEN];
    worked_put().emit(&mut l).unwrap();
    out.extend_from_slice(&l);
    out.extend_from_slice(b"LNetPUT!");
    assert_eq!(out, v);
}

#[test]
fn vector_6_probe_put_asks_for_a_zero_copy_ack() {
    let v = hex(KSOCK_PROBE_PUT);
    let k = KsockHdr::parse(&v).unwrap();
    assert_eq!(k.kind, KsockType::Lnet);
    assert_eq!(k.zc_req, 2);
    assert_eq!(k.zc_ack, 0);
    let lnet = LnetHdr::parse(&v[KSOCK_HDR_LEN..]).unwrap();
    assert_eq!((lnet.dest_pid, lnet.src_pid), (1, 2));
    // Our answer: a NOOP acknowledging cookie 2.
    let noops = zc_ack_noops(&mut vec![k.zc_req]);
    assert_eq!(noops.len(), 1);
    assert_eq!(
        noops[0].emit().as_slice(),
        hex("c00000000000000000000000000000000200000000000000").as_slice()
    );
    assert_eq!(ZcAcks::from_hdr(&noops[0]), ZcAcks::One(2));
}

#[test]
fn vector_5_noop_keepalive() {
    let v = hex(KSOCK_NOOP_KEEPALIVE);
    assert_eq!(v.len(), KSOCK_HDR_LEN);
    let k = KsockHdr::parse(&v).unwrap();
    assert_eq!(k, KsockHdr::KEEPALIVE);
    assert_eq!(k.zc_ack, ZC_KEEPALIVE);
    assert_eq!(ZcAcks::from_hdr(&k), ZcAcks::Keepalive);
    assert_eq!(ZcAcks::from_hdr(&k).count(), 0);
    assert_eq!(KsockHdr::KEEPALIVE.emit().as_slice(), v.as_slice());
}

#[test]
fn checksum_of_the_worked_put() {
    // zlib.crc32(x) ^ 0xffffffff, as socklnd-vectors.py's ksock_csum computes it.
    let v = hex(KSOCK_PUT);
    let mut c = KsockCsum::new();
    c.update(&v);
    assert_eq!(c.value(), 0xe986_8750);
    // The same, fed header first with the csum field zeroed, then the rest in pieces.
    let mut c = KsockHdr::parse(&v).unwrap().csum_start();
    c.update(&v[24..50]);
    c.update(&v[50..]);
    assert_eq!(c.value(), 0xe986_8750);
    let mut c = KsockCsum::new();
    c.update(b"LNetPUT!");
    assert_eq!(c.value(), 0x9774_4a01);
}
