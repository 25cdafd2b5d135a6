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

/// The byte order a message travels in.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum ByteOrder {
    /// Little-endian: what every x86 and arm64 Lustre node sends, and what we send by default.
    #[default]
    Little,
    /// Big-endian: accepted on receive (older POWER nodes); emitted only on request.
    Big,
}

/// Panic-free field access in this order: a read outside `b` gives 0, a write outside it
/// does nothing (parsers check lengths first; these never index out of bounds).
impl ByteOrder {
    pub fn get_u16(self, b: &[u8], at: usize) -> u16 {
        let mut a = [0u8; 2];
        if let Some(s) = b.get(at..at.saturating_add(2)) {
            a.copy_from_slice(s);
        }
        match self {
            ByteOrder::Little => u16::from_le_bytes(a),
            ByteOrder::Big => u16::from_be_bytes(a),
        }
    }

    pub fn get_u32(self, b: &[u8], at: usize) -> u32 {
        let mut a = [0u8; 4];
        if let Some(s) = b.get(at..at.saturating_add(4)) {
            a.copy_from_slice(s);
        }
        match self {
            ByteOrder::Little => u32::from_le_bytes(a),
            ByteOrder::Big => u32::from_be_bytes(a),
        }
    }

    pub fn get_u64(self, b: &[u8], at: usize) -> u64 {
        let mut a = [0u8; 8];
        if let Some(s) = b.get(at..at.saturating_add(8)) {
            a.copy_from_slice(s);
        }
        match self {
            ByteOrder::Little => u64::from_le_bytes(a),
            ByteOrder::Big => u64::from_be_bytes(a),
        }
    }

    pub fn put_u16(self, b: &mut [u8], at: usize, v: u16) {
        let a = match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        };
        if let Some(s) = b.get_mut(at..at.saturating_add(2)) {
            s.copy_from_slice(&a);
        }
    }

    pub fn put_u32(self, b: &mut [u8], at: usize, v: u32) {
        let a = match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        };
        if let Some(s) = b.get_mut(at..at.saturating_add(4)) {
            s.copy_from_slice(&a);
        }
    }

    pub fn put_u64(self, b: &mut [u8], at: usize, v: u64) {
        let a = match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        };
        if let Some(s) = b.get_mut(at..at.saturating_add(8)) {
            s.copy_from_slice(&a);
        }
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

/// Fails with [`WireError::BufferTooSmall`] unless `buf` holds `needed` bytes.
pub(crate) fn check_room(buf: &[u8], needed: usize) -> Result<(), WireError> {
    if buf.len() < needed {
        Err(WireError::BufferTooSmall {
            needed,
            got: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Fails with [`WireError::Truncated`] unless `buf` holds `needed` bytes.
pub(crate) fn check_len(buf: &[u8], needed: usize) -> Result<(), WireError> {
    if buf.len() < needed {
        Err(WireError::Truncated {
            needed,
            got: buf.len(),
        })
    } else {
        Ok(())
    }
}
