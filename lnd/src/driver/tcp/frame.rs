//! The tcp fabric's frame format on the socket.
//!
//! Every frame is
//!
//! ```text
//! +----------------+--------+----------------------+
//! | len: u32 (LE)  | kind   | body                 |
//! | 4 bytes        | 1 byte | len - 1 bytes        |
//! +----------------+--------+----------------------+
//! ```
//!
//! `len` counts the kind byte and the body (so `len >= 1`; a frame occupies `4 + len` bytes).
//!
//! | kind | name         | body                                        | body length      |
//! |------|--------------|---------------------------------------------|------------------|
//! | 1    | CONNREQ      | connection-manager private data (CONNREQ)   | 0..=64           |
//! | 2    | CONNACK      | private data (CONNACK)                      | 0..=64           |
//! | 3    | REJECT       | private data (the reject); then the passive side closes | 0..=64 |
//! | 4    | MSG          | one o2iblnd message, lands in one receive slot | 1..=4096      |
//! | 5    | DISCONNECT   | empty; the sender then does shutdown(WR)    | 0                |
//! | 6    | RDMA_WRITE   | `[u32 rkey LE][u64 addr LE][data]`: data for the receiver's registered memory | 12..=12 + 1 MiB |
//!
//! Private data is whole: a CONNREQ/CONNACK/REJECT frame carries all of it (at most
//! [`PrivateData::MAX`](crate::fabric::PrivateData::MAX) bytes). Kind 0 and kinds above 6 are
//! invalid. A frame is validated as soon as its 5-byte head arrives, before its body: a bad kind or
//! a length outside its kind's range closes the connection at once (counted), without waiting for
//! (or buffering) a body. End of stream in the middle of a frame is `Truncated`.
//!
//! RDMA_WRITE is the emulation of one RDMA write (or one piece of it): `data` goes to the
//! receiver's region registered under `rkey`, at virtual address `addr` (the region's address plus
//! an offset), and nothing is reported to the receiver's engine. Its length limit is its own
//! ([`MAX_WRITE_DATA`] bytes of data, LNET_MTU); senders cut writes into frames of at most
//! [`WRITE_CHUNK`] bytes of data, so a write is placed piece by piece, in order with the MSG frames
//! around it. Only MSG-sized frames ([`MAX_FRAME`]) must fit whole in a receive buffer: the
//! receiver validates the 17 bytes of head and write head ([`parse_write_head`]), checks the key
//! and the bounds `[addr, addr + data)` before writing anything, then streams the data from its
//! receive buffer into the region as it arrives, and reads what is still in the socket straight
//! into the region (`TcpFabric::parse`).

use core::fmt;

use crate::fabric::PrivateData;
use crate::wire::kib::MSG_SIZE;

/// Bytes before the body: the length and the kind.
pub const HEAD_LEN: usize = 5;
/// The largest frame a receiver holds whole in its receive buffer (a full MSG). RDMA_WRITE frames
/// may be larger: their data streams into the target region.
pub const MAX_FRAME: usize = HEAD_LEN + MSG_SIZE;
/// Bytes of an RDMA_WRITE body before its data: the rkey and the target address.
pub const WRITE_HEAD_LEN: usize = 12;
/// The most data one RDMA_WRITE frame may carry (LNET_MTU, the largest write o2iblnd makes).
pub const MAX_WRITE_DATA: usize = 1 << 20;
/// The most data a sender puts in one RDMA_WRITE frame (a larger write is several frames).
pub const WRITE_CHUNK: usize = 64 * 1024;

coded_enum! {
    /// What a frame is.
    pub enum FrameKind {
        ConnReq = 1,
        ConnAck = 2,
        Reject = 3,
        Msg = 4,
        Disconnect = 5,
        /// One RDMA write (or a piece of one): `[u32 rkey][u64 addr][data]`.
        RdmaWrite = 6,
    }
}

impl FrameKind {
    /// The body lengths allowed for this kind.
    pub fn body_range(self) -> core::ops::RangeInclusive<usize> {
        match self {
            FrameKind::ConnReq | FrameKind::ConnAck | FrameKind::Reject => 0..=PrivateData::MAX,
            FrameKind::Msg => 1..=MSG_SIZE,
            FrameKind::Disconnect => 0..=0,
            FrameKind::RdmaWrite => WRITE_HEAD_LEN..=WRITE_HEAD_LEN + MAX_WRITE_DATA,
        }
    }
}

/// Why the byte stream of a connection was refused. Each closes that connection and is counted.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum FrameError {
    /// A kind byte that is not a frame kind.
    BadKind(u8),
    /// A length outside the range of its kind (or zero).
    BadLength { kind: u8, len: u32 },
    /// End of stream inside a frame.
    Truncated,
    /// A well-formed frame that is not allowed in the connection's state (e.g. MSG before
    /// CONNREQ, a second CONNREQ, anything after DISCONNECT).
    Unexpected(FrameKind),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadKind(k) => write!(f, "bad frame kind {k}"),
            FrameError::BadLength { kind, len } => {
                write!(f, "bad frame length {len} for kind {kind}")
            }
            FrameError::Truncated => f.write_str("end of stream inside a frame"),
            FrameError::Unexpected(k) => write!(f, "unexpected {k:?} frame"),
        }
    }
}

/// A validated frame head.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub kind: FrameKind,
    /// Body bytes that follow the head.
    pub body_len: usize,
}

impl Head {
    /// Bytes of the whole frame.
    pub fn frame_len(self) -> usize {
        HEAD_LEN + self.body_len
    }
}

/// Validates the head at the start of `buf`: `Ok(None)` if fewer than [`HEAD_LEN`] bytes are there.
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, FrameError> {
    let Some(head) = buf.get(..HEAD_LEN) else {
        return Ok(None);
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let kind_byte = head[4];
    let Some(kind) = FrameKind::from_code(kind_byte) else {
        return Err(FrameError::BadKind(kind_byte));
    };
    let body_len = (len as usize).wrapping_sub(1);
    if len == 0 || !kind.body_range().contains(&body_len) {
        return Err(FrameError::BadLength {
            kind: kind_byte,
            len,
        });
    }
    Ok(Some(Head { kind, body_len }))
}

/// What [`split_frame`] finds: the head, the body, and the bytes after the frame.
pub type Split<'a> = (Head, &'a [u8], &'a [u8]);

/// A whole frame at the start of `buf`: its validated head, its body, and the bytes after it;
/// `Ok(None)` while the frame is incomplete (at the end of a stream that is
/// [`FrameError::Truncated`]). The fabric itself streams an RDMA_WRITE's data instead of waiting
/// for the whole frame; this is the same validation ([`parse_head`]) for whole buffers (tools,
/// the corpus test, the `tcp_frame` fuzz target).
pub fn split_frame(buf: &[u8]) -> Result<Option<Split<'_>>, FrameError> {
    let Some(head) = parse_head(buf)? else {
        return Ok(None);
    };
    let Some(body) = buf.get(HEAD_LEN..head.frame_len()) else {
        return Ok(None);
    };
    Ok(Some((head, body, &buf[head.frame_len()..])))
}

/// Appends the frame `split_frame` returned as (`head`, `body`) to `out`, through the encoders
/// the fabric sends with (an RDMA_WRITE through [`push_write_head`]): re-encoding what parsed
/// must give the same bytes.
pub fn push_parsed(out: &mut Vec<u8>, head: Head, body: &[u8]) {
    if head.kind == FrameKind::RdmaWrite {
        if let Some((key, addr)) = parse_write_head(body) {
            push_write_head(out, key, addr, body.len() - WRITE_HEAD_LEN);
            out.extend_from_slice(&body[WRITE_HEAD_LEN..]);
            return;
        }
    }
    push_frame(out, head.kind, body);
}

/// Appends the head of a `kind` frame with a `body_len`-byte body to `out`.
pub fn push_head(out: &mut Vec<u8>, kind: FrameKind, body_len: usize) {
    let len = (body_len as u32).wrapping_add(1);
    out.extend_from_slice(&len.to_le_bytes());
    out.push(kind as u8);
}

/// The (rkey, addr) of an RDMA_WRITE frame whose body starts at `body`: `None` if fewer than
/// [`WRITE_HEAD_LEN`] bytes are there.
pub fn parse_write_head(body: &[u8]) -> Option<(u32, u64)> {
    let b = body.get(..WRITE_HEAD_LEN)?;
    let key = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let mut addr = [0u8; 8];
    addr.copy_from_slice(&b[4..12]);
    Some((key, u64::from_le_bytes(addr)))
}

/// Appends the head and write head of an RDMA_WRITE frame carrying `data_len` bytes of data for
/// (`key`, `addr`); the data follows.
pub fn push_write_head(out: &mut Vec<u8>, key: u32, addr: u64, data_len: usize) {
    push_head(out, FrameKind::RdmaWrite, WRITE_HEAD_LEN + data_len);
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&addr.to_le_bytes());
}

/// Appends a whole frame to `out`.
pub fn push_frame(out: &mut Vec<u8>, kind: FrameKind, body: &[u8]) {
    push_head(out, kind, body.len());
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_roundtrip_and_limits() {
        let mut out = Vec::new();
        push_frame(&mut out, FrameKind::Msg, &[7u8; 100]);
        assert_eq!(&out[..5], &[101, 0, 0, 0, 4]);
        let h = parse_head(&out).unwrap().unwrap();
        assert_eq!(
            h,
            Head {
                kind: FrameKind::Msg,
                body_len: 100
            }
        );
        assert_eq!(h.frame_len(), out.len());
        assert_eq!(parse_head(&out[..4]), Ok(None));

        out.clear();
        push_frame(&mut out, FrameKind::Disconnect, &[]);
        assert_eq!(out, [1, 0, 0, 0, 5]);
        assert_eq!(
            parse_head(&out).unwrap().unwrap().kind,
            FrameKind::Disconnect
        );

        // Limits per kind.
        let head = |len: u32, kind: u8| {
            let mut b = len.to_le_bytes().to_vec();
            b.push(kind);
            b
        };
        // (body length, kind byte, what the head is).
        #[derive(Debug)]
        enum Want {
            Frame,
            BadLength,
            BadKind,
        }
        use Want::*;
        let cases = [
            (1 + 4096, 4, Frame),
            (2 + 4096, 4, BadLength),
            (1, 4, BadLength),
            (0, 1, BadLength),
            (65, 1, Frame),
            (66, 2, BadLength),
            (2, 5, BadLength),
            (1, 0, BadKind),
            (1, 7, BadKind),
            // RDMA_WRITE: at least the write head, at most 1 MiB of data.
            (1, 6, BadLength),
            (12, 6, BadLength),
            (13, 6, Frame),
            (13 + (1 << 20), 6, Frame),
            (14 + (1 << 20), 6, BadLength),
            (u32::MAX, 4, BadLength),
        ];
        for (len, kind, want) in cases {
            let got = parse_head(&head(len, kind));
            let case = format!("length {len}, kind {kind}: {want:?}");
            match want {
                Frame => assert!(got.unwrap().is_some(), "{case}"),
                BadLength => assert!(matches!(got, Err(FrameError::BadLength { .. })), "{case}"),
                BadKind => assert_eq!(got, Err(FrameError::BadKind(kind)), "{case}"),
            }
        }
        let mut w = Vec::new();
        push_write_head(&mut w, 0xdead_beef, 0x7f00_0000_1234, 3);
        w.extend_from_slice(&[1, 2, 3]);
        let h = parse_head(&w).unwrap().unwrap();
        assert_eq!(
            (h.kind, h.body_len, h.frame_len()),
            (FrameKind::RdmaWrite, 15, w.len())
        );
        assert_eq!(
            parse_write_head(&w[HEAD_LEN..]),
            Some((0xdead_beef, 0x7f00_0000_1234))
        );
        assert_eq!(parse_write_head(&w[HEAD_LEN..HEAD_LEN + 11]), None);
    }

    #[test]
    fn parse_head_never_panics() {
        for x in testkit::XorShift(0x9e37_79b9_7f4a_7c15).take(10_000) {
            let b = x.to_le_bytes();
            let _ = parse_head(&b[..(x % 9) as usize]);
        }
    }
}
