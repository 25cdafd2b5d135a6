//! o2iblnd messages (o2iblnd-idl.h; pack/unpack in o2iblnd.c kiblnd_pack_msg/kiblnd_unpack_msg).
//!
//! Every message starts with a 48-byte header in the sender's byte order:
//!
//! | offset | field        | size |
//! |--------|--------------|------|
//! | 0      | magic        | 4    |
//! | 4      | version      | 2    |
//! | 6      | type         | 1    |
//! | 7      | credits      | 1    |
//! | 8      | nob          | 4    |
//! | 12     | cksum        | 4    |
//! | 16     | srcnid       | 8    |
//! | 24     | srcstamp     | 8    |
//! | 32     | dstnid       | 8    |
//! | 40     | dststamp     | 8    |
//!
//! followed by a packed per-type body. Embedded LNet headers stay little-endian whatever the
//! message's order, because o2iblnd never flips them.

use super::list::{WireList, WireRecord};
use super::lnet::{LnetHdr, LNET_HDR_LEN};
use super::{check_len, check_room, wire_layout, ByteOrder, Nid, WireError, WireField};

/// LNET_PROTO_IB_MAGIC.
pub const IB_MAGIC: u32 = 0x0be9_1b91;
/// Protocol version 1 (IBLND_MSG_VERSION_1).
pub const VERSION_1: u16 = 0x11;
/// Protocol version 2 (IBLND_MSG_VERSION), the one we speak.
pub const VERSION_2: u16 = 0x12;
/// Bytes in the common header.
pub const KIB_HDR_LEN: usize = 48;
/// Every message buffer, and every posted receive, is this size (IBLND_MSG_SIZE).
pub const MSG_SIZE: usize = 4096;
/// Where IMMEDIATE payload starts: header + LNet header.
pub const IMMEDIATE_PAYLOAD_OFFSET: usize = KIB_HDR_LEN + LNET_HDR_LEN;
/// The most payload an IMMEDIATE message carries: 4096 - 120.
pub const MAX_INLINE: usize = MSG_SIZE - IMMEDIATE_PAYLOAD_OFFSET;
/// The most fragments one RDMA descriptor has (IBLND_MAX_RDMA_FRAGS = LNET_MAX_IOV + 1).
pub const MAX_RDMA_FRAGS: usize = 257;
/// Bytes in a reject (`struct kib_rej`).
pub const REJ_LEN: usize = 24;
/// Bytes in connparams.
pub const CONNPARAMS_LEN: usize = 8;

mod field {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const TYPE: usize = 6;
    pub const CREDITS: usize = 7;
    pub const NOB: usize = 8;
    pub const CKSUM: usize = 12;
    pub const SRCNID: usize = 16;
    pub const SRCSTAMP: usize = 24;
    pub const DSTNID: usize = 32;
    pub const DSTSTAMP: usize = 40;
    pub const BODY: usize = 48;
}

crate::wire_enum! {
    /// o2iblnd message type codes.
    pub enum KibMsgType: from_u8(u8) {
        // Connection setup (in the CM private data), then messages, then the RDMA exchanges
        // (o2iblnd-idl.h IBLND_MSG_*).
        ConnReq = 0xc0, ConnAck = 0xc1,
        Noop = 0xd0, Immediate = 0xd1,
        PutReq = 0xd2, PutNak = 0xd3, PutAck = 0xd4, PutDone = 0xd5,
        GetReq = 0xd6, GetDone = 0xd7,
    }
}

impl KibMsgType {
    /// The smallest `nob` a message of this type can have (kiblnd_msgtype2size; descriptors are
    /// counted with no fragments, the fragments are checked against `nob` separately).
    pub const fn min_nob(self) -> usize {
        match self {
            KibMsgType::ConnReq | KibMsgType::ConnAck => KIB_HDR_LEN + CONNPARAMS_LEN,
            KibMsgType::Noop => KIB_HDR_LEN,
            KibMsgType::Immediate => IMMEDIATE_PAYLOAD_OFFSET,
            KibMsgType::PutReq => KIB_HDR_LEN + LNET_HDR_LEN + 8,
            KibMsgType::PutAck => KIB_HDR_LEN + 16 + RD_HDR_LEN,
            KibMsgType::GetReq => KIB_HDR_LEN + LNET_HDR_LEN + 8 + RD_HDR_LEN,
            KibMsgType::PutNak | KibMsgType::PutDone | KibMsgType::GetDone => {
                KIB_HDR_LEN + COMPLETION_LEN
            }
        }
    }

    /// Whether sending this type consumes one of the peer's receive credits (reference 2.3).
    /// V2 NOOPs and the replies/completions travel without one.
    pub const fn needs_credit(self) -> bool {
        matches!(
            self,
            KibMsgType::Immediate | KibMsgType::PutReq | KibMsgType::GetReq
        )
    }
}

const RD_HDR_LEN: usize = 8;
const COMPLETION_LEN: usize = 12;

/// Connection parameters carried by CONNREQ, CONNACK and rejects.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConnParams {
    pub queue_depth: u16,
    pub max_frags: u16,
    pub max_msg_size: u32,
}

wire_layout!(ConnParams {
    queue_depth: u16 = 0,
    max_frags: u16 = 2,
    max_msg_size: u32 = 4
});

/// One RDMA fragment: length and address in the owner's registered region.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RdmaFrag {
    pub nob: u32,
    pub addr: u64,
}

// {nob u32, addr u64} packed: the 64-bit address is deliberately misaligned.
wire_layout!(RdmaFrag { nob: u32 = 0, addr: u64 = 4 } record 12);

/// An RDMA descriptor: one key for the whole region, and its fragments.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct RdmaDesc<'a> {
    pub key: u32,
    pub frags: WireList<'a, RdmaFrag>,
}

impl<'a> RdmaDesc<'a> {
    /// A descriptor to emit.
    pub fn new(key: u32, frags: &'a [RdmaFrag]) -> RdmaDesc<'a> {
        RdmaDesc {
            key,
            frags: WireList::Slice(frags),
        }
    }

    fn wire_len(&self) -> usize {
        RD_HDR_LEN + self.frags.len() * RdmaFrag::WIRE_LEN
    }

    /// Reads a descriptor at `at`, within a message of `nob` bytes.
    fn parse(b: &'a [u8], at: usize, nob: usize, o: ByteOrder) -> Result<RdmaDesc<'a>, WireError> {
        let nfrags = o.get_u32(b, at + 4);
        if nfrags == 0 || nfrags as usize > MAX_RDMA_FRAGS {
            return Err(WireError::BadFragCount(nfrags));
        }
        let end = at + RD_HDR_LEN + nfrags as usize * RdmaFrag::WIRE_LEN;
        if nob < end {
            return Err(WireError::NobTooSmall {
                nob: nob as u32,
                min: end,
            });
        }
        Ok(RdmaDesc {
            key: o.get_u32(b, at),
            frags: WireList::Wire {
                bytes: b.get(at + RD_HDR_LEN..end).unwrap_or_default(),
                order: o,
            },
        })
    }

    fn write(&self, b: &mut [u8], at: usize, o: ByteOrder) {
        o.put_u32(b, at, self.key);
        o.put_u32(b, at + 4, self.frags.len() as u32);
        let end = at + self.wire_len();
        if let Some(out) = b.get_mut(at + RD_HDR_LEN..end) {
            self.frags.write_all(out, o);
        }
    }
}

/// The errnos a completion status carries (negated), re-exported from the workspace's table
/// ([`super::errno`]) for the LND's users.
pub use super::errno::{EMSGSIZE, ENODATA, EPROTO};

/// The body of PUT_NAK, PUT_DONE and GET_DONE.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Completion {
    pub cookie: u64,
    /// Negative errno on failure, otherwise the bytes transferred.
    pub status: i32,
}

wire_layout!(Completion {
    cookie: u64 = 0,
    status: i32 = 8
});

/// The per-type body of a message.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum KibBody<'a> {
    ConnReq(ConnParams),
    ConnAck(ConnParams),
    /// Returns credits, or proves liveness (keepalive).
    Noop,
    /// An LNet message with its payload inline (at most [`MAX_INLINE`] bytes).
    Immediate {
        hdr: LnetHdr,
        payload: &'a [u8],
    },
    /// First step of an RDMA PUT: the sink answers with PUT_ACK or PUT_NAK.
    PutReq {
        hdr: LnetHdr,
        cookie: u64,
    },
    PutNak(Completion),
    /// The sink's buffer for an RDMA PUT.
    PutAck {
        src_cookie: u64,
        dst_cookie: u64,
        rd: RdmaDesc<'a>,
    },
    PutDone(Completion),
    /// An RDMA GET: the requester's sink buffer travels with the request.
    GetReq {
        hdr: LnetHdr,
        cookie: u64,
        rd: RdmaDesc<'a>,
    },
    GetDone(Completion),
}

impl KibBody<'_> {
    /// The message type of this body.
    pub fn msg_type(&self) -> KibMsgType {
        match self {
            KibBody::ConnReq(_) => KibMsgType::ConnReq,
            KibBody::ConnAck(_) => KibMsgType::ConnAck,
            KibBody::Noop => KibMsgType::Noop,
            KibBody::Immediate { .. } => KibMsgType::Immediate,
            KibBody::PutReq { .. } => KibMsgType::PutReq,
            KibBody::PutNak(_) => KibMsgType::PutNak,
            KibBody::PutAck { .. } => KibMsgType::PutAck,
            KibBody::PutDone(_) => KibMsgType::PutDone,
            KibBody::GetReq { .. } => KibMsgType::GetReq,
            KibBody::GetDone(_) => KibMsgType::GetDone,
        }
    }

    fn wire_len(&self) -> usize {
        match self {
            KibBody::Immediate { payload, .. } => IMMEDIATE_PAYLOAD_OFFSET + payload.len(),
            KibBody::PutAck { rd, .. } => KIB_HDR_LEN + 16 + rd.wire_len(),
            KibBody::GetReq { rd, .. } => KIB_HDR_LEN + LNET_HDR_LEN + 8 + rd.wire_len(),
            other => other.msg_type().min_nob(),
        }
    }
}

/// How a received message was framed: what the parser learned besides its content.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Framing {
    pub order: ByteOrder,
    /// `ibm_nob`: bytes the message occupies (the rest of the buffer is ignored).
    pub nob: usize,
    /// The checksum it carried, if any (0 on the wire means none), and the flavour it matched.
    pub cksum: Option<Checksum>,
}

/// How a sender added each byte into o2iblnd's checksum. kiblnd_cksum adds the bytes as C
/// `char`s, whose signedness is the kernel build's: signed on x86 kernels up to 6.1 (RHEL 8/9,
/// SLES 15, Debian 12), unsigned on every kernel since 6.2 (built with -funsigned-char). The two
/// differ on any message, since the o2iblnd magic itself has bytes >= 0x80.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CksumFlavour {
    /// Bytes >= 0x80 count as negative (pre-6.2 x86 kernels).
    Signed,
    /// Bytes count as 0..=255 (kernels since 6.2, and other architectures).
    Unsigned,
}

impl CksumFlavour {
    /// Both flavours, the one most kernels at Lustre sites compute first.
    pub const ALL: [CksumFlavour; 2] = [CksumFlavour::Signed, CksumFlavour::Unsigned];

    /// The name used in configs and tools.
    pub fn name(self) -> &'static str {
        match self {
            CksumFlavour::Signed => "signed",
            CksumFlavour::Unsigned => "unsigned",
        }
    }
}

/// A checksum a message carried.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Checksum {
    pub value: u32,
    /// The flavour the value matched; `None` when both flavours give the same value (no byte
    /// >= 0x80 changed the sum), so the message says nothing about its sender's flavour.
    pub flavour: Option<CksumFlavour>,
}

/// How to emit a message.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct EmitOpts {
    pub order: ByteOrder,
    /// Fill `ibm_cksum` in this flavour (the `cksum` module parameter); `None` sends 0, which
    /// every receiver reads as "no checksum".
    pub checksum: Option<CksumFlavour>,
}

/// A validated o2iblnd message.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct KibMsg<'a> {
    pub version: u16,
    /// Credits returned to the receiver.
    pub credits: u8,
    pub src_nid: Nid,
    /// The sender's incarnation.
    pub src_stamp: u64,
    pub dst_nid: Nid,
    /// The sender's idea of the receiver's incarnation (0 if it never knew one).
    pub dst_stamp: u64,
    pub body: KibBody<'a>,
}

/// o2iblnd's message checksum in the unsigned flavour (kernels since 6.2); see [`cksum_as`].
pub fn cksum(msg: &[u8]) -> u32 {
    cksum_as(msg, CksumFlavour::Unsigned)
}

/// o2iblnd's message checksum (kiblnd_cksum): rotate left by one and add each byte, computed with
/// the checksum field zeroed; never 0, which means "no checksum". `flavour` says whether a byte
/// is added as a signed or an unsigned C `char`.
pub fn cksum_as(msg: &[u8], flavour: CksumFlavour) -> u32 {
    let mut sum: u32 = 0;
    for (i, &byte) in msg.iter().enumerate() {
        let byte = if (field::CKSUM..field::CKSUM + 4).contains(&i) {
            0
        } else {
            byte
        };
        let value = match flavour {
            CksumFlavour::Unsigned => u32::from(byte),
            // Sign-extended, as a signed char promoted to int and then to the u32 sum.
            CksumFlavour::Signed => i32::from(byte as i8) as u32,
        };
        sum = sum.rotate_left(1).wrapping_add(value);
    }
    if sum == 0 {
        1
    } else {
        sum
    }
}

/// Which flavour of checksum `carried` is for `msg`, if either: a message is accepted when its
/// checksum matches what either kind of kernel computes.
pub fn check_cksum(msg: &[u8], carried: u32) -> Result<Checksum, WireError> {
    let unsigned = cksum_as(msg, CksumFlavour::Unsigned);
    let signed = cksum_as(msg, CksumFlavour::Signed);
    let flavour = match (carried == signed, carried == unsigned) {
        (true, true) => None,
        (true, false) => Some(CksumFlavour::Signed),
        (false, true) => Some(CksumFlavour::Unsigned),
        (false, false) => {
            return Err(WireError::BadChecksum {
                carried,
                unsigned,
                signed,
            })
        }
    };
    Ok(Checksum {
        value: carried,
        flavour,
    })
}

/// Reads only the type code, for cheap dispatch and for counters on a message that fails to parse.
pub fn peek_type(b: &[u8]) -> Option<u8> {
    b.get(field::TYPE).copied()
}

impl<'a> KibMsg<'a> {
    /// A version 2 message (what 2.x kernels send) from `src` to `dst`, each a NID with its
    /// incarnation (the receiver's as the sender knows it: 0 if it never knew one), returning
    /// no credits.
    pub fn v2(src: (Nid, u64), dst: (Nid, u64), body: KibBody<'a>) -> KibMsg<'a> {
        KibMsg {
            version: VERSION_2,
            credits: 0,
            src_nid: src.0,
            src_stamp: src.1,
            dst_nid: dst.0,
            dst_stamp: dst.1,
            body,
        }
    }

    /// The message type.
    pub fn msg_type(&self) -> KibMsgType {
        self.body.msg_type()
    }

    /// Bytes this message takes on the wire (`ibm_nob`).
    pub fn wire_len(&self) -> usize {
        self.body.wire_len()
    }

    /// Validates and parses a message, in the order kiblnd_unpack_msg checks it: magic and version,
    /// header length, nob against the bytes received, checksum, type and its minimum size, source
    /// NID, then the body (fragment counts, inline length).
    pub fn parse(b: &'a [u8]) -> Result<(KibMsg<'a>, Framing), WireError> {
        check_len(b, 6)?;
        let o = ByteOrder::detect(b, field::MAGIC, IB_MAGIC).ok_or(WireError::BadMagic(
            ByteOrder::Little.get_u32(b, field::MAGIC),
        ))?;
        let version = o.get_u16(b, field::VERSION);
        if version != VERSION_1 && version != VERSION_2 {
            return Err(WireError::BadVersion(version));
        }
        check_len(b, KIB_HDR_LEN)?;
        let nob32 = o.get_u32(b, field::NOB);
        let nob = nob32 as usize;
        if nob > b.len() {
            return Err(WireError::NobTooLarge {
                nob: nob32,
                got: b.len(),
            });
        }
        let carried = o.get_u32(b, field::CKSUM);
        let msg = b.get(..nob).unwrap_or_default();
        let checksum = if carried != 0 {
            Some(check_cksum(msg, carried)?)
        } else {
            None
        };
        let raw_type = b.get(field::TYPE).copied().unwrap_or(0);
        let ty = KibMsgType::from_u8(raw_type).ok_or(WireError::UnknownType(raw_type))?;
        if nob < ty.min_nob() {
            return Err(WireError::NobTooSmall {
                nob: nob32,
                min: ty.min_nob(),
            });
        }
        let src_nid = Nid::from_raw(o.get_u64(b, field::SRCNID));
        if src_nid.is_any() {
            return Err(WireError::AnySourceNid);
        }
        let at = field::BODY;
        let body = match ty {
            KibMsgType::ConnReq => KibBody::ConnReq(ConnParams::get(o, msg, at)),
            KibMsgType::ConnAck => KibBody::ConnAck(ConnParams::get(o, msg, at)),
            KibMsgType::Noop => KibBody::Noop,
            KibMsgType::Immediate => {
                let hdr = LnetHdr::parse(msg.get(at..).unwrap_or_default())?;
                let inline = msg.get(IMMEDIATE_PAYLOAD_OFFSET..).unwrap_or_default();
                if inline.len() > MAX_INLINE {
                    return Err(WireError::InlineTooLarge(inline.len()));
                }
                let announced = hdr.payload_length;
                let payload =
                    inline
                        .get(..announced as usize)
                        .ok_or(WireError::InlineTooShort {
                            announced,
                            carried: inline.len(),
                        })?;
                KibBody::Immediate { hdr, payload }
            }
            KibMsgType::PutReq => KibBody::PutReq {
                hdr: LnetHdr::parse(msg.get(at..).unwrap_or_default())?,
                cookie: o.get_u64(msg, at + LNET_HDR_LEN),
            },
            KibMsgType::PutAck => KibBody::PutAck {
                src_cookie: o.get_u64(msg, at),
                dst_cookie: o.get_u64(msg, at + 8),
                rd: RdmaDesc::parse(msg, at + 16, nob, o)?,
            },
            KibMsgType::GetReq => KibBody::GetReq {
                hdr: LnetHdr::parse(msg.get(at..).unwrap_or_default())?,
                cookie: o.get_u64(msg, at + LNET_HDR_LEN),
                rd: RdmaDesc::parse(msg, at + LNET_HDR_LEN + 8, nob, o)?,
            },
            KibMsgType::PutNak => KibBody::PutNak(Completion::get(o, msg, at)),
            KibMsgType::PutDone => KibBody::PutDone(Completion::get(o, msg, at)),
            KibMsgType::GetDone => KibBody::GetDone(Completion::get(o, msg, at)),
        };
        Ok((
            KibMsg {
                version,
                credits: b.get(field::CREDITS).copied().unwrap_or(0),
                src_nid,
                src_stamp: o.get_u64(b, field::SRCSTAMP),
                dst_nid: Nid::from_raw(o.get_u64(b, field::DSTNID)),
                dst_stamp: o.get_u64(b, field::DSTSTAMP),
                body,
            },
            Framing {
                order: o,
                nob,
                cksum: checksum,
            },
        ))
    }

    /// Writes the message into `b` and returns its length. Refuses bodies that a receiver would
    /// refuse (inline payload over 3976 bytes, 0 or more than 257 fragments) before writing.
    pub fn emit(&self, b: &mut [u8], opts: EmitOpts) -> Result<usize, WireError> {
        match self.body {
            KibBody::Immediate { payload, .. } if payload.len() > MAX_INLINE => {
                return Err(WireError::InlineTooLarge(payload.len()));
            }
            KibBody::PutAck { rd, .. } | KibBody::GetReq { rd, .. }
                if rd.frags.is_empty() || rd.frags.len() > MAX_RDMA_FRAGS =>
            {
                return Err(WireError::BadFragCount(rd.frags.len() as u32));
            }
            _ => {}
        }
        let nob = self.wire_len();
        check_room(b, nob)?;
        let o = opts.order;
        o.put_u32(b, field::MAGIC, IB_MAGIC);
        o.put_u16(b, field::VERSION, self.version);
        if let Some(t) = b.get_mut(field::TYPE) {
            *t = self.msg_type() as u8;
        }
        if let Some(c) = b.get_mut(field::CREDITS) {
            *c = self.credits;
        }
        o.put_u32(b, field::NOB, nob as u32);
        o.put_u32(b, field::CKSUM, 0);
        o.put_u64(b, field::SRCNID, self.src_nid.raw());
        o.put_u64(b, field::SRCSTAMP, self.src_stamp);
        o.put_u64(b, field::DSTNID, self.dst_nid.raw());
        o.put_u64(b, field::DSTSTAMP, self.dst_stamp);
        let at = field::BODY;
        match self.body {
            KibBody::ConnReq(cp) | KibBody::ConnAck(cp) => cp.put(o, b, at),
            KibBody::Noop => {}
            KibBody::Immediate { hdr, payload } => {
                hdr.emit(b.get_mut(at..).unwrap_or_default())?;
                if let Some(out) = b.get_mut(IMMEDIATE_PAYLOAD_OFFSET..nob) {
                    out.copy_from_slice(payload);
                }
            }
            KibBody::PutReq { hdr, cookie } => {
                hdr.emit(b.get_mut(at..).unwrap_or_default())?;
                o.put_u64(b, at + LNET_HDR_LEN, cookie);
            }
            KibBody::PutAck {
                src_cookie,
                dst_cookie,
                rd,
            } => {
                o.put_u64(b, at, src_cookie);
                o.put_u64(b, at + 8, dst_cookie);
                rd.write(b, at + 16, o);
            }
            KibBody::GetReq { hdr, cookie, rd } => {
                hdr.emit(b.get_mut(at..).unwrap_or_default())?;
                o.put_u64(b, at + LNET_HDR_LEN, cookie);
                rd.write(b, at + LNET_HDR_LEN + 8, o);
            }
            KibBody::PutNak(c) | KibBody::PutDone(c) | KibBody::GetDone(c) => c.put(o, b, at),
        }
        if let Some(flavour) = opts.checksum {
            let sum = cksum_as(b.get(..nob).unwrap_or_default(), flavour);
            o.put_u32(b, field::CKSUM, sum);
        }
        Ok(nob)
    }
}

/// Why a passive side refused a connection (IBLND_REJECT_*).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// "You lost the connection race."
    ConnRace,
    NoResources,
    Fatal,
    ConnUncompat,
    /// The requester's idea of my incarnation is out of date, or its own instance changed.
    ConnStale,
    RdmaFrags,
    MsgQueueSize,
    InvalidSrvId,
    /// My NI is still starting.
    Early,
    /// A code we do not know; treated like FATAL.
    Other(u8),
}

impl RejectReason {
    /// The wire code.
    pub const fn code(self) -> u8 {
        match self {
            RejectReason::ConnRace => 1,
            RejectReason::NoResources => 2,
            RejectReason::Fatal => 3,
            RejectReason::ConnUncompat => 4,
            RejectReason::ConnStale => 5,
            RejectReason::RdmaFrags => 6,
            RejectReason::MsgQueueSize => 7,
            RejectReason::InvalidSrvId => 8,
            RejectReason::Early => 9,
            RejectReason::Other(c) => c,
        }
    }

    /// The reason with wire code `c`.
    pub const fn from_code(c: u8) -> RejectReason {
        match c {
            1 => RejectReason::ConnRace,
            2 => RejectReason::NoResources,
            3 => RejectReason::Fatal,
            4 => RejectReason::ConnUncompat,
            5 => RejectReason::ConnStale,
            6 => RejectReason::RdmaFrags,
            7 => RejectReason::MsgQueueSize,
            8 => RejectReason::InvalidSrvId,
            9 => RejectReason::Early,
            c => RejectReason::Other(c),
        }
    }
}

/// A reject, sent as the connection manager's consumer-defined private data (`struct kib_rej`):
/// magic u32, version u16, why u8, padding u8, incarnation u64, connparams.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct KibRej {
    pub version: u16,
    pub why: RejectReason,
    /// The rejecter's own incarnation.
    pub incarnation: u64,
    /// The rejecter's queue depth and fragment limit.
    pub cp: ConnParams,
}

impl KibRej {
    /// Parses a reject in either byte order. Private data may be padded (148 bytes on OFED); bytes
    /// after the 24 are ignored.
    pub fn parse(b: &[u8]) -> Result<(KibRej, ByteOrder), WireError> {
        check_len(b, 6)?;
        let o = ByteOrder::detect(b, 0, IB_MAGIC)
            .ok_or(WireError::BadMagic(ByteOrder::Little.get_u32(b, 0)))?;
        let version = o.get_u16(b, 4);
        if version != VERSION_1 && version != VERSION_2 {
            return Err(WireError::BadVersion(version));
        }
        check_len(b, REJ_LEN)?;
        Ok((
            KibRej {
                version,
                why: RejectReason::from_code(b.get(6).copied().unwrap_or(0)),
                incarnation: o.get_u64(b, 8),
                cp: ConnParams::get(o, b, 16),
            },
            o,
        ))
    }

    /// Writes the 24-byte reject.
    pub fn emit(&self, b: &mut [u8], order: ByteOrder) -> Result<usize, WireError> {
        check_room(b, REJ_LEN)?;
        order.put_u32(b, 0, IB_MAGIC);
        order.put_u16(b, 4, self.version);
        if let Some(s) = b.get_mut(6..8) {
            s.copy_from_slice(&[self.why.code(), 0]);
        }
        order.put_u64(b, 8, self.incarnation);
        self.cp.put(order, b, 16);
        Ok(REJ_LEN)
    }
}
