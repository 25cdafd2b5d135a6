use core::fmt;

use super::lnet::LnetMsgType;

/// Why bytes from the network (or a buffer handed to an emitter) were refused.
///
/// Each variant is its own failure so that counters and logs can say exactly what a peer sent.
/// Values are small and `Copy`: these errors sit on the receive path.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the format needs: a cut-off frame, or a peer speaking something else.
    Truncated { needed: usize, got: usize },
    /// The magic is neither ours nor byte-swapped ours: not an o2iblnd/ping message at all.
    BadMagic(u32),
    /// A known magic with a protocol version we do not speak (o2iblnd knows 0x11 and 0x12).
    BadVersion(u16),
    /// `ibm_nob` claims more bytes than were received.
    NobTooLarge { nob: u32, got: usize },
    /// `ibm_nob` is smaller than the minimum for the message type (or for its fragments).
    NobTooSmall { nob: u32, min: usize },
    /// An RDMA descriptor with no fragments or more than 257 (IBLND_MAX_RDMA_FRAGS).
    BadFragCount(u32),
    /// More inline payload than fits an IMMEDIATE message (3976 bytes).
    InlineTooLarge(usize),
    /// An IMMEDIATE message carries fewer inline bytes than its LNet header announces.
    InlineTooShort { announced: u32, carried: usize },
    /// An o2iblnd message type code we do not know.
    UnknownType(u8),
    /// An LNet message type outside ACK/PUT/GET/REPLY/HELLO.
    UnknownLnetType(u32),
    /// An LNet payload length the message type cannot have (ACK/GET > 0, PUT/REPLY > 1 MiB).
    BadPayloadLength { msg_type: LnetMsgType, len: u32 },
    /// The message checksum matches its bytes in neither flavour (signed or unsigned `char`).
    BadChecksum {
        carried: u32,
        unsigned: u32,
        signed: u32,
    },
    /// The sender NID is LNET_NID_ANY, which no sender can have.
    AnySourceNid,
    /// A ping reply without the NI_STATUS feature, which every receiver requires.
    PingWithoutStatus,
    /// The caller's buffer cannot hold what is being emitted.
    BufferTooSmall { needed: usize, got: usize },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Truncated { needed, got } => {
                write!(f, "truncated: need {needed} bytes, got {got}")
            }
            WireError::BadMagic(m) => write!(f, "bad magic {m:#010x}"),
            WireError::BadVersion(v) => write!(f, "unsupported protocol version {v:#x}"),
            WireError::NobTooLarge { nob, got } => {
                write!(f, "nob {nob} is larger than the {got} bytes received")
            }
            WireError::NobTooSmall { nob, min } => {
                write!(
                    f,
                    "nob {nob} is smaller than the {min} bytes this message needs"
                )
            }
            WireError::BadFragCount(n) => write!(f, "RDMA fragment count {n} out of range 1..=257"),
            WireError::InlineTooLarge(n) => {
                write!(f, "inline payload of {n} bytes exceeds the 3976-byte limit")
            }
            WireError::InlineTooShort { announced, carried } => write!(
                f,
                "IMMEDIATE announces {announced} payload bytes but carries {carried}"
            ),
            WireError::UnknownType(t) => write!(f, "unknown o2iblnd message type {t:#04x}"),
            WireError::UnknownLnetType(t) => write!(f, "unknown LNet message type {t}"),
            WireError::BadPayloadLength { msg_type, len } => {
                write!(f, "LNet {msg_type:?} cannot carry {len} payload bytes")
            }
            WireError::BadChecksum {
                carried,
                unsigned,
                signed,
            } => write!(
                f,
                "checksum mismatch: message says {carried:#010x}, bytes sum to {unsigned:#010x} \
                 (unsigned) or {signed:#010x} (signed)"
            ),
            WireError::AnySourceNid => write!(f, "source NID is LNET_NID_ANY"),
            WireError::PingWithoutStatus => write!(f, "ping reply lacks the NI_STATUS feature"),
            WireError::BufferTooSmall { needed, got } => {
                write!(
                    f,
                    "output buffer too small: need {needed} bytes, have {got}"
                )
            }
        }
    }
}

impl std::error::Error for WireError {}
