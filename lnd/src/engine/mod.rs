//! The o2ib LND engine: one endpoint per NI, sans-IO.
//!
//! Inputs are `handle_*(now, ..)` calls (fabric events, timer expiry) and the upper-layer calls
//! `send` / `recv_done` / `shutdown`; outputs are drained with `poll_action` (fabric work),
//! `poll_event` (news for LNet) and `poll_timeout` (when to call `handle_timeout` next). After any
//! input, drain all three, in that order. The engine never reads a clock, spawns a thread or does
//! I/O, so a simulator can run thousands of endpoints deterministically.
//!
//! What it does, with the o2iblnd behaviour it follows (o2iblnd_cb.c unless noted):
//! - connection setup and every reject reason (kiblnd_active_connect, kiblnd_passive_connect,
//!   kiblnd_check_connreply, kiblnd_rejected);
//! - credits: credits, outstanding and reserved credits, the reserved / credit / no-credit queues,
//!   credits piggy-backed on every message, a NOOP at the high-water mark, concurrent_sends
//!   (kiblnd_check_sends_locked, kiblnd_need_noop, kiblnd_post_rx);
//! - races: the strict higher-NID rule, the LU-7646 counter, the LU-17480 connect deadline, and
//!   abandoning an attempt proven stale (ours), see [`race`];
//! - reconnect pacing (LU-5718/LU-7569): only after the failed connection is reaped, a few fast
//!   retries then one per interval per peer, with jitter;
//! - liveness: tx deadlines, keepalive NOOPs, peer down with a reason; every message ends with a
//!   status;
//! - connd's work driven by the timer wheel, so its cost follows what expired;
//! - graceful close always: Disconnect first, a bounded wait, then Destroy; shutdown closes all.
//!
//! Files: this one holds the endpoint (its state, its public API, the transition funnel);
//! `handshake` connection setup and races, `credits` the send scheduler, `tx` a message's life
//! and what arrives, `connd` closes, reaps, reconnects, keepalives and forgetting peers; the
//! transition table is `conn`, the race rule `race`, tunables `config`, events and counters
//! `events`.

pub use crate::iface::o2ib as config;
pub mod conn;
mod connd;
mod credits;
pub mod events;
mod handshake;
mod lnd;
pub mod race;
mod rdma;
#[cfg(test)]
mod tests;
mod tx;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tracing::{debug, error, trace, warn};

pub use config::{ChecksumConfig, EndpointConfig, RaceOrder, RacePolicy, Tunables};
pub use conn::{ConnInput, ConnState};
pub use events::{BulkOp, DownReason, LndEvent, LndStats, RxToken, SendError, TxError};
pub use race::{adopts_peer_order, resolve_race, RaceDecision, RaceInput};
pub use rdma::RdmaSink;

use crate::fabric::{
    ConnId, ConnectFailure, DisconnectReason, FabricAction, FabricEvent, FabricSink, LocalFrag,
    PrivateData, RemoteFrag, RequestId, WcStatus, WrId,
};
use crate::handle::{handle_type, HandleSlab};
use crate::slots::Slots;
use crate::time::{Duration, Instant};
use crate::trim::{Capacity, CapacityReport, Trim, TRIM_FLOOR, TRIM_FLOOR_SMALL, TRIM_INTERVAL};
use crate::wheel::{TimerKey, TimerWheel};
use crate::wire::errno::{EMSGSIZE, ENODATA, EPROTO};
use crate::wire::kib::{
    CksumFlavour, Completion, EmitOpts, Framing, KibMsgType, MAX_INLINE, MAX_RDMA_FRAGS, MSG_SIZE,
    VERSION_2,
};
use crate::wire::{ConnParams, KibBody, KibMsg, KibRej, LnetHdr, Nid, RejectReason};

/// Out-of-band receive slots per connection beyond 2 x queue depth (V2: one keepalive, one for
/// returning credits).
const OOB_SLOTS: u16 = 2;
/// NOOPs allowed in flight per connection (IBLND_OOB_MSGS for V2).
const MAX_NOOPS_POSTED: u16 = 2;
/// Passive handshakes one peer instance may have in flight at once (its attempts and a second
/// beside a slow one, or o2iblnd's `conns_per_peer`). A request beyond it supersedes the oldest,
/// so a peer that keeps asking is bounded, not refused.
const MAX_ACCEPTING: usize = 4;
/// Established connections one peer instance may have opened to us: o2iblnd's largest
/// `conns_per_peer`. A request beyond it closes the oldest of them (ours to it are not counted):
/// a peer that loses its ends without telling us cannot pile up dead connections here.
pub const MAX_CONNS_PER_PEER: usize = 127;
/// How many replaced incarnations of a peer are remembered (enough for a few quick restarts in
/// a row, each of whose requests may still be in flight).
const SUPERSEDED_KEPT: usize = 4;

type PeerIdx = usize;

handle_type! {
    /// A message's handle; its `as_u64` is the send's work-request id.
    type TxKey = Handle<TxTag>, "tx";
}

fn wr_of(key: TxKey) -> WrId {
    WrId(key.as_u64())
}

/// What a timer is for. Each is checked against the live object when it fires, so a timer for
/// something already gone is harmless.
#[derive(Copy, Clone, Debug)]
enum TimerEvent {
    /// Connect deadline, keepalive or close deadline, by the connection's state.
    Conn(ConnId),
    /// A message's LND deadline.
    Tx(TxKey),
    /// A grant of our memory to a peer (our PUT_ACK or GET_REQ) is due to be reclaimed:
    /// `Tunables::grant_timeout` passed without its completion.
    Grant(TxKey),
    /// connd: destroy a zombie.
    Reap(ConnId),
    /// connd: a paced reconnect is due.
    Reconnect(PeerIdx),
    /// connd: an active connect has gone unanswered for `connect_hedge`.
    Hedge(ConnId),
    /// connd: give back the room a burst left in the tables (see [`crate::trim`]).
    Trim,
}

enum TxBody {
    Immediate {
        hdr: LnetHdr,
        payload: Vec<u8>,
    },
    Noop {
        keepalive: bool,
    },
    /// PUT_REQ: a PUT or REPLY whose payload is in registered memory (`src`), waiting for the
    /// sink's PUT_ACK or PUT_NAK (kiblnd_send, the rendezvous branch).
    PutReq {
        hdr: LnetHdr,
        src: Vec<LocalFrag>,
    },
    /// GET_REQ: a GET whose REPLY is to be written into `sink`, waiting for GET_DONE.
    GetReq {
        hdr: LnetHdr,
        sink: RdmaSink,
    },
    /// PUT_ACK: our `sink` for the peer's PUT_REQ `src_cookie`, waiting for its PUT_DONE
    /// (kiblnd_recv, IBLND_MSG_PUT_REQ).
    PutAck {
        src_cookie: u64,
        sink: RdmaSink,
    },
    /// The data of a rendezvous, written into the peer's advertised sink right ahead of the
    /// completion that tells it so (kiblnd_init_rdma). Taken when posted.
    Write {
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
    },
    /// PUT_NAK, PUT_DONE or GET_DONE: a rendezvous completion, sent without a credit.
    Completion {
        kind: KibMsgType,
        done: Completion,
    },
}

#[derive(Copy, Clone, PartialEq, Eq)]
enum TxPlace {
    /// On the peer's queue, waiting for a connection.
    Peer,
    /// On one of a connection's queues.
    Queued(ConnId),
    /// Posted to the fabric, waiting for its send completion.
    Posted(ConnId),
    /// Sent, and waiting for the peer's completion of its rendezvous (o2iblnd tx_waiting).
    Waiting(ConnId),
}

struct Tx {
    peer: PeerIdx,
    body: TxBody,
    /// LNet's cookie; `None` for NOOPs, which LNet never sees.
    cookie: Option<u64>,
    timer: Option<TimerKey>,
    place: TxPlace,
    /// When it was put on a connection's queue: a peer heard from since then is not silent.
    queued_at: Instant,
    /// A rendezvous step still owed by the peer (PUT_ACK / PUT_NAK, PUT_DONE, GET_DONE): the
    /// message is finished only once this is clear and its own send has completed.
    waiting: bool,
    /// The rendezvous status to report: the peer's completion (bytes written, or a negative
    /// errno), or, for a completion we send, the status it carries.
    status: i32,
    /// Our PUT_ACK or GET_REQ: how many bytes of its sink, from the start, the peer has
    /// written at least once, as the fabric reported ([`FabricEvent::WritesCovered`]).
    covered: u64,
    /// Our PUT_ACK or GET_REQ: when its grant is reclaimed if its completion has not come.
    grant_timer: Option<TimerKey>,
}

/// A rendezvous request from the peer, held until LNet answers it (by its receive slot, which
/// stays unposted until then).
struct PendingRdma {
    slot: u16,
    /// The peer's cookie, echoed in our answer.
    cookie: u64,
    /// For a GET_REQ, the peer's sink; empty for a PUT_REQ.
    sink: RdmaSink,
    get: bool,
}

struct Conn {
    peer: PeerIdx,
    state: ConnState,
    active: bool,
    /// The peer's incarnation on this connection (the CONNACK's or CONNREQ's srcstamp).
    peer_stamp: u64,
    /// The dststamp our CONNREQ carried (active side): if the peer's instance is not that one,
    /// the attempt is doomed.
    sent_dst_stamp: u64,
    /// Active side: while this attempt was in flight we refused the peer's own request with
    /// CONN_RACE. If the peer refuses this attempt with CONN_RACE too, it orders NIDs the other
    /// way.
    refused_peer_race: bool,
    /// The peer asked for another connection while this one was up: it may have lost its end
    /// (our close of it lost in a partition). New messages take another connection until the
    /// peer is heard on this one again; a keepalive NOOP probes it meanwhile.
    probation: bool,
    /// When probation started: a send queued since then that completes proves the far end.
    probation_since: Instant,
    queue_depth: u16,
    max_frags: u16,
    credits: u16,
    outstanding: u16,
    reserved: u16,
    nsends_posted: u16,
    noops_posted: u16,
    tx_rsrvd: VecDeque<TxKey>,
    tx_cred: VecDeque<TxKey>,
    tx_nocred: VecDeque<TxKey>,
    last_send: Instant,
    /// When the peer was last heard from on this connection (any message, NOOPs included).
    last_recv: Instant,
    timer: Option<TimerKey>,
    /// The first error that closed it; `None` for a graceful close.
    error: Option<DownReason>,
    /// Whether to reconnect once it is reaped.
    reconnect: bool,
    /// Whether we have told the fabric to disconnect it.
    disconnect_sent: bool,
    /// Messages that arrived before the passive side saw ESTABLISHED (kiblnd ibc_early_rxs).
    early_rx: Vec<(u16, Vec<u8>)>,
    /// The peer's rendezvous requests LNet has not answered yet.
    rdma_rx: Vec<PendingRdma>,
    created: Instant,
}

struct Peer {
    nid: Nid,
    /// The peer's incarnation as last known; 0 = never known.
    incarnation: u64,
    /// Incarnations of the peer that a newer one replaced, newest last (0 = empty slot): a
    /// connect request still in flight from one of them when the new instance's came first
    /// must not be taken for a "restart" back to it.
    superseded: [u64; SUPERSEDED_KEPT],
    version: u16,
    queue_depth: u16,
    max_frags: u16,
    /// Messages waiting for a connection.
    tx_queue: VecDeque<TxKey>,
    /// Established connections, oldest first: ours and the peer's (both sides may connect at
    /// once, a slow attempt may have a second beside it, o2iblnd's `conns_per_peer` opens
    /// several), at most [`MAX_CONNS_PER_PEER`] of the peer's; a self-connection has both ends.
    conns: Vec<ConnId>,
    /// Our active connect in flight (the newer one when two are).
    active: Option<ConnId>,
    /// An earlier active connect that had gone unanswered for `connect_hedge` when `active`
    /// started beside it; it may still win, until `active` has waited its turn (see
    /// `Endpoint::hedge_due`).
    stalled: Option<ConnId>,
    /// Earlier attempts given up since the peer was last connected: each doubles how long
    /// the next pair waits before its earlier one is given up.
    hedge_round: u8,
    /// Passive connections waiting for ESTABLISHED, oldest first, at most [`MAX_ACCEPTING`]
    /// (o2iblnd's `ibp_accepting` counts them the same way: a newer request does not make an
    /// older one dead).
    accepting: Vec<ConnId>,
    zombies: u32,
    peak_zombies: u32,
    /// A reconnect is wanted as soon as the zombies are reaped.
    reconnect_wanted: bool,
    reconnect_timer: Option<TimerKey>,
    /// Connect attempts since the last success (LU-7569's ibp_reconnected).
    attempts: u32,
    last_attempt: Option<Instant>,
    /// CONN_RACE rejects we sent this peer since our last accept of it (LU-7646's ibp_races).
    races: u32,
    /// CONN_RACE rejects this peer has sent us since our last connection to it.
    races_received: u32,
    /// The most CONN_RACE rejects this peer ever sent us between two connections.
    peak_races_received: u32,
    /// The last connect failed because the peer refused it (no listener, or it rejected the
    /// request), not because it could not be reached: what waits for it then fails with
    /// [`TxError::ConnectRefused`] (o2iblnd's ECONNREFUSED, REMOTE_DROPPED).
    refused: bool,
    /// Whether LNet was last told the peer is up.
    up: bool,
    /// Whether LNet was last told the peer is down.
    reported_down: bool,
    /// The checksum flavour the peer's own checksummed messages use, once seen.
    cksum: Option<CksumFlavour>,
    /// Where the next message starts looking when `conns_per_peer` spreads them over several
    /// connections (kiblnd_get_conn_locked's ibp_next_conn).
    next_conn: usize,
    /// `maybe_add_conn` was put off while a zombie of the peer's was being torn down.
    add_conn_after_reap: bool,
    /// Races in which both sides refused each other since we last switched order for this
    /// peer.
    disagreements: u32,
    /// When the last disagreement was counted (one per race, not one per attempt in it).
    disagreed_at: Option<Instant>,
}

impl Peer {
    fn connecting(&self) -> bool {
        self.active.is_some()
            || self.stalled.is_some()
            || !self.accepting.is_empty()
            || self.reconnect_timer.is_some()
    }

    /// Whether `stamp` names an instance of the peer that a newer one replaced.
    fn is_superseded(&self, stamp: u64) -> bool {
        stamp != 0 && self.superseded.contains(&stamp)
    }

    /// The peer is now instance `stamp`; the one we knew (if any, and not the same) is gone.
    fn set_incarnation(&mut self, stamp: u64) {
        let old = self.incarnation;
        if let Some(s) = self.superseded.iter_mut().find(|s| **s == stamp) {
            *s = 0;
        }
        if old != 0 && old != stamp && !self.superseded.contains(&old) {
            self.superseded.rotate_left(1);
            self.superseded[SUPERSEDED_KEPT - 1] = old;
        }
        self.incarnation = stamp;
    }
}

/// A read-only view of a peer, for tools and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerView {
    pub nid: Nid,
    pub incarnation: u64,
    pub established: usize,
    pub connecting: bool,
    pub zombies: u32,
    /// The most zombies this peer ever had at once.
    pub peak_zombies: u32,
    pub queued: usize,
    pub races: u32,
    /// The most CONN_RACE rejects this peer sent us between two of our connections to it.
    pub peak_races_received: u32,
    pub attempts_since_success: u32,
    pub up: bool,
}

/// A read-only view of a connection, for `lnetctl conn show` and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnView {
    pub id: ConnId,
    pub peer: Nid,
    pub state: ConnState,
    pub active: bool,
    pub peer_incarnation: u64,
    pub queue_depth: u16,
    pub credits: u16,
    pub outstanding_credits: u16,
    pub reserved_credits: u16,
    pub sends_posted: u16,
    pub queued: usize,
    pub created: Instant,
}

/// One LND instance on one NI.
pub struct Endpoint {
    cfg: EndpointConfig,
    now: Instant,
    conns: HandleSlab<Conn, crate::fabric::ConnTag>,
    /// Peers with a connection, a connect under way, or something queued; an idle one is
    /// forgotten (`maybe_forget`), so the slot of a forgotten peer is never referred to.
    peers: Slots<Peer>,
    peer_index: HashMap<Nid, PeerIdx>,
    /// The race order learned for peers that order NIDs unlike our NI (kept when the peer itself
    /// is forgotten, bounded by the peer limit).
    learned_orders: HashMap<Nid, RaceOrder>,
    txs: HandleSlab<Tx, TxTag>,
    wheel: TimerWheel<TimerEvent>,
    actions: VecDeque<FabricAction>,
    events: VecDeque<LndEvent>,
    stats: LndStats,
    rng: u64,
    /// How long our active connects take to be established (a smoothed mean, as TCP's srtt),
    /// once one has been: a hedge waits at least four of these (see `Endpoint::hedge_delay`).
    connect_srtt: Option<Duration>,
    shutting_down: bool,
    leaks: Arc<AtomicU64>,
    /// Message buffers given back by the fabric and by LNet, reused for the next sends and
    /// receives so that the steady state allocates nothing per message.
    pool: Vec<Vec<u8>>,
    /// Copies of every message sent and received while a capture is on (`lnetctl capture`).
    capture: Option<VecDeque<Captured>>,
    /// A [`TimerEvent::Trim`] is pending: armed when a table grows past [`TRIM_FLOOR`], kept
    /// while one is still large, so an endpoint with small tables has no such timer.
    trim_armed: bool,
    /// The room the last trim pass left in the tables that arm it (at least [`TRIM_FLOOR`]):
    /// growth past it arms the next pass.
    trim_mark: usize,
    /// The fabric reports which granted bytes a peer wrote ([`FabricEvent::WritesCovered`]):
    /// a PUT_DONE or GET_DONE is then accepted only if its data all arrived.
    fabric_sees_writes: bool,
}

/// Buffers the engine keeps for reuse; beyond this, given-back buffers are freed.
const POOL_MAX: usize = 1024;
/// Captured messages held until the driver drains them; beyond this, new ones are dropped and
/// counted (`LndStats::capture_drops`) rather than growing without bound.
const CAPTURE_MAX: usize = 65536;

/// Which way a captured message went.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CaptureDir {
    Sent,
    Received,
}

/// One kib message as it crossed the fabric (see [`Endpoint::set_capture`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Captured {
    /// When the engine handed it to the fabric, or got it from the fabric.
    pub at: Instant,
    pub dir: CaptureDir,
    pub conn: ConnId,
    /// The peer's NID on that connection.
    pub peer: Nid,
    /// The whole kib message, as on the wire.
    pub bytes: Vec<u8>,
}

impl Endpoint {
    /// Starts an endpoint at `now`.
    pub fn new(cfg: EndpointConfig, now: Instant) -> Endpoint {
        let rng = cfg.seed | 1;
        Endpoint {
            now,
            conns: HandleSlab::new(),
            peers: Slots::new(),
            peer_index: HashMap::new(),
            learned_orders: HashMap::new(),
            txs: HandleSlab::new(),
            wheel: TimerWheel::new(now, Duration::from_millis(1)),
            actions: VecDeque::new(),
            events: VecDeque::new(),
            stats: LndStats::default(),
            rng,
            connect_srtt: None,
            shutting_down: false,
            leaks: Arc::new(AtomicU64::new(0)),
            pool: Vec::new(),
            capture: None,
            trim_armed: false,
            trim_mark: TRIM_FLOOR,
            fabric_sees_writes: false,
            cfg,
        }
    }

    /// Says whether the fabric below reports the writes it sees land in our grants
    /// ([`FabricEvent::WritesCovered`]; `Driver::sees_writes`). When it does, a PUT_DONE or
    /// GET_DONE with a success status completes only if every byte it accounts for was written
    /// at least once (coverage, not a count: a byte written twice counts once); otherwise the
    /// transfer fails with -EPROTO, nothing of it is handed on, and the connection is closed
    /// as a protocol error (`rdma_short_writes`). A grant that outlives
    /// [`Tunables::grant_timeout`] is revoked there; on a fabric that cannot see writes
    /// (verbs), the connection is closed instead, so the peer can no longer write into memory
    /// that goes back to a pool.
    pub fn set_fabric_sees_writes(&mut self, on: bool) {
        self.fabric_sees_writes = on;
    }

    /// Whether the fabric reports the writes it sees (see [`Endpoint::set_fabric_sees_writes`]).
    pub fn fabric_sees_writes(&self) -> bool {
        self.fabric_sees_writes
    }

    /// Gives a message buffer back for reuse (a `FabricAction::Send`'s bytes once the fabric
    /// has copied them, or a `Received` payload once LNet is done with it).
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        // Only message-sized buffers: a big one handed back would stay pinned in the pool.
        if self.pool.len() < POOL_MAX && (MSG_SIZE..=2 * MSG_SIZE).contains(&buf.capacity()) {
            buf.clear();
            self.pool.push(buf);
        }
    }

    /// An empty buffer for a payload to hand to [`Lnd::send`](crate::iface::Lnd::send), from
    /// the pool when it has one (no allocation in the steady state).
    pub fn take_buffer(&mut self) -> Vec<u8> {
        self.pool
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(MSG_SIZE))
    }

    /// Starts (`true`) or stops recording every message sent and received; drain the records
    /// with [`Endpoint::poll_captured`]. Stopping drops records not drained yet.
    ///
    /// Recorded: every MSG (NOOP, IMMEDIATE, PUT_*, GET_*) as sent and as received, and the
    /// CONNREQ / CONNACK carried in connection-manager private data (a received CONNREQ before
    /// any check, with connection id 0.0 since it has none yet). Rejects (not kib messages) and
    /// private data that does not parse are not recorded.
    pub fn set_capture(&mut self, on: bool) {
        self.capture = on.then(VecDeque::new);
    }

    /// True while a capture is on.
    pub fn is_capturing(&self) -> bool {
        self.capture.is_some()
    }

    /// The next captured message, oldest first.
    pub fn poll_captured(&mut self) -> Option<Captured> {
        self.capture.as_mut()?.pop_front()
    }

    fn record(&mut self, dir: CaptureDir, conn: ConnId, peer: Nid, bytes: &[u8]) {
        let at = self.now;
        let Some(q) = self.capture.as_mut() else {
            return;
        };
        if q.len() >= CAPTURE_MAX {
            self.stats.capture_drops += 1;
            return;
        }
        q.push_back(Captured {
            at,
            dir,
            conn,
            peer,
            bytes: bytes.to_vec(),
        });
        let cap = q.capacity();
        self.note_growth(cap);
    }

    /// This NI's NID.
    pub fn nid(&self) -> Nid {
        self.cfg.nid
    }

    /// This instance's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.cfg.incarnation
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &LndStats {
        &self.stats
    }

    /// A counter that outlives the endpoint: connections it still owned when it was dropped.
    pub fn leak_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.leaks)
    }

    /// Views of every peer.
    pub fn peers(&self) -> impl Iterator<Item = PeerView> + '_ {
        self.peers.iter().map(|(_, p)| p.view())
    }

    /// Peers the LND holds now (each with a connection, a connect or something queued).
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// The view of one peer.
    pub fn peer(&self, nid: Nid) -> Option<PeerView> {
        let i = *self.peer_index.get(&nid)?;
        self.peers.get(i).map(Peer::view)
    }

    /// Views of every connection.
    pub fn conns(&self) -> impl Iterator<Item = ConnView> + '_ {
        self.conns.iter().map(|(id, c)| ConnView {
            id,
            peer: self.peers[c.peer].nid,
            state: c.state,
            active: c.active,
            peer_incarnation: c.peer_stamp,
            queue_depth: c.queue_depth,
            credits: c.credits,
            outstanding_credits: c.outstanding,
            reserved_credits: c.reserved,
            sends_posted: c.nsends_posted,
            queued: c.tx_rsrvd.len() + c.tx_cred.len() + c.tx_nocred.len(),
            created: c.created,
        })
    }
}

impl Peer {
    fn view(&self) -> PeerView {
        let p = self;
        PeerView {
            nid: p.nid,
            incarnation: p.incarnation,
            established: p.conns.len(),
            connecting: p.connecting(),
            zombies: p.zombies,
            peak_zombies: p.peak_zombies,
            queued: p.tx_queue.len(),
            races: p.races,
            peak_races_received: p.peak_races_received,
            attempts_since_success: p.attempts,
            up: p.up,
        }
    }
}

impl Endpoint {
    /// Bytes of engine state, estimated from the capacities of its tables (for the scale bench).
    pub fn state_bytes(&self) -> usize {
        use core::mem::size_of;
        let queues: usize = self
            .conns
            .iter()
            .map(|(_, c)| {
                (c.tx_rsrvd.capacity() + c.tx_cred.capacity() + c.tx_nocred.capacity())
                    * size_of::<TxKey>()
            })
            .sum::<usize>()
            + self
                .peers
                .iter()
                .map(|(_, p)| {
                    p.tx_queue.capacity() * size_of::<TxKey>()
                        + p.conns.capacity() * size_of::<ConnId>()
                })
                .sum::<usize>();
        size_of::<Endpoint>()
            + self.conns.capacity() * size_of::<Conn>()
            + self.peers.capacity() * size_of::<Peer>()
            + self.peer_index.capacity() * (size_of::<Nid>() + size_of::<PeerIdx>() + 8)
            + self.txs.capacity() * size_of::<Tx>()
            + self.wheel.len() * 48
            + queues
    }

    /// What each table holds and the room it keeps (per-peer and per-connection queues summed),
    /// for tests and tools: what a burst left behind, and what the trim gave back.
    pub fn capacities(&self) -> Vec<Capacity> {
        let mut r = CapacityReport::default();
        r.add("txs", &self.txs);
        r.add("conns", &self.conns);
        r.add("peers", &self.peers);
        r.add("peer_index", &self.peer_index);
        r.add("learned_orders", &self.learned_orders);
        r.add("timers", &self.wheel);
        r.add("actions", &self.actions);
        r.add("events", &self.events);
        if let Some(q) = &self.capture {
            r.add("capture", q);
        }
        for (_, c) in self.conns.iter() {
            r.add("conn_queues", &c.tx_rsrvd);
            r.add("conn_queues", &c.tx_cred);
            r.add("conn_queues", &c.tx_nocred);
        }
        for (_, p) in self.peers.iter() {
            r.add("peer_queues", &p.tx_queue);
        }
        r.finish()
    }

    /// Messages accepted by `send` and not yet finished.
    pub fn pending_sends(&self) -> usize {
        self.txs.iter().filter(|(_, t)| t.cookie.is_some()).count()
    }

    // ---------------------------------------------------------------- outputs

    /// The next thing for the fabric to do.
    pub fn poll_action(&mut self) -> Option<FabricAction> {
        self.actions.pop_front()
    }

    /// The next piece of news for LNet.
    pub fn poll_event(&mut self) -> Option<LndEvent> {
        self.events.pop_front()
    }

    /// When `handle_timeout` should next be called (it may be early; never late).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.wheel.next_deadline()
    }

    /// True once `shutdown` was called and every connection has been destroyed.
    pub fn is_shut_down(&self) -> bool {
        self.shutting_down && self.conns.is_empty()
    }

    // ---------------------------------------------------------------- upper layer

    /// LNet is done with a received message: repost its slot and return the credit. For a
    /// rendezvous request ([`LndEvent::BulkRequest`]) this means nothing matched: the peer gets
    /// PUT_NAK with status 0 (its PUT is done, as a PUT nobody wanted is in LNet) or GET_DONE
    /// with -ENODATA, as kiblnd_recv answers a request LNet dropped.
    pub fn recv_done(&mut self, now: Instant, rx: RxToken) {
        self.advance(now);
        let Some(c) = self.established_mut(rx.conn_id()) else {
            return;
        };
        if let Some(req) = Self::take_pending(c, rx.slot16()) {
            let status = if req.get { -ENODATA } else { 0 };
            return self.refuse_pending(rx, req, status);
        }
        c.outstanding = c.outstanding.saturating_add(1);
        self.actions.push_back(FabricAction::PostRecv {
            conn: rx.conn_id(),
            slot: rx.slot16(),
        });
        self.check_sends(rx.conn_id(), false);
    }

    /// LNet refused a received message as a protocol violation (lnet_parse returned -EPROTO:
    /// a message for another node addressed to a peer on the net it arrived on): the slot is
    /// not reposted and the connection it came on is closed, as o2iblnd closes a connection
    /// whose receive LNet failed (kiblnd_handle_rx). Counted in `rx_refused`.
    pub fn recv_failed(&mut self, now: Instant, rx: RxToken) {
        self.advance(now);
        self.stats.rx_refused += 1;
        self.close_conn(rx.conn_id(), Some(DownReason::ProtocolError));
    }

    /// Stops the endpoint: refuses new work, fails queued messages, and closes every connection
    /// gracefully. Keep driving it until [`Endpoint::is_shut_down`].
    pub fn shutdown(&mut self, now: Instant) {
        self.advance(now);
        if self.shutting_down {
            return;
        }
        debug!(nid = %self.cfg.nid, conns = self.conns.len(), "LND shutting down");
        self.shutting_down = true;
        let all: Vec<PeerIdx> = self.peers.iter().map(|(p, _)| p).collect();
        for p in all {
            self.cancel_reconnect(p);
            self.peers[p].reconnect_wanted = false;
            self.fail_peer_queue(p, TxError::Shutdown);
        }
        let ids: Vec<ConnId> = self.conn_ids();
        for id in ids {
            self.close_conn(id, None);
        }
    }

    // ---------------------------------------------------------------- fabric inputs

    // ---------------------------------------------------------------- internals

    fn advance(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
    }

    fn conn(&self, id: ConnId) -> Option<&Conn> {
        self.conns.get(id)
    }

    fn conn_mut(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.conns.get_mut(id)
    }

    /// The connection `id` while it is established: what a received message's answer
    /// (`recv_done`, a rendezvous answer) is for; once it closes there is nothing to answer.
    fn established_mut(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.conn_mut(id)
            .filter(|c| c.state == ConnState::Established)
    }

    fn conn_ids(&self) -> Vec<ConnId> {
        self.conns.handles()
    }

    /// Applies one input to a connection's state, keeping the peer's zombie count in step.
    fn transition(&mut self, id: ConnId, input: ConnInput) -> Option<ConnState> {
        let c = self.conn_mut(id)?;
        let from = c.state;
        match from.next(input) {
            Ok(to) => {
                c.state = to;
                let p = c.peer;
                if !from.is_zombie() && to.is_zombie() {
                    let peer = &mut self.peers[p];
                    peer.zombies += 1;
                    peer.peak_zombies = peer.peak_zombies.max(peer.zombies);
                    self.stats.zombies += 1;
                }
                Some(to)
            }
            Err(e) => {
                error!(conn = ?id, %e, "invalid connection transition");
                self.stats.invalid_transitions += 1;
                None
            }
        }
    }
}

/// The engine is where every fabric event ends up, directly (a bare endpoint) or through the
/// LNet runtime that owns it.
impl FabricSink for Endpoint {
    fn fabric_event(&mut self, now: Instant, ev: FabricEvent<'_>) {
        match ev {
            FabricEvent::ConnectRequest { req, private } => {
                self.handle_connect_request(now, req, private)
            }
            FabricEvent::Established { conn, private } => {
                self.handle_established(now, conn, private)
            }
            FabricEvent::ConnectFailed { conn, why } => self.handle_connect_failed(now, conn, why),
            FabricEvent::Recv { conn, slot, bytes } => self.handle_recv(now, conn, slot, bytes),
            FabricEvent::SendComplete { conn, wr, status } => {
                self.handle_send_complete(now, conn, wr, status)
            }
            FabricEvent::Disconnected { conn, why } => self.handle_disconnected(now, conn, why),
            FabricEvent::WritesCovered { conn, id, prefix } => {
                self.handle_writes_covered(now, conn, id, prefix)
            }
        }
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        Endpoint::recycle(self, buf);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let live = self.conns.len() as u64;
        if live > 0 {
            // The 3FS #426 failure: connections released without a close. Their peers will only
            // find out through their own timeouts. Say so loudly, and count it.
            error!(nid = %self.cfg.nid, connections = live,
                   "LND endpoint dropped while it still owns connections: no graceful close was done");
            self.stats.ungraceful_drops += live;
            self.leaks.fetch_add(live, Ordering::Relaxed);
        }
    }
}
