//! [`LnetNode`]: the NIs, the send path with its credits, local delivery, the receive path and
//! the ping service.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use lnd::engine::Captured;
use lnd::engine::{DownReason, Endpoint, EndpointConfig, LndEvent, SendError, TxError};
use lnd::fabric::{FabricAction, FabricEvent, FabricSink};
use lnd::handle::{Handle, HandleSlab, Tag};
use lnd::time::{Duration, Instant};
use lnd::wheel::TimerWheel;
use lnd::wire::kib::MAX_INLINE;
use lnd::wire::lnet::{
    LNET_HDR_LEN, LNET_MTU, LNET_PID_LUSTRE, LNET_PING_MATCHBITS, LNET_RESERVED_PORTAL,
};
use lnd::wire::{LnetBody, LnetHdr, Nid, WireHandle};
use tracing::{debug, trace};

use crate::config::{NiConfig, NodeConfig};
use crate::error::LnetError;
use crate::peer::PeerNi;
use crate::ping::{self, PingReply, PING_SINK_LEN};
use crate::stats::{LnetStats, NiInfo, PeerInfo, PeerState};

/// Which of the node's NIs: the position in [`NodeConfig::nis`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NiIndex(pub usize);

/// Names a PUT from [`LnetNode::send_put`] until its [`LnetEvent::PutDone`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsgId(pub u64);

/// Names a ping from [`LnetNode::ping`] until its [`LnetEvent::PingDone`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PingId(pub u64);

/// What the node tells its user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LnetEvent {
    /// A PUT for us arrived (from a peer or from ourselves).
    Put {
        /// The originator (the header's `src_nid`).
        from: Nid,
        /// Which of our NIDs (or `0@lo`) it was addressed to.
        to: Nid,
        portal: u32,
        match_bits: u64,
        hdr_data: u64,
        payload: Vec<u8>,
    },
    /// A PUT is finished: handed to the peer's LND (o2iblnd completes a send when the peer's
    /// HCA has it) or delivered locally, or failed. Exactly once per [`MsgId`].
    PutDone {
        id: MsgId,
        result: Result<(), LnetError>,
    },
    /// A ping is finished: the reply, or why there is none. Exactly once per [`PingId`], at the
    /// latest at its timeout.
    PingDone {
        id: PingId,
        target: Nid,
        result: Result<PingReply, LnetError>,
    },
    /// An LND has a working connection to the peer (lnet_notify alive).
    PeerUp { ni: NiIndex, nid: Nid },
    /// An LND lost the peer (lnet_notify dead).
    PeerDown {
        ni: NiIndex,
        nid: Nid,
        reason: DownReason,
    },
}

/// Who waits for an outgoing message.
#[derive(Copy, Clone, Debug)]
enum Purpose {
    /// A user's PUT: report [`LnetEvent::PutDone`].
    Put(MsgId),
    /// A ping's GET: a failure fails the ping.
    PingGet(PingId),
    /// A REPLY or ACK we answer with: nobody waits.
    Response,
}

/// Where a message goes.
#[derive(Copy, Clone, Debug)]
enum Route {
    /// In memory; the source NID to put in the header (`0@lo` for `0@lo`, else the own NID).
    Local(Nid),
    /// Through this NI's LND.
    Remote(usize),
}

/// An outgoing message for an LND, from its creation until the LND finishes it.
struct OutMsg {
    peer: Nid,
    ni: usize,
    hdr: LnetHdr,
    /// Held while the message waits for credits; moved into the LND when sent.
    payload: Vec<u8>,
    len: usize,
    purpose: Purpose,
    /// Holds a peer tx credit (msg_peertxcredit).
    peer_credit: bool,
    /// Holds an NI tx credit (msg_txcredit).
    ni_credit: bool,
}

/// Outgoing messages by cookie: a slab, each cookie its key in the low 32 bits and the slot's
/// generation in the high 32, so a stale cookie (its slot since reused) finds nothing.
#[derive(Default)]
struct MsgTable {
    slots: HandleSlab<OutMsg, MsgTag>,
}

/// The tag of an outgoing message's handle (its cookie is the handle's `as_u64`).
#[derive(Debug)]
enum MsgTag {}

impl Tag for MsgTag {
    const NAME: &'static str = "msg";
}

impl MsgTable {
    fn insert(&mut self, m: OutMsg) -> u64 {
        self.slots.insert(m).as_u64()
    }

    fn get(&self, cookie: &u64) -> Option<&OutMsg> {
        self.slots.get(Handle::from_u64(*cookie))
    }

    fn get_mut(&mut self, cookie: &u64) -> Option<&mut OutMsg> {
        self.slots.get_mut(Handle::from_u64(*cookie))
    }

    fn remove(&mut self, cookie: &u64) -> Option<OutMsg> {
        self.slots.remove(Handle::from_u64(*cookie))
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn len(&self) -> usize {
        self.slots.len()
    }
}

/// A message delivered in memory.
struct LocalMsg {
    hdr: LnetHdr,
    payload: Vec<u8>,
    purpose: Purpose,
}

struct PendingPing {
    target: Nid,
    deadline: Instant,
}

/// One NI: its LND endpoint and its tx credits (the CPT tx queue's tq_credits; one CPT here).
struct Ni {
    nid: Nid,
    credits: u32,
    peer_credits: u32,
    ep: Endpoint,
    tx_credits: i64,
    min_tx_credits: i64,
    /// Messages holding a peer credit, waiting for an NI credit (tq_delayed).
    delayed: VecDeque<u64>,
    send_count: u64,
    recv_count: u64,
    drop_count: u64,
    /// `peer_timeout`: how long a peer NI reached through this NI may go without traffic
    /// before it is forgotten.
    peer_timeout: Duration,
    /// Most peer NIs kept for this NI (its LND's peer limit).
    peer_limit: usize,
    /// Peer NIs reached through this NI now.
    peers: usize,
}

/// An LNet node: its NIs and LNDs, peers and credits, ping service and counters. Sans-IO; see
/// the crate documentation for how to drive it.
pub struct LnetNode {
    pid: u32,
    /// Our half of every wire handle we hand out (Lustre's ln_interface_cookie): a REPLY naming
    /// another cookie is not for any ping of this instance.
    interface_cookie: u64,
    nis: Vec<Ni>,
    /// Every NID of the node (ours, and those of the node's other runtimes), in order.
    node_nids: Vec<Nid>,
    peers: BTreeMap<Nid, PeerNi>,
    /// When to look at a peer NI again for aging: one timer per peer NI, re-armed from its
    /// last traffic when it fires, so the cost follows what expires, not the table's size.
    peer_ages: TimerWheel<Nid>,
    /// Outgoing LND messages; a message's cookie is its slab key and a generation (see
    /// [`MsgTable`]), so finding it on the per-message path is an index, not a hash.
    msgs: MsgTable,
    /// Messages handed to the LND that it refused on the spot, finished in `process` (never
    /// recursively, however long the credit queues).
    refused: VecDeque<(u64, LnetError)>,
    local: VecDeque<LocalMsg>,
    pings: HashMap<u64, PendingPing>,
    ping_deadlines: BTreeSet<(Instant, u64)>,
    next_ping: u64,
    next_msg: u64,
    /// Our ping buffer, built once (the NI list never changes).
    ping_buffer: Vec<u8>,
    events: VecDeque<LnetEvent>,
    stats: LnetStats,
    now: Instant,
    shutting_down: bool,
}

impl LnetNode {
    /// Starts a node at `now`: one LND endpoint per NI, with the NI's tunables.
    pub fn new(cfg: NodeConfig, now: Instant) -> LnetNode {
        let nis: Vec<Ni> = cfg.nis.iter().map(|c| Ni::new(c, now)).collect();
        let interface_cookie = cfg
            .nis
            .iter()
            .fold(0x6c6e_6574_u64 ^ u64::from(cfg.pid), |acc, n| {
                acc.rotate_left(17) ^ n.incarnation
            });
        let own: Vec<Nid> = nis.iter().map(|n| n.nid).collect();
        let node_nids = if cfg.node_nids.is_empty() {
            own
        } else {
            cfg.node_nids.clone()
        };
        LnetNode {
            pid: cfg.pid,
            interface_cookie,
            ping_buffer: ping::ping_buffer(cfg.pid, &node_nids),
            node_nids,
            nis,
            peers: BTreeMap::new(),
            peer_ages: TimerWheel::new(now, Duration::from_millis(100)),
            msgs: MsgTable::default(),
            refused: VecDeque::new(),
            local: VecDeque::new(),
            pings: HashMap::new(),
            ping_deadlines: BTreeSet::new(),
            next_ping: 1,
            next_msg: 1,
            events: VecDeque::new(),
            stats: LnetStats::default(),
            now,
            shutting_down: false,
        }
    }

    // ------------------------------------------------------------------ upper layer

    /// Sends a PUT of `payload` to (`dst`, `portal`, `match_bits`), without an ACK. The outcome
    /// comes as [`LnetEvent::PutDone`]; an error here means nothing was sent and no event follows.
    pub fn send_put(
        &mut self,
        now: Instant,
        dst: Nid,
        portal: u32,
        match_bits: u64,
        payload: Vec<u8>,
    ) -> Result<MsgId, LnetError> {
        self.advance(now);
        let route = self.route_checked(dst, payload.len())?;
        let id = MsgId(self.next_msg);
        self.next_msg += 1;
        let hdr = LnetHdr {
            dest_nid: dst,
            src_nid: self.src_nid(route),
            dest_pid: LNET_PID_LUSTRE,
            src_pid: self.pid,
            payload_length: payload.len() as u32,
            body: LnetBody::Put {
                ack_wmd: WireHandle::NONE,
                match_bits,
                hdr_data: 0,
                ptl_index: portal,
                offset: 0,
            },
        };
        self.launch(route, dst, hdr, payload, Purpose::Put(id));
        self.process(now);
        Ok(id)
    }

    /// Pings `dst`: a GET on portal 0 with the ping match bits (api-ni.c, lnet_ping). The outcome
    /// comes as [`LnetEvent::PingDone`], at the latest `timeout` from now. A ping of `0@lo` or of
    /// one of our own NIDs is answered in memory, within this call.
    pub fn ping(&mut self, now: Instant, dst: Nid, timeout: Duration) -> Result<PingId, LnetError> {
        self.advance(now);
        let route = self.route_checked(dst, 0)?;
        let id = self.next_ping;
        self.next_ping += 1;
        let deadline = now.saturating_add(timeout);
        self.pings.insert(
            id,
            PendingPing {
                target: dst,
                deadline,
            },
        );
        self.ping_deadlines.insert((deadline, id));
        let hdr = LnetHdr {
            dest_nid: dst,
            src_nid: self.src_nid(route),
            dest_pid: LNET_PID_LUSTRE,
            src_pid: self.pid,
            payload_length: 0,
            body: LnetBody::Get {
                return_wmd: WireHandle {
                    interface_cookie: self.interface_cookie,
                    object_cookie: id,
                },
                match_bits: LNET_PING_MATCHBITS,
                ptl_index: LNET_RESERVED_PORTAL,
                src_offset: 0,
                sink_length: PING_SINK_LEN,
            },
        };
        self.launch(route, dst, hdr, Vec::new(), Purpose::PingGet(PingId(id)));
        self.process(now);
        Ok(PingId(id))
    }

    /// Stops every LND gracefully; new sends are refused. Queued messages fail as the LNDs give
    /// them back. Keep driving the node until [`LnetNode::is_shut_down`].
    pub fn shutdown(&mut self, now: Instant) {
        self.advance(now);
        self.shutting_down = true;
        for ni in &mut self.nis {
            ni.ep.shutdown(now);
        }
        self.process(now);
    }

    /// True once shutdown was asked, every LND closed its connections and no message is left.
    pub fn is_shut_down(&self) -> bool {
        self.shutting_down
            && self.nis.iter().all(|n| n.ep.is_shut_down())
            && self.msgs.is_empty()
            && self.local.is_empty()
    }

    // ------------------------------------------------------------------ driver

    /// Feeds one fabric event to NI `ni`'s endpoint, then processes what it produced.
    pub fn handle_fabric(&mut self, now: Instant, ni: NiIndex, ev: FabricEvent<'_>) {
        self.advance(now);
        if let Some(n) = self.nis.get_mut(ni.0) {
            n.ep.fabric_event(now, ev);
        }
        self.process(now);
    }

    /// NI `ni` as its driver's [`FabricSink`]: what the driver reports goes to that NI's LND
    /// endpoint, and nothing else of the endpoint is reachable through it. Call
    /// [`LnetNode::process`] after the driver's poll.
    pub fn fabric_sink(&mut self, ni: NiIndex) -> Option<NiSink<'_>> {
        self.nis.get_mut(ni.0).map(|n| NiSink { ep: &mut n.ep })
    }

    /// Runs the timers due at `now`: the LNDs' and the pings' (a ping past its deadline fails
    /// with [`LnetError::Timeout`]).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        for ni in &mut self.nis {
            ni.ep.handle_timeout(now);
        }
        while let Some((_, nid)) = self.peer_ages.poll(now) {
            self.age_peer(nid);
        }
        while let Some(&(at, id)) = self.ping_deadlines.first() {
            if at > now {
                break;
            }
            self.ping_deadlines.remove(&(at, id));
            if let Some(p) = self.pings.remove(&id) {
                debug!(target = %p.target, "ping timed out");
                self.count_error(&LnetError::Timeout);
                self.events.push_back(LnetEvent::PingDone {
                    id: PingId(id),
                    target: p.target,
                    result: Err(LnetError::Timeout),
                });
            }
        }
        self.process(now);
    }

    /// Drains every endpoint's events into LNet and delivers local messages, until nothing is
    /// left. Call it after a driver fed an NI through [`LnetNode::fabric_sink`];
    /// every other input calls it itself.
    pub fn process(&mut self, now: Instant) {
        self.advance(now);
        loop {
            let mut progressed = false;
            while let Some((cookie, err)) = self.refused.pop_front() {
                progressed = true;
                self.finish_out(cookie, Err(err));
            }
            for i in 0..self.nis.len() {
                while let Some(ev) = self.nis[i].ep.poll_event() {
                    progressed = true;
                    self.on_lnd_event(i, ev);
                }
            }
            while let Some(m) = self.local.pop_front() {
                progressed = true;
                self.deliver_local(m);
            }
            if !progressed {
                break;
            }
        }
    }

    /// The next fabric action of any NI, with the NI it is for.
    pub fn poll_action(&mut self) -> Option<(NiIndex, FabricAction)> {
        self.nis
            .iter_mut()
            .enumerate()
            .find_map(|(i, n)| n.ep.poll_action().map(|a| (NiIndex(i), a)))
    }

    /// The next event for the user.
    pub fn poll_event(&mut self) -> Option<LnetEvent> {
        self.events.pop_front()
    }

    /// When [`LnetNode::handle_timeout`] should next be called: the earliest LND timer or ping
    /// deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let lnd = self.nis.iter().filter_map(|n| n.ep.poll_timeout()).min();
        let ping = self.ping_deadlines.first().map(|&(t, _)| t);
        let aging = self.peer_ages.next_deadline();
        [lnd, ping, aging].into_iter().flatten().min()
    }

    /// NI `ni`'s LND endpoint (read-only: stats, peers, connections).
    pub fn endpoint(&self, ni: NiIndex) -> Option<&Endpoint> {
        self.nis.get(ni.0).map(|n| &n.ep)
    }

    /// Starts (`true`) or stops recording every kib message NI `ni` sends and receives
    /// (`lnetctl capture`); records not drained are dropped when it stops.
    pub fn set_capture(&mut self, ni: NiIndex, on: bool) {
        if let Some(n) = self.nis.get_mut(ni.0) {
            n.ep.set_capture(on);
        }
    }

    /// NI `ni`'s endpoint, for unit tests that play a misbehaving sender below LNet.
    #[cfg(test)]
    pub(crate) fn endpoint_mut(&mut self, ni: NiIndex) -> Option<&mut Endpoint> {
        self.nis.get_mut(ni.0).map(|n| &mut n.ep)
    }

    /// The next message NI `ni` recorded, oldest first.
    pub fn poll_captured(&mut self, ni: NiIndex) -> Option<Captured> {
        self.nis.get_mut(ni.0)?.ep.poll_captured()
    }

    // ------------------------------------------------------------------ views

    /// Our PID.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Gives a message buffer back (a `Put` event's payload once consumed) so that the next
    /// receive or send reuses it instead of allocating.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if let Some(ni) = self.nis.first_mut() {
            ni.ep.recycle(buf);
        }
    }

    /// An empty buffer for a payload, from the LND's pool when it has one.
    pub fn take_buffer(&mut self) -> Vec<u8> {
        self.nis
            .first_mut()
            .map_or_else(Vec::new, |ni| ni.ep.take_buffer())
    }

    /// Our NIDs, in NI order.
    pub fn nids(&self) -> Vec<Nid> {
        self.nis.iter().map(|n| n.nid).collect()
    }

    /// Every NID of the node, this runtime's and its siblings' (see `NodeConfig::node_nids`).
    pub fn node_nids(&self) -> &[Nid] {
        &self.node_nids
    }

    /// Node-wide counters (`lnetctl stats show`).
    pub fn stats(&self) -> &LnetStats {
        &self.stats
    }

    /// Every peer NI we sent to or heard from, by NID (`lnetctl peer show`).
    pub fn peers(&self) -> Vec<PeerInfo> {
        self.peers.values().map(PeerNi::info).collect()
    }

    /// One peer NI.
    pub fn peer(&self, nid: Nid) -> Option<PeerInfo> {
        self.peers.get(&nid).map(PeerNi::info)
    }

    /// Every local NI (`lnetctl net show -v`).
    pub fn nets(&self) -> Vec<NiInfo> {
        self.nis
            .iter()
            .enumerate()
            .map(|(i, n)| NiInfo {
                index: NiIndex(i),
                nid: n.nid,
                status: "up",
                credits: n.credits,
                peer_credits: n.peer_credits,
                available_tx_credits: n.tx_credits,
                min_tx_credits: n.min_tx_credits,
                send_count: n.send_count,
                recv_count: n.recv_count,
                drop_count: n.drop_count,
                lnd_tunables: n.ep.config().tunables.clone(),
                lnd_stats: n.ep.stats().clone(),
                lnd_config: n.ep.config().clone(),
                lnd_peers: n.ep.peer_count(),
            })
            .collect()
    }

    /// Peer NIs in the table now.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Pings still waiting for a reply.
    pub fn pending_pings(&self) -> usize {
        self.pings.len()
    }

    /// Messages LNet still holds (waiting for credits, in an LND, or queued for local delivery).
    pub fn messages_in_flight(&self) -> usize {
        self.msgs.len() + self.local.len()
    }

    // ------------------------------------------------------------------ send path

    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    fn is_own(&self, nid: Nid) -> bool {
        self.node_nids.contains(&nid)
    }

    /// Route selection for this slice: ourselves in memory, else the first NI on `dst`'s net.
    fn route(&self, dst: Nid) -> Result<Route, LnetError> {
        if dst == Nid::LO_0 || self.is_own(dst) {
            return Ok(Route::Local(dst));
        }
        self.nis
            .iter()
            .position(|n| n.nid.net() == dst.net())
            .map(Route::Remote)
            .ok_or(LnetError::NoRoute(dst))
    }

    /// Routes a new user message and checks what the path can carry; a refusal is counted.
    fn route_checked(&mut self, dst: Nid, len: usize) -> Result<Route, LnetError> {
        let checked = if self.shutting_down {
            Err(LnetError::Shutdown)
        } else {
            self.route(dst).and_then(|r| {
                let max = match r {
                    Route::Local(_) => LNET_MTU as usize,
                    Route::Remote(_) => MAX_INLINE,
                };
                if len > max {
                    Err(LnetError::PayloadTooLarge { len, max })
                } else {
                    Ok(r)
                }
            })
        };
        if let Err(e) = &checked {
            self.count_error(e);
        }
        checked
    }

    fn src_nid(&self, route: Route) -> Nid {
        match route {
            Route::Local(src) => src,
            Route::Remote(ni) => self.nis[ni].nid,
        }
    }

    fn alloc_msg(&mut self) {
        self.stats.msgs_alloc += 1;
        self.stats.msgs_max = self.stats.msgs_max.max(self.stats.msgs_alloc);
    }

    fn free_msg(&mut self) {
        self.stats.msgs_alloc = self.stats.msgs_alloc.saturating_sub(1);
    }

    /// The peer NI's entry, made if it is new; `None` when it is new and its NI's share of the
    /// table is full (counted). Every use marks it active.
    fn peer_entry(&mut self, nid: Nid, ni: usize) -> Option<&mut PeerNi> {
        let now = self.now;
        if !self.peers.contains_key(&nid) {
            let n = &mut self.nis[ni];
            if n.peers >= n.peer_limit {
                self.stats.peer_table_full += 1;
                return None;
            }
            n.peers += 1;
            let mut p = PeerNi::new(nid, NiIndex(ni), n.peer_credits, now);
            // A peer forgotten while its connection stayed up learns its state from the LND.
            if n.ep.peer(nid).is_some_and(|v| v.up) {
                p.state = PeerState::Up;
            }
            self.peer_ages.insert(now + n.peer_timeout, nid);
            self.peers.insert(nid, p);
        }
        let p = self.peers.get_mut(&nid)?;
        p.last_active = now;
        Some(p)
    }

    /// A peer NI's aging timer fired: forget it if it has been quiet for peer_timeout and holds
    /// nothing, else look again when it could next be.
    fn age_peer(&mut self, nid: Nid) {
        let Some(p) = self.peers.get(&nid) else {
            return;
        };
        let ni = p.ni.0;
        let timeout = self.nis[ni].peer_timeout;
        let due = p.last_active + timeout;
        if self.now >= due && p.is_idle() {
            self.peers.remove(&nid);
            self.nis[ni].peers = self.nis[ni].peers.saturating_sub(1);
            self.stats.peers_aged += 1;
            trace!(peer = %nid, "peer aged out");
            return;
        }
        let next = if self.now >= due {
            self.now + timeout
        } else {
            due
        };
        self.peer_ages.insert(next, nid);
    }

    fn launch(&mut self, route: Route, dst: Nid, hdr: LnetHdr, payload: Vec<u8>, purpose: Purpose) {
        self.alloc_msg();
        match route {
            Route::Local(_) => self.local.push_back(LocalMsg {
                hdr,
                payload,
                purpose,
            }),
            Route::Remote(ni) => {
                let known = self.peer_entry(dst, ni).is_some();
                let cookie = self.msgs.insert(OutMsg {
                    peer: dst,
                    ni,
                    hdr,
                    len: payload.len(),
                    payload,
                    purpose,
                    peer_credit: false,
                    ni_credit: false,
                });
                if known {
                    self.post_send(cookie);
                } else {
                    // Finished in `process` with a status, holding no credit.
                    let e = LnetError::Refused(SendError::PeerTableFull(dst));
                    self.refused.push_back((cookie, e));
                }
            }
        }
    }

    /// Takes the credits a message still lacks, peer first, then NI (lnet_post_send_locked); a
    /// counter that goes negative parks the message. With both, the message goes to the LND.
    fn post_send(&mut self, cookie: u64) {
        let Some(m) = self.msgs.get_mut(&cookie) else {
            return;
        };
        let (peer_nid, ni, len) = (m.peer, m.ni, m.len);
        if !m.peer_credit {
            m.peer_credit = true;
            let Some(p) = self.peers.get_mut(&peer_nid) else {
                return;
            };
            p.tx_credits -= 1;
            p.min_tx_credits = p.min_tx_credits.min(p.tx_credits);
            if p.tx_credits < 0 {
                p.txq.push_back(cookie);
                p.txqnob += (len + LNET_HDR_LEN) as u64;
                trace!(peer = %peer_nid, credits = p.tx_credits, "waiting for a peer credit");
                return;
            }
        }
        if !m.ni_credit {
            m.ni_credit = true;
            let n = &mut self.nis[ni];
            n.tx_credits -= 1;
            n.min_tx_credits = n.min_tx_credits.min(n.tx_credits);
            if n.tx_credits < 0 {
                n.delayed.push_back(cookie);
                trace!(ni = %n.nid, credits = n.tx_credits, "waiting for an NI credit");
                return;
            }
        }
        let payload = std::mem::take(&mut m.payload);
        let hdr = m.hdr;
        let now = self.now;
        match self.nis[ni].ep.send(now, peer_nid, hdr, payload, cookie) {
            Ok(()) => {
                self.stats.send_count += 1;
                self.stats.send_length += len as u64;
                self.nis[ni].send_count += 1;
                if let Some(p) = self.peers.get_mut(&peer_nid) {
                    p.send_count += 1;
                }
            }
            Err(e) => self.refused.push_back((cookie, LnetError::Refused(e))),
        }
    }

    /// The LND is done with a message: return its credits, count, and tell whoever waits.
    fn finish_out(&mut self, cookie: u64, result: Result<(), LnetError>) {
        let Some(m) = self.msgs.remove(&cookie) else {
            debug!(cookie, "completion for an unknown message");
            return;
        };
        self.free_msg();
        self.return_credits(&m);
        if let Err(e) = &result {
            self.count_error(e);
            self.nis[m.ni].drop_count += 1;
            if let Some(p) = self.peers.get_mut(&m.peer) {
                p.drop_count += 1;
            }
        }
        match m.purpose {
            Purpose::Put(id) => self.events.push_back(LnetEvent::PutDone { id, result }),
            Purpose::PingGet(PingId(id)) => {
                if let Err(e) = result {
                    // The GET never made it: fail the ping now rather than at its timeout.
                    self.complete_ping(id, Err(e));
                }
            }
            Purpose::Response => {}
        }
    }

    /// lnet_return_tx_credits_locked: give back the NI credit, then the peer credit; a counter
    /// still at or below zero after the return means someone waits, and the oldest goes now.
    fn return_credits(&mut self, m: &OutMsg) {
        if m.ni_credit {
            let n = &mut self.nis[m.ni];
            n.tx_credits += 1;
            if n.tx_credits <= 0 {
                if let Some(next) = n.delayed.pop_front() {
                    self.post_send(next);
                }
            }
        }
        if m.peer_credit {
            let Some(p) = self.peers.get_mut(&m.peer) else {
                return;
            };
            p.tx_credits += 1;
            if p.tx_credits <= 0 {
                if let Some(next) = p.txq.pop_front() {
                    let len = self.msgs.get(&next).map_or(0, |n| n.len);
                    p.txqnob = p.txqnob.saturating_sub((len + LNET_HDR_LEN) as u64);
                    self.post_send(next);
                }
            }
        }
    }

    fn count_error(&mut self, e: &LnetError) {
        let s = &mut self.stats;
        s.errors += 1;
        match e {
            LnetError::NoRoute(_) => s.local_no_route_count += 1,
            LnetError::Timeout => s.response_timeout_count += 1,
            LnetError::Lnd(TxError::Timeout) => s.local_timeout_count += 1,
            LnetError::Lnd(TxError::ConnAborted | TxError::Shutdown) | LnetError::Shutdown => {
                s.local_aborted_count += 1
            }
            LnetError::Lnd(TxError::ConnectFailed) | LnetError::Refused(_) => {
                s.local_error_count += 1
            }
            LnetError::Lnd(TxError::PeerUnreachable) => s.network_timeout_count += 1,
            LnetError::PayloadTooLarge { .. } | LnetError::BadReply(_) => {}
        }
    }

    // ------------------------------------------------------------------ receive path

    fn on_lnd_event(&mut self, ni: usize, ev: LndEvent) {
        let now = self.now;
        match ev {
            LndEvent::Received {
                from,
                hdr,
                payload,
                rx,
            } => {
                // The contract: hand every received message back exactly once. Nothing here
                // delays a message, so its slot and credit go back at once.
                self.nis[ni].ep.recv_done(now, rx);
                if let Some(p) = self.peer_entry(from, ni) {
                    p.recv_count += 1;
                }
                self.parse(Some(ni), from, hdr, payload);
            }
            LndEvent::SendDone { cookie, result, .. } => {
                self.finish_out(cookie, result.map_err(LnetError::Lnd));
            }
            LndEvent::PeerUp { nid } => {
                if let Some(p) = self.peer_entry(nid, ni) {
                    p.state = PeerState::Up;
                }
                self.events.push_back(LnetEvent::PeerUp {
                    ni: NiIndex(ni),
                    nid,
                });
            }
            LndEvent::PeerDown { nid, reason } => {
                if let Some(p) = self.peer_entry(nid, ni) {
                    p.state = PeerState::Down;
                }
                self.events.push_back(LnetEvent::PeerDown {
                    ni: NiIndex(ni),
                    nid,
                    reason,
                });
            }
        }
    }

    /// A message short-circuited in memory: sent and received at once, no credits (as Lustre's
    /// loopback LND: "no send credit hassles").
    fn deliver_local(&mut self, m: LocalMsg) {
        let len = m.payload.len() as u64;
        self.stats.send_count += 1;
        self.stats.send_length += len;
        self.stats.loopback_count += 1;
        self.stats.loopback_length += len;
        let from = m.hdr.src_nid;
        self.parse(None, from, m.hdr, m.payload);
        self.free_msg();
        if let Purpose::Put(id) = m.purpose {
            self.events
                .push_back(LnetEvent::PutDone { id, result: Ok(()) });
        }
    }

    /// lnet_parse and the matching that follows, for one message (from the LND of NI `via`, or
    /// local when `None`).
    fn parse(&mut self, via: Option<usize>, from: Nid, hdr: LnetHdr, mut payload: Vec<u8>) {
        self.alloc_msg();
        let for_me = self.is_own(hdr.dest_nid) || (via.is_none() && hdr.dest_nid == Nid::LO_0);
        let announced = hdr.payload_length as usize;
        let verdict = if !for_me {
            // Not ours, and no forwarding in this slice.
            Err("not addressed to us")
        } else if payload.len() < announced {
            Err("payload shorter than its header says")
        } else {
            payload.truncate(announced);
            Ok(())
        };
        let verdict = verdict.and_then(|()| self.match_msg(&hdr, payload));
        match verdict {
            Ok(len) => {
                self.stats.recv_count += 1;
                self.stats.recv_length += len as u64;
                if let Some(ni) = via {
                    self.nis[ni].recv_count += 1;
                }
            }
            Err(why) => {
                debug!(%from, dest = %hdr.dest_nid, kind = ?hdr.msg_type(), why, "dropping a message");
                self.stats.drop_count += 1;
                self.stats.drop_length += u64::from(hdr.payload_length);
                if let Some(ni) = via {
                    self.nis[ni].drop_count += 1;
                    if let Some(p) = self.peers.get_mut(&from) {
                        p.drop_count += 1;
                    }
                }
            }
        }
        self.free_msg();
    }

    /// Delivers a message addressed to us; returns its length, or why it was dropped.
    fn match_msg(&mut self, hdr: &LnetHdr, payload: Vec<u8>) -> Result<usize, &'static str> {
        let len = payload.len();
        match hdr.body {
            LnetBody::Put {
                ptl_index: LNET_RESERVED_PORTAL,
                ..
            } => Err("PUT on the reserved portal (discovery push is not supported)"),
            LnetBody::Put {
                ack_wmd,
                match_bits,
                hdr_data,
                ptl_index,
                ..
            } => {
                self.events.push_back(LnetEvent::Put {
                    from: hdr.src_nid,
                    to: hdr.dest_nid,
                    portal: ptl_index,
                    match_bits,
                    hdr_data,
                    payload,
                });
                if ack_wmd != WireHandle::NONE {
                    // lnet_parse_put then lnet_ack: the sender asked for an ACK.
                    self.respond(
                        hdr,
                        0,
                        LnetBody::Ack {
                            dst_wmd: ack_wmd,
                            match_bits,
                            mlength: len as u32,
                        },
                        Vec::new(),
                    );
                }
                Ok(len)
            }
            LnetBody::Get {
                return_wmd,
                match_bits: LNET_PING_MATCHBITS,
                ptl_index: LNET_RESERVED_PORTAL,
                sink_length,
                ..
            } => {
                // The ping service: answer from the ping buffer, cut to the requester's sink
                // (the ping target MD truncates).
                let n = self.ping_buffer.len().min(sink_length as usize);
                let reply = self.ping_buffer[..n].to_vec();
                self.respond(
                    hdr,
                    n as u32,
                    LnetBody::Reply {
                        dst_wmd: return_wmd,
                    },
                    reply,
                );
                Ok(0)
            }
            LnetBody::Get { .. } => Err("GET matched nothing"),
            LnetBody::Reply { dst_wmd } => {
                if dst_wmd.interface_cookie != self.interface_cookie {
                    return Err("REPLY for another instance");
                }
                let id = dst_wmd.object_cookie;
                let Some(target) = self.pings.get(&id).map(|p| p.target) else {
                    return Err("REPLY for no pending ping (late or unknown)");
                };
                let result = ping::parse_reply(target, &payload).map_err(LnetError::BadReply);
                if let Err(e) = &result {
                    self.count_error(e);
                }
                self.complete_ping(id, result);
                Ok(len)
            }
            LnetBody::Ack { .. } => Err("ACK, but we never ask for one"),
            LnetBody::Hello { .. } => Err("HELLO (only byte-stream LNDs use it)"),
        }
    }

    /// Sends a REPLY or ACK back to the originator of `req`, from the NID it addressed.
    fn respond(&mut self, req: &LnetHdr, len: u32, body: LnetBody, payload: Vec<u8>) {
        let dst = req.src_nid;
        let route = match self.route(dst) {
            Ok(r) => r,
            Err(e) => {
                self.count_error(&e);
                return;
            }
        };
        let src = match route {
            Route::Local(_) => req.dest_nid,
            Route::Remote(ni) => self.nis[ni].nid,
        };
        let hdr = LnetHdr {
            dest_nid: dst,
            src_nid: src,
            dest_pid: req.src_pid,
            src_pid: self.pid,
            payload_length: len,
            body,
        };
        self.launch(route, dst, hdr, payload, Purpose::Response);
    }

    fn complete_ping(&mut self, id: u64, result: Result<PingReply, LnetError>) {
        if let Some(p) = self.pings.remove(&id) {
            self.ping_deadlines.remove(&(p.deadline, id));
            self.events.push_back(LnetEvent::PingDone {
                id: PingId(id),
                target: p.target,
                result,
            });
        }
    }
}

impl Ni {
    fn new(c: &NiConfig, now: Instant) -> Ni {
        let (credits, peer_credits) = c.effective_credits();
        let mut ecfg = EndpointConfig::new(c.nid, c.incarnation);
        ecfg.tunables = c.tunables.clone();
        ecfg.race_order = c.race_order;
        ecfg.checksum = c.checksum;
        ecfg.peer_limit = c.peer_limit;
        Ni {
            nid: c.nid,
            credits,
            peer_credits,
            ep: Endpoint::new(ecfg, now),
            tx_credits: i64::from(credits),
            min_tx_credits: i64::from(credits),
            delayed: VecDeque::new(),
            send_count: 0,
            recv_count: 0,
            drop_count: 0,
            peer_timeout: c.peer_timeout,
            peer_limit: c.peer_limit,
            peers: 0,
        }
    }
}

/// One NI of an [`LnetNode`] as its driver sees it: a [`FabricSink`] and nothing more.
pub struct NiSink<'a> {
    ep: &'a mut Endpoint,
}

impl FabricSink for NiSink<'_> {
    fn fabric_event(&mut self, now: Instant, ev: FabricEvent<'_>) {
        self.ep.fabric_event(now, ev);
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        self.ep.recycle(buf);
    }
}

#[cfg(test)]
mod msg_table_tests {
    use super::*;

    fn msg(len: usize) -> OutMsg {
        let a: Nid = "10.0.0.1@o2ib".parse().unwrap();
        OutMsg {
            peer: a,
            ni: 0,
            hdr: LnetHdr::put(a, a, len as u32, 4, 0),
            payload: vec![0; len],
            len,
            purpose: Purpose::Response,
            peer_credit: false,
            ni_credit: false,
        }
    }

    /// A cookie whose slot was freed and reused finds nothing: a late completion for a finished
    /// message cannot finish (and return the credits of) the message now in its slot.
    #[test]
    fn stale_cookie_finds_nothing_after_its_slot_is_reused() {
        let mut t = MsgTable::default();
        let old = t.insert(msg(1));
        assert_eq!(t.get(&old).map(|m| m.len), Some(1));
        assert_eq!(t.remove(&old).map(|m| m.len), Some(1));
        let new = t.insert(msg(2));
        assert_eq!(new & 0xffff_ffff, old & 0xffff_ffff, "the slot is reused");
        assert_ne!(new, old);
        assert!(t.get(&old).is_none());
        assert!(t.get_mut(&old).is_none());
        assert!(t.remove(&old).is_none());
        assert_eq!(t.len(), 1, "a stale remove must not free the live message");
        assert_eq!(t.remove(&new).map(|m| m.len), Some(2));
        assert!(t.is_empty());
        assert!(t.remove(&u64::MAX).is_none());
    }
}
