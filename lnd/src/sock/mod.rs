//! The sans-IO socklnd engine: one [`SockEngine`] per NI on a `tcp` net, behind the LND
//! interface ([`crate::iface::Lnd`]), speaking the kernel ksocklnd's protocol
//! (shared/reference/lustre-socklnd.md sections 1-7, 10-11).
//!
//! Same shape as the o2ib engine: inputs are [`SockEngine::handle_stream`] (a driver's
//! [`StreamEvent`], also through [`StreamSink`]), LNet's calls through [`Lnd`], and
//! [`Lnd::handle_timeout`]; outputs are drained with [`SockEngine::poll_action`] (what the
//! stream driver does), [`Lnd::poll_event`] (news for LNet) and [`Lnd::poll_timeout`]. It never
//! reads a clock, spawns a thread or does I/O.
//!
//! - `table`: the connection states and their one transition function.
//! - `handshake`: the LNet acceptor (section 2.4), the HELLO both ways (3.4, 3.5), the race,
//!   incarnation and duplicate rules (3.7-3.9), dials and their backoff.
//! - `rx`: KSOCK messages in: headers through a small carry buffer, payloads inline or
//!   straight into LNet's memory, checksums, ZC-ACK duty, keepalives in.
//! - `tx`: messages out: the connection choice of 4.3, queues waiting for a connection,
//!   completions, keepalives out.
//! - `lnd`: the [`Lnd`] trait.
//!
//! Sending to our own NID never makes a connection: the message is delivered locally (LNet's
//! `lo` path does the same in the kernel; a self-connection would have to dodge the race and
//! duplicate rules, which exempt equal NIDs for just that case).

mod handshake;
mod lnd;
mod rx;
pub mod table;
mod tx;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_hostile;

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};

use tracing::{debug, info, warn};

use crate::handle::{handle_type, HandleSlab};
pub use crate::iface::sock::{AcceptMode, SockConfig, SockConnView, SockStats};
use crate::iface::{BulkMem, DownReason, LndEvent, TxError};
use crate::stream::{
    CloseMode, IncomingId, SendId, SendPayload, StreamAction, StreamEvent, StreamId, StreamSink,
    StreamTag,
};
use crate::time::{Duration, Instant};
use crate::wheel::TimerWheel;
use crate::wire::sock::{ConnType, HelloHead, HelloVersion, KsockCsum, KsockHdr};
use crate::wire::{ByteOrder, LnetHdr, Nid, WireHandle};
pub use table::{next_state, ConnInput, ConnState};

/// Bytes asked for between messages: several small messages can come in one read, and an idle
/// connection holds no buffer of ours (the carry is dropped when empty).
const RX_CHUNK: u32 = 4096;
/// Consecutive HELLO refusals (EALREADY / EPROTO) to one peer after which we stop dialing it
/// for this round and fail what waits (LU-7646: a race must not repeat for ever; 2.16 stops
/// after 3 when every type is covered, LU-16191).
const MAX_RACES: u32 = 20;
/// Consecutive races after which a type the peer's own connections cover is not redialled.
const RACES_COVERED: u32 = 3;
/// Keepalive NOOPs are retried at most this often (`ksocknal_send_keepalive_locked`).
const KEEPALIVE_RETRY: Duration = Duration::from_secs(10);
/// The RxToken connection of a message delivered to ourselves.
const LOCAL_CONN: u64 = u64::MAX;

handle_type! {
    /// The name of a message waiting for, or on, a connection.
    type TxId = Handle<TxTag>, "socktx";
}

/// A message LNet handed us.
#[derive(Debug)]
struct Tx {
    peer: Nid,
    hdr: LnetHdr,
    payload: SendPayload,
    cookie: u64,
    /// A GET whose REPLY lands in LNet's memory (its outcome is `BulkDone`, not `SendDone`).
    get: bool,
    queued_at: Instant,
}

/// A GET of ours (`send_bulk(BulkSend::Get)`) waiting for its REPLY, keyed by the GET's
/// `return_wmd`, which the REPLY carries as its `dst_wmd`.
#[derive(Debug)]
struct GetWait {
    peer: Nid,
    cookie: u64,
    sink: BulkMem,
    /// Set once the GET left; the REPLY is due within `timeout` of that.
    deadline: Option<Instant>,
    /// Its REPLY's payload is landing (on this connection).
    landing: Option<StreamId>,
}

/// Where a passive or active handshake is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum HsStep {
    /// The acceptor request's magic (4 bytes).
    Magic,
    /// Its version (4 more).
    ReqVersion(ByteOrder),
    /// Its NID (the rest of 16 or 28).
    ReqBody(ByteOrder, usize),
    /// A HELLO's magic and version (8).
    HelloHead,
    /// The rest of the HELLO.
    HelloBody(HelloHead),
    /// Its IP list (read and ignored).
    HelloIps(HelloHead, u32),
}

/// Where an established connection's receive is.
#[derive(Debug)]
enum RxPhase {
    /// Between messages (or within a header): bytes gather in the carry.
    Header,
    /// A bulk payload's header went up to LNet as a BulkRequest; nothing is read until LNet
    /// answers (socklnd's only back-pressure, reference 5.3).
    AwaitLnet,
    /// A payload lands in LNet's memory.
    Mem(Box<Landing>),
    /// A payload (or its surplus) is read and dropped.
    Discard { left: u32, msg: Box<RxMsg> },
}

/// A received message's identity while its payload comes in.
#[derive(Debug)]
struct RxMsg {
    ksock: KsockHdr,
    hdr: LnetHdr,
    /// Checksum over what is covered so far (Some when the sender set one).
    csum: Option<KsockCsum>,
}

/// A payload landing in LNet's memory.
#[derive(Debug)]
struct Landing {
    msg: RxMsg,
    mem: crate::mem::SharedMem,
    offset: u64,
    /// Bytes to land, and landed so far.
    len: u32,
    landed: u32,
    /// Bytes of the payload after those, read and dropped.
    surplus: u32,
    /// Whose memory: a BulkRequest's (LNet's cookie) or a GET of ours.
    cookie: u64,
    get: Option<WireHandle>,
    /// The whole landing must be done by then (`grant_timeout`).
    deadline: Instant,
}

/// One TCP connection.
#[derive(Debug)]
struct Conn {
    state: ConnState,
    active: bool,
    remote: SocketAddrV4,
    local: SocketAddrV4,
    /// Active: the NID dialed. Passive: the HELLO's (or the userspace identity).
    peer: Option<Nid>,
    /// Our view of its type (Any until a passive HELLO says).
    ctype: ConnType,
    version: HelloVersion,
    /// A dialer from a port above 1023 (`accept=all`): never dialed back.
    userspace: bool,
    hs: HsStep,
    /// Bytes read and not yet consumed. Dropped (no capacity) when empty.
    carry: Vec<u8>,
    /// A Recv is posted (one at a time, the stream contract).
    posted: bool,
    /// Bytes still expected by a posted `Recv { Mem }`.
    mem_left: u32,
    rx: RxPhase,
    /// Received messages LNet holds (Received not yet answered).
    held: u32,
    last_rx: Instant,
    /// The handshake step's deadline.
    hs_deadline: Option<Instant>,
    /// Sends handed to the driver, oldest first.
    inflight: VecDeque<(SendId, Option<TxId>, u32)>,
    queued_bytes: u64,
    last_tx_progress: Instant,
    last_keepalive: Instant,
    last_used: Instant,
    /// The earliest timer on the wheel for it.
    timer_at: Option<Instant>,
    zc_acks_sent: u64,
    zc_acks_received: u64,
}

/// What we hold on a peer.
#[derive(Debug, Default)]
struct Peer {
    /// Its connections (handshaking and established).
    conns: Vec<StreamId>,
    /// Incarnation and version of the first connection made while it had none (3.7).
    incarnation: Option<u64>,
    version: Option<HelloVersion>,
    up: bool,
    /// Messages waiting for a usable connection, oldest first.
    queue: VecDeque<TxId>,
    /// Dial backoff (0 after a success) and when the next dial may start.
    backoff: Duration,
    next_dial: Option<Instant>,
    /// Consecutive HELLO refusals of our dials.
    races: u32,
    /// conns_per_peer as fixed when we first dialed it (the duplicate rule's N).
    cpp: u32,
    userspace: bool,
    timer_at: Option<Instant>,
}

/// A message LNet holds (an RxToken), answered exactly once.
#[derive(Debug)]
enum Held {
    /// Came up as `Received`; its connection is `stream`.
    Inline { stream: StreamId },
    /// Came up as a BulkRequest: its payload waits in the stream.
    Bulk {
        stream: StreamId,
        msg: Box<RxMsg>,
        from: Nid,
    },
    /// Delivered to ourselves: the payload is here.
    Local { payload: Vec<u8>, bulk: bool },
}

/// A timer on the wheel; checked against its owner's own deadlines when it fires.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Timer {
    Conn(StreamId),
    Peer(Nid),
    Get(WireHandle),
}

/// A socklnd NI: see the module doc.
pub struct SockEngine {
    cfg: SockConfig,
    now: Instant,
    conns: HandleSlab<Conn, StreamTag>,
    peers: HashMap<Nid, Peer>,
    txs: HandleSlab<Tx, TxTag>,
    held: HashMap<(u64, u32), Held>,
    next_slot: u32,
    gets: HashMap<WireHandle, GetWait>,
    /// Landings done whose surplus is still being read, by connection.
    landings: HashMap<StreamId, (u64, Option<WireHandle>, u32)>,
    wheel: TimerWheel<Timer>,
    actions: VecDeque<StreamAction>,
    events: VecDeque<LndEvent>,
    stats: SockStats,
    listening: Option<SocketAddrV4>,
    shutting_down: bool,
    next_send: u64,
    recycled: Vec<Vec<u8>>,
    /// `lnetctl capture`: the stream bytes sent and received, while on (bounded).
    capture: Option<VecDeque<SockCaptured>>,
}

/// Records the capture queue holds at most; beyond, records are dropped and counted
/// (`capture_drops`), so a capture nobody drains costs bounded memory.
pub const CAPTURE_QUEUE: usize = 4096;
/// Payload bytes a record keeps of one send or read; the rest is only counted (`elided`), so a
/// pcap of the stream stays consistent (the writer fills the count with zeros) without holding
/// a copy of every bulk payload.
pub const CAPTURE_BYTES: usize = 4096;

/// Bytes of one connection's stream, as `lnetctl capture` records them: what one `Send` put on
/// it, or what one read took off it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SockCaptured {
    pub at: Instant,
    /// Ours to the peer (`true`) or the peer's to us.
    pub sent: bool,
    /// The peer's NID, once its HELLO named it.
    pub peer: Option<Nid>,
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
    /// The first bytes, as on the wire.
    pub bytes: Vec<u8>,
    /// Bytes that followed `bytes` on the stream and were not kept.
    pub elided: u32,
}

impl SockEngine {
    /// An NI with `cfg`, started at `now`: its listener is the first action (unless
    /// `accept=none`).
    pub fn new(cfg: SockConfig, now: Instant) -> SockEngine {
        let mut e = SockEngine {
            cfg,
            now,
            conns: HandleSlab::new(),
            peers: HashMap::new(),
            txs: HandleSlab::new(),
            held: HashMap::new(),
            next_slot: 0,
            gets: HashMap::new(),
            landings: HashMap::new(),
            wheel: TimerWheel::new(now, Duration::from_millis(10)),
            actions: VecDeque::new(),
            events: VecDeque::new(),
            stats: SockStats::default(),
            listening: None,
            shutting_down: false,
            next_send: 1,
            recycled: Vec::new(),
            capture: None,
        };
        if e.cfg.accept != AcceptMode::None {
            let addr = SocketAddrV4::new(e.my_ip(), e.cfg.accept_port);
            e.actions.push_back(StreamAction::Listen {
                addr,
                backlog: e.cfg.accept_backlog,
            });
        }
        e
    }

    /// The settings.
    pub fn config(&self) -> &SockConfig {
        &self.cfg
    }

    /// The counters.
    pub fn stats(&self) -> &SockStats {
        &self.stats
    }

    /// Where the listener is, once the driver said.
    pub fn listening(&self) -> Option<SocketAddrV4> {
        self.listening
    }

    /// The next thing for the stream driver to do.
    pub fn poll_action(&mut self) -> Option<StreamAction> {
        self.actions.pop_front()
    }

    /// Starts (`true`) or stops recording the bytes of every connection (`lnetctl capture`);
    /// records not drained are dropped when it stops.
    pub fn set_capture(&mut self, on: bool) {
        self.capture = on.then(VecDeque::new);
    }

    /// The next captured record, oldest first.
    pub fn poll_captured(&mut self) -> Option<SockCaptured> {
        self.capture.as_mut()?.pop_front()
    }

    /// Records `bytes` (and `elided` more) of connection `id`'s stream, if capturing.
    fn capture_bytes(&mut self, id: StreamId, sent: bool, bytes: &[&[u8]], elided: u32) {
        let Some(q) = self.capture.as_mut() else {
            return;
        };
        let Some(c) = self.conns.get(id) else {
            return;
        };
        if q.len() >= CAPTURE_QUEUE {
            self.stats.capture_drops += 1;
            return;
        }
        let mut kept = Vec::new();
        let mut skipped = elided;
        for b in bytes {
            let room = CAPTURE_BYTES.saturating_sub(kept.len());
            let n = b.len().min(room);
            kept.extend_from_slice(&b[..n]);
            skipped = skipped.saturating_add((b.len() - n) as u32);
        }
        q.push_back(SockCaptured {
            at: self.now,
            sent,
            peer: c.peer,
            local: c.local,
            remote: c.remote,
            bytes: kept,
            elided: skipped,
        });
    }

    /// Every connection, for `conn show`.
    pub fn conn_views(&self) -> Vec<SockConnView> {
        let mut v: Vec<SockConnView> = self
            .conns
            .iter()
            .map(|(_, c)| SockConnView {
                peer: c.peer,
                remote: c.remote,
                local: c.local,
                ctype: if c.state.handshaking() && !c.active {
                    ""
                } else {
                    type_name(c.ctype)
                },
                state: c.state.name(),
                active: c.active,
                queued_bytes: c.queued_bytes,
                zc_acks_sent: c.zc_acks_sent,
                zc_acks_received: c.zc_acks_received,
            })
            .collect();
        v.sort_by_key(|c| (c.peer.map(Nid::raw), c.remote, c.ctype));
        v
    }

    /// Bytes the engine holds in its connections' carry buffers (what a connection costs us
    /// beyond the driver's socket).
    pub fn carry_bytes(&self) -> usize {
        self.conns.iter().map(|(_, c)| c.carry.capacity()).sum()
    }

    /// One event from the stream driver, at `now`.
    pub fn handle_stream(&mut self, now: Instant, ev: StreamEvent<'_>) {
        self.advance(now);
        match ev {
            StreamEvent::Listening { local } => {
                info!(nid = %self.cfg.nid, %local, "socklnd listening");
                self.listening = Some(local);
            }
            StreamEvent::ListenFailed { errno } => {
                warn!(nid = %self.cfg.nid, errno, "socklnd cannot listen: accepting nothing");
                self.listening = None;
            }
            StreamEvent::Incoming {
                incoming,
                peer,
                local,
            } => self.on_incoming(incoming, peer, local),
            StreamEvent::Connected { stream, local } => self.on_connected(stream, local),
            StreamEvent::DialFailed { stream, error } => self.on_dial_failed(stream, error),
            StreamEvent::Data { stream, bytes } => self.on_data(stream, bytes),
            StreamEvent::Filled { stream, n } => self.on_filled(stream, n),
            StreamEvent::Sent { stream, id, result } => self.on_sent(stream, id, result),
            StreamEvent::Ended { stream, why } => self.on_ended(stream, why),
        }
    }

    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    fn my_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.cfg.nid.addr())
    }

    fn next_send_id(&mut self) -> SendId {
        let id = SendId(self.next_send);
        self.next_send += 1;
        id
    }

    // ------------------------------------------------------------------ timers

    /// The earliest of a connection's deadlines.
    fn conn_deadline(&self, c: &Conn) -> Option<Instant> {
        let t = self.cfg.timeout;
        let mut d: Option<Instant> = c.hs_deadline;
        let mut min = |x: Instant| d = Some(d.map_or(x, |y| y.min(x)));
        if c.state == ConnState::Established {
            let mid_message = match &c.rx {
                RxPhase::Header => !c.carry.is_empty(),
                RxPhase::AwaitLnet => false,
                RxPhase::Mem(l) => {
                    min(l.deadline);
                    true
                }
                RxPhase::Discard { .. } => true,
            };
            if mid_message {
                min(c.last_rx.saturating_add(t));
            }
            if !c.inflight.is_empty() {
                min(c.last_tx_progress.saturating_add(t));
            }
            if self.keepalive_conn(c) {
                min(self.keepalive_due(c));
            }
        }
        d
    }

    /// (Re)arms a connection's timer if its earliest deadline moved earlier.
    fn arm_conn(&mut self, id: StreamId) {
        let Some(c) = self.conns.get(id) else { return };
        let Some(d) = self.conn_deadline(c) else {
            return;
        };
        if c.timer_at.is_some_and(|t| t <= d) {
            return;
        }
        self.wheel.insert(d, Timer::Conn(id));
        if let Some(c) = self.conns.get_mut(id) {
            c.timer_at = Some(d);
        }
    }

    fn peer_deadline(&self, nid: Nid, p: &Peer) -> Option<Instant> {
        let mut d = p.next_dial.filter(|_| !p.queue.is_empty());
        if let Some(tx) = p.queue.front().and_then(|&k| self.txs.get(k)) {
            let x = tx.queued_at.saturating_add(self.cfg.timeout);
            d = Some(d.map_or(x, |y| y.min(x)));
        }
        let _ = nid;
        d
    }

    fn arm_peer(&mut self, nid: Nid) {
        let Some(p) = self.peers.get(&nid) else {
            return;
        };
        let Some(d) = self.peer_deadline(nid, p) else {
            return;
        };
        if p.timer_at.is_some_and(|t| t <= d) {
            return;
        }
        self.wheel.insert(d, Timer::Peer(nid));
        if let Some(p) = self.peers.get_mut(&nid) {
            p.timer_at = Some(d);
        }
    }

    /// Runs every timer due at `now`.
    pub fn run_timers(&mut self, now: Instant) {
        self.advance(now);
        while let Some((_, t)) = self.wheel.poll(now) {
            match t {
                Timer::Conn(id) => {
                    if let Some(c) = self.conns.get_mut(id) {
                        c.timer_at = None;
                    }
                    self.conn_timeouts(id);
                    self.arm_conn(id);
                }
                Timer::Peer(nid) => {
                    if let Some(p) = self.peers.get_mut(&nid) {
                        p.timer_at = None;
                    }
                    self.peer_timeouts(nid);
                    self.arm_peer(nid);
                }
                Timer::Get(wmd) => self.get_timeout(wmd),
            }
        }
    }

    /// A connection's deadlines that passed.
    fn conn_timeouts(&mut self, id: StreamId) {
        let now = self.now;
        let t = self.cfg.timeout;
        let Some(c) = self.conns.get(id) else { return };
        if c.hs_deadline.is_some_and(|d| d <= now) {
            self.stats.handshake_timeouts += 1;
            debug!(?id, state = c.state.name(), "socklnd handshake timed out");
            let (active, peer) = (c.active, c.peer);
            if let (true, Some(nid)) = (active, peer) {
                self.dial_failed_hard(nid, TxError::ConnectFailed);
            }
            self.close(id, ConnInput::TimedOut, DownReason::Timeout);
            return;
        }
        if c.state != ConnState::Established {
            return;
        }
        let stall = match &c.rx {
            RxPhase::Mem(l) if l.deadline <= now => Some(Stall::Bulk),
            RxPhase::Header if !c.carry.is_empty() => Some(Stall::Rx),
            RxPhase::Mem(_) | RxPhase::Discard { .. } => Some(Stall::Rx),
            _ => None,
        }
        .filter(|s| *s == Stall::Bulk || c.last_rx.saturating_add(t) <= now);
        let tx_stall = !c.inflight.is_empty() && c.last_tx_progress.saturating_add(t) <= now;
        match (stall, tx_stall) {
            (Some(Stall::Bulk), _) => {
                self.stats.bulk_stalls += 1;
                warn!(?id, peer = ?c.peer, "socklnd bulk payload not in within grant_timeout");
                self.close_siblings(id, ConnInput::TimedOut, DownReason::Timeout);
            }
            (Some(Stall::Rx), _) => {
                self.stats.rx_stalls += 1;
                warn!(?id, peer = ?c.peer, "socklnd message stalled mid-way");
                self.close_siblings(id, ConnInput::TimedOut, DownReason::Timeout);
            }
            (None, true) => {
                self.stats.tx_stalls += 1;
                warn!(?id, peer = ?c.peer, "socklnd send made no progress");
                self.close_siblings(id, ConnInput::TimedOut, DownReason::Timeout);
            }
            (None, false) => {
                if self.keepalive_conn(c) && self.keepalive_due(c) <= now {
                    self.send_keepalive(id);
                }
            }
        }
    }

    // ------------------------------------------------------------------ closing

    /// Closes one connection: the table's transition, the driver's `Close`, and everything it
    /// held failed once. `why` is the reason given to LNet if it was the peer's last.
    fn close(&mut self, id: StreamId, input: ConnInput, why: DownReason) {
        let Some(c) = self.conns.get(id) else { return };
        if next_state(c.state, input).is_none() {
            // Closing takes nothing more: the connection is already gone.
            return;
        }
        let mode = match input {
            ConnInput::Close | ConnInput::Refused => CloseMode::Graceful,
            ConnInput::Ended if why == DownReason::Closed => CloseMode::Graceful,
            _ => CloseMode::Abort,
        };
        let Some(c) = self.conns.remove(id) else {
            return;
        };
        match mode {
            CloseMode::Graceful => self.stats.closes_graceful += 1,
            CloseMode::Abort => self.stats.closes_abort += 1,
        }
        self.stats.conns = self.conns.len() as u64;
        if c.state.handshaking() && !c.active {
            self.stats.unauthenticated = self.stats.unauthenticated.saturating_sub(1);
        }
        debug!(?id, peer = ?c.peer, state = c.state.name(), ?input, "socklnd close");
        self.actions
            .push_back(StreamAction::Close { stream: id, mode });
        // What was on it: handed to the socket, so the peer may have some of it (a resend
        // is LNet's call); after a deadline it is a timeout.
        let err = match input {
            ConnInput::TimedOut => TxError::Timeout,
            _ => TxError::SendFailed,
        };
        for (_, tx, _) in c.inflight {
            if let Some(tx) = tx {
                self.fail_tx(tx, err);
            }
        }
        if let RxPhase::Mem(l) = c.rx {
            let result = Err(if input == ConnInput::TimedOut {
                TxError::GrantExpired
            } else {
                TxError::ConnAborted
            });
            self.end_landing(*l, c.peer.unwrap_or(Nid::ANY), result);
        }
        if let Some((cookie, get, _)) = self.landings.remove(&id) {
            if let Some(w) = get {
                self.gets.remove(&w);
            }
            self.bulk_done(
                cookie,
                c.peer.unwrap_or(Nid::ANY),
                Err(TxError::ConnAborted),
            );
        }
        let Some(nid) = c.peer else { return };
        let Some(p) = self.peers.get_mut(&nid) else {
            return;
        };
        p.conns.retain(|&s| s != id);
        let established_left = p.conns.iter().any(|&s| {
            self.conns
                .get(s)
                .is_some_and(|c| c.state == ConnState::Established)
        });
        if !established_left && p.up {
            p.up = false;
            p.incarnation = None;
            p.version = None;
            let reason = match (input, why) {
                (ConnInput::Ended, DownReason::Closed) => DownReason::Closed,
                (ConnInput::Ended, _) => DownReason::ConnectionLost,
                (ConnInput::ProtocolError, _) => DownReason::ProtocolError,
                (ConnInput::TimedOut, _) => DownReason::Timeout,
                (_, w) => w,
            };
            info!(peer = %nid, ?reason, "socklnd peer down");
            self.events.push_back(LndEvent::PeerDown { nid, reason });
            // GETs waiting for a REPLY from it will not get one.
            let dead: Vec<WireHandle> = self
                .gets
                .iter()
                .filter(|(_, g)| g.peer == nid && g.landing.is_none())
                .map(|(k, _)| *k)
                .collect();
            for k in dead {
                if let Some(g) = self.gets.remove(&k) {
                    self.bulk_done(g.cookie, nid, Err(TxError::ConnAborted));
                }
            }
        }
        // Messages still waiting redial the peer (the kernel dials only with traffic).
        let waiting = self.peers.get(&nid).is_some_and(|p| !p.queue.is_empty());
        if waiting && !self.shutting_down {
            self.kick_peer(nid);
        }
        self.forget_peer_if_idle(nid);
    }

    /// Closes `id` and every connection to the same peer IP (reference 5.7: siblings go
    /// together on an error).
    fn close_siblings(&mut self, id: StreamId, input: ConnInput, why: DownReason) {
        let Some(ip) = self.conns.get(id).map(|c| *c.remote.ip()) else {
            return;
        };
        let all: Vec<StreamId> = self
            .conns
            .iter()
            .filter(|(_, c)| *c.remote.ip() == ip && c.state == ConnState::Established)
            .map(|(s, _)| s)
            .collect();
        self.close(id, input, why);
        for s in all {
            self.close(s, ConnInput::Close, why);
        }
    }

    fn on_ended(&mut self, id: StreamId, why: crate::stream::EndReason) {
        let Some(c) = self.conns.get(id) else { return };
        let active_hs = c.active && c.state.handshaking();
        // EOF at a message boundary is a quiet close; inside a message a protocol error
        // (reference 5.7).
        let boundary = matches!(c.rx, RxPhase::Header) && c.carry.is_empty();
        let (input, reason) = match why {
            crate::stream::EndReason::Eof if boundary || c.state.handshaking() => {
                (ConnInput::Ended, DownReason::Closed)
            }
            crate::stream::EndReason::Eof => {
                self.stats.protocol_errors += 1;
                (ConnInput::ProtocolError, DownReason::ProtocolError)
            }
            crate::stream::EndReason::TimedOut => (ConnInput::Ended, DownReason::Timeout),
            _ => (ConnInput::Ended, DownReason::ConnectionLost),
        };
        let peer = c.peer;
        if active_hs {
            if let Some(nid) = peer {
                self.dial_failed_hard(nid, TxError::ConnectFailed);
            }
        }
        if reason == DownReason::Closed {
            self.close(id, input, reason);
        } else {
            self.close_siblings(id, input, reason);
        }
    }

    /// Drops a peer we hold nothing for.
    fn forget_peer_if_idle(&mut self, nid: Nid) {
        let idle = self
            .peers
            .get(&nid)
            .is_some_and(|p| p.conns.is_empty() && p.queue.is_empty() && !p.up);
        let getting = self.gets.values().any(|g| g.peer == nid);
        if idle && !getting && self.peers.get(&nid).is_some_and(|p| p.next_dial.is_none()) {
            self.peers.remove(&nid);
        }
    }

    fn bulk_done(&mut self, cookie: u64, peer: Nid, result: Result<u32, TxError>) {
        self.events.push_back(LndEvent::BulkDone {
            cookie,
            peer,
            result,
        });
    }

    fn get_timeout(&mut self, wmd: WireHandle) {
        let now = self.now;
        let due = self
            .gets
            .get(&wmd)
            .is_some_and(|g| g.landing.is_none() && g.deadline.is_some_and(|d| d <= now));
        if due {
            if let Some(g) = self.gets.remove(&wmd) {
                debug!(peer = %g.peer, "socklnd GET: no REPLY in time");
                self.bulk_done(g.cookie, g.peer, Err(TxError::Timeout));
                self.forget_peer_if_idle(g.peer);
            }
        }
    }
}

impl StreamSink for SockEngine {
    fn stream_event(&mut self, now: Instant, ev: StreamEvent<'_>) {
        self.handle_stream(now, ev);
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Stall {
    Rx,
    Bulk,
}

fn type_name(t: ConnType) -> &'static str {
    match t {
        ConnType::Any => "any",
        ConnType::Control => "control",
        ConnType::BulkIn => "bulk_in",
        ConnType::BulkOut => "bulk_out",
    }
}
