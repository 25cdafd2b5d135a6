//! The framework services' bodies (portal 51): sessions, joins, debug queries, batches and
//! stats (`srpc_*_reqst` / `srpc_*_reply` in rpc.h).

use super::codec::{fixed_layouts, BodyLayout, Field, Reader, Writer};
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
}
