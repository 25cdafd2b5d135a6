//! What the selftest console and the node's selftest service share: lst's commands and replies
//! as the control protocol carries them ([`LstCommand`], [`LstReply`], [`LstError`]), and the
//! console's state, which a node's [`Selftest`](super::Selftest) holds beside its service. Types
//! only: `console.rs` is the console's behaviour and `service.rs` the service's; both use these
//! and neither the other's (they did, a cycle).

use std::collections::{BTreeMap, HashMap, VecDeque};

use lnd::time::{Duration, Instant};
use lnd::wire::{ByteOrder, Nid};
use serde::{Deserialize, Serialize};

use super::srpc::{RpcError, SlotId};
use super::wire::{LstBid, LstSid, SrpcBody};

/// How often the console pings its nodes while a session is open.
pub const PING_INTERVAL: Duration = Duration::from_secs(8);

/// The console's RPC timeout when the session names none (lst's default).
pub const DEFAULT_RPC_TIMEOUT: u32 = 30;

/// A brw test's data check, as lst spells it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckSpec {
    None,
    Simple,
    Full,
}

/// A test, as `lst add_test ... ping` or `... brw read|write size=N check=C off=N` gives it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum TestSpec {
    Ping,
    Brw {
        write: bool,
        size: u32,
        check: CheckSpec,
        #[serde(default)]
        off: u32,
    },
}

/// One of lst's commands (`lnetctl selftest ...`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "cmd")]
pub enum LstCommand {
    NewSession {
        name: String,
        /// Seconds the console waits for a node (its RPC timeout).
        #[serde(default)]
        timeout: Option<u32>,
        #[serde(default)]
        force: bool,
    },
    EndSession,
    ShowSession,
    AddGroup {
        name: String,
        nids: Vec<String>,
    },
    DelGroup {
        name: String,
    },
    ListGroup,
    AddBatch {
        name: String,
    },
    ListBatch,
    AddTest {
        batch: String,
        /// RPCs per unit (`None` or -1: until stopped).
        #[serde(default)]
        loop_count: Option<i64>,
        #[serde(default)]
        concurrency: Option<u32>,
        /// `--distribute D:S`.
        #[serde(default)]
        distribute: Option<(u32, u32)>,
        from: String,
        to: String,
        #[serde(default)]
        stop_onerr: bool,
        test: TestSpec,
    },
    Run {
        batch: String,
    },
    Stop {
        batch: String,
        #[serde(default)]
        force: bool,
    },
    Query {
        batch: String,
    },
    Stat {
        groups: Vec<String>,
    },
    Ping {
        group: String,
    },
    /// The latency of the test RPCs this daemon's own NI ran as a client.
    Latency,
}

/// One node's answer to a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LstNodeResult {
    pub nid: String,
    /// "ok", "busy", "down", or an errno's name.
    pub state: String,
    /// The node's status (a positive errno; 0 ok), if it answered.
    #[serde(default)]
    pub status: Option<u32>,
    #[serde(default)]
    pub error: Option<String>,
    /// For `ping`: the session the node is in.
    #[serde(default)]
    pub detail: Option<String>,
    /// For `query`: the batch's tests active on the node.
    #[serde(default)]
    pub active: Option<u32>,
}

/// One node's counters (a QUERY_STAT reply), with the console's time it came at.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LstNodeStat {
    pub nid: String,
    pub group: String,
    /// Why the node gave none (then every counter is 0).
    #[serde(default)]
    pub error: Option<String>,
    pub running_ms: u32,
    pub active_batches: u32,
    pub brw_errors: u32,
    pub ping_errors: u32,
    pub rpc_errors: u32,
    pub rpcs_sent: u32,
    pub rpcs_rcvd: u32,
    pub rpcs_dropped: u32,
    pub rpcs_expired: u32,
    pub bulk_get: u64,
    pub bulk_put: u64,
    /// Of `rpcs_sent`, the framework RPCs of the console asking (on the console's own node
    /// only; 0 elsewhere): `rpcs_sent - console_rpcs` is the test RPCs the node sent.
    #[serde(default)]
    pub console_rpcs: u32,
    pub send_count: u32,
    pub recv_count: u32,
    pub send_length: u64,
    pub recv_length: u64,
}

/// Latency percentiles of one kind of test RPC, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LstLatency {
    pub test: String,
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

/// A group and its nodes' states.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LstGroupInfo {
    pub name: String,
    pub nodes: Vec<LstNodeResult>,
}

/// A batch and its tests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LstBatchInfo {
    pub name: String,
    pub tests: Vec<String>,
}

/// What a command answers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LstReply {
    /// One line, as lst prints it.
    pub message: String,
    #[serde(default)]
    pub nodes: Vec<LstNodeResult>,
    #[serde(default)]
    pub stats: Vec<LstNodeStat>,
    /// The console's clock when the stats were complete, in milliseconds.
    #[serde(default)]
    pub at_ms: u64,
    #[serde(default)]
    pub groups: Vec<LstGroupInfo>,
    #[serde(default)]
    pub batches: Vec<LstBatchInfo>,
    #[serde(default)]
    pub latency: Vec<LstLatency>,
}

/// Why a command failed as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LstError {
    pub errno: i32,
    pub message: String,
}

impl LstError {
    pub(super) fn new(errno: i32, message: impl Into<String>) -> LstError {
        LstError {
            errno,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for LstError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// How a command started: answered at once, or pending under an id whose answer
/// [`Selftest::poll_console`](super::Selftest::poll_console) gives later.
#[derive(Debug)]
pub enum ConsoleStart {
    Done(Result<LstReply, LstError>),
    Pending(u64),
}

/// The state of a node as the console last saw it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum NodeState {
    Unknown,
    Active,
    Busy,
    Down,
}

impl NodeState {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            NodeState::Unknown => "unknown",
            NodeState::Active => "active",
            NodeState::Busy => "busy",
            NodeState::Down => "down",
        }
    }
}

pub(super) struct ConsoleTest {
    pub(super) from: String,
    pub(super) to: String,
    pub(super) spec: TestSpec,
    pub(super) concurrency: u32,
    pub(super) loop_count: Option<i64>,
    pub(super) distribute: (u32, u32),
    pub(super) stop_onerr: bool,
}

pub(super) struct ConsoleBatch {
    pub(super) bid: LstBid,
    pub(super) tests: Vec<ConsoleTest>,
}

pub(super) struct ConsoleSession {
    pub(super) name: String,
    pub(super) sid: LstSid,
    pub(super) timeout: u32,
    pub(super) features: u32,
    /// `new_session --force`: take nodes from other sessions.
    pub(super) force: bool,
    pub(super) groups: BTreeMap<String, Vec<Nid>>,
    pub(super) state: BTreeMap<Nid, NodeState>,
    pub(super) batches: BTreeMap<String, ConsoleBatch>,
    pub(super) next_bid: u64,
    pub(super) next_ping: Instant,
}

/// What a transaction's answer is made of.
pub(super) enum TxnKind {
    AddGroup {
        name: String,
    },
    /// The first `nservers` nodes are the test's servers (a server-side TEST each, as
    /// lstcon_test_nodes_add sends before the clients'), the rest its clients.
    AddTest {
        batch: String,
        test: ConsoleTest,
        nservers: usize,
    },
    /// End the session on a deleted group's nodes that are in no other group.
    DelGroup {
        name: String,
    },
    Batch {
        opc: u32,
        bid: LstBid,
        arg: u32,
    },
    Stat {
        groups: Vec<String>,
    },
    Ping,
    EndSession,
    KeepAlive,
}

pub(super) struct Txn {
    /// The session it was started in: its answer changes nothing in another.
    pub(super) sid: LstSid,
    pub(super) kind: TxnKind,
    pub(super) nodes: Vec<Nid>,
    pub(super) results: Vec<Option<Result<(SrpcBody, ByteOrder), RpcError>>>,
    pub(super) left: usize,
    pub(super) slots: Vec<SlotId>,
}

/// The console's state (see the module docs).
pub(crate) struct Console {
    pub(super) seed: u64,
    pub(super) session: Option<ConsoleSession>,
    pub(super) txns: HashMap<u64, Txn>,
    pub(super) next_txn: u64,
    pub(super) done: VecDeque<(u64, Result<LstReply, LstError>)>,
}

impl Console {
    pub(crate) fn new(seed: u64) -> Console {
        Console {
            seed,
            session: None,
            txns: HashMap::new(),
            next_txn: 1,
            done: VecDeque::new(),
        }
    }
}
