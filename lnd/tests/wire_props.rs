//! Property tests for the wire layer: every message type round-trips in both byte orders, with and
//! without checksums; parsing arbitrary or mutated bytes never panics; each malformation the
//! receive path can meet returns its own error.

use lnd::wire::kib::{
    cksum, Checksum, CksumFlavour, EmitOpts, KibMsgType, MAX_INLINE, MAX_RDMA_FRAGS,
};
use lnd::wire::lnet::LNET_MTU;
use lnd::wire::ping::feat;
use lnd::wire::{
    ByteOrder, Completion, ConnParams, KibBody, KibMsg, KibRej, LnetBody, LnetHdr, LnetMsgType,
    NiStatus, Nid, PingInfo, RdmaDesc, RdmaFrag, RejectReason, WireError, WireHandle,
};
use proptest::prelude::*;

fn nid() -> impl Strategy<Value = Nid> {
    (0u64..u64::MAX).prop_map(Nid::from_raw)
}

fn wmd() -> impl Strategy<Value = WireHandle> {
    (any::<u64>(), any::<u64>()).prop_map(|(i, o)| WireHandle {
        interface_cookie: i,
        object_cookie: o,
    })
}

fn lnet_hdr() -> impl Strategy<Value = LnetHdr> {
    // Each body from its handle and a tuple of its other fields (`any` of a tuple draws each
    // element as `any` would); the payload length is 0 where the type forbids a payload.
    let body = prop_oneof![
        (wmd(), any::<(u64, u32)>()).prop_map(|(dst_wmd, (match_bits, mlength))| {
            let body = LnetBody::Ack {
                dst_wmd,
                match_bits,
                mlength,
            };
            (0u32, body)
        }),
        (wmd(), any::<(u64, u64, u32, u32)>(), 0..=LNET_MTU).prop_map(
            |(ack_wmd, (match_bits, hdr_data, ptl_index, offset), len)| {
                let body = LnetBody::Put {
                    ack_wmd,
                    match_bits,
                    hdr_data,
                    ptl_index,
                    offset,
                };
                (len, body)
            }
        ),
        (wmd(), any::<(u64, u32, u32, u32)>()).prop_map(
            |(return_wmd, (match_bits, ptl_index, src_offset, sink_length))| {
                let body = LnetBody::Get {
                    return_wmd,
                    match_bits,
                    ptl_index,
                    src_offset,
                    sink_length,
                };
                (0, body)
            }
        ),
        (wmd(), 0..=LNET_MTU).prop_map(|(w, len)| (len, LnetBody::Reply { dst_wmd: w })),
        any::<(u64, u32, u32)>().prop_map(|(incarnation, conn_type, len)| {
            let body = LnetBody::Hello {
                incarnation,
                conn_type,
            };
            (len, body)
        }),
    ];
    (nid(), nid(), any::<u32>(), any::<u32>(), body).prop_map(|(d, s, dp, sp, (len, body))| {
        LnetHdr {
            dest_nid: d,
            src_nid: s,
            dest_pid: dp,
            src_pid: sp,
            payload_length: len,
            body,
        }
    })
}

fn cp() -> impl Strategy<Value = ConnParams> {
    (any::<u16>(), any::<u16>(), any::<u32>()).prop_map(|(q, f, m)| ConnParams {
        queue_depth: q,
        max_frags: f,
        max_msg_size: m,
    })
}

fn frags() -> impl Strategy<Value = Vec<RdmaFrag>> {
    prop::collection::vec(
        (any::<u32>(), any::<u64>()).prop_map(|(nob, addr)| RdmaFrag { nob, addr }),
        1..=MAX_RDMA_FRAGS,
    )
}

/// Owned material from which any message can be borrowed.
#[derive(Debug, Clone)]
struct Material {
    ty: KibMsgType,
    version: u16,
    credits: u8,
    src: Nid,
    sstamp: u64,
    dst: Nid,
    dstamp: u64,
    cp: ConnParams,
    hdr: LnetHdr,
    payload: Vec<u8>,
    cookies: (u64, u64),
    status: i32,
    key: u32,
    frags: Vec<RdmaFrag>,
}

impl Material {
    fn msg(&self) -> KibMsg<'_> {
        let c = Completion {
            cookie: self.cookies.0,
            status: self.status,
        };
        let mut hdr = self.hdr;
        let body = match self.ty {
            KibMsgType::ConnReq => KibBody::ConnReq(self.cp),
            KibMsgType::ConnAck => KibBody::ConnAck(self.cp),
            KibMsgType::Noop => KibBody::Noop,
            KibMsgType::Immediate => {
                // An immediate's header announces exactly the inline bytes.
                hdr.payload_length = self.payload.len() as u32;
                if matches!(hdr.body, LnetBody::Ack { .. } | LnetBody::Get { .. }) {
                    hdr.body = LnetBody::Reply {
                        dst_wmd: WireHandle::NONE,
                    };
                }
                KibBody::Immediate {
                    hdr,
                    payload: &self.payload,
                }
            }
            KibMsgType::PutReq => KibBody::PutReq {
                hdr,
                cookie: self.cookies.0,
            },
            KibMsgType::PutNak => KibBody::PutNak(c),
            KibMsgType::PutAck => KibBody::PutAck {
                src_cookie: self.cookies.0,
                dst_cookie: self.cookies.1,
                rd: RdmaDesc::new(self.key, &self.frags),
            },
            KibMsgType::PutDone => KibBody::PutDone(c),
            KibMsgType::GetReq => KibBody::GetReq {
                hdr,
                cookie: self.cookies.0,
                rd: RdmaDesc::new(self.key, &self.frags),
            },
            KibMsgType::GetDone => KibBody::GetDone(c),
        };
        KibMsg {
            version: self.version,
            credits: self.credits,
            src_nid: self.src,
            src_stamp: self.sstamp,
            dst_nid: self.dst,
            dst_stamp: self.dstamp,
            body,
        }
    }
}

fn material() -> impl Strategy<Value = Material> {
    let ty = prop::sample::select(KibMsgType::ALL.to_vec());
    (
        (ty, prop::sample::select(vec![0x11u16, 0x12]), any::<u8>()),
        (nid(), any::<u64>(), nid(), any::<u64>()),
        (cp(), lnet_hdr()),
        prop::collection::vec(any::<u8>(), 0..=MAX_INLINE),
        (any::<u64>(), any::<u64>(), any::<i32>(), any::<u32>()),
        frags(),
    )
        .prop_map(
            |(
                (ty, version, credits),
                (src, sstamp, dst, dstamp),
                (cp, hdr),
                payload,
                (c0, c1, status, key),
                frags,
            )| {
                Material {
                    ty,
                    version,
                    credits,
                    src,
                    sstamp,
                    dst,
                    dstamp,
                    cp,
                    hdr,
                    payload,
                    cookies: (c0, c1),
                    status,
                    key,
                    frags,
                }
            },
        )
}

fn opts() -> impl Strategy<Value = EmitOpts> {
    (any::<bool>(), 0..3u8).prop_map(|(big, checksum)| EmitOpts {
        order: if big {
            ByteOrder::Big
        } else {
            ByteOrder::Little
        },
        checksum: [
            None,
            Some(CksumFlavour::Signed),
            Some(CksumFlavour::Unsigned),
        ][usize::from(checksum)],
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lnet_header_round_trips(hdr in lnet_hdr()) {
        let mut buf = [0u8; 72];
        hdr.emit(&mut buf).unwrap();
        prop_assert_eq!(LnetHdr::parse(&buf).unwrap(), hdr);
    }

    #[test]
    fn kib_messages_round_trip(m in material(), opts in opts()) {
        let msg = m.msg();
        let mut buf = vec![0u8; 4096];
        let n = msg.emit(&mut buf, opts).unwrap();
        prop_assert!(n <= 4096);
        prop_assert_eq!(n, msg.wire_len());
        let (back, framing) = KibMsg::parse(&buf[..n]).unwrap();
        prop_assert_eq!(back, msg);
        prop_assert_eq!(framing.order, opts.order);
        prop_assert_eq!(framing.nob, n);
        prop_assert_eq!(framing.cksum.is_some(), opts.checksum.is_some());
        // The checksum verifies in the flavour it was made in (or in both, when no byte >= 0x80
        // told them apart), never only in the other one.
        if let (Some(c), Some(f)) = (framing.cksum, opts.checksum) {
            prop_assert!(c.flavour.is_none_or(|got| got == f));
        }
        // A receive buffer is 4 KiB whatever the message: trailing bytes are ignored.
        let (in_slot, _) = KibMsg::parse(&buf).unwrap();
        prop_assert_eq!(in_slot, msg);
    }

    #[test]
    fn rejects_round_trip(why: u8, inc: u64, cp in cp(), big: bool, v in prop::sample::select(vec![0x11u16, 0x12])) {
        let rej = KibRej { version: v, why: RejectReason::from_code(why), incarnation: inc, cp };
        let order = if big { ByteOrder::Big } else { ByteOrder::Little };
        let mut buf = [0u8; 24];
        rej.emit(&mut buf, order).unwrap();
        prop_assert_eq!(KibRej::parse(&buf).unwrap(), (rej, order));
        prop_assert_eq!(rej.why.code(), why);
    }

    #[test]
    fn pings_round_trip(features: u32, pid: u32, nis in prop::collection::vec((nid(), any::<u32>(), any::<u32>()), 0..64), big: bool) {
        let nis: Vec<NiStatus> = nis.into_iter().map(|(nid, status, msg_size)| NiStatus { nid, status, msg_size }).collect();
        let ping = PingInfo::new(features | feat::NI_STATUS, pid, &nis);
        let order = if big { ByteOrder::Big } else { ByteOrder::Little };
        let mut buf = vec![0u8; ping.wire_len()];
        ping.emit(&mut buf, order).unwrap();
        prop_assert_eq!(PingInfo::parse(&buf).unwrap(), (ping, order));
    }

    #[test]
    fn parsing_arbitrary_bytes_never_panics(b in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = KibMsg::parse(&b);
        let _ = KibRej::parse(&b);
        let _ = PingInfo::parse(&b);
        let _ = LnetHdr::parse(&b);
    }

    #[test]
    fn parsing_mutated_messages_never_panics(m in material(), opts in opts(),
                                            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
                                            cut in any::<prop::sample::Index>()) {
        let msg = m.msg();
        let mut buf = vec![0u8; 4096];
        let n = msg.emit(&mut buf, opts).unwrap();
        buf.truncate(n);
        for (at, v) in edits {
            let i = at.index(buf.len());
            buf[i] = v;
        }
        let _ = KibMsg::parse(&buf);
        let _ = KibMsg::parse(&buf[..cut.index(buf.len() + 1)]);
    }
}

// Each malformation gets its own error.

/// A V2 message from 10.0.0.1@o2ib (stamp 1) to 10.0.0.2@o2ib (stamp 2) returning no credits:
/// the frame every malformation below starts from.
fn v2_msg(body: KibBody<'_>) -> KibMsg<'_> {
    KibMsg {
        version: 0x12,
        credits: 0,
        src_nid: "10.0.0.1@o2ib".parse().unwrap(),
        src_stamp: 1,
        dst_nid: "10.0.0.2@o2ib".parse().unwrap(),
        dst_stamp: 2,
        body,
    }
}

fn good_noop() -> Vec<u8> {
    let msg = v2_msg(KibBody::Noop);
    let mut b = vec![0u8; 48];
    msg.emit(&mut b, EmitOpts::default()).unwrap();
    b
}

fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn truncated() {
    let b = good_noop();
    assert_eq!(
        KibMsg::parse(&b[..5]),
        Err(WireError::Truncated { needed: 6, got: 5 })
    );
    assert_eq!(
        KibMsg::parse(&b[..47]),
        Err(WireError::Truncated {
            needed: 48,
            got: 47
        })
    );
    assert!(matches!(
        LnetHdr::parse(&[0; 71]),
        Err(WireError::Truncated {
            needed: 72,
            got: 71
        })
    ));
    assert!(matches!(
        KibRej::parse(&b[..20]),
        Err(WireError::Truncated {
            needed: 24,
            got: 20
        })
    ));
}

#[test]
fn bad_magic() {
    let mut b = good_noop();
    set_u32(&mut b, 0, 0xeebc_0ded); // socklnd's magic
    assert_eq!(KibMsg::parse(&b), Err(WireError::BadMagic(0xeebc_0ded)));
    assert!(matches!(PingInfo::parse(&b), Err(WireError::BadMagic(_))));
}

#[test]
fn bad_version() {
    let mut b = good_noop();
    b[4..6].copy_from_slice(&0x13u16.to_le_bytes());
    assert_eq!(KibMsg::parse(&b), Err(WireError::BadVersion(0x13)));
}

#[test]
fn nob_larger_than_buffer() {
    let mut b = good_noop();
    set_u32(&mut b, 8, 49);
    assert_eq!(
        KibMsg::parse(&b),
        Err(WireError::NobTooLarge { nob: 49, got: 48 })
    );
}

#[test]
fn nob_too_small_for_type() {
    let mut b = good_noop();
    b[6] = KibMsgType::PutDone as u8;
    assert_eq!(
        KibMsg::parse(&b),
        Err(WireError::NobTooSmall { nob: 48, min: 60 })
    );
}

fn put_ack(nfrags_on_wire: u32, frags_sent: usize) -> Vec<u8> {
    let frags = vec![RdmaFrag { nob: 1, addr: 2 }; frags_sent.max(1)];
    let msg = v2_msg(KibBody::PutAck {
        src_cookie: 1,
        dst_cookie: 2,
        rd: RdmaDesc::new(7, &frags),
    });
    let mut b = vec![0u8; 4096];
    let n = msg.emit(&mut b, EmitOpts::default()).unwrap();
    b.truncate(n);
    set_u32(&mut b, 48 + 16 + 4, nfrags_on_wire);
    b
}

#[test]
fn fragment_count_out_of_range() {
    assert_eq!(
        KibMsg::parse(&put_ack(0, 1)),
        Err(WireError::BadFragCount(0))
    );
    assert_eq!(
        KibMsg::parse(&put_ack(258, 1)),
        Err(WireError::BadFragCount(258))
    );
    // A count the message is too short to hold.
    assert!(matches!(
        KibMsg::parse(&put_ack(3, 2)),
        Err(WireError::NobTooSmall { .. })
    ));
    // Emitting refuses them too.
    let frags = vec![RdmaFrag { nob: 1, addr: 2 }; 258];
    let msg = KibMsg {
        version: 0x12,
        credits: 0,
        src_nid: Nid::LO_0,
        src_stamp: 0,
        dst_nid: Nid::LO_0,
        dst_stamp: 0,
        body: KibBody::PutAck {
            src_cookie: 0,
            dst_cookie: 0,
            rd: RdmaDesc::new(0, &frags),
        },
    };
    assert_eq!(
        msg.emit(&mut [0u8; 8192], EmitOpts::default()),
        Err(WireError::BadFragCount(258))
    );
}

fn immediate(payload: &[u8]) -> KibMsg<'_> {
    v2_msg(KibBody::Immediate {
        hdr: LnetHdr {
            dest_nid: Nid::LO_0,
            src_nid: Nid::LO_0,
            dest_pid: 0,
            src_pid: 0,
            payload_length: payload.len() as u32,
            body: LnetBody::Reply {
                dst_wmd: WireHandle::NONE,
            },
        },
        payload,
    })
}

#[test]
fn inline_payload_too_large() {
    let big = vec![0u8; MAX_INLINE + 1];
    assert_eq!(
        immediate(&big).emit(&mut [0u8; 8192], EmitOpts::default()),
        Err(WireError::InlineTooLarge(3977))
    );
    // On receive: a 4097-byte IMMEDIATE.
    let fits = vec![0u8; MAX_INLINE];
    let mut b = vec![0u8; 4097];
    immediate(&fits).emit(&mut b, EmitOpts::default()).unwrap();
    set_u32(&mut b, 8, 4097);
    set_u32(&mut b, 48 + 28, 3977);
    assert_eq!(KibMsg::parse(&b), Err(WireError::InlineTooLarge(3977)));
}

#[test]
fn inline_shorter_than_announced() {
    let mut b = vec![0u8; 4096];
    let n = immediate(b"hello")
        .emit(&mut b, EmitOpts::default())
        .unwrap();
    set_u32(&mut b, 48 + 28, 6);
    assert_eq!(
        KibMsg::parse(&b[..n]),
        Err(WireError::InlineTooShort {
            announced: 6,
            carried: 5
        })
    );
}

#[test]
fn unknown_types() {
    let mut b = good_noop();
    b[6] = 0xd8;
    assert_eq!(KibMsg::parse(&b), Err(WireError::UnknownType(0xd8)));
    let mut b = vec![0u8; 4096];
    let n = immediate(b"").emit(&mut b, EmitOpts::default()).unwrap();
    set_u32(&mut b, 48 + 24, 5);
    assert_eq!(KibMsg::parse(&b[..n]), Err(WireError::UnknownLnetType(5)));
}

#[test]
fn impossible_lnet_payload_lengths() {
    let mut h = [0u8; 72];
    set_u32(&mut h, 24, LnetMsgType::Get as u32);
    set_u32(&mut h, 28, 1);
    assert_eq!(
        LnetHdr::parse(&h),
        Err(WireError::BadPayloadLength {
            msg_type: LnetMsgType::Get,
            len: 1
        })
    );
    set_u32(&mut h, 24, LnetMsgType::Put as u32);
    set_u32(&mut h, 28, LNET_MTU + 1);
    assert!(matches!(
        LnetHdr::parse(&h),
        Err(WireError::BadPayloadLength {
            msg_type: LnetMsgType::Put,
            ..
        })
    ));
}

#[test]
fn checksums_are_checked() {
    let msg = immediate(b"checksummed payload");
    let mut b = vec![0u8; 4096];
    let n = msg
        .emit(
            &mut b,
            EmitOpts {
                order: ByteOrder::Little,
                checksum: Some(CksumFlavour::Unsigned),
            },
        )
        .unwrap();
    let carried = u32::from_le_bytes(b[12..16].try_into().unwrap());
    assert_ne!(carried, 0);
    assert_eq!(
        cksum(&b[..n]),
        carried,
        "the sum is computed with the field zeroed"
    );
    assert_eq!(
        KibMsg::parse(&b[..n]).unwrap().1.cksum,
        Some(Checksum {
            value: carried,
            flavour: Some(CksumFlavour::Unsigned)
        })
    );
    b[n - 1] ^= 0x40;
    assert!(
        matches!(KibMsg::parse(&b[..n]), Err(WireError::BadChecksum { carried: c, .. }) if c == carried)
    );
}

#[test]
fn any_source_nid() {
    let mut b = good_noop();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(KibMsg::parse(&b), Err(WireError::AnySourceNid));
}

#[test]
fn ping_without_status() {
    let ping = PingInfo::new(feat::BASE, 1, &[]);
    let mut b = [0u8; 16];
    ping.emit(&mut b, ByteOrder::Little).unwrap();
    assert_eq!(PingInfo::parse(&b), Err(WireError::PingWithoutStatus));
    let ping = PingInfo::new(feat::BASE | feat::NI_STATUS, 1, &[]);
    ping.emit(&mut b, ByteOrder::Little).unwrap();
    set_u32(&mut b, 12, 2); // claims two entries it does not carry
    assert_eq!(
        PingInfo::parse(&b),
        Err(WireError::Truncated {
            needed: 48,
            got: 16
        })
    );
}

#[test]
fn output_buffer_too_small() {
    let msg = immediate(b"0123456789");
    assert_eq!(
        msg.emit(&mut [0u8; 129], EmitOpts::default()),
        Err(WireError::BufferTooSmall {
            needed: 130,
            got: 129
        })
    );
}
