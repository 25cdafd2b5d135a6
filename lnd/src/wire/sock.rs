//! The LNet acceptor and ksocklnd (socklnd, the `tcp` LND) wire formats
//! (shared/reference/lustre-socklnd.md, sections 2, 3, 5 and 8).
//!
//! A socklnd connection starts with three things, each parsed here from untrusted bytes:
//!
//! 1. The **acceptor request** (`acceptor.c:lnet_connect` / `lnet_accept`): 16 bytes (v1, a 64-bit
//!    target NID) or 28 bytes (v2, a 20-byte `struct lnet_nid`), in the dialer's byte order.
//!    [`classify_acceptor`] reads the first four bytes, [`ConnReq`] the rest.
//! 2. The **HELLO** (`socklnd_cb.c:ksocknal_send_hello` / `ksocknal_recv_hello`): [`hello_head`]
//!    reads magic and version (8 bytes), which say how long the rest is; [`Hello::parse_body`]
//!    reads it; [`Hello::check_ips`] the (legacy) IP list that V1-V3 may append.
//! 3. Then **KSOCK messages** ([`KsockHdr`], 24 bytes): a NOOP (header only) or an LNET message
//!    (header + the 72-byte little-endian [`LnetHdr`](super::LnetHdr) + payload). Their zero-copy
//!    cookies acknowledge the peer's zero-copy sends ([`ZcAcks`], [`zc_ack_noops`]).
//!
//! As in the rest of `wire`, every parse checks lengths first and every read after that goes
//! through [`ByteOrder`]'s panic-free accessors; a refusal is a typed [`SockError`].
//!
//! Byte order: a receiver recognises the sender's order by the magic and swaps every integer of a
//! byte-swapped request or HELLO, including the HELLO's 64-bit NIDs. Kernels since 2.15 forget to
//! swap those NIDs (reference 3.3, a latent bug that only hits opposite-endian peers); we read what
//! a big-endian sender actually wrote. We always send little-endian, as every x86 and arm64 kernel.

use core::fmt;

use super::{ByteOrder, LndType, Net, Nid};

/// `LNET_PROTO_ACCEPTOR_MAGIC`: the first word of an acceptor request.
pub const ACCEPTOR_MAGIC: u32 = 0xacce_7100;
/// `LNET_PROTO_MAGIC`: the first word of a V2, V3 or V4 HELLO.
pub const PROTO_MAGIC: u32 = 0x4572_6963;
/// `LNET_PROTO_TCP_MAGIC`: the first word of a V1 HELLO (and of a pre-acceptor socknal).
pub const V1_MAGIC: u32 = 0xeebc_0ded;
/// The acceptor's TCP port, the same on every node (`accept_port`).
pub const ACCEPT_PORT: u16 = 988;
/// Acceptor request version 1: the target is a 64-bit NID.
pub const ACCEPTOR_V1: u32 = 1;
/// Acceptor request version 2: the target is a 20-byte `struct lnet_nid` (large NIDs).
pub const ACCEPTOR_V2: u32 = 2;
/// Bytes in a v1 acceptor request.
pub const CONNREQ_LEN: usize = 16;
/// Bytes in a v2 acceptor request.
pub const CONNREQ_V2_LEN: usize = 28;
/// Magic + version of a HELLO: what decides the rest.
pub const HELLO_HEAD_LEN: usize = 8;
/// Bytes in a V2/V3 HELLO (`struct ksock_hello_msg_nid4`), without the IP list.
pub const HELLO_V3_LEN: usize = 56;
/// Bytes in a V4 HELLO (`struct ksock_hello_msg`).
pub const HELLO_V4_LEN: usize = 80;
/// Bytes in a V1 HELLO (a 72-byte LNet header), without the IP list.
pub const HELLO_V1_LEN: usize = 72;
/// Bytes in a KSOCK message header (`struct ksock_msg_hdr`).
pub const KSOCK_HDR_LEN: usize = 24;
/// Bytes before the payload of a V2/V3 KSOCK_MSG_LNET message: KSOCK header + nid4 LNet header.
pub const KSOCK_LNET_HDR_LEN: usize = KSOCK_HDR_LEN + super::lnet::LNET_HDR_LEN;
/// The most IPv4 addresses a V1-V3 HELLO may list (`LNET_INTERFACES_NUM`).
pub const MAX_HELLO_IPS: u32 = 16;
/// `ksm_zc_cookies[1]` of a keepalive NOOP (`SOCKNAL_KEEPALIVE_PING`); acknowledges nothing.
pub const ZC_KEEPALIVE: u64 = 1;
/// `KSOCK_MSG_NOOP`.
pub const KSOCK_MSG_NOOP: u32 = 0xc0;
/// `KSOCK_MSG_LNET`.
pub const KSOCK_MSG_LNET: u32 = 0xc1;
/// Bytes in a `struct lnet_nid`.
pub const WIDE_NID_LEN: usize = 20;

const LE: ByteOrder = ByteOrder::Little;

/// Why socklnd bytes were refused. One variant per reason, so counters and logs can say exactly
/// what a peer sent; small and `Copy`, as they sit on the receive path.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SockError {
    /// Fewer bytes than the format needs.
    #[error("short: need {need} bytes, got {got}")]
    Short { need: usize, got: usize },
    /// Not the magic this format starts with, in either byte order.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// A known magic with a version we do not know: an acceptor request other than 1 or 2 (the
    /// acceptor answers [`acceptor_refusal`]), a HELLO other than V1-V4 (the passive side answers
    /// with a V3 HELLO of ctype -1, [`Hello::refusal`]).
    #[error("unknown protocol version {0:#x}")]
    BadVersion(u32),
    /// A sender NID of LNET_NID_ANY, which no sender can have (`ksocknal_recv_hello`).
    #[error("source NID is LNET_NID_ANY")]
    NidAny,
    /// A HELLO listing more than 16 IP addresses.
    #[error("HELLO lists {0} IP addresses, more than 16")]
    TooManyIps(u32),
    /// A HELLO listing the address 0.0.0.0.
    #[error("HELLO lists the zero IP address")]
    ZeroIp,
    /// A HELLO connection type outside -1..=3.
    #[error("connection type {0} is not one of -1..=3")]
    BadConnType(i32),
    /// A KSOCK message type other than NOOP (0xc0) or LNET (0xc1).
    #[error("unknown KSOCK message type {0:#x}")]
    BadMsgType(u32),
    /// A V1 HELLO whose LNet header is not of type HELLO (4).
    #[error("V1 HELLO header has LNet type {0}, not HELLO (4)")]
    V1NotHello(u32),
    /// A 20-byte `struct lnet_nid` that a 64-bit NID cannot hold (IPv6, or a malformed one).
    #[error("NID {0} does not fit in 64 bits")]
    LargeNid(WideNid),
    /// We only ever send V2 and V3 HELLOs (V1 and V4 peers get a V3 refusal).
    #[error("we do not emit HELLO version {0}")]
    CannotEmit(u32),
}

// ---------------------------------------------------------------------------------------------
// 20-byte NIDs
// ---------------------------------------------------------------------------------------------

/// A `struct lnet_nid` as carried by acceptor requests v2 and V4 HELLOs (byte-order independent):
/// u8 `nid_size` (address bytes - 4), u8 `nid_type` (the LND), big-endian u16 `nid_num`, then
/// 16 address bytes in network order, zero-padded.
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct WideNid(pub [u8; WIDE_NID_LEN]);

impl WideNid {
    /// `LNET_ANY_NID`: all ones.
    pub const ANY: WideNid = WideNid([0xff; WIDE_NID_LEN]);

    /// The wide form of a 64-bit NID, as `lnet_nid4_to_nid` builds it (LNET_NID_ANY becomes
    /// LNET_ANY_NID); `None` for an LND type number that does not fit the 8-bit `nid_type`.
    pub fn from_nid(nid: Nid) -> Option<WideNid> {
        if nid.is_any() {
            return Some(WideNid::ANY);
        }
        let lnd = u8::try_from(nid.net().lnd().number()).ok()?;
        let mut b = [0u8; WIDE_NID_LEN];
        b[1] = lnd;
        b[2..4].copy_from_slice(&nid.net().number().to_be_bytes());
        b[4..8].copy_from_slice(&nid.addr().to_be_bytes());
        Some(WideNid(b))
    }

    /// Reads 20 bytes at `at`; zeros past the end of `b`.
    fn read(b: &[u8], at: usize) -> WideNid {
        let mut w = [0u8; WIDE_NID_LEN];
        if let Some(s) = b.get(at..at.saturating_add(WIDE_NID_LEN)) {
            w.copy_from_slice(s);
        }
        WideNid(w)
    }

    /// `nid_size`: address bytes minus 4 (0 for IPv4, 12 for IPv6).
    pub fn size(&self) -> u8 {
        self.0[0]
    }

    /// The LND type.
    pub fn lnd(&self) -> LndType {
        LndType::from_number(u16::from(self.0[1]))
    }

    /// The network number.
    pub fn net_number(&self) -> u16 {
        u16::from_be_bytes([self.0[2], self.0[3]])
    }

    /// True for `LNET_ANY_NID`.
    pub fn is_any(&self) -> bool {
        *self == WideNid::ANY
    }

    /// The 64-bit NID this is, if it is one: a 4-byte address with zero padding (the kernel
    /// compares all 16 address bytes, so padding is part of the identity), or LNET_ANY_NID.
    pub fn to_nid(&self) -> Option<Nid> {
        if self.is_any() {
            return Some(Nid::ANY);
        }
        if self.size() != 0 || self.0[8..].iter().any(|&b| b != 0) {
            return None;
        }
        let net = Net::new(self.lnd(), self.net_number());
        let addr = u32::from_be_bytes([self.0[4], self.0[5], self.0[6], self.0[7]]);
        Some(Nid::new(net, addr))
    }

    /// `to_nid`, with LNET_ANY_NID and large NIDs refused.
    fn to_sender_nid(self) -> Result<Nid, SockError> {
        let nid = self.to_nid().ok_or(SockError::LargeNid(self))?;
        if nid.is_any() {
            return Err(SockError::NidAny);
        }
        Ok(nid)
    }
}

impl fmt::Display for WideNid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(nid) = self.to_nid() {
            // LNET_ANY_NID prints as "<?>", as Nid's Display does.
            return write!(f, "{nid}");
        }
        let net = Net::new(self.lnd(), self.net_number());
        if self.size() == 12 {
            let mut a = [0u8; 16];
            a.copy_from_slice(&self.0[4..]);
            return write!(f, "{}@{net}", std::net::Ipv6Addr::from(a));
        }
        // Something no kernel sends: show the raw bytes.
        f.write_str("<")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        f.write_str(">")
    }
}

impl fmt::Debug for WideNid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WideNid({self})")
    }
}

// ---------------------------------------------------------------------------------------------
// The acceptor
// ---------------------------------------------------------------------------------------------

/// What the first 4 bytes at the acceptor say the connection is (`acceptor.c:lnet_accept`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum AcceptorMagic {
    /// An acceptor request, in this byte order: read the version next.
    Acceptor { order: ByteOrder },
    /// A HELLO sent without an acceptor request (a newer peer, or a confused one): the acceptor
    /// answers [`acceptor_refusal`] and closes.
    LnetProto,
    /// A pre-acceptor socknal (V1 magic, either order): closed without a reply.
    V1Socknal,
    /// Anything else (the value read little-endian): closed without a reply.
    Other(u32),
}

/// Classifies the first 4 bytes read by the acceptor. Every magic is recognised in both byte
/// orders, as `lnet_accept_magic` does.
pub fn classify_acceptor(first4: [u8; 4]) -> AcceptorMagic {
    if let Some(order) = ByteOrder::detect(&first4, 0, ACCEPTOR_MAGIC) {
        AcceptorMagic::Acceptor { order }
    } else if ByteOrder::detect(&first4, 0, PROTO_MAGIC).is_some() {
        AcceptorMagic::LnetProto
    } else if ByteOrder::detect(&first4, 0, V1_MAGIC).is_some() {
        AcceptorMagic::V1Socknal
    } else {
        AcceptorMagic::Other(u32::from_le_bytes(first4))
    }
}

/// An acceptor connection request: which of the listener's NIs the dialer wants.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConnReq {
    /// 1 or 2 as received; [`ConnReq::emit`] always writes version 1.
    pub version: u32,
    /// The NID of the NI being asked for (the listener's, not the dialer's).
    pub target: Nid,
}

impl ConnReq {
    /// A v1 request for `target`.
    pub fn new(target: Nid) -> ConnReq {
        ConnReq {
            version: ACCEPTOR_V1,
            target,
        }
    }

    /// Parses a whole request (magic, version and target: 16 bytes for v1, 28 for v2) in `order`
    /// (from [`classify_acceptor`]). A v2 target that is not a 64-bit NID is
    /// [`SockError::LargeNid`]: it can match none of our NIs.
    pub fn parse(order: ByteOrder, b: &[u8]) -> Result<ConnReq, SockError> {
        check(b, 8)?;
        let magic = order.get_u32(b, 0);
        if magic != ACCEPTOR_MAGIC {
            return Err(SockError::BadMagic(magic));
        }
        let version = order.get_u32(b, 4);
        let body = ConnReq::body_len(version).ok_or(SockError::BadVersion(version))?;
        check(b, 8 + body)?;
        let target = if version == ACCEPTOR_V1 {
            // A flipped v1 request has its NID swapped too (lnet_accept: __swab64s).
            Nid::from_raw(order.get_u64(b, 8))
        } else {
            let w = WideNid::read(b, 8);
            w.to_nid().ok_or(SockError::LargeNid(w))?
        };
        Ok(ConnReq { version, target })
    }

    /// Bytes after magic + version for a request of `version`; `None` for a version the acceptor
    /// does not know (it then answers [`acceptor_refusal`]).
    pub fn body_len(version: u32) -> Option<usize> {
        match version {
            ACCEPTOR_V1 => Some(CONNREQ_LEN - 8),
            ACCEPTOR_V2 => Some(CONNREQ_V2_LEN - 8),
            _ => None,
        }
    }

    /// The 16-byte v1 request, little-endian (what we send: our NIDs are 64-bit).
    pub fn emit(&self) -> [u8; CONNREQ_LEN] {
        let mut b = [0u8; CONNREQ_LEN];
        LE.put_u32(&mut b, 0, ACCEPTOR_MAGIC);
        LE.put_u32(&mut b, 4, ACCEPTOR_V1);
        LE.put_u64(&mut b, 8, self.target.raw());
        b
    }
}

/// The 16 bytes the acceptor writes before closing on a HELLO sent without a request, or on a
/// request version it does not know: {magic, version 1, NID 0}, little-endian.
pub fn acceptor_refusal() -> [u8; CONNREQ_LEN] {
    ConnReq::new(Nid::from_raw(0)).emit()
}

// ---------------------------------------------------------------------------------------------
// HELLO
// ---------------------------------------------------------------------------------------------

/// A socklnd protocol version (reference 3.1).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HelloVersion {
    /// The V1 magic and a bare 72-byte LNet header of type HELLO; no KSOCK headers after.
    V1,
    /// KSOCK messages; the only version with checksums.
    V2,
    /// What kernels 2.15 and 2.16 send first to IPv4 peers, and what we speak.
    V3,
    /// 20-byte NIDs and a 96-byte LNet header (2.16, IPv6).
    V4,
}

impl HelloVersion {
    /// The version number (1..=4).
    pub const fn number(self) -> u32 {
        match self {
            HelloVersion::V1 => 1,
            HelloVersion::V2 => 2,
            HelloVersion::V3 => 3,
            HelloVersion::V4 => 4,
        }
    }

    /// The V2-V4 version with this number (V1 is recognised by its own magic, not a number).
    pub const fn from_number(v: u32) -> Option<HelloVersion> {
        match v {
            2 => Some(HelloVersion::V2),
            3 => Some(HelloVersion::V3),
            4 => Some(HelloVersion::V4),
            _ => None,
        }
    }

    /// Whether we run connections in this version. The others (V1, V4) are answered with a V3
    /// HELLO of ctype -1, as a 2.15 kernel answers V4.
    pub const fn is_spoken(self) -> bool {
        matches!(self, HelloVersion::V2 | HelloVersion::V3)
    }
}

/// A HELLO's magic and version: its byte order and how many bytes follow.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct HelloHead {
    pub version: HelloVersion,
    pub order: ByteOrder,
}

/// Reads a HELLO's first 8 bytes (`ksocknal_recv_hello`): `PROTO_MAGIC` in either order with
/// version 2, 3 or 4; or the little-endian V1 magic with version 1.0. A good magic with another
/// version is [`SockError::BadVersion`] (the passive side answers with a V3 refusal); any other
/// magic is [`SockError::BadMagic`] (closed without a reply).
pub fn hello_head(b: &[u8; 8]) -> Result<HelloHead, SockError> {
    if let Some(order) = ByteOrder::detect(b, 0, PROTO_MAGIC) {
        let v = order.get_u32(b, 4);
        let version = HelloVersion::from_number(v).ok_or(SockError::BadVersion(v))?;
        return Ok(HelloHead { version, order });
    }
    // A V1 HELLO is always little-endian: the kernel compares with le32_to_cpu(TCP magic) and
    // refuses the swapped form as a bad magic. Its version is {u16 major 1, u16 minor 0}.
    let magic = LE.get_u32(b, 0);
    if magic == V1_MAGIC {
        let v = LE.get_u32(b, 4);
        if LE.get_u16(b, 4) == 1 && LE.get_u16(b, 6) == 0 {
            return Ok(HelloHead {
                version: HelloVersion::V1,
                order: ByteOrder::Little,
            });
        }
        return Err(SockError::BadVersion(v));
    }
    Err(SockError::BadMagic(magic))
}

impl HelloHead {
    /// Bytes after the head, before any IP list: V2/V3 48, V4 72, V1 64.
    pub fn body_len(&self) -> usize {
        match self.version {
            HelloVersion::V1 => HELLO_V1_LEN - HELLO_HEAD_LEN,
            HelloVersion::V2 | HelloVersion::V3 => HELLO_V3_LEN - HELLO_HEAD_LEN,
            HelloVersion::V4 => HELLO_V4_LEN - HELLO_HEAD_LEN,
        }
    }
}

/// A socklnd connection type (`SOCKLND_CONN_*`), named from its owner's view.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConnType {
    /// 0: untyped (typed_conns = 0); V3 never sends on it.
    Any,
    /// 1: small messages.
    Control,
    /// 2: the owner receives bulk here; also where it sends ZC-ACKs and keepalives
    /// (`SOCKLND_CONN_ACK`).
    BulkIn,
    /// 3: the owner sends bulk here.
    BulkOut,
}

impl ConnType {
    /// The type with wire value `v` (0..=3); -1 (NONE, a refusal) and the rest are `None`.
    pub fn from_wire(v: i32) -> Option<ConnType> {
        match v {
            0 => Some(ConnType::Any),
            1 => Some(ConnType::Control),
            2 => Some(ConnType::BulkIn),
            3 => Some(ConnType::BulkOut),
            _ => None,
        }
    }

    /// The wire value.
    pub fn to_wire(self) -> i32 {
        match self {
            ConnType::Any => 0,
            ConnType::Control => 1,
            ConnType::BulkIn => 2,
            ConnType::BulkOut => 3,
        }
    }

    /// The type of the same connection seen from the other end: the dialer's BULK_IN is the
    /// listener's BULK_OUT (`ksocknal_invert_type`).
    pub fn inverse(self) -> ConnType {
        match self {
            ConnType::BulkIn => ConnType::BulkOut,
            ConnType::BulkOut => ConnType::BulkIn,
            t => t,
        }
    }
}

/// A HELLO, any version. Numbers are host values whatever order they came in.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Hello {
    pub version: HelloVersion,
    pub src_nid: Nid,
    /// Not checked by kernels; V1 carries none (0).
    pub dst_nid: Nid,
    pub src_pid: u32,
    /// Never filled by a kernel sender; echoed by a passive kernel. Send 0, ignore.
    pub dst_pid: u32,
    pub src_incarnation: u64,
    /// As `dst_pid`.
    pub dst_incarnation: u64,
    /// As sent: -1 NONE (a refusal), 0..=3 a [`ConnType`]; anything else fails the parse.
    pub ctype: i32,
    /// How many u32 IPv4 addresses follow (V1-V3; 0 for V4, which reads no list): the caller reads
    /// `4 * nips` more bytes and hands them to [`Hello::check_ips`].
    pub nips: u32,
}

/// V2/V3 offsets, from the start of the HELLO.
mod v3 {
    pub const SRC_NID: usize = 8;
    pub const DST_NID: usize = 16;
    pub const SRC_PID: usize = 24;
    pub const DST_PID: usize = 28;
    pub const SRC_INC: usize = 32;
    pub const DST_INC: usize = 40;
    pub const CTYPE: usize = 48;
    pub const NIPS: usize = 52;
}

/// V4 offsets, from the start of the HELLO.
mod v4 {
    pub const SRC_NID: usize = 8;
    pub const DST_NID: usize = 28;
    pub const SRC_PID: usize = 48;
    pub const DST_PID: usize = 52;
    pub const SRC_INC: usize = 56;
    pub const DST_INC: usize = 64;
    pub const CTYPE: usize = 72;
}

/// V1 offsets (a nid4 LNet header whose dest_nid slot holds the magic and version), from the
/// start of the HELLO.
mod v1 {
    pub const SRC_NID: usize = 8;
    pub const DEST_PID: usize = 16;
    pub const SRC_PID: usize = 20;
    pub const TYPE: usize = 24;
    pub const PAYLOAD_LENGTH: usize = 28;
    pub const INCARNATION: usize = 32;
    pub const CTYPE: usize = 40;
}

impl Hello {
    /// The connection type of a refusal (`SOCKLND_CONN_NONE`).
    pub const REFUSED: i32 = -1;

    /// Parses the `head.body_len()` bytes after the head (more are ignored). Refuses a source
    /// NID of LNET_NID_ANY, more than 16 IPs (V1-V3), a ctype outside -1..=3, a V1 header that is
    /// not of type HELLO, and (V4) a NID a 64-bit NID cannot hold. A V4 HELLO is answered with a
    /// V3 refusal whatever this returns.
    pub fn parse_body(head: &HelloHead, body: &[u8]) -> Result<Hello, SockError> {
        check(body, head.body_len())?;
        // Offsets below are from the start of the HELLO; the head is not in `body`.
        let o = head.order;
        let at = |off: usize| off - HELLO_HEAD_LEN;
        let hello = match head.version {
            HelloVersion::V2 | HelloVersion::V3 => Hello {
                version: head.version,
                src_nid: Nid::from_raw(o.get_u64(body, at(v3::SRC_NID))),
                dst_nid: Nid::from_raw(o.get_u64(body, at(v3::DST_NID))),
                src_pid: o.get_u32(body, at(v3::SRC_PID)),
                dst_pid: o.get_u32(body, at(v3::DST_PID)),
                src_incarnation: o.get_u64(body, at(v3::SRC_INC)),
                dst_incarnation: o.get_u64(body, at(v3::DST_INC)),
                ctype: o.get_u32(body, at(v3::CTYPE)) as i32,
                nips: o.get_u32(body, at(v3::NIPS)),
            },
            HelloVersion::V4 => {
                let src = WideNid::read(body, at(v4::SRC_NID)).to_sender_nid()?;
                let dst = WideNid::read(body, at(v4::DST_NID));
                let dst = dst.to_nid().ok_or(SockError::LargeNid(dst))?;
                Hello {
                    version: head.version,
                    src_nid: src,
                    dst_nid: dst,
                    src_pid: o.get_u32(body, at(v4::SRC_PID)),
                    dst_pid: o.get_u32(body, at(v4::DST_PID)),
                    src_incarnation: o.get_u64(body, at(v4::SRC_INC)),
                    dst_incarnation: o.get_u64(body, at(v4::DST_INC)),
                    ctype: o.get_u32(body, at(v4::CTYPE)) as i32,
                    // ksocknal_recv_hello_v2 reads no list for V4 and ignores the field.
                    nips: 0,
                }
            }
            HelloVersion::V1 => {
                // ksocknal_recv_hello_v1: the rest of an LNet header, always little-endian.
                let t = LE.get_u32(body, at(v1::TYPE));
                if t != super::lnet::LnetMsgType::Hello as u32 {
                    return Err(SockError::V1NotHello(t));
                }
                Hello {
                    version: HelloVersion::V1,
                    src_nid: Nid::from_raw(LE.get_u64(body, at(v1::SRC_NID))),
                    dst_nid: Nid::from_raw(0),
                    src_pid: LE.get_u32(body, at(v1::SRC_PID)),
                    dst_pid: LE.get_u32(body, at(v1::DEST_PID)),
                    src_incarnation: LE.get_u64(body, at(v1::INCARNATION)),
                    dst_incarnation: 0,
                    ctype: LE.get_u32(body, at(v1::CTYPE)) as i32,
                    // The list's byte count, in the header's payload_length.
                    nips: LE.get_u32(body, at(v1::PAYLOAD_LENGTH)) / 4,
                }
            }
        };
        if hello.src_nid.is_any() {
            return Err(SockError::NidAny);
        }
        if hello.nips > MAX_HELLO_IPS {
            return Err(SockError::TooManyIps(hello.nips));
        }
        if hello.ctype != Hello::REFUSED && ConnType::from_wire(hello.ctype).is_none() {
            return Err(SockError::BadConnType(hello.ctype));
        }
        Ok(hello)
    }

    /// Checks the IP list that followed a V1-V3 HELLO (`4 * nips` bytes, in the HELLO's order;
    /// V1 little-endian): a zero address fails the HELLO, as in `ksocknal_recv_hello`. The
    /// addresses themselves are not used (kernels since 2.15 send none).
    pub fn check_ips(head: &HelloHead, ips: &[u8]) -> Result<(), SockError> {
        let order = match head.version {
            HelloVersion::V1 => ByteOrder::Little,
            _ => head.order,
        };
        if ips.len() % 4 != 0 {
            return Err(SockError::Short {
                need: ips.len().next_multiple_of(4),
                got: ips.len(),
            });
        }
        if ips.len() > 4 * MAX_HELLO_IPS as usize {
            return Err(SockError::TooManyIps((ips.len() / 4) as u32));
        }
        let zero = (0..ips.len())
            .step_by(4)
            .any(|at| order.get_u32(ips, at) == 0);
        if zero {
            Err(SockError::ZeroIp)
        } else {
            Ok(())
        }
    }

    /// The connection type the sender asked for; `None` for a refusal (ctype -1).
    pub fn conn_type(&self) -> Option<ConnType> {
        ConnType::from_wire(self.ctype)
    }

    /// True for a refusal (ctype -1).
    pub fn is_refusal(&self) -> bool {
        self.ctype == Hello::REFUSED
    }

    /// The V3 HELLO with ctype -1 that a passive side sends before closing, to refuse a
    /// connection or a protocol version it does not speak (`ksocknal_recv_hello`, unknown
    /// version; `ksocknal_create_conn`, refusals). For an unknown version the kernel names itself
    /// as `dst_nid`; for other refusals the dialer's claimed NID.
    pub fn refusal(my_nid: Nid, dst_nid: Nid, my_incarnation: u64) -> Hello {
        Hello::new(
            HelloVersion::V3,
            my_nid,
            dst_nid,
            my_incarnation,
            Hello::REFUSED,
        )
    }

    /// The HELLO a kernel sends from `src_nid` to `dst_nid` (both sides' and the answer's):
    /// LNET_PID_LUSTRE as its PID, the peer's PID and incarnation left 0 (`ksocknal_send_hello`
    /// never fills them), no IP list, and `ctype` as it goes on the wire.
    pub fn new(
        version: HelloVersion,
        src_nid: Nid,
        dst_nid: Nid,
        src_incarnation: u64,
        ctype: i32,
    ) -> Hello {
        Hello {
            version,
            src_nid,
            dst_nid,
            src_pid: super::lnet::LNET_PID_LUSTRE,
            dst_pid: 0,
            src_incarnation,
            dst_incarnation: 0,
            ctype,
            nips: 0,
        }
    }

    /// The 56-byte V2/V3 HELLO, little-endian, with no IP list (`nips` is written as 0, as 2.15+
    /// kernels send). We never send V1 or V4 ([`SockError::CannotEmit`]).
    pub fn emit(&self) -> Result<Vec<u8>, SockError> {
        let mut b = vec![0u8; HELLO_V3_LEN];
        self.emit_into(&mut b)?;
        Ok(b)
    }

    /// As [`emit`](Self::emit), into the first 56 bytes of `b`; returns 56.
    pub fn emit_into(&self, b: &mut [u8]) -> Result<usize, SockError> {
        if !self.version.is_spoken() {
            return Err(SockError::CannotEmit(self.version.number()));
        }
        check(b, HELLO_V3_LEN)?;
        if let Some(s) = b.get_mut(..HELLO_V3_LEN) {
            s.fill(0);
        }
        LE.put_u32(b, 0, PROTO_MAGIC);
        LE.put_u32(b, 4, self.version.number());
        LE.put_u64(b, v3::SRC_NID, self.src_nid.raw());
        LE.put_u64(b, v3::DST_NID, self.dst_nid.raw());
        LE.put_u32(b, v3::SRC_PID, self.src_pid);
        LE.put_u32(b, v3::DST_PID, self.dst_pid);
        LE.put_u64(b, v3::SRC_INC, self.src_incarnation);
        LE.put_u64(b, v3::DST_INC, self.dst_incarnation);
        LE.put_u32(b, v3::CTYPE, self.ctype as u32);
        // nips stays 0.
        Ok(HELLO_V3_LEN)
    }
}

// ---------------------------------------------------------------------------------------------
// KSOCK messages
// ---------------------------------------------------------------------------------------------

/// A KSOCK message type.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum KsockType {
    /// 0xc0: the header alone (ZC-ACKs, keepalives).
    Noop,
    /// 0xc1: an LNet header and its payload follow.
    Lnet,
}

impl KsockType {
    /// The type with wire value `v`.
    pub fn from_wire(v: u32) -> Option<KsockType> {
        match v {
            KSOCK_MSG_NOOP => Some(KsockType::Noop),
            KSOCK_MSG_LNET => Some(KsockType::Lnet),
            _ => None,
        }
    }

    /// The wire value.
    pub fn to_wire(self) -> u32 {
        match self {
            KsockType::Noop => KSOCK_MSG_NOOP,
            KsockType::Lnet => KSOCK_MSG_LNET,
        }
    }
}

/// The 24-byte KSOCK message header (`struct ksock_msg_hdr`, reference 5.1), sender order:
/// u32 type, u32 csum, u64 `zc_cookies[0]`, u64 `zc_cookies[1]`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct KsockHdr {
    pub kind: KsockType,
    /// 0 = none. Only V2 connections ever carry one (reference 5.4); we send 0.
    pub csum: u32,
    /// `zc_cookies[0]`: on LNET, the zero-copy request cookie (0 = no ACK wanted); on a NOOP, the
    /// low end of an ACK range or pair.
    pub zc_req: u64,
    /// `zc_cookies[1]`: the zero-copy ACK cookie (0 = none, 1 = keepalive).
    pub zc_ack: u64,
}

impl KsockHdr {
    /// The header of an LNET message asking for no zero-copy ACK and acknowledging nothing.
    pub const LNET: KsockHdr = KsockHdr {
        kind: KsockType::Lnet,
        csum: 0,
        zc_req: 0,
        zc_ack: 0,
    };

    /// A keepalive NOOP (`ksocknal_send_keepalive_locked`): cookies {0, 1}.
    pub const KEEPALIVE: KsockHdr = KsockHdr {
        kind: KsockType::Noop,
        csum: 0,
        zc_req: 0,
        zc_ack: ZC_KEEPALIVE,
    };

    /// Parses a little-endian header (what every kernel sends).
    pub fn parse(b: &[u8]) -> Result<KsockHdr, SockError> {
        KsockHdr::parse_in(ByteOrder::Little, b)
    }

    /// Parses a header in `order` (the HELLO's: `ksocknal_process_receive` swaps it when the
    /// connection is flipped).
    pub fn parse_in(order: ByteOrder, b: &[u8]) -> Result<KsockHdr, SockError> {
        check(b, KSOCK_HDR_LEN)?;
        let t = order.get_u32(b, 0);
        let kind = KsockType::from_wire(t).ok_or(SockError::BadMsgType(t))?;
        Ok(KsockHdr {
            kind,
            csum: order.get_u32(b, 4),
            zc_req: order.get_u64(b, 8),
            zc_ack: order.get_u64(b, 16),
        })
    }

    /// The 24 bytes, little-endian.
    pub fn emit(&self) -> [u8; KSOCK_HDR_LEN] {
        self.emit_in(ByteOrder::Little)
    }

    /// The 24 bytes in `order`.
    pub fn emit_in(&self, order: ByteOrder) -> [u8; KSOCK_HDR_LEN] {
        let mut b = [0u8; KSOCK_HDR_LEN];
        order.put_u32(&mut b, 0, self.kind.to_wire());
        order.put_u32(&mut b, 4, self.csum);
        order.put_u64(&mut b, 8, self.zc_req);
        order.put_u64(&mut b, 16, self.zc_ack);
        b
    }

    /// A V2 checksum started over this header with its csum field zeroed (`ksocknal_lib_csum_tx`
    /// sums the KSOCK header, the LNet header and the payload; feed the rest with
    /// [`KsockCsum::update`]).
    pub fn csum_start(&self) -> KsockCsum {
        let mut c = KsockCsum::new();
        c.update(&KsockHdr { csum: 0, ..*self }.emit());
        c
    }
}

/// What a received header's ACK cookies acknowledge (reference 5.5; `ksocknal_handle_zcack`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ZcAcks {
    /// `zc_cookies[1]` is 0.
    None,
    /// A keepalive ping (cookie 1 alone): acknowledges nothing.
    Keepalive,
    /// One cookie.
    One(u64),
    /// Every cookie in `a..=b` (`a < b`).
    Range(u64, u64),
    /// Exactly `a` and `b` (`a > b`).
    Pair(u64, u64),
}

impl ZcAcks {
    /// Decodes a header's ACK cookies. On an LNET message only `zc_cookies[1]` acknowledges
    /// (`zc_cookies[0]` is its own request); on a NOOP, `{0, c}` and `{c, c}` acknowledge c,
    /// `{a < b}` the range, `{a > b}` the pair. A keepalive is cookie 1 alone; cookie 1 in a pair
    /// is decoded as such and, never being pending, fails the sender's count check as in the
    /// kernel.
    pub fn from_hdr(h: &KsockHdr) -> ZcAcks {
        let b = h.zc_ack;
        if b == 0 {
            return ZcAcks::None;
        }
        let a = match h.kind {
            KsockType::Noop if h.zc_req != 0 => h.zc_req,
            _ => b,
        };
        if a == b {
            if b == ZC_KEEPALIVE {
                ZcAcks::Keepalive
            } else {
                ZcAcks::One(b)
            }
        } else if a < b {
            ZcAcks::Range(a, b)
        } else {
            ZcAcks::Pair(a, b)
        }
    }

    /// How many cookies this acknowledges (the kernel closes the connection unless exactly this
    /// many were pending).
    pub fn count(&self) -> u64 {
        match *self {
            ZcAcks::None | ZcAcks::Keepalive => 0,
            ZcAcks::One(_) => 1,
            ZcAcks::Range(a, b) if a <= b => (b - a).saturating_add(1),
            ZcAcks::Range(..) => 0,
            ZcAcks::Pair(..) => 2,
        }
    }

    /// Whether cookie `c` is acknowledged.
    pub fn contains(&self, c: u64) -> bool {
        match *self {
            ZcAcks::None | ZcAcks::Keepalive => false,
            ZcAcks::One(x) => c == x,
            ZcAcks::Range(a, b) => a <= c && c <= b,
            ZcAcks::Pair(a, b) => c == a || c == b,
        }
    }

    /// The NOOP header that carries this set (`None` carries nothing).
    pub fn to_noop(&self) -> Option<KsockHdr> {
        let (a, b) = match *self {
            ZcAcks::None => return None,
            ZcAcks::Keepalive => (0, ZC_KEEPALIVE),
            ZcAcks::One(c) => (0, c),
            ZcAcks::Range(a, b) | ZcAcks::Pair(a, b) => (a, b),
        };
        Some(KsockHdr {
            kind: KsockType::Noop,
            csum: 0,
            zc_req: a,
            zc_ack: b,
        })
    }
}

/// Encodes the cookies to acknowledge into as few NOOP headers as possible: each run of
/// consecutive cookies is one range, the remaining single cookies go two to a pair, a last odd
/// one alone. Drains `cookies`; duplicates count once, and 0 and 1 (never request cookies: 0 is
/// "none", 1 a keepalive) are dropped.
pub fn zc_ack_noops(cookies: &mut Vec<u64>) -> Vec<KsockHdr> {
    cookies.sort_unstable();
    cookies.dedup();
    cookies.retain(|&c| c > ZC_KEEPALIVE);
    let mut sets = Vec::new();
    let mut singles = Vec::new();
    let mut i = 0;
    while let Some(&start) = cookies.get(i) {
        let mut end = start;
        let mut j = i + 1;
        while cookies
            .get(j)
            .is_some_and(|&c| Some(c) == end.checked_add(1))
        {
            end += 1;
            j += 1;
        }
        if end > start {
            sets.push(ZcAcks::Range(start, end));
        } else {
            singles.push(start);
        }
        i = j;
    }
    for p in singles.chunks(2) {
        match *p {
            [lo, hi] => sets.push(ZcAcks::Pair(hi, lo)),
            [c] => sets.push(ZcAcks::One(c)),
            _ => {}
        }
    }
    cookies.clear();
    sets.iter().filter_map(ZcAcks::to_noop).collect()
}

// ---------------------------------------------------------------------------------------------
// Checksum
// ---------------------------------------------------------------------------------------------

/// The socklnd message checksum (reference 5.4; `socklnd_lib.c`): Linux `crc32_le` (reflected,
/// polynomial 0xedb88320) seeded 0xffffffff with no final inversion, i.e. zlib's CRC-32 xor
/// 0xffffffff. Incremental.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct KsockCsum(u32);

impl Default for KsockCsum {
    fn default() -> Self {
        KsockCsum::new()
    }
}

impl KsockCsum {
    /// The seed.
    pub fn new() -> Self {
        KsockCsum(!0)
    }

    /// Adds `b`.
    pub fn update(&mut self, b: &[u8]) {
        self.0 = super::pcap::crc32_update(self.0, b);
    }

    /// The checksum of everything added so far.
    pub fn value(&self) -> u32 {
        self.0
    }
}

fn check(b: &[u8], need: usize) -> Result<(), SockError> {
    super::need(b, need, |need, got| SockError::Short { need, got })
}

#[cfg(test)]
mod tests;
