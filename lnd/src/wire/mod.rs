//! Wire formats, byte-exact with Lustre's LNet and o2iblnd (shared/reference/lustre-lnet-o2iblnd.md,
//! sections 1 and 2) and with the acceptor and ksocklnd ([`sock`]; lustre-socklnd.md).
//!
//! Every format follows the smoltcp discipline: parsing takes untrusted bytes and either returns a
//! validated representation or a [`WireError`] that names what is wrong. After the checks at the top
//! of a `parse`, every read is in bounds by construction, and the readers below are panic-free even
//! if a check were missing (an out-of-range read yields zero, never a panic). Emitting writes into a
//! caller's buffer and never allocates.
//!
//! Byte order: o2iblnd messages and the ping payload travel in the *sender's* byte order and the
//! receiver flips them when it sees a byte-swapped magic (kiblnd_unpack_msg, lnet_ping). The LNet
//! header is always little-endian (lnet_hdr_to_nid4). We accept both orders and emit either.

pub mod errno;
mod error;
pub mod kib;
pub mod list;
pub mod lnet;
pub mod nid;
pub mod pcap;
pub mod pcap_tcp;

pub mod ping;
pub mod sock;

pub use error::WireError;
pub use kib::{
    Completion, ConnParams, Framing, KibBody, KibMsg, KibMsgType, KibRej, RdmaDesc, RdmaFrag,
    RejectReason,
};
pub use lnet::{LnetBody, LnetHdr, LnetMsgType, WireHandle};
pub use nid::{LndType, Net, Nid, NidParseError};
pub use ping::{NiStatus, PingInfo};

/// Declares fieldless enums whose discriminants are their wire codes, each with `ALL` (every
/// variant, in declaration order) and `$from`, the variant a wire code names (`None` for an
/// unknown one): the code table is written once, in the enum itself, instead of again in a
/// decoding `match`. A wire code is a plain value: each enum derives `Copy`, `Eq` and `Hash`.
#[macro_export]
macro_rules! wire_enum {
    ($(
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $from:ident($int:ty) {
            $($(#[$vmeta:meta])* $variant:ident = $code:literal,)*
        }
    )*) => {$(
        $(#[$meta])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant = $code,)*
        }

        impl $name {
            /// Every variant, in declaration order (for tests and tables; not every enum's
            /// users need it).
            #[allow(dead_code)]
            pub const ALL: [$name; [$($code),*].len()] = [$($name::$variant),*];

            /// The variant with wire code `v`, if any.
            pub fn $from(v: $int) -> Option<$name> {
                match v {
                    $($code => Some($name::$variant),)*
                    _ => None,
                }
            }
        }
    )*};
}

/// The byte order a message travels in.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum ByteOrder {
    /// Little-endian: what every x86 and arm64 Lustre node sends, and what we send by default.
    #[default]
    Little,
    /// Big-endian: accepted on receive (older POWER nodes); emitted only on request.
    Big,
}

/// One reader/writer pair per integer width: the logic is the same for every width, only the type
/// and its byte count differ.
macro_rules! order_accessors {
    ($($get:ident, $put:ident, $t:ty;)*) => {$(
        pub fn $get(self, b: &[u8], at: usize) -> $t {
            let mut a = [0u8; std::mem::size_of::<$t>()];
            if let Some(s) = b.get(at..at.saturating_add(a.len())) {
                a.copy_from_slice(s);
            }
            match self {
                ByteOrder::Little => <$t>::from_le_bytes(a),
                ByteOrder::Big => <$t>::from_be_bytes(a),
            }
        }

        pub fn $put(self, b: &mut [u8], at: usize, v: $t) {
            let a = match self {
                ByteOrder::Little => v.to_le_bytes(),
                ByteOrder::Big => v.to_be_bytes(),
            };
            if let Some(s) = b.get_mut(at..at.saturating_add(a.len())) {
                s.copy_from_slice(&a);
            }
        }
    )*};
}

/// Panic-free field access in this order: a read outside `b` gives 0, a write outside it
/// does nothing (parsers check lengths first; these never index out of bounds).
impl ByteOrder {
    order_accessors! {
        get_u16, put_u16, u16;
        get_u32, put_u32, u32;
        get_u64, put_u64, u64;
    }

    /// Which order a 32-bit magic was written in, if it is `magic` at all.
    pub fn detect(b: &[u8], at: usize, magic: u32) -> Option<ByteOrder> {
        if ByteOrder::Little.get_u32(b, at) == magic {
            Some(ByteOrder::Little)
        } else if ByteOrder::Big.get_u32(b, at) == magic {
            Some(ByteOrder::Big)
        } else {
            None
        }
    }
}

/// A fixed-width field of a wire format, read and written in a byte order at an offset, as
/// panic-free as the [`ByteOrder`] accessors. Layouts ([`wire_layout!`], the LNet header bodies)
/// name each field's type and offset once, and parsing and emitting both go through this.
pub(crate) trait WireField: Copy {
    fn get(o: ByteOrder, b: &[u8], at: usize) -> Self;
    fn put(self, o: ByteOrder, b: &mut [u8], at: usize);
}

macro_rules! int_fields {
    ($($t:ty: $get:ident, $put:ident;)*) => {$(
        impl WireField for $t {
            fn get(o: ByteOrder, b: &[u8], at: usize) -> $t {
                o.$get(b, at)
            }
            fn put(self, o: ByteOrder, b: &mut [u8], at: usize) {
                o.$put(b, at, self)
            }
        }
    )*};
}

int_fields! {
    u16: get_u16, put_u16;
    u32: get_u32, put_u32;
    u64: get_u64, put_u64;
}

/// Signed words (a completion's status) travel as their two's-complement bits.
impl WireField for i32 {
    fn get(o: ByteOrder, b: &[u8], at: usize) -> i32 {
        o.get_u32(b, at) as i32
    }
    fn put(self, o: ByteOrder, b: &mut [u8], at: usize) {
        o.put_u32(b, at, self as u32)
    }
}

impl WireField for Nid {
    fn get(o: ByteOrder, b: &[u8], at: usize) -> Nid {
        Nid::from_raw(o.get_u64(b, at))
    }
    fn put(self, o: ByteOrder, b: &mut [u8], at: usize) {
        o.put_u64(b, at, self.raw())
    }
}

/// Makes a struct a [`WireField`] from its layout (each field's type and offset from the
/// struct's start), written once for both directions; with `record LEN`, also a
/// [`list::WireRecord`] of LEN bytes, read in place in a [`list::WireList`].
macro_rules! wire_layout {
    ($name:ident { $($field:ident: $t:ty = $off:expr),* $(,)? }) => {
        impl $crate::wire::WireField for $name {
            fn get(o: $crate::wire::ByteOrder, b: &[u8], at: usize) -> $name {
                $name { $($field: <$t as $crate::wire::WireField>::get(o, b, at + $off)),* }
            }
            fn put(self, o: $crate::wire::ByteOrder, b: &mut [u8], at: usize) {
                $($crate::wire::WireField::put(self.$field, o, b, at + $off);)*
            }
        }
    };
    ($name:ident { $($fields:tt)* } record $len:expr) => {
        wire_layout!($name { $($fields)* });

        impl $crate::wire::list::WireRecord for $name {
            const WIRE_LEN: usize = $len;
            fn read(b: &[u8], order: $crate::wire::ByteOrder) -> $name {
                $crate::wire::WireField::get(order, b, 0)
            }
            fn write(&self, b: &mut [u8], order: $crate::wire::ByteOrder) {
                $crate::wire::WireField::put(*self, order, b, 0)
            }
        }
    };
}
pub(crate) use wire_layout;

/// `Ok` if `buf` holds `needed` bytes, otherwise the error `short` makes of (needed, got): the
/// one length check every wire format here (and selftest's) starts with, each with its own error.
pub fn need<E>(buf: &[u8], needed: usize, short: impl FnOnce(usize, usize) -> E) -> Result<(), E> {
    if buf.len() < needed {
        Err(short(needed, buf.len()))
    } else {
        Ok(())
    }
}

/// Fails with [`WireError::BufferTooSmall`] unless `buf` holds `needed` bytes.
pub(crate) fn check_room(buf: &[u8], needed: usize) -> Result<(), WireError> {
    need(buf, needed, |needed, got| WireError::BufferTooSmall {
        needed,
        got,
    })
}

/// Fails with [`WireError::Truncated`] unless `buf` holds `needed` bytes.
pub(crate) fn check_len(buf: &[u8], needed: usize) -> Result<(), WireError> {
    need(buf, needed, |needed, got| WireError::Truncated {
        needed,
        got,
    })
}
