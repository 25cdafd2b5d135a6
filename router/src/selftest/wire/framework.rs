//! The framework services' bodies (portal 51): sessions, joins, debug queries, batches and
//! stats (`srpc_*_reqst` / `srpc_*_reply` in rpc.h).

use super::codec::{counter_fields, fixed_layouts, BodyLayout, Field, Reader, Writer};
use super::messages::*;

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

/// Remove-session request (`struct srpc_rmsn_reqst`, 24 bytes): `rmsn_rpyid` at 0, `rmsn_sid`
/// at 8.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoveSessionRequest {
    /// Reply match bits.
    pub rpyid: u64,
    /// The session to end.
    pub sid: LstSid,
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

// The counters a stat reply carries, each read and written as one field of the reply (the
// offsets are within `sfw_counters`, `srpc_counters` and `lnet_counters_common`).
counter_fields! {
    SfwCounters {
        running_ms @ 0, active_batches @ 4, zombie_sessions @ 8, brw_errors @ 12,
        ping_errors @ 16,
    }
    SrpcCounters {
        errors @ 0, rpcs_sent @ 4, rpcs_rcvd @ 8, rpcs_dropped @ 12, rpcs_expired @ 16,
        bulk_get @ 20, bulk_put @ 28,
    }
    LnetCounters {
        msgs_alloc @ 0, msgs_max @ 4, errors @ 8, send_count @ 12, recv_count @ 16,
        route_count @ 20, drop_count @ 24, send_length @ 28, recv_length @ 36,
        route_length @ 44, drop_length @ 52,
    }
}

// The bodies above with every field at a fixed offset: their offsets, as in their docs.
fixed_layouts! {
    MakeSessionRequest, 60 { rpyid @ 0, sid @ 8, force @ 24, name @ 28 }
    MakeSessionReply, 56 { status @ 0, sid @ 4, timeout @ 20, name @ 24 }
    RemoveSessionRequest, 24 { rpyid @ 0, sid @ 8 }
    RemoveSessionReply, 20 { status @ 0, sid @ 4 }
    JoinRequest, 56 { rpyid @ 0, sid @ 8, group @ 24 }
    JoinReply, 56 { status @ 0, sid @ 4, timeout @ 20, session @ 24 }
    DebugRequest, 28 { rpyid @ 0, sid @ 8, flags @ 24 }
    DebugReply, 60 { status @ 0, sid @ 4, timeout @ 20, nbatch @ 24, name @ 28 }
    BatchRequest, 44 { rpyid @ 0, sid @ 8, bid @ 24, opc @ 32, testidx @ 36, arg @ 40 }
    BatchReply, 28 { status @ 0, sid @ 4, active @ 20, time @ 24 }
    StatRequest, 28 { rpyid @ 0, sid @ 8, stat_type @ 24 }
    StatReply, 136 { status @ 0, sid @ 4, fw @ 20, rpc @ 40, lnet @ 76 }
}
