//! Wire formats of lnet_selftest's RPC protocol ("srpc"), byte-exact with Lustre's
//! `lnet/selftest/rpc.h`, `selftest.h` and `include/uapi/linux/lnet/lnetst.h`.
//!
//! # How the protocol travels
//!
//! Every selftest RPC is one fixed-size message, `struct srpc_msg`: a 24-byte header and a
//! union of bodies, packed, 160 bytes in all (module.c asserts the size at build time). The
//! sender always sends the whole 160 bytes, whatever the body, and a Lustre server drops a
//! request whose LNet `mlength` is anything else (srpc_lnet_ev_handler), so [`SrpcMsg::parse`]
//! wants at least [`SRPC_MSG_LEN`] bytes and [`SrpcMsg::emit`] always writes exactly that many,
//! zero-filling what the body does not use.
//!
//! - A **request** is an LNet PUT to the server's portal: [`SRPC_FRAMEWORK_REQUEST_PORTAL`] (51)
//!   for the framework services (session, batch, test, stat, join, debug: ids below
//!   [`SRPC_FRAMEWORK_SERVICE_MAX_ID`]), [`SRPC_REQUEST_PORTAL`] (50) for the test services (brw,
//!   ping); the match bits are the service id (srpc_serv_portal and the service's posted
//!   buffers in rpc.c).
//! - Every request body starts with `rpyid`: the match bits of a buffer the client posted on
//!   [`SRPC_RDMA_PORTAL`] (52) for the **reply**, which the server PUTs there. Requests that move
//!   bulk data (test, brw) carry `bulkid` next: the match bits of the client's bulk buffer, also
//!   on portal 52, which the server GETs (the client is the source) or PUTs into (the client is
//!   the sink) before it replies (srpc_prepare_bulk, srpc_do_bulk).
//! - Every reply body starts with a `status`, a **positive** errno (`EPROTO`, `EBUSY`, ...), 0 on
//!   success; framework replies carry the server's session id next.
//!
//! # Byte order
//!
//! Like o2iblnd, selftest sends in the sender's native order, and the receiver swaps when it sees
//! [`SRPC_MSG_MAGIC`] byte-swapped (srpc_unpack_msg_hdr, sfw_unpack_message). We detect the order
//! from the magic, return it with the parsed message, and emit either order. Where Lustre's
//! swapping routines forget a field (the status of a debug reply, `bar_active` and `bar_time` of
//! a batch reply are never swapped by sfw_unpack_message) we still swap it: we read what the
//! sender meant; a kernel receiver of the other order would misread those fields either way.
//!
//! # Session features and the two bulk layouts
//!
//! The header's `msg_ses_feats` carries the session's feature bits. The only one defined,
//! [`LST_FEAT_BULK_LEN`], switches the brw parameters of a test request from the v0 layout
//! (a page count: assumes both ends have the same page size) to v1 (a byte length and an offset),
//! and changes how long the destination-list bulk is (see [`dest_ids_len`]). Servers reply EPROTO
//! to feature bits they do not know rather than dropping the message, so [`SrpcMsg::parse`]
//! accepts any bits and hands them up.
//!
//! # Style
//!
//! As in `lnd::wire`: parsing checks the length and magic first and then every read is in bounds
//! by construction; the readers below also return zero rather than panic out of range. Values
//! the receiver answers with an error status (an unknown brw opcode, check flag, batch opcode,
//! test service) are kept raw with typed accessors, so a service can answer them as Lustre
//! does instead of losing the request.

use core::fmt;

use lnd::wire::{ByteOrder, Nid};

/// Bytes of `struct srpc_msg`: the header and the largest body (the stat reply).
pub const SRPC_MSG_LEN: usize = 160;
/// Bytes of the srpc header before the body union.
pub const SRPC_HDR_LEN: usize = 24;
/// Bytes of the body union (`msg_body`).
pub const SRPC_BODY_LEN: usize = SRPC_MSG_LEN - SRPC_HDR_LEN;

/// `msg_magic` of every srpc message (SRPC_MSG_MAGIC in rpc.h).
pub const SRPC_MSG_MAGIC: u32 = 0xeeb0_f00d;
/// The only srpc version (SRPC_MSG_VERSION); Lustre answers any other with EPROTO.
pub const SRPC_MSG_VERSION: u32 = 1;

/// Portal of test-service requests (brw, ping): SRPC_REQUEST_PORTAL in selftest.h.
pub const SRPC_REQUEST_PORTAL: u32 = 50;
/// Portal of framework-service requests, a lazy portal: SRPC_FRAMEWORK_REQUEST_PORTAL.
pub const SRPC_FRAMEWORK_REQUEST_PORTAL: u32 = 51;
/// Portal of every reply and bulk transfer, matched by `rpyid`/`bulkid`: SRPC_RDMA_PORTAL.
pub const SRPC_RDMA_PORTAL: u32 = 52;

/// Service ids below this one are framework services (SRPC_FRAMEWORK_SERVICE_MAX_ID).
pub const SRPC_FRAMEWORK_SERVICE_MAX_ID: u32 = 10;
/// One past the highest service id (SRPC_SERVICE_MAX_ID).
pub const SRPC_SERVICE_MAX_ID: u32 = 13;

/// Length of the fixed name buffers (session and group names): LST_NAME_SIZE, NUL included.
pub const LST_NAME_SIZE: usize = 32;

/// No session features (LST_FEAT_NONE).
pub const LST_FEAT_NONE: u32 = 0;
/// Session feature: brw tests carry a byte length and offset (v1 parameters) instead of a page
/// count (LST_FEAT_BULK_LEN, "variable page size").
pub const LST_FEAT_BULK_LEN: u32 = 1 << 0;
/// Every feature this implementation (and current Lustre) knows: LST_FEATS_MASK.
pub const LST_FEATS_MASK: u32 = LST_FEAT_BULK_LEN;

/// Highest concurrency of a test (LST_MAX_CONCUR, SFW_MAX_CONCUR).
pub const LST_MAX_CONCUR: u32 = 1024;
/// Largest LNet message, so largest brw transfer (LNET_MTU, 1 MiB).
pub const LNET_MTU: u32 = lnd::wire::lnet::LNET_MTU;
/// Most pages (iovecs) one LNet memory descriptor, so one selftest bulk, may have (LNET_MAX_IOV).
pub const LNET_MAX_IOV: usize = 256;
/// The page size every x86-64 Lustre node uses; v0 brw parameters and the destination list
/// depend on it (see [`dest_ids_len`]).
pub const PAGE_SIZE_4K: usize = 4096;
/// Most pages of a brw bulk with 4 KiB pages: LNET_MTU / 4096.
pub const BRW_MAX_PAGES_4K: usize = (LNET_MTU as usize) / PAGE_SIZE_4K;

/// `pnr_magic` of ping test requests and replies (LST_PING_TEST_MAGIC in ping_test.c).
pub const LST_PING_TEST_MAGIC: u32 = 0xbabe_face;
/// The word brw data patterns are made of (BRW_MAGIC in brw_test.c).
pub const BRW_MAGIC: u64 = 0xeeb0_eeb1_eeb2_eeb3;
/// The word a brw sink buffer is poisoned with before data arrives (BRW_POISON).
pub const BRW_POISON: u64 = 0xbeef_beef_beef_beef;
/// Size of one pattern word (BRW_MSIZE); pattern offsets and lengths are multiples of it.
pub const BRW_MSIZE: usize = 8;

/// Batch request opcode: start the batch (SRPC_BATCH_OPC_RUN).
pub const SRPC_BATCH_OPC_RUN: u32 = 1;
/// Batch request opcode: stop the batch; `arg` says whether to force (SRPC_BATCH_OPC_STOP).
pub const SRPC_BATCH_OPC_STOP: u32 = 2;
/// Batch request opcode: query a batch (`testidx` 0) or one of its tests (SRPC_BATCH_OPC_QUERY).
pub const SRPC_BATCH_OPC_QUERY: u32 = 3;

/// Bytes of one destination entry in a test request's bulk (`struct lnet_process_id_packed`:
/// a 64-bit NID and a 32-bit PID, packed).
pub const PROCESS_ID_LEN: usize = 12;

/// Destination entries per page of the destination-list bulk (SFW_ID_PER_PAGE): the trailing
/// `page_size % 12` bytes of every page are unused. 341 for 4 KiB pages.
pub const fn ids_per_page(page_size: usize) -> usize {
    page_size / PROCESS_ID_LEN
}

/// Most destinations one test request can name (SFW_MAX_NDESTS: LNET_MAX_IOV pages of ids),
/// for 4 KiB pages.
pub const SFW_MAX_NDESTS_4K: usize = LNET_MAX_IOV * ids_per_page(PAGE_SIZE_4K);

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Why selftest bytes (or a buffer handed to an emitter) were refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SelftestWireError {
    /// Fewer bytes than the format needs (an srpc message is always 160 bytes).
    Truncated { needed: usize, got: usize },
    /// `msg_magic` is neither [`SRPC_MSG_MAGIC`] nor its byte swap.
    BadMagic(u32),
    /// A version other than [`SRPC_MSG_VERSION`]; see [`SrpcHeader`] to answer it with EPROTO.
    BadVersion(u32),
    /// A `msg_type` outside 0..=17.
    UnknownMsgType(u32),
    /// A well-formed message of another type than the one asked for.
    WrongMsgType { expected: MsgType, got: MsgType },
    /// Emitting a test request whose brw parameter layout (v0 or v1) disagrees with the
    /// [`LST_FEAT_BULK_LEN`] bit of the features it is sent with: the receiver would read the
    /// other layout.
    BulkLayoutMismatch { features: u32 },
    /// Emitting [`TestParams::Other`] with the brw or ping service id, which the receiver would
    /// parse as [`TestParams::BulkV0`]/[`TestParams::BulkV1`] or [`TestParams::Ping`].
    BadTestService(u32),
    /// The caller's buffer cannot hold what is being emitted.
    BufferTooSmall { needed: usize, got: usize },
    /// A page size or in-page offset that is not a positive multiple of 8 (offset below the page
    /// size), or a bulk length that is not a multiple of 8: brw_fill_page asserts all of these.
    Misaligned {
        page_size: usize,
        offset: usize,
        len: usize,
    },
    /// Bulk data does not carry the expected pattern: the 8-byte word at byte `at` of the bulk.
    BadBulkData {
        at: usize,
        found: u64,
        expected: u64,
    },
}

impl fmt::Display for SelftestWireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SelftestWireError::Truncated { needed, got } => {
                write!(f, "truncated: need {needed} bytes, got {got}")
            }
            SelftestWireError::BadMagic(m) => write!(f, "bad srpc magic {m:#010x}"),
            SelftestWireError::BadVersion(v) => write!(f, "unsupported srpc version {v}"),
            SelftestWireError::UnknownMsgType(t) => write!(f, "unknown srpc message type {t}"),
            SelftestWireError::WrongMsgType { expected, got } => {
                write!(f, "expected an srpc {expected:?}, got {got:?}")
            }
            SelftestWireError::BulkLayoutMismatch { features } => write!(
                f,
                "brw test parameters do not match session features {features:#x}"
            ),
            SelftestWireError::BadTestService(s) => {
                write!(f, "service {s} needs typed test parameters")
            }
            SelftestWireError::BufferTooSmall { needed, got } => {
                write!(
                    f,
                    "output buffer too small: need {needed} bytes, have {got}"
                )
            }
            SelftestWireError::Misaligned {
                page_size,
                offset,
                len,
            } => write!(
                f,
                "bulk of {len} bytes at page offset {offset} (page size {page_size}) is not \
                 8-byte aligned"
            ),
            SelftestWireError::BadBulkData {
                at,
                found,
                expected,
            } => write!(
                f,
                "bad bulk data at byte {at}: {found:#018x}, expected {expected:#018x}"
            ),
        }
    }
}

impl std::error::Error for SelftestWireError {}

fn check_len(b: &[u8], needed: usize) -> Result<(), SelftestWireError> {
    if b.len() < needed {
        Err(SelftestWireError::Truncated {
            needed,
            got: b.len(),
        })
    } else {
        Ok(())
    }
}

fn check_room(b: &[u8], needed: usize) -> Result<(), SelftestWireError> {
    if b.len() < needed {
        Err(SelftestWireError::BufferTooSmall {
            needed,
            got: b.len(),
        })
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Panic-free field access: integers through lnd's `ByteOrder`, byte arrays here
// ---------------------------------------------------------------------------------------------

fn take<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = b.get(at..at.saturating_add(N)) {
        a.copy_from_slice(s);
    }
    a
}

fn put<const N: usize>(b: &mut [u8], at: usize, a: [u8; N]) {
    if let Some(s) = b.get_mut(at..at.saturating_add(N)) {
        s.copy_from_slice(&a);
    }
}

/// Reads fields of one message body in one byte order; offsets are relative to the body.
struct Reader<'a> {
    b: &'a [u8],
    order: ByteOrder,
}

impl Reader<'_> {
    fn u8(&self, at: usize) -> u8 {
        take::<1>(self.b, SRPC_HDR_LEN + at)[0]
    }
    fn u16(&self, at: usize) -> u16 {
        self.order.get_u16(self.b, SRPC_HDR_LEN + at)
    }
    fn u32(&self, at: usize) -> u32 {
        self.order.get_u32(self.b, SRPC_HDR_LEN + at)
    }
    fn u64(&self, at: usize) -> u64 {
        self.order.get_u64(self.b, SRPC_HDR_LEN + at)
    }
    fn sid(&self, at: usize) -> LstSid {
        LstSid {
            nid: Nid::from_raw(self.u64(at)),
            stamp: self.u64(at + 8) as i64,
        }
    }
    fn name(&self, at: usize) -> LstName {
        LstName(take(self.b, SRPC_HDR_LEN + at))
    }
}

/// Writes fields of one message body in one byte order; offsets are relative to the body.
struct Writer<'a> {
    b: &'a mut [u8],
    order: ByteOrder,
}

impl Writer<'_> {
    fn u8(&mut self, at: usize, v: u8) {
        put(self.b, SRPC_HDR_LEN + at, [v]);
    }
    fn u16(&mut self, at: usize, v: u16) {
        self.order.put_u16(self.b, SRPC_HDR_LEN + at, v);
    }
    fn u32(&mut self, at: usize, v: u32) {
        self.order.put_u32(self.b, SRPC_HDR_LEN + at, v);
    }
    fn u64(&mut self, at: usize, v: u64) {
        self.order.put_u64(self.b, SRPC_HDR_LEN + at, v);
    }
    fn sid(&mut self, at: usize, sid: LstSid) {
        self.u64(at, sid.nid.raw());
        self.u64(at + 8, sid.stamp as u64);
    }
    fn name(&mut self, at: usize, name: &LstName) {
        put(self.b, SRPC_HDR_LEN + at, name.0);
    }
}

// ---------------------------------------------------------------------------------------------
// Enumerations
// ---------------------------------------------------------------------------------------------

/// Selftest services (`enum srpc_service_type` in rpc.h). The request of a service is sent with
/// the service id as LNet match bits to [`ServiceId::portal`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ServiceId {
    /// Query a node's session (the `lst` "debug" and node-status queries).
    Debug = 0,
    /// Create (or force-steal) a node's session.
    MakeSession = 1,
    /// End a node's session.
    RemoveSession = 2,
    /// Run, stop or query a batch.
    Batch = 3,
    /// Add a test to a batch.
    Test = 4,
    /// Read a node's counters.
    QueryStat = 5,
    /// Join a console's session (group membership from the node side).
    Join = 6,
    /// Bulk read/write test.
    Brw = 11,
    /// Ping test.
    Ping = 12,
}

impl ServiceId {
    /// Every service, framework services first.
    pub const ALL: [ServiceId; 9] = [
        ServiceId::Debug,
        ServiceId::MakeSession,
        ServiceId::RemoveSession,
        ServiceId::Batch,
        ServiceId::Test,
        ServiceId::QueryStat,
        ServiceId::Join,
        ServiceId::Brw,
        ServiceId::Ping,
    ];

    /// The service with id `v`, if any.
    pub fn from_u32(v: u32) -> Option<ServiceId> {
        ServiceId::ALL.into_iter().find(|s| *s as u32 == v)
    }

    /// A framework service (session, batch, test, stat, join, debug), as opposed to a test
    /// service (brw, ping).
    pub fn is_framework(self) -> bool {
        (self as u32) < SRPC_FRAMEWORK_SERVICE_MAX_ID
    }

    /// The portal its requests go to (srpc_serv_portal).
    pub fn portal(self) -> u32 {
        if self.is_framework() {
            SRPC_FRAMEWORK_REQUEST_PORTAL
        } else {
            SRPC_REQUEST_PORTAL
        }
    }

    /// Its request message type (srpc_service2request).
    pub fn request_type(self) -> MsgType {
        match self {
            ServiceId::Debug => MsgType::DebugRequest,
            ServiceId::MakeSession => MsgType::MakeSessionRequest,
            ServiceId::RemoveSession => MsgType::RemoveSessionRequest,
            ServiceId::Batch => MsgType::BatchRequest,
            ServiceId::Test => MsgType::TestRequest,
            ServiceId::QueryStat => MsgType::StatRequest,
            ServiceId::Join => MsgType::JoinRequest,
            ServiceId::Brw => MsgType::BrwRequest,
            ServiceId::Ping => MsgType::PingRequest,
        }
    }

    /// Its reply message type (srpc_service2reply: always the request type plus one).
    pub fn reply_type(self) -> MsgType {
        self.request_type().reply()
    }
}

/// `msg_type` values (`enum srpc_msg_type`): requests are even, each reply is its request + 1.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum MsgType {
    MakeSessionRequest = 0,
    MakeSessionReply = 1,
    RemoveSessionRequest = 2,
    RemoveSessionReply = 3,
    BatchRequest = 4,
    BatchReply = 5,
    StatRequest = 6,
    StatReply = 7,
    TestRequest = 8,
    TestReply = 9,
    DebugRequest = 10,
    DebugReply = 11,
    BrwRequest = 12,
    BrwReply = 13,
    PingRequest = 14,
    PingReply = 15,
    JoinRequest = 16,
    JoinReply = 17,
}

impl MsgType {
    /// Every message type, in wire order.
    pub const ALL: [MsgType; 18] = [
        MsgType::MakeSessionRequest,
        MsgType::MakeSessionReply,
        MsgType::RemoveSessionRequest,
        MsgType::RemoveSessionReply,
        MsgType::BatchRequest,
        MsgType::BatchReply,
        MsgType::StatRequest,
        MsgType::StatReply,
        MsgType::TestRequest,
        MsgType::TestReply,
        MsgType::DebugRequest,
        MsgType::DebugReply,
        MsgType::BrwRequest,
        MsgType::BrwReply,
        MsgType::PingRequest,
        MsgType::PingReply,
        MsgType::JoinRequest,
        MsgType::JoinReply,
    ];

    /// The type with wire code `v`, if any.
    pub fn from_u32(v: u32) -> Option<MsgType> {
        MsgType::ALL.get(usize::try_from(v).ok()?).copied()
    }

    /// Whether this is a reply (odd code).
    pub fn is_reply(self) -> bool {
        (self as u32) & 1 == 1
    }

    /// The reply type of a request; a reply is its own.
    pub fn reply(self) -> MsgType {
        MsgType::from_u32(self as u32 | 1).unwrap_or(self)
    }

    /// The service this message belongs to.
    pub fn service(self) -> ServiceId {
        match self as u32 / 2 {
            0 => ServiceId::MakeSession,
            1 => ServiceId::RemoveSession,
            2 => ServiceId::Batch,
            3 => ServiceId::QueryStat,
            4 => ServiceId::Test,
            5 => ServiceId::Debug,
            6 => ServiceId::Brw,
            7 => ServiceId::Ping,
            _ => ServiceId::Join,
        }
    }
}

/// Test types of the console's add-test call (`enum lst_test_type` in lnetst.h). They do not
/// travel in srpc messages themselves: the console turns them into a [`ServiceId`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum TestType {
    /// Bulk read/write: service [`ServiceId::Brw`].
    Bulk = 1,
    /// Ping: service [`ServiceId::Ping`].
    Ping = 2,
}

impl TestType {
    /// The test type with code `v`, if any.
    pub fn from_u32(v: u32) -> Option<TestType> {
        match v {
            1 => Some(TestType::Bulk),
            2 => Some(TestType::Ping),
            _ => None,
        }
    }

    /// The service that runs it.
    pub fn service(self) -> ServiceId {
        match self {
            TestType::Bulk => ServiceId::Brw,
            TestType::Ping => ServiceId::Ping,
        }
    }
}

/// Direction of a brw test (`enum lst_brw_type`), as seen from the client.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BrwOp {
    /// The server PUTs the data into the client's sink.
    Read = 1,
    /// The server GETs the data from the client's source.
    Write = 2,
}

impl BrwOp {
    /// The opcode with code `v`, if any.
    pub fn from_u32(v: u32) -> Option<BrwOp> {
        match v {
            1 => Some(BrwOp::Read),
            2 => Some(BrwOp::Write),
            _ => None,
        }
    }
}

/// How brw data is checked (`enum lst_brw_flags`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BrwCheck {
    /// No pattern written, none checked.
    None = 1,
    /// First and last 8-byte word of each page segment (see [`fill_pattern`]).
    Simple = 2,
    /// Every 8-byte word.
    Full = 3,
    /// Like `None`, and the receiver may discard the data without copying it (LNET_MD_DISCARD).
    Discard = 4,
}

impl BrwCheck {
    /// The check with code `v`, if any.
    pub fn from_u32(v: u32) -> Option<BrwCheck> {
        match v {
            1 => Some(BrwCheck::None),
            2 => Some(BrwCheck::Simple),
            3 => Some(BrwCheck::Full),
            4 => Some(BrwCheck::Discard),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------------

/// A session id (`struct lst_sid` in lnetst.h, 16 bytes): the console's NID and the time the
/// session was made, in milliseconds.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LstSid {
    /// `ses_nid`: the NID of the console node (64-bit form).
    pub nid: Nid,
    /// `ses_stamp`: a signed 64-bit time stamp in milliseconds.
    pub stamp: i64,
}

impl LstSid {
    /// What a node with no session answers with: LNET_NID_ANY and stamp -1 (get_old_sid in
    /// framework.c).
    pub const NONE: LstSid = LstSid {
        nid: Nid::ANY,
        stamp: -1,
    };
}

/// A batch id (`struct lst_bid`, 8 bytes): unique within its session.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct LstBid(pub u64);

/// A 32-byte name buffer (session or group name, LST_NAME_SIZE). Lustre fills it with strscpy,
/// so it is NUL-terminated and zero-padded; the raw bytes are kept as received.
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct LstName(pub [u8; LST_NAME_SIZE]);

impl LstName {
    /// The empty name.
    pub const EMPTY: LstName = LstName([0; LST_NAME_SIZE]);

    /// A name of at most 31 bytes without NUL, zero-padded; `None` if it does not fit.
    pub fn new(name: &str) -> Option<LstName> {
        let s = name.as_bytes();
        if s.len() >= LST_NAME_SIZE || s.contains(&0) {
            return None;
        }
        let mut a = [0u8; LST_NAME_SIZE];
        a.get_mut(..s.len())?.copy_from_slice(s);
        Some(LstName(a))
    }

    /// The bytes before the first NUL (all 32 if a peer sent none).
    pub fn as_bytes(&self) -> &[u8] {
        let end = self.0.iter().position(|&c| c == 0).unwrap_or(LST_NAME_SIZE);
        self.0.get(..end).unwrap_or(&[])
    }

    /// The name as text, invalid UTF-8 replaced.
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }
}

impl fmt::Debug for LstName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string_lossy())
    }
}

/// Framework counters of a node (`struct sfw_counters` in lnetst.h, packed, 20 bytes).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct SfwCounters {
    /// Milliseconds since the current session started.
    pub running_ms: u32,
    /// Batches currently running.
    pub active_batches: u32,
    /// Ended sessions still being torn down.
    pub zombie_sessions: u32,
    /// Failed brw RPCs (transport, status or data check).
    pub brw_errors: u32,
    /// Failed ping RPCs.
    pub ping_errors: u32,
}

/// Selftest RPC counters of a node (`struct srpc_counters` in lnetst.h, packed, 36 bytes).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct SrpcCounters {
    /// RPCs that failed.
    pub errors: u32,
    /// RPCs this node sent as a client.
    pub rpcs_sent: u32,
    /// Requests this node received as a server.
    pub rpcs_rcvd: u32,
    /// Requests dropped (malformed, no buffer).
    pub rpcs_dropped: u32,
    /// Client RPCs that timed out.
    pub rpcs_expired: u32,
    /// Bulk bytes moved by GET.
    pub bulk_get: u64,
    /// Bulk bytes moved by PUT.
    pub bulk_put: u64,
}

/// A node's whole-LNet counters (`struct lnet_counters_common` in lnet-idl.h, packed,
/// 60 bytes, offsets asserted in api-ni.c lnet_assert_wire_constants). `lst stat` derives its
/// rates and bandwidths from the send/recv counts and lengths.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct LnetCounters {
    /// Messages allocated now.
    pub msgs_alloc: u32,
    /// Highest `msgs_alloc` seen.
    pub msgs_max: u32,
    /// Errors.
    pub errors: u32,
    /// Messages sent.
    pub send_count: u32,
    /// Messages received.
    pub recv_count: u32,
    /// Messages routed.
    pub route_count: u32,
    /// Messages dropped.
    pub drop_count: u32,
    /// Bytes sent.
    pub send_length: u64,
    /// Bytes received.
    pub recv_length: u64,
    /// Bytes routed.
    pub route_length: u64,
    /// Bytes dropped.
    pub drop_length: u64,
}

/// One destination of a test (`struct lnet_process_id_packed`, 12 bytes): see [`dest_ids_len`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProcessId {
    /// The destination NID (64-bit form: lnet_nid_to_nid4).
    pub nid: Nid,
    /// The destination PID (LNET_PID_LUSTRE for kernel nodes).
    pub pid: u32,
}

// ---------------------------------------------------------------------------------------------
// The header
// ---------------------------------------------------------------------------------------------

mod hdr {
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

fn detect_order(b: &[u8]) -> Result<ByteOrder, SelftestWireError> {
    ByteOrder::detect(b, hdr::MAGIC, SRPC_MSG_MAGIC)
        .ok_or_else(|| SelftestWireError::BadMagic(ByteOrder::Little.get_u32(b, hdr::MAGIC)))
}

// ---------------------------------------------------------------------------------------------
// Bodies
// ---------------------------------------------------------------------------------------------

/// One body layout of the `msg_body` union. Offsets are from the start of the body (byte 24 of
/// the message); all reads are in bounds once the message length is checked.
trait BodyLayout: Sized {
    const TYPE: MsgType;
    /// Bytes the body uses (the rest of the 136-byte union is zero on emit).
    const LEN: usize;
    fn read(r: &Reader<'_>, features: u32) -> Self;
    fn write(&self, w: &mut Writer<'_>);
}

/// Make-session request (`struct srpc_mksn_reqst`, 60 bytes), console to node on portal 51:
///
/// | offset | field       | size |
/// |--------|-------------|------|
/// | 0      | mksn_rpyid  | 8    |
/// | 8      | mksn_sid    | 16   |
/// | 24     | mksn_force  | 4    |
/// | 28     | mksn_name   | 32   |
///
/// The session's features travel in the header, and a node answers EPROTO to bits it does not
/// know (sfw_make_session).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct MakeSessionRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// The new session's id.
    pub sid: LstSid,
    /// Non-zero: take the node even if another session holds it.
    pub force: u32,
    /// Session name.
    pub name: LstName,
}

impl BodyLayout for MakeSessionRequest {
    const TYPE: MsgType = MsgType::MakeSessionRequest;
    const LEN: usize = 60;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        MakeSessionRequest {
            rpyid: r.u64(0),
            sid: r.sid(8),
            force: r.u32(24),
            name: r.name(28),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(0, self.rpyid);
        w.sid(8, self.sid);
        w.u32(24, self.force);
        w.name(28, &self.name);
    }
}

/// Make-session reply (`struct srpc_mksn_reply`, 56 bytes):
///
/// | offset | field        | size |
/// |--------|--------------|------|
/// | 0      | mksn_status  | 4    |
/// | 4      | mksn_sid     | 16   |
/// | 20     | mksn_timeout | 4    |
/// | 24     | mksn_name    | 32   |
///
/// On EBUSY the sid and name are those of the session that holds the node.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct MakeSessionReply {
    /// Positive errno, 0 on success.
    pub status: u32,
    /// The node's session id after the call.
    pub sid: LstSid,
    /// Seconds of console silence after which the node ends the session.
    pub timeout: u32,
    /// Name of the node's current session (filled on EBUSY).
    pub name: LstName,
}

impl BodyLayout for MakeSessionReply {
    const TYPE: MsgType = MsgType::MakeSessionReply;
    const LEN: usize = 56;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        MakeSessionReply {
            status: r.u32(0),
            sid: r.sid(4),
            timeout: r.u32(20),
            name: r.name(24),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(0, self.status);
        w.sid(4, self.sid);
        w.u32(20, self.timeout);
        w.name(24, &self.name);
    }
}

/// Remove-session request (`struct srpc_rmsn_reqst`, 24 bytes): `rmsn_rpyid` at 0, `rmsn_sid`
/// at 8.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoveSessionRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// The session to end.
    pub sid: LstSid,
}

impl BodyLayout for RemoveSessionRequest {
    const TYPE: MsgType = MsgType::RemoveSessionRequest;
    const LEN: usize = 24;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        RemoveSessionRequest {
            rpyid: r.u64(0),
            sid: r.sid(8),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(0, self.rpyid);
        w.sid(8, self.sid);
    }
}

/// Remove-session reply (`struct srpc_rmsn_reply`, 20 bytes): `rmsn_status` at 0, `rmsn_sid`
/// at 4.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoveSessionReply {
    /// Positive errno, 0 on success.
    pub status: u32,
    /// The node's session id.
    pub sid: LstSid,
}

impl BodyLayout for RemoveSessionReply {
    const TYPE: MsgType = MsgType::RemoveSessionReply;
    const LEN: usize = 20;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        RemoveSessionReply {
            status: r.u32(0),
            sid: r.sid(4),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(0, self.status);
        w.sid(4, self.sid);
    }
}

/// Join request (`struct srpc_join_reqst`, 56 bytes): `join_rpyid` at 0, `join_sid` at 8,
/// `join_group` (32-byte name) at 24.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct JoinRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// The session to join.
    pub sid: LstSid,
    /// The group to join.
    pub group: LstName,
}

impl BodyLayout for JoinRequest {
    const TYPE: MsgType = MsgType::JoinRequest;
    const LEN: usize = 56;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        JoinRequest {
            rpyid: r.u64(0),
            sid: r.sid(8),
            group: r.name(24),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(0, self.rpyid);
        w.sid(8, self.sid);
        w.name(24, &self.group);
    }
}

/// Join reply (`struct srpc_join_reply`, 56 bytes): `join_status` at 0, `join_sid` at 4,
/// `join_timeout` at 20, `join_session` (32-byte name) at 24.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct JoinReply {
    /// Positive errno, 0 on success.
    pub status: u32,
    /// The session's id.
    pub sid: LstSid,
    /// Seconds of inactivity before the session expires.
    pub timeout: u32,
    /// The session's name.
    pub session: LstName,
}

impl BodyLayout for JoinReply {
    const TYPE: MsgType = MsgType::JoinReply;
    const LEN: usize = 56;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        JoinReply {
            status: r.u32(0),
            sid: r.sid(4),
            timeout: r.u32(20),
            session: r.name(24),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(0, self.status);
        w.sid(4, self.sid);
        w.u32(20, self.timeout);
        w.name(24, &self.session);
    }
}

/// Debug (session query) request (`struct srpc_debug_reqst`, 28 bytes): `dbg_rpyid` at 0,
/// `dbg_sid` at 8, `dbg_flags` at 24 (the console sends 0).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct DebugRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// The console's session id.
    pub sid: LstSid,
    /// Debug flags bitmap (unused: 0).
    pub flags: u32,
}

impl BodyLayout for DebugRequest {
    const TYPE: MsgType = MsgType::DebugRequest;
    const LEN: usize = 28;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        DebugRequest {
            rpyid: r.u64(0),
            sid: r.sid(8),
            flags: r.u32(24),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(0, self.rpyid);
        w.sid(8, self.sid);
        w.u32(24, self.flags);
    }
}

/// Debug reply (`struct srpc_debug_reply`, 60 bytes): `dbg_status` at 0, `dbg_sid` at 4,
/// `dbg_timeout` at 20, `dbg_nbatch` at 24, `dbg_name` (32-byte name) at 28.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct DebugReply {
    /// Positive errno, 0 on success (Lustre forgets to byte-swap this one; we do not).
    pub status: u32,
    /// The node's session id ([`LstSid::NONE`] if none).
    pub sid: LstSid,
    /// The session's timeout in seconds.
    pub timeout: u32,
    /// Number of batches on the node.
    pub nbatch: u32,
    /// The session's name.
    pub name: LstName,
}

impl BodyLayout for DebugReply {
    const TYPE: MsgType = MsgType::DebugReply;
    const LEN: usize = 60;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        DebugReply {
            status: r.u32(0),
            sid: r.sid(4),
            timeout: r.u32(20),
            nbatch: r.u32(24),
            name: r.name(28),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(0, self.status);
        w.sid(4, self.sid);
        w.u32(20, self.timeout);
        w.u32(24, self.nbatch);
        w.name(28, &self.name);
    }
}

/// Batch request (`struct srpc_batch_reqst`, 44 bytes):
///
/// | offset | field       | size |
/// |--------|-------------|------|
/// | 0      | bar_rpyid   | 8    |
/// | 8      | bar_sid     | 16   |
/// | 24     | bar_bid     | 8    |
/// | 32     | bar_opc     | 4    |
/// | 36     | bar_testidx | 4    |
/// | 40     | bar_arg     | 4    |
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BatchRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// The console's session id.
    pub sid: LstSid,
    /// The batch.
    pub bid: LstBid,
    /// `SRPC_BATCH_OPC_RUN`, `_STOP` or `_QUERY`, raw (a node answers others with EINVAL).
    pub opc: u32,
    /// For a query: 0 for the whole batch, else the 1-based index of one test.
    pub testidx: u32,
    /// For run: seconds to run (0: until done); for stop: non-zero to force.
    pub arg: u32,
}

impl BodyLayout for BatchRequest {
    const TYPE: MsgType = MsgType::BatchRequest;
    const LEN: usize = 44;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        BatchRequest {
            rpyid: r.u64(0),
            sid: r.sid(8),
            bid: LstBid(r.u64(24)),
            opc: r.u32(32),
            testidx: r.u32(36),
            arg: r.u32(40),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(0, self.rpyid);
        w.sid(8, self.sid);
        w.u64(24, self.bid.0);
        w.u32(32, self.opc);
        w.u32(36, self.testidx);
        w.u32(40, self.arg);
    }
}

/// Batch reply (`struct srpc_batch_reply`, 28 bytes): `bar_status` at 0, `bar_sid` at 4,
/// `bar_active` at 20, `bar_time` at 24 (Lustre byte-swaps neither of the last two).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BatchReply {
    /// Positive errno, 0 on success.
    pub status: u32,
    /// The node's session id.
    pub sid: LstSid,
    /// Active tests in the batch (or in the queried test).
    pub active: u32,
    /// Remaining run time (unused by current Lustre: 0).
    pub time: u32,
}

impl BodyLayout for BatchReply {
    const TYPE: MsgType = MsgType::BatchReply;
    const LEN: usize = 28;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        BatchReply {
            status: r.u32(0),
            sid: r.sid(4),
            active: r.u32(20),
            time: r.u32(24),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(0, self.status);
        w.sid(4, self.sid);
        w.u32(20, self.active);
        w.u32(24, self.time);
    }
}

/// Stat request (`struct srpc_stat_reqst`, 28 bytes): `str_rpyid` at 0, `str_sid` at 8,
/// `str_type` at 24 (the console sends 0 and nodes ignore it).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct StatRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// The console's session id.
    pub sid: LstSid,
    /// Kind of statistics (unused: 0).
    pub stat_type: u32,
}

impl BodyLayout for StatRequest {
    const TYPE: MsgType = MsgType::StatRequest;
    const LEN: usize = 28;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        StatRequest {
            rpyid: r.u64(0),
            sid: r.sid(8),
            stat_type: r.u32(24),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(0, self.rpyid);
        w.sid(8, self.sid);
        w.u32(24, self.stat_type);
    }
}

/// Stat reply (`struct srpc_stat_reply`, 136 bytes, the largest body):
///
/// | offset | field                          | size |
/// |--------|--------------------------------|------|
/// | 0      | str_status                     | 4    |
/// | 4      | str_sid                        | 16   |
/// | 20     | str_fw (sfw_counters)          | 20   |
/// | 40     | str_rpc (srpc_counters)        | 36   |
/// | 76     | str_lnet (lnet_counters_common)| 60   |
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct StatReply {
    /// Positive errno, 0 on success.
    pub status: u32,
    /// The node's session id.
    pub sid: LstSid,
    /// Framework counters.
    pub fw: SfwCounters,
    /// RPC counters.
    pub rpc: SrpcCounters,
    /// Whole-node LNet counters.
    pub lnet: LnetCounters,
}

impl BodyLayout for StatReply {
    const TYPE: MsgType = MsgType::StatReply;
    const LEN: usize = 136;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        StatReply {
            status: r.u32(0),
            sid: r.sid(4),
            fw: SfwCounters {
                running_ms: r.u32(20),
                active_batches: r.u32(24),
                zombie_sessions: r.u32(28),
                brw_errors: r.u32(32),
                ping_errors: r.u32(36),
            },
            rpc: SrpcCounters {
                errors: r.u32(40),
                rpcs_sent: r.u32(44),
                rpcs_rcvd: r.u32(48),
                rpcs_dropped: r.u32(52),
                rpcs_expired: r.u32(56),
                bulk_get: r.u64(60),
                bulk_put: r.u64(68),
            },
            lnet: LnetCounters {
                msgs_alloc: r.u32(76),
                msgs_max: r.u32(80),
                errors: r.u32(84),
                send_count: r.u32(88),
                recv_count: r.u32(92),
                route_count: r.u32(96),
                drop_count: r.u32(100),
                send_length: r.u64(104),
                recv_length: r.u64(112),
                route_length: r.u64(120),
                drop_length: r.u64(128),
            },
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(0, self.status);
        w.sid(4, self.sid);
        let f = &self.fw;
        w.u32(20, f.running_ms);
        w.u32(24, f.active_batches);
        w.u32(28, f.zombie_sessions);
        w.u32(32, f.brw_errors);
        w.u32(36, f.ping_errors);
        let c = &self.rpc;
        w.u32(40, c.errors);
        w.u32(44, c.rpcs_sent);
        w.u32(48, c.rpcs_rcvd);
        w.u32(52, c.rpcs_dropped);
        w.u32(56, c.rpcs_expired);
        w.u64(60, c.bulk_get);
        w.u64(68, c.bulk_put);
        let l = &self.lnet;
        w.u32(76, l.msgs_alloc);
        w.u32(80, l.msgs_max);
        w.u32(84, l.errors);
        w.u32(88, l.send_count);
        w.u32(92, l.recv_count);
        w.u32(96, l.route_count);
        w.u32(100, l.drop_count);
        w.u64(104, l.send_length);
        w.u64(112, l.recv_length);
        w.u64(120, l.route_length);
        w.u64(128, l.drop_length);
    }
}

/// The per-service parameters of a test request (the 12-byte `tsr_u` union), chosen by the
/// request's `tsr_service` and, for brw, by the header's [`LST_FEAT_BULK_LEN`] bit
/// (sfw_unpack_addtest_req).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum TestParams {
    /// Ping test (`struct test_ping_req`, 8 bytes): `png_size` at 0, `png_flags` at 4.
    Ping {
        /// Size of the ping message (unused by current Lustre).
        size: u32,
        /// Reserved flags.
        flags: u32,
    },
    /// Brw test, v0 layout (`struct test_bulk_req`, 12 bytes), sessions without
    /// [`LST_FEAT_BULK_LEN`]: `blk_opc` at 0, `blk_npg` at 4, `blk_flags` at 8. The transfer is
    /// `npg` pages of the *receiver's* page size at offset 0 (brw_client_init), which is why v1
    /// exists.
    BulkV0 {
        /// [`BrwOp`] code, raw.
        opc: u32,
        /// Number of pages.
        npg: u32,
        /// [`BrwCheck`] code, raw.
        flags: u32,
    },
    /// Brw test, v1 layout (`struct test_bulk_req_v1`, 12 bytes), sessions with
    /// [`LST_FEAT_BULK_LEN`]: `blk_opc` (u16) at 0, `blk_flags` (u16) at 2, `blk_len` at 4,
    /// `blk_offset` at 8.
    BulkV1 {
        /// [`BrwOp`] code, raw.
        opc: u16,
        /// [`BrwCheck`] code, raw.
        flags: u16,
        /// Bytes per transfer (at most [`LNET_MTU`]).
        len: u32,
        /// Offset of the data in the client's first page; the console sends the client offset
        /// to clients and the (reserved) server offset to servers. Must be a multiple of 8.
        offset: u32,
    },
    /// Any other service: the 12 union bytes exactly as received (a node answers EINVAL).
    Other {
        /// The raw `tsr_service` (neither 11 nor 12).
        service: u32,
        /// The union's bytes, unswapped.
        raw: [u8; 12],
    },
}

impl TestParams {
    /// The `tsr_service` these parameters go with.
    pub fn service(&self) -> u32 {
        match self {
            TestParams::Ping { .. } => ServiceId::Ping as u32,
            TestParams::BulkV0 { .. } | TestParams::BulkV1 { .. } => ServiceId::Brw as u32,
            TestParams::Other { service, .. } => *service,
        }
    }
}

/// Test request (`struct srpc_test_reqst`, 70 bytes): add a test to a batch on a node.
///
/// | offset | field          | size |
/// |--------|----------------|------|
/// | 0      | tsr_rpyid      | 8    |
/// | 8      | tsr_bulkid     | 8    |
/// | 16     | tsr_sid        | 16   |
/// | 32     | tsr_bid        | 8    |
/// | 40     | tsr_service    | 4    |
/// | 44     | tsr_loop       | 4    |
/// | 48     | tsr_concur     | 4    |
/// | 52     | tsr_is_client  | 1    |
/// | 53     | tsr_stop_onerr | 1    |
/// | 54     | tsr_ndest      | 4    |
/// | 58     | tsr_u          | 12   |
///
/// `tsr_service` is declared as a C enum; we take it as 4 bytes, which is what GCC gives an
/// enum of small values on every Linux ABI (the header does not say so; module.c's total of 160
/// bytes does not depend on it because the stat reply is the largest body).
///
/// **Where the destinations travel.** A client-side request (`is_client`) names `ndest`
/// destination processes, but they are not in the message: the console posts them as a bulk
/// buffer on [`SRPC_RDMA_PORTAL`] with match bits `bulkid`, and the node, before it replies,
/// LNet-GETs that buffer (sfw_add_test allocates a sink of `12 * ndest` bytes; srpc_do_bulk).
/// The buffer is an array of 12-byte [`ProcessId`]s, page by page: see [`dest_ids_len`],
/// [`emit_dest_ids`] and [`parse_dest_ids`]. A server-side request (`!is_client`) has
/// `ndest` 0, no bulk, and `loop_count` is the number of request buffers to post.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct TestRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// Match bits of the destination-list bulk (client side only).
    pub bulkid: u64,
    /// The console's session id.
    pub sid: LstSid,
    /// The batch the test joins.
    pub bid: LstBid,
    /// Client: RPCs per destination and unit (loop count); server: buffers to post.
    pub loop_count: u32,
    /// Concurrent RPCs per destination (at most [`LST_MAX_CONCUR`]).
    pub concur: u32,
    /// This node runs the client side of the test.
    pub is_client: bool,
    /// Stop a test unit at its first error.
    pub stop_onerr: bool,
    /// Number of destinations in the bulk.
    pub ndest: u32,
    /// The service and its parameters.
    pub params: TestParams,
}

impl BodyLayout for TestRequest {
    const TYPE: MsgType = MsgType::TestRequest;
    const LEN: usize = 70;
    fn read(r: &Reader<'_>, features: u32) -> Self {
        let service = r.u32(40);
        let params = if service == ServiceId::Ping as u32 {
            TestParams::Ping {
                size: r.u32(58),
                flags: r.u32(62),
            }
        } else if service == ServiceId::Brw as u32 {
            if features & LST_FEAT_BULK_LEN == 0 {
                TestParams::BulkV0 {
                    opc: r.u32(58),
                    npg: r.u32(62),
                    flags: r.u32(66),
                }
            } else {
                TestParams::BulkV1 {
                    opc: r.u16(58),
                    flags: r.u16(60),
                    len: r.u32(62),
                    offset: r.u32(66),
                }
            }
        } else {
            TestParams::Other {
                service,
                raw: take(r.b, SRPC_HDR_LEN + 58),
            }
        };
        TestRequest {
            rpyid: r.u64(0),
            bulkid: r.u64(8),
            sid: r.sid(16),
            bid: LstBid(r.u64(32)),
            loop_count: r.u32(44),
            concur: r.u32(48),
            is_client: r.u8(52) != 0,
            stop_onerr: r.u8(53) != 0,
            ndest: r.u32(54),
            params,
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(0, self.rpyid);
        w.u64(8, self.bulkid);
        w.sid(16, self.sid);
        w.u64(32, self.bid.0);
        w.u32(40, self.params.service());
        w.u32(44, self.loop_count);
        w.u32(48, self.concur);
        w.u8(52, u8::from(self.is_client));
        w.u8(53, u8::from(self.stop_onerr));
        w.u32(54, self.ndest);
        match self.params {
            TestParams::Ping { size, flags } => {
                w.u32(58, size);
                w.u32(62, flags);
            }
            TestParams::BulkV0 { opc, npg, flags } => {
                w.u32(58, opc);
                w.u32(62, npg);
                w.u32(66, flags);
            }
            TestParams::BulkV1 {
                opc,
                flags,
                len,
                offset,
            } => {
                w.u16(58, opc);
                w.u16(60, flags);
                w.u32(62, len);
                w.u32(66, offset);
            }
            TestParams::Other { raw, .. } => put(w.b, SRPC_HDR_LEN + 58, raw),
        }
    }
}

/// Test reply (`struct srpc_test_reply`, 20 bytes): `tsr_status` at 0, `tsr_sid` at 4.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct TestReply {
    /// Positive errno, 0 on success.
    pub status: u32,
    /// The node's session id.
    pub sid: LstSid,
}

impl BodyLayout for TestReply {
    const TYPE: MsgType = MsgType::TestReply;
    const LEN: usize = 20;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        TestReply {
            status: r.u32(0),
            sid: r.sid(4),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(0, self.status);
        w.sid(4, self.sid);
    }
}

/// Ping test request (`struct srpc_ping_reqst`, 32 bytes), test client to server on portal 50:
///
/// | offset | field         | size |
/// |--------|---------------|------|
/// | 0      | pnr_rpyid     | 8    |
/// | 8      | pnr_magic     | 4    |
/// | 12     | pnr_seq       | 4    |
/// | 16     | pnr_time_sec  | 8    |
/// | 24     | pnr_time_nsec | 8    |
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PingRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// [`LST_PING_TEST_MAGIC`]; a server refuses anything else (ping_server_handle).
    pub magic: u32,
    /// The client's sequence number, echoed in the reply.
    pub seq: u32,
    /// Send time, wall-clock seconds.
    pub time_sec: u64,
    /// Send time, nanoseconds within the second.
    pub time_nsec: u64,
}

impl BodyLayout for PingRequest {
    const TYPE: MsgType = MsgType::PingRequest;
    const LEN: usize = 32;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        PingRequest {
            rpyid: r.u64(0),
            magic: r.u32(8),
            seq: r.u32(12),
            time_sec: r.u64(16),
            time_nsec: r.u64(24),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(0, self.rpyid);
        w.u32(8, self.magic);
        w.u32(12, self.seq);
        w.u64(16, self.time_sec);
        w.u64(24, self.time_nsec);
    }
}

/// Ping test reply (`struct srpc_ping_reply`, 12 bytes): `pnr_status` at 0, `pnr_magic` at 4,
/// `pnr_seq` at 8.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PingReply {
    /// Positive errno (EPROTO for unknown features), 0 on success.
    pub status: u32,
    /// [`LST_PING_TEST_MAGIC`]; the client counts anything else as an error.
    pub magic: u32,
    /// The request's sequence number.
    pub seq: u32,
}

impl BodyLayout for PingReply {
    const TYPE: MsgType = MsgType::PingReply;
    const LEN: usize = 12;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        PingReply {
            status: r.u32(0),
            magic: r.u32(4),
            seq: r.u32(8),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(0, self.status);
        w.u32(4, self.magic);
        w.u32(8, self.seq);
    }
}

/// Brw test request (`struct srpc_brw_reqst`, 28 bytes), test client to server on portal 50:
///
/// | offset | field      | size |
/// |--------|------------|------|
/// | 0      | brw_rpyid  | 8    |
/// | 8      | brw_bulkid | 8    |
/// | 16     | brw_rw     | 4    |
/// | 20     | brw_len    | 4    |
/// | 24     | brw_flags  | 4    |
///
/// The data itself is a bulk on [`SRPC_RDMA_PORTAL`] with match bits `bulkid`: for a read the
/// server PUTs `len` bytes there, for a write it GETs them, then it replies. The server's buffer
/// always starts at page offset 0 (brw_server_handle); without [`LST_FEAT_BULK_LEN`] `len` must
/// be a whole number of pages.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BrwRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// Bulk match bits.
    pub bulkid: u64,
    /// [`BrwOp`] code, raw (a server answers others with EINVAL).
    pub rw: u32,
    /// Bytes to move, 1..=[`LNET_MTU`].
    pub len: u32,
    /// [`BrwCheck`] code, raw: the pattern the data carries.
    pub flags: u32,
}

impl BrwRequest {
    /// The direction, if `rw` is a known code.
    pub fn op(&self) -> Option<BrwOp> {
        BrwOp::from_u32(self.rw)
    }

    /// The data check, if `flags` is a known code.
    pub fn check(&self) -> Option<BrwCheck> {
        BrwCheck::from_u32(self.flags)
    }
}

impl BodyLayout for BrwRequest {
    const TYPE: MsgType = MsgType::BrwRequest;
    const LEN: usize = 28;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        BrwRequest {
            rpyid: r.u64(0),
            bulkid: r.u64(8),
            rw: r.u32(16),
            len: r.u32(20),
            flags: r.u32(24),
        }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(0, self.rpyid);
        w.u64(8, self.bulkid);
        w.u32(16, self.rw);
        w.u32(20, self.len);
        w.u32(24, self.flags);
    }
}

/// Brw test reply (`struct srpc_brw_reply`, 4 bytes): `brw_status` at 0, a positive errno
/// (EBADMSG when a written pattern did not check out).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BrwReply {
    /// Positive errno, 0 on success.
    pub status: u32,
}

impl BodyLayout for BrwReply {
    const TYPE: MsgType = MsgType::BrwReply;
    const LEN: usize = 4;
    fn read(r: &Reader<'_>, _: u32) -> Self {
        BrwReply { status: r.u32(0) }
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(0, self.status);
    }
}

// ---------------------------------------------------------------------------------------------
// The message
// ---------------------------------------------------------------------------------------------

macro_rules! bodies {
    ($($variant:ident),* $(,)?) => {
        /// The body of an srpc message, one variant per `msg_type`.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        pub enum SrpcBody {
            $(
                #[doc = concat!("A [`", stringify!($variant), "`] body.")]
                $variant($variant),
            )*
        }

        impl SrpcBody {
            /// The `msg_type` this body is sent with.
            pub fn msg_type(&self) -> MsgType {
                match self {
                    $(SrpcBody::$variant(_) => <$variant as BodyLayout>::TYPE,)*
                }
            }

            /// Bytes of the body union this body uses.
            pub fn len(&self) -> usize {
                match self {
                    $(SrpcBody::$variant(_) => <$variant as BodyLayout>::LEN,)*
                }
            }

            /// Never true: every body has fields (here for clippy's `len_without_is_empty`).
            pub fn is_empty(&self) -> bool {
                false
            }

            fn read(t: MsgType, r: &Reader<'_>, features: u32) -> SrpcBody {
                match t {
                    $(MsgType::$variant => SrpcBody::$variant(<$variant as BodyLayout>::read(r, features)),)*
                }
            }

            fn write(&self, w: &mut Writer<'_>) {
                match self {
                    $(SrpcBody::$variant(x) => x.write(w),)*
                }
            }
        }

        $(
            impl From<$variant> for SrpcBody {
                fn from(x: $variant) -> SrpcBody {
                    SrpcBody::$variant(x)
                }
            }

            impl $variant {
                /// The `msg_type` of this body.
                pub const MSG_TYPE: MsgType = <$variant as BodyLayout>::TYPE;

                /// Parses a whole 160-byte srpc message that must carry this body, returning
                /// it and the byte order it came in. The header's features are only used where
                /// the layout depends on them (a test request's brw parameters); use
                /// [`SrpcMsg::parse`] to see them.
                pub fn parse(msg: &[u8]) -> Result<(Self, ByteOrder), SelftestWireError> {
                    let (m, order) = SrpcMsg::parse(msg)?;
                    match m.body {
                        SrpcBody::$variant(x) => Ok((x, order)),
                        other => Err(SelftestWireError::WrongMsgType {
                            expected: Self::MSG_TYPE,
                            got: other.msg_type(),
                        }),
                    }
                }

                /// Emits this body as a whole 160-byte srpc message in `order`, with the
                /// features [`SrpcBody::implied_features`] gives it; use [`SrpcMsg::emit`] to
                /// choose them.
                pub fn emit(&self, buf: &mut [u8], order: ByteOrder) -> Result<usize, SelftestWireError> {
                    SrpcMsg::new(SrpcBody::$variant(*self)).emit(buf, order)
                }
            }
        )*
    };
}

bodies!(
    MakeSessionRequest,
    MakeSessionReply,
    RemoveSessionRequest,
    RemoveSessionReply,
    BatchRequest,
    BatchReply,
    StatRequest,
    StatReply,
    TestRequest,
    TestReply,
    DebugRequest,
    DebugReply,
    BrwRequest,
    BrwReply,
    PingRequest,
    PingReply,
    JoinRequest,
    JoinReply,
);

impl SrpcBody {
    /// The session features a body is sent with when none are chosen: every feature we know
    /// ([`LST_FEATS_MASK`]), except that a test request with v0 brw parameters needs
    /// [`LST_FEAT_BULK_LEN`] clear.
    pub fn implied_features(&self) -> u32 {
        match self {
            SrpcBody::TestRequest(TestRequest {
                params: TestParams::BulkV0 { .. },
                ..
            }) => LST_FEAT_NONE,
            _ => LST_FEATS_MASK,
        }
    }
}

/// A validated srpc message (`struct srpc_msg`, 160 bytes, packed): the header fields that mean
/// something and the typed body. `msg_magic` and `msg_version` are implied
/// ([`SRPC_MSG_MAGIC`], [`SRPC_MSG_VERSION`]), `msg_type` comes from the body, and the two
/// reserved words are written as zero and ignored on receive.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SrpcMsg {
    /// `msg_ses_feats`: the session's feature bits. Unknown bits are kept: Lustre answers them
    /// with EPROTO rather than dropping the message.
    pub features: u32,
    /// The body.
    pub body: SrpcBody,
}

impl SrpcMsg {
    /// A message with the body's [`SrpcBody::implied_features`].
    pub fn new(body: SrpcBody) -> SrpcMsg {
        SrpcMsg {
            features: body.implied_features(),
            body,
        }
    }

    /// The message type.
    pub fn msg_type(&self) -> MsgType {
        self.body.msg_type()
    }

    /// Parses a message: at least [`SRPC_MSG_LEN`] bytes (bytes beyond are ignored), a known
    /// magic in either byte order, version 1, a known type. Returns the message and the order it
    /// was sent in (which also tells how the brw data pattern and destination list of this
    /// exchange are ordered).
    pub fn parse(b: &[u8]) -> Result<(SrpcMsg, ByteOrder), SelftestWireError> {
        check_len(b, SRPC_MSG_LEN)?;
        let order = detect_order(b)?;
        let version = order.get_u32(b, hdr::VERSION);
        if version != SRPC_MSG_VERSION {
            return Err(SelftestWireError::BadVersion(version));
        }
        let raw_type = order.get_u32(b, hdr::TYPE);
        let msg_type =
            MsgType::from_u32(raw_type).ok_or(SelftestWireError::UnknownMsgType(raw_type))?;
        let features = order.get_u32(b, hdr::SES_FEATS);
        let r = Reader { b, order };
        let body = SrpcBody::read(msg_type, &r, features);
        Ok((SrpcMsg { features, body }, order))
    }

    /// Writes the whole 160-byte message into `buf` in `order`, zeroing what the body does not
    /// use; returns [`SRPC_MSG_LEN`]. Refuses a test request whose brw layout disagrees with
    /// `features`, and [`TestParams::Other`] carrying the brw or ping service id.
    pub fn emit(&self, buf: &mut [u8], order: ByteOrder) -> Result<usize, SelftestWireError> {
        if let SrpcBody::TestRequest(t) = &self.body {
            let v1 = self.features & LST_FEAT_BULK_LEN != 0;
            match t.params {
                TestParams::BulkV0 { .. } if v1 => {
                    return Err(SelftestWireError::BulkLayoutMismatch {
                        features: self.features,
                    })
                }
                TestParams::BulkV1 { .. } if !v1 => {
                    return Err(SelftestWireError::BulkLayoutMismatch {
                        features: self.features,
                    })
                }
                TestParams::Other { service, .. }
                    if service == ServiceId::Brw as u32 || service == ServiceId::Ping as u32 =>
                {
                    return Err(SelftestWireError::BadTestService(service))
                }
                _ => {}
            }
        }
        let got = buf.len();
        let out = buf
            .get_mut(..SRPC_MSG_LEN)
            .ok_or(SelftestWireError::BufferTooSmall {
                needed: SRPC_MSG_LEN,
                got,
            })?;
        out.fill(0);
        order.put_u32(out, hdr::MAGIC, SRPC_MSG_MAGIC);
        order.put_u32(out, hdr::VERSION, SRPC_MSG_VERSION);
        order.put_u32(out, hdr::TYPE, self.msg_type() as u32);
        order.put_u32(out, hdr::RESERVED0, 0);
        order.put_u32(out, hdr::RESERVED1, 0);
        order.put_u32(out, hdr::SES_FEATS, self.features);
        self.body.write(&mut Writer { b: out, order });
        Ok(SRPC_MSG_LEN)
    }
}

// ---------------------------------------------------------------------------------------------
// The destination list of a test request
// ---------------------------------------------------------------------------------------------

/// Bytes of the destination-list bulk for `ndest` destinations (lstcon_testrpc_prep):
/// with [`LST_FEAT_BULK_LEN`] exactly `12 * ndest`, the last page partly used; without it
/// whole pages. Either way the ids are laid out page by page, [`ids_per_page`] to a page,
/// each page's `page_size % 12` tail unused, so entry `i` is at byte
/// `(i / per_page) * page_size + (i % per_page) * 12`. The page size is the console's and
/// must match the node's (Lustre assumes the same PAGE_SIZE at both ends; with 4 KiB pages
/// that holds on x86-64 and most arm64 builds, not on 64 KiB-page nodes). Note that with the
/// feature both ends size the bulk as `12 * ndest` bytes (lstcon_testrpc_prep, sfw_add_test)
/// yet place entries by page, so past [`ids_per_page`] destinations the paged end of the list
/// lies `page_size % 12` bytes per extra page beyond the bulk's length and Lustre's last entries
/// never fully travel. We report that faithfully: [`parse_dest_ids`] then fails with
/// `Truncated` rather than invent bytes. (A Lustre quirk read from the source, not seen on a
/// live system.)
pub fn dest_ids_len(ndest: usize, page_size: usize, features: u32) -> usize {
    let per_page = ids_per_page(page_size).max(1);
    let pages = ndest.div_ceil(per_page);
    if features & LST_FEAT_BULK_LEN != 0 {
        ndest.saturating_mul(PROCESS_ID_LEN)
    } else {
        pages.saturating_mul(page_size)
    }
}

fn dest_id_offset(i: usize, page_size: usize) -> usize {
    let per_page = ids_per_page(page_size).max(1);
    (i / per_page) * page_size + (i % per_page) * PROCESS_ID_LEN
}

/// Writes `ids` into `buf` as the destination-list bulk (see [`dest_ids_len`]), in `order` (the
/// order of the test request that announces them); returns the bytes up to the end of the last
/// entry. Unused page tails are left as they are.
pub fn emit_dest_ids(
    ids: &[ProcessId],
    page_size: usize,
    buf: &mut [u8],
    order: ByteOrder,
) -> Result<usize, SelftestWireError> {
    if page_size < PROCESS_ID_LEN {
        return Err(SelftestWireError::Misaligned {
            page_size,
            offset: 0,
            len: ids.len(),
        });
    }
    let end = match ids.len() {
        0 => 0,
        n => dest_id_offset(n - 1, page_size) + PROCESS_ID_LEN,
    };
    check_room(buf, end)?;
    for (i, id) in ids.iter().enumerate() {
        let at = dest_id_offset(i, page_size);
        order.put_u64(buf, at, id.nid.raw());
        order.put_u32(buf, at + 8, id.pid);
    }
    Ok(end)
}

/// Reads `ndest` destinations from a destination-list bulk in `order` (the test request's byte
/// order, as sfw_add_test_instance swaps each entry when the request was swapped).
pub fn parse_dest_ids(
    bulk: &[u8],
    ndest: usize,
    page_size: usize,
    order: ByteOrder,
) -> Result<Vec<ProcessId>, SelftestWireError> {
    if page_size < PROCESS_ID_LEN {
        return Err(SelftestWireError::Misaligned {
            page_size,
            offset: 0,
            len: bulk.len(),
        });
    }
    let end = match ndest {
        0 => 0,
        n => dest_id_offset(n - 1, page_size) + PROCESS_ID_LEN,
    };
    check_len(bulk, end)?;
    Ok((0..ndest)
        .map(|i| {
            let at = dest_id_offset(i, page_size);
            ProcessId {
                nid: Nid::from_raw(order.get_u64(bulk, at)),
                pid: order.get_u32(bulk, at + 8),
            }
        })
        .collect())
}

// ---------------------------------------------------------------------------------------------
// Bulk data patterns (brw_test.c)
// ---------------------------------------------------------------------------------------------

/// Number of pages a brw bulk of `len` bytes spans when it starts at in-page offset `offset`
/// (brw_client_prep_rpc).
pub fn brw_page_count(offset: usize, len: usize, page_size: usize) -> usize {
    offset.saturating_add(len).div_ceil(page_size.max(1))
}

/// Splits a bulk of `len` bytes starting at in-page `offset` into per-page segments
/// `(start, len)` in bulk coordinates, as srpc_init_bulk lays out its iovecs.
fn segments(
    len: usize,
    offset: usize,
    page_size: usize,
) -> Result<impl Iterator<Item = (usize, usize)>, SelftestWireError> {
    if page_size == 0
        || page_size % BRW_MSIZE != 0
        || offset >= page_size
        || offset % BRW_MSIZE != 0
        || len % BRW_MSIZE != 0
    {
        return Err(SelftestWireError::Misaligned {
            page_size,
            offset,
            len,
        });
    }
    let mut pos = 0usize;
    let mut in_page = offset;
    Ok(core::iter::from_fn(move || {
        if pos >= len {
            return None;
        }
        let seg = (page_size - in_page).min(len - pos);
        let item = (pos, seg);
        pos += seg;
        in_page = 0;
        Some(item)
    }))
}

/// The word offsets (within one page segment of `seg` bytes at `start`) a check looks at.
fn pattern_words(check: BrwCheck, start: usize, seg: usize) -> impl Iterator<Item = usize> {
    let (first, step, count) = match check {
        BrwCheck::None | BrwCheck::Discard => (start, BRW_MSIZE, 0),
        // The first word, and the last one when the segment has more than one.
        BrwCheck::Simple if seg > BRW_MSIZE => (start, seg - BRW_MSIZE, 2),
        BrwCheck::Simple => (start, BRW_MSIZE, seg / BRW_MSIZE),
        BrwCheck::Full => (start, BRW_MSIZE, seg / BRW_MSIZE),
    };
    (0..count).map(move |k| first + k * step)
}

/// Writes the brw pattern of `check` into `buf`, a bulk whose first byte sits at in-page offset
/// `offset` in pages of `page_size` bytes (brw_fill_bulk): each page segment gets `magic` in its
/// first and last 8-byte word ([`BrwCheck::Simple`]) or in every word ([`BrwCheck::Full`]);
/// `None` and `Discard` write nothing. The word is written in `order`, the byte order of the
/// node sending the data (Lustre copies it from memory). Use [`BRW_MAGIC`] for data and
/// [`BRW_POISON`] to poison a sink before it is filled.
pub fn fill_pattern(
    buf: &mut [u8],
    offset: usize,
    page_size: usize,
    check: BrwCheck,
    magic: u64,
    order: ByteOrder,
) -> Result<(), SelftestWireError> {
    for (start, seg) in segments(buf.len(), offset, page_size)? {
        for at in pattern_words(check, start, seg) {
            order.put_u64(buf, at, magic);
        }
    }
    Ok(())
}

/// Checks the brw pattern of `check` in `buf` (brw_check_bulk), laid out as for
/// [`fill_pattern`]; `order` is the byte order of the node that sent the data (the order its
/// srpc messages came in: Lustre compares against the byte-swapped magic when the message was
/// swapped). Returns the first bad word. `None` and `Discard` always pass.
///
/// The segmenting follows the *checking* node's layout: a Lustre brw server always lays out its
/// buffer from page offset 0 while a v1 client may use a non-zero offset, so with
/// [`BrwCheck::Simple`] and an offset the two ends look at different words (a write would then
/// fail the server's check unless the client's pages happen to hold the magic there). We mirror
/// that; the service decides which offset each side uses.
pub fn check_pattern(
    buf: &[u8],
    offset: usize,
    page_size: usize,
    check: BrwCheck,
    magic: u64,
    order: ByteOrder,
) -> Result<(), SelftestWireError> {
    for (start, seg) in segments(buf.len(), offset, page_size)? {
        for at in pattern_words(check, start, seg) {
            let found = order.get_u64(buf, at);
            if found != magic {
                return Err(SelftestWireError::BadBulkData {
                    at,
                    found,
                    expected: magic,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LE: ByteOrder = ByteOrder::Little;
    const BE: ByteOrder = ByteOrder::Big;

    /// Copies `bytes` to absolute offset `off` of the expected message.
    fn at(e: &mut [u8], off: usize, bytes: &[u8]) {
        e[off..off + bytes.len()].copy_from_slice(bytes);
    }

    /// Header of a little-endian message of type `t` with features `f` (offsets 0..24).
    fn le_header(t: u32, f: u32) -> Vec<u8> {
        let mut e = vec![0u8; SRPC_MSG_LEN];
        at(&mut e, 0, &0xeeb0_f00du32.to_le_bytes()); // msg_magic
        at(&mut e, 4, &1u32.to_le_bytes()); // msg_version
        at(&mut e, 8, &t.to_le_bytes()); // msg_type
                                         // 12: msg_reserved0 = 0, 16: msg_reserved1 = 0
        at(&mut e, 20, &f.to_le_bytes()); // msg_ses_feats
        e
    }

    fn emit_msg(m: &SrpcMsg, order: ByteOrder) -> Vec<u8> {
        let mut b = vec![0xa5u8; SRPC_MSG_LEN];
        assert_eq!(m.emit(&mut b, order), Ok(SRPC_MSG_LEN));
        b
    }

    fn sid() -> LstSid {
        LstSid {
            nid: Nid::from_raw(0x0005_0000_c0a8_0101), // 192.168.1.1@o2ib
            stamp: 1_700_000_000_123,
        }
    }

    #[test]
    fn sizes_match_lustre() {
        assert_eq!(SRPC_MSG_LEN, 160);
        assert_eq!(SRPC_BODY_LEN, StatReply::LEN);
        for t in MsgType::ALL {
            assert_eq!(MsgType::from_u32(t as u32), Some(t));
            assert!(t.service().request_type() as u32 / 2 == t as u32 / 2);
            assert_eq!(t.is_reply(), t.reply() == t);
        }
        assert_eq!(MsgType::from_u32(18), None);
        assert_eq!(ids_per_page(4096), 341);
        assert_eq!(SFW_MAX_NDESTS_4K, 256 * 341);
        assert_eq!(BRW_MAX_PAGES_4K, 256);
        assert_eq!(ServiceId::Brw.portal(), 50);
        assert_eq!(ServiceId::Join.portal(), 51);
        assert_eq!(ServiceId::Ping.reply_type(), MsgType::PingReply);
        assert_eq!(TestType::Bulk.service(), ServiceId::Brw);
        assert_eq!(ServiceId::from_u32(10), None);
    }

    #[test]
    fn kat_ping_request_le_literal() {
        let m = PingRequest {
            rpyid: 0x0102_0304_0506_0708,
            magic: LST_PING_TEST_MAGIC,
            seq: 7,
            time_sec: 0x11,
            time_nsec: 0x22,
        };
        let mut e = vec![0u8; SRPC_MSG_LEN];
        at(&mut e, 0, &[0x0d, 0xf0, 0xb0, 0xee]); // msg_magic 0xeeb0f00d, LE
        at(&mut e, 4, &[1, 0, 0, 0]); // msg_version 1
        at(&mut e, 8, &[14, 0, 0, 0]); // msg_type SRPC_MSG_PING_REQST
        at(&mut e, 20, &[1, 0, 0, 0]); // msg_ses_feats LST_FEAT_BULK_LEN
        at(&mut e, 24, &[8, 7, 6, 5, 4, 3, 2, 1]); // 24+0: pnr_rpyid
        at(&mut e, 32, &[0xce, 0xfa, 0xbe, 0xba]); // 24+8: pnr_magic 0xbabeface
        at(&mut e, 36, &[7, 0, 0, 0]); // 24+12: pnr_seq
        at(&mut e, 40, &[0x11, 0, 0, 0, 0, 0, 0, 0]); // 24+16: pnr_time_sec
        at(&mut e, 48, &[0x22, 0, 0, 0, 0, 0, 0, 0]); // 24+24: pnr_time_nsec
        let mut b = [0xffu8; 200];
        assert_eq!(m.emit(&mut b, LE), Ok(160));
        assert_eq!(&b[..160], &e[..]);
        assert_eq!(b[160], 0xff, "nothing written past the message");
        assert_eq!(PingRequest::parse(&e), Ok((m, LE)));
    }

    #[test]
    fn kat_ping_request_be() {
        let m = PingRequest {
            rpyid: 0x0102_0304_0506_0708,
            magic: LST_PING_TEST_MAGIC,
            seq: 7,
            time_sec: 0x11,
            time_nsec: 0x22,
        };
        let mut e = vec![0u8; SRPC_MSG_LEN];
        at(&mut e, 0, &[0xee, 0xb0, 0xf0, 0x0d]); // msg_magic, BE
        at(&mut e, 4, &[0, 0, 0, 1]); // msg_version
        at(&mut e, 8, &[0, 0, 0, 14]); // msg_type
        at(&mut e, 20, &[0, 0, 0, 1]); // msg_ses_feats
        at(&mut e, 24, &[1, 2, 3, 4, 5, 6, 7, 8]); // pnr_rpyid
        at(&mut e, 32, &[0xba, 0xbe, 0xfa, 0xce]); // pnr_magic
        at(&mut e, 36, &[0, 0, 0, 7]); // pnr_seq
        at(&mut e, 40, &[0, 0, 0, 0, 0, 0, 0, 0x11]); // pnr_time_sec
        at(&mut e, 48, &[0, 0, 0, 0, 0, 0, 0, 0x22]); // pnr_time_nsec
        assert_eq!(emit_msg(&SrpcMsg::new(m.into()), BE), e);
        assert_eq!(PingRequest::parse(&e), Ok((m, BE)));
    }

    #[test]
    fn kat_ping_reply() {
        let m = PingReply {
            status: 71, // EPROTO
            magic: LST_PING_TEST_MAGIC,
            seq: 0x0a0b_0c0d,
        };
        let mut e = le_header(15, 1); // SRPC_MSG_PING_REPLY
        at(&mut e, 24, &71u32.to_le_bytes()); // 24+0: pnr_status
        at(&mut e, 28, &0xbabe_faceu32.to_le_bytes()); // 24+4: pnr_magic
        at(&mut e, 32, &[0x0d, 0x0c, 0x0b, 0x0a]); // 24+8: pnr_seq
        let mut b = [0u8; 160];
        m.emit(&mut b, LE).unwrap();
        assert_eq!(&b[..], &e[..]);
        assert_eq!(PingReply::parse(&e), Ok((m, LE)));
    }

    #[test]
    fn kat_brw_request_and_reply() {
        let m = BrwRequest {
            rpyid: 0x1111_2222_3333_4444,
            bulkid: 0x5555_6666_7777_8888,
            rw: BrwOp::Write as u32,
            len: 1 << 20,
            flags: BrwCheck::Full as u32,
        };
        let mut e = le_header(12, 1); // SRPC_MSG_BRW_REQST
        at(&mut e, 24, &0x1111_2222_3333_4444u64.to_le_bytes()); // 24+0: brw_rpyid
        at(&mut e, 32, &0x5555_6666_7777_8888u64.to_le_bytes()); // 24+8: brw_bulkid
        at(&mut e, 40, &2u32.to_le_bytes()); // 24+16: brw_rw LST_BRW_WRITE
        at(&mut e, 44, &[0, 0, 0x10, 0]); // 24+20: brw_len 1 MiB
        at(&mut e, 48, &3u32.to_le_bytes()); // 24+24: brw_flags LST_BRW_CHECK_FULL
        assert_eq!(emit_msg(&SrpcMsg::new(m.into()), LE), e);
        let (p, o) = BrwRequest::parse(&e).unwrap();
        assert_eq!((p, o), (m, LE));
        assert_eq!(p.op(), Some(BrwOp::Write));
        assert_eq!(p.check(), Some(BrwCheck::Full));

        let r = BrwReply { status: 74 }; // EBADMSG
        let mut e = le_header(13, 1); // SRPC_MSG_BRW_REPLY
        at(&mut e, 24, &74u32.to_le_bytes()); // 24+0: brw_status
        assert_eq!(emit_msg(&SrpcMsg::new(r.into()), LE), e);
        assert_eq!(BrwReply::parse(&e), Ok((r, LE)));
        // The same reply big-endian: only the magic tells the order.
        let mut e = vec![0u8; 160];
        at(&mut e, 0, &0xeeb0_f00du32.to_be_bytes());
        at(&mut e, 4, &1u32.to_be_bytes());
        at(&mut e, 8, &13u32.to_be_bytes());
        at(&mut e, 20, &1u32.to_be_bytes());
        at(&mut e, 24, &74u32.to_be_bytes());
        assert_eq!(emit_msg(&SrpcMsg::new(r.into()), BE), e);
        assert_eq!(BrwReply::parse(&e), Ok((r, BE)));
    }

    #[test]
    fn kat_make_session_request() {
        let m = MakeSessionRequest {
            rpyid: 42,
            sid: sid(),
            force: 1,
            name: LstName::new("read_test").unwrap(),
        };
        let mut e = le_header(0, 1); // SRPC_MSG_MKSN_REQST
        at(&mut e, 24, &42u64.to_le_bytes()); // 24+0: mksn_rpyid
        at(&mut e, 32, &0x0005_0000_c0a8_0101u64.to_le_bytes()); // 24+8: mksn_sid.ses_nid
        at(&mut e, 40, &1_700_000_000_123i64.to_le_bytes()); // 24+16: mksn_sid.ses_stamp
        at(&mut e, 48, &1u32.to_le_bytes()); // 24+24: mksn_force
        at(&mut e, 52, b"read_test"); // 24+28: mksn_name[32], NUL-padded
        assert_eq!(emit_msg(&SrpcMsg::new(m.into()), LE), e);
        let (p, _) = MakeSessionRequest::parse(&e).unwrap();
        assert_eq!(p, m);
        assert_eq!(p.name.to_string_lossy(), "read_test");
    }

    #[test]
    fn kat_test_request_brw_v1() {
        let m = TestRequest {
            rpyid: 0x10,
            bulkid: 0x20,
            sid: sid(),
            bid: LstBid(0x30),
            loop_count: 100_000,
            concur: 8,
            is_client: true,
            stop_onerr: false,
            ndest: 2,
            params: TestParams::BulkV1 {
                opc: BrwOp::Read as u16,
                flags: BrwCheck::Simple as u16,
                len: 4096,
                offset: 8,
            },
        };
        let mut e = le_header(8, 1); // SRPC_MSG_TEST_REQST, LST_FEAT_BULK_LEN
        at(&mut e, 24, &0x10u64.to_le_bytes()); // 24+0: tsr_rpyid
        at(&mut e, 32, &0x20u64.to_le_bytes()); // 24+8: tsr_bulkid
        at(&mut e, 40, &0x0005_0000_c0a8_0101u64.to_le_bytes()); // 24+16: tsr_sid.ses_nid
        at(&mut e, 48, &1_700_000_000_123i64.to_le_bytes()); // 24+24: tsr_sid.ses_stamp
        at(&mut e, 56, &0x30u64.to_le_bytes()); // 24+32: tsr_bid
        at(&mut e, 64, &11u32.to_le_bytes()); // 24+40: tsr_service SRPC_SERVICE_BRW
        at(&mut e, 68, &100_000u32.to_le_bytes()); // 24+44: tsr_loop
        at(&mut e, 72, &8u32.to_le_bytes()); // 24+48: tsr_concur
        at(&mut e, 76, &[1]); // 24+52: tsr_is_client
        at(&mut e, 77, &[0]); // 24+53: tsr_stop_onerr
        at(&mut e, 78, &2u32.to_le_bytes()); // 24+54: tsr_ndest (unaligned: packed)
        at(&mut e, 82, &1u16.to_le_bytes()); // 24+58: blk_opc LST_BRW_READ (u16)
        at(&mut e, 84, &2u16.to_le_bytes()); // 24+60: blk_flags LST_BRW_CHECK_SIMPLE (u16)
        at(&mut e, 86, &4096u32.to_le_bytes()); // 24+62: blk_len
        at(&mut e, 90, &8u32.to_le_bytes()); // 24+66: blk_offset
        assert_eq!(emit_msg(&SrpcMsg::new(m.into()), LE), e);
        assert_eq!(TestRequest::parse(&e), Ok((m, LE)));

        // The same union bytes in a session without the feature read as v0.
        at(&mut e, 20, &0u32.to_le_bytes());
        let (v0, _) = TestRequest::parse(&e).unwrap();
        assert_eq!(
            v0.params,
            TestParams::BulkV0 {
                opc: 0x0002_0001,
                npg: 4096,
                flags: 8
            }
        );
        // And emitting v1 parameters without the feature is refused.
        let bad = SrpcMsg {
            features: 0,
            body: m.into(),
        };
        assert_eq!(
            bad.emit(&mut [0u8; 160], LE),
            Err(SelftestWireError::BulkLayoutMismatch { features: 0 })
        );
    }

    #[test]
    fn kat_stat_reply() {
        let m = StatReply {
            status: 0,
            sid: sid(),
            fw: SfwCounters {
                running_ms: 1,
                active_batches: 2,
                zombie_sessions: 3,
                brw_errors: 4,
                ping_errors: 5,
            },
            rpc: SrpcCounters {
                errors: 6,
                rpcs_sent: 7,
                rpcs_rcvd: 8,
                rpcs_dropped: 9,
                rpcs_expired: 10,
                bulk_get: 11,
                bulk_put: 12,
            },
            lnet: LnetCounters {
                msgs_alloc: 13,
                msgs_max: 14,
                errors: 15,
                send_count: 16,
                recv_count: 17,
                route_count: 18,
                drop_count: 19,
                send_length: 20,
                recv_length: 21,
                route_length: 22,
                drop_length: 0x0102_0304_0506_0708,
            },
        };
        let mut e = le_header(7, 1); // SRPC_MSG_STAT_REPLY
                                     // 24+0: str_status = 0
        at(&mut e, 28, &0x0005_0000_c0a8_0101u64.to_le_bytes()); // 24+4: str_sid.ses_nid
        at(&mut e, 36, &1_700_000_000_123i64.to_le_bytes()); // 24+12: str_sid.ses_stamp
                                                             // 24+20: str_fw, five u32: running_ms .. ping_errors = 1..=5
        for (i, v) in (1u32..=5).enumerate() {
            at(&mut e, 44 + 4 * i, &v.to_le_bytes());
        }
        // 24+40: str_rpc, five u32 (errors .. rpcs_expired = 6..=10) then two u64
        for (i, v) in (6u32..=10).enumerate() {
            at(&mut e, 64 + 4 * i, &v.to_le_bytes());
        }
        at(&mut e, 84, &11u64.to_le_bytes()); // 24+60: bulk_get
        at(&mut e, 92, &12u64.to_le_bytes()); // 24+68: bulk_put
                                              // 24+76: str_lnet, seven u32 (msgs_alloc .. drop_count = 13..=19) then four u64
        for (i, v) in (13u32..=19).enumerate() {
            at(&mut e, 100 + 4 * i, &v.to_le_bytes());
        }
        at(&mut e, 128, &20u64.to_le_bytes()); // 24+104: send_length
        at(&mut e, 136, &21u64.to_le_bytes()); // 24+112: recv_length
        at(&mut e, 144, &22u64.to_le_bytes()); // 24+120: route_length
        at(&mut e, 152, &0x0102_0304_0506_0708u64.to_le_bytes()); // 24+128: drop_length, ends at 160
        assert_eq!(emit_msg(&SrpcMsg::new(m.into()), LE), e);
        assert_eq!(StatReply::parse(&e), Ok((m, LE)));
    }

    #[test]
    fn typed_errors() {
        let mut b = [0u8; 160];
        PingReply {
            status: 0,
            magic: LST_PING_TEST_MAGIC,
            seq: 1,
        }
        .emit(&mut b, LE)
        .unwrap();
        assert_eq!(
            PingRequest::parse(&b),
            Err(SelftestWireError::WrongMsgType {
                expected: MsgType::PingRequest,
                got: MsgType::PingReply
            })
        );
        assert_eq!(
            SrpcMsg::parse(&b[..159]),
            Err(SelftestWireError::Truncated {
                needed: 160,
                got: 159
            })
        );
        let mut v = b;
        v[4] = 2;
        assert_eq!(SrpcMsg::parse(&v), Err(SelftestWireError::BadVersion(2)));
        // The header alone still parses, so a server can answer EPROTO to rpyid.
        assert_eq!(SrpcHeader::parse(&v).map(|(h, _)| h.version), Ok(2));
        let mut v = b;
        v[8] = 18;
        assert_eq!(
            SrpcMsg::parse(&v),
            Err(SelftestWireError::UnknownMsgType(18))
        );
        let mut v = b;
        v[0] = 0;
        assert!(matches!(
            SrpcMsg::parse(&v),
            Err(SelftestWireError::BadMagic(_))
        ));
        assert_eq!(
            b.as_slice().len(),
            BrwReply { status: 0 }.emit(&mut [0u8; 200], BE).unwrap()
        );
        assert_eq!(
            BrwReply { status: 0 }.emit(&mut [0u8; 159], LE),
            Err(SelftestWireError::BufferTooSmall {
                needed: 160,
                got: 159
            })
        );
        let other = TestRequest {
            rpyid: 0,
            bulkid: 0,
            sid: LstSid::NONE,
            bid: LstBid(0),
            loop_count: 1,
            concur: 1,
            is_client: false,
            stop_onerr: false,
            ndest: 0,
            params: TestParams::Other {
                service: 12,
                raw: [0; 12],
            },
        };
        assert_eq!(
            other.emit(&mut [0u8; 160], LE),
            Err(SelftestWireError::BadTestService(12))
        );
        assert_eq!(LstName::new(&"x".repeat(32)), None);
        assert!(LstName::new(&"x".repeat(31)).is_some());
    }

    #[test]
    fn dest_ids_page_layout() {
        let ids: Vec<ProcessId> = (0..400u32)
            .map(|i| ProcessId {
                nid: Nid::from_raw(0x0005_0000_0a00_0000 | u64::from(i)),
                pid: 12345,
            })
            .collect();
        let mut bulk = vec![0u8; 2 * 4096];
        let end = emit_dest_ids(&ids, 4096, &mut bulk, LE).unwrap();
        assert_eq!(end, 4096 + 59 * 12);
        // Entry 340 is the last of page 1 (bytes 4080..4092), entry 341 opens page 2.
        assert_eq!(
            &bulk[4080..4088],
            &(0x0005_0000_0a00_0000u64 | 340).to_le_bytes()
        );
        assert_eq!(&bulk[4092..4096], &[0, 0, 0, 0]);
        assert_eq!(
            &bulk[4096..4104],
            &(0x0005_0000_0a00_0000u64 | 341).to_le_bytes()
        );
        assert_eq!(parse_dest_ids(&bulk, 400, 4096, LE).unwrap(), ids);
        assert_eq!(dest_ids_len(400, 4096, 0), 8192);
        assert_eq!(dest_ids_len(400, 4096, LST_FEAT_BULK_LEN), 4800);
        assert!(matches!(
            parse_dest_ids(&bulk[..4800], 400, 4096, LE),
            Err(SelftestWireError::Truncated { .. })
        ));
        let mut be = vec![0u8; 24];
        emit_dest_ids(&ids[..2], 4096, &mut be, BE).unwrap();
        assert_eq!(&be[8..12], &12345u32.to_be_bytes());
        assert_eq!(parse_dest_ids(&be, 2, 4096, BE).unwrap(), &ids[..2]);
    }

    #[test]
    fn full_pattern_catches_any_flipped_byte() {
        // 3 segments: 4088 bytes at offset 8, one whole page, 1000 bytes.
        let len = 4088 + 4096 + 1000;
        let mut buf = vec![0u8; len];
        for order in [LE, BE] {
            fill_pattern(&mut buf, 8, 4096, BrwCheck::Full, BRW_MAGIC, order).unwrap();
            assert_eq!(
                check_pattern(&buf, 8, 4096, BrwCheck::Full, BRW_MAGIC, order),
                Ok(())
            );
            for i in [0, 1, 7, 4087, 4088, 5000, len - 1] {
                let mut bad = buf.clone();
                bad[i] ^= 0x10;
                assert!(
                    matches!(
                        check_pattern(&bad, 8, 4096, BrwCheck::Full, BRW_MAGIC, order),
                        Err(SelftestWireError::BadBulkData { at, .. }) if at == i / 8 * 8
                    ),
                    "byte {i} flipped"
                );
            }
        }
        // Filled in one order, checked in the other: every word is wrong.
        fill_pattern(&mut buf, 8, 4096, BrwCheck::Full, BRW_MAGIC, LE).unwrap();
        assert!(check_pattern(&buf, 8, 4096, BrwCheck::Full, BRW_MAGIC, BE).is_err());
        assert_eq!(
            &buf[..8],
            &[0xb3, 0xee, 0xb2, 0xee, 0xb1, 0xee, 0xb0, 0xee][..]
        );
        assert_eq!(&buf[..8], &BRW_MAGIC.to_le_bytes());
    }

    #[test]
    fn simple_pattern_checks_first_and_last_word_of_each_page() {
        let len = 4096 + 4096 + 8; // two full pages and a one-word page
        let mut buf = vec![0u8; len];
        fill_pattern(&mut buf, 0, 4096, BrwCheck::Simple, BRW_MAGIC, LE).unwrap();
        let words: Vec<usize> = (0..len / 8)
            .filter(|w| buf[w * 8..w * 8 + 8] != [0; 8])
            .map(|w| w * 8)
            .collect();
        assert_eq!(words, vec![0, 4088, 4096, 8184, 8192]);
        assert_eq!(
            check_pattern(&buf, 0, 4096, BrwCheck::Simple, BRW_MAGIC, LE),
            Ok(())
        );
        for w in &words {
            let mut bad = buf.clone();
            bad[w + 3] ^= 1;
            assert!(matches!(
                check_pattern(&bad, 0, 4096, BrwCheck::Simple, BRW_MAGIC, LE),
                Err(SelftestWireError::BadBulkData { at, .. }) if at == *w
            ));
        }
        // A flip in the middle of a page is not seen by simple, but is by full.
        let mut mid = buf.clone();
        mid[2000] ^= 1;
        assert_eq!(
            check_pattern(&mid, 0, 4096, BrwCheck::Simple, BRW_MAGIC, LE),
            Ok(())
        );
        // None and Discard never look.
        assert_eq!(
            check_pattern(&mid, 0, 4096, BrwCheck::None, BRW_MAGIC, LE),
            Ok(())
        );
        assert_eq!(
            check_pattern(&mid, 0, 4096, BrwCheck::Discard, BRW_MAGIC, LE),
            Ok(())
        );
        // Misalignment is refused, as brw_fill_page asserts.
        assert!(matches!(
            fill_pattern(&mut buf[..12], 0, 4096, BrwCheck::Full, BRW_MAGIC, LE),
            Err(SelftestWireError::Misaligned { .. })
        ));
        assert!(matches!(
            check_pattern(&buf, 4, 4096, BrwCheck::Full, BRW_MAGIC, LE),
            Err(SelftestWireError::Misaligned { .. })
        ));
        assert_eq!(brw_page_count(8, 4096, 4096), 2);
        assert_eq!(brw_page_count(0, 1 << 20, 4096), 256);
    }

    // ----- property tests -----

    fn arb_sid() -> impl Strategy<Value = LstSid> {
        (any::<u64>(), any::<i64>()).prop_map(|(n, stamp)| LstSid {
            nid: Nid::from_raw(n),
            stamp,
        })
    }

    fn arb_name() -> impl Strategy<Value = LstName> {
        any::<[u8; 32]>().prop_map(LstName)
    }

    fn arb_params() -> impl Strategy<Value = TestParams> {
        prop_oneof![
            (any::<u32>(), any::<u32>()).prop_map(|(size, flags)| TestParams::Ping { size, flags }),
            (any::<u32>(), any::<u32>(), any::<u32>())
                .prop_map(|(opc, npg, flags)| TestParams::BulkV0 { opc, npg, flags }),
            (any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>()).prop_map(
                |(opc, flags, len, offset)| TestParams::BulkV1 {
                    opc,
                    flags,
                    len,
                    offset
                }
            ),
            (any::<u32>(), any::<[u8; 12]>())
                .prop_filter("typed services", |(s, _)| *s != 11 && *s != 12)
                .prop_map(|(service, raw)| TestParams::Other { service, raw }),
        ]
    }

    fn arb_framework_body() -> impl Strategy<Value = SrpcBody> {
        prop_oneof![
            (any::<u64>(), arb_sid(), any::<u32>(), arb_name()).prop_map(
                |(rpyid, sid, force, name)| {
                    SrpcBody::from(MakeSessionRequest {
                        rpyid,
                        sid,
                        force,
                        name,
                    })
                }
            ),
            (any::<u32>(), arb_sid(), any::<u32>(), arb_name()).prop_map(
                |(status, sid, timeout, name)| SrpcBody::from(MakeSessionReply {
                    status,
                    sid,
                    timeout,
                    name
                })
            ),
            (any::<u64>(), arb_sid())
                .prop_map(|(rpyid, sid)| SrpcBody::from(RemoveSessionRequest { rpyid, sid })),
            (any::<u32>(), arb_sid())
                .prop_map(|(status, sid)| SrpcBody::from(RemoveSessionReply { status, sid })),
            (any::<u64>(), arb_sid(), any::<u64>(), any::<[u32; 3]>()).prop_map(
                |(rpyid, sid, bid, [opc, testidx, arg])| SrpcBody::from(BatchRequest {
                    rpyid,
                    sid,
                    bid: LstBid(bid),
                    opc,
                    testidx,
                    arg
                })
            ),
            (any::<u32>(), arb_sid(), any::<u32>(), any::<u32>()).prop_map(
                |(status, sid, active, time)| SrpcBody::from(BatchReply {
                    status,
                    sid,
                    active,
                    time
                })
            ),
            (any::<u64>(), arb_sid(), any::<u32>()).prop_map(|(rpyid, sid, stat_type)| {
                SrpcBody::from(StatRequest {
                    rpyid,
                    sid,
                    stat_type,
                })
            }),
            (
                any::<u32>(),
                arb_sid(),
                any::<[u32; 10]>(),
                any::<[u32; 7]>(),
                any::<[u64; 6]>()
            )
                .prop_map(|(status, sid, a, l, w)| SrpcBody::from(StatReply {
                    status,
                    sid,
                    fw: SfwCounters {
                        running_ms: a[0],
                        active_batches: a[1],
                        zombie_sessions: a[2],
                        brw_errors: a[3],
                        ping_errors: a[4],
                    },
                    rpc: SrpcCounters {
                        errors: a[5],
                        rpcs_sent: a[6],
                        rpcs_rcvd: a[7],
                        rpcs_dropped: a[8],
                        rpcs_expired: a[9],
                        bulk_get: w[0],
                        bulk_put: w[1],
                    },
                    lnet: LnetCounters {
                        msgs_alloc: l[0],
                        msgs_max: l[1],
                        errors: l[2],
                        send_count: l[3],
                        recv_count: l[4],
                        route_count: l[5],
                        drop_count: l[6],
                        send_length: w[2],
                        recv_length: w[3],
                        route_length: w[4],
                        drop_length: w[5],
                    },
                })),
            (
                any::<[u64; 3]>(),
                arb_sid(),
                any::<[u32; 3]>(),
                any::<(bool, bool)>(),
                arb_params()
            )
                .prop_map(
                    |([rpyid, bulkid, bid], sid, [loop_count, concur, ndest], (c, s), params)| {
                        SrpcBody::from(TestRequest {
                            rpyid,
                            bulkid,
                            sid,
                            bid: LstBid(bid),
                            loop_count,
                            concur,
                            is_client: c,
                            stop_onerr: s,
                            ndest,
                            params,
                        })
                    }
                ),
        ]
    }

    fn arb_other_body() -> impl Strategy<Value = SrpcBody> {
        prop_oneof![
            (any::<u32>(), arb_sid())
                .prop_map(|(status, sid)| SrpcBody::from(TestReply { status, sid })),
            (any::<u64>(), arb_sid(), any::<u32>())
                .prop_map(|(rpyid, sid, flags)| SrpcBody::from(DebugRequest { rpyid, sid, flags })),
            (
                any::<u32>(),
                arb_sid(),
                any::<u32>(),
                any::<u32>(),
                arb_name()
            )
                .prop_map(|(status, sid, timeout, nbatch, name)| SrpcBody::from(
                    DebugReply {
                        status,
                        sid,
                        timeout,
                        nbatch,
                        name
                    }
                )),
            (any::<[u64; 2]>(), any::<[u32; 3]>()).prop_map(
                |([rpyid, bulkid], [rw, len, flags])| {
                    SrpcBody::from(BrwRequest {
                        rpyid,
                        bulkid,
                        rw,
                        len,
                        flags,
                    })
                }
            ),
            any::<u32>().prop_map(|status| SrpcBody::from(BrwReply { status })),
            (any::<u64>(), any::<[u32; 2]>(), any::<[u64; 2]>()).prop_map(
                |(rpyid, [magic, seq], [time_sec, time_nsec])| SrpcBody::from(PingRequest {
                    rpyid,
                    magic,
                    seq,
                    time_sec,
                    time_nsec
                })
            ),
            any::<[u32; 3]>().prop_map(|[status, magic, seq]| SrpcBody::from(PingReply {
                status,
                magic,
                seq
            })),
            (any::<u64>(), arb_sid(), arb_name())
                .prop_map(|(rpyid, sid, group)| SrpcBody::from(JoinRequest { rpyid, sid, group })),
            (any::<u32>(), arb_sid(), any::<u32>(), arb_name()).prop_map(
                |(status, sid, timeout, session)| SrpcBody::from(JoinReply {
                    status,
                    sid,
                    timeout,
                    session
                })
            ),
        ]
    }

    fn arb_msg() -> impl Strategy<Value = SrpcMsg> {
        (
            prop_oneof![arb_framework_body(), arb_other_body()],
            any::<u32>(),
        )
            .prop_map(|(body, feats)| {
                // The BULK_LEN bit must agree with a brw test request's layout.
                let features = match body {
                    SrpcBody::TestRequest(TestRequest {
                        params: TestParams::BulkV0 { .. },
                        ..
                    }) => feats & !LST_FEAT_BULK_LEN,
                    SrpcBody::TestRequest(TestRequest {
                        params: TestParams::BulkV1 { .. },
                        ..
                    }) => feats | LST_FEAT_BULK_LEN,
                    _ => feats,
                };
                SrpcMsg { features, body }
            })
    }

    fn arb_order() -> impl Strategy<Value = ByteOrder> {
        prop_oneof![Just(LE), Just(BE)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn round_trip_every_message(m in arb_msg(), order in arb_order()) {
            let b = emit_msg(&m, order);
            prop_assert_eq!(SrpcMsg::parse(&b), Ok((m, order)));
            // Bytes past the body's end are zero.
            let used = SRPC_HDR_LEN + m.body.len();
            prop_assert!(b[used..].iter().all(|&x| x == 0));
            // The other order gives the same message with every multi-byte field swapped.
            let other = match order { LE => BE, BE => LE };
            let b2 = emit_msg(&m, other);
            prop_assert_eq!(SrpcMsg::parse(&b2), Ok((m, other)));
            let (h, o) = SrpcHeader::parse(&b).unwrap();
            prop_assert_eq!(o, order);
            prop_assert_eq!(h.msg_type, m.msg_type() as u32);
            prop_assert_eq!(h.features, m.features);
        }

        #[test]
        fn every_prefix_is_truncated(m in arb_msg(), order in arb_order(), cut in 0usize..160) {
            let b = emit_msg(&m, order);
            prop_assert_eq!(
                SrpcMsg::parse(&b[..cut]),
                Err(SelftestWireError::Truncated { needed: 160, got: cut })
            );
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = SrpcMsg::parse(&b);
            let _ = SrpcHeader::parse(&b);
            let _ = TestRequest::parse(&b);
            let _ = parse_dest_ids(&b, b.len() / 7, 64, LE);
        }

        #[test]
        fn garbage_with_valid_header_parses_or_errs(
            mut b in proptest::collection::vec(any::<u8>(), 160..200),
            order in arb_order(),
            t in 0u32..20,
        ) {
            order.put_u32(&mut b, 0, SRPC_MSG_MAGIC);
            order.put_u32(&mut b, 4, SRPC_MSG_VERSION);
            order.put_u32(&mut b, 8, t);
            match SrpcMsg::parse(&b) {
                Ok((m, o)) => {
                    prop_assert_eq!(o, order);
                    prop_assert_eq!(m.msg_type() as u32, t);
                    // Re-emitting what we understood parses to the same thing.
                    let b2 = emit_msg(&m, o);
                    prop_assert_eq!(SrpcMsg::parse(&b2), Ok((m, o)));
                }
                Err(e) => prop_assert_eq!(e, SelftestWireError::UnknownMsgType(t)),
            }
        }

        #[test]
        fn pattern_round_trip_and_single_flip(
            words in 1usize..600,
            off_words in 0usize..512,
            flip in any::<prop::sample::Index>(),
            order in arb_order(),
        ) {
            let len = words * 8;
            let offset = off_words * 8;
            let mut buf = vec![0u8; len];
            fill_pattern(&mut buf, offset, 4096, BrwCheck::Full, BRW_MAGIC, order).unwrap();
            prop_assert_eq!(check_pattern(&buf, offset, 4096, BrwCheck::Full, BRW_MAGIC, order), Ok(()));
            let i = flip.index(len);
            buf[i] ^= 0x80;
            let flagged = matches!(
                check_pattern(&buf, offset, 4096, BrwCheck::Full, BRW_MAGIC, order),
                Err(SelftestWireError::BadBulkData { at, .. }) if at == i / 8 * 8
            );
            prop_assert!(flagged);
        }
    }
}
