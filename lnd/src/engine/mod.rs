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

pub mod config;
pub mod conn;
pub mod events;
pub mod race;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use slab::Slab;
use tracing::{debug, error, trace, warn};

pub use config::{ChecksumConfig, EndpointConfig, RaceOrder, RacePolicy, Tunables};
pub use conn::{ConnInput, ConnState};
pub use events::{DownReason, LndEvent, LndStats, RxToken, SendError, TxError};
pub use race::{adopts_peer_order, resolve_race, RaceDecision, RaceInput};

use crate::fabric::{
    ConnId, ConnectFailure, FabricAction, FabricEvent, FabricSink, PrivateData, RequestId,
    WcStatus, WrId,
};
use crate::handle::{Handle, HandleSlab, Tag};
use crate::time::{Duration, Instant};
use crate::wheel::{TimerKey, TimerWheel};
use crate::wire::kib::{
    CksumFlavour, EmitOpts, Framing, KibMsgType, MAX_INLINE, MAX_RDMA_FRAGS, MSG_SIZE, VERSION_2,
};
use crate::wire::{ConnParams, KibBody, KibMsg, KibRej, LnetHdr, Nid, RejectReason};

/// Out-of-band receive slots per connection beyond 2 x queue depth (V2: one keepalive, one for
/// returning credits).
const OOB_SLOTS: u16 = 2;
/// NOOPs allowed in flight per connection (IBLND_OOB_MSGS for V2).
const MAX_NOOPS_POSTED: u16 = 2;

type PeerIdx = usize;

/// The tag of a message's handle.
#[derive(Debug)]
enum TxTag {}

impl Tag for TxTag {
    const NAME: &'static str = "tx";
}

/// A message's handle; its `as_u64` is the send's work-request id.
type TxKey = Handle<TxTag>;

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
    /// connd: destroy a zombie.
    Reap(ConnId),
    /// connd: a paced reconnect is due.
    Reconnect(PeerIdx),
}

enum TxBody {
    Immediate { hdr: LnetHdr, payload: Vec<u8> },
    Noop { keepalive: bool },
}

enum TxPlace {
    /// On the peer's queue, waiting for a connection.
    Peer,
    /// On one of a connection's queues.
    Queued(ConnId),
    /// Posted to the fabric, waiting for its send completion.
    Posted(ConnId),
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
    /// Active side: while this attempt was in flight we accepted the peer's own request, as the
    /// lower side. If the peer accepts this attempt too, it orders NIDs the other way (both
    /// think they are lower, and two connections result).
    accepted_peer_race: bool,
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
    created: Instant,
}

struct Peer {
    nid: Nid,
    /// The peer's incarnation as last known; 0 = never known.
    incarnation: u64,
    version: u16,
    queue_depth: u16,
    max_frags: u16,
    /// Messages waiting for a connection.
    tx_queue: VecDeque<TxKey>,
    /// Established connections (one per direction at most; a self-connection has both ends).
    conns: Vec<ConnId>,
    /// Our active connect in flight.
    active: Option<ConnId>,
    /// A passive connection waiting for ESTABLISHED.
    accepting: Option<ConnId>,
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
    /// Whether LNet was last told the peer is up.
    up: bool,
    /// Whether LNet was last told the peer is down.
    reported_down: bool,
    /// The checksum flavour the peer's own checksummed messages use, once seen.
    cksum: Option<CksumFlavour>,
    /// Races in which both sides refused, or both accepted, each other since we last switched
    /// order for this peer.
    disagreements: u32,
}

impl Peer {
    fn connecting(&self) -> bool {
        self.active.is_some() || self.accepting.is_some() || self.reconnect_timer.is_some()
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
    peers: Slab<Peer>,
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
    shutting_down: bool,
    leaks: Arc<AtomicU64>,
    /// Message buffers given back by the fabric and by LNet, reused for the next sends and
    /// receives so that the steady state allocates nothing per message.
    pool: Vec<Vec<u8>>,
    /// Copies of every message sent and received while a capture is on (`lnetctl capture`).
    capture: Option<VecDeque<Captured>>,
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
            peers: Slab::new(),
            peer_index: HashMap::new(),
            learned_orders: HashMap::new(),
            txs: HandleSlab::new(),
            wheel: TimerWheel::new(now, Duration::from_millis(1)),
            actions: VecDeque::new(),
            events: VecDeque::new(),
            stats: LndStats::default(),
            rng,
            shutting_down: false,
            leaks: Arc::new(AtomicU64::new(0)),
            pool: Vec::new(),
            capture: None,
            cfg,
        }
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

    /// An empty buffer for a payload to hand to [`Endpoint::send`], from the pool when it has
    /// one (no allocation in the steady state).
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

    /// Queues an LNet message for `peer`. The result comes later as [`LndEvent::SendDone`] with
    /// `cookie`, exactly once, unless this returns an error.
    pub fn send(
        &mut self,
        now: Instant,
        peer: Nid,
        hdr: LnetHdr,
        payload: Vec<u8>,
        cookie: u64,
    ) -> Result<(), SendError> {
        self.advance(now);
        if self.shutting_down {
            return Err(SendError::Shutdown);
        }
        if payload.len() > MAX_INLINE {
            return Err(SendError::PayloadTooLarge(payload.len()));
        }
        if peer.is_any() || peer.net() != self.cfg.nid.net() {
            return Err(SendError::BadPeer(peer));
        }
        let Some(p) = self.peer_idx(peer) else {
            return Err(SendError::PeerTableFull(peer));
        };
        let key = self.new_tx(p, TxBody::Immediate { hdr, payload }, Some(cookie));
        self.launch_tx(key);
        Ok(())
    }

    /// LNet is done with a received message: repost its slot and return the credit.
    pub fn recv_done(&mut self, now: Instant, rx: RxToken) {
        self.advance(now);
        let Some(c) = self.conn_mut(rx.conn) else {
            return;
        };
        if c.state != ConnState::Established {
            return;
        }
        c.outstanding = c.outstanding.saturating_add(1);
        self.actions.push_back(FabricAction::PostRecv {
            conn: rx.conn,
            slot: rx.slot,
        });
        self.check_sends(rx.conn, false);
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

    /// A peer asks to connect (the passive side of the handshake, kiblnd_passive_connect).
    pub fn handle_connect_request(&mut self, now: Instant, req: RequestId, private: &[u8]) {
        self.advance(now);
        let my_cp = self.my_connparams();
        let (msg, framing) = match KibMsg::parse(private) {
            Ok(m) => m,
            Err(e) => {
                self.stats.bad_connreqs += 1;
                debug!(error = %e, "unparseable connect request");
                return self.reject(req, RejectReason::Fatal);
            }
        };
        if self.capture.is_some() {
            // Recorded before any check, so a capture shows the requests we refuse too. It has no
            // connection yet: conn is the never-allocated id 0.0.
            self.record(
                CaptureDir::Received,
                ConnId::from_u64(0),
                msg.src_nid,
                private,
            );
        }
        let KibBody::ConnReq(cp) = msg.body else {
            self.stats.bad_connreqs += 1;
            return self.reject(req, RejectReason::Fatal);
        };
        if msg.dst_nid != self.cfg.nid || msg.version != VERSION_2 {
            self.stats.bad_connreqs += 1;
            return self.reject(req, RejectReason::Fatal);
        }
        if self.shutting_down {
            return self.reject(req, RejectReason::NoResources);
        }
        // The requester thinks we are an instance that is gone.
        if msg.dst_stamp != 0 && msg.dst_stamp != self.cfg.incarnation {
            return self.reject(req, RejectReason::ConnStale);
        }
        if cp.queue_depth > my_cp.queue_depth || cp.queue_depth < 2 {
            return self.reject(req, RejectReason::MsgQueueSize);
        }
        if usize::from(cp.max_frags) > MAX_RDMA_FRAGS || cp.max_frags == 0 {
            return self.reject(req, RejectReason::RdmaFrags);
        }
        if cp.max_msg_size as usize > MSG_SIZE {
            return self.reject(req, RejectReason::Fatal);
        }
        let Some(p) = self.peer_idx(msg.src_nid) else {
            self.stats.peer_table_full += 1;
            debug!(peer = %msg.src_nid, limit = self.cfg.peer_limit, "peer table full, refusing");
            return self.reject(req, RejectReason::NoResources);
        };
        self.learn_cksum(p, &framing);
        let policy = self.cfg.race_policy;

        // A new instance of a peer we knew: everything to the old one is dead (kiblnd step 10).
        let known = self.peers[p].incarnation;
        if known != 0 && known != msg.src_stamp {
            self.stats.peer_reboots += 1;
            debug!(peer = %msg.src_nid, old = known, new = msg.src_stamp, "peer restarted");
            self.peers[p].incarnation = msg.src_stamp;
            self.close_peer_conns(p, DownReason::Rebooted);
            if !policy.abandons_stale() {
                // Lustre refuses this one and lets the peer retry once the old connections are
                // gone; we close synchronously, so we can accept at once.
                return self.reject(req, RejectReason::ConnStale);
            }
        }

        let active = self.peers[p].active;
        let active_proven_stale = active
            .and_then(|a| self.conn(a))
            .is_some_and(|c| c.sent_dst_stamp != 0 && c.sent_dst_stamp != msg.src_stamp);
        let decision = resolve_race(RaceInput {
            my_nid: self.cfg.nid,
            peer_nid: msg.src_nid,
            active_in_flight: active.is_some(),
            active_proven_stale,
            races: self.peers[p].races,
            race_limit: self.cfg.tunables.race_limit,
            policy,
            order: self.race_order_for(msg.src_nid),
        });
        match decision {
            RaceDecision::RejectRace => {
                if let Some(c) = active.and_then(|a| self.conn_mut(a)) {
                    c.refused_peer_race = true;
                }
                self.peers[p].races += 1;
                self.stats.races += 1;
                trace!(peer = %msg.src_nid, races = self.peers[p].races, "conn race");
                return self.reject(req, RejectReason::ConnRace);
            }
            RaceDecision::Yield => {
                self.stats.race_yields += 1;
                debug!(peer = %msg.src_nid, "conn race unresolved after the limit, letting the lower NID win");
            }
            RaceDecision::AbandonActiveAndAccept => {
                if let Some(a) = active {
                    self.stats.stale_abandons += 1;
                    debug!(peer = %msg.src_nid, "abandoning an active connect to a gone instance");
                    self.handshake_failed(a, None, true, true);
                }
            }
            RaceDecision::Accept => {
                if let Some(c) = active.and_then(|a| self.conn_mut(a)) {
                    c.accepted_peer_race = true;
                }
            }
        }

        // A request while we hold a connection to the same instance means the peer lost its side:
        // ours is dead to it. A request while we wait on an earlier accept supersedes it.
        if let Some(old) = self.peers[p].accepting.take() {
            self.handshake_failed(old, None, true, true);
        }
        let same_instance: Vec<ConnId> = self.peers[p]
            .conns
            .iter()
            .copied()
            .filter(|&c| self.conn(c).is_some_and(|c| !c.active) && msg.src_nid != self.cfg.nid)
            .collect();
        for c in same_instance {
            self.close_conn(c, Some(DownReason::Closed));
        }

        let peer = &mut self.peers[p];
        peer.races = 0;
        peer.incarnation = msg.src_stamp;
        peer.version = msg.version;
        let qd = cp.queue_depth;
        let id = self.new_conn(p, false, qd, cp.max_frags.min(MAX_RDMA_FRAGS as u16));
        self.transition(id, ConnInput::StartAccept);
        if let Some(c) = self.conn_mut(id) {
            c.peer_stamp = msg.src_stamp;
        }
        self.peers[p].accepting = Some(id);
        self.stats.accepts += 1;
        let ack = KibMsg {
            version: VERSION_2,
            credits: 0,
            src_nid: self.cfg.nid,
            src_stamp: self.cfg.incarnation,
            dst_nid: msg.src_nid,
            dst_stamp: msg.src_stamp,
            body: KibBody::ConnAck(ConnParams {
                queue_depth: qd,
                max_frags: cp.max_frags.min(MAX_RDMA_FRAGS as u16),
                max_msg_size: MSG_SIZE as u32,
            }),
        };
        let private = encode_private(&ack, self.emit_opts(p));
        if self.capture.is_some() {
            self.record(CaptureDir::Sent, id, msg.src_nid, private.as_bytes());
        }
        self.actions.push_back(FabricAction::Accept {
            req,
            conn: id,
            private,
            recv_slots: recv_slots(qd),
        });
        self.arm_conn_timer(id, now + self.cfg.tunables.connect_timeout());
    }

    /// The connection manager says `conn` is established; on the active side `private` holds the
    /// CONNACK (kiblnd_check_connreply), on the passive side it is empty.
    pub fn handle_established(&mut self, now: Instant, conn: ConnId, private: &[u8]) {
        self.advance(now);
        let Some(c) = self.conn(conn) else {
            return;
        };
        match c.state {
            ConnState::ActiveConnect => {}
            ConnState::PassiveWait => return self.passive_established(conn),
            // LU-18260 / LU-18899: an event for an attempt already abandoned or closed.
            _ => return,
        }
        let p = c.peer;
        if self.capture.is_some() && !private.is_empty() {
            let peer = self.peers[p].nid;
            self.record(CaptureDir::Received, conn, peer, private);
        }
        let parsed = KibMsg::parse(private);
        if let Ok((_, framing)) = &parsed {
            self.learn_cksum(p, framing);
        }
        let Some(c) = self.conn(conn) else {
            return;
        };
        let checked = match parsed {
            Ok((msg, _)) => match msg.body {
                KibBody::ConnAck(cp)
                    if msg.version == VERSION_2
                        && cp.queue_depth <= c.queue_depth
                        && cp.queue_depth >= 2
                        && cp.max_frags <= c.max_frags
                        && cp.max_frags > 0
                        && cp.max_msg_size as usize <= MSG_SIZE
                        && msg.src_nid == self.peers[p].nid =>
                {
                    if msg.dst_nid != self.cfg.nid || msg.dst_stamp != self.cfg.incarnation {
                        Err(DownReason::ProtocolError)
                    } else {
                        Ok((msg.src_stamp, cp))
                    }
                }
                _ => Err(DownReason::ProtocolError),
            },
            Err(_) => Err(DownReason::ProtocolError),
        };
        let (stamp, cp) = match checked {
            Ok(v) => v,
            Err(reason) => {
                // The queue pair is up: go through ESTABLISHED and close at once (as o2iblnd).
                self.stats.bad_msgs += 1;
                self.peers[p].active = None;
                self.transition(conn, ConnInput::Established);
                self.close_conn(conn, Some(reason));
                return;
            }
        };
        let known = self.peers[p].incarnation;
        if known != 0 && known != stamp {
            self.stats.peer_reboots += 1;
            self.close_peer_conns(p, DownReason::Rebooted);
        }
        self.peers[p].incarnation = stamp;
        self.peers[p].active = None;
        if self.conn(conn).is_some_and(|c| c.accepted_peer_race) && stamp == known {
            // Both sides accepted each other's request in one race: the peer thinks it is the
            // lower one too.
            self.orders_disagree(p);
        }
        if let Some(c) = self.conn_mut(conn) {
            c.peer_stamp = stamp;
            c.queue_depth = cp.queue_depth;
            c.max_frags = cp.max_frags;
            c.credits = cp.queue_depth;
            c.reserved = cp.queue_depth;
        }
        self.established(conn);
    }

    /// The active connect `conn` failed (kiblnd_rejected and the CM error events).
    pub fn handle_connect_failed(&mut self, now: Instant, conn: ConnId, why: ConnectFailure) {
        self.advance(now);
        let Some(c) = self.conn(conn) else {
            return;
        };
        if c.state != ConnState::ActiveConnect {
            return;
        }
        let p = c.peer;
        let retry = match why {
            ConnectFailure::Rejected(private) => match KibRej::parse(private.as_bytes()) {
                Ok((rej, _)) => {
                    LndStats::count_reject(&mut self.stats.rejects_received, rej.why);
                    let peer = &mut self.peers[p];
                    match rej.why {
                        RejectReason::ConnStale => {
                            // Learn who the peer is now, so the retry names it.
                            if rej.incarnation != 0 {
                                peer.incarnation = rej.incarnation;
                            }
                            true
                        }
                        RejectReason::MsgQueueSize => {
                            if rej.cp.queue_depth >= 2 && rej.cp.queue_depth < peer.queue_depth {
                                peer.queue_depth = rej.cp.queue_depth;
                            }
                            true
                        }
                        RejectReason::RdmaFrags => {
                            if rej.cp.max_frags > 0 && rej.cp.max_frags < peer.max_frags {
                                peer.max_frags = rej.cp.max_frags;
                            }
                            true
                        }
                        RejectReason::ConnRace => {
                            peer.races_received += 1;
                            peer.peak_races_received =
                                peer.peak_races_received.max(peer.races_received);
                            if self.conn(conn).is_some_and(|c| c.refused_peer_race) {
                                self.orders_disagree(p);
                            }
                            true
                        }
                        RejectReason::ConnUncompat => true,
                        _ => false,
                    }
                }
                Err(_) => {
                    LndStats::count_reject(
                        &mut self.stats.rejects_received,
                        RejectReason::Other(0),
                    );
                    false
                }
            },
            ConnectFailure::StaleConn => true,
            ConnectFailure::NoListener | ConnectFailure::Unreachable | ConnectFailure::Error => {
                self.stats.connect_failures += 1;
                false
            }
        };
        self.handshake_failed(conn, Some(DownReason::ConnectFailed), retry, false);
    }

    /// The connection manager says `conn` is disconnected (the peer closed, or our close completed).
    pub fn handle_disconnected(&mut self, now: Instant, conn: ConnId) {
        self.advance(now);
        let Some(c) = self.conn(conn) else {
            return;
        };
        match c.state {
            ConnState::Init | ConnState::ActiveConnect | ConnState::PassiveWait => {
                self.handshake_failed(conn, Some(DownReason::ConnectFailed), false, false);
            }
            ConnState::Established => {
                // The peer closed first: acknowledge and go.
                self.close_conn(conn, None);
                self.finish_close(conn);
            }
            ConnState::Closing => self.finish_close(conn),
            ConnState::Disconnected => {}
        }
    }

    /// A message arrived in receive slot `slot` of `conn` (kiblnd_rx_complete, kiblnd_handle_rx).
    pub fn handle_recv(&mut self, now: Instant, conn: ConnId, slot: u16, bytes: &[u8]) {
        self.advance(now);
        let now = self.now;
        let Some(c) = self.conn_mut(conn) else {
            return;
        };
        match c.state {
            ConnState::Established => c.last_recv = now,
            ConnState::PassiveWait => {
                // Data can beat the ESTABLISHED event (LU-8303); keep it for then.
                c.early_rx.push((slot, bytes.to_vec()));
                return;
            }
            _ => return,
        }
        self.stats.msgs_received += 1;
        let me = self.cfg.nid;
        let my_stamp = self.cfg.incarnation;
        let (msg, framing) = match KibMsg::parse(bytes) {
            Ok(m) => m,
            Err(e) => {
                self.stats.bad_msgs += 1;
                debug!(error = %e, "bad message, closing the connection");
                return self.close_conn(conn, Some(DownReason::ProtocolError));
            }
        };
        if framing.cksum.is_some() {
            if let Some(p) = self.conn(conn).map(|c| c.peer) {
                self.learn_cksum(p, &framing);
            }
        }
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        let peer_nid = self.peers[c.peer].nid;
        if self.capture.is_some() {
            self.record(CaptureDir::Received, conn, peer_nid, bytes);
        }
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        if msg.src_nid != peer_nid
            || msg.dst_nid != me
            || msg.src_stamp != c.peer_stamp
            || msg.dst_stamp != my_stamp
        {
            self.stats.stale_rx += 1;
            debug!(peer = %peer_nid, "stale rx, closing the connection");
            return self.close_conn(conn, Some(DownReason::ProtocolError));
        }
        if u32::from(c.credits) + u32::from(msg.credits) > u32::from(c.queue_depth) {
            let (credits, qd) = (c.credits, c.queue_depth);
            self.stats.credit_overflows += 1;
            warn!(peer = %peer_nid, credits, returned = msg.credits, qd,
                  "peer returned more credits than the queue depth");
            return self.close_conn(conn, Some(DownReason::ProtocolError));
        }
        c.credits += u16::from(msg.credits);
        match msg.body {
            KibBody::Noop => {
                // V2 NOOPs travel without a credit: repost, nothing to return.
                self.actions
                    .push_back(FabricAction::PostRecv { conn, slot });
            }
            KibBody::Immediate { hdr, payload } => {
                self.stats.bytes_received += payload.len() as u64;
                let mut buf = self.take_buffer();
                buf.extend_from_slice(payload);
                self.events.push_back(LndEvent::Received {
                    from: peer_nid,
                    hdr,
                    payload: buf,
                    rx: RxToken { conn, slot },
                });
            }
            other => {
                // The RDMA rendezvous (PUT_REQ/ACK/NAK/DONE, GET_REQ/DONE) belongs to the bulk
                // path, not yet driven: refuse loudly rather than lose the message silently.
                self.stats.unsupported_msgs += 1;
                warn!(peer = %peer_nid, kind = ?other.msg_type(), "RDMA rendezvous not supported yet");
                return self.close_conn(conn, Some(DownReason::ProtocolError));
            }
        }
        self.check_sends(conn, false);
    }

    /// A posted send completed.
    pub fn handle_send_complete(&mut self, now: Instant, conn: ConnId, wr: WrId, status: WcStatus) {
        self.advance(now);
        let key = TxKey::from_u64(wr.0);
        let Some(tx) = self.txs.get(key) else {
            return;
        };
        if !matches!(tx.place, TxPlace::Posted(c) if c == conn) {
            return;
        }
        if let Some(c) = self.conn_mut(conn) {
            c.nsends_posted = c.nsends_posted.saturating_sub(1);
        }
        let is_noop = matches!(
            self.txs.get_mut(key).expect("live tx").body,
            TxBody::Noop { .. }
        );
        if is_noop {
            if let Some(c) = self.conn_mut(conn) {
                c.noops_posted = c.noops_posted.saturating_sub(1);
            }
        }
        match status {
            WcStatus::Success => self.finish_tx(key, Ok(())),
            failed => {
                let err = if failed == WcStatus::RetryExceeded {
                    TxError::PeerUnreachable
                } else {
                    TxError::ConnAborted
                };
                self.finish_tx(key, Err(err));
                // Any failed completion means the queue pair is in error: the connection is done
                // (kiblnd_tx_complete closes on every failure, flushes included).
                self.close_conn(conn, Some(DownReason::Unreachable));
            }
        }
        self.check_sends(conn, false);
    }

    /// Runs every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        while let Some((_, ev)) = self.wheel.poll(self.now) {
            match ev {
                TimerEvent::Conn(id) => self.on_conn_timer(id),
                TimerEvent::Tx(key) => self.on_tx_deadline(key),
                TimerEvent::Reap(id) => self.reap(id),
                TimerEvent::Reconnect(p) => {
                    let Some(peer) = self.peers.get_mut(p) else {
                        continue;
                    };
                    peer.reconnect_timer = None;
                    self.maybe_connect(p);
                    self.maybe_forget(p);
                }
            }
        }
    }

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

    fn conn_ids(&self) -> Vec<ConnId> {
        self.conns.handles()
    }

    /// The peer's slot, made if it is new; `None` when it is new and the table is full.
    fn peer_idx(&mut self, nid: Nid) -> Option<PeerIdx> {
        if let Some(&p) = self.peer_index.get(&nid) {
            return Some(p);
        }
        if self.peers.len() >= self.cfg.peer_limit {
            return None;
        }
        let qd = self.cfg.tunables.queue_depth();
        let p = self.peers.insert(Peer {
            nid,
            incarnation: 0,
            version: VERSION_2,
            queue_depth: qd,
            max_frags: MAX_RDMA_FRAGS as u16,
            tx_queue: VecDeque::new(),
            conns: Vec::new(),
            active: None,
            accepting: None,
            zombies: 0,
            peak_zombies: 0,
            reconnect_wanted: false,
            reconnect_timer: None,
            attempts: 0,
            last_attempt: None,
            races: 0,
            races_received: 0,
            peak_races_received: 0,
            up: false,
            reported_down: false,
            cksum: None,
            disagreements: 0,
        });
        self.peer_index.insert(nid, p);
        Some(p)
    }

    /// Forgets a peer that has no connection (not even a zombie), no connect under way and
    /// nothing queued, as o2iblnd frees a peer with no connections: what a peer costs is then
    /// bounded by what it is doing, and a flood of forged NIDs leaves nothing behind.
    fn maybe_forget(&mut self, p: PeerIdx) {
        let Some(peer) = self.peers.get(p) else {
            return;
        };
        let idle = peer.conns.is_empty()
            && peer.active.is_none()
            && peer.accepting.is_none()
            && peer.zombies == 0
            && peer.tx_queue.is_empty()
            && peer.reconnect_timer.is_none()
            && !peer.reconnect_wanted;
        // Every connection of the peer is counted above (handshakes as active/accepting,
        // established ones in `conns`, closing and disconnected ones as zombies until reaped), so
        // no connection, message or timer refers to the slot once it is free.
        if !idle {
            return;
        }
        let nid = peer.nid;
        self.peers.remove(p);
        self.peer_index.remove(&nid);
        self.stats.peers_forgotten += 1;
        trace!(peer = %nid, "peer forgotten");
    }

    /// The race order in use with `nid`: the one learned for it, or our NI's.
    fn race_order_for(&self, nid: Nid) -> RaceOrder {
        self.learned_orders
            .get(&nid)
            .copied()
            .unwrap_or(self.cfg.race_order)
    }

    /// Both sides refused (or both accepted) each other in one race: the peer orders NIDs the
    /// other way. Switch to its order for this peer when [`adopts_peer_order`] says so.
    fn orders_disagree(&mut self, p: PeerIdx) {
        let nid = self.peers[p].nid;
        self.stats.race_order_disagreements += 1;
        self.peers[p].disagreements += 1;
        let n = self.peers[p].disagreements;
        if !self.cfg.race_policy.adapts_to_peer() || !adopts_peer_order(self.cfg.nid, nid, n) {
            debug!(peer = %nid, disagreements = n, "the peer orders NIDs the other way");
            return;
        }
        let adopted = self.race_order_for(nid).other();
        if adopted == self.cfg.race_order {
            self.learned_orders.remove(&nid);
        } else if self.learned_orders.len() < self.cfg.peer_limit {
            self.learned_orders.insert(nid, adopted);
        }
        self.peers[p].disagreements = 0;
        self.stats.race_order_adoptions += 1;
        debug!(peer = %nid, order = adopted.name(), "the peer orders NIDs the other way: adopting its order");
    }

    /// Remembers the flavour of a peer's checksum from a message that carried one.
    fn learn_cksum(&mut self, p: PeerIdx, framing: &Framing) {
        let Some(flavour) = framing.cksum.and_then(|c| c.flavour) else {
            return;
        };
        let peer = &mut self.peers[p];
        if peer.cksum != Some(flavour) {
            peer.cksum = Some(flavour);
            match flavour {
                CksumFlavour::Signed => self.stats.cksum_signed_peers += 1,
                CksumFlavour::Unsigned => self.stats.cksum_unsigned_peers += 1,
            }
        }
    }

    /// How to encode what we send to peer `p`: checksummed in its flavour when checksums are
    /// on, in the configured default until its flavour is known.
    fn emit_opts(&self, p: PeerIdx) -> EmitOpts {
        let ck = self.cfg.checksum;
        EmitOpts {
            order: Default::default(),
            checksum: if ck.emit {
                self.peers
                    .get(p)
                    .and_then(|peer| peer.cksum)
                    .or(ck.default_flavour)
            } else {
                None
            },
        }
    }

    fn my_connparams(&self) -> ConnParams {
        ConnParams {
            queue_depth: self.cfg.tunables.queue_depth(),
            max_frags: MAX_RDMA_FRAGS as u16,
            max_msg_size: MSG_SIZE as u32,
        }
    }

    fn reject(&mut self, req: RequestId, why: RejectReason) {
        LndStats::count_reject(&mut self.stats.rejects_sent, why);
        let rej = KibRej {
            version: VERSION_2,
            why,
            incarnation: self.cfg.incarnation,
            cp: self.my_connparams(),
        };
        let mut private = PrivateData::EMPTY;
        if let Ok(n) = rej.emit(private.buf_mut(), Default::default()) {
            private.set_len(n);
        }
        self.actions
            .push_back(FabricAction::Reject { req, private });
    }

    fn new_conn(
        &mut self,
        peer: PeerIdx,
        active: bool,
        queue_depth: u16,
        max_frags: u16,
    ) -> ConnId {
        self.conns.insert(Conn {
            peer,
            state: ConnState::Init,
            active,
            peer_stamp: 0,
            sent_dst_stamp: 0,
            refused_peer_race: false,
            accepted_peer_race: false,
            queue_depth,
            max_frags,
            credits: queue_depth,
            outstanding: 0,
            reserved: queue_depth,
            nsends_posted: 0,
            noops_posted: 0,
            tx_rsrvd: VecDeque::new(),
            tx_cred: VecDeque::new(),
            tx_nocred: VecDeque::new(),
            last_send: self.now,
            last_recv: self.now,
            timer: None,
            error: None,
            reconnect: false,
            disconnect_sent: false,
            early_rx: Vec::new(),
            created: self.now,
        })
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

    fn arm_conn_timer(&mut self, id: ConnId, at: Instant) {
        let key = self.wheel.insert(at, TimerEvent::Conn(id));
        if let Some(c) = self.conn_mut(id) {
            if let Some(old) = c.timer.replace(key) {
                self.wheel.cancel(old);
            }
        }
    }

    fn disarm_conn_timer(&mut self, id: ConnId) {
        if let Some(old) = self.conn_mut(id).and_then(|c| c.timer.take()) {
            self.wheel.cancel(old);
        }
    }

    fn new_tx(&mut self, peer: PeerIdx, body: TxBody, cookie: Option<u64>) -> TxKey {
        self.txs.insert(Tx {
            peer,
            body,
            cookie,
            timer: None,
            place: TxPlace::Peer,
            queued_at: self.now,
        })
    }

    fn tx_live(&self, key: TxKey) -> bool {
        self.txs.contains(key)
    }

    fn set_tx_deadline(&mut self, key: TxKey, at: Instant) {
        let t = self.wheel.insert(at, TimerEvent::Tx(key));
        if let Some(old) = self.txs.get_mut(key).expect("live tx").timer.replace(t) {
            self.wheel.cancel(old);
        }
    }

    /// Puts a message on its way: onto an established connection, or onto the peer's queue while
    /// one is made (kiblnd_launch_tx).
    fn launch_tx(&mut self, key: TxKey) {
        let p = self.txs.get_mut(key).expect("live tx").peer;
        if let Some(conn) = self.pick_conn(p) {
            self.queue_on_conn(key, conn);
            self.check_sends(conn, false);
            return;
        }
        // Waiting for a connection: the deadline covers the connect and address/route resolution
        // (connect timeout + 2 x 5 s, as kiblnd_launch_tx).
        let wait = self.cfg.tunables.connect_timeout() + Duration::from_secs(10);
        let at = self.now + wait;
        self.set_tx_deadline(key, at);
        self.txs.get_mut(key).expect("live tx").place = TxPlace::Peer;
        self.peers[p].tx_queue.push_back(key);
        self.maybe_connect(p);
    }

    /// The connection a new message goes on. Always the same one while it lives, so messages to a
    /// peer stay in order; our own active end first, which also keeps a self-connection (both of
    /// whose ends are ours) to one stream.
    fn pick_conn(&mut self, p: PeerIdx) -> Option<ConnId> {
        let peer = &self.peers[p];
        peer.conns
            .iter()
            .copied()
            .find(|&c| self.conn(c).is_some_and(|c| c.active))
            .or_else(|| peer.conns.first().copied())
    }

    fn queue_on_conn(&mut self, key: TxKey, conn: ConnId) {
        let at = self.now + self.cfg.tunables.timeout;
        self.set_tx_deadline(key, at);
        let tx = &mut self.txs.get_mut(key).expect("live tx");
        tx.place = TxPlace::Queued(conn);
        tx.queued_at = self.now;
        let kind = match tx.body {
            TxBody::Immediate { .. } => KibMsgType::Immediate,
            TxBody::Noop { .. } => KibMsgType::Noop,
        };
        let Some(c) = self.conn_mut(conn) else {
            return;
        };
        match kind {
            KibMsgType::PutReq | KibMsgType::GetReq => c.tx_rsrvd.push_back(key),
            k if k.needs_credit() => c.tx_cred.push_back(key),
            _ => c.tx_nocred.push_back(key),
        }
    }

    /// Starts an active connect if the peer needs one and the pacing rule allows it now; otherwise
    /// arranges for it to happen when it may (kiblnd_launch_tx, kiblnd_reconnect_peer, LU-7569).
    fn maybe_connect(&mut self, p: PeerIdx) {
        if self.shutting_down {
            return;
        }
        let peer = &mut self.peers[p];
        if peer.tx_queue.is_empty() || !peer.conns.is_empty() || peer.connecting() {
            return;
        }
        // Only one failed connection at a time: reconnect once it is reaped.
        if peer.zombies > 0 {
            peer.reconnect_wanted = true;
            return;
        }
        let t = &self.cfg.tunables;
        if self.cfg.race_policy.adapts_to_peer()
            && peer.attempts >= t.fast_reconnects
            && peer.races_received > 0
            && peer.races_received <= t.race_limit.saturating_add(1)
        {
            // The peer refused us with CONN_RACE: it is alive, holding a connect of its own that
            // may never finish. Retry at a quick bounded pace until it has refused us race_limit
            // + 1 times (a kernel peer lets us win at race_limit), without counting these tries
            // toward the slow path.
            let earliest = peer
                .last_attempt
                .map_or(self.now, |last| last + t.race_retry_interval);
            if earliest > self.now {
                let jitter = jitter(
                    &mut self.rng,
                    Duration::from_nanos(t.race_retry_interval.as_nanos() / 4),
                );
                let key = self
                    .wheel
                    .insert(earliest + jitter, TimerEvent::Reconnect(p));
                self.peers[p].reconnect_timer = Some(key);
                return;
            }
            return self.connect_now(p);
        }
        if peer.attempts >= t.fast_reconnects {
            let earliest = peer
                .last_attempt
                .map_or(self.now, |last| last + t.reconnect_interval);
            if earliest > self.now || peer.attempts == t.fast_reconnects {
                let jitter = jitter(&mut self.rng, t.reconnect_jitter);
                let at = earliest.max(self.now) + jitter;
                let key = self.wheel.insert(at, TimerEvent::Reconnect(p));
                self.peers[p].reconnect_timer = Some(key);
                // Counting this one as scheduled keeps later attempts on the slow path.
                self.peers[p].attempts += 1;
                return;
            }
        }
        self.connect_now(p);
    }

    fn connect_now(&mut self, p: PeerIdx) {
        let peer = &mut self.peers[p];
        let reconnect = peer.attempts > 0;
        if peer.attempts < self.cfg.tunables.fast_reconnects {
            peer.attempts += 1;
        }
        peer.last_attempt = Some(self.now);
        peer.reconnect_wanted = false;
        let (nid, qd, frags, dst_stamp) =
            (peer.nid, peer.queue_depth, peer.max_frags, peer.incarnation);
        let id = self.new_conn(p, true, qd, frags);
        self.transition(id, ConnInput::StartConnect);
        if let Some(c) = self.conn_mut(id) {
            c.sent_dst_stamp = dst_stamp;
        }
        self.peers[p].active = Some(id);
        self.stats.connects += 1;
        if reconnect {
            self.stats.reconnects += 1;
        }
        let req = KibMsg {
            version: VERSION_2,
            credits: 0,
            src_nid: self.cfg.nid,
            src_stamp: self.cfg.incarnation,
            dst_nid: nid,
            dst_stamp,
            body: KibBody::ConnReq(ConnParams {
                queue_depth: qd,
                max_frags: frags,
                max_msg_size: MSG_SIZE as u32,
            }),
        };
        trace!(peer = %nid, conn = ?id, "active connect");
        let private = encode_private(&req, self.emit_opts(p));
        if self.capture.is_some() {
            self.record(CaptureDir::Sent, id, nid, private.as_bytes());
        }
        self.actions.push_back(FabricAction::Connect {
            conn: id,
            peer: nid,
            private,
            recv_slots: recv_slots(qd),
        });
        if self.cfg.race_policy.bounds_connects() {
            let at = self.now + self.cfg.tunables.connect_timeout();
            self.arm_conn_timer(id, at);
        }
    }

    fn passive_established(&mut self, conn: ConnId) {
        let Some(c) = self.conn(conn) else {
            return;
        };
        let p = c.peer;
        if self.peers[p].accepting == Some(conn) {
            self.peers[p].accepting = None;
        }
        self.established(conn);
        let early = self
            .conn_mut(conn)
            .map(|c| std::mem::take(&mut c.early_rx))
            .unwrap_or_default();
        for (slot, bytes) in early {
            self.handle_recv(self.now, conn, slot, &bytes);
        }
    }

    /// Common to both sides once a connection is up (kiblnd_connreq_done).
    fn established(&mut self, conn: ConnId) {
        self.disarm_conn_timer(conn);
        if self.transition(conn, ConnInput::Established).is_none() {
            return;
        }
        let now = self.now;
        let Some(c) = self.conn_mut(conn) else {
            return;
        };
        c.last_send = now;
        c.last_recv = now;
        let (p, stamp) = (c.peer, c.peer_stamp);
        self.stats.established += 1;
        // Connections to an older instance of this peer are dead.
        let stale: Vec<ConnId> = self.peers[p]
            .conns
            .iter()
            .copied()
            .filter(|&o| self.conn(o).is_some_and(|oc| oc.peer_stamp != stamp))
            .collect();
        for o in stale {
            self.close_conn(o, Some(DownReason::Rebooted));
        }
        let peer = &mut self.peers[p];
        peer.conns.push(conn);
        peer.attempts = 0;
        peer.races = 0;
        peer.races_received = 0;
        self.cancel_reconnect(p);
        if !self.cfg.tunables.keepalive.is_zero() {
            let keepalive = self.now + self.cfg.tunables.keepalive;
            self.arm_conn_timer(conn, keepalive);
        }
        let nid = self.peers[p].nid;
        if !self.peers[p].up {
            self.peers[p].up = true;
            self.peers[p].reported_down = false;
            self.events.push_back(LndEvent::PeerUp { nid });
        }
        trace!(peer = %nid, conn = ?conn, "established");
        let queued: Vec<TxKey> = self.peers[p].tx_queue.drain(..).collect();
        for key in queued {
            if self.tx_live(key) {
                self.queue_on_conn(key, conn);
            }
        }
        self.check_sends(conn, false);
    }

    /// A handshake that did not complete: the connection becomes a zombie for connd to reap, and
    /// the peer's queued messages fail unless another attempt is on its way
    /// (kiblnd_connreq_done with an error, kiblnd_peer_connect_failed).
    ///
    /// `notify_peer` is set when we give up on our own (deadline, stale, shutdown, superseded):
    /// the peer may already consider the connection made, so it is told with a Disconnect before
    /// the teardown; a failure the fabric reported needs none.
    fn handshake_failed(
        &mut self,
        conn: ConnId,
        reason: Option<DownReason>,
        retry: bool,
        notify_peer: bool,
    ) {
        self.disarm_conn_timer(conn);
        let Some(c) = self.conn(conn) else {
            return;
        };
        let p = c.peer;
        if self.transition(conn, ConnInput::HandshakeFailed).is_none() {
            return;
        }
        if notify_peer {
            if let Some(c) = self.conn_mut(conn) {
                c.disconnect_sent = true;
            }
            self.actions.push_back(FabricAction::Disconnect { conn });
        }
        let peer = &mut self.peers[p];
        if peer.active == Some(conn) {
            peer.active = None;
        }
        if peer.accepting == Some(conn) {
            peer.accepting = None;
        }
        if let Some(c) = self.conn_mut(conn) {
            c.reconnect = retry;
            c.error = reason;
        }
        self.schedule_reap(conn);
        let peer = &self.peers[p];
        if !retry && peer.conns.is_empty() && !peer.connecting() {
            self.fail_peer_queue(p, TxError::ConnectFailed);
            if let Some(reason) = reason {
                self.peer_down(p, reason);
            }
        }
    }

    /// Closes an established connection: Disconnect first, then wait (bounded) for the fabric to
    /// confirm (kiblnd_close_conn_locked). `error` is `None` for a graceful close.
    fn close_conn(&mut self, conn: ConnId, error: Option<DownReason>) {
        let Some(c) = self.conn(conn) else {
            return;
        };
        match c.state {
            ConnState::Established => {}
            ConnState::Init | ConnState::ActiveConnect | ConnState::PassiveWait => {
                return self.handshake_failed(conn, error, false, true);
            }
            ConnState::Closing | ConnState::Disconnected => return,
        }
        let p = c.peer;
        self.transition(conn, ConnInput::Close);
        if let Some(c) = self.conn_mut(conn) {
            c.error = error;
            c.disconnect_sent = true;
        }
        match error {
            None => self.stats.graceful_closes += 1,
            Some(_) => self.stats.conns_lost += 1,
        }
        self.peers[p].conns.retain(|&x| x != conn);
        self.actions.push_back(FabricAction::Disconnect { conn });
        let at = self.now + self.cfg.tunables.close_timeout;
        self.arm_conn_timer(conn, at);
        // Queued messages go now; posted ones when their completions flush, or at the reap.
        self.abort_queued(conn, TxError::ConnAborted);
        let peer = &self.peers[p];
        if peer.conns.is_empty() {
            if !peer.tx_queue.is_empty() {
                self.maybe_connect(p);
            } else if !peer.connecting() {
                self.peer_down(p, error.unwrap_or(DownReason::Closed));
            }
        }
    }

    fn close_peer_conns(&mut self, p: PeerIdx, reason: DownReason) {
        let conns = self.peers[p].conns.clone();
        for c in conns {
            self.close_conn(c, Some(reason));
        }
    }

    /// The close is complete (the fabric confirmed, or the wait ran out): a zombie now.
    fn finish_close(&mut self, conn: ConnId) {
        self.disarm_conn_timer(conn);
        if self.transition(conn, ConnInput::Disconnected).is_some() {
            self.schedule_reap(conn);
        }
    }

    fn schedule_reap(&mut self, conn: ConnId) {
        let key = self.wheel.insert(self.now, TimerEvent::Reap(conn));
        if let Some(c) = self.conn_mut(conn) {
            if let Some(old) = c.timer.replace(key) {
                self.wheel.cancel(old);
            }
        }
    }

    /// connd: destroy a zombie, finish whatever it still held, and reconnect if that was wanted
    /// (kiblnd_destroy_conn, then the reconnect list).
    fn reap(&mut self, conn: ConnId) {
        let Some(c) = self.conn(conn) else {
            return;
        };
        if c.state != ConnState::Disconnected {
            return;
        }
        let p = c.peer;
        let reconnect = c.reconnect;
        self.abort_queued(conn, TxError::ConnAborted);
        // Posted messages whose completions never came.
        let posted: Vec<TxKey> = self
            .txs
            .iter()
            .filter(|(_, t)| matches!(t.place, TxPlace::Posted(x) if x == conn))
            .map(|(key, _)| key)
            .collect();
        for key in posted {
            self.finish_tx(key, Err(TxError::ConnAborted));
        }
        self.conns.remove(conn);
        self.actions.push_back(FabricAction::Destroy { conn });
        self.stats.reaped += 1;
        self.stats.zombies = self.stats.zombies.saturating_sub(1);
        let peer = &mut self.peers[p];
        peer.zombies = peer.zombies.saturating_sub(1);
        if reconnect || peer.reconnect_wanted {
            peer.reconnect_wanted = false;
            self.maybe_connect(p);
        }
        let peer = &self.peers[p];
        if peer.conns.is_empty()
            && !peer.connecting()
            && !peer.tx_queue.is_empty()
            && peer.zombies == 0
        {
            // A reconnect was not allowed (e.g. a fatal reject) and nothing else will come.
            self.fail_peer_queue(p, TxError::ConnectFailed);
        }
        self.maybe_forget(p);
    }

    fn cancel_reconnect(&mut self, p: PeerIdx) {
        if let Some(k) = self.peers[p].reconnect_timer.take() {
            self.wheel.cancel(k);
        }
    }

    /// Tells LNet the peer is down, once per change: after it was up, or the first time a peer we
    /// never reached fails (kiblnd_peer_connect_failed notifies LNet in both cases).
    fn peer_down(&mut self, p: PeerIdx, reason: DownReason) {
        let peer = &mut self.peers[p];
        if peer.up || !peer.reported_down {
            peer.up = false;
            peer.reported_down = true;
            self.stats.peers_down += 1;
            let nid = peer.nid;
            debug!(peer = %nid, ?reason, "peer down");
            self.events.push_back(LndEvent::PeerDown { nid, reason });
        }
    }

    fn fail_peer_queue(&mut self, p: PeerIdx, err: TxError) {
        let queued: Vec<TxKey> = self.peers[p].tx_queue.drain(..).collect();
        for key in queued {
            self.finish_tx(key, Err(err));
        }
    }

    fn abort_queued(&mut self, conn: ConnId, err: TxError) {
        let Some(c) = self.conn_mut(conn) else {
            return;
        };
        let mut queued: Vec<TxKey> = c.tx_rsrvd.drain(..).collect();
        queued.extend(c.tx_cred.drain(..));
        queued.extend(c.tx_nocred.drain(..));
        for key in queued {
            self.finish_tx(key, Err(err));
        }
    }

    /// A message is finished: report it (unless it is a NOOP) and free it.
    fn finish_tx(&mut self, key: TxKey, result: Result<(), TxError>) {
        let Some(tx) = self.txs.remove(key) else {
            return;
        };
        if let Some(t) = tx.timer {
            self.wheel.cancel(t);
        }
        if let Some(cookie) = tx.cookie {
            if result.is_ok() {
                if let TxBody::Immediate { payload, .. } = &tx.body {
                    self.stats.bytes_sent += payload.len() as u64;
                }
            }
            if let TxBody::Immediate { payload, .. } = tx.body {
                self.recycle(payload);
            }
            let peer = self.peers[tx.peer].nid;
            self.events.push_back(LndEvent::SendDone {
                cookie,
                peer,
                result,
            });
        }
    }

    fn on_tx_deadline(&mut self, key: TxKey) {
        let Some(tx) = self.txs.get_mut(key) else {
            return;
        };
        tx.timer = None;
        self.stats.tx_timeouts += 1;
        match tx.place {
            TxPlace::Peer => {
                let p = tx.peer;
                self.peers[p].tx_queue.retain(|&k| k != key);
                debug!(peer = %self.peers[p].nid, "timed out tx waiting for a connection");
                self.finish_tx(key, Err(TxError::Timeout));
                self.maybe_forget(p);
            }
            TxPlace::Queued(conn) | TxPlace::Posted(conn) => {
                // "Timed out RDMA": the connection is no good (kiblnd_check_txs_locked). This is
                // how a peer that owes us something (credits for a queued message, a completion
                // for a posted one) and stays silent is declared dead.
                let queued_at = tx.queued_at;
                if self.conn(conn).is_some_and(|c| c.last_recv <= queued_at) {
                    self.stats.silent_peers += 1;
                }
                debug!(conn = ?conn, "timed out tx, closing the connection");
                self.finish_tx(key, Err(TxError::Timeout));
                self.close_conn(conn, Some(DownReason::Timeout));
            }
        }
    }

    fn on_conn_timer(&mut self, id: ConnId) {
        let keepalive = self.cfg.tunables.keepalive;
        let Some(c) = self.conn_mut(id) else {
            return;
        };
        c.timer = None;
        match c.state {
            ConnState::ActiveConnect | ConnState::PassiveWait => {
                // LU-17480: an attempt that outlived its deadline is aborted.
                let retry = c.active;
                self.stats.connect_timeouts += 1;
                debug!(conn = ?id, "connect deadline passed");
                self.handshake_failed(id, Some(DownReason::Timeout), retry, true);
            }
            ConnState::Established => {
                // Keepalive only (kiblnd_check_conns): a NOOP when we have sent nothing for
                // `keepalive`, so a crashed peer is found by the transport (EOF/RST on tcp, a
                // failed send on verbs). Silence alone is never fatal: a kernel peer sends
                // NOOPs on its own schedule, or never (keepalive=0), and owes an idle peer
                // nothing. A peer that owes us something is found by the message deadlines.
                let due = c.last_send + keepalive;
                let next = if self.now >= due {
                    self.check_sends(id, true);
                    self.now + keepalive
                } else {
                    due
                };
                self.arm_conn_timer(id, next);
            }
            ConnState::Closing => {
                self.stats.close_timeouts += 1;
                self.finish_close(id);
            }
            ConnState::Init | ConnState::Disconnected => {}
        }
    }

    /// The send scheduler (kiblnd_check_sends_locked): reserved -> credit queue while reserved
    /// credits last, maybe a NOOP, then post from the no-credit queue, then the credit queue,
    /// stopping at concurrent_sends or when credits run out.
    fn check_sends(&mut self, conn: ConnId, keepalive: bool) {
        let concurrent = self.cfg.tunables.concurrent_sends();
        let Some(c) = self.conn(conn) else {
            return;
        };
        if c.state != ConnState::Established {
            return;
        }
        let hiw = self.cfg.tunables.credits_hiw(c.queue_depth);
        let p = c.peer;
        {
            let c = self.conn_mut(conn).expect("checked above");
            while c.reserved > 0 {
                let Some(k) = c.tx_rsrvd.pop_front() else {
                    break;
                };
                c.reserved -= 1;
                c.tx_cred.push_back(k);
            }
        }
        let c = self.conn(conn).expect("checked above");
        let need_noop = (keepalive || c.outstanding >= hiw)
            && c.tx_nocred.is_empty()
            && (c.tx_cred.is_empty() || c.credits == 0)
            && c.noops_posted < MAX_NOOPS_POSTED;
        if need_noop {
            let key = self.new_tx(p, TxBody::Noop { keepalive }, None);
            self.queue_on_conn(key, conn);
        }
        loop {
            let c = self.conn_mut(conn).expect("checked above");
            if c.nsends_posted >= concurrent {
                break;
            }
            let (key, credit) = if let Some(&k) = c.tx_nocred.front() {
                (k, false)
            } else if let Some(&k) = c.tx_cred.front() {
                if c.credits == 0 {
                    break;
                }
                (k, true)
            } else {
                break;
            };
            if credit {
                c.tx_cred.pop_front();
            } else {
                c.tx_nocred.pop_front();
            }
            // A key whose message already finished (its deadline fired) is skipped.
            let Some(tx) = self.txs.get(key) else {
                continue;
            };
            // A NOOP made redundant by what went before it is dropped (kiblnd_post_tx_locked).
            if let TxBody::Noop { keepalive } = tx.body {
                let c = self.conn(conn).expect("checked above");
                if (!keepalive && c.outstanding < hiw) || c.noops_posted >= MAX_NOOPS_POSTED {
                    self.finish_tx(key, Ok(()));
                    continue;
                }
            }
            self.post_tx(conn, key, credit);
        }
    }

    fn post_tx(&mut self, conn: ConnId, key: TxKey, credit: bool) {
        let me = self.cfg.nid;
        let Some(p) = self.conn(conn).map(|c| c.peer) else {
            return;
        };
        let opts = self.emit_opts(p);
        let my_stamp = self.cfg.incarnation;
        let now = self.now;
        let c = self.conns.get_mut(conn).expect("live conn");
        let returned = c.outstanding.min(255) as u8;
        c.outstanding -= u16::from(returned);
        if credit {
            c.credits -= 1;
        }
        c.nsends_posted += 1;
        c.last_send = now;
        let (peer_stamp, p) = (c.peer_stamp, c.peer);
        let tx = &mut self.txs.get_mut(key).expect("live tx");
        tx.place = TxPlace::Posted(conn);
        let body = match &tx.body {
            TxBody::Immediate { hdr, payload } => KibBody::Immediate { hdr: *hdr, payload },
            TxBody::Noop { keepalive } => {
                if *keepalive {
                    self.stats.keepalives += 1;
                } else {
                    self.stats.credit_noops += 1;
                }
                KibBody::Noop
            }
        };
        let is_noop = matches!(body, KibBody::Noop);
        let msg = KibMsg {
            version: VERSION_2,
            credits: returned,
            src_nid: me,
            src_stamp: my_stamp,
            dst_nid: self.peers[p].nid,
            dst_stamp: peer_stamp,
            body,
        };
        let mut bytes = self
            .pool
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(MSG_SIZE));
        bytes.resize(msg.wire_len(), 0);
        if let Err(e) = msg.emit(&mut bytes, opts) {
            // Unreachable by construction: payloads are checked in `send`.
            error!(error = %e, "cannot encode a message");
        }
        self.stats.msgs_sent += 1;
        if is_noop {
            if let Some(c) = self.conn_mut(conn) {
                c.noops_posted += 1;
            }
        }
        if self.capture.is_some() {
            let peer = self.peers[p].nid;
            self.record(CaptureDir::Sent, conn, peer, &bytes);
        }
        self.actions.push_back(FabricAction::Send {
            conn,
            wr: wr_of(key),
            bytes,
        });
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
            FabricEvent::Disconnected { conn } => self.handle_disconnected(now, conn),
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

fn recv_slots(queue_depth: u16) -> u16 {
    queue_depth.saturating_mul(2).saturating_add(OOB_SLOTS)
}

fn encode_private(msg: &KibMsg<'_>, opts: EmitOpts) -> PrivateData {
    let mut p = PrivateData::EMPTY;
    match msg.emit(p.buf_mut(), opts) {
        Ok(n) => p.set_len(n),
        Err(e) => error!(error = %e, "cannot encode connection private data"),
    }
    p
}

/// xorshift64: reproducible jitter from the endpoint's seed.
fn jitter(state: &mut u64, max: Duration) -> Duration {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    if max.is_zero() {
        Duration::ZERO
    } else {
        Duration::from_nanos(x % max.as_nanos())
    }
}
