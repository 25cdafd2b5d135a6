//! The LNet header in its 64-bit-NID wire form: 72 bytes, always little-endian
//! (lnet-idl.h `struct lnet_hdr_nid4`; offsets asserted in api-ni.c lnet_assert_wire_constants).
//!
//! | offset | field          | size |
//! |--------|----------------|------|
//! | 0      | dest_nid       | 8    |
//! | 8      | src_nid        | 8    |
//! | 16     | dest_pid       | 4    |
//! | 20     | src_pid        | 4    |
//! | 24     | type           | 4    |
//! | 28     | payload_length | 4    |
//! | 32     | per-type body  | 40   |

use super::{check_len, check_room, wire_layout, ByteOrder, Nid, WireError, WireField};

/// Bytes in the header.
pub const LNET_HDR_LEN: usize = 72;
/// The largest payload one LNet message can carry (LNET_MTU).
pub const LNET_MTU: u32 = 1 << 20;
/// The well-known PID of kernel Lustre (LNET_PID_LUSTRE).
pub const LNET_PID_LUSTRE: u32 = 12345;
/// Set in a PID to mark a userspace process (LNET_PID_USERFLAG).
pub const LNET_PID_USERFLAG: u32 = 0x8000_0000;
/// Match bits of an LNet ping GET on portal 0 (LNET_PROTO_PING_MATCHBITS).
pub const LNET_PING_MATCHBITS: u64 = 0x8000_0000_0000_0000;
/// The portal reserved for LNet itself (ping, discovery).
pub const LNET_RESERVED_PORTAL: u32 = 0;

mod field {
    pub const DEST_NID: usize = 0;
    pub const SRC_NID: usize = 8;
    pub const DEST_PID: usize = 16;
    pub const SRC_PID: usize = 20;
    pub const TYPE: usize = 24;
    pub const PAYLOAD_LENGTH: usize = 28;
    pub const BODY: usize = 32;
}

crate::wire_enum! {
    /// LNet message types (`enum lnet_msg_type`).
    pub enum LnetMsgType: from_u32(u32) {
        Ack = 0, Put = 1, Get = 2, Reply = 3, Hello = 4,
    }
}

/// A wire handle naming a memory descriptor on its owner: interface cookie + object cookie.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct WireHandle {
    pub interface_cookie: u64,
    pub object_cookie: u64,
}

impl WireHandle {
    /// LNET_WIRE_HANDLE_COOKIE_NONE in both halves: "no ACK wanted" in a PUT.
    pub const NONE: WireHandle = WireHandle {
        interface_cookie: u64::MAX,
        object_cookie: u64::MAX,
    };
}

// Read and written in the header's order, which is always little-endian (LE below).
wire_layout!(WireHandle {
    interface_cookie: u64 = 0,
    object_cookie: u64 = 8
});

const LE: ByteOrder = ByteOrder::Little;

/// The per-type part of the header.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum LnetBody {
    Ack {
        dst_wmd: WireHandle,
        match_bits: u64,
        mlength: u32,
    },
    Put {
        ack_wmd: WireHandle,
        match_bits: u64,
        hdr_data: u64,
        ptl_index: u32,
        offset: u32,
    },
    Get {
        return_wmd: WireHandle,
        match_bits: u64,
        ptl_index: u32,
        src_offset: u32,
        sink_length: u32,
    },
    Reply {
        dst_wmd: WireHandle,
    },
    /// Only byte-stream LNDs send HELLO; o2iblnd never does, but the header can carry it.
    Hello {
        incarnation: u64,
        conn_type: u32,
    },
}

impl LnetBody {
    /// The message type this body belongs to.
    pub fn msg_type(&self) -> LnetMsgType {
        match self {
            LnetBody::Ack { .. } => LnetMsgType::Ack,
            LnetBody::Put { .. } => LnetMsgType::Put,
            LnetBody::Get { .. } => LnetMsgType::Get,
            LnetBody::Reply { .. } => LnetMsgType::Reply,
            LnetBody::Hello { .. } => LnetMsgType::Hello,
        }
    }

    /// The wire handle every body but HELLO starts with: the MD an ACK or REPLY goes to, the one
    /// a PUT wants its ACK on, the one a GET's REPLY comes back to.
    pub fn wmd(&self) -> Option<WireHandle> {
        match *self {
            LnetBody::Ack { dst_wmd: w, .. }
            | LnetBody::Put { ack_wmd: w, .. }
            | LnetBody::Get { return_wmd: w, .. }
            | LnetBody::Reply { dst_wmd: w } => Some(w),
            LnetBody::Hello { .. } => None,
        }
    }

    /// The match bits of an ACK, PUT or GET (right after the wire handle).
    pub fn match_bits(&self) -> Option<u64> {
        match *self {
            LnetBody::Ack { match_bits, .. }
            | LnetBody::Put { match_bits, .. }
            | LnetBody::Get { match_bits, .. } => Some(match_bits),
            LnetBody::Reply { .. } | LnetBody::Hello { .. } => None,
        }
    }

    /// The portal a PUT or GET targets.
    pub fn ptl_index(&self) -> Option<u32> {
        match *self {
            LnetBody::Put { ptl_index, .. } | LnetBody::Get { ptl_index, .. } => Some(ptl_index),
            _ => None,
        }
    }
}

/// Each body's fields with their offsets from the start of the body, written once so that the
/// parser and the emitter cannot disagree on a layout (lnet-idl.h `struct lnet_{ack,put,get,
/// reply,hello}`).
macro_rules! body_layouts {
    ($($variant:ident { $($field:ident: $t:ty = $off:expr),* $(,)? })*) => {
        impl LnetBody {
            /// The body of a `msg_type` header whose body starts at `at` in `b`.
            fn read(msg_type: LnetMsgType, b: &[u8], at: usize) -> LnetBody {
                match msg_type {
                    $(LnetMsgType::$variant => LnetBody::$variant {
                        $($field: <$t as WireField>::get(LE, b, at + $off)),*
                    },)*
                }
            }

            /// Writes the body's fields at `at` in `b` (the caller zeroed the unused bytes).
            fn write(&self, b: &mut [u8], at: usize) {
                match *self {
                    $(LnetBody::$variant { $($field),* } => {
                        $(WireField::put($field, LE, b, at + $off);)*
                    })*
                }
            }
        }
    };
}

body_layouts! {
    // Body offsets: 0 the wire handle (16 bytes), 16 the match bits, then the rest.
    Ack { dst_wmd: WireHandle = 0, match_bits: u64 = 16, mlength: u32 = 24 }
    Put { ack_wmd: WireHandle = 0, match_bits: u64 = 16, hdr_data: u64 = 24, ptl_index: u32 = 32,
          offset: u32 = 36 }
    Get { return_wmd: WireHandle = 0, match_bits: u64 = 16, ptl_index: u32 = 24,
          src_offset: u32 = 28, sink_length: u32 = 32 }
    Reply { dst_wmd: WireHandle = 0 }
    Hello { incarnation: u64 = 0, conn_type: u32 = 8 }
}

/// A validated LNet header.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LnetHdr {
    pub dest_nid: Nid,
    pub src_nid: Nid,
    pub dest_pid: u32,
    pub src_pid: u32,
    pub payload_length: u32,
    pub body: LnetBody,
}

impl LnetHdr {
    /// A header from `src` to `dest` with kernel Lustre's PID at both ends.
    fn between_kernels(src: Nid, dest: Nid, payload_length: u32, body: LnetBody) -> LnetHdr {
        LnetHdr {
            dest_nid: dest,
            src_nid: src,
            dest_pid: LNET_PID_LUSTRE,
            src_pid: LNET_PID_LUSTRE,
            payload_length,
            body,
        }
    }

    /// A PUT from `src` to `dest` between kernel-Lustre PIDs, asking for no ACK, with no header
    /// data and offset 0: the shape most traffic in tests, benches and tools takes.
    pub fn put(
        src: Nid,
        dest: Nid,
        payload_length: u32,
        ptl_index: u32,
        match_bits: u64,
    ) -> LnetHdr {
        let body = LnetBody::Put {
            ack_wmd: WireHandle::NONE,
            match_bits,
            hdr_data: 0,
            ptl_index,
            offset: 0,
        };
        LnetHdr::between_kernels(src, dest, payload_length, body)
    }

    /// A GET from `src` to `dest` between kernel-Lustre PIDs for `sink_length` bytes from offset
    /// 0 of what `match_bits` matches on `ptl_index`; the REPLY comes back to `return_wmd` (as
    /// LNetGet fills the header in lnet_prep_send / lnet_send).
    pub fn get(
        src: Nid,
        dest: Nid,
        return_wmd: WireHandle,
        ptl_index: u32,
        match_bits: u64,
        sink_length: u32,
    ) -> LnetHdr {
        let body = LnetBody::Get {
            return_wmd,
            match_bits,
            ptl_index,
            src_offset: 0,
            sink_length,
        };
        LnetHdr::between_kernels(src, dest, 0, body)
    }

    /// The message type.
    pub fn msg_type(&self) -> LnetMsgType {
        self.body.msg_type()
    }

    /// Parses the first 72 bytes of `b`.
    ///
    /// Refuses what lnet_parse refuses before matching: unknown types, ACK or GET with a payload,
    /// PUT or REPLY larger than LNET_MTU.
    pub fn parse(b: &[u8]) -> Result<LnetHdr, WireError> {
        check_len(b, LNET_HDR_LEN)?;
        let raw_type = LE.get_u32(b, field::TYPE);
        let msg_type =
            LnetMsgType::from_u32(raw_type).ok_or(WireError::UnknownLnetType(raw_type))?;
        let payload_length = LE.get_u32(b, field::PAYLOAD_LENGTH);
        let bad_len = match msg_type {
            LnetMsgType::Ack | LnetMsgType::Get => payload_length != 0,
            LnetMsgType::Put | LnetMsgType::Reply => payload_length > LNET_MTU,
            LnetMsgType::Hello => false,
        };
        if bad_len {
            return Err(WireError::BadPayloadLength {
                msg_type,
                len: payload_length,
            });
        }
        let body = LnetBody::read(msg_type, b, field::BODY);
        Ok(LnetHdr {
            dest_nid: Nid::from_raw(LE.get_u64(b, field::DEST_NID)),
            src_nid: Nid::from_raw(LE.get_u64(b, field::SRC_NID)),
            dest_pid: LE.get_u32(b, field::DEST_PID),
            src_pid: LE.get_u32(b, field::SRC_PID),
            payload_length,
            body,
        })
    }

    /// Writes the header into the first 72 bytes of `b`; unused body bytes are zeroed.
    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        check_room(b, LNET_HDR_LEN)?;
        if let Some(s) = b.get_mut(..LNET_HDR_LEN) {
            s.fill(0);
        }
        LE.put_u64(b, field::DEST_NID, self.dest_nid.raw());
        LE.put_u64(b, field::SRC_NID, self.src_nid.raw());
        LE.put_u32(b, field::DEST_PID, self.dest_pid);
        LE.put_u32(b, field::SRC_PID, self.src_pid);
        LE.put_u32(b, field::TYPE, self.msg_type() as u32);
        LE.put_u32(b, field::PAYLOAD_LENGTH, self.payload_length);
        self.body.write(b, field::BODY);
        Ok(LNET_HDR_LEN)
    }
}
