//! A deterministic TCP-like stream network in virtual time, for streaming LNDs (socklnd): the
//! simulator's counterpart of [`crate::stream`], as the RC fabric of [`super::World`] is of
//! [`crate::fabric`]. Hosts are named by [`HostId`] and addressed by IPv4 address; each host's
//! LND drives the network with [`StreamAction`]s ([`StreamNet::apply`]) and hears
//! [`StreamEvent`]s ([`StreamNet::deliver`]).
//!
//! # The model
//! - **Dial**: after `latency` the SYN reaches the target; a listener there makes an `Incoming`
//!   (the connection exists from then on: what the dialer sends waits in its receive buffer until
//!   the target adopts it), and the dialer hears `Connected` one more `latency` later. No
//!   listener: `DialFailed(Refused)` after a round trip. No host at that address, a host that is
//!   down, a partition, or a full backlog: `DialFailed(Unreachable)` after `connect_timeout` (the
//!   SYN retries of a real stack). A source port is taken from `ports_from` down to `ports_to`,
//!   shared toward different remotes as `SO_REUSEPORT` lets the kernel; none free: `NoPorts`.
//! - **Bytes**: a direction of a connection carries at most `window` bytes not yet read by the
//!   receiver (its send and receive buffers together). A send moves into the window as room
//!   allows, arrives `latency` (plus its length over `bandwidth`) later, and is reported `Sent`
//!   once its last byte entered the window. The receiver's posted `Recv` takes what has arrived
//!   (all of it up to `max`, or less under [`StreamNet::set_partial_io`]); with none posted
//!   nothing is read, the window fills and the sender's sends stop: back-pressure, as with real
//!   sockets.
//! - **Close**: graceful sends what is queued then FIN; the peer hears `Ended(Eof)` once it has
//!   read every byte before the FIN (with a `Recv` posted, as a real read returns 0). Abort sends
//!   RST: the peer hears `Ended(Reset)` at once (its unread bytes and unsent sends are dropped,
//!   the sends reported failed).
//! - **Faults**: [`StreamNet::crash`] (a host vanishes: its peers hear nothing, and find out by
//!   TCP keepalive or user timeout if they configured one, `Ended(TimedOut)`, or by RST once the
//!   host is back and they send to it), [`StreamNet::restart`], [`StreamNet::partition`] /
//!   [`StreamNet::heal`] (bytes held, not lost, as TCP retransmits), [`StreamNet::reset_between`],
//!   partial reads.
//!
//! Every random choice comes from one seeded [`SimRng`], so a run is a function of its seed and
//! its calls.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};

use super::SimRng;
use crate::stream::{
    CloseMode, DialError, EndReason, IncomingId, RecvTarget, SendId, SendPayload, SockOpts,
    StreamAction, StreamEvent, StreamId, StreamReport as Report,
};
use crate::time::{Duration, Instant};

/// A host of the stream network (one per simulated node that has streaming NIs).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId(pub u32);

/// The network's parameters.
#[derive(Clone, Debug)]
pub struct StreamNetConfig {
    /// One-way delay of a segment.
    pub latency: Duration,
    /// Bytes per second of one direction of a connection (0: unlimited).
    pub bandwidth: u64,
    /// Bytes one direction holds that the receiver has not read (send + receive buffers).
    pub window: usize,
    /// How long a dial to nobody takes to fail.
    pub connect_timeout: Duration,
    /// The first port a dial (or a listener) on port 0 gets.
    pub ephemeral_base: u16,
    /// How long a stack with no keepalive and no user timeout retransmits to a silent peer
    /// before it gives up (Linux's tcp_retries2 = 15: about 15 minutes).
    pub retransmit_limit: Duration,
    pub seed: u64,
}

impl Default for StreamNetConfig {
    fn default() -> Self {
        StreamNetConfig {
            latency: Duration::from_micros(20),
            bandwidth: 0,
            window: 256 * 1024,
            connect_timeout: Duration::from_secs(3),
            ephemeral_base: 40000,
            retransmit_limit: Duration::from_secs(924),
            seed: 1,
        }
    }
}

/// What the network counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamNetStats {
    pub dials: u64,
    pub dials_refused: u64,
    pub dials_unreachable: u64,
    pub dials_no_ports: u64,
    pub accepted: u64,
    pub refused: u64,
    pub bytes_delivered: u64,
    pub graceful_closes: u64,
    pub aborts: u64,
    pub resets_heard: u64,
    pub timeouts: u64,
    /// Reports for a stream its host no longer has (a close crossed them): dropped.
    pub stale_actions: u64,
}

/// The network's key for one end of a connection.
type EndKey = u64;

/// Something due at a time.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// A dial's SYN reaches its target.
    Syn(EndKey),
    /// The dialer learns it is connected.
    Established(EndKey),
    /// A dial fails.
    DialFails(EndKey, DialErrorKey),
    /// Bytes arrive at an end (the segment's payload is held in `Net::segments`).
    Arrive(EndKey, u64),
    /// The peer's FIN arrives.
    Fin(EndKey),
    /// The peer's RST arrives.
    Rst(EndKey),
    /// An end gives up on a silent peer (keepalive or user timeout).
    GiveUp(EndKey),
    /// A gracefully closed end is let go of.
    Reap(EndKey),
    /// An end's bytes have been stalled for its TCP_USER_TIMEOUT, if they still are.
    UserTimeout(EndKey),
}

/// Whether a due is work in flight for [`StreamNet::in_flight`]: everything but the timers of
/// a stack (its give-up on a silent peer, which may sit in the queue for a quarter of an hour,
/// and its bound on a graceful close, usually moot once both FINs are out).
fn counts_as_work(due: &Due) -> bool {
    !matches!(due, Due::GiveUp(_) | Due::UserTimeout(_) | Due::Reap(_))
}

/// `DialError` with an order, for the queue.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum DialErrorKey {
    Refused,
    Unreachable,
}

/// A send not yet wholly in the window.
#[derive(Debug)]
struct PendingSend {
    id: SendId,
    bytes: Vec<u8>,
    moved: usize,
}

/// Where a posted receive stands.
#[derive(Debug)]
struct PostedRecv {
    target: RecvTarget,
    done: u32,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum EndState {
    /// Dialing: the SYN is on its way.
    Dialing,
    /// Arrived at a listener, not adopted yet.
    Unadopted,
    Open,
    /// Closed gracefully by its host: still swallowing the peer's bytes until the peer's FIN or
    /// the reap, reporting nothing.
    Closing,
}

#[derive(Debug)]
struct End {
    host: HostId,
    /// The host's name for it (none while unadopted).
    stream: Option<StreamId>,
    incoming: Option<IncomingId>,
    state: EndState,
    local: SocketAddrV4,
    remote: SocketAddrV4,
    peer: Option<EndKey>,
    /// Arrived, unread.
    rx: VecDeque<u8>,
    /// Bytes sent toward this end not yet read by it (arrived or on the way): the window.
    inbound: usize,
    rx_fin: bool,
    recv: Option<PostedRecv>,
    tx: VecDeque<PendingSend>,
    /// Our FIN waits for the queued sends.
    fin_after_tx: bool,
    ended: bool,
    opts: SockOpts,
    /// When the peer was last heard from (bytes, FIN) or the connection made.
    heard: Instant,
    /// When the last segment sent from this end arrives (the next arrives no earlier).
    last_arrival: Instant,
    /// Since when its queued bytes have been held by a stall.
    stalled_since: Option<Instant>,
    /// The last piece that moved was a short write: the next segment leaves after it.
    split: bool,
}

#[derive(Debug, Default)]
struct Host {
    ip: Option<Ipv4Addr>,
    up: bool,
    /// Its process reads nothing (hung): posted receives stay unserved, windows fill.
    deaf: bool,
    listener: Option<(SocketAddrV4, u32)>,
    next_incoming: u64,
    next_ephemeral: u16,
}

/// The network (see the module documentation).
pub struct StreamNet {
    cfg: StreamNetConfig,
    rng: SimRng,
    now: Instant,
    hosts: Vec<Host>,
    by_ip: HashMap<Ipv4Addr, HostId>,
    ends: BTreeMap<EndKey, End>,
    next_end: EndKey,
    by_stream: HashMap<(HostId, StreamId), EndKey>,
    by_incoming: HashMap<(HostId, IncomingId), EndKey>,
    queue: BinaryHeap<Reverse<(Instant, u64, Due)>>,
    seq: u64,
    segments: HashMap<u64, Vec<u8>>,
    /// Reports ready for their hosts, in order.
    out: VecDeque<(HostId, Report)>,
    partial_io: f64,
    partial_writes: f64,
    /// Cut host pairs (lower first), with how many partitions cut each.
    partitions: HashMap<(HostId, HostId), u32>,
    /// Stalled directions (from, to), with how many stalls hold each.
    stalls: HashMap<(HostId, HostId), u32>,
    /// Dues in the queue that are work in flight (not a stack's give-up timer).
    busy: u64,
    stats: StreamNetStats,
}

/// A report ready for its host, taken out of the network with [`StreamNet::pop_report`] (so the
/// host can act, and the network be driven, before the next one is looked at).
#[derive(Debug)]
pub struct ReadyReport {
    host: HostId,
    report: Report,
}

impl ReadyReport {
    /// The host it is for.
    pub fn host(&self) -> HostId {
        self.host
    }

    /// The event, as a driver reports it.
    pub fn event(&self) -> StreamEvent<'_> {
        self.report.as_event()
    }
}

impl StreamNet {
    /// An empty network at time zero.
    pub fn new(cfg: StreamNetConfig) -> StreamNet {
        StreamNet {
            rng: SimRng::new(cfg.seed),
            cfg,
            now: Instant::from_nanos(0),
            hosts: Vec::new(),
            by_ip: HashMap::new(),
            ends: BTreeMap::new(),
            next_end: 1,
            by_stream: HashMap::new(),
            by_incoming: HashMap::new(),
            queue: BinaryHeap::new(),
            seq: 0,
            segments: HashMap::new(),
            out: VecDeque::new(),
            partial_io: 0.0,
            partial_writes: 0.0,
            partitions: HashMap::new(),
            stalls: HashMap::new(),
            busy: 0,
            stats: StreamNetStats::default(),
        }
    }

    /// Adds a host at `ip` (one host per address).
    pub fn add_host(&mut self, ip: Ipv4Addr) -> HostId {
        let id = HostId(self.hosts.len() as u32);
        self.hosts.push(Host {
            ip: Some(ip),
            up: true,
            next_ephemeral: self.cfg.ephemeral_base,
            ..Host::default()
        });
        self.by_ip.insert(ip, id);
        id
    }

    /// The host at `ip`.
    pub fn host_at(&self, ip: Ipv4Addr) -> Option<HostId> {
        self.by_ip.get(&ip).copied()
    }

    /// The network's time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The counters.
    pub fn stats(&self) -> &StreamNetStats {
        &self.stats
    }

    /// Connections (ends) the network holds for `host`, in any state.
    pub fn ends_of(&self, host: HostId) -> usize {
        self.ends.values().filter(|e| e.host == host).count()
    }

    /// Open connections of `host` whose other end is gone (crashed, rebooted, reset) and that
    /// have not heard so yet: what a peer holds for a dead connection (a zombie, once it has
    /// had time to find out).
    pub fn orphan_ends(&self, host: HostId) -> usize {
        self.ends
            .values()
            .filter(|e| e.host == host && e.state == EndState::Open && !e.ended)
            .filter(|e| e.peer.is_none_or(|p| !self.ends.contains_key(&p)))
            .count()
    }

    /// With probability `p` a read takes only part of what has arrived.
    pub fn set_partial_io(&mut self, p: f64) {
        self.partial_io = p;
    }

    /// With probability `p` each piece of a send that moves into the window is cut short, so a
    /// send leaves as several segments (what a short `send()` returns, or TSO/MSS splits, do to
    /// a reader: it sees a message in pieces even with whole reads).
    pub fn set_partial_writes(&mut self, p: f64) {
        self.partial_writes = p;
    }

    /// Dues that are work in flight: segments, FINs, RSTs, handshakes, and reports not yet
    /// taken (a stack's timers are not work: keepalive, retransmission and user-timeout
    /// give-ups, the bound on a graceful close).
    pub fn in_flight(&self) -> u64 {
        self.busy + self.out.len() as u64
    }

    /// The oldest ready report, if any.
    pub fn pop_report(&mut self) -> Option<ReadyReport> {
        let (host, report) = self.out.pop_front()?;
        Some(ReadyReport { host, report })
    }

    /// Moves the network's clock to `t` (if later) without running what is due: a host acting
    /// at `t` while dues at `t` wait for their turn.
    pub fn set_now(&mut self, t: Instant) {
        self.now = self.now.max(t);
    }

    /// When the next thing is due.
    pub fn next_event_at(&self) -> Option<Instant> {
        self.queue.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Whether reports wait for delivery.
    pub fn has_reports(&self) -> bool {
        !self.out.is_empty()
    }

    /// Runs everything due up to `t` (the time moves there).
    pub fn advance(&mut self, t: Instant) {
        while let Some(Reverse((at, _, _))) = self.queue.peek() {
            if *at > t {
                break;
            }
            let Some(Reverse((at, _, due))) = self.queue.pop() else {
                break;
            };
            if counts_as_work(&due) {
                self.busy -= 1;
            }
            self.now = self.now.max(at);
            self.run(due);
        }
        self.now = self.now.max(t);
    }

    /// Hands every ready report to `f` (host, time, event), oldest first.
    pub fn deliver(&mut self, mut f: impl FnMut(HostId, Instant, StreamEvent<'_>)) {
        while let Some((host, r)) = self.out.pop_front() {
            f(host, self.now, r.as_event());
        }
    }

    /// One action of `host`'s LND.
    pub fn apply(&mut self, host: HostId, action: StreamAction) {
        if !self.host_up(host) {
            return;
        }
        match action {
            StreamAction::Listen { addr, backlog } => self.listen(host, addr, backlog),
            StreamAction::Unlisten => self.hosts[host.0 as usize].listener = None,
            StreamAction::Adopt { incoming, stream } => self.adopt(host, incoming, stream),
            StreamAction::Refuse { incoming } => {
                if let Some(k) = self.by_incoming.remove(&(host, incoming)) {
                    self.stats.refused += 1;
                    self.abort(k);
                }
            }
            StreamAction::Dial {
                stream,
                local,
                ports_from,
                ports_to,
                remote,
            } => self.dial(host, stream, local, ports_from, ports_to, remote),
            StreamAction::Configure { stream, opts } => {
                if let Some(e) = self.end_mut(host, stream) {
                    e.opts = opts;
                }
            }
            StreamAction::Recv { stream, target } => {
                if let Some(k) = self.key(host, stream) {
                    if let Some(e) = self.ends.get_mut(&k) {
                        e.recv = Some(PostedRecv { target, done: 0 });
                    }
                    self.read(k);
                }
            }
            StreamAction::Send {
                stream,
                id,
                head,
                payload,
            } => {
                let Some(k) = self.key(host, stream) else {
                    return;
                };
                let mut bytes = head;
                match payload {
                    SendPayload::None => {}
                    SendPayload::Bytes(b) => bytes.extend_from_slice(&b),
                    SendPayload::Mem { mem, offset, len } => mem.with(|m| {
                        let from = (offset as usize).min(m.len());
                        let to = from.saturating_add(len as usize).min(m.len());
                        bytes.extend_from_slice(&m[from..to]);
                    }),
                }
                if let Some(e) = self.ends.get_mut(&k) {
                    e.tx.push_back(PendingSend {
                        id,
                        bytes,
                        moved: 0,
                    });
                }
                self.pump(k);
            }
            StreamAction::Close { stream, mode } => {
                let Some(k) = self.by_stream.remove(&(host, stream)) else {
                    return;
                };
                let dead = self
                    .ends
                    .get(&k)
                    .is_some_and(|e| e.ended && e.peer.is_none_or(|p| !self.ends.contains_key(&p)));
                match mode {
                    // Reset or timed out: nothing to send or wait for.
                    _ if dead => {
                        self.ends.remove(&k);
                    }
                    CloseMode::Graceful => self.close_gracefully(k),
                    CloseMode::Abort => {
                        self.stats.aborts += 1;
                        self.abort(k);
                    }
                }
            }
        }
    }

    /// The connection ends `host` holds.
    fn ends_on(&self, host: HostId) -> Vec<EndKey> {
        let on_host = self.ends.iter().filter(|(_, e)| e.host == host);
        on_host.map(|(k, _)| *k).collect()
    }

    /// `host` vanishes without a word: its connections and listener are gone; its peers hear
    /// nothing.
    pub fn crash(&mut self, host: HostId) {
        self.hosts[host.0 as usize].up = false;
        self.hosts[host.0 as usize].listener = None;
        for k in self.ends_on(host) {
            let Some(p) = self.ends.remove(&k).and_then(|e| e.peer) else {
                continue;
            };
            // Its peers hear nothing; a stack that probes idle connections finds out.
            if let Some(after) = self.ends.get(&p).and_then(|pe| keepalive_after(&pe.opts)) {
                self.at(self.now + after, Due::GiveUp(p));
            }
        }
        self.by_stream.retain(|(h, _), _| *h != host);
        self.by_incoming.retain(|(h, _), _| *h != host);
        // What it had not heard yet dies with it.
        self.out.retain(|(h, _)| *h != host);
    }

    /// The process on `host` exits while the host stays up: the kernel closes what it left
    /// open. Its listener goes (connections waiting in its accept queue are reset), a
    /// connection with unread bytes is reset (Linux sends RST when a socket with unread data
    /// is closed: `tcp_close`), any other is closed gracefully. Nothing more is reported to it.
    pub fn close_host(&mut self, host: HostId) {
        self.hosts[host.0 as usize].listener = None;
        let mine: Vec<EndKey> = self
            .ends
            .iter()
            .filter(|(_, e)| e.host == host && e.state != EndState::Closing)
            .map(|(k, _)| *k)
            .collect();
        for k in mine {
            let Some(e) = self.ends.get(&k) else {
                continue;
            };
            if let Some(s) = e.stream {
                self.by_stream.remove(&(host, s));
            }
            let abort = e.state != EndState::Open || !e.rx.is_empty() || e.ended;
            if abort {
                self.stats.aborts += 1;
                self.abort(k);
            } else {
                // Its queued sends still go out before the FIN, as the kernel's would.
                self.close_gracefully(k);
            }
        }
        self.by_incoming.retain(|(h, _), _| *h != host);
        self.out.retain(|(h, _)| *h != host);
    }

    /// `host` is back, with no connection and no listener.
    pub fn restart(&mut self, host: HostId) {
        self.hosts[host.0 as usize].up = true;
    }

    /// Bytes and connects between `a` and `b` are held until [`StreamNet::heal`]. Partitions
    /// stack: a pair cut twice is healed by the second heal.
    pub fn partition(&mut self, a: HostId, b: HostId) {
        *self.partitions.entry((a.min(b), a.max(b))).or_insert(0) += 1;
    }

    /// Ends a partition: what was held moves again.
    pub fn heal(&mut self, a: HostId, b: HostId) {
        let key = (a.min(b), a.max(b));
        if let Some(n) = self.partitions.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.partitions.remove(&key);
            }
        }
        self.pump_all();
    }

    /// Ends every partition.
    pub fn heal_all(&mut self) {
        self.partitions.clear();
        self.pump_all();
    }

    /// Bytes from `from` to `to` are held (queued sends stay queued, nothing new arrives), on
    /// every connection between them, until [`StreamNet::unstall`]; the other direction and new
    /// connects are untouched. A peer whose stack stops ACKing, a one-way black hole: the
    /// sender's sends stop completing, and only a deadline of its own (TCP_USER_TIMEOUT,
    /// the LND's) notices. Stalls stack as partitions do.
    pub fn stall(&mut self, from: HostId, to: HostId) {
        *self.stalls.entry((from, to)).or_insert(0) += 1;
        let keys: Vec<EndKey> = self
            .ends
            .iter()
            .filter(|(_, e)| e.host == from && !e.tx.is_empty())
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            self.arm_user_timeout(k);
        }
    }

    /// `host`'s process stops reading (`true`: a hung or wedged peer): its posted receives are
    /// not served, so what is sent to it fills the window and its senders' sends stop
    /// completing, while its stack still ACKs what arrived (no TCP timeout fires: only the
    /// sender's own deadline sees it). `false` resumes reading.
    pub fn set_deaf(&mut self, host: HostId, deaf: bool) {
        self.hosts[host.0 as usize].deaf = deaf;
        if !deaf {
            for k in self.ends_on(host) {
                self.read(k);
            }
        }
    }

    /// Ends a stall: what was held moves again.
    pub fn unstall(&mut self, from: HostId, to: HostId) {
        if let Some(n) = self.stalls.get_mut(&(from, to)) {
            *n -= 1;
            if *n == 0 {
                self.stalls.remove(&(from, to));
            }
        }
        self.pump_all();
    }

    fn pump_all(&mut self) {
        let keys: Vec<EndKey> = self.ends.keys().copied().collect();
        for k in keys {
            self.pump(k);
        }
    }

    /// Every connection between `a` and `b` is reset (both sides hear RST).
    pub fn reset_between(&mut self, a: HostId, b: HostId) {
        let keys: Vec<EndKey> = self
            .ends
            .iter()
            .filter(|(_, e)| {
                e.host == a
                    && e.peer
                        .and_then(|p| self.ends.get(&p))
                        .is_some_and(|p| p.host == b)
            })
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            let peer = self.ends.get(&k).and_then(|e| e.peer);
            self.hear_rst(k);
            if let Some(p) = peer {
                self.hear_rst(p);
            }
        }
    }

    // ------------------------------------------------------------------ internals

    fn host_up(&self, h: HostId) -> bool {
        self.hosts.get(h.0 as usize).is_some_and(|h| h.up)
    }

    fn key(&mut self, host: HostId, stream: StreamId) -> Option<EndKey> {
        let k = self.by_stream.get(&(host, stream)).copied();
        if k.is_none() {
            self.stats.stale_actions += 1;
        }
        k
    }

    fn end_mut(&mut self, host: HostId, stream: StreamId) -> Option<&mut End> {
        let k = self.key(host, stream)?;
        self.ends.get_mut(&k)
    }

    fn at(&mut self, t: Instant, due: Due) {
        if counts_as_work(&due) {
            self.busy += 1;
        }
        self.seq += 1;
        self.queue.push(Reverse((t, self.seq, due)));
    }

    fn report(&mut self, host: HostId, r: Report) {
        self.out.push_back((host, r));
    }

    fn partitioned(&self, a: HostId, b: HostId) -> bool {
        !self.partitions.is_empty() && self.partitions.contains_key(&(a.min(b), a.max(b)))
    }

    fn stalled(&self, from: HostId, to: HostId) -> bool {
        !self.stalls.is_empty() && self.stalls.contains_key(&(from, to))
    }

    /// End `k` has bytes it cannot get out (stalled): with TCP_USER_TIMEOUT set, its stack
    /// gives up that long after (checked then: the stall may be over).
    fn arm_user_timeout(&mut self, k: EndKey) {
        let Some(e) = self.ends.get_mut(&k) else {
            return;
        };
        if e.stalled_since.is_some() {
            return;
        }
        e.stalled_since = Some(self.now);
        if let Some(ut) = e.opts.user_timeout {
            let t = self.now + ut;
            self.at(t, Due::UserTimeout(k));
        }
    }

    fn listen(&mut self, host: HostId, addr: SocketAddrV4, backlog: u32) {
        let h = &mut self.hosts[host.0 as usize];
        if h.ip != Some(*addr.ip()) {
            // EADDRNOTAVAIL: not this host's address.
            return self.report(host, Report::ListenFailed(99));
        }
        let port = if addr.port() == 0 {
            h.next_ephemeral = h.next_ephemeral.wrapping_add(1);
            h.next_ephemeral - 1
        } else {
            addr.port()
        };
        let local = SocketAddrV4::new(*addr.ip(), port);
        h.listener = Some((local, backlog.max(1)));
        self.report(host, Report::Listening(local));
    }

    fn new_end(&mut self, end: End) -> EndKey {
        let k = self.next_end;
        self.next_end += 1;
        self.ends.insert(k, end);
        k
    }

    fn blank_end(&self, host: HostId, local: SocketAddrV4, remote: SocketAddrV4) -> End {
        End {
            host,
            stream: None,
            incoming: None,
            state: EndState::Dialing,
            local,
            remote,
            peer: None,
            rx: VecDeque::new(),
            inbound: 0,
            rx_fin: false,
            recv: None,
            tx: VecDeque::new(),
            fin_after_tx: false,
            ended: false,
            opts: SockOpts::default(),
            heard: self.now,
            last_arrival: self.now,
            stalled_since: None,
            split: false,
        }
    }

    fn dial(
        &mut self,
        host: HostId,
        stream: StreamId,
        local: Ipv4Addr,
        ports_from: u16,
        ports_to: u16,
        remote: SocketAddrV4,
    ) {
        self.stats.dials += 1;
        let port = if ports_from == 0 {
            let h = &mut self.hosts[host.0 as usize];
            let p = h.next_ephemeral;
            h.next_ephemeral = h
                .next_ephemeral
                .checked_add(1)
                .unwrap_or(self.cfg.ephemeral_base);
            Some(p)
        } else {
            let taken: HashSet<u16> = self
                .ends
                .values()
                .filter(|e| e.host == host && *e.local.ip() == local && e.remote == remote)
                .map(|e| e.local.port())
                .collect();
            (ports_to..=ports_from).rev().find(|p| !taken.contains(p))
        };
        let Some(port) = port else {
            self.stats.dials_no_ports += 1;
            return self.report(host, Report::DialFailed(stream, DialError::NoPorts));
        };
        let end = End {
            stream: Some(stream),
            ..self.blank_end(host, SocketAddrV4::new(local, port), remote)
        };
        let k = self.new_end(end);
        self.by_stream.insert((host, stream), k);
        let target = self.by_ip.get(remote.ip()).copied();
        match target {
            Some(t) if self.host_up(t) && !self.partitioned(host, t) => {
                self.at(self.now + self.cfg.latency, Due::Syn(k));
            }
            _ => self.at(
                self.now + self.cfg.connect_timeout,
                Due::DialFails(k, DialErrorKey::Unreachable),
            ),
        }
    }

    fn adopt(&mut self, host: HostId, incoming: IncomingId, stream: StreamId) {
        let Some(k) = self.by_incoming.remove(&(host, incoming)) else {
            self.stats.stale_actions += 1;
            return;
        };
        self.stats.accepted += 1;
        if let Some(e) = self.ends.get_mut(&k) {
            e.stream = Some(stream);
            e.state = EndState::Open;
            let reset = e.ended;
            self.by_stream.insert((host, stream), k);
            if reset {
                // Reset before it was adopted: the first thing its host hears.
                self.report(host, Report::Ended(stream, EndReason::Reset));
            }
        }
    }

    fn run(&mut self, due: Due) {
        match due {
            Due::Syn(k) => self.syn(k),
            Due::Established(k) => {
                if let Some(e) = self.ends.get_mut(&k) {
                    if e.state == EndState::Dialing {
                        e.state = EndState::Open;
                        e.heard = self.now;
                        let (host, stream, local) = (e.host, e.stream, e.local);
                        if let Some(s) = stream {
                            self.report(host, Report::Connected(s, local));
                        }
                        self.pump(k);
                    }
                }
            }
            Due::DialFails(k, why) => {
                if let Some(e) = self.ends.remove(&k) {
                    let error = match why {
                        DialErrorKey::Refused => {
                            self.stats.dials_refused += 1;
                            DialError::Refused
                        }
                        DialErrorKey::Unreachable => {
                            self.stats.dials_unreachable += 1;
                            DialError::Unreachable
                        }
                    };
                    if let Some(s) = e.stream {
                        self.by_stream.remove(&(e.host, s));
                        self.report(e.host, Report::DialFailed(s, error));
                    }
                }
            }
            Due::Arrive(k, seg) => {
                let bytes = self.segments.remove(&seg).unwrap_or_default();
                if let Some(e) = self.ends.get_mut(&k) {
                    e.heard = self.now;
                    if e.state == EndState::Closing {
                        // Swallowed by a closing end (its driver reads to EOF).
                        e.inbound = e.inbound.saturating_sub(bytes.len());
                    } else {
                        e.rx.extend(bytes);
                        self.read(k);
                    }
                }
            }
            Due::Fin(k) => {
                if let Some(e) = self.ends.get_mut(&k) {
                    e.rx_fin = true;
                    e.heard = self.now;
                    if e.state == EndState::Closing {
                        self.ends.remove(&k);
                    } else {
                        self.read(k);
                    }
                }
            }
            Due::Rst(k) => self.hear_rst(k),
            Due::GiveUp(k) => {
                let silent = self.ends.get(&k).is_some_and(|e| {
                    let peer_gone = e.peer.is_none_or(|p| !self.ends.contains_key(&p));
                    peer_gone && !e.ended
                });
                if silent {
                    self.stats.timeouts += 1;
                    self.end_with(k, EndReason::TimedOut);
                }
            }
            Due::Reap(k) => {
                self.ends.remove(&k);
            }
            Due::UserTimeout(k) => {
                let expired = self.ends.get(&k).is_some_and(|e| {
                    let ut = e.opts.user_timeout.unwrap_or(Duration::MAX);
                    !e.ended
                        && !e.tx.is_empty()
                        && e.stalled_since.is_some_and(|s| s + ut <= self.now)
                });
                if expired {
                    self.stats.timeouts += 1;
                    self.end_with(k, EndReason::TimedOut);
                }
            }
        }
    }

    fn syn(&mut self, k: EndKey) {
        let Some(e) = self.ends.get(&k) else {
            return;
        };
        let (local, remote, from) = (e.local, e.remote, e.host);
        let target = self
            .by_ip
            .get(remote.ip())
            .copied()
            .filter(|t| !self.partitioned(from, *t));
        // A partition made while the SYN was on its way eats it.
        let Some(t) = target else {
            return self.at(
                self.now + self.cfg.connect_timeout,
                Due::DialFails(k, DialErrorKey::Unreachable),
            );
        };
        let listening = self.hosts[t.0 as usize]
            .listener
            .filter(|(addr, _)| addr.port() == remote.port());
        let Some((_, backlog)) = listening.filter(|_| self.host_up(t)) else {
            return self.at(
                self.now + self.cfg.latency,
                Due::DialFails(k, DialErrorKey::Refused),
            );
        };
        let waiting = self.by_incoming.keys().filter(|(h, _)| *h == t).count();
        if waiting >= backlog as usize {
            // A full accept queue drops the SYN; the dialer's retries run out.
            return self.at(
                self.now + self.cfg.connect_timeout,
                Due::DialFails(k, DialErrorKey::Unreachable),
            );
        }
        let h = &mut self.hosts[t.0 as usize];
        let incoming = IncomingId(h.next_incoming);
        h.next_incoming += 1;
        let server = End {
            incoming: Some(incoming),
            state: EndState::Unadopted,
            peer: Some(k),
            ..self.blank_end(t, remote, local)
        };
        let sk = self.new_end(server);
        self.by_incoming.insert((t, incoming), sk);
        if let Some(e) = self.ends.get_mut(&k) {
            e.peer = Some(sk);
        }
        self.report(
            t,
            Report::Incoming {
                incoming,
                peer: local,
                local: remote,
            },
        );
        self.at(self.now + self.cfg.latency, Due::Established(k));
    }

    /// Moves queued sends of end `k` into the window toward its peer.
    fn pump(&mut self, k: EndKey) {
        loop {
            let Some(e) = self.ends.get(&k) else {
                return;
            };
            if !matches!(e.state, EndState::Open | EndState::Closing) {
                return;
            }
            let Some(p) = e.peer else {
                return;
            };
            let host = e.host;
            let (peer_alive, peer_host, room) = match self.ends.get(&p) {
                Some(pe) => (true, pe.host, self.cfg.window.saturating_sub(pe.inbound)),
                None => (false, HostId(u32::MAX), usize::MAX),
            };
            if peer_alive && self.partitioned(host, peer_host) {
                return;
            }
            if peer_alive && (!e.tx.is_empty() || e.fin_after_tx) && self.stalled(host, peer_host) {
                // Held, FIN included (it follows the bytes).
                if !e.tx.is_empty() {
                    self.arm_user_timeout(k);
                }
                return;
            }
            let e = self.ends.get_mut(&k).expect("checked above");
            e.stalled_since = None;
            let Some(front) = e.tx.front_mut() else {
                if e.fin_after_tx {
                    e.fin_after_tx = false;
                    if peer_alive {
                        let t = (self.now + self.cfg.latency).max(e.last_arrival);
                        self.at(t, Due::Fin(p));
                    }
                }
                return;
            };
            if room == 0 {
                return;
            }
            let mut n = (front.bytes.len() - front.moved).min(room);
            let split_before = e.split;
            e.split = false;
            if n > 1 && self.rng.chance(self.partial_writes) {
                n = 1 + self.rng.below(n as u64 - 1) as usize;
                e.split = true;
            }
            let chunk = front.bytes[front.moved..front.moved + n].to_vec();
            front.moved += n;
            let done = front.moved == front.bytes.len();
            let id = front.id;
            if done {
                e.tx.pop_front();
            }
            let stream = e.stream;
            let state = e.state;
            if peer_alive {
                if let Some(pe) = self.ends.get_mut(&p) {
                    pe.inbound += n;
                }
                let serial = Duration::from_nanos(
                    (n as u64)
                        .saturating_mul(1_000_000_000)
                        .checked_div(self.cfg.bandwidth)
                        .unwrap_or(0),
                );
                self.seq += 1;
                let seg = self.seq;
                self.segments.insert(seg, chunk);
                // Segments of one direction arrive in order, each after the one before.
                let e = self.ends.get_mut(&k).expect("checked above");
                // The rest of a short write goes in a later segment, a little after.
                let gap = if split_before {
                    Duration::from_micros(1)
                } else {
                    Duration::ZERO
                };
                let t = (self.now + self.cfg.latency + serial).max(e.last_arrival + gap);
                e.last_arrival = t;
                self.at(t, Due::Arrive(p, seg));
            } else {
                self.sent_to_nobody(k);
            }
            if done && state == EndState::Open {
                if let Some(s) = stream {
                    self.report(host, Report::Sent(s, id, Ok(())));
                }
            }
        }
    }

    /// Serves end `k`'s posted receive from what has arrived.
    fn read(&mut self, k: EndKey) {
        loop {
            let partial = self.partial_io;
            let Some(e) = self.ends.get_mut(&k) else {
                return;
            };
            if e.state != EndState::Open || e.ended {
                return;
            }
            let Some(stream) = e.stream else {
                return;
            };
            let host = e.host;
            if self.hosts[host.0 as usize].deaf {
                return;
            }
            let Some(recv) = e.recv.as_mut() else {
                return;
            };
            if e.rx.is_empty() {
                if e.rx_fin {
                    e.ended = true;
                    e.recv = None;
                    self.report(host, Report::Ended(stream, EndReason::Eof));
                }
                return;
            }
            let want = match &recv.target {
                RecvTarget::Bytes { max } => (*max as usize).max(1),
                RecvTarget::Mem { len, .. } => (*len - recv.done) as usize,
            };
            let mut n = want.min(e.rx.len());
            if n > 1 && self.rng.chance(partial) {
                n = 1 + self.rng.below(n as u64 - 1) as usize;
            }
            let bytes: Vec<u8> = e.rx.drain(..n).collect();
            e.inbound = e.inbound.saturating_sub(n);
            self.stats.bytes_delivered += n as u64;
            let e = self.ends.get_mut(&k).expect("still here");
            let recv = e.recv.as_mut().expect("still posted");
            let report = match &recv.target {
                RecvTarget::Bytes { .. } => {
                    e.recv = None;
                    Report::Data(stream, bytes)
                }
                RecvTarget::Mem { mem, offset, len } => {
                    let at = *offset as usize + recv.done as usize;
                    mem.with(|m| {
                        let end = (at + n).min(m.len());
                        if at < end {
                            m[at..end].copy_from_slice(&bytes[..end - at]);
                        }
                    });
                    recv.done += n as u32;
                    if recv.done >= *len {
                        e.recv = None;
                    }
                    Report::Filled(stream, n as u32)
                }
            };
            self.report(host, report);
            // Room in the window: the peer's queued sends move on.
            if let Some(p) = self.ends.get(&k).and_then(|e| e.peer) {
                self.pump(p);
            }
        }
    }

    /// End `k` sent bytes to a peer end that no longer exists: a host that is up answers RST
    /// (it has no such connection: it restarted); one that is down says nothing, and the sender
    /// retransmits until its stack gives up.
    fn sent_to_nobody(&mut self, k: EndKey) {
        let Some(e) = self.ends.get(&k) else {
            return;
        };
        let remote_up = self
            .by_ip
            .get(e.remote.ip())
            .is_some_and(|h| self.host_up(*h));
        if remote_up {
            self.at(self.now + self.cfg.latency * 2, Due::Rst(k));
        } else {
            let after = give_up_after(&e.opts, self.cfg.retransmit_limit);
            self.at(self.now + after, Due::GiveUp(k));
        }
    }

    fn close_gracefully(&mut self, k: EndKey) {
        self.stats.graceful_closes += 1;
        let Some(e) = self.ends.get_mut(&k) else {
            return;
        };
        if let Some(i) = e.incoming.take() {
            self.by_incoming.remove(&(e.host, i));
        }
        e.state = EndState::Closing;
        e.recv = None;
        e.rx.clear();
        e.fin_after_tx = true;
        let peer_fin = e.rx_fin;
        self.pump(k);
        if peer_fin {
            // Both FINs: nothing left to wait for once ours is out.
            self.at(self.now + self.cfg.latency, Due::Reap(k));
        } else {
            // The driver's bound on reading to the peer's EOF.
            self.at(self.now + Duration::from_secs(2), Due::Reap(k));
        }
    }

    fn abort(&mut self, k: EndKey) {
        if let Some(e) = self.ends.remove(&k) {
            if let Some(i) = e.incoming {
                self.by_incoming.remove(&(e.host, i));
            }
            if let Some(p) = e.peer {
                let t = self.now + self.cfg.latency;
                self.at(t, Due::Rst(p));
            }
        }
    }

    fn hear_rst(&mut self, k: EndKey) {
        let Some(e) = self.ends.get_mut(&k) else {
            return;
        };
        if e.ended && e.state != EndState::Dialing {
            return;
        }
        self.stats.resets_heard += 1;
        e.peer = None;
        match e.state {
            EndState::Closing => {
                self.ends.remove(&k);
            }
            EndState::Dialing => {
                let k2 = k;
                self.at(self.now, Due::DialFails(k2, DialErrorKey::Refused));
            }
            EndState::Unadopted => {
                e.ended = true;
            }
            EndState::Open => self.end_with(k, EndReason::Reset),
        }
    }

    /// End `k` fails under its host: its sends are reported failed, then `Ended`.
    fn end_with(&mut self, k: EndKey, why: EndReason) {
        let Some(e) = self.ends.get_mut(&k) else {
            return;
        };
        if e.ended {
            return;
        }
        e.ended = true;
        e.recv = None;
        e.rx.clear();
        let host = e.host;
        let sends: Vec<SendId> = e.tx.drain(..).map(|s| s.id).collect();
        if let Some(s) = e.stream {
            for id in sends {
                self.report(host, Report::Sent(s, id, Err(why)));
            }
            self.report(host, Report::Ended(s, why));
        }
    }
}

/// How long a stack with these options retransmits to a silent peer: the user timeout, else the
/// retransmission limit, cut short by keepalive's probes if they end first.
fn give_up_after(opts: &SockOpts, retransmit_limit: Duration) -> Duration {
    let mut after = opts.user_timeout.unwrap_or(retransmit_limit);
    if let Some(k) = keepalive_after(opts) {
        after = after.min(k);
    }
    after
}

/// How long TCP keepalive takes to declare an idle peer dead (`None`: keepalive off).
fn keepalive_after(opts: &SockOpts) -> Option<Duration> {
    opts.keepalive.map(|(idle, intvl, cnt)| {
        Duration::from_secs(u64::from(idle) + u64::from(intvl) * u64::from(cnt))
    })
}

#[cfg(test)]
#[path = "streams_tests.rs"]
mod tests;
