//! The selftest messages' vocabulary: the protocol's constants, the errors of its codec, the
//! service, message, test and brw enumerations, and the session ids, names and counters the
//! bodies carry (`lnet/selftest/rpc.h`, `selftest.h`, `lnetst.h`).

use core::fmt;

use lnd::wire::{Nid, WireError};

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
            // The length errors read as lnd's wire errors do.
            SelftestWireError::Truncated { needed, got } => {
                WireError::Truncated { needed, got }.fmt(f)
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
                WireError::BufferTooSmall { needed, got }.fmt(f)
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

pub(super) fn check_len(b: &[u8], needed: usize) -> Result<(), SelftestWireError> {
    lnd::wire::need(b, needed, |needed, got| SelftestWireError::Truncated {
        needed,
        got,
    })
}

pub(super) fn check_room(b: &[u8], needed: usize) -> Result<(), SelftestWireError> {
    lnd::wire::need(b, needed, |needed, got| SelftestWireError::BufferTooSmall {
        needed,
        got,
    })
}

// ---------------------------------------------------------------------------------------------
// Enumerations
// ---------------------------------------------------------------------------------------------

lnd::wire_enum! {
    /// Selftest services (`enum srpc_service_type` in rpc.h). The request of a service is sent with
    /// the service id as LNet match bits to [`ServiceId::portal`].
    pub enum ServiceId: from_u32(u32) {
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
}

impl ServiceId {
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

lnd::wire_enum! {
    /// `msg_type` values (`enum srpc_msg_type`): requests are even, each reply is its request + 1.
    pub enum MsgType: from_u32(u32) {
        // One request and its reply a line.
        MakeSessionRequest = 0, MakeSessionReply = 1,
        RemoveSessionRequest = 2, RemoveSessionReply = 3,
        BatchRequest = 4, BatchReply = 5,
        StatRequest = 6, StatReply = 7,
        TestRequest = 8, TestReply = 9,
        DebugRequest = 10, DebugReply = 11,
        BrwRequest = 12, BrwReply = 13,
        PingRequest = 14, PingReply = 15,
        JoinRequest = 16, JoinReply = 17,
    }
}

impl MsgType {
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

lnd::wire_enum! {
    /// Test types of the console's add-test call (`enum lst_test_type` in lnetst.h). They do not
    /// travel in srpc messages themselves: the console turns them into a [`ServiceId`].
    pub enum TestType: from_u32(u32) {
        /// Bulk read/write: service [`ServiceId::Brw`].
        Bulk = 1,
        /// Ping: service [`ServiceId::Ping`].
        Ping = 2,
    }
}

impl TestType {
    /// The service that runs it.
    pub fn service(self) -> ServiceId {
        match self {
            TestType::Bulk => ServiceId::Brw,
            TestType::Ping => ServiceId::Ping,
        }
    }
}

lnd::wire_enum! {
    /// Direction of a brw test (`enum lst_brw_type`), as seen from the client.
    pub enum BrwOp: from_u32(u32) {
        /// The server PUTs the data into the client's sink.
        Read = 1,
        /// The server GETs the data from the client's source.
        Write = 2,
    }

    /// How brw data is checked (`enum lst_brw_flags`).
    pub enum BrwCheck: from_u32(u32) {
        /// No pattern written, none checked.
        None = 1,
        /// First and last 8-byte word of each page segment (see [`fill_pattern`]).
        Simple = 2,
        /// Every 8-byte word.
        Full = 3,
        /// Like `None`, and the receiver may discard the data without copying it (LNET_MD_DISCARD).
        Discard = 4,
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
