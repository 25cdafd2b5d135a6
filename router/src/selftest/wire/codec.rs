//! Byte access to one srpc message: panic-free readers and writers of body fields in either
//! byte order, the 24-byte header, and the layout every body implements.

use lnd::wire::{ByteOrder, Nid};

use super::messages::*;

// ---------------------------------------------------------------------------------------------
// Panic-free field access: integers through lnd's `ByteOrder`, byte arrays here
// ---------------------------------------------------------------------------------------------

pub(super) fn take<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = b.get(at..at.saturating_add(N)) {
        a.copy_from_slice(s);
    }
    a
}

pub(super) fn put<const N: usize>(b: &mut [u8], at: usize, a: [u8; N]) {
    if let Some(s) = b.get_mut(at..at.saturating_add(N)) {
        s.copy_from_slice(&a);
    }
}

/// Reads fields of one message body in one byte order; offsets are relative to the body.
pub(super) struct Reader<'a> {
    pub(super) b: &'a [u8],
    pub(super) order: ByteOrder,
}

impl Reader<'_> {
    pub(super) fn u8(&self, at: usize) -> u8 {
        take::<1>(self.b, SRPC_HDR_LEN + at)[0]
    }
    pub(super) fn u16(&self, at: usize) -> u16 {
        self.order.get_u16(self.b, SRPC_HDR_LEN + at)
    }
    pub(super) fn u32(&self, at: usize) -> u32 {
        self.order.get_u32(self.b, SRPC_HDR_LEN + at)
    }
    pub(super) fn u64(&self, at: usize) -> u64 {
        self.order.get_u64(self.b, SRPC_HDR_LEN + at)
    }
    pub(super) fn sid(&self, at: usize) -> LstSid {
        LstSid {
            nid: Nid::from_raw(self.u64(at)),
            stamp: self.u64(at + 8) as i64,
        }
    }
    pub(super) fn name(&self, at: usize) -> LstName {
        LstName(take(self.b, SRPC_HDR_LEN + at))
    }
}

/// Writes fields of one message body in one byte order; offsets are relative to the body.
pub(super) struct Writer<'a> {
    pub(super) b: &'a mut [u8],
    pub(super) order: ByteOrder,
}

impl Writer<'_> {
    pub(super) fn u8(&mut self, at: usize, v: u8) {
        put(self.b, SRPC_HDR_LEN + at, [v]);
    }
    pub(super) fn u16(&mut self, at: usize, v: u16) {
        self.order.put_u16(self.b, SRPC_HDR_LEN + at, v);
    }
    pub(super) fn u32(&mut self, at: usize, v: u32) {
        self.order.put_u32(self.b, SRPC_HDR_LEN + at, v);
    }
    pub(super) fn u64(&mut self, at: usize, v: u64) {
        self.order.put_u64(self.b, SRPC_HDR_LEN + at, v);
    }
    pub(super) fn sid(&mut self, at: usize, sid: LstSid) {
        self.u64(at, sid.nid.raw());
        self.u64(at + 8, sid.stamp as u64);
    }
    pub(super) fn name(&mut self, at: usize, name: &LstName) {
        put(self.b, SRPC_HDR_LEN + at, name.0);
    }
}

// ---------------------------------------------------------------------------------------------
// The header
// ---------------------------------------------------------------------------------------------

pub(super) mod hdr {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const TYPE: usize = 8;
    pub const RESERVED0: usize = 12;
    pub const RESERVED1: usize = 16;
    pub const SES_FEATS: usize = 20;
}

/// The srpc header alone (`struct srpc_msg` up to `msg_body`, 24 bytes):
///
/// | offset | field          | size |
/// |--------|----------------|------|
/// | 0      | msg_magic      | 4    |
/// | 4      | msg_version    | 4    |
/// | 8      | msg_type       | 4    |
/// | 12     | msg_reserved0  | 4    |
/// | 16     | msg_reserved1  | 4    |
/// | 20     | msg_ses_feats  | 4    |
/// | 24     | msg_body       | 136  |
///
/// Parsing only checks the magic, so a server can still answer a message of another version
/// with EPROTO, as srpc_handle_rpc does (the reply goes to [`SrpcHeader::rpyid`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SrpcHeader {
    /// `msg_version`.
    pub version: u32,
    /// `msg_type`, raw.
    pub msg_type: u32,
    /// `msg_ses_feats`: the session's feature bits.
    pub features: u32,
    /// The first 8 bytes of the body: a request's reply match bits (`rpyid` of
    /// `srpc_generic_reqst`); meaningless for a reply.
    pub rpyid: u64,
    /// The next 8 bytes: a test or brw request's bulk match bits (`bulkid`).
    pub bulkid: u64,
}

impl SrpcHeader {
    /// Reads the header of a message (at least 40 bytes: header and the two generic request
    /// words) and detects its byte order from the magic.
    pub fn parse(b: &[u8]) -> Result<(SrpcHeader, ByteOrder), SelftestWireError> {
        check_len(b, SRPC_HDR_LEN + 16)?;
        let order = detect_order(b)?;
        Ok((
            SrpcHeader {
                version: order.get_u32(b, hdr::VERSION),
                msg_type: order.get_u32(b, hdr::TYPE),
                features: order.get_u32(b, hdr::SES_FEATS),
                rpyid: order.get_u64(b, SRPC_HDR_LEN),
                bulkid: order.get_u64(b, SRPC_HDR_LEN + 8),
            },
            order,
        ))
    }
}

pub(super) fn detect_order(b: &[u8]) -> Result<ByteOrder, SelftestWireError> {
    ByteOrder::detect(b, hdr::MAGIC, SRPC_MSG_MAGIC)
        .ok_or_else(|| SelftestWireError::BadMagic(ByteOrder::Little.get_u32(b, hdr::MAGIC)))
}

// ---------------------------------------------------------------------------------------------
// Bodies
// ---------------------------------------------------------------------------------------------

/// One body layout of the `msg_body` union. Offsets are from the start of the body (byte 24 of
/// the message); all reads are in bounds once the message length is checked.
pub(super) trait BodyLayout: Sized {
    const TYPE: MsgType;
    /// Bytes the body uses (the rest of the 136-byte union is zero on emit).
    const LEN: usize;
    fn read(r: &Reader<'_>, features: u32) -> Self;
    fn write(&self, w: &mut Writer<'_>);
}

/// A field type a body is made of, read and written at an offset of the body (so a body whose
/// fields are all of these is described by a table of offsets: see [`fixed_layouts`]).
pub(super) trait Field: Sized {
    fn get(r: &Reader<'_>, at: usize) -> Self;
    fn set(&self, w: &mut Writer<'_>, at: usize);
}

// The fields the reader and writer have a method for, of the same name, taking them by value.
macro_rules! field_by_value {
    ($($ty:ty => $m:ident),+ $(,)?) => {$(
        impl Field for $ty {
            fn get(r: &Reader<'_>, at: usize) -> Self {
                r.$m(at)
            }
            fn set(&self, w: &mut Writer<'_>, at: usize) {
                w.$m(at, *self);
            }
        }
    )+};
}

field_by_value!(u32 => u32, u64 => u64, LstSid => sid);

impl Field for LstName {
    fn get(r: &Reader<'_>, at: usize) -> Self {
        r.name(at)
    }
    fn set(&self, w: &mut Writer<'_>, at: usize) {
        w.name(at, self);
    }
}

impl Field for LstBid {
    fn get(r: &Reader<'_>, at: usize) -> Self {
        LstBid(r.u64(at))
    }
    fn set(&self, w: &mut Writer<'_>, at: usize) {
        w.u64(at, self.0);
    }
}

/// The [`BodyLayout`] of bodies whose fields sit at fixed offsets whatever the session's
/// features, from a table: `Body, bytes used { field @ offset, ... }` (the body's `MsgType` variant has
/// its name). The offsets are those of the Lustre struct the body's doc shows.
macro_rules! fixed_layouts {
    ($($body:ident, $len:literal { $($field:ident @ $at:literal),+ $(,)? })+) => {$(
        impl BodyLayout for $body {
            const TYPE: MsgType = MsgType::$body;
            const LEN: usize = $len;
            fn read(r: &Reader<'_>, _: u32) -> Self {
                $body { $($field: Field::get(r, $at)),+ }
            }
            fn write(&self, w: &mut Writer<'_>) {
                $(Field::set(&self.$field, w, $at);)+
            }
        }
    )+};
}
pub(super) use fixed_layouts;

/// [`Field`] for a struct of fields carried together inside a body (the counters of a stat
/// reply), from a table: `Struct { field @ offset within the struct, ... }`.
macro_rules! counter_fields {
    ($($ty:ident { $($field:ident @ $at:literal),+ $(,)? })+) => {$(
        impl Field for $ty {
            fn get(r: &Reader<'_>, at: usize) -> Self {
                $ty { $($field: Field::get(r, at + $at)),+ }
            }
            fn set(&self, w: &mut Writer<'_>, at: usize) {
                $(Field::set(&self.$field, w, at + $at);)+
            }
        }
    )+};
}
pub(super) use counter_fields;
