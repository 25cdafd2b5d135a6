//! What the world records: how each send ended, what upper layers received, peer events, and
//! the counters of everything the fabric saw.

use super::*;

/// How a message handed to [`World::send`] ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    /// `SendDone` with `Ok`.
    Delivered,
    /// `SendDone` with an error.
    Failed(TxError),
    /// `Endpoint::send` refused it on the spot.
    Refused(SendError),
    /// The sending node had no endpoint (crashed or stopped).
    NodeDown,
    /// The sending node crashed before the message finished.
    LostInCrash,
}

impl SendOutcome {
    /// Whether the message was delivered.
    pub fn is_delivered(self) -> bool {
        self == SendOutcome::Delivered
    }

    /// The outcome as the engine's result, where it has one (`None` for `Refused`, `NodeDown`,
    /// `LostInCrash`).
    pub fn as_result(self) -> Option<Result<(), TxError>> {
        match self {
            SendOutcome::Delivered => Some(Ok(())),
            SendOutcome::Failed(e) => Some(Err(e)),
            _ => None,
        }
    }
}

/// One message handed to [`World::send`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendRecord {
    pub from: NodeId,
    pub to: Nid,
    pub queued_at: Instant,
    /// When and how it finished; `None` while pending.
    pub done: Option<(Instant, SendOutcome)>,
}

/// A message the upper layer of a node received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedMsg {
    pub at: Instant,
    pub from: Nid,
    pub hdr: LnetHdr,
    pub len: usize,
}

/// A peer up/down notification a node's upper layer got.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PeerEvent {
    pub at: Instant,
    pub nid: Nid,
    /// `None` for up, the reason for down.
    pub down: Option<DownReason>,
}

/// The simulator's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Events processed (stale timers included; a stream network step counts one).
    pub events: u64,
    /// Stream reports for a node that is not running (crashed, stopped), dropped.
    pub stream_reports_dropped: u64,
    /// Timer events skipped because the endpoint re-armed earlier or went away.
    pub stale_timers: u64,
    /// Messages delivered into a receive slot.
    pub messages: u64,
    /// Bytes of those messages (o2iblnd messages, headers included).
    pub bytes: u64,
    /// Sends that found no posted receive slot (receiver not ready): credits should prevent it.
    pub rnr: u64,
    /// RDMA writes placed in the peer's region, and their bytes.
    pub rdma_writes: u64,
    pub rdma_bytes: u64,
    /// RDMA writes that completed with `Error` because they fell outside the local or the remote
    /// region (bad key, deregistered, out of bounds).
    pub rdma_errors: u64,
    /// Connected ends destroyed without any disconnect while the peer end stayed connected
    /// (3FS #426).
    pub orphaned: u64,
    /// Events for ends already destroyed (or for a node instance that is gone), dropped.
    pub dropped_late_events: u64,
    /// Passive ends established by their first message before the RTU (COMM_EST).
    pub comm_est: u64,
    /// `Connect` actions.
    pub connects: u64,
    /// Connects chosen to be stuck (no event ever).
    pub stuck_connects: u64,
    /// Connection-manager messages lost.
    pub cm_lost: u64,
    /// Connect requests delivered to an endpoint.
    pub requests: u64,
    /// `Accept` / `Reject` actions.
    pub accepts: u64,
    pub rejects: u64,
    /// Connections established at the active side.
    pub established: u64,
    /// `Disconnect` / `Destroy` actions (repeated disconnects not counted).
    pub disconnects: u64,
    pub destroys: u64,
    /// Send completions by status.
    pub flushed: u64,
    pub retry_exceeded: u64,
    /// Actions naming a connection or request the fabric does not know (engine bugs, or a
    /// request made stale by a crash).
    pub unknown_actions: u64,
    /// `PostRecv` of a slot already posted.
    pub double_posts: u64,
    /// `Send` on an end whose connection is not established yet.
    pub premature_sends: u64,
    /// Node lifecycle.
    pub crashes: u64,
    pub restarts: u64,
    pub shutdowns: u64,
    /// Connections the dropped endpoints still owned (their `Drop` counted them as leaks).
    pub leaked_conns: u64,
    /// Invalid connection transitions counted by endpoints since dropped (crashes, restarts);
    /// [`World::invalid_transitions`] adds the live ones.
    pub invalid_transitions_dropped: u64,
    /// Upper layer: messages handed to `World::send`, and how they finished.
    pub sends: u64,
    pub sends_delivered: u64,
    pub sends_failed: u64,
    pub sends_refused: u64,
    pub sends_lost: u64,
    /// `SendDone` for a cookie that is unknown or already finished (exactly-once violated).
    pub unexpected_send_done: u64,
    /// Messages received by upper layers.
    pub received: u64,
}
