//! A deterministic fabric simulator and world harness: many LND endpoints on one simulated RC
//! fabric, in virtual time, with RDMA-shaped faults.
//!
//! A [`World`] holds nodes ([`NodeId`]), each running one [`SimNode`] (or none while it is down):
//! a bare LND [`Endpoint`] by default (`World` is `World<Endpoint>`), or a node built on one, such
//! as an LNet node (`router`'s `sim` feature), that talks to the fabric only through
//! [`crate::fabric`]. It has a virtual clock, one event queue ordered by (time, sequence number)
//! and one seeded RNG. Nothing reads a clock, spawns a thread or does I/O, so a run is a pure function of its seed and of the
//! calls made on the world: every bug found here replays.
//!
//! # The fabric model (RC queue pairs and the connection manager)
//!
//! A connection is a pair of *ends*, one per node, each named by the engine's [`ConnId`]. The
//! simulator keeps, per end: its state, its peer end, the receive slots currently posted, and its
//! send queue.
//!
//! - **Connect**: the end is created with slots `0..recv_slots` posted. After `cm_latency` the
//!   request reaches the target node, whose endpoint gets `handle_connect_request`. The target's
//!   `Accept` sends a reply that reaches the active side after `cm_latency` (active
//!   `handle_established` with the CONNACK); the passive side gets its own `handle_established`
//!   (empty private data) one more `cm_latency` later, when the RTU would arrive, so data from the
//!   active side can beat it (LU-8303). Data that does is itself the proof: as InfiniBand raises
//!   COMM_EST on the passive queue pair and o2iblnd turns it into ESTABLISHED (rdma_notify), the
//!   passive side gets `handle_established` just before that first message, and a lost RTU then
//!   fails nothing. `Reject` reaches the active side as
//!   [`ConnectFailure::Rejected`]. A NID that no node has, a crashed node, a partition, or a lost
//!   CM message make the attempt fail with [`ConnectFailure::Unreachable`] `unreachable_after` after
//!   it started; a node whose endpoint was shut down answers [`ConnectFailure::NoListener`].
//! - **Send**: a message is delivered after `latency` into the peer end's lowest posted slot
//!   (`handle_recv`), and completes with [`WcStatus::Success`] one `latency` later. Messages on one
//!   end are delivered in order and completions are reported in order. No posted slot is an RNR:
//!   counted in [`SimStats::rnr`], completed with [`WcStatus::Error`], and the queue pair goes to
//!   error. A peer end that is gone, closing or across a partition is retried every
//!   `retry_interval`; after `retry_horizon` the send completes with [`WcStatus::RetryExceeded`] and
//!   the queue pair goes to error (what is queued behind it flushes). A partition healed in time
//!   lets the retry succeed.
//! - **RDMA write** ([`FabricAction::RdmaWrite`], or injected by a test with [`World::rdma_write`]):
//!   a work request on the same send queue as the sends, so it is delivered and completed in
//!   posting order with them. Its data takes `len / bandwidth` on the end's link (writes posted
//!   together are serialised) and arrives `latency` later; then the bytes are copied from the local
//!   fragments piece by piece into the peer node's regions registered under the remote
//!   fragments' keys, and the write completes with [`WcStatus::Success`] one `latency` later. A send posted behind a write is delivered only
//!   after the write's data is in place. No receive slot is consumed and the peer's endpoint hears
//!   nothing. A malformed write (see [`FabricAction::RdmaWrite`]), or one with a fragment outside
//!   the local region or outside the remote one (unknown or deregistered key, address below or
//!   past the end) writes nothing (every fragment is checked first), completes with [`WcStatus::Error`]
//!   (counted in [`SimStats::rdma_errors`]) and puts the local queue pair in error (what is queued
//!   behind it flushes); the peer end is left as it is. An unreachable peer and a closing
//!   connection are handled as for sends ([`WcStatus::RetryExceeded`], [`WcStatus::Flushed`]).
//! - **Registered regions**: per node, [`World::registry`] is the node's
//!   [`Registry`]: registering a buffer gives a [`Registration`] (region
//!   id, remote key, address); [`World::region`] reads a region in place. A crash, a reboot or a completed shutdown drops all of the node's regions (the
//!   driver that owned the registrations is gone).
//! - **Disconnect**: the queue pair goes to error (queued sends complete [`WcStatus::Flushed`]);
//!   the peer end gets `handle_disconnected` after `cm_latency` (and its own queue flushes), the
//!   local end gets its own `handle_disconnected` after `2 x cm_latency`. If the peer node is down
//!   or partitioned away (or the DREQ is lost), only the local end hears, after `retry_horizon`
//!   (with [`DisconnectReason::TransportError`]; a DREQ or DREP heard is
//!   [`DisconnectReason::Closed`]). The simulator models no fabric protocol errors.
//!   Each end hears `handle_disconnected` at most once; a second `Disconnect` is a no-op.
//! - **Destroy**: the end is removed; nothing more is reported for it and its pending events are
//!   dropped (counted in [`SimStats::dropped_late_events`]). Destroying a connected end that never
//!   disconnected while its peer end is still connected is the 3FS #426 case: counted in
//!   [`SimStats::orphaned`]; the peer only finds out through its own sends and keepalives.
//!
//! # Faults
//!
//! All random choices come from the world's RNG, seeded by [`SimConfig::seed`]:
//! [`World::stuck_connects`] / [`World::stuck_next_connect`] (an outgoing connect that never gets
//! any event, the LU-7646 mlx5 case), [`World::cm_loss`] and [`World::cm_delay`] (lost or late
//! connection-manager messages), [`World::crash`], [`World::reboot`] and [`World::restart`]
//! (nodes vanishing without a close, coming back with a new incarnation), [`World::shutdown`]
//! (graceful), and [`World::partition`] / [`World::heal`].
//!
//! # The upper-layer model
//!
//! What the world books of a node's events is the node's choice ([`SimNode::book`]). For a bare
//! endpoint, the world plays LNet: every `Received` is logged and handed back with `recv_done`
//! (at once, or after a random delay set by [`World::set_recv_delay`]); every `SendDone` is
//! recorded against its cookie; peer up/down events are logged. [`World::pending_sends`] says how
//! many messages have no outcome yet: "every message ends with a status" is
//! `run_until_idle(..)` returning `true`.
//! A node with its own upper layer (an LNet node) books its peer up/down events and keeps the rest
//! in [`World::node_events`].

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use tracing::{debug, trace};

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::engine::{DownReason, Endpoint, EndpointConfig, LndEvent, RxToken, SendError, TxError};
use crate::fabric::{
    check_rdma_write, rdma_pieces, ConnId, ConnectFailure, DisconnectReason, Fabric, FabricAction,
    FabricEvent, FabricSink, LocalFrag, PrivateData, RegionId, Registration, Registry, RemoteFrag,
    RequestId, WcStatus, WrId,
};
use crate::time::{Duration, Instant};

/// Why an end hears `handle_disconnected`: a DREQ (the peer's, or the DREP to ours) is a close;
/// a DREQ retried to the horizon, or a handshake given up on, is the transport failing.
const CLOSED: DisconnectReason = DisconnectReason::Closed;
const LOST: DisconnectReason = DisconnectReason::TransportError;
use crate::wire::{KibRej, LnetHdr, Nid, RejectReason};

// ---------------------------------------------------------------------------------------------
// Small deterministic helpers

/// A fast, deterministic hasher for the simulator's integer keys (FxHash's mixing step). Unlike
/// std's default it has no per-process random state, which also keeps iteration orders stable.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

const FX_K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(FX_K);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// The simulator's random numbers: splitmix64, seeded. Also lent to tests through
/// [`World::rng`] so that workloads derive from the same seed.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// Uniform in `[0, max]`.
    pub fn duration_up_to(&mut self, max: Duration) -> Duration {
        if max.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_nanos(self.below(max.as_nanos().saturating_add(1)))
        }
    }

    /// True with probability `p` (clamped to [0, 1]). Draws nothing when `p <= 0` or `p >= 1`, so
    /// a fault configured off does not perturb the rest of the run.
    pub fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        if p >= 1.0 {
            return true;
        }
        ((self.next_u64() >> 11) as f64) * (1.0 / (1u64 << 53) as f64) < p
    }
}

/// A set of receive slots: a bitmap with a fast "lowest posted".
#[derive(Clone, Debug, Default)]
struct SlotSet {
    words: Vec<u64>,
    count: u32,
}

impl SlotSet {
    fn with_first(n: u16) -> SlotSet {
        let mut s = SlotSet::default();
        for slot in 0..n {
            s.insert(slot);
        }
        s
    }

    /// Inserts `slot`; false if it was already there.
    fn insert(&mut self, slot: u16) -> bool {
        let (w, b) = (usize::from(slot / 64), slot % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        let bit = 1u64 << b;
        if self.words[w] & bit != 0 {
            return false;
        }
        self.words[w] |= bit;
        self.count += 1;
        true
    }

    /// Removes and returns the lowest slot.
    fn take_lowest(&mut self) -> Option<u16> {
        if self.count == 0 {
            return None;
        }
        for (w, word) in self.words.iter_mut().enumerate() {
            if *word != 0 {
                let b = word.trailing_zeros();
                *word &= !(1u64 << b);
                self.count -= 1;
                return Some((w as u32 * 64 + b) as u16);
            }
        }
        None
    }

    fn len(&self) -> usize {
        self.count as usize
    }
}

// ---------------------------------------------------------------------------------------------
// Public types

/// A node of the simulated world (an index in the order nodes were added).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    fn idx(self) -> usize {
        self.0 as usize
    }
}

/// A partition made by [`World::partition`], for [`World::heal_partition`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PartitionId(u8);

/// What a [`World`] needs from the node it hosts: the bare LND [`Endpoint`] (the default), or
/// anything built on one that talks to the fabric through [`crate::fabric`] (an LNet node).
///
/// The world feeds the node fabric events through its [`FabricSink`] side, applies what
/// [`SimNode::poll_action`] gives to the simulated fabric, runs [`SimNode::handle_timeout`] at
/// [`SimNode::poll_timeout`], and books every [`SimNode::poll_event`] through [`SimNode::book`]
/// (received messages, send outcomes, peer up/down; anything else goes to
/// [`World::node_events`]). A crash drops the node; its [`SimNode::leak_counter`] says how many
/// connections it still owned.
pub trait SimNode: FabricSink + Sized {
    /// What the node is made from; kept by the world to make it again at a restart.
    type Config: Clone;
    /// What the node tells its upper layer.
    type Event;

    /// A fresh node at `now`.
    fn start(cfg: &Self::Config, now: Instant) -> Self;
    /// The NID connects to this node are routed by.
    fn config_nid(cfg: &Self::Config) -> Nid;
    /// The configuration's incarnation.
    fn config_incarnation(cfg: &Self::Config) -> u64;
    /// Makes `cfg` the configuration of the node's next life, with `incarnation`.
    fn reincarnate(cfg: &mut Self::Config, incarnation: u64);

    /// The next fabric action.
    fn poll_action(&mut self) -> Option<FabricAction>;
    /// The next event for the upper layer.
    fn poll_event(&mut self) -> Option<Self::Event>;
    /// What the world books for `ev`.
    fn book(ev: Self::Event) -> Booking<Self::Event>;
    /// A message booked as [`Booking::Received`] with a token is finished with (the world plays
    /// the upper layer that returns it).
    fn recv_done(&mut self, now: Instant, rx: RxToken);
    /// When [`SimNode::handle_timeout`] should next run.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Runs the timers due at `now`.
    fn handle_timeout(&mut self, now: Instant);

    /// Starts a graceful stop.
    fn shutdown(&mut self, now: Instant);
    /// Whether the graceful stop is complete (the world then removes the node).
    fn is_shut_down(&self) -> bool;
    /// A counter that outlives the node: connections it still owned when it was dropped.
    fn leak_counter(&self) -> Arc<AtomicU64>;
    /// Connection state changes the node's LND refused so far.
    fn invalid_transitions(&self) -> u64;
}

/// How the world books one of a node's events ([`SimNode::book`]).
#[derive(Debug)]
pub enum Booking<E> {
    /// A message for the upper layer: logged in [`World::received`]; `rx`, if any, is handed back
    /// with [`SimNode::recv_done`] at once or after the node's receive delay.
    Received {
        from: Nid,
        hdr: LnetHdr,
        len: usize,
        rx: Option<RxToken>,
    },
    /// A message handed to [`World::send`] finished.
    SendDone {
        cookie: u64,
        result: Result<(), TxError>,
    },
    /// A peer came up ([`World::peer_events`]).
    PeerUp { nid: Nid },
    /// A peer went down ([`World::peer_events`]).
    PeerDown { nid: Nid, reason: DownReason },
    /// Anything else: kept in [`World::node_events`] (when `keep_logs`).
    Other(E),
}

impl SimNode for Endpoint {
    type Config = EndpointConfig;
    type Event = LndEvent;

    fn start(cfg: &EndpointConfig, now: Instant) -> Endpoint {
        Endpoint::new(cfg.clone(), now)
    }
    fn config_nid(cfg: &EndpointConfig) -> Nid {
        cfg.nid
    }
    fn config_incarnation(cfg: &EndpointConfig) -> u64 {
        cfg.incarnation
    }
    fn reincarnate(cfg: &mut EndpointConfig, incarnation: u64) {
        cfg.incarnation = incarnation;
        cfg.seed ^= incarnation.rotate_left(17);
    }
    fn poll_action(&mut self) -> Option<FabricAction> {
        Endpoint::poll_action(self)
    }
    fn poll_event(&mut self) -> Option<LndEvent> {
        Endpoint::poll_event(self)
    }
    fn book(ev: LndEvent) -> Booking<LndEvent> {
        match ev {
            LndEvent::Received {
                from,
                hdr,
                payload,
                rx,
            } => Booking::Received {
                from,
                hdr,
                len: payload.len(),
                rx: Some(rx),
            },
            LndEvent::SendDone { cookie, result, .. } => Booking::SendDone { cookie, result },
            LndEvent::PeerUp { nid } => Booking::PeerUp { nid },
            LndEvent::PeerDown { nid, reason } => Booking::PeerDown { nid, reason },
            // The test plays LNet for a rendezvous: it finds these in `World::node_events`.
            ev @ (LndEvent::BulkRequest { .. } | LndEvent::BulkDone { .. }) => Booking::Other(ev),
        }
    }
    fn recv_done(&mut self, now: Instant, rx: RxToken) {
        Endpoint::recv_done(self, now, rx);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Endpoint::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Endpoint::handle_timeout(self, now);
    }
    fn shutdown(&mut self, now: Instant) {
        Endpoint::shutdown(self, now);
    }
    fn is_shut_down(&self) -> bool {
        Endpoint::is_shut_down(self)
    }
    fn leak_counter(&self) -> Arc<AtomicU64> {
        Endpoint::leak_counter(self)
    }
    fn invalid_transitions(&self) -> u64 {
        self.stats().invalid_transitions
    }
}

/// The simulator's parameters. `Default` gives an InfiniBand-like fabric.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Seed of every random choice the world makes.
    pub seed: u64,
    /// One-way latency of a message on a connection (default 2 µs).
    pub latency: Duration,
    /// One-way latency of a connection-manager message (default 20 µs).
    pub cm_latency: Duration,
    /// Link bandwidth for RDMA writes, in bytes per second (default 12.5 GB/s, 100 Gb/s EDR): a
    /// write of `len` bytes occupies its connection's link for `len / bandwidth`. Zero means
    /// unlimited. Sends are small and are not charged.
    pub bandwidth: u64,
    /// How long the transport retries a send to a peer that does not answer before completing it
    /// with `RetryExceeded`; also how long a disconnect towards a vanished peer takes to complete
    /// locally (default 1 s).
    pub retry_horizon: Duration,
    /// How often, within `retry_horizon`, a blocked send is retried (default 100 ms).
    pub retry_interval: Duration,
    /// How long a connect to a down node, across a partition or with a lost CM message takes to
    /// fail with `Unreachable` (default 1 s).
    pub unreachable_after: Duration,
    /// Keep the per-node logs of received messages and peer events, and the records of finished
    /// sends (default true; turn off for very large runs, counters are kept either way).
    pub keep_logs: bool,
    /// The virtual time the world starts at (default zero).
    pub start: Instant,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            seed: 0x5eed,
            latency: Duration::from_micros(2),
            cm_latency: Duration::from_micros(20),
            bandwidth: 12_500_000_000,
            retry_horizon: Duration::from_secs(1),
            retry_interval: Duration::from_millis(100),
            unreachable_after: Duration::from_secs(1),
            keep_logs: true,
            start: Instant::ZERO,
        }
    }
}

impl SimConfig {
    /// The defaults with `seed`.
    pub fn with_seed(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            ..SimConfig::default()
        }
    }
}

/// Where a node is in its life.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum NodeState {
    /// Its endpoint runs.
    Up,
    /// [`World::shutdown`] was called; the endpoint is closing its connections.
    Stopping,
    /// The endpoint shut down and was removed; the host is up, so connects to it are answered
    /// with `NoListener`.
    Stopped,
    /// The host is down (crashed or rebooting): nothing answers.
    Crashed,
}

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
    /// Events processed (stale timers included).
    pub events: u64,
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

/// Node `n`'s memory registration ([`World::registry`]): what its driver would register. Keys
/// and addresses are unique in the world, so a key of a region that is gone (or of another node)
/// never matches a new one. A region lives until it is deregistered, or until the node crashes,
/// reboots or shuts down (the driver that owned the registrations is gone: deregistering it
/// later gives `None`). A write into a deregistered region, or from one, fails with
/// [`WcStatus::Error`].
pub struct NodeRegistry<'a, N: SimNode = Endpoint> {
    w: &'a mut World<N>,
    n: NodeId,
}

impl<N: SimNode> Registry for NodeRegistry<'_, N> {
    /// Fails if the node has no running endpoint (crashed or stopped): there is no driver to
    /// register with.
    fn register(&mut self, bytes: Vec<u8>) -> std::io::Result<Registration> {
        let w = &mut *self.w;
        let node = &mut w.nodes[self.n.idx()];
        if node.ep.is_none() {
            return Err(std::io::Error::other(format!(
                "register on node {} without a running endpoint",
                node.nid
            )));
        }
        w.next_region += 1;
        let id = w.next_region;
        // An odd multiplier is a bijection on u32: distinct ids give distinct keys.
        let key = (id as u32).wrapping_mul(0x9e37_79b1);
        let addr = w.next_region_addr;
        let len = bytes.len() as u64;
        let pages = len.div_ceil(PAGE) + 1;
        w.next_region_addr += pages * PAGE;
        node.rkeys.insert(key, id);
        node.regions.insert(id, Region { key, addr, bytes });
        Ok(Registration::new(RegionId(id), key, addr, len))
    }

    fn read(&self, reg: &Registration, offset: u64, out: &mut [u8]) -> bool {
        let Some(b) = self.w.region(self.n, reg) else {
            return false;
        };
        let Ok(len) = u32::try_from(out.len()) else {
            return false;
        };
        match span(b, offset, len) {
            Some(r) => {
                out.copy_from_slice(&b[r]);
                true
            }
            None => false,
        }
    }

    fn deregister(&mut self, reg: Registration) -> Option<Vec<u8>> {
        let node = &mut self.w.nodes[self.n.idx()];
        let r = node.regions.remove(&reg.id().0)?;
        node.rkeys.remove(&r.key);
        Some(r.bytes)
    }
}

// ---------------------------------------------------------------------------------------------
// Internals

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum EndState {
    /// Active side, waiting for the reply.
    Connecting,
    /// Passive side, accepted (queue pair ready), waiting for the RTU.
    Accepting,
    Established,
    /// Queue pair in error: disconnected, failed, or a fatal completion.
    Error,
}

/// One RDMA write waiting on a send queue.
struct Write {
    local: Vec<LocalFrag>,
    remote: Vec<RemoteFrag>,
    /// Its length; `None` if malformed (refused when it reaches the head of the queue).
    len: Option<u32>,
}

enum WqeOp {
    Send(Vec<u8>),
    Write(Write),
}

struct Wqe {
    wr: WrId,
    op: WqeOp,
    /// When it reaches the peer (if the peer can be reached).
    due: Instant,
}

/// A buffer registered on a node.
struct Region {
    key: u32,
    addr: u64,
    bytes: Vec<u8>,
}

/// A write injected with [`World::rdma_write`] and how it completed.
struct RdmaRecord {
    node: NodeId,
    end: u64,
    status: Option<WcStatus>,
}

/// Where the simulator places registered regions (addresses are only names; a guard page
/// separates regions).
const REGION_BASE: u64 = 0x7f00_0000_0000;
const PAGE: u64 = 4096;

/// The slice `[off, off + len)` of `b`, if it lies inside.
fn span(b: &[u8], off: u64, len: u32) -> Option<std::ops::Range<usize>> {
    let start = usize::try_from(off).ok()?;
    let end = start.checked_add(len as usize)?;
    (end <= b.len()).then_some(start..end)
}

struct End {
    node: NodeId,
    conn: ConnId,
    state: EndState,
    /// The other end, once connected at the fabric level.
    peer: Option<u64>,
    /// The node at the other side (known from the start on both sides, when it exists).
    peer_node: Option<NodeId>,
    posted: SlotSet,
    sq: VecDeque<Wqe>,
    /// When the link is free of the RDMA writes already posted (bandwidth model).
    link_free: Instant,
    pump_at: Option<Instant>,
    retry_deadline: Option<Instant>,
    /// Completions are reported in order: never before this.
    last_cq: Instant,
    disconnect_issued: bool,
    disconnect_reported: bool,
}

struct PendingReq {
    active: u64,
    active_node: NodeId,
    target: NodeId,
    started: Instant,
}

struct Node<N: SimNode> {
    cfg: N::Config,
    /// `cfg`'s NID.
    nid: Nid,
    state: NodeState,
    ep: Option<N>,
    /// Changes whenever the endpoint instance changes, so events for an old one are dropped.
    epoch: u32,
    /// The pending timer event's time (at most one live timer event per node).
    timer_at: Option<Instant>,
    /// The node's ends: ConnId -> end uid.
    ends: FxMap<ConnId, u64>,
    recv_delay: Duration,
    stuck_prob: f64,
    stuck_next: Vec<Nid>,
    received: Vec<ReceivedMsg>,
    received_count: u64,
    peer_events: Vec<PeerEvent>,
    /// Every connect this node started: (when, to whom). Kept even without `keep_logs`.
    connects: Vec<(Instant, Nid)>,
    /// Cookies of this node's unfinished sends.
    pending: FxMap<u64, ()>,
    part_a: u64,
    part_b: u64,
    leaked: u64,
    /// Registered regions by id, and their ids by remote key.
    regions: FxMap<u64, Region>,
    rkeys: FxMap<u32, u64>,
    /// Events booked as [`Booking::Other`], with when (empty unless `keep_logs`).
    events: Vec<(Instant, N::Event)>,
}

enum Ev {
    Timer {
        node: NodeId,
        epoch: u32,
    },
    Request {
        active: u64,
        active_node: NodeId,
        target: NodeId,
        private: PrivateData,
        started: Instant,
    },
    Reply {
        active: u64,
        active_node: NodeId,
        passive: u64,
        passive_node: NodeId,
        private: PrivateData,
        started: Instant,
    },
    Rtu {
        passive: u64,
        active_node: NodeId,
    },
    /// The RTU was lost (or cut): the passive end fails unless data established it meanwhile
    /// (COMM_EST).
    RtuLost {
        passive: u64,
    },
    Rejected {
        active: u64,
        active_node: NodeId,
        passive_node: NodeId,
        private: PrivateData,
        started: Instant,
    },
    ConnFailed {
        end: u64,
        why: ConnectFailure,
    },
    Disconnected {
        end: u64,
        why: DisconnectReason,
    },
    Pump {
        end: u64,
    },
    SendDone {
        end: u64,
        wr: WrId,
        status: WcStatus,
    },
    RecvDone {
        node: NodeId,
        epoch: u32,
        rx: RxToken,
    },
    Restart {
        node: NodeId,
        epoch: u32,
        incarnation: u64,
    },
}

struct Scheduled {
    at: Instant,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest (time, seq) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

// ---------------------------------------------------------------------------------------------
// The world

/// Many nodes on one simulated fabric, in virtual time: bare LND endpoints by default, or any
/// [`SimNode`]. See the module documentation.
pub struct World<N: SimNode = Endpoint> {
    cfg: SimConfig,
    now: Instant,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    /// Events in the queue other than timers.
    in_flight: u64,
    rng: SimRng,
    nodes: Vec<Node<N>>,
    by_nid: FxMap<Nid, NodeId>,
    ends: FxMap<u64, End>,
    next_uid: u64,
    reqs: FxMap<u64, PendingReq>,
    next_req: u64,
    cm_loss: f64,
    cm_delay: Duration,
    partitions_used: u64,
    sends: FxMap<u64, SendRecord>,
    next_cookie: u64,
    pending_sends: usize,
    next_region: u64,
    next_region_addr: u64,
    next_rdma: u64,
    rdma: FxMap<u64, RdmaRecord>,
    /// CONN_RACE rejects carried, per unordered pair of nodes (lower id first).
    race_rejects: FxMap<(u32, u32), u64>,
    stats: SimStats,
}

impl World {
    /// An empty world of LND endpoints at `cfg.start`.
    pub fn new(cfg: SimConfig) -> World {
        World::hosting(cfg)
    }

    /// Node `n`'s endpoint, if it runs.
    pub fn endpoint(&self, n: NodeId) -> Option<&Endpoint> {
        self.node(n)
    }

    /// Node `n`'s endpoint, mutably. If you give it an input, call [`World::poll_node`] afterwards
    /// so its actions and events are processed (or use [`World::with_endpoint`], which does).
    pub fn endpoint_mut(&mut self, n: NodeId) -> Option<&mut Endpoint> {
        self.node_mut(n)
    }

    /// Runs `f` on node `n`'s endpoint with the current time, then processes whatever it produced.
    /// (To stop a node use [`World::shutdown`], which also retires the endpoint once it is shut
    /// down; `Endpoint::shutdown` called through here does not.)
    pub fn with_endpoint<R>(
        &mut self,
        n: NodeId,
        f: impl FnOnce(&mut Endpoint, Instant) -> R,
    ) -> Option<R> {
        self.with_node(n, f)
    }

    // ------------------------------------------------------------------ upper layer

    /// Node `from` sends an LNet message to `to` now. Returns the cookie under which its outcome
    /// is recorded; a refusal by `Endpoint::send` (or a node without endpoint) is recorded as the
    /// outcome at once.
    pub fn send(&mut self, from: NodeId, to: Nid, hdr: LnetHdr, payload: Vec<u8>) -> u64 {
        self.start_send(from, to, |ep, now, cookie| {
            ep.send(now, to, hdr, payload, cookie)
        })
    }

    /// Node `from` PUTs the registered fragments `src` to `to` by rendezvous
    /// (`Endpoint::send_put_rdma`); recorded as [`World::send`] records its messages. The sink's
    /// side is the test's to play: its `LndEvent::BulkRequest` is in [`World::node_events`].
    pub fn send_put_rdma(
        &mut self,
        from: NodeId,
        to: Nid,
        hdr: LnetHdr,
        src: Vec<crate::fabric::LocalFrag>,
    ) -> u64 {
        self.start_send(from, to, |ep, now, cookie| {
            ep.send_put_rdma(now, to, hdr, src, cookie)
        })
    }

    /// Records a send from `from` to `to` under a new cookie and starts it with `start`; a
    /// refusal (or a node without endpoint) is its outcome at once.
    fn start_send(
        &mut self,
        from: NodeId,
        to: Nid,
        start: impl FnOnce(&mut Endpoint, Instant, u64) -> Result<(), SendError>,
    ) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.stats.sends += 1;
        self.sends.insert(
            cookie,
            SendRecord {
                from,
                to,
                queued_at: self.now,
                done: None,
            },
        );
        self.pending_sends += 1;
        let now = self.now;
        let node = &mut self.nodes[from.idx()];
        let Some(ep) = node.ep.as_mut() else {
            self.finish_send(cookie, SendOutcome::NodeDown);
            return cookie;
        };
        trace!(at = %now, from = %node.nid, %to, cookie, "send");
        match start(ep, now, cookie) {
            Ok(()) => {
                node.pending.insert(cookie, ());
            }
            Err(e) => self.finish_send(cookie, SendOutcome::Refused(e)),
        }
        self.drain(from, false);
        cookie
    }
}

impl<N: SimNode> World<N> {
    // ------------------------------------------------------------------ construction, queries

    /// An empty world of `N` nodes at `cfg.start` (`World::new` for endpoints).
    pub fn hosting(cfg: SimConfig) -> World<N> {
        World {
            now: cfg.start,
            seq: 0,
            queue: BinaryHeap::new(),
            in_flight: 0,
            rng: SimRng::new(cfg.seed),
            nodes: Vec::new(),
            by_nid: FxMap::default(),
            ends: FxMap::default(),
            next_uid: 1,
            reqs: FxMap::default(),
            next_req: 1,
            cm_loss: 0.0,
            cm_delay: Duration::ZERO,
            partitions_used: 0,
            sends: FxMap::default(),
            next_cookie: 1,
            pending_sends: 0,
            next_region: 0,
            next_region_addr: REGION_BASE,
            next_rdma: 0,
            rdma: FxMap::default(),
            race_rejects: FxMap::default(),
            stats: SimStats::default(),
            cfg,
        }
    }

    /// Adds a node and starts it now. Connects to its NID are routed to it.
    ///
    /// # Panics
    /// If another node already has that NID.
    pub fn add_node(&mut self, cfg: N::Config) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        let nid = N::config_nid(&cfg);
        let prev = self.by_nid.insert(nid, id);
        assert!(prev.is_none(), "two simulated nodes with NID {nid}");
        self.nodes.push(Node {
            cfg,
            nid,
            state: NodeState::Crashed,
            ep: None,
            epoch: 0,
            timer_at: None,
            ends: FxMap::default(),
            recv_delay: Duration::ZERO,
            stuck_prob: 0.0,
            stuck_next: Vec::new(),
            received: Vec::new(),
            received_count: 0,
            peer_events: Vec::new(),
            connects: Vec::new(),
            pending: FxMap::default(),
            part_a: 0,
            part_b: 0,
            leaked: 0,
            regions: FxMap::default(),
            rkeys: FxMap::default(),
            events: Vec::new(),
        });
        self.start_node(id);
        id
    }

    /// The simulator's configuration.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// Virtual now.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The world's RNG, for workloads that should derive from the same seed.
    pub fn rng(&mut self) -> &mut SimRng {
        &mut self.rng
    }

    /// Number of nodes ever added.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Every node id.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    /// The node that has `nid`.
    pub fn node_of(&self, nid: Nid) -> Option<NodeId> {
        self.by_nid.get(&nid).copied()
    }

    /// The NID of node `n`.
    pub fn nid_of(&self, n: NodeId) -> Nid {
        self.nodes[n.idx()].nid
    }

    /// Where node `n` is in its life.
    pub fn node_state(&self, n: NodeId) -> NodeState {
        self.nodes[n.idx()].state
    }

    /// Node `n`'s running instance, if it runs.
    pub fn node(&self, n: NodeId) -> Option<&N> {
        self.nodes.get(n.idx())?.ep.as_ref()
    }

    /// Node `n`'s running instance, mutably. If you give it an input, call [`World::poll_node`]
    /// afterwards so its actions and events are processed (or use [`World::with_node`], which
    /// does).
    pub fn node_mut(&mut self, n: NodeId) -> Option<&mut N> {
        self.nodes.get_mut(n.idx())?.ep.as_mut()
    }

    /// Runs `f` on node `n`'s running instance with the current time, then processes whatever it
    /// produced. (To stop a node use [`World::shutdown`], which also retires it once it is shut
    /// down; a shutdown called through here does not.)
    pub fn with_node<R>(&mut self, n: NodeId, f: impl FnOnce(&mut N, Instant) -> R) -> Option<R> {
        let now = self.now;
        let r = f(self.nodes.get_mut(n.idx())?.ep.as_mut()?, now);
        self.drain(n, false);
        Some(r)
    }

    /// Processes node `n`'s pending actions and events and re-arms its timer.
    pub fn poll_node(&mut self, n: NodeId) {
        self.drain(n, false);
    }

    /// Counters.
    pub fn stats(&self) -> &SimStats {
        &self.stats
    }

    /// Messages received by node `n`'s upper layer, in order (empty unless `keep_logs`).
    pub fn received(&self, n: NodeId) -> &[ReceivedMsg] {
        &self.nodes[n.idx()].received
    }

    /// How many messages node `n`'s upper layer received (kept even without `keep_logs`).
    pub fn received_count(&self, n: NodeId) -> u64 {
        self.nodes[n.idx()].received_count
    }

    /// Peer up/down events node `n`'s upper layer got, in order (empty unless `keep_logs`).
    pub fn peer_events(&self, n: NodeId) -> &[PeerEvent] {
        &self.nodes[n.idx()].peer_events
    }

    /// Node `n`'s events booked as [`Booking::Other`] (all its instances), with when, in order
    /// (empty unless `keep_logs`; an endpoint has none).
    pub fn node_events(&self, n: NodeId) -> &[(Instant, N::Event)] {
        &self.nodes[n.idx()].events
    }

    /// Every active connect node `n` started (all its endpoint instances): when, and to which NID.
    /// Kept even without `keep_logs` (connect storms are what the simulator is for).
    pub fn connect_log(&self, n: NodeId) -> &[(Instant, Nid)] {
        &self.nodes[n.idx()].connects
    }

    /// Connections that node `n`'s dropped endpoints still owned (crashes).
    pub fn leaked_conns(&self, n: NodeId) -> u64 {
        self.nodes[n.idx()].leaked
    }

    /// CONN_RACE rejects the fabric has carried between `a` and `b`, in both directions
    /// together (each counted when the passive side sends it, whether or not it arrives).
    pub fn race_rejects_between(&self, a: NodeId, b: NodeId) -> u64 {
        let key = (a.0.min(b.0), a.0.max(b.0));
        self.race_rejects.get(&key).copied().unwrap_or(0)
    }

    /// Every pair of nodes that exchanged CONN_RACE rejects, with the count (lower id first).
    pub fn race_rejects_by_pair(&self) -> impl Iterator<Item = ((NodeId, NodeId), u64)> + '_ {
        self.race_rejects
            .iter()
            .map(|(&(a, b), &n)| ((NodeId(a), NodeId(b)), n))
    }

    /// How the message with `cookie` finished, and when; `None` while pending (or if unknown, or
    /// finished while `keep_logs` was off).
    pub fn outcome(&self, cookie: u64) -> Option<(Instant, SendOutcome)> {
        self.sends.get(&cookie)?.done
    }

    /// The record of the message with `cookie`.
    pub fn send_record(&self, cookie: u64) -> Option<&SendRecord> {
        self.sends.get(&cookie)
    }

    /// Connection state changes any endpoint's transition table refused, live or dropped.
    pub fn invalid_transitions(&self) -> u64 {
        self.stats.invalid_transitions_dropped
            + self
                .nodes
                .iter()
                .filter_map(|n| n.ep.as_ref())
                .map(|e| e.invalid_transitions())
                .sum::<u64>()
    }

    /// Messages handed to [`World::send`] that have no outcome yet.
    pub fn pending_sends(&self) -> usize {
        self.pending_sends
    }

    /// Fabric ends (connection halves) that exist now, over all nodes.
    pub fn live_ends(&self) -> usize {
        self.ends.len()
    }

    /// Fabric ends that node `n` holds now.
    pub fn ends_of(&self, n: NodeId) -> usize {
        self.nodes[n.idx()].ends.len()
    }

    /// Receive slots posted on node `n`'s end for `conn` (`None` if the fabric has no such end).
    pub fn posted_slots(&self, n: NodeId, conn: ConnId) -> Option<usize> {
        let uid = self.nodes[n.idx()].ends.get(&conn)?;
        Some(self.ends.get(uid)?.posted.len())
    }

    /// Events in the queue that are not timers (messages, CM traffic, completions, ...).
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Whether nothing is in flight and no message is pending (only timers remain).
    pub fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.pending_sends == 0
    }

    /// When the next event is due.
    pub fn next_event_at(&self) -> Option<Instant> {
        self.queue.peek().map(|s| s.at)
    }

    // ------------------------------------------------------------------ upper layer

    /// Node `n`'s upper layer returns received messages after a random delay in `[0, max]`
    /// instead of at once (zero restores "at once"). Varies repost and credit-return schedules.
    pub fn set_recv_delay(&mut self, n: NodeId, max: Duration) {
        self.nodes[n.idx()].recv_delay = max;
    }

    // ------------------------------------------------------------------ registered memory, RDMA

    /// Node `n`'s memory registration, as its driver would do it (ibv_reg_mr): see
    /// [`NodeRegistry`].
    pub fn registry(&mut self, n: NodeId) -> NodeRegistry<'_, N> {
        NodeRegistry { w: self, n }
    }

    /// The contents of node `n`'s region `reg`, in place (`None` if it is not registered there).
    pub fn region(&self, n: NodeId, reg: &Registration) -> Option<&[u8]> {
        Some(&self.nodes[n.idx()].regions.get(&reg.id().0)?.bytes)
    }

    /// Node `from` posts an RDMA write on its connection `conn`, as if its endpoint had emitted
    /// [`FabricAction::RdmaWrite`] (the engine does not drive bulk data yet): the fragments
    /// `local` go onto the fragments `remote` on the peer. The write goes through the same
    /// path as the engine's actions; its completion is recorded ([`World::rdma_status`]) and then
    /// handed to the endpoint's `handle_send_complete`, which ignores a WrId it does not know.
    ///
    /// The returned WrId has its top bit set and its low 32 bits all ones (see [`WrId::injected`]), so
    /// it cannot be taken for one of the engine's. A write on a connection the fabric does not
    /// know is counted in [`SimStats::unknown_actions`] and never completes. The engine is not
    /// told when such a write puts the queue pair in error.
    pub fn rdma_write(
        &mut self,
        from: NodeId,
        conn: ConnId,
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
    ) -> WrId {
        self.next_rdma += 1;
        let wr = WrId::injected(self.next_rdma);
        if let Some(end) = self.end_uid(from, conn) {
            self.rdma.insert(
                wr.0,
                RdmaRecord {
                    node: from,
                    end,
                    status: None,
                },
            );
        }
        self.apply(
            from,
            FabricAction::RdmaWrite {
                conn,
                wr,
                local,
                remote,
            },
        );
        wr
    }

    /// How node `n`'s write `wr` (from [`World::rdma_write`]) completed; `None` while it has not
    /// (or if its connection was destroyed first, or `wr` is not one of `n`'s).
    pub fn rdma_status(&self, n: NodeId, wr: WrId) -> Option<WcStatus> {
        self.rdma.get(&wr.0).filter(|r| r.node == n)?.status
    }

    // ------------------------------------------------------------------ running

    /// Processes the next event. False if there is none.
    pub fn step(&mut self) -> bool {
        let Some(s) = self.queue.pop() else {
            return false;
        };
        if s.at > self.now {
            self.now = s.at;
        }
        self.stats.events += 1;
        if !matches!(s.ev, Ev::Timer { .. }) {
            self.in_flight -= 1;
        }
        self.dispatch(s.at, s.ev);
        true
    }

    /// Processes every event due at or before `t`, then sets the clock to `t` (if later).
    pub fn run_until(&mut self, t: Instant) {
        while self.queue.peek().is_some_and(|s| s.at <= t) {
            self.step();
        }
        if t > self.now {
            self.now = t;
        }
    }

    /// [`World::run_until`] `now + d`.
    pub fn run_for(&mut self, d: Duration) {
        let t = self.now + d;
        self.run_until(t);
    }

    /// Runs until the world is idle ([`World::is_idle`]: nothing in flight, every message
    /// finished; timers may remain) or the next event is after `limit` (then the clock is set to
    /// `limit`). Returns whether it became idle. Endpoints reap failed connections on their next
    /// timer tick, so run a little longer (`run_for`) before checking that fabric ends are gone.
    pub fn run_until_idle(&mut self, limit: Instant) -> bool {
        loop {
            if self.is_idle() {
                return true;
            }
            match self.queue.peek() {
                Some(s) if s.at <= limit => {
                    self.step();
                }
                _ => {
                    if limit > self.now {
                        self.now = limit;
                    }
                    return self.is_idle();
                }
            }
        }
    }

    // ------------------------------------------------------------------ faults and lifecycle

    /// Each outgoing connect of node `n` is, with probability `p`, stuck: it never produces any
    /// event (the LU-7646 mlx5 case). Only the engine's connect deadline can end it.
    pub fn stuck_connects(&mut self, n: NodeId, p: f64) {
        self.nodes[n.idx()].stuck_prob = p;
    }

    /// Node `n`'s next connect to `to` is stuck (one-shot; stacks).
    pub fn stuck_next_connect(&mut self, n: NodeId, to: Nid) {
        self.nodes[n.idx()].stuck_next.push(to);
    }

    /// Each connection-manager message (request, reply, reject, disconnect request) is lost with
    /// probability `p`: a lost connect exchange fails with `Unreachable` after
    /// `unreachable_after`; a lost disconnect request is never heard by the peer.
    pub fn cm_loss(&mut self, p: f64) {
        self.cm_loss = p;
    }

    /// Each connection-manager message takes an extra random delay in `[0, max]`.
    pub fn cm_delay(&mut self, max: Duration) {
        self.cm_delay = max;
    }

    /// Cuts `a` from `b`: nothing passes between a node of `a` and a node of `b` (CM messages and
    /// data alike) until healed. Up to 64 partitions at once.
    ///
    /// # Panics
    /// If 64 partitions are already in force.
    pub fn partition(&mut self, a: &[NodeId], b: &[NodeId]) -> PartitionId {
        let k = (!self.partitions_used).trailing_zeros();
        assert!(k < 64, "at most 64 partitions at once");
        self.partitions_used |= 1 << k;
        for n in a {
            self.nodes[n.idx()].part_a |= 1 << k;
        }
        for n in b {
            self.nodes[n.idx()].part_b |= 1 << k;
        }
        debug!(at = %self.now, id = k, a = a.len(), b = b.len(), "partition");
        PartitionId(k as u8)
    }

    /// Ends one partition.
    pub fn heal_partition(&mut self, id: PartitionId) {
        let bit = !(1u64 << id.0);
        self.partitions_used &= bit;
        for node in &mut self.nodes {
            node.part_a &= bit;
            node.part_b &= bit;
        }
        debug!(at = %self.now, id = id.0, "partition healed");
    }

    /// Ends every partition.
    pub fn heal(&mut self) {
        self.partitions_used = 0;
        for node in &mut self.nodes {
            node.part_a = 0;
            node.part_b = 0;
        }
        debug!(at = %self.now, "all partitions healed");
    }

    /// Node `n` vanishes without closing anything: its endpoint is dropped (its `Drop` logs and
    /// counts the connections it still owned, see [`World::leaked_conns`]) and all its fabric ends
    /// vanish; its unfinished sends are recorded as [`SendOutcome::LostInCrash`]. Peers find out
    /// through their own sends, keepalives and connects. A no-op if the host is already down.
    pub fn crash(&mut self, n: NodeId) {
        if self.nodes[n.idx()].state == NodeState::Crashed {
            return;
        }
        debug!(at = %self.now, node = %self.nid_of(n), "crash");
        self.stats.crashes += 1;
        self.take_down(n, NodeState::Crashed);
    }

    /// Crashes node `n` now and restarts it after `down_for` with the same configuration and
    /// `new_incarnation`.
    pub fn reboot(&mut self, n: NodeId, down_for: Duration, new_incarnation: u64) {
        self.crash(n);
        let epoch = self.nodes[n.idx()].epoch;
        self.push(
            self.now + down_for,
            Ev::Restart {
                node: n,
                epoch,
                incarnation: new_incarnation,
            },
        );
    }

    /// Starts a fresh endpoint on a crashed or stopped node now, with `new_incarnation`. Returns
    /// false (and does nothing) if the node's endpoint runs.
    pub fn restart(&mut self, n: NodeId, new_incarnation: u64) -> bool {
        let node = &mut self.nodes[n.idx()];
        if !matches!(node.state, NodeState::Crashed | NodeState::Stopped) {
            return false;
        }
        N::reincarnate(&mut node.cfg, new_incarnation);
        self.stats.restarts += 1;
        self.start_node(n);
        true
    }

    /// Graceful stop: `Endpoint::shutdown` now; once the endpoint reports `is_shut_down` it is
    /// removed and the node is [`NodeState::Stopped`].
    pub fn shutdown(&mut self, n: NodeId) {
        let now = self.now;
        let node = &mut self.nodes[n.idx()];
        if node.state != NodeState::Up {
            return;
        }
        let Some(ep) = node.ep.as_mut() else {
            return;
        };
        debug!(at = %now, node = %node.nid, "shutdown");
        self.stats.shutdowns += 1;
        node.state = NodeState::Stopping;
        ep.shutdown(now);
        self.drain(n, false);
    }

    // ------------------------------------------------------------------ internals: plumbing

    fn push(&mut self, at: Instant, ev: Ev) {
        let at = at.max(self.now);
        if !matches!(ev, Ev::Timer { .. }) {
            self.in_flight += 1;
        }
        let seq = self.seq;
        self.seq += 1;
        self.queue.push(Scheduled { at, seq, ev });
    }

    /// One connection-manager message's delay, or `None` if it is lost.
    fn cm_hop(&mut self) -> Option<Duration> {
        if self.rng.chance(self.cm_loss) {
            self.stats.cm_lost += 1;
            return None;
        }
        Some(self.cfg.cm_latency + self.rng.duration_up_to(self.cm_delay))
    }

    fn blocked(&self, x: NodeId, y: NodeId) -> bool {
        if x == y || self.partitions_used == 0 {
            return false;
        }
        let (a, b) = (&self.nodes[x.idx()], &self.nodes[y.idx()]);
        (a.part_a & b.part_b) | (a.part_b & b.part_a) != 0
    }

    /// Whether node `n`'s host answers connection-manager traffic from `from`.
    fn host_reachable(&self, from: NodeId, n: NodeId) -> bool {
        self.nodes[n.idx()].state != NodeState::Crashed && !self.blocked(from, n)
    }

    fn start_node(&mut self, n: NodeId) {
        let now = self.now;
        let node = &mut self.nodes[n.idx()];
        node.epoch = node.epoch.wrapping_add(1);
        node.state = NodeState::Up;
        node.timer_at = None;
        node.ep = Some(N::start(&node.cfg, now));
        debug!(at = %now, node = %node.nid, incarnation = N::config_incarnation(&node.cfg),
               "node up");
        self.drain(n, false);
    }

    /// Removes node `n`'s endpoint and every end it had.
    fn take_down(&mut self, n: NodeId, state: NodeState) {
        let now = self.now;
        let node = &mut self.nodes[n.idx()];
        node.state = state;
        node.epoch = node.epoch.wrapping_add(1);
        node.timer_at = None;
        let mut leaked = 0;
        if let Some(ep) = node.ep.take() {
            self.stats.invalid_transitions_dropped += ep.invalid_transitions();
            let leaks = ep.leak_counter();
            drop(ep);
            leaked = leaks.load(std::sync::atomic::Ordering::Relaxed);
            node.leaked += leaked;
        }
        node.regions.clear();
        node.rkeys.clear();
        let ends: Vec<u64> = node.ends.drain().map(|(_, uid)| uid).collect();
        let mut pending: Vec<u64> = node.pending.drain().map(|(c, ())| c).collect();
        pending.sort_unstable();
        self.stats.leaked_conns += leaked;
        for uid in ends {
            self.ends.remove(&uid);
        }
        for cookie in pending {
            self.finish_send(cookie, SendOutcome::LostInCrash);
        }
        // Requests this node received but never answered: the requester times out.
        let mut orphan_reqs: Vec<u64> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.target == n)
            .map(|(&id, _)| id)
            .collect();
        orphan_reqs.sort_unstable();
        for id in orphan_reqs {
            if let Some(r) = self.reqs.remove(&id) {
                let at = now.max(r.started + self.cfg.unreachable_after);
                self.push(
                    at,
                    Ev::ConnFailed {
                        end: r.active,
                        why: ConnectFailure::Unreachable,
                    },
                );
            }
        }
    }

    fn finish_send(&mut self, cookie: u64, outcome: SendOutcome) {
        let now = self.now;
        let Some(rec) = self.sends.get_mut(&cookie) else {
            self.stats.unexpected_send_done += 1;
            return;
        };
        if rec.done.is_some() {
            self.stats.unexpected_send_done += 1;
            return;
        }
        rec.done = Some((now, outcome));
        let from = rec.from;
        self.pending_sends -= 1;
        match outcome {
            SendOutcome::Delivered => self.stats.sends_delivered += 1,
            SendOutcome::Failed(_) => self.stats.sends_failed += 1,
            SendOutcome::Refused(_) | SendOutcome::NodeDown => self.stats.sends_refused += 1,
            SendOutcome::LostInCrash => self.stats.sends_lost += 1,
        }
        self.nodes[from.idx()].pending.remove(&cookie);
        if !self.cfg.keep_logs {
            self.sends.remove(&cookie);
        }
    }

    /// After an input to node `n`: apply its actions, play its upper layer, re-arm its timer, and
    /// retire it if a shutdown completed. `after_timer` means the input was a timer at `now`.
    fn drain(&mut self, n: NodeId, after_timer: bool) {
        loop {
            let Some(ep) = self.nodes[n.idx()].ep.as_mut() else {
                return;
            };
            if let Some(a) = ep.poll_action() {
                self.apply(n, a);
                continue;
            }
            if let Some(e) = ep.poll_event() {
                self.upper(n, e);
                continue;
            }
            break;
        }
        let now = self.now;
        let node = &mut self.nodes[n.idx()];
        let Some(ep) = node.ep.as_ref() else {
            return;
        };
        if node.state == NodeState::Stopping && ep.is_shut_down() {
            debug!(at = %now, node = %node.nid, "shut down");
            if !node.ends.is_empty() {
                debug!(node = %node.nid, ends = node.ends.len(), "ends left after shutdown");
            }
            self.take_down(n, NodeState::Stopped);
            return;
        }
        // Re-arm: keep at most one pending timer event, the earliest wanted. A later deadline
        // leaves the earlier event in place (a spurious handle_timeout is harmless).
        if let Some(deadline) = ep.poll_timeout() {
            let floor = if after_timer {
                now + Duration::from_nanos(1)
            } else {
                now
            };
            let at = deadline.max(floor);
            if node.timer_at.is_none_or(|t| at < t) {
                node.timer_at = Some(at);
                let epoch = node.epoch;
                self.push(at, Ev::Timer { node: n, epoch });
            }
        }
    }

    /// The upper-layer model (LNet, for a bare endpoint) of node `n`: books `ev`.
    fn upper(&mut self, n: NodeId, ev: N::Event) {
        let now = self.now;
        let keep = self.cfg.keep_logs;
        match N::book(ev) {
            Booking::Received { from, hdr, len, rx } => {
                self.stats.received += 1;
                let node = &mut self.nodes[n.idx()];
                node.received_count += 1;
                trace!(at = %now, node = %node.nid, %from, len, "received");
                if keep {
                    node.received.push(ReceivedMsg {
                        at: now,
                        from,
                        hdr,
                        len,
                    });
                }
                let Some(rx) = rx else {
                    return;
                };
                let max = node.recv_delay;
                if max.is_zero() {
                    if let Some(ep) = node.ep.as_mut() {
                        ep.recv_done(now, rx);
                    }
                } else {
                    let epoch = node.epoch;
                    let d = self.rng.duration_up_to(max);
                    self.push(now + d, Ev::RecvDone { node: n, epoch, rx });
                }
            }
            Booking::SendDone { cookie, result } => {
                let outcome = match result {
                    Ok(()) => SendOutcome::Delivered,
                    Err(e) => SendOutcome::Failed(e),
                };
                trace!(at = %now, node = %self.nodes[n.idx()].nid, cookie, ?outcome, "send done");
                if self.nodes[n.idx()].pending.remove(&cookie).is_none() {
                    self.stats.unexpected_send_done += 1;
                    return;
                }
                self.finish_send(cookie, outcome);
            }
            Booking::PeerUp { nid } => {
                let node = &mut self.nodes[n.idx()];
                debug!(at = %now, node = %node.nid, peer = %nid, "peer up");
                if keep {
                    node.peer_events.push(PeerEvent {
                        at: now,
                        nid,
                        down: None,
                    });
                }
            }
            Booking::PeerDown { nid, reason } => {
                let node = &mut self.nodes[n.idx()];
                debug!(at = %now, node = %node.nid, peer = %nid, ?reason, "peer down");
                if keep {
                    node.peer_events.push(PeerEvent {
                        at: now,
                        nid,
                        down: Some(reason),
                    });
                }
            }
            Booking::Other(ev) => {
                if keep {
                    self.nodes[n.idx()].events.push((now, ev));
                }
            }
        }
    }

    fn end_uid(&self, n: NodeId, conn: ConnId) -> Option<u64> {
        self.nodes[n.idx()].ends.get(&conn).copied()
    }

    fn new_end(&mut self, n: NodeId, conn: ConnId, state: EndState, slots: u16) -> u64 {
        let uid = self.next_uid;
        self.next_uid += 1;
        self.ends.insert(
            uid,
            End {
                node: n,
                conn,
                state,
                peer: None,
                peer_node: None,
                posted: SlotSet::with_first(slots),
                sq: VecDeque::new(),
                link_free: self.now,
                pump_at: None,
                retry_deadline: None,
                last_cq: self.now,
                disconnect_issued: false,
                disconnect_reported: false,
            },
        );
        if let Some(old) = self.nodes[n.idx()].ends.insert(conn, uid) {
            // The engine reused a live ConnId: drop the old end rather than confuse the two.
            self.stats.unknown_actions += 1;
            self.ends.remove(&old);
        }
        uid
    }

    // ------------------------------------------------------------------ internals: actions

    /// Applies one action of node `n` to the fabric. Never calls into an endpoint.
    fn apply(&mut self, n: NodeId, action: FabricAction) {
        let now = self.now;
        NodeFabric { w: self, n }.apply(now, action);
    }

    /// Queues a send or an RDMA write of node `n` on `conn`'s send queue.
    fn post(&mut self, n: NodeId, conn: ConnId, wr: WrId, op: WqeOp) {
        let now = self.now;
        let Some(uid) = self.end_uid(n, conn) else {
            self.stats.unknown_actions += 1;
            debug!(node = %self.nid_of(n), ?conn, "send or write on an unknown connection");
            return;
        };
        let latency = self.cfg.latency;
        let transfer = match &op {
            WqeOp::Send(_) => None,
            WqeOp::Write(w) => Some(self.transfer_time(w.len.unwrap_or(0))),
        };
        let e = self.ends.get_mut(&uid).expect("indexed end exists");
        match e.state {
            EndState::Established | EndState::Accepting => {
                let due = match transfer {
                    None => now + latency,
                    Some(t) => {
                        let start = now.max(e.link_free);
                        e.link_free = start + t;
                        start + t + latency
                    }
                };
                e.sq.push_back(Wqe { wr, op, due });
                if e.sq.len() == 1 {
                    self.schedule_pump(uid, due);
                }
            }
            EndState::Error => {
                self.stats.flushed += 1;
                self.complete(uid, wr, WcStatus::Flushed, now);
            }
            EndState::Connecting => {
                self.stats.premature_sends += 1;
                debug!(node = %self.nid_of(n), ?conn, "send or write before the connection is up");
                self.complete(uid, wr, WcStatus::Error, now);
            }
        }
    }

    /// How long `len` bytes of RDMA write occupy a link.
    fn transfer_time(&self, len: u32) -> Duration {
        match self.cfg.bandwidth {
            0 => Duration::ZERO,
            bw => {
                let ns = (u128::from(len) * 1_000_000_000).div_ceil(u128::from(bw));
                Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64)
            }
        }
    }

    /// Copies write `w` of node `from` into node `to`'s memory, or says why it may not. Every
    /// fragment is checked before a byte is copied, so a refused write places nothing.
    fn place_write(&mut self, from: NodeId, to: NodeId, w: &Write) -> Result<u32, &'static str> {
        let len = check_rdma_write(&w.local, &w.remote).map_err(|_| "malformed write")?;
        let src = &self.nodes[from.idx()].regions;
        for f in &w.local {
            let r = src.get(&f.region.0).ok_or("local region not registered")?;
            span(&r.bytes, f.offset, f.len).ok_or("outside the local region")?;
        }
        let dst_node = &self.nodes[to.idx()];
        for f in &w.remote {
            let id = dst_node
                .rkeys
                .get(&f.key)
                .ok_or("no region under the remote key")?;
            let dst = &dst_node.regions[id];
            let off = f
                .addr
                .checked_sub(dst.addr)
                .ok_or("below the remote region")?;
            span(&dst.bytes, off, f.len).ok_or("past the end of the remote region")?;
        }
        for p in rdma_pieces(&w.local, &w.remote) {
            let src = &self.nodes[from.idx()].regions[&p.region.0];
            let data = src.bytes[span(&src.bytes, p.offset, p.len).expect("checked")].to_vec();
            let dst_node = &mut self.nodes[to.idx()];
            let id = dst_node.rkeys[&p.key];
            let dst = dst_node.regions.get_mut(&id).expect("keyed region exists");
            let r = span(&dst.bytes, p.addr - dst.addr, p.len).expect("checked");
            dst.bytes[r].copy_from_slice(&data);
        }
        Ok(len)
    }

    fn schedule_pump(&mut self, uid: u64, at: Instant) {
        let Some(e) = self.ends.get_mut(&uid) else {
            return;
        };
        if e.pump_at.is_none_or(|t| at < t) {
            e.pump_at = Some(at);
            self.push(at, Ev::Pump { end: uid });
        }
    }

    /// Schedules a completion on end `uid`, in order after the ones already scheduled.
    fn complete(&mut self, uid: u64, wr: WrId, status: WcStatus, at: Instant) {
        let Some(e) = self.ends.get_mut(&uid) else {
            return;
        };
        let at = at.max(e.last_cq);
        e.last_cq = at;
        self.push(
            at,
            Ev::SendDone {
                end: uid,
                wr,
                status,
            },
        );
    }

    /// End `uid`'s queue pair goes to error: what is still queued flushes.
    fn qp_error(&mut self, uid: u64) {
        let now = self.now;
        let Some(e) = self.ends.get_mut(&uid) else {
            return;
        };
        if e.state == EndState::Error {
            return;
        }
        e.state = EndState::Error;
        e.pump_at = None;
        e.retry_deadline = None;
        let flushed: Vec<WrId> = e.sq.drain(..).map(|w| w.wr).collect();
        self.stats.flushed += flushed.len() as u64;
        for wr in flushed {
            self.complete(uid, wr, WcStatus::Flushed, now);
        }
    }

    /// The end that a message from node `from` on a connection whose other end is `peer` would
    /// land in, if it can land now.
    fn receiver(&self, from: NodeId, peer: Option<u64>) -> Option<u64> {
        let p = peer?;
        let e = self.ends.get(&p)?;
        if !matches!(e.state, EndState::Established | EndState::Accepting) {
            return None;
        }
        if self.blocked(from, e.node) {
            return None;
        }
        Some(p)
    }

    /// Moves end `uid`'s send queue: delivers what is due, retries or fails a blocked head.
    fn pump(&mut self, uid: u64) {
        let now = self.now;
        let latency = self.cfg.latency;
        loop {
            let Some(e) = self.ends.get(&uid) else {
                return;
            };
            if e.state == EndState::Error {
                return;
            }
            let Some(head) = e.sq.front() else {
                return;
            };
            let due = head.due;
            if due > now {
                self.schedule_pump(uid, due);
                return;
            }
            let Some(p) = self.receiver(e.node, e.peer) else {
                // The peer does not answer: the transport retries until the horizon.
                let horizon = self.cfg.retry_horizon.saturating_sub(latency);
                let interval = self.cfg.retry_interval.max(Duration::from_nanos(1));
                let e = self.ends.get_mut(&uid).expect("checked above");
                let (n, conn) = (e.node, e.conn);
                let deadline = *e.retry_deadline.get_or_insert(now + horizon);
                if now >= deadline {
                    let wqe = e.sq.pop_front().expect("checked above");
                    e.retry_deadline = None;
                    self.stats.retry_exceeded += 1;
                    debug!(at = %now, node = %self.nid_of(n), ?conn, "retry exceeded");
                    self.complete(uid, wqe.wr, WcStatus::RetryExceeded, now);
                    self.qp_error(uid);
                } else {
                    self.schedule_pump(uid, (now + interval).min(deadline));
                }
                return;
            };
            let e = self.ends.get_mut(&uid).expect("checked above");
            let (n, conn) = (e.node, e.conn);
            let wqe = e.sq.pop_front().expect("checked above");
            e.retry_deadline = None;
            let (pn, pconn) = {
                let pe = &self.ends[&p];
                (pe.node, pe.conn)
            };
            let bytes = match wqe.op {
                WqeOp::Send(bytes) => bytes,
                WqeOp::Write(w) => {
                    let len = match self.place_write(n, pn, &w) {
                        Ok(len) => len,
                        Err(why) => {
                            self.stats.rdma_errors += 1;
                            debug!(at = %now, node = %self.nid_of(n), ?conn, local = ?w.local,
                                   remote = ?w.remote, why, "RDMA write refused");
                            self.complete(uid, wqe.wr, WcStatus::Error, now + latency);
                            self.qp_error(uid);
                            return;
                        }
                    };
                    self.stats.rdma_writes += 1;
                    self.stats.rdma_bytes += u64::from(len);
                    self.complete(uid, wqe.wr, WcStatus::Success, now + latency);
                    continue;
                }
            };
            let slot = self.ends.get_mut(&p).and_then(|pe| pe.posted.take_lowest());
            let Some(slot) = slot else {
                self.stats.rnr += 1;
                debug!(at = %now, node = %self.nid_of(n), ?conn,
                       "receiver not ready: no posted slot");
                self.complete(uid, wqe.wr, WcStatus::Error, now + latency);
                self.qp_error(uid);
                return;
            };
            self.stats.messages += 1;
            self.stats.bytes += bytes.len() as u64;
            self.complete(uid, wqe.wr, WcStatus::Success, now + latency);
            if self
                .ends
                .get(&p)
                .is_some_and(|pe| pe.state == EndState::Accepting)
            {
                // COMM_EST: a message on a passive queue pair whose RTU has not come proves
                // the connection up (o2iblnd: kiblnd_qp_event -> rdma_notify -> ESTABLISHED).
                self.stats.comm_est += 1;
                self.establish_passive(p, "established (passive, COMM_EST)");
            }
            if let Some(ep) = self.nodes[pn.idx()].ep.as_mut() {
                ep.fabric_event(
                    now,
                    FabricEvent::Recv {
                        conn: pconn,
                        slot,
                        bytes: &bytes,
                    },
                );
            }
            self.drain(pn, false);
        }
    }

    // ------------------------------------------------------------------ internals: events

    /// The passive end `end` is up (its RTU came, or its first message: COMM_EST); its
    /// endpoint gets `handle_established` with empty private data. The caller drains the node.
    fn establish_passive(&mut self, end: u64, what: &'static str) {
        let Some(e) = self.ends.get_mut(&end) else {
            return;
        };
        e.state = EndState::Established;
        let (n, conn) = (e.node, e.conn);
        trace!(at = %self.now, node = %self.nid_of(n), ?conn, "{what}");
        if let Some(ep) = self.nodes[n.idx()].ep.as_mut() {
            ep.fabric_event(self.now, FabricEvent::Established { conn, private: &[] });
        }
    }

    fn late(&mut self, what: &str) {
        self.stats.dropped_late_events += 1;
        trace!(at = %self.now, what, "event for a gone end dropped");
    }

    fn dispatch(&mut self, at: Instant, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Timer { node, epoch } => {
                let nd = &mut self.nodes[node.idx()];
                if nd.epoch != epoch || nd.timer_at != Some(at) {
                    self.stats.stale_timers += 1;
                    return;
                }
                nd.timer_at = None;
                let Some(ep) = nd.ep.as_mut() else {
                    return;
                };
                ep.handle_timeout(now);
                self.drain(node, true);
            }
            Ev::Request {
                active,
                active_node,
                target,
                private,
                started,
            } => {
                let unreachable_at = now.max(started + self.cfg.unreachable_after);
                if !self.host_reachable(active_node, target) {
                    self.push(
                        unreachable_at,
                        Ev::ConnFailed {
                            end: active,
                            why: ConnectFailure::Unreachable,
                        },
                    );
                    return;
                }
                if self.nodes[target.idx()].ep.is_none() {
                    // The host is up but nothing listens.
                    let back = self.cfg.cm_latency;
                    self.push(
                        now + back,
                        Ev::ConnFailed {
                            end: active,
                            why: ConnectFailure::NoListener,
                        },
                    );
                    return;
                }
                let id = self.next_req;
                self.next_req += 1;
                self.reqs.insert(
                    id,
                    PendingReq {
                        active,
                        active_node,
                        target,
                        started,
                    },
                );
                self.stats.requests += 1;
                if let Some(ep) = self.nodes[target.idx()].ep.as_mut() {
                    ep.fabric_event(
                        now,
                        FabricEvent::ConnectRequest {
                            req: RequestId(id),
                            private: private.as_bytes(),
                        },
                    );
                }
                self.drain(target, false);
            }
            Ev::Reply {
                active,
                active_node,
                passive,
                passive_node,
                private,
                started,
            } => {
                let passive_ok = self
                    .ends
                    .get(&passive)
                    .is_some_and(|e| e.state == EndState::Accepting);
                let active_ok = self
                    .ends
                    .get(&active)
                    .is_some_and(|e| e.state == EndState::Connecting);
                if self.blocked(active_node, passive_node) {
                    // Lost on the way: both sides time out.
                    self.push(
                        now.max(started + self.cfg.unreachable_after),
                        Ev::ConnFailed {
                            end: active,
                            why: ConnectFailure::Unreachable,
                        },
                    );
                    self.push(
                        now + self.cfg.unreachable_after,
                        Ev::Disconnected {
                            end: passive,
                            why: LOST,
                        },
                    );
                    return;
                }
                if !active_ok {
                    // Nobody waits for this reply any more: the active CM rejects it, or, if its
                    // host is down, the passive side times out.
                    self.late("reply");
                    let d = if self.host_reachable(passive_node, active_node) {
                        self.cfg.cm_latency
                    } else {
                        self.cfg.unreachable_after
                    };
                    self.push(
                        now + d,
                        Ev::Disconnected {
                            end: passive,
                            why: LOST,
                        },
                    );
                    return;
                }
                if !passive_ok {
                    // The passive side gave up (or closed) before its reply arrived.
                    self.deliver_connect_failed(active, ConnectFailure::Error);
                    return;
                }
                let e = self.ends.get_mut(&active).expect("checked above");
                e.state = EndState::Established;
                e.peer = Some(passive);
                e.peer_node = Some(passive_node);
                let conn = e.conn;
                self.stats.established += 1;
                trace!(at = %now, node = %self.nid_of(active_node), ?conn, "established (active)");
                if let Some(ep) = self.nodes[active_node.idx()].ep.as_mut() {
                    ep.fabric_event(
                        now,
                        FabricEvent::Established {
                            conn,
                            private: private.as_bytes(),
                        },
                    );
                }
                self.drain(active_node, false);
                match self.cm_hop() {
                    Some(d) => self.push(
                        now + d,
                        Ev::Rtu {
                            passive,
                            active_node,
                        },
                    ),
                    None => self.push(now + self.cfg.unreachable_after, Ev::RtuLost { passive }),
                }
            }
            Ev::Rtu {
                passive,
                active_node,
            } => {
                let Some(e) = self.ends.get_mut(&passive) else {
                    return self.late("rtu");
                };
                if e.state != EndState::Accepting {
                    return self.late("rtu");
                }
                let pn = e.node;
                if self.blocked(active_node, pn) {
                    self.push(now + self.cfg.unreachable_after, Ev::RtuLost { passive });
                    return;
                }
                self.establish_passive(passive, "established (passive)");
                self.drain(pn, false);
            }
            Ev::Rejected {
                active,
                active_node,
                passive_node,
                private,
                started,
            } => {
                if self.blocked(active_node, passive_node) {
                    self.push(
                        now.max(started + self.cfg.unreachable_after),
                        Ev::ConnFailed {
                            end: active,
                            why: ConnectFailure::Unreachable,
                        },
                    );
                    return;
                }
                self.deliver_connect_failed(active, ConnectFailure::Rejected(private));
            }
            Ev::ConnFailed { end, why } => self.deliver_connect_failed(end, why),
            Ev::RtuLost { passive } => match self.ends.get(&passive) {
                Some(e) if e.state == EndState::Accepting => {
                    self.dispatch(
                        at,
                        Ev::Disconnected {
                            end: passive,
                            why: LOST,
                        },
                    );
                }
                _ => self.late("rtu lost"),
            },
            Ev::Disconnected { end, why } => {
                let Some(e) = self.ends.get_mut(&end) else {
                    return self.late("disconnected");
                };
                if e.disconnect_reported {
                    return;
                }
                e.disconnect_reported = true;
                let (n, conn) = (e.node, e.conn);
                self.qp_error(end);
                trace!(at = %now, node = %self.nid_of(n), ?conn, "disconnected");
                if let Some(ep) = self.nodes[n.idx()].ep.as_mut() {
                    ep.fabric_event(now, FabricEvent::Disconnected { conn, why });
                }
                self.drain(n, false);
            }
            Ev::Pump { end } => {
                let Some(e) = self.ends.get_mut(&end) else {
                    return self.late("pump");
                };
                if e.pump_at != Some(at) {
                    return;
                }
                e.pump_at = None;
                self.pump(end);
            }
            Ev::SendDone { end, wr, status } => {
                let Some(e) = self.ends.get(&end) else {
                    return self.late("send completion");
                };
                let (n, conn) = (e.node, e.conn);
                if let Some(r) = self.rdma.get_mut(&wr.0).filter(|r| r.end == end) {
                    r.status.get_or_insert(status);
                }
                // An injected write's WrId is unknown to the engine, which ignores it.
                if let Some(ep) = self.nodes[n.idx()].ep.as_mut() {
                    ep.fabric_event(now, FabricEvent::SendComplete { conn, wr, status });
                }
                self.drain(n, false);
            }
            Ev::RecvDone { node, epoch, rx } => {
                let nd = &mut self.nodes[node.idx()];
                if nd.epoch != epoch {
                    return self.late("recv_done");
                }
                let Some(ep) = nd.ep.as_mut() else {
                    return;
                };
                ep.recv_done(now, rx);
                self.drain(node, false);
            }
            Ev::Restart {
                node,
                epoch,
                incarnation,
            } => {
                if self.nodes[node.idx()].epoch == epoch {
                    self.restart(node, incarnation);
                }
            }
        }
    }

    fn deliver_connect_failed(&mut self, end: u64, why: ConnectFailure) {
        let now = self.now;
        let Some(e) = self.ends.get_mut(&end) else {
            return self.late("connect failure");
        };
        if e.state != EndState::Connecting {
            return self.late("connect failure");
        }
        e.state = EndState::Error;
        let (n, conn) = (e.node, e.conn);
        trace!(at = %now, node = %self.nid_of(n), ?conn, ?why, "connect failed");
        if let Some(ep) = self.nodes[n.idx()].ep.as_mut() {
            ep.fabric_event(now, FabricEvent::ConnectFailed { conn, why });
        }
        self.drain(n, false);
    }
}

/// An LNet PUT header from `src` to `dst` for a `payload_len`-byte payload, with `match_bits`
/// (tests use it as a sequence number).
pub fn put_hdr(src: Nid, dst: Nid, payload_len: usize, match_bits: u64) -> LnetHdr {
    LnetHdr::put(src, dst, payload_len as u32, 4, match_bits)
}

#[cfg(test)]
mod rdma_tests;

/// Node `n`'s side of the simulated fabric: what its engine's actions do to the world. Never
/// calls into an endpoint.
struct NodeFabric<'w, N: SimNode> {
    w: &'w mut World<N>,
    n: NodeId,
}

impl<N: SimNode> Fabric for NodeFabric<'_, N> {
    fn connect(
        &mut self,
        now: Instant,
        conn: ConnId,
        peer: Nid,
        private: PrivateData,
        recv_slots: u16,
    ) {
        let n = self.n;
        self.w.stats.connects += 1;
        self.w.nodes[n.idx()].connects.push((now, peer));
        let uid = self.w.new_end(n, conn, EndState::Connecting, recv_slots);
        let target = self.w.node_of(peer);
        if let Some(e) = self.w.ends.get_mut(&uid) {
            e.peer_node = target;
        }
        let node = &mut self.w.nodes[n.idx()];
        let stuck = if let Some(i) = node.stuck_next.iter().position(|&x| x == peer) {
            node.stuck_next.swap_remove(i);
            true
        } else {
            let p = node.stuck_prob;
            self.w.rng.chance(p)
        };
        if stuck {
            self.w.stats.stuck_connects += 1;
            debug!(at = %now, node = %self.w.nid_of(n), %peer, ?conn, "connect stuck");
            return;
        }
        trace!(at = %now, node = %self.w.nid_of(n), %peer, ?conn, "connect");
        let Some(target) = target else {
            self.w.push(
                now + self.w.cfg.unreachable_after,
                Ev::ConnFailed {
                    end: uid,
                    why: ConnectFailure::Unreachable,
                },
            );
            return;
        };
        match self.w.cm_hop() {
            Some(d) => self.w.push(
                now + d,
                Ev::Request {
                    active: uid,
                    active_node: n,
                    target,
                    private,
                    started: now,
                },
            ),
            None => self.w.push(
                now + self.w.cfg.unreachable_after,
                Ev::ConnFailed {
                    end: uid,
                    why: ConnectFailure::Unreachable,
                },
            ),
        }
    }

    fn accept(
        &mut self,
        now: Instant,
        req: RequestId,
        conn: ConnId,
        private: PrivateData,
        recv_slots: u16,
    ) {
        let n = self.n;
        let Some(r) = self.w.reqs.remove(&req.0) else {
            self.w.stats.unknown_actions += 1;
            debug!(node = %self.w.nid_of(n), ?req, "accept of an unknown request");
            return;
        };
        if r.target != n {
            self.w.stats.unknown_actions += 1;
            self.w.reqs.insert(req.0, r);
            return;
        }
        self.w.stats.accepts += 1;
        let uid = self.w.new_end(n, conn, EndState::Accepting, recv_slots);
        if let Some(e) = self.w.ends.get_mut(&uid) {
            e.peer = Some(r.active);
            e.peer_node = Some(r.active_node);
        }
        match self.w.cm_hop() {
            Some(d) => self.w.push(
                now + d,
                Ev::Reply {
                    active: r.active,
                    active_node: r.active_node,
                    passive: uid,
                    passive_node: n,
                    private,
                    started: r.started,
                },
            ),
            None => {
                // The reply is lost: both sides time out.
                self.w.push(
                    now.max(r.started + self.w.cfg.unreachable_after),
                    Ev::ConnFailed {
                        end: r.active,
                        why: ConnectFailure::Unreachable,
                    },
                );
                self.w.push(
                    now + self.w.cfg.unreachable_after,
                    Ev::Disconnected {
                        end: uid,
                        why: LOST,
                    },
                );
            }
        }
    }

    fn reject(&mut self, now: Instant, req: RequestId, private: PrivateData) {
        let n = self.n;
        let Some(r) = self.w.reqs.remove(&req.0) else {
            self.w.stats.unknown_actions += 1;
            return;
        };
        self.w.stats.rejects += 1;
        if matches!(KibRej::parse(private.as_bytes()), Ok((rej, _)) if rej.why == RejectReason::ConnRace)
        {
            let key = (n.0.min(r.active_node.0), n.0.max(r.active_node.0));
            *self.w.race_rejects.entry(key).or_default() += 1;
        }
        match self.w.cm_hop() {
            Some(d) => self.w.push(
                now + d,
                Ev::Rejected {
                    active: r.active,
                    active_node: r.active_node,
                    passive_node: n,
                    private,
                    started: r.started,
                },
            ),
            None => self.w.push(
                now.max(r.started + self.w.cfg.unreachable_after),
                Ev::ConnFailed {
                    end: r.active,
                    why: ConnectFailure::Unreachable,
                },
            ),
        }
    }

    fn post_recv(&mut self, _: Instant, conn: ConnId, slot: u16) {
        let n = self.n;
        let Some(e) = self
            .w
            .end_uid(n, conn)
            .and_then(|u| self.w.ends.get_mut(&u))
        else {
            self.w.stats.unknown_actions += 1;
            return;
        };
        if !e.posted.insert(slot) {
            self.w.stats.double_posts += 1;
            debug!(node = %self.w.nid_of(n), ?conn, slot, "slot posted twice");
        }
    }

    fn send(&mut self, _: Instant, conn: ConnId, wr: WrId, bytes: Vec<u8>) {
        let n = self.n;
        self.w.post(n, conn, wr, WqeOp::Send(bytes));
    }

    fn rdma_write(
        &mut self,
        _: Instant,
        conn: ConnId,
        wr: WrId,
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
    ) {
        let n = self.n;
        let len = check_rdma_write(&local, &remote).ok();
        let w = Write { local, remote, len };
        self.w.post(n, conn, wr, WqeOp::Write(w));
    }

    // Writes are checked by key and bounds only (see `FabricAction::GrantWrites`).
    fn grant_writes(&mut self, _: Instant, _: ConnId, _: WrId, _: Vec<RemoteFrag>) {}

    fn revoke_writes(&mut self, _: Instant, _: ConnId, _: WrId) {}

    fn disconnect(&mut self, now: Instant, conn: ConnId) {
        let n = self.n;
        let Some(uid) = self.w.end_uid(n, conn) else {
            self.w.stats.unknown_actions += 1;
            return;
        };
        let e = self.w.ends.get_mut(&uid).expect("indexed end exists");
        if e.disconnect_issued {
            return;
        }
        e.disconnect_issued = true;
        self.w.stats.disconnects += 1;
        let (peer, peer_node) = (e.peer, e.peer_node);
        trace!(at = %now, node = %self.w.nid_of(n), ?conn, "disconnect");
        self.w.qp_error(uid);
        let cm = self.w.cfg.cm_latency;
        match (peer, peer_node) {
            (Some(p), Some(pn)) if self.w.host_reachable(n, pn) => {
                // DREQ to the peer, DREP back; a lost DREQ is retried until the horizon.
                match self.w.cm_hop() {
                    Some(d) => {
                        if self.w.ends.contains_key(&p) {
                            self.w.push(
                                now + d,
                                Ev::Disconnected {
                                    end: p,
                                    why: CLOSED,
                                },
                            );
                        }
                        self.w.push(
                            now + d + cm,
                            Ev::Disconnected {
                                end: uid,
                                why: CLOSED,
                            },
                        );
                    }
                    None => self.w.push(
                        now + self.w.cfg.retry_horizon,
                        Ev::Disconnected {
                            end: uid,
                            why: LOST,
                        },
                    ),
                }
            }
            (Some(_), _) => self.w.push(
                now + self.w.cfg.retry_horizon,
                Ev::Disconnected {
                    end: uid,
                    why: LOST,
                },
            ),
            // Not connected at the fabric level: only the local side hears.
            (None, _) => self.w.push(
                now + cm,
                Ev::Disconnected {
                    end: uid,
                    why: CLOSED,
                },
            ),
        }
    }

    fn destroy(&mut self, now: Instant, conn: ConnId) {
        let n = self.n;
        let Some(uid) = self.w.nodes[n.idx()].ends.remove(&conn) else {
            self.w.stats.unknown_actions += 1;
            return;
        };
        self.w.stats.destroys += 1;
        let Some(e) = self.w.ends.remove(&uid) else {
            return;
        };
        let peer_connected = e
            .peer
            .and_then(|p| self.w.ends.get(&p))
            .is_some_and(|p| matches!(p.state, EndState::Established | EndState::Accepting));
        if !e.disconnect_issued && !e.disconnect_reported && peer_connected {
            self.w.stats.orphaned += 1;
            debug!(at = %now, node = %self.w.nid_of(n), ?conn,
                   "connection destroyed without a disconnect: the peer is not told");
        }
        trace!(at = %now, node = %self.w.nid_of(n), ?conn, "destroy");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EndpointConfig, RacePolicy};
    use crate::fabric::RemoteRegion;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn world(seed: u64) -> World {
        World::new(SimConfig::with_seed(seed))
    }

    fn node(w: &mut World, addr: &str, inc: u64) -> NodeId {
        w.add_node(EndpointConfig::new(nid(addr), inc))
    }

    fn send_n(w: &mut World, from: NodeId, to: NodeId, n: u64, len: usize) -> Vec<u64> {
        let (src, dst) = (w.nid_of(from), w.nid_of(to));
        (0..n)
            .map(|i| w.send(from, dst, put_hdr(src, dst, len, i), vec![i as u8; len]))
            .collect()
    }

    fn limit(w: &World, secs: u64) -> Instant {
        w.now() + Duration::from_secs(secs)
    }

    /// Audit F5: a burst of messages queued behind credits (to a healthy peer, delivered) or
    /// behind a connection that never comes (to a crashed peer, failed) used to leave every table
    /// and queue at its peak for good. Once it is over, the trim gives the room back within a
    /// few intervals, even while light traffic goes on (which the burst's highest slab keys
    /// would otherwise keep busy).
    #[test]
    fn a_burst_leaves_no_peak_capacity_behind() {
        use crate::trim::{TRIM_FLOOR, TRIM_INTERVAL};
        const BURST: u64 = 50_000;
        for crashed in [false, true] {
            let mut w = world(7);
            let a = node(&mut w, "10.0.0.1@o2ib", 1);
            let b = node(&mut w, "10.0.0.2@o2ib", 2);
            if crashed {
                w.crash(b);
            }
            let cookies = send_n(&mut w, a, b, BURST, 64);
            let peak = w.endpoint(a).unwrap().capacities();
            let txs = peak.iter().find(|c| c.name == "txs").unwrap();
            assert!(txs.capacity >= BURST as usize, "{peak:?}");
            assert!(w.run_until_idle(limit(&w, 600)), "crashed {crashed}");
            let failed = cookies
                .iter()
                .filter(|c| !w.outcome(**c).is_some_and(|(_, o)| o.is_delivered()))
                .count();
            assert_eq!(failed == BURST as usize, crashed, "{failed} failed");
            // A little traffic afterwards, to the peer if it is up.
            let (src, dst) = (w.nid_of(a), w.nid_of(b));
            for i in 0..100 {
                if !crashed {
                    w.send(a, dst, put_hdr(src, dst, 64, i), vec![0; 64]);
                }
                w.run_for(Duration::from_nanos(TRIM_INTERVAL.as_nanos() / 5));
            }
            w.run_for(TRIM_INTERVAL * 3);
            let after = w.endpoint(a).unwrap().capacities();
            for c in &after {
                assert!(
                    c.capacity <= 2 * TRIM_FLOOR,
                    "crashed {crashed}: {} keeps {} after the burst: {after:?}",
                    c.name,
                    c.capacity
                );
            }
            let ep = w.endpoint(a).unwrap();
            assert!(
                ep.state_bytes() < 1 << 20,
                "{} bytes kept",
                ep.state_bytes()
            );
        }
    }

    /// The per-pair counter sees each CONN_RACE reject once, whichever side sends it, and
    /// nothing else.
    #[test]
    fn race_rejects_counted_per_unordered_pair() {
        for seed in 0..10 {
            let mut w = world(seed);
            let a = node(&mut w, "10.0.0.1@o2ib", 1);
            let b = node(&mut w, "10.0.0.2@o2ib", 2);
            let c = node(&mut w, "10.0.0.3@o2ib", 3);
            // a and b connect to each other in the same instant: b (higher) refuses a once.
            send_n(&mut w, a, b, 1, 8);
            send_n(&mut w, b, a, 1, 8);
            // c connects alone: no race.
            send_n(&mut w, c, a, 1, 8);
            assert!(w.run_until_idle(limit(&w, 10)), "seed {seed}");
            let races = w.endpoint(b).unwrap().stats().races;
            assert_eq!(races, 1, "seed {seed}");
            assert_eq!(w.race_rejects_between(a, b), races, "seed {seed}");
            assert_eq!(w.race_rejects_between(b, a), races, "seed {seed}");
            assert_eq!(w.race_rejects_between(a, c), 0, "seed {seed}");
            let pairs: Vec<_> = w.race_rejects_by_pair().collect();
            assert_eq!(pairs, vec![((a, b), 1)], "seed {seed}");
        }
    }

    #[test]
    fn slot_set_lowest_first() {
        let mut s = SlotSet::with_first(3);
        assert_eq!(s.len(), 3);
        assert!(!s.insert(1));
        assert_eq!(s.take_lowest(), Some(0));
        assert_eq!(s.take_lowest(), Some(1));
        assert!(s.insert(200));
        assert!(s.insert(0));
        assert_eq!(s.take_lowest(), Some(0));
        assert_eq!(s.take_lowest(), Some(2));
        assert_eq!(s.take_lowest(), Some(200));
        assert_eq!(s.take_lowest(), None);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn rng_is_seeded_and_bounded() {
        let mut a = SimRng::new(7);
        let mut b = SimRng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert!(!a.chance(0.0));
        assert!(a.chance(1.0));
        let hits = (0..10_000).filter(|_| a.chance(0.25)).count();
        assert!((2_000..3_000).contains(&hits), "{hits}");
        for _ in 0..1000 {
            assert!(a.duration_up_to(Duration::from_micros(5)) <= Duration::from_micros(5));
            assert!(a.below(3) < 3);
        }
    }

    #[test]
    fn event_order_is_time_then_sequence() {
        let mut h = BinaryHeap::new();
        for (seq, t) in [(0, 5), (1, 3), (2, 5), (3, 1)] {
            h.push(Scheduled {
                at: Instant::from_nanos(t),
                seq,
                ev: Ev::Pump { end: seq },
            });
        }
        let order: Vec<u64> = std::iter::from_fn(|| h.pop().map(|s| s.seq)).collect();
        assert_eq!(order, vec![3, 1, 0, 2]);
    }

    #[test]
    fn partitions_block_both_ways_and_heal() {
        let mut w = world(1);
        let a = node(&mut w, "10.0.0.1@o2ib", 1);
        let b = node(&mut w, "10.0.0.2@o2ib", 2);
        let c = node(&mut w, "10.0.0.3@o2ib", 3);
        let p = w.partition(&[a], &[b]);
        assert!(w.blocked(a, b) && w.blocked(b, a));
        assert!(!w.blocked(a, c) && !w.blocked(b, c) && !w.blocked(a, a));
        let q = w.partition(&[c], &[a, b]);
        w.heal_partition(p);
        assert!(!w.blocked(a, b));
        assert!(w.blocked(c, b));
        let _ = q;
        w.heal();
        assert!(!w.blocked(c, b));
    }

    #[test]
    fn exchange_100_messages_both_ways() {
        let mut w = world(42);
        let a = node(&mut w, "10.0.0.1@o2ib", 100);
        let b = node(&mut w, "10.0.0.2@o2ib", 200);
        let mut cookies = send_n(&mut w, a, b, 100, 512);
        cookies.extend(send_n(&mut w, b, a, 100, 1000));
        assert!(w.run_until_idle(limit(&w, 10)), "not idle: {:?}", w.stats());
        for c in &cookies {
            assert_eq!(w.outcome(*c).map(|(_, o)| o), Some(SendOutcome::Delivered));
        }
        for (n, from) in [(a, b), (b, a)] {
            let got = w.received(n);
            assert_eq!(got.len(), 100);
            assert!(got.iter().all(|m| m.from == w.nid_of(from)));
            let bits: Vec<u64> = got
                .iter()
                .map(|m| match m.hdr.body {
                    crate::wire::LnetBody::Put { match_bits, .. } => match_bits,
                    _ => u64::MAX,
                })
                .collect();
            assert_eq!(bits, (0..100).collect::<Vec<_>>(), "in order");
        }
        let s = w.stats();
        assert_eq!(s.rnr, 0);
        assert_eq!(s.orphaned, 0);
        assert_eq!(s.unexpected_send_done, 0);
        assert_eq!(s.double_posts, 0);
        assert_eq!(s.premature_sends, 0);
        assert_eq!(s.sends_delivered, 200);
        assert_eq!(
            w.connect_log(a).len() + w.connect_log(b).len(),
            2,
            "one connect each way"
        );
        assert!(w
            .peer_events(a)
            .iter()
            .any(|e| e.nid == w.nid_of(b) && e.down.is_none()));
    }

    #[test]
    fn crash_makes_queued_messages_fail() {
        let mut w = world(7);
        let a = node(&mut w, "10.0.0.1@o2ib", 100);
        let b = node(&mut w, "10.0.0.2@o2ib", 200);
        send_n(&mut w, a, b, 1, 64);
        assert!(w.run_until_idle(limit(&w, 10)));
        w.crash(b);
        assert_eq!(w.node_state(b), NodeState::Crashed);
        assert_eq!(w.ends_of(b), 0);
        assert_eq!(
            w.leaked_conns(b),
            1,
            "the crashed endpoint owned one connection"
        );
        let cookies = send_n(&mut w, a, b, 50, 64);
        assert!(
            w.run_until_idle(limit(&w, 300)),
            "messages to a crashed node hang: {} pending, {:?}",
            w.pending_sends(),
            w.stats()
        );
        for c in cookies {
            match w.outcome(c) {
                Some((_, SendOutcome::Failed(_))) => {}
                other => panic!("cookie {c}: {other:?}"),
            }
        }
        assert!(w.stats().retry_exceeded > 0);
        assert!(w
            .peer_events(a)
            .iter()
            .any(|e| e.nid == w.nid_of(b) && e.down.is_some()));
    }

    /// The same seed gives the same run, event for event.
    #[test]
    fn runs_replay_from_the_seed() {
        let run = |seed: u64| {
            let mut w = world(seed);
            w.cm_delay(Duration::from_micros(200));
            let ids: Vec<NodeId> = (1..=6)
                .map(|i| node(&mut w, &format!("10.0.0.{i}@o2ib"), 1000 + i))
                .collect();
            for &x in &ids {
                w.set_recv_delay(x, Duration::from_micros(50));
            }
            for i in 0..60u64 {
                let from = ids[(i % 6) as usize];
                let to = ids[((i * 7 + 1) % 6) as usize];
                send_n(&mut w, from, to, 3, 100 + i as usize);
                w.run_for(Duration::from_micros(30));
            }
            w.crash(ids[5]);
            assert!(w.run_until_idle(limit(&w, 300)));
            let log: Vec<(Instant, Nid, usize)> = ids
                .iter()
                .flat_map(|&n| w.received(n).iter().map(|m| (m.at, m.from, m.len)))
                .collect();
            (w.stats().clone(), log, w.now())
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3).1, run(4).1, "the seed matters (cm delays)");
    }

    #[test]
    fn simultaneous_connects_race_and_settle() {
        for policy in RacePolicy::ALL {
            let mut w = world(11);
            let mut cfg = EndpointConfig::new(nid("10.0.0.1@o2ib"), 1);
            cfg.race_policy = policy;
            let a = w.add_node(cfg);
            let mut cfg = EndpointConfig::new(nid("10.0.0.2@o2ib"), 2);
            cfg.race_policy = policy;
            let b = w.add_node(cfg);
            let mut cookies = send_n(&mut w, a, b, 10, 64);
            cookies.extend(send_n(&mut w, b, a, 10, 64));
            assert!(w.run_until_idle(limit(&w, 60)), "{policy:?}");
            assert!(
                cookies
                    .iter()
                    .all(|&c| w.outcome(c).is_some_and(|(_, o)| o.is_delivered())),
                "{policy:?}"
            );
            assert_eq!(w.stats().rnr, 0);
        }
    }

    #[test]
    fn graceful_shutdown_tells_the_peer() {
        let mut w = world(5);
        let a = node(&mut w, "10.0.0.1@o2ib", 1);
        let b = node(&mut w, "10.0.0.2@o2ib", 2);
        send_n(&mut w, a, b, 5, 64);
        send_n(&mut w, b, a, 5, 64);
        assert!(w.run_until_idle(limit(&w, 10)));
        w.shutdown(b);
        w.run_for(Duration::from_secs(5));
        assert_eq!(w.node_state(b), NodeState::Stopped);
        assert!(w.endpoint(b).is_none());
        assert_eq!(w.leaked_conns(b), 0);
        assert_eq!(w.stats().orphaned, 0);
        assert_eq!(w.ends_of(b), 0);
        assert!(w
            .peer_events(a)
            .iter()
            .any(|e| e.nid == w.nid_of(b) && e.down == Some(DownReason::Closed)));
        // The host is up, nothing listens: a new message fails quickly, not after timeouts.
        let t0 = w.now();
        let c = send_n(&mut w, a, b, 1, 64)[0];
        assert!(w.run_until_idle(limit(&w, 60)));
        let (at, o) = w.outcome(c).unwrap();
        assert!(matches!(o, SendOutcome::Failed(_)), "{o:?}");
        assert!(at - t0 < Duration::from_secs(1), "took {:?}", at - t0);
        // Sending from the stopped node is refused.
        let c = send_n(&mut w, b, a, 1, 64)[0];
        assert_eq!(w.outcome(c).map(|(_, o)| o), Some(SendOutcome::NodeDown));
    }

    #[test]
    fn reboot_then_messages_reach_the_new_instance() {
        let mut w = world(9);
        let a = node(&mut w, "10.0.0.1@o2ib", 1);
        let b = node(&mut w, "10.0.0.2@o2ib", 2);
        send_n(&mut w, a, b, 3, 64);
        assert!(w.run_until_idle(limit(&w, 10)));
        w.reboot(b, Duration::from_secs(2), 3);
        w.run_for(Duration::from_secs(3));
        assert_eq!(w.node_state(b), NodeState::Up);
        assert_eq!(w.endpoint(b).unwrap().incarnation(), 3);
        // The first messages may die with the old connection; later ones must get through.
        let mut delivered = false;
        for _ in 0..20 {
            let c = send_n(&mut w, a, b, 1, 64)[0];
            assert!(w.run_until_idle(limit(&w, 120)), "{:?}", w.stats());
            if w.outcome(c).unwrap().1.is_delivered() {
                delivered = true;
                break;
            }
        }
        assert!(
            delivered,
            "never reached the rebooted node: {:?}",
            w.stats()
        );
        assert!(w.received(b).iter().any(|m| m.from == w.nid_of(a)));
    }

    /// Without a second attempt beside it (`connect_hedge` 0, as kernel Lustre), a connect
    /// that never completes holds the message until its deadline ends it.
    #[test]
    fn stuck_connect_is_ended_by_the_connect_deadline() {
        let mut w = world(13);
        let mut cfg = EndpointConfig::new(nid("10.0.0.1@o2ib"), 1);
        cfg.tunables.connect_hedge = Duration::ZERO;
        let a = w.add_node(cfg);
        let b = node(&mut w, "10.0.0.2@o2ib", 2);
        w.stuck_next_connect(a, w.nid_of(b));
        let c = send_n(&mut w, a, b, 1, 64)[0];
        assert!(w.run_until_idle(limit(&w, 120)), "{:?}", w.stats());
        assert_eq!(w.stats().stuck_connects, 1);
        let (at, o) = w.outcome(c).unwrap();
        assert!(o.is_delivered(), "{o:?}");
        assert!(
            at >= Instant::from_secs(5),
            "delivered at {at} despite the stuck connect"
        );
        assert_eq!(w.live_ends(), 2, "the stuck attempt was destroyed");
    }

    /// LU-7646's stuck active connect costs `connect_hedge`, not a connect deadline: a second
    /// attempt starts beside the unanswered one and carries the message. When the second is
    /// stuck too, the first is given up once the second has waited twice the hedge delay, and
    /// a third starts; each further pair waits twice as long (at most half the deadline). So k
    /// stuck in a row cost 1 + 2 + 4 + ... hedge delays, far below a deadline each (before:
    /// two stuck cost a whole deadline, 12.5 s, and a storm's unlucky pairs 14 s). Never more
    /// than two attempts, one connection and one zombie for the pair.
    #[test]
    fn a_stuck_connect_gets_a_second_attempt_beside_it() {
        for stuck in 1..=4u64 {
            let mut w = world(13 + stuck);
            let a = node(&mut w, "10.0.0.1@o2ib", 1);
            let b = node(&mut w, "10.0.0.2@o2ib", 2);
            for _ in 0..stuck {
                w.stuck_next_connect(a, w.nid_of(b));
            }
            let t0 = w.now();
            let c = send_n(&mut w, a, b, 1, 64)[0];
            let (mut peak_zombies, mut peak_conns) = (0, 0);
            let end = limit(&w, 120);
            while w.now() < end && w.outcome(c).is_none() {
                w.run_for(Duration::from_millis(50));
                let ep = w.node(a).unwrap();
                let v = ep.peer(w.nid_of(b)).unwrap();
                peak_zombies = peak_zombies.max(v.zombies);
                peak_conns = peak_conns.max(ep.conns().filter(|c| c.active).count());
            }
            let (at, o) = w.outcome(c).unwrap();
            assert!(o.is_delivered(), "{o:?}");
            let took = at - t0;
            let deadline = crate::engine::Tunables::default().connect_timeout();
            let hedge = crate::engine::Tunables::default().connect_hedge;
            // The hedge, then each pair's wait: 2, 4, ... hedges, capped at half the deadline.
            let cap = Duration::from_nanos(deadline.as_nanos() / 2);
            let bound = (1..stuck).fold(hedge, |t, k| t + hedge.saturating_mul(1 << k).min(cap))
                + Duration::from_millis(100);
            assert!(bound < deadline + hedge, "{stuck} stuck: {bound}");
            assert!(took <= bound, "{stuck} stuck: delivered after {took}");
            assert!(peak_zombies <= 1, "{stuck} stuck: {peak_zombies} zombies");
            assert!(peak_conns <= 2, "{stuck} stuck: {peak_conns} active ends");
            assert!(w.run_until_idle(limit(&w, 120)), "{:?}", w.stats());
            let ep = w.node(a).unwrap();
            assert_eq!(w.stats().stuck_connects, stuck);
            assert_eq!(ep.stats().connect_hedges, stuck);
            assert_eq!(ep.stats().hedge_abandons, stuck - 1);
            assert_eq!(ep.conns().count(), 1, "one connection left");
            assert_eq!(w.live_ends(), 2, "every stuck attempt was destroyed");
            assert_eq!(w.invalid_transitions(), 0);
        }
    }

    /// Connects that are only slow (CM messages late by up to 3 s, longer than
    /// `connect_hedge`): every message still arrives once, a pair never holds more than two
    /// connections, and the hedge delay learns what connects take, so that after the first
    /// connects a slow fabric is not sent every request twice.
    #[test]
    fn slow_connects_teach_the_hedge_delay_and_lose_nothing() {
        let mut w = world(29);
        w.cm_delay(Duration::from_secs(3));
        let a = node(&mut w, "10.0.0.1@o2ib", 1);
        let peers: Vec<NodeId> = (2..10)
            .map(|i| node(&mut w, &format!("10.0.0.{i}@o2ib"), i))
            .collect();
        let mut cookies = Vec::new();
        for &b in &peers {
            cookies.extend(send_n(&mut w, a, b, 5, 64));
            let end = limit(&w, 60);
            while w.now() < end && cookies.iter().any(|&c| w.outcome(c).is_none()) {
                w.run_for(Duration::from_millis(100));
                for &x in &peers {
                    let per_pair = w
                        .node(a)
                        .unwrap()
                        .conns()
                        .filter(|c| c.peer == w.nid_of(x))
                        .count();
                    assert!(per_pair <= 2, "{per_pair} connections to one peer");
                }
            }
        }
        assert!(w.run_until_idle(limit(&w, 120)), "{:?}", w.stats());
        assert!(cookies
            .iter()
            .all(|&c| w.outcome(c).unwrap().1.is_delivered()));
        let hedges = w.node(a).unwrap().stats().connect_hedges;
        assert!(hedges <= 2, "{hedges} hedges for {} peers", peers.len());
        assert_eq!(w.invalid_transitions(), 0);
    }

    #[test]
    fn partition_healed_within_the_retry_horizon_loses_nothing() {
        let mut w = world(17);
        let a = node(&mut w, "10.0.0.1@o2ib", 1);
        let b = node(&mut w, "10.0.0.2@o2ib", 2);
        send_n(&mut w, a, b, 1, 64);
        assert!(w.run_until_idle(limit(&w, 10)));
        let p = w.partition(&[a], &[b]);
        let cookies = send_n(&mut w, a, b, 3, 64);
        w.run_for(Duration::from_millis(400));
        assert_eq!(w.pending_sends(), 3);
        w.heal_partition(p);
        assert!(w.run_until_idle(limit(&w, 10)));
        assert!(cookies
            .iter()
            .all(|&c| w.outcome(c).unwrap().1.is_delivered()));
        assert_eq!(w.stats().retry_exceeded, 0);
    }

    #[test]
    fn long_partition_fails_with_a_status() {
        let mut w = world(19);
        let a = node(&mut w, "10.0.0.1@o2ib", 1);
        let b = node(&mut w, "10.0.0.2@o2ib", 2);
        send_n(&mut w, a, b, 1, 64);
        assert!(w.run_until_idle(limit(&w, 10)));
        w.partition(&[a], &[b]);
        let cookies = send_n(&mut w, a, b, 5, 64);
        assert!(w.run_until_idle(limit(&w, 300)), "{:?}", w.stats());
        assert!(cookies
            .iter()
            .all(|&c| matches!(w.outcome(c).unwrap().1, SendOutcome::Failed(_))));
        assert!(w.stats().retry_exceeded >= 1);
    }

    /// Random repost delays never make a sender overrun the receiver's posted slots: credits work.
    #[test]
    fn delayed_reposts_never_cause_rnr() {
        let mut w = world(23);
        let a = node(&mut w, "10.0.0.1@o2ib", 1);
        let b = node(&mut w, "10.0.0.2@o2ib", 2);
        w.set_recv_delay(b, Duration::from_micros(300));
        w.set_recv_delay(a, Duration::from_micros(100));
        let mut cookies = Vec::new();
        for _ in 0..20 {
            cookies.extend(send_n(&mut w, a, b, 100, 2000));
            cookies.extend(send_n(&mut w, b, a, 10, 100));
            w.run_for(Duration::from_micros(500));
        }
        assert!(w.run_until_idle(limit(&w, 60)), "{:?}", w.stats());
        assert_eq!(w.stats().rnr, 0);
        assert!(cookies
            .iter()
            .all(|&c| w.outcome(c).unwrap().1.is_delivered()));
        assert_eq!(w.received_count(b), 2000);
    }

    #[test]
    fn lossy_and_slow_connection_manager_still_ends_every_message() {
        let mut w = world(29);
        w.cm_loss(0.3);
        w.cm_delay(Duration::from_millis(2));
        let ids: Vec<NodeId> = (1..=4)
            .map(|i| node(&mut w, &format!("10.0.0.{i}@o2ib"), i))
            .collect();
        let mut cookies = Vec::new();
        for &x in &ids {
            for &y in &ids {
                if x != y {
                    cookies.extend(send_n(&mut w, x, y, 5, 64));
                }
            }
        }
        assert!(w.run_until_idle(limit(&w, 600)), "{:?}", w.stats());
        assert!(w.stats().cm_lost > 0);
        assert!(cookies.iter().all(|&c| w.outcome(c).is_some()));
    }

    #[test]
    fn many_clients_one_server() {
        let mut w = World::new(SimConfig {
            keep_logs: false,
            ..SimConfig::with_seed(31)
        });
        let server = node(&mut w, "10.1.0.1@o2ib", 1);
        let clients: Vec<NodeId> = (0..300u32)
            .map(|i| {
                let addr = format!("10.2.{}.{}@o2ib", i / 250, i % 250 + 1);
                node(&mut w, &addr, 10 + u64::from(i))
            })
            .collect();
        for &c in &clients {
            send_n(&mut w, c, server, 4, 256);
        }
        send_n(&mut w, server, clients[7], 4, 256);
        assert!(w.run_until_idle(limit(&w, 60)), "{:?}", w.stats());
        let s = w.stats();
        assert_eq!(s.sends_delivered, 1204, "{s:?}");
        assert_eq!(w.received_count(server), 1200);
        assert_eq!(s.rnr, 0);
    }

    /// Every fault at once on a handful of nodes: every message ends with a status, no engine
    /// contract violation shows at the fabric, and afterwards the fabric holds exactly the
    /// connections the endpoints hold.
    #[test]
    fn chaos_every_message_ends() {
        for seed in 0..20u64 {
            let mut w = world(seed);
            w.cm_loss(0.1);
            w.cm_delay(Duration::from_micros(300));
            let ids: Vec<NodeId> = (1..=5)
                .map(|i| node(&mut w, &format!("10.0.0.{i}@o2ib"), i))
                .collect();
            for &x in &ids {
                w.stuck_connects(x, 0.1);
                w.set_recv_delay(x, Duration::from_micros(20));
            }
            for r in 0..50u64 {
                let x = ids[w.rng().below(5) as usize];
                let y = ids[w.rng().below(5) as usize];
                send_n(&mut w, x, y, 3, 100);
                match r {
                    10 => w.crash(ids[1]),
                    15 => assert!(w.restart(ids[1], 77)),
                    20 => w.reboot(ids[2], Duration::from_millis(10), 88),
                    30 => w.shutdown(ids[3]),
                    35 => {
                        w.partition(&[ids[0]], &[ids[4]]);
                    }
                    40 => w.heal(),
                    _ => {}
                }
                w.run_for(Duration::from_millis(3));
            }
            assert!(
                w.run_until_idle(limit(&w, 600)),
                "seed {seed}: {:?}",
                w.stats()
            );
            w.run_for(Duration::from_secs(400));
            let s = w.stats();
            assert_eq!(
                s.sends,
                s.sends_delivered + s.sends_failed + s.sends_refused + s.sends_lost
            );
            assert_eq!(s.rnr, 0, "seed {seed}");
            assert_eq!(s.unexpected_send_done, 0, "seed {seed}");
            assert_eq!(s.double_posts, 0, "seed {seed}");
            assert_eq!(s.premature_sends, 0, "seed {seed}");
            assert_eq!(s.unknown_actions, 0, "seed {seed}");
            for &n in &ids {
                let held = w.endpoint(n).map_or(0, |ep| ep.conns().count());
                assert_eq!(held, w.ends_of(n), "seed {seed}, node {n:?}");
            }
        }
    }

    /// 10,000 clients and one server (run with `--ignored --release`).
    #[test]
    #[ignore]
    fn scale_10k_clients_one_server() {
        let mut w = World::new(SimConfig {
            keep_logs: false,
            ..SimConfig::with_seed(31)
        });
        let server = node(&mut w, "10.1.0.1@o2ib", 1);
        let clients: Vec<NodeId> = (0..10_000u32)
            .map(|i| {
                let addr = format!("10.2.{}.{}@o2ib", i / 250, i % 250 + 1);
                node(&mut w, &addr, 10 + u64::from(i))
            })
            .collect();
        for _ in 0..10 {
            for &c in &clients {
                send_n(&mut w, c, server, 1, 256);
            }
            w.run_for(Duration::from_millis(1));
        }
        assert!(w.run_until_idle(limit(&w, 60)), "{:?}", w.stats());
        w.run_for(Duration::from_secs(300));
        let s = w.stats();
        assert_eq!(s.sends_delivered, 100_000);
        assert_eq!(s.rnr, 0);
    }

    #[test]
    fn connect_to_an_unknown_nid_fails_unreachable() {
        let mut w = world(37);
        let a = node(&mut w, "10.0.0.1@o2ib", 1);
        let dst = nid("10.9.9.9@o2ib");
        let c = w.send(a, dst, put_hdr(w.nid_of(a), dst, 8, 0), vec![0; 8]);
        assert!(w.run_until_idle(limit(&w, 120)));
        assert!(matches!(w.outcome(c).unwrap().1, SendOutcome::Failed(_)));
        // Idle means no message pending; the failed attempt is reaped on the endpoint's next tick.
        w.run_for(Duration::from_secs(1));
        assert_eq!(w.live_ends(), 0);
    }

    // ------------------------------------------------------------------ RDMA writes

    const MIB: usize = 1 << 20;

    /// Two nodes with a connection a -> b (one message sent to establish it), a 1 MiB source region
    /// on `a` filled with a pattern and a zeroed 1 MiB sink region on `b`.
    struct Bulk {
        w: World,
        a: NodeId,
        b: NodeId,
        conn: ConnId,
        src: Registration,
        sink: Registration,
        remote: RemoteRegion,
    }

    /// Node `from` writes `len` bytes at `off` of `src` to `remote`: one fragment each side.
    fn write1(
        w: &mut World,
        from: NodeId,
        conn: ConnId,
        src: &Registration,
        off: u64,
        remote: RemoteRegion,
        len: u32,
    ) -> WrId {
        w.rdma_write(
            from,
            conn,
            vec![src.local_frag(off, len)],
            vec![remote.frag(len)],
        )
    }

    fn bulk(seed: u64) -> Bulk {
        let mut w = world(seed);
        let a = node(&mut w, "10.0.0.1@o2ib", 1);
        let b = node(&mut w, "10.0.0.2@o2ib", 2);
        send_n(&mut w, a, b, 1, 64);
        assert!(w.run_until_idle(limit(&w, 10)));
        let conn = w
            .endpoint(a)
            .unwrap()
            .conns()
            .find(|c| c.peer == w.nid_of(b))
            .expect("a is connected to b")
            .id;
        let pattern: Vec<u8> = (0..MIB)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
            .collect();
        let src = w.registry(a).register(pattern).unwrap();
        let sink = w.registry(b).register(vec![0; MIB]).unwrap();
        let remote = sink.remote();
        Bulk {
            w,
            a,
            b,
            conn,
            src,
            sink,
            remote,
        }
    }

    /// The 257 fragments (offset, len) of a 1 MiB buffer that starts 2 KiB into a page: the most
    /// an o2iblnd descriptor carries.
    fn frags_257() -> Vec<(u64, u32)> {
        let mut v = vec![(0u64, 2048u32)];
        let mut off = 2048u64;
        while off + 4096 <= MIB as u64 {
            v.push((off, 4096));
            off += 4096;
        }
        v.push((off, (MIB as u64 - off) as u32));
        v
    }

    #[test]
    fn rdma_write_257_fragments_copies_the_region_then_a_send_follows() {
        let mut t = bulk(41);
        let (a, b) = (t.a, t.b);
        let frags = frags_257();
        assert_eq!(frags.len(), 257);
        assert_eq!(
            frags.iter().map(|f| u64::from(f.1)).sum::<u64>(),
            MIB as u64
        );
        let t0 = t.w.now();
        let received_before = t.w.received_count(b);
        let wrs: Vec<WrId> = frags
            .iter()
            .map(|&(off, len)| write1(&mut t.w, a, t.conn, &t.src, off, t.remote.at(off), len))
            .collect();
        assert!(wrs
            .iter()
            .all(|wr| wr.0 >> 63 == 1 && wr.0 as u32 == u32::MAX));
        // A message posted behind the writes (PUT_DONE-like) on the same connection.
        let c = send_n(&mut t.w, a, b, 1, 64)[0];
        assert!(t.w.run_until_idle(limit(&t.w, 10)), "{:?}", t.w.stats());
        for wr in &wrs {
            assert_eq!(t.w.rdma_status(a, *wr), Some(WcStatus::Success), "{wr:?}");
            assert_eq!(t.w.rdma_status(b, *wr), None, "not b's write");
        }
        assert_eq!(t.w.region(b, &t.sink), t.w.region(a, &t.src));
        assert!(t.w.outcome(c).unwrap().1.is_delivered());
        // RC ordering: the message arrives only after all the data is in place, which at
        // 12.5 GB/s takes ~84 µs (a lone send takes 2 µs).
        let arrived = t.w.received(b).last().unwrap().at;
        assert_eq!(t.w.received_count(b), received_before + 1);
        let wire = Duration::from_nanos((MIB as u64 * 1_000_000_000).div_ceil(12_500_000_000));
        assert!(
            arrived >= t0 + wire + t.w.config().latency,
            "arrived {:?} after the start",
            arrived - t0
        );
        let s = t.w.stats();
        assert_eq!(
            (s.rdma_writes, s.rdma_bytes, s.rdma_errors),
            (257, MIB as u64, 0)
        );
        assert_eq!((s.flushed, s.retry_exceeded, s.unknown_actions), (0, 0, 0));
        // The engine ignored the completions it did not know: nothing is left posted.
        let view = t.w.endpoint(a).unwrap().conns().next().unwrap();
        assert_eq!(view.sends_posted, 0);
        assert_eq!(view.id, t.conn);
    }

    #[test]
    fn rdma_write_outside_the_region_fails_and_writes_nothing() {
        type Aim = fn(RemoteRegion) -> RemoteRegion;
        let cases: [(&str, Aim, u64, u32); 5] = [
            (
                "wrong key",
                |r| RemoteRegion {
                    key: r.key ^ 1,
                    ..r
                },
                0,
                4096,
            ),
            ("past the end", |r| r.at(MIB as u64 - 100), 0, 4096),
            (
                "below the start",
                |r| RemoteRegion {
                    addr: r.addr - 1,
                    ..r
                },
                0,
                4096,
            ),
            ("huge length", |r| r, 0, u32::MAX),
            ("outside the local region", |r| r, MIB as u64 - 8, 4096),
        ];
        for (what, target, local_offset, len) in cases {
            let mut t = bulk(43);
            let (a, b) = (t.a, t.b);
            let received_before = t.w.received_count(b);
            let wr = write1(
                &mut t.w,
                a,
                t.conn,
                &t.src,
                local_offset,
                target(t.remote),
                len,
            );
            // Queued behind the bad write: flushed when the queue pair goes to error.
            let c = send_n(&mut t.w, a, b, 1, 64)[0];
            assert!(t.w.run_until_idle(limit(&t.w, 10)), "{what}");
            assert_eq!(t.w.rdma_status(a, wr), Some(WcStatus::Error), "{what}");
            assert!(
                t.w.region(b, &t.sink).unwrap().iter().all(|&x| x == 0),
                "{what}"
            );
            assert_eq!(t.w.received_count(b), received_before, "{what}");
            assert!(
                matches!(t.w.outcome(c).unwrap().1, SendOutcome::Failed(_)),
                "{what}"
            );
            let s = t.w.stats();
            assert_eq!(
                (s.rdma_errors, s.rdma_writes, s.flushed),
                (1, 0, 1),
                "{what}"
            );
        }
    }

    #[test]
    fn rdma_write_to_a_deregistered_region_fails() {
        let mut t = bulk(45);
        let (a, b) = (t.a, t.b);
        let ghost = Registration::new(t.sink.id(), t.sink.key(), t.sink.addr(), t.sink.len());
        let buf = t.w.registry(b).deregister(t.sink).unwrap();
        assert_eq!(buf.len(), MIB);
        assert!(t.w.region(b, &ghost).is_none());
        assert!(t.w.registry(b).deregister(ghost).is_none());
        let wr = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote, 4096);
        assert!(t.w.run_until_idle(limit(&t.w, 10)));
        assert_eq!(t.w.rdma_status(a, wr), Some(WcStatus::Error));
        assert_eq!(t.w.stats().rdma_errors, 1);
    }

    #[test]
    fn rdma_write_to_a_crashed_peer_exceeds_retries_after_the_horizon() {
        let mut t = bulk(47);
        let (a, b) = (t.a, t.b);
        t.w.crash(b);
        assert!(
            t.w.region(b, &t.sink).is_none(),
            "a crash drops the node's regions"
        );
        let wr = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote, 4096);
        let horizon = t.w.config().retry_horizon;
        t.w.run_for(horizon - Duration::from_millis(10));
        assert_eq!(t.w.rdma_status(a, wr), None, "still retrying");
        t.w.run_for(Duration::from_millis(20));
        assert_eq!(t.w.rdma_status(a, wr), Some(WcStatus::RetryExceeded));
        let s = t.w.stats();
        assert_eq!((s.retry_exceeded, s.rdma_errors, s.rdma_writes), (1, 0, 0));
        // The restarted node has no regions; its old key names nothing.
        assert!(t.w.restart(b, 3));
        assert!(t.w.region(b, &t.sink).is_none());
        assert!(t.w.registry(b).deregister(t.sink).is_none());
    }

    #[test]
    fn rdma_writes_queued_behind_a_disconnect_are_flushed() {
        let mut t = bulk(53);
        let (a, b) = (t.a, t.b);
        // Two 1 MiB writes take ~170 µs on the link; the peer's DREQ arrives after 20 µs.
        let w1 = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote, MIB as u32);
        let w2 = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote, MIB as u32);
        t.w.shutdown(b);
        t.w.run_for(Duration::from_secs(5));
        assert_eq!(t.w.node_state(b), NodeState::Stopped);
        assert_eq!(t.w.rdma_status(a, w1), Some(WcStatus::Flushed));
        assert_eq!(t.w.rdma_status(a, w2), Some(WcStatus::Flushed));
        let s = t.w.stats();
        assert_eq!((s.rdma_writes, s.rdma_bytes, s.rdma_errors), (0, 0, 0));
        assert!(s.flushed >= 2);
        assert!(
            t.w.region(b, &t.sink).is_none(),
            "shutdown drops the node's regions"
        );
        // A write posted on an end already in error flushes at once.
        let mut t = bulk(59);
        let (a, b) = (t.a, t.b);
        let wr = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote.at(8), 8);
        // A bad write first: the queue pair is in error, but the engine still holds the end.
        let bad = write1(
            &mut t.w,
            a,
            t.conn,
            &t.src,
            0,
            RemoteRegion { key: 0, ..t.remote },
            8,
        );
        assert!(t.w.run_until_idle(limit(&t.w, 1)));
        assert_eq!(t.w.rdma_status(a, wr), Some(WcStatus::Success));
        assert_eq!(t.w.rdma_status(a, bad), Some(WcStatus::Error));
        let late = write1(&mut t.w, a, t.conn, &t.src, 0, t.remote, 8);
        assert!(t.w.run_until_idle(limit(&t.w, 1)));
        assert_eq!(t.w.rdma_status(a, late), Some(WcStatus::Flushed));
        assert_eq!(&t.w.region(b, &t.sink).unwrap()[..24], {
            let mut v = [0u8; 24];
            v[8..16].copy_from_slice(&t.w.region(a, &t.src).unwrap()[..8]);
            v
        });
    }

    #[test]
    fn rdma_write_bandwidth_is_configurable() {
        for (bw, wire_ns) in [(0u64, 0u64), (1_000_000_000, 1_048_576)] {
            let mut w = World::new(SimConfig {
                bandwidth: bw,
                ..SimConfig::with_seed(61)
            });
            let a = node(&mut w, "10.0.0.1@o2ib", 1);
            let b = node(&mut w, "10.0.0.2@o2ib", 2);
            send_n(&mut w, a, b, 1, 64);
            assert!(w.run_until_idle(limit(&w, 10)));
            let conn = w.endpoint(a).unwrap().conns().next().unwrap().id;
            let src = w.registry(a).register(vec![7; MIB]).unwrap();
            let sink = w.registry(b).register(vec![0; MIB]).unwrap();
            let t0 = w.now();
            let wr = write1(&mut w, a, conn, &src, 0, sink.remote(), MIB as u32);
            let mut done = None;
            while done.is_none() && w.step() {
                if w.rdma_status(a, wr).is_some() {
                    done = Some(w.now());
                }
            }
            let took = done.expect("completed") - t0;
            // Data on the wire, one latency there and one back for the ack.
            assert_eq!(
                took,
                Duration::from_nanos(wire_ns + 4_000),
                "bandwidth {bw}"
            );
            assert_eq!(w.region(b, &sink), w.region(a, &src));
        }
    }

    /// What a zeroed sink region at `sink_addr` holds after `local` (offsets into `src`) is
    /// written onto `remote`.
    fn expected_sink(
        src: &[u8],
        sink_len: usize,
        sink_addr: u64,
        local: &[LocalFrag],
        remote: &[RemoteFrag],
    ) -> Vec<u8> {
        let mut v = vec![0; sink_len];
        for p in rdma_pieces(local, remote) {
            let (s, d, n) = (
                p.offset as usize,
                (p.addr - sink_addr) as usize,
                p.len as usize,
            );
            v[d..d + n].copy_from_slice(&src[s..s + n]);
        }
        v
    }

    #[test]
    fn rdma_write_fragment_lists_land_byte_exact() {
        let mut t = bulk(67);
        let (a, b) = (t.a, t.b);
        let src = t.w.region(a, &t.src).unwrap().to_vec();
        // 3 local fragments (out of order), 4 remote ones (with gaps), odd lengths: 150_001 bytes.
        let local = vec![
            t.src.local_frag(100_003, 70_001),
            t.src.local_frag(7, 13),
            t.src.local_frag(1_000, 79_987),
        ];
        let remote = vec![
            t.sink.remote_frag(5, 33),
            t.sink.remote_frag(1_001, 65_537),
            t.sink.remote_frag(80_000, 84_430),
            t.sink.remote_frag(200_001, 1),
        ];
        let want = expected_sink(&src, MIB, t.sink.addr(), &local, &remote);
        assert!(rdma_pieces(&local, &remote).count() >= 6);
        let wr = t.w.rdma_write(a, t.conn, local, remote);
        // 257 fragments each side, with other boundaries, onto a second sink.
        let sink2 = t.w.registry(b).register(vec![0; 257 * 8192]).unwrap();
        let local2: Vec<LocalFrag> = frags_257()
            .iter()
            .map(|&(off, len)| t.src.local_frag(off, len))
            .collect();
        let mut lens = vec![1000u32];
        lens.extend(std::iter::repeat_n(4096, 255));
        lens.push(MIB as u32 - 1000 - 255 * 4096);
        let remote2: Vec<RemoteFrag> = lens
            .iter()
            .enumerate()
            .map(|(k, &len)| sink2.remote_frag(k as u64 * 8192, len))
            .collect();
        assert_eq!((local2.len(), remote2.len()), (257, 257));
        let want2 = expected_sink(&src, 257 * 8192, sink2.addr(), &local2, &remote2);
        let wr2 = t.w.rdma_write(a, t.conn, local2, remote2);
        assert!(t.w.run_until_idle(limit(&t.w, 10)), "{:?}", t.w.stats());
        assert_eq!(t.w.rdma_status(a, wr), Some(WcStatus::Success));
        assert_eq!(t.w.rdma_status(a, wr2), Some(WcStatus::Success));
        assert!(t.w.region(b, &t.sink).unwrap() == &want[..]);
        assert!(t.w.registry(b).contents(&sink2).unwrap() == want2);
        let s = t.w.stats();
        assert_eq!(
            (s.rdma_writes, s.rdma_bytes, s.rdma_errors),
            (2, 150_001 + MIB as u64, 0)
        );
    }

    #[test]
    fn malformed_rdma_writes_fail_and_write_nothing() {
        type Frags = (Vec<LocalFrag>, Vec<RemoteFrag>);
        type Make = fn(&Registration, &Registration) -> Frags;
        let cases: [(&str, Make); 5] = [
            ("258 fragments a side", |s, r| {
                (
                    (0..258).map(|i| s.local_frag(i * 8, 8)).collect(),
                    (0..258).map(|i| r.remote_frag(i * 16, 8)).collect(),
                )
            }),
            ("totals differ", |s, r| {
                (
                    vec![s.local_frag(0, 100), s.local_frag(100, 100)],
                    vec![r.remote_frag(0, 150), r.remote_frag(1000, 49)],
                )
            }),
            ("a later local fragment outside its region", |s, r| {
                (
                    vec![s.local_frag(0, 100), s.local_frag(MIB as u64 - 50, 100)],
                    vec![r.remote_frag(0, 200)],
                )
            }),
            ("a later remote fragment outside its region", |s, r| {
                (
                    vec![s.local_frag(0, 200)],
                    vec![r.remote_frag(0, 100), r.remote_frag(MIB as u64 - 50, 100)],
                )
            }),
            ("no fragments", |_, _| (vec![], vec![])),
        ];
        for (what, make) in cases {
            let mut t = bulk(71);
            let (a, b) = (t.a, t.b);
            let (local, remote) = make(&t.src, &t.sink);
            let wr = t.w.rdma_write(a, t.conn, local, remote);
            let c = send_n(&mut t.w, a, b, 1, 64)[0];
            assert!(t.w.run_until_idle(limit(&t.w, 10)), "{what}");
            assert_eq!(t.w.rdma_status(a, wr), Some(WcStatus::Error), "{what}");
            assert!(
                t.w.region(b, &t.sink).unwrap().iter().all(|&x| x == 0),
                "{what}"
            );
            assert!(
                matches!(t.w.outcome(c).unwrap().1, SendOutcome::Failed(_)),
                "{what}"
            );
            let s = t.w.stats();
            assert_eq!((s.rdma_errors, s.rdma_writes), (1, 0), "{what}");
        }
    }
}
