//! Known-answer vectors sent by a real Lustre 2.16.1 kernel LNet (ko2iblnd, x86_64, Linux 6.1)
//! to ulnet over Soft-RoCE, from shared/reference/kernel-interop.md. Each one is parsed field by
//! field against what the reference says the kernel sent; where the message is one we also emit
//! (CONNREQ, CONNACK, IMMEDIATE), our encoder must reproduce the kernel's bytes exactly, checksum
//! included.

use lnd::wire::kib::{check_cksum, cksum_as, Checksum, CksumFlavour, EmitOpts};
use lnd::wire::ping::status;
use lnd::wire::{
    ByteOrder, ConnParams, Framing, KibBody, KibMsg, LnetBody, LnetHdr, PingInfo, WireError,
    WireHandle,
};

const V1_CONNREQ: &str = "911be90b1200c00038000000000000000100000a000005009c9add4cab6106000200000a0000050000000000000000000800010100100000";
const V2_PING_GET: &str = "911be90b1200d10078000000000000000100000a000005009c9add4cab6106000200000a00000500aa02e64cab6106000200000a000005000100000a0000050039300000393000000200000000000000337c533a2485ed180d0000000000000000000000000000800000000000000000780f000000000000";
const V3_PING_REPLY: &str = "911be90b1200d102a8000000000000000100000a000005009c9add4cab6106000200000a00000500aa02e64cab6106000200000a000005000100000a0000050039300000393000000300000030000000aa027ce677b906000100000000000000000000000000000000000000000000000000000000000000676e69701e0000003930000002000000000000000000090002000000000000000100000a00000500dec0aa1500000000";
const V4_CONNACK_CKSUM: &str = "911be90b1200c10038000000985d78a70100000a000005000f8b7e5fab6106000200000a00000500fdfb725fab6106000800010100100000";

/// The kernel's NI, 10.0.0.1@o2ib.
const KERNEL: &str = "10.0.0.1@o2ib";
/// ulnet's NI, 10.0.0.2@o2ib.
const ULNET: &str = "10.0.0.2@o2ib";
/// The kernel's incarnation in vectors 1-3, and ours as the kernel knew it.
const KERNEL_STAMP: u64 = 0x0006_61ab_4cdd_9a9c;
const ULNET_STAMP: u64 = 0x0006_61ab_4ce6_02aa;
/// LNet's PID for kernel Lustre (LNET_PID_LUSTRE).
const PID_LUSTRE: u32 = 12345;

use testkit::hex;

use testkit::nid;

/// The connparams the kernel sent in both directions (vectors 1 and 4): queue depth 8 (its
/// peer_credits), 257 fragments (IBLND_MAX_RDMA_FRAGS), 4 KiB messages (IBLND_MSG_SIZE).
const KERNEL_PARAMS: ConnParams = ConnParams {
    queue_depth: 8,
    max_frags: 257,
    max_msg_size: 4096,
};

/// A message as the kernel sent it to ulnet: version 2, no credits returned.
fn from_kernel(src_stamp: u64, dst_stamp: u64, body: KibBody<'_>) -> KibMsg<'_> {
    KibMsg {
        version: 0x12,
        credits: 0,
        src_nid: nid(KERNEL),
        src_stamp,
        dst_nid: nid(ULNET),
        dst_stamp,
        body,
    }
}

/// Parses a vector the kernel sent without a checksum: it must be `len` bytes, all of them the
/// message (`nob`), and carry cksum 0.
fn parse_unsummed<'a>(b: &'a [u8], len: usize, what: &str) -> (KibMsg<'a>, Framing) {
    assert_eq!(b.len(), len);
    let (msg, framing) =
        KibMsg::parse(b).unwrap_or_else(|e| panic!("the kernel's {what} parses: {e:?}"));
    assert_eq!(framing.nob, len);
    assert_eq!(framing.cksum, None, "cksum 0 means none");
    (msg, framing)
}

/// The vector parsed as `want`, and our encoder, asked for no checksum as the kernel was,
/// re-emits `want` as exactly the kernel's bytes.
fn assert_kernel_bytes(b: &[u8], msg: &KibMsg<'_>, want: &KibMsg<'_>) {
    assert_eq!(msg, want);
    assert_eq!(emit(want, None), b);
}

fn emit(msg: &KibMsg<'_>, checksum: Option<CksumFlavour>) -> Vec<u8> {
    let mut out = vec![0u8; msg.wire_len()];
    let n = msg
        .emit(
            &mut out,
            EmitOpts {
                order: ByteOrder::Little,
                checksum,
            },
        )
        .expect("emits");
    out.truncate(n);
    out
}

#[test]
fn vector_1_connreq() {
    let b = hex(V1_CONNREQ);
    let (msg, framing) = parse_unsummed(&b, 56, "CONNREQ");
    assert_eq!(framing.order, ByteOrder::Little);
    let want = from_kernel(KERNEL_STAMP, 0, KibBody::ConnReq(KERNEL_PARAMS));
    assert_kernel_bytes(&b, &msg, &want);
}

#[test]
fn vector_2_ping_get() {
    let b = hex(V2_PING_GET);
    let (msg, _) = parse_unsummed(&b, 120, "ping GET");
    let hdr = LnetHdr {
        dest_nid: nid(ULNET),
        src_nid: nid(KERNEL),
        dest_pid: PID_LUSTRE,
        src_pid: PID_LUSTRE,
        payload_length: 0,
        body: LnetBody::Get {
            return_wmd: WireHandle {
                interface_cookie: 0x18ed_8524_3a53_7c33,
                object_cookie: 0x0d,
            },
            // LNET_PROTO_PING_MATCHBITS on the reserved portal, room for the whole reply.
            match_bits: 0x8000_0000_0000_0000,
            ptl_index: 0,
            src_offset: 0,
            sink_length: 3960,
        },
    };
    let want = from_kernel(
        KERNEL_STAMP,
        ULNET_STAMP,
        KibBody::Immediate { hdr, payload: &[] },
    );
    assert_kernel_bytes(&b, &msg, &want);
}

#[test]
fn vector_3_ping_reply() {
    let b = hex(V3_PING_REPLY);
    let (msg, _) = parse_unsummed(&b, 168, "ping REPLY");
    assert_eq!(msg.credits, 2, "two credits returned");
    let KibBody::Immediate { hdr, payload } = msg.body else {
        panic!("an IMMEDIATE, got {:?}", msg.body);
    };
    assert_eq!(hdr.src_nid, nid(KERNEL));
    assert_eq!(hdr.dest_nid, nid(ULNET));
    assert_eq!((hdr.src_pid, hdr.dest_pid), (PID_LUSTRE, PID_LUSTRE));
    assert_eq!(hdr.payload_length, 48);
    assert_eq!(
        hdr.body,
        LnetBody::Reply {
            dst_wmd: WireHandle {
                interface_cookie: 0x0006_b977_e67c_02aa,
                object_cookie: 1,
            }
        }
    );
    assert_eq!(payload.len(), 48);
    let (ping, order) = PingInfo::parse(payload).expect("the kernel's ping info parses");
    assert_eq!(order, ByteOrder::Little);
    assert_eq!(ping.pid, PID_LUSTRE);
    assert_eq!(ping.features, 0x1e);
    assert_eq!(ping.nis.len(), 2);
    let lo = ping.nis.get(0).expect("entry 0");
    assert_eq!(lo.nid, nid("0@lo"));
    assert_eq!(
        lo.status, 2,
        "entry 0's status is the ping buffer's sequence number"
    );
    let ni = ping.nis.get(1).expect("entry 1");
    assert_eq!(ni.nid, nid(KERNEL));
    assert_eq!(ni.status, status::UP);
    assert_eq!(ni.msg_size, 0);
    // Re-emitted whole, it is the kernel's message.
    assert_eq!(emit(&msg, None), b);
}

#[test]
fn vector_4_connack_with_a_signed_checksum() {
    let b = hex(V4_CONNACK_CKSUM);
    assert_eq!(b.len(), 56);
    // The checksum is the signed-char sum (Linux 6.1 on x86); the unsigned sum differs.
    assert_eq!(cksum_as(&b, CksumFlavour::Signed), 0xa778_5d98);
    assert_eq!(cksum_as(&b, CksumFlavour::Unsigned), 0x49c0_5de1);
    assert_eq!(
        check_cksum(&b, 0xa778_5d98),
        Ok(Checksum {
            value: 0xa778_5d98,
            flavour: Some(CksumFlavour::Signed)
        })
    );
    let (msg, framing) = KibMsg::parse(&b).expect("the kernel's checksummed CONNACK verifies");
    assert_eq!(
        framing.cksum,
        Some(Checksum {
            value: 0xa778_5d98,
            flavour: Some(CksumFlavour::Signed),
        })
    );
    let want = from_kernel(
        0x0006_61ab_5f7e_8b0f,
        0x0006_61ab_5f72_fbfd,
        KibBody::ConnAck(KERNEL_PARAMS),
    );
    assert_eq!(msg, want);
    // Emitted in the signed flavour, it is byte for byte what the kernel sent.
    assert_eq!(emit(&want, Some(CksumFlavour::Signed)), b);
    // In the unsigned flavour it carries the unsigned sum, which a 6.2+ kernel computes.
    let unsigned = emit(&want, Some(CksumFlavour::Unsigned));
    assert_eq!(&unsigned[12..16], &0x49c0_5de1u32.to_le_bytes());
    assert_eq!(
        KibMsg::parse(&unsigned).expect("parses").1.cksum,
        Some(Checksum {
            value: 0x49c0_5de1,
            flavour: Some(CksumFlavour::Unsigned),
        })
    );
}

#[test]
fn a_checksum_matching_neither_flavour_is_refused() {
    let mut b = hex(V4_CONNACK_CKSUM);
    b[12..16].copy_from_slice(&0x1234_5678u32.to_le_bytes());
    assert_eq!(
        KibMsg::parse(&b).map(|_| ()),
        Err(WireError::BadChecksum {
            carried: 0x1234_5678,
            unsigned: 0x49c0_5de1,
            signed: 0xa778_5d98,
        })
    );
    // A flipped byte breaks both flavours too.
    let mut b = hex(V4_CONNACK_CKSUM);
    b[40] ^= 0x01;
    assert!(matches!(
        KibMsg::parse(&b),
        Err(WireError::BadChecksum { .. })
    ));
}

#[test]
fn every_message_we_emit_carries_exactly_its_flavours_sum() {
    // Every vector, re-emitted in each flavour, carries what that flavour computes over the
    // bytes with the field zeroed, and parses back as that flavour.
    for v in [V1_CONNREQ, V2_PING_GET, V3_PING_REPLY, V4_CONNACK_CKSUM] {
        let b = hex(v);
        let (msg, _) = KibMsg::parse(&b).expect("parses");
        for flavour in CksumFlavour::ALL {
            let out = emit(&msg, Some(flavour));
            let carried = u32::from_le_bytes(out[12..16].try_into().expect("4 bytes"));
            let mut zeroed = out.clone();
            zeroed[12..16].fill(0);
            assert_eq!(carried, cksum_as(&zeroed, flavour));
            let (again, framing) = KibMsg::parse(&out).expect("our own checksum verifies");
            assert_eq!(again, msg);
            assert_eq!(
                framing.cksum,
                Some(Checksum {
                    value: carried,
                    flavour: Some(flavour),
                }),
                "the magic's bytes >= 0x80 always tell the flavours apart"
            );
        }
    }
}
