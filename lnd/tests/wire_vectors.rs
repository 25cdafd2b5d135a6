//! Known-answer vectors for the wire formats, written byte by byte from the offsets in
//! shared/reference/lustre-lnet-o2iblnd.md (sections 1.4, 1.5, 2.2, 2.3, 2.5), not produced by our
//! encoder. Each vector is parsed and compared with the expected fields, and our encoder must
//! reproduce it exactly.

use lnd::wire::kib::{EmitOpts, MAX_INLINE};
use lnd::wire::lnet::LNET_HDR_LEN;
use lnd::wire::ping::{feat, status};
use lnd::wire::{
    ByteOrder, Completion, ConnParams, KibBody, KibMsg, KibRej, LnetBody, LnetHdr, NiStatus, Nid,
    PingInfo, RdmaDesc, RdmaFrag, RejectReason, WireHandle,
};

/// Builds a byte vector from fields, each written in an explicit width and order.
struct Bytes(Vec<u8>);

/// A little- and a big-endian appender per integer width.
macro_rules! bytes_fields {
    ($($le:ident, $be:ident: $t:ty;)*) => {$(
        fn $le(mut self, v: $t) -> Bytes {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn $be(mut self, v: $t) -> Bytes {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
    )*};
}

impl Bytes {
    fn new() -> Bytes {
        Bytes(Vec::new())
    }
    fn u8(mut self, v: u8) -> Bytes {
        self.0.push(v);
        self
    }
    bytes_fields! {
        le16, be16: u16;
        le32, be32: u32;
        le64, be64: u64;
    }
    fn raw(mut self, b: &[u8]) -> Bytes {
        self.0.extend_from_slice(b);
        self
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

// 10.0.0.1@o2ib: net = 5 << 16 | 0, address 0x0a000001.
const CLIENT: u64 = 0x0005_0000_0a00_0001;
// 10.0.0.2@o2ib
const SERVER: u64 = 0x0005_0000_0a00_0002;
const CLIENT_STAMP: u64 = 0x0005_f1c2_3344_5566;
const SERVER_STAMP: u64 = 0x0005_f1c2_7788_99aa;

fn nid(raw: u64) -> Nid {
    Nid::from_raw(raw)
}

/// The 72-byte LNet PUT header, all little-endian (reference 1.4).
fn put_hdr_bytes(payload_length: u32) -> Bytes {
    Bytes::new()
        .le64(SERVER) // 0 dest_nid
        .le64(CLIENT) // 8 src_nid
        .le32(12345) // 16 dest_pid (LNET_PID_LUSTRE)
        .le32(12345 | 0x8000_0000) // 20 src_pid, userspace flag
        .le32(1) // 24 type PUT
        .le32(payload_length) // 28 payload_length
        .le64(0x1111_2222_3333_4444) // 32 ack_wmd.interface_cookie
        .le64(0x5555_6666_7777_8888) // 40 ack_wmd.object_cookie
        .le64(0x0102_0304_0506_0708) // 48 match_bits
        .le64(0xaabb_ccdd) // 56 hdr_data
        .le32(4) // 64 ptl_index
        .le32(16) // 68 offset
}

fn put_hdr(payload_length: u32) -> LnetHdr {
    LnetHdr {
        dest_nid: nid(SERVER),
        src_nid: nid(CLIENT),
        dest_pid: 12345,
        src_pid: 12345 | 0x8000_0000,
        payload_length,
        body: LnetBody::Put {
            ack_wmd: WireHandle {
                interface_cookie: 0x1111_2222_3333_4444,
                object_cookie: 0x5555_6666_7777_8888,
            },
            match_bits: 0x0102_0304_0506_0708,
            hdr_data: 0xaabb_ccdd,
            ptl_index: 4,
            offset: 16,
        },
    }
}

/// The 48-byte kib header, little-endian, as the reference's table lays it out.
fn kib_hdr_le(
    ty: u8,
    credits: u8,
    nob: u32,
    src: u64,
    sstamp: u64,
    dst: u64,
    dstamp: u64,
) -> Bytes {
    Bytes::new()
        .le32(0x0be9_1b91) // 0 magic
        .le16(0x12) // 4 version
        .u8(ty) // 6 type
        .u8(credits) // 7 credits
        .le32(nob) // 8 nob
        .le32(0) // 12 cksum
        .le64(src) // 16 srcnid
        .le64(sstamp) // 24 srcstamp
        .le64(dst) // 32 dstnid
        .le64(dstamp) // 40 dststamp
}

fn emit_le(msg: &KibMsg<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    let n = msg.emit(&mut buf, EmitOpts::default()).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn lnet_put_header() {
    let v = put_hdr_bytes(4096);
    assert_eq!(v.len(), LNET_HDR_LEN);
    let hdr = LnetHdr::parse(&v.0).unwrap();
    assert_eq!(hdr, put_hdr(4096));
    let mut out = [0u8; LNET_HDR_LEN];
    assert_eq!(hdr.emit(&mut out).unwrap(), 72);
    assert_eq!(&out[..], &v.0[..]);
}

#[test]
fn ping_reply_with_lo_and_two_nis() {
    let features = feat::BASE | feat::NI_STATUS | feat::MULTI_RAIL | feat::DISCOVERY;
    let v = Bytes::new()
        .le32(0x7069_6e67) // magic "ping"
        .le32(0x1b) // features
        .le32(12345) // pid
        .le32(3) // nnis
        .le64(0x0009_0000_0000_0000) // 0@lo
        .le32(7) // its status word is the sequence number
        .le32(0)
        .le64(CLIENT) // 10.0.0.1@o2ib
        .le32(0x15aa_c0de) // UP
        .le32(4096)
        .le64(0x0002_0001_c0a8_0102) // 192.168.1.2@tcp1
        .le32(0xdead_face) // DOWN
        .le32(4096);
    assert_eq!(features, 0x1b);
    let (ping, order) = PingInfo::parse(&v.0).unwrap();
    assert_eq!(order, ByteOrder::Little);
    let nis = [
        NiStatus::loopback(7),
        NiStatus {
            nid: "10.0.0.1@o2ib".parse().unwrap(),
            status: status::UP,
            msg_size: 4096,
        },
        NiStatus {
            nid: "192.168.1.2@tcp1".parse().unwrap(),
            status: status::DOWN,
            msg_size: 4096,
        },
    ];
    assert_eq!(ping, PingInfo::new(features, 12345, &nis));
    let mut out = vec![0u8; 256];
    let n = ping.emit(&mut out, ByteOrder::Little).unwrap();
    assert_eq!(&out[..n], &v.0[..]);
}

#[test]
fn connreq() {
    let v = kib_hdr_le(0xc0, 0, 56, CLIENT, CLIENT_STAMP, SERVER, 0)
        .le16(8) // queue_depth
        .le16(257) // max_frags
        .le32(4096); // max_msg_size
    assert_eq!(v.len(), 56);
    let (msg, framing) = KibMsg::parse(&v.0).unwrap();
    assert_eq!(framing.nob, 56);
    assert_eq!(framing.cksum, None);
    let want = KibMsg {
        version: 0x12,
        credits: 0,
        src_nid: nid(CLIENT),
        src_stamp: CLIENT_STAMP,
        dst_nid: nid(SERVER),
        dst_stamp: 0,
        body: KibBody::ConnReq(ConnParams {
            queue_depth: 8,
            max_frags: 257,
            max_msg_size: 4096,
        }),
    };
    assert_eq!(msg, want);
    assert_eq!(emit_le(&want), v.0);
}

#[test]
fn conn_stale_reject() {
    let v = Bytes::new()
        .le32(0x0be9_1b91) // magic
        .le16(0x12) // version
        .u8(5) // why: CONN_STALE
        .u8(0) // padding
        .le64(SERVER_STAMP) // the rejecter's incarnation
        .le16(8)
        .le16(257)
        .le32(4096);
    assert_eq!(v.len(), 24);
    let (rej, order) = KibRej::parse(&v.0).unwrap();
    assert_eq!(order, ByteOrder::Little);
    let want = KibRej {
        version: 0x12,
        why: RejectReason::ConnStale,
        incarnation: SERVER_STAMP,
        cp: ConnParams {
            queue_depth: 8,
            max_frags: 257,
            max_msg_size: 4096,
        },
    };
    assert_eq!(rej, want);
    let mut out = [0u8; 24];
    want.emit(&mut out, ByteOrder::Little).unwrap();
    assert_eq!(&out[..], &v.0[..]);
    // OFED pads reject private data to 148 bytes; the padding is ignored.
    let mut padded = v.0.clone();
    padded.resize(148, 0);
    assert_eq!(KibRej::parse(&padded).unwrap().0, want);
}

#[test]
fn put_ack_with_three_fragments() {
    let nob = 48 + 16 + 8 + 3 * 12;
    let v = kib_hdr_le(
        0xd4,
        2,
        nob as u32,
        SERVER,
        SERVER_STAMP,
        CLIENT,
        CLIENT_STAMP,
    )
    .le64(0xc0c0_0001) // src cookie
    .le64(0xd0d0_0002) // dst cookie
    .le32(0x00ab_cdef) // rd_key
    .le32(3) // rd_nfrags
    .le32(4096) // frag 0 nob
    .le64(0x7f00_0000_1000) // frag 0 addr (misaligned on purpose)
    .le32(4096)
    .le64(0x7f00_0000_2000)
    .le32(100)
    .le64(0x7f00_0000_3000);
    assert_eq!(v.len(), nob);
    let frags = [
        RdmaFrag {
            nob: 4096,
            addr: 0x7f00_0000_1000,
        },
        RdmaFrag {
            nob: 4096,
            addr: 0x7f00_0000_2000,
        },
        RdmaFrag {
            nob: 100,
            addr: 0x7f00_0000_3000,
        },
    ];
    let want = KibMsg {
        version: 0x12,
        credits: 2,
        src_nid: nid(SERVER),
        src_stamp: SERVER_STAMP,
        dst_nid: nid(CLIENT),
        dst_stamp: CLIENT_STAMP,
        body: KibBody::PutAck {
            src_cookie: 0xc0c0_0001,
            dst_cookie: 0xd0d0_0002,
            rd: RdmaDesc::new(0x00ab_cdef, &frags),
        },
    };
    let (msg, _) = KibMsg::parse(&v.0).unwrap();
    assert_eq!(msg, want);
    match msg.body {
        KibBody::PutAck { rd, .. } => {
            assert_eq!(rd.frags.len(), 3);
            assert_eq!(rd.frags.get(2), Some(frags[2]));
            assert_eq!(rd.frags.get(3), None);
        }
        other => panic!("parsed as {other:?}"),
    }
    assert_eq!(emit_le(&want), v.0);
}

#[test]
fn immediate_with_3976_bytes() {
    assert_eq!(MAX_INLINE, 3976);
    let payload: Vec<u8> = (0..3976u32).map(|i| (i * 7 + 3) as u8).collect();
    let v = kib_hdr_le(0xd1, 1, 4096, CLIENT, CLIENT_STAMP, SERVER, SERVER_STAMP)
        .raw(&put_hdr_bytes(3976).0)
        .raw(&payload);
    assert_eq!(v.len(), 4096);
    let want = KibMsg {
        version: 0x12,
        credits: 1,
        src_nid: nid(CLIENT),
        src_stamp: CLIENT_STAMP,
        dst_nid: nid(SERVER),
        dst_stamp: SERVER_STAMP,
        body: KibBody::Immediate {
            hdr: put_hdr(3976),
            payload: &payload,
        },
    };
    let (msg, framing) = KibMsg::parse(&v.0).unwrap();
    assert_eq!(framing.nob, 4096);
    assert_eq!(msg, want);
    assert_eq!(emit_le(&want), v.0);
}

#[test]
fn big_endian_put_done() {
    // A big-endian sender: every kib field is swapped, the magic reads 0x911be90b little-endian.
    let v = Bytes::new()
        .be32(0x0be9_1b91)
        .be16(0x12)
        .u8(0xd5)
        .u8(3)
        .be32(60)
        .be32(0)
        .be64(CLIENT)
        .be64(CLIENT_STAMP)
        .be64(SERVER)
        .be64(SERVER_STAMP)
        .be64(0xfeed_0000_0042) // cookie
        .be32(1_048_576); // status: bytes transferred
    assert_eq!(&v.0[..4], &[0x0b, 0xe9, 0x1b, 0x91]);
    let (msg, framing) = KibMsg::parse(&v.0).unwrap();
    assert_eq!(framing.order, ByteOrder::Big);
    let want = KibMsg {
        version: 0x12,
        credits: 3,
        src_nid: nid(CLIENT),
        src_stamp: CLIENT_STAMP,
        dst_nid: nid(SERVER),
        dst_stamp: SERVER_STAMP,
        body: KibBody::PutDone(Completion {
            cookie: 0xfeed_0000_0042,
            status: 1_048_576,
        }),
    };
    assert_eq!(msg, want);
    let mut out = [0u8; 64];
    let n = want
        .emit(
            &mut out,
            EmitOpts {
                order: ByteOrder::Big,
                checksum: None,
            },
        )
        .unwrap();
    assert_eq!(&out[..n], &v.0[..]);
}

#[test]
fn big_endian_immediate_keeps_lnet_header_little_endian() {
    // o2iblnd flips only its own fields; the embedded LNet header is little-endian on the wire.
    let v = Bytes::new()
        .be32(0x0be9_1b91)
        .be16(0x12)
        .u8(0xd1)
        .u8(0)
        .be32(120 + 4)
        .be32(0)
        .be64(CLIENT)
        .be64(CLIENT_STAMP)
        .be64(SERVER)
        .be64(SERVER_STAMP)
        .raw(&put_hdr_bytes(4).0)
        .raw(b"abcd");
    let (msg, _) = KibMsg::parse(&v.0).unwrap();
    assert_eq!(
        msg.body,
        KibBody::Immediate {
            hdr: put_hdr(4),
            payload: b"abcd"
        }
    );
}

#[test]
fn big_endian_ping_and_reject() {
    let v = Bytes::new()
        .be32(0x7069_6e67)
        .be32(0x3)
        .be32(12345)
        .be32(1)
        .be64(0x0009_0000_0000_0000)
        .be32(1)
        .be32(0);
    let (ping, order) = PingInfo::parse(&v.0).unwrap();
    assert_eq!(order, ByteOrder::Big);
    assert_eq!(ping.nis.get(0).unwrap().nid, Nid::LO_0);
    let r = Bytes::new()
        .be32(0x0be9_1b91)
        .be16(0x12)
        .u8(1)
        .u8(0)
        .be64(42)
        .be16(16)
        .be16(257)
        .be32(4096);
    let (rej, _) = KibRej::parse(&r.0).unwrap();
    assert_eq!(rej.why, RejectReason::ConnRace);
    assert_eq!(rej.incarnation, 42);
    assert_eq!(rej.cp.queue_depth, 16);
}
