//! The ping payload (`struct lnet_ping_info`, lnet-idl.h), sent in the responder's byte order.
//!
//! Header: magic u32, features u32, pid u32, nnis u32; then `nnis` entries of
//! {nid u64, status u32, msg_size u32}. Entry 0 is `0@lo`, whose status word carries the ping
//! buffer's sequence number (api-ni.c).

use super::list::{WireList, WireRecord};
use super::{check_len, check_room, wire_layout, ByteOrder, Nid, WireError};

/// LNET_PROTO_PING_MAGIC, "ping".
pub const PING_MAGIC: u32 = 0x7069_6E67;
/// Bytes before the first NI entry.
pub const PING_HDR_LEN: usize = 16;

/// Feature bits (LNET_PING_FEAT_*).
pub mod feat {
    pub const BASE: u32 = 0x1;
    pub const NI_STATUS: u32 = 0x2;
    /// The node is NOT routing.
    pub const RTE_DISABLED: u32 = 0x4;
    pub const MULTI_RAIL: u32 = 0x8;
    pub const DISCOVERY: u32 = 0x10;
    pub const LARGE_ADDR: u32 = 0x20;
    pub const PRIMARY_LARGE: u32 = 0x40;
    pub const METADATA: u32 = 0x80;
}

/// NI status words.
pub mod status {
    pub const UP: u32 = 0x15aa_c0de;
    pub const DOWN: u32 = 0xdead_face;
    pub const INVALID: u32 = 0;
}

/// One NI entry of a ping reply.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct NiStatus {
    pub nid: Nid,
    /// [`status::UP`] or [`status::DOWN`]; for entry 0 (`0@lo`) the buffer sequence number.
    pub status: u32,
    pub msg_size: u32,
}

impl NiStatus {
    /// Entry 0 of every ping reply: `0@lo`, whose status word carries the ping buffer's
    /// sequence number `seq` (api-ni.c).
    pub const fn loopback(seq: u32) -> NiStatus {
        NiStatus {
            nid: Nid::LO_0,
            status: seq,
            msg_size: 0,
        }
    }
}

wire_layout!(NiStatus { nid: Nid = 0, status: u32 = 8, msg_size: u32 = 12 } record 16);

/// A validated ping payload.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct PingInfo<'a> {
    pub features: u32,
    pub pid: u32,
    pub nis: WireList<'a, NiStatus>,
}

impl<'a> PingInfo<'a> {
    /// A payload listing `nis` (entry 0 should be `0@lo` with the sequence number as status).
    pub fn new(features: u32, pid: u32, nis: &'a [NiStatus]) -> PingInfo<'a> {
        PingInfo {
            features,
            pid,
            nis: WireList::Slice(nis),
        }
    }

    /// Bytes this payload takes on the wire.
    pub fn wire_len(&self) -> usize {
        PING_HDR_LEN + self.nis.len() * NiStatus::WIRE_LEN
    }

    /// Parses a ping reply in either byte order. Bytes after the last entry are ignored (a reply
    /// buffer may be larger than the payload).
    pub fn parse(b: &'a [u8]) -> Result<(PingInfo<'a>, ByteOrder), WireError> {
        check_len(b, PING_HDR_LEN)?;
        let order = ByteOrder::detect(b, 0, PING_MAGIC)
            .ok_or(WireError::BadMagic(ByteOrder::Little.get_u32(b, 0)))?;
        let features = order.get_u32(b, 4);
        if features & feat::NI_STATUS == 0 {
            return Err(WireError::PingWithoutStatus);
        }
        let nnis = order.get_u32(b, 12) as usize;
        let end = nnis
            .checked_mul(NiStatus::WIRE_LEN)
            .and_then(|n| n.checked_add(PING_HDR_LEN))
            .unwrap_or(usize::MAX);
        check_len(b, end)?;
        let bytes = b.get(PING_HDR_LEN..end).unwrap_or_default();
        Ok((
            PingInfo {
                features,
                pid: order.get_u32(b, 8),
                nis: WireList::Wire { bytes, order },
            },
            order,
        ))
    }

    /// Writes the payload in `order`; returns the bytes written.
    pub fn emit(&self, b: &mut [u8], order: ByteOrder) -> Result<usize, WireError> {
        let len = self.wire_len();
        check_room(b, len)?;
        order.put_u32(b, 0, PING_MAGIC);
        order.put_u32(b, 4, self.features);
        order.put_u32(b, 8, self.pid);
        order.put_u32(b, 12, self.nis.len() as u32);
        if let Some(out) = b.get_mut(PING_HDR_LEN..len) {
            self.nis.write_all(out, order);
        }
        Ok(len)
    }
}
