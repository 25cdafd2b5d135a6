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
//! # Stream hosts (socklnd)
//!
//! A node with a stream address ([`SimNode::stream_addr`]; a [`crate::sock::SockEngine`] has
//! its NID's) is also a host of the world's [`streams::StreamNet`], a TCP-like network in the
//! same virtual time (its model is in that module). The world applies the node's
//! [`SimNode::poll_stream_action`]s as it applies its fabric actions, hands it each report
//! through [`SimNode::stream_event`] (then drains it), and runs the network's dues in turn with
//! its own events (a world event first at equal times), so a run still replays from its seed;
//! the network draws from its own RNG, seeded from the world's. The world's faults reach it:
//! a crash takes the host down with the node (its connections vanish silently), a reboot or
//! restart brings it back with no connection, a completed shutdown has the host's kernel close
//! what the node left open, partitions cut streams too. Its own faults:
//! [`World::stream_partial_io`] (short reads and writes), [`World::stall_streams`] (one
//! direction holds its bytes: a peer that stops ACKing), [`World::reset_streams`].
//! [`World::is_idle`] counts stream work in flight, not a stack's timers. `World<SockEngine>`
//! runs bare socklnd engines (`World::send` / `World::send_bulk` for it); scenarios are in
//! `sock_tests.rs`.
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
//!
//! Layout: `world` (building, querying and running the world, the event queue, each node's upper
//! layer), `cm` (what a node's actions do, through [`Fabric`], and the connection manager's
//! events), `qp` (registered memory, send queues, RDMA writes, completions), `faults` (faults and
//! lifecycle), `record` (outcomes, received messages, counters), `streams` (the stream network),
//! `stream_world` (the world's side of it), `sock` (a socklnd engine as a node); the state they
//! share is here.

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
use crate::stream::{StreamAction, StreamEvent};
use crate::time::{Duration, Instant};
use std::net::Ipv4Addr;
use streams::{HostId, StreamNet, StreamNetConfig};

/// Why an end hears `handle_disconnected`: a DREQ (the peer's, or the DREP to ours) is a close;
/// a DREQ retried to the horizon, or a handshake given up on, is the transport failing.
const CLOSED: DisconnectReason = DisconnectReason::Closed;
const LOST: DisconnectReason = DisconnectReason::TransportError;
use crate::wire::{KibRej, LnetHdr, Nid, RejectReason};

mod cm;
mod faults;
mod qp;
mod record;
mod sock;
mod stream_world;
pub mod streams;
mod world;

pub use qp::NodeRegistry;
pub use record::*;

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

    /// The node's address on the world's stream network ([`streams::StreamNet`]), if it has a
    /// streaming NI (socklnd): it is then a host there, its stream actions are applied and its
    /// stream events delivered. `None` (the default): a fabric-only node.
    fn stream_addr(cfg: &Self::Config) -> Option<Ipv4Addr> {
        let _ = cfg;
        None
    }
    /// The next stream action (drained as fabric actions are).
    fn poll_stream_action(&mut self) -> Option<StreamAction> {
        None
    }
    /// One event of the stream network for this node, at `now`.
    fn stream_event(&mut self, now: Instant, ev: StreamEvent<'_>) {
        let _ = (now, ev);
    }
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
    crate::forward_lifecycle!(Endpoint, LndEvent);
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
    /// The stream network stream hosts ([`SimNode::stream_addr`]) are on. Its `seed` is not
    /// used: the network's RNG is seeded from `seed` (its own stream of numbers, so stream
    /// faults never perturb the fabric's choices, nor the other way round).
    pub streams: StreamNetConfig,
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
            streams: StreamNetConfig::default(),
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
    /// Its host on the stream network, if it has a stream address.
    host: Option<HostId>,
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
    /// The stream network of the nodes that have a stream address.
    streams: StreamNet,
    /// The node of each stream host, by `HostId`.
    host_nodes: Vec<NodeId>,
    /// The host pairs each live partition cut on the stream network, by partition bit.
    stream_cuts: FxMap<u8, Vec<(HostId, HostId)>>,
    /// Stream reports are being handed out (a node acting on one does not start another round).
    delivering: bool,
}

/// An LNet PUT header from `src` to `dst` for a `payload_len`-byte payload, with `match_bits`
/// (tests use it as a sequence number).
pub fn put_hdr(src: Nid, dst: Nid, payload_len: usize, match_bits: u64) -> LnetHdr {
    LnetHdr::put(src, dst, payload_len as u32, 4, match_bits)
}

#[cfg(test)]
mod rdma_tests;

#[cfg(test)]
mod stream_world_tests;

#[cfg(test)]
mod tests;
