//! [`LnetNode`]: the NIs, the send path with its credits, local delivery, the receive path and
//! the ping service.

use crate::health::{HStatus, MAX_HEALTH};
use std::collections::{BTreeMap, HashMap, VecDeque};

use lnd::handle::{Handle, HandleSlab, Tag};
use lnd::iface::{BulkSend, DownReason, Lnd, LndEvent, RxToken, SendError, TxError};
use lnd::time::{Duration, Instant};
use lnd::trim::{Capacity, CapacityReport, Trim, TRIM_FLOOR, TRIM_FLOOR_SMALL, TRIM_INTERVAL};
use lnd::wire::lnet::{
    LNET_HDR_LEN, LNET_MTU, LNET_PID_LUSTRE, LNET_PING_MATCHBITS, LNET_RESERVED_PORTAL,
};
use lnd::wire::{LnetBody, LnetHdr, Net, Nid, WireHandle};
use tracing::{debug, trace, warn};

use crate::alive::{self, NetAlive};
use crate::config::{NiConfig, NodeConfig};
use crate::error::LnetError;
use crate::forward::{
    ForwardStats, FwdDrop, FwdKey, Handover, PoolClass, PoolInfo, Pools, RoutingInfo,
};
use crate::gateway::{GatewayInfo, Gateways};
use crate::ids::{MdId, MsgId, NiIndex, PingId};
use crate::peer::PeerNi;
use crate::ping::{self, PingReply, PING_SINK_LEN};
use crate::routes::{GatewayState, RouteConfig, RouteTable};
use crate::stats::{LnetStats, NiInfo, PeerInfo, PeerState};

mod bulk;
mod bulk_state;
mod forwarding;
mod fwd_state;
mod paths;
mod peers;
mod pings;
mod recovery;
mod timers;
use crate::alive::NetLiveness;
use crate::health::{HealthCfg, Recovery};
use bulk_state::Mds;
pub use bulk_state::{BulkBuf, SCRUB_BUDGET};
use fwd_state::{Arrival, Forwarder};
use paths::Paths;
use pings::{PendingPing, PingKind, Pings};
use timers::{NodeTimer, TimerTable};

/// Messages waiting for credits to one peer beyond which a REPLY or ACK to it is not queued
/// (`LnetError::Backlog`). Far above what a well-behaved peer leaves queued (its own window of
/// requests), and it bounds what a peer that asks without returning credits (or floods pings
/// under someone else's NID) can make us hold: the hostile-peer audit grew a daemon to 1 GB
/// in 10 s with unanswered ping replies. Kernel LNet has no such bound.
pub const RESPONSE_BACKLOG: usize = 4096;

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
    /// A GET from [`LnetNode::send_get_bulk`] is finished: the bytes written into its buffer, or
    /// why none were. Exactly once per [`MsgId`].
    GetDone {
        id: MsgId,
        result: Result<u32, LnetError>,
    },
    /// A PUT landed in the sink posted as `md` ([`LnetNode::post_sink`]): the bytes written
    /// there, or why the transfer failed. Exactly once per matched MD.
    BulkPut {
        md: MdId,
        from: Nid,
        match_bits: u64,
        hdr_data: u64,
        result: Result<u32, LnetError>,
    },
    /// A PUT small enough to travel inline (IMMEDIATE: a kernel o2iblnd sends PUTs under its
    /// message size so, ksocklnd every PUT) matched the sink posted as `md`: instead of a
    /// [`LnetEvent::BulkPut`], its bytes, already cut to the MD's length (LNet's truncation).
    /// The node never writes registered memory (the fabric does): the user copies `payload`
    /// into the MD's buffer, and the transfer is then done with `payload.len()` bytes.
    BulkPutInline {
        md: MdId,
        from: Nid,
        match_bits: u64,
        hdr_data: u64,
        payload: Vec<u8>,
    },
    /// The REPLY of a routed GET from [`LnetNode::send_get_bulk`] came inline (a kernel peer
    /// answers small GETs so): instead of a [`LnetEvent::GetDone`], its bytes, cut to the
    /// GET's buffer, for the user to copy there; the GET is then done with `payload.len()`.
    GetDoneInline { id: MsgId, payload: Vec<u8> },
    /// A GET read the source posted as `md` ([`LnetNode::post_source`]): the bytes written
    /// into the requester's sink, or why not. Exactly once per matched MD.
    BulkGetServed {
        md: MdId,
        to: Nid,
        result: Result<u32, LnetError>,
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
    /// A user's GET into registered memory: report [`LnetEvent::GetDone`].
    GetBulk(MsgId),
    /// A user's routed GET into registered memory, the GET itself: its failure fails the GET
    /// (its REPLY, by rendezvous, is `GetBulk`).
    GetRouted(u64),
    /// A peer's IMMEDIATE GET answered by a REPLY from a posted source (counted as sent by
    /// `post_send`): report [`LnetEvent::BulkGetServed`].
    ServeReply(MdId),
    /// A peer's PUT being written into a posted sink: report [`LnetEvent::BulkPut`], and ACK it
    /// if the sender asked.
    SinkPut {
        md: MdId,
        match_bits: u64,
        hdr_data: u64,
        ack: WireHandle,
    },
    /// A peer's GET being answered from a posted source: report [`LnetEvent::BulkGetServed`].
    ServeGet(MdId),
    /// A bulk PUT for another node being written into a router buffer: forward it once in.
    ForwardIn(FwdKey),
    /// A ping's GET: a failure fails the ping.
    PingGet(PingId),
    /// A REPLY or ACK we answer with: nobody waits.
    Response,
    /// A message forwarded for another node: held as `key` by the runtime whose NI is
    /// `origin` (this node, or a sibling runtime that handed it over); `leg` is the routes it
    /// may take if it has to move to another gateway.
    Forward { origin: Nid, key: FwdKey, leg: Leg },
    /// The router pinger's GET to a gateway: its failure marks the gateway dead.
    GatewayPing(PingId),
}

/// Which routes a message may take: any, or, for a message to forward that has already
/// crossed a router, only to a last-hop gateway (the hop rule, [`Leg::of`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Leg {
    Any,
    Last,
}

impl Leg {
    /// The leg a message to forward, from `src` and handed to us by the peer `from`, may take
    /// (the hop rule). LNet carries no hop count and Lustre has no defence against a routing
    /// loop: three routers that each route a net through the next with `hop: 2` (multi-hop
    /// routes, which avoid_asym_router_failure does not look at) pass one message around for
    /// good. The source NID is set by the originator and kept by every router (lib-msg.c), and
    /// an originator sends from that NI itself, so a message that a peer other than its source
    /// handed us has already crossed a router. Such a message goes on only to its
    /// destination's net, or through a gateway with an NI on that net
    /// ([`Gateways::is_last_hop`]), which then delivers it directly; when only other routes
    /// remain it is dropped, counted as a loop ([`LnetError::HopLimit`]). So no message
    /// crosses more than three routers, whatever the routes say; a path of four or more is
    /// not supported.
    fn of(src: Nid, from: Nid) -> Leg {
        if src == from {
            Leg::Any
        } else {
            Leg::Last
        }
    }
}

/// Where a message goes.
#[derive(Copy, Clone, Debug)]
enum Route {
    /// In memory; the source NID to put in the header (`0@lo` for `0@lo`, else the own NID).
    Local(Nid),
    /// Through NI `ni`'s LND to `next`: the destination itself, or the gateway towards it.
    Remote { ni: usize, next: Nid },
    /// Through a sibling runtime's NI on this net (the daemon runs one runtime per NI).
    Sibling(Net),
    /// To this NID of the node that a sibling runtime runs: delivered in memory by that
    /// runtime (a [`Handover::Local`]), so that what is addressed to that NI reaches its
    /// users (its selftest), as a forward reaches its egress.
    SiblingNi,
}

impl OutMsg {
    /// A REPLY or ACK of ours (not one forwarded for another node): what
    /// [`RESPONSE_BACKLOG`] bounds per peer.
    fn is_own_answer(&self) -> bool {
        matches!(
            self.hdr.msg_type(),
            lnd::wire::LnetMsgType::Reply | lnd::wire::LnetMsgType::Ack
        ) && !matches!(self.purpose, Purpose::Forward { .. })
    }
}

/// An outgoing message for an LND, from its creation until the LND finishes it.
struct OutMsg {
    peer: Nid,
    ni: usize,
    hdr: LnetHdr,
    /// Held while the message waits for credits; moved into the LND when sent.
    payload: Vec<u8>,
    /// For a bulk message, what the LND moves instead (registered memory).
    bulk: Option<BulkSend>,
    /// Payload bytes: sent, or (for a transfer into our memory) received.
    len: usize,
    purpose: Purpose,
    /// Holds a peer tx credit (msg_peertxcredit).
    peer_credit: bool,
    /// Holds an NI tx credit (msg_txcredit).
    ni_credit: bool,
    /// Times it was sent again after a local failure (msg_retry_count).
    retries: u32,
    /// When this attempt was handed to LNet: its failure is resent only within
    /// `transaction_timeout` of this (msg_deadline, set at each commit).
    born: Instant,
    /// Its data went by rendezvous (`bulk` is taken when it is posted): never resent.
    rendezvous: bool,
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

    /// Every message with its cookie.
    fn iter(&self) -> impl Iterator<Item = (u64, &OutMsg)> + '_ {
        self.slots.iter().map(|(h, m)| (h.as_u64(), m))
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
    /// Sent by a sibling runtime (which counted it sent): only its receipt is counted here.
    from_sibling: bool,
}

/// One NI: its LND endpoint and its tx credits (the CPT tx queue's tq_credits; one CPT here).
struct Ni {
    nid: Nid,
    credits: u32,
    peer_credits: u32,
    /// The NI's LND, as LNet drives it (kernel: ni_net->net_lnd).
    lnd: Box<dyn Lnd>,
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
    /// Router credits each peer NI gets (peer_buffer_credits, or peer_credits).
    rtr_credits: u32,
    /// LNet health of this NI (local failures) and its counters.
    health: crate::health::Health,
    hstats: crate::health::NiHealthStats,
}

/// An LNet node: its NIs and LNDs, peers and credits, ping service and counters. Sans-IO; see
/// the crate documentation for how to drive it.
pub struct LnetNode {
    pid: u32,
    /// LNet's global tunables (`global show`, `lnetctl set`).
    globals: crate::GlobalTunables,
    /// LNet health's tunables and recovery queue.
    recovery: Recovery,
    /// Our half of every wire handle we hand out (Lustre's ln_interface_cookie): a REPLY naming
    /// another cookie is not for any ping of this instance.
    interface_cookie: u64,
    nis: Vec<Ni>,
    /// Every NID of the node (ours, and those of the node's other runtimes), in order.
    node_nids: Vec<Nid>,
    peers: BTreeMap<Nid, PeerNi>,
    /// Outgoing LND messages; a message's cookie is its slab key and a generation (see
    /// [`MsgTable`]), so finding it on the per-message path is an index, not a hash.
    msgs: MsgTable,
    /// Messages handed to the LND that it refused on the spot, finished in `process` (never
    /// recursively, however long the credit queues).
    refused: VecDeque<(u64, LnetError)>,
    local: VecDeque<LocalMsg>,
    /// The ping service: pings in flight, their deadlines, our ping buffer.
    pings: Pings,
    next_msg: u64,
    /// Which of the node's nets are alive (the board shared with sibling runtimes).
    alive: NetLiveness,
    events: VecDeque<LnetEvent>,
    stats: LnetStats,
    now: Instant,
    shutting_down: bool,
    /// The way to other nets: routes, gateways and their round robin.
    paths: Paths,
    /// The forwarder: routing on or off, the router buffer pools, the messages held for other
    /// nodes, the books, and the work for sibling runtimes.
    fwd: Forwarder,
    /// Posted memory descriptors over registered memory (see `bulk`).
    mds: Mds,
    /// The node's large router buffers this runtime lends (see `node/bulk_state.rs`).
    large: bulk_state::LargeBuffers,
    /// This runtime's fabric failed for good ([`LnetNode::fabric_lost`]).
    fabric_lost: bool,
    /// GETs into registered memory sent through a router, by their wire handle's object
    /// cookie: waiting for a REPLY by rendezvous, each until its deadline.
    bulk_gets: HashMap<u64, bulk_state::RoutedGet>,
    /// Every deadline of LNet's own (peer aging, pings, routed GETs, the recovery tick, the
    /// trim pass): one table behind `poll_timeout`.
    timers: TimerTable,
    /// The room the last pass left in the tables that arm it (at least the floor).
    trim_mark: usize,
}

impl LnetNode {
    /// Starts a node at `now` over `lnds`, one per NI of `cfg` in the same order (each built for
    /// that NI by the layer that knows its fabric: `LnetNode::new` builds o2ib ones).
    ///
    /// # Panics
    /// If `lnds` and `cfg.nis` differ in number: a node whose NIs had no LND could not run.
    pub fn with_lnds(cfg: NodeConfig, lnds: Vec<Box<dyn Lnd>>, now: Instant) -> LnetNode {
        assert_eq!(lnds.len(), cfg.nis.len(), "one LND per NI");
        let nis: Vec<Ni> = cfg
            .nis
            .iter()
            .zip(lnds)
            .map(|(c, lnd)| Ni::new(c, lnd))
            .collect();
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
        let mut routes = RouteTable::default();
        for r in &cfg.routes {
            // The configuration checks its routes with their lines (`NodeConfig::check_routes`);
            // one that still fails here is left out rather than trusted.
            if let Err(e) = routes.add(*r, &node_nids) {
                warn!(net = %r.net, gateway = %r.gateway, "route refused: {e}");
            }
        }
        // Only the gateways this runtime's NIs reach are its to watch; a sibling runtime
        // watches the others.
        let mine: Vec<Nid> = routes
            .gateways()
            .into_iter()
            .filter(|g| nis.iter().any(|n| n.nid.net() == g.net()))
            .collect();
        let gateways = Gateways::new(cfg.gateway_health, &mine, now);
        let routing = cfg.routing.enabled;
        let alive_slot: Vec<usize> = nis
            .iter()
            .map(|n| {
                node_nids
                    .iter()
                    .position(|&x| x == n.nid)
                    .unwrap_or(usize::MAX)
            })
            .collect();
        let shared = cfg
            .net_alive
            .as_ref()
            .filter(|b| b.len() == node_nids.len());
        let alive_judged = (0..node_nids.len())
            .map(|i| shared.is_some() || alive_slot.contains(&i))
            .collect();
        let net_alive = shared
            .cloned()
            .unwrap_or_else(|| NetAlive::new(node_nids.len()));
        let mut globals = cfg.globals.clone();
        // Not set (a library user's config; the daemon derives it for the whole node).
        // The first NI's LND timeout (o2iblnd's default, 50 s, for a node without NIs).
        let lnd = nis
            .first()
            .map_or(lnd::iface::o2ib::Tunables::default().timeout, |n| {
                n.lnd.timeout()
            });
        globals.derive_transaction_timeout(lnd.as_secs());
        LnetNode {
            pid: cfg.pid,
            recovery: Recovery::new(HealthCfg::of(&globals)),
            globals,
            interface_cookie,
            pings: Pings::new(ping::ping_buffer(
                cfg.pid,
                &node_nids,
                ping::our_features(false),
                |_| false,
            )),
            alive: NetLiveness {
                board: net_alive,
                slot: alive_slot,
                judged: alive_judged,
                started: now,
            },
            node_nids,
            nis,
            peers: BTreeMap::new(),
            msgs: MsgTable::default(),
            refused: VecDeque::new(),
            local: VecDeque::new(),
            next_msg: 1,
            events: VecDeque::new(),
            stats: LnetStats::default(),
            now,
            shutting_down: false,
            paths: Paths {
                routes,
                gateways,
                used: HashMap::new(),
                seq: 0,
            },
            fwd: Forwarder {
                on: routing,
                pools: Pools::new(cfg.routing.buffers),
                held: HandleSlab::default(),
                ready: VecDeque::new(),
                stats: ForwardStats::default(),
                handovers: VecDeque::new(),
            },
            mds: Mds::default(),
            large: bulk_state::LargeBuffers::new(cfg.routing.scrub),
            fabric_lost: false,
            bulk_gets: HashMap::new(),
            timers: TimerTable::new(now),
            trim_mark: TRIM_FLOOR,
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
        self.launch(route, hdr, payload, Purpose::Put(id));
        self.process(now);
        Ok(id)
    }

    /// Pings `dst`: a GET on portal 0 with the ping match bits (api-ni.c, lnet_ping). The outcome
    /// comes as [`LnetEvent::PingDone`], at the latest `timeout` from now. A ping of `0@lo` or of
    /// one of our own NIDs is answered in memory, within this call.
    pub fn ping(&mut self, now: Instant, dst: Nid, timeout: Duration) -> Result<PingId, LnetError> {
        self.advance(now);
        let route = match self.route_checked(dst, 0)? {
            // The ping buffer is the node's, whichever runtime answers: answered here, from
            // our NI (the reply is for it).
            Route::SiblingNi => Route::Local(self.nis.first().map_or(dst, |n| n.nid)),
            r => r,
        };
        let id = self.pings.next_id();
        let deadline = now.saturating_add(timeout);
        self.launch_ping(id, dst, route, deadline, PingKind::User);
        self.process(now);
        Ok(PingId(id))
    }

    /// Stops every LND gracefully; new sends are refused. Queued messages fail as the LNDs give
    /// them back. Keep driving the node until [`LnetNode::is_shut_down`].
    pub fn shutdown(&mut self, now: Instant) {
        self.advance(now);
        self.shutting_down = true;
        self.drop_waiting_forwards(FwdDrop::Shutdown);
        self.fail_bulk_gets();
        for ni in &mut self.nis {
            ni.lnd.shutdown(now);
        }
        self.process(now);
    }

    /// True once shutdown was asked, every LND closed its connections and no message is left.
    pub fn is_shut_down(&self) -> bool {
        self.shutting_down
            && self.nis.iter().all(|n| n.lnd.is_shut_down())
            && self.msgs.is_empty()
            && self.local.is_empty()
            && self.fwd.held.is_empty()
            && self.bulk_gets.is_empty()
    }

    // ------------------------------------------------------------------ driver

    /// Runs the timers due at `now`: the LNDs' and the pings' (a ping past its deadline fails
    /// with [`LnetError::Timeout`]).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        for ni in &mut self.nis {
            ni.lnd.handle_timeout(now);
        }
        while let Some(t) = self.timers.poll(now) {
            match t {
                NodeTimer::PeerAge(nid) => self.age_peer(nid),
                NodeTimer::Ping(id) => {
                    if self.pings.target(id).is_some() {
                        debug!(id, "ping timed out");
                        self.count_error(&LnetError::Timeout);
                        self.complete_ping(id, Err(LnetError::Timeout));
                    }
                }
                NodeTimer::RoutedGet(cookie) => {
                    self.end_bulk_get(cookie, Err(LnetError::Timeout), false)
                }
                NodeTimer::Recovery => self.recover_peers(),
                NodeTimer::Trim => self.trim(),
            }
        }
        self.ping_gateways();
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
                while let Some(ev) = self.nis[i].lnd.poll_event() {
                    progressed = true;
                    self.on_lnd_event(i, ev);
                }
            }
            while let Some(m) = self.local.pop_front() {
                progressed = true;
                self.deliver_local(m);
            }
            while let Some(key) = self.fwd.ready.pop_front() {
                progressed = true;
                self.commit_forward(key);
            }
            if !progressed {
                break;
            }
        }
        // Where a burst shows: the messages and held forwards (every queue holds their keys),
        // and the events the user has not taken yet. A few compares per input, no more. Past
        // what the last pass left, not past the floor: a table in the band a pass leaves alone
        // (above the floor, not sparse) would re-arm it every 5 s on an idle node.
        if self.timers.trim_at().is_none()
            && (self.msgs.slots.capacity() > self.trim_mark
                || self.fwd.held.capacity() > self.trim_mark
                || self.events.capacity() > self.trim_mark)
        {
            self.timers.arm_trim(self.now + TRIM_INTERVAL);
        }
    }

    /// Gives back the room a burst left in the node's tables and queues (see `lnd::trim`), and
    /// looks again in [`TRIM_INTERVAL`] while any is still large (busy, or a slab held at its
    /// size by a live entry near its top: entries are never moved, so a cookie or a held
    /// message's key stays valid).
    fn trim(&mut self) {
        // The sizes are only for the debug line: on a node with many peers a report walks
        // them all.
        let report = tracing::enabled!(tracing::Level::DEBUG);
        let room = |n: &Self| -> usize { n.capacities().iter().map(|c| c.capacity).sum() };
        let before = if report { room(self) } else { 0 };
        let mut large = false;
        large |= self.msgs.slots.trim(TRIM_FLOOR);
        large |= self.fwd.held.trim(TRIM_FLOOR);
        large |= self.refused.trim(TRIM_FLOOR);
        large |= self.local.trim(TRIM_FLOOR);
        large |= self.pings.trim();
        large |= self.events.trim(TRIM_FLOOR);
        large |= self.fwd.ready.trim(TRIM_FLOOR);
        large |= self.fwd.handovers.trim(TRIM_FLOOR);
        large |= self.paths.used.trim(TRIM_FLOOR);
        large |= self.bulk_gets.trim(TRIM_FLOOR);
        large |= self.timers.trim();
        large |= self.mds.trim();
        for pool in &mut self.fwd.pools.0 {
            large |= pool.waiting.trim(TRIM_FLOOR);
        }
        for ni in &mut self.nis {
            large |= ni.delayed.trim(TRIM_FLOOR);
        }
        for p in self.peers.values_mut() {
            large |= p.txq.trim(TRIM_FLOOR_SMALL);
            large |= p.rtrq.trim(TRIM_FLOOR_SMALL);
        }
        if report {
            let after = room(self);
            if after < before {
                debug!(
                    before,
                    after, "LNet tables trimmed after a burst (entries of room)"
                );
            }
        }
        self.trim_mark = TRIM_FLOOR
            .max(self.msgs.slots.capacity())
            .max(self.fwd.held.capacity())
            .max(self.events.capacity());
        if large {
            self.timers.arm_trim(self.now + TRIM_INTERVAL);
        }
    }

    /// What each of the node's tables holds and the room it keeps (per-peer and per-NI queues
    /// summed), for tests and tools; the LNDs report theirs through
    /// [`Endpoint::capacities`](lnd::engine::Endpoint::capacities).
    pub fn capacities(&self) -> Vec<Capacity> {
        let mut r = CapacityReport::default();
        r.add("msgs", &self.msgs.slots);
        r.add("fwds", &self.fwd.held);
        r.add("refused", &self.refused);
        r.add("local", &self.local);
        self.pings.capacities(&mut r);
        r.add("events", &self.events);
        r.add("fwd_ready", &self.fwd.ready);
        r.add("handovers", &self.fwd.handovers);
        r.add("route_used", &self.paths.used);
        r.add("bulk_gets", &self.bulk_gets);
        self.timers.capacities(&mut r);
        self.mds.capacities(&mut r);
        for pool in &self.fwd.pools.0 {
            r.add("pool_waiting", &pool.waiting);
        }
        for ni in &self.nis {
            r.add("ni_delayed", &ni.delayed);
        }
        for p in self.peers.values() {
            r.add("peer_txq", &p.txq);
            r.add("peer_rtrq", &p.rtrq);
        }
        r.finish()
    }

    /// The next event for the user.
    pub fn poll_event(&mut self) -> Option<LnetEvent> {
        self.events.pop_front()
    }

    /// Whether [`LnetNode::poll_event`] has an event to give.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// When [`LnetNode::handle_timeout`] should next be called: the earliest of the LNDs'
    /// timers, the node's timer table and the gateways' ping schedule; now, while large buffers
    /// wait to be scrubbed (the loop does that work, `LnetNode::scrub_bulk`).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let lnd = self.nis.iter().filter_map(|n| n.lnd.poll_timeout()).min();
        let scrub = self.has_bulk_to_scrub().then_some(self.now);
        [
            lnd,
            self.timers.next_deadline(),
            self.paths.gateways.next_deadline(),
            scrub,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// NI `ni`'s LND.
    pub fn lnd(&self, ni: NiIndex) -> Option<&dyn Lnd> {
        self.nis.get(ni.0).map(|n| &*n.lnd)
    }

    /// NI `ni`'s LND, for the layer that built it (its fabric's events and actions go through
    /// it, and its own type is reached with `as_any_mut`). What it does to the LND reaches LNet
    /// at the next [`LnetNode::process`].
    pub fn lnd_mut(&mut self, ni: NiIndex) -> Option<&mut dyn Lnd> {
        self.nis.get_mut(ni.0).map(|n| &mut *n.lnd)
    }

    /// How many NIs the node runs.
    pub fn ni_count(&self) -> usize {
        self.nis.len()
    }

    /// Sends `hdr` as it is to peer `next` through NI `ni`, for unit tests that play a
    /// misbehaving sender (a header LNet would never build).
    #[cfg(test)]
    pub(crate) fn send_raw(
        &mut self,
        now: Instant,
        ni: NiIndex,
        next: Nid,
        hdr: LnetHdr,
        payload: Vec<u8>,
    ) {
        self.advance(now);
        self.launch(
            Route::Remote { ni: ni.0, next },
            hdr,
            payload,
            Purpose::Response,
        );
        self.process(now);
    }

    // ------------------------------------------------------------------ views

    /// Our PID.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// LNet's global tunables.
    pub fn globals(&self) -> &crate::GlobalTunables {
        &self.globals
    }

    /// `lnetctl set NAME VALUE` for global tunables: checked against Lustre's ranges and rules
    /// as a whole, then kept; nothing changes on an error.
    pub fn set_globals(&mut self, values: &[(String, i64)]) -> Result<(), crate::GlobalError> {
        let v: Vec<(&str, i64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let mut g = self.globals.clone();
        g.set_all(&v)?;
        self.adopt_globals(g);
        Ok(())
    }

    /// Takes `globals` whole, as another node of the same daemon checked and kept them (the
    /// daemon's NI runtimes share one set).
    pub fn adopt_globals(&mut self, globals: crate::GlobalTunables) {
        if self.globals == globals {
            return;
        }
        self.globals = globals;
        self.recovery.cfg = HealthCfg::of(&self.globals);
        if self.recovery.cfg.sensitivity == 0 {
            // Health off (Lustre's 0): every value back to the maximum, nothing in recovery.
            for p in self.peers.values_mut() {
                p.health.restore();
            }
            for n in &mut self.nis {
                n.health.restore();
            }
            self.recovery.peers.clear();
        }
    }

    /// Gives a message buffer back (a `Put` event's payload once consumed) so that the next
    /// receive or send reuses it instead of allocating.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if let Some(ni) = self.nis.first_mut() {
            ni.lnd.recycle(buf);
        }
    }

    /// An empty buffer for a payload, from the LND's pool when it has one.
    pub fn take_buffer(&mut self) -> Vec<u8> {
        self.nis
            .first_mut()
            .map_or_else(Vec::new, |ni| ni.lnd.take_buffer())
    }

    /// Tells every NI's LND whether the fabric below reports the writes it sees land
    /// (`lnd::driver::Driver::sees_writes`; see `Lnd::set_fabric_sees_writes`).
    pub fn set_fabric_sees_writes(&mut self, on: bool) {
        for n in &mut self.nis {
            n.lnd.set_fabric_sees_writes(on);
        }
    }

    /// Our NIDs, in NI order.
    pub fn nids(&self) -> Vec<Nid> {
        self.nis.iter().map(|n| n.nid).collect()
    }

    /// Every NID of the node, this runtime's and its siblings' (see `NodeConfig::node_nids`).
    pub fn node_nids(&self) -> &[Nid] {
        &self.node_nids
    }

    /// The liveness board of [`LnetNode::node_nids`] (one slot per NID, in that order): what
    /// a relay ([`crate::relay`]) reads to pass over a sibling whose fabric failed.
    pub fn net_alive(&self) -> &NetAlive {
        &self.alive.board
    }

    /// This runtime's fabric failed for good (its driver returned an error; o2iblnd's fatal
    /// HCA error): its NIs are marked failed on the board, so every sibling runtime's ping
    /// reply lists them DOWN (Lustre: ni_fatal_error_on, reported by
    /// lnet_update_ni_status_locked) and `net show` says `status: down`, and the nodes
    /// routing through us to that net take the route down (avoid_asym_router_failure). The
    /// LND is shut down and every connection ended as the fabric can no longer say it did:
    /// what they carried fails with its reason (forwards back to their ingress, counted), what
    /// waited here for a router credit or buffer is dropped (counted `shutdown`), and what
    /// comes later is refused at once. The other NIs of the node go on.
    pub fn fabric_lost(&mut self, now: Instant) {
        self.advance(now);
        for i in 0..self.nis.len() {
            if let Some(&slot) = self.alive.slot.get(i) {
                self.alive.board.fail(slot);
            }
            // Each connection ends as lost (a transport failure, counted `conns_lost`), then
            // the LND stops: shut down first, they would count as graceful closes.
            self.nis[i].lnd.fabric_lost(now);
        }
        self.fabric_lost = true;
        // What waits here for a router credit or a buffer came in on this fabric and can never
        // be received now; routed GETs into our memory can never get their REPLY.
        self.drop_waiting_forwards(FwdDrop::Shutdown);
        self.fail_bulk_gets();
        self.process(now);
    }

    /// The node's NIDs changed (an NI added or removed at run time, `lnetctl net add|del`,
    /// in a sibling runtime): `nids` is every NID of the node now and `board` their shared
    /// liveness board, in the same order. Our own NIDs stay ours whatever `nids` says (a
    /// runtime being removed keeps them until it is gone). From now on a message to a new NID
    /// is local, a net of a new sibling is reached through it, a route whose gateway is on a
    /// removed net is unusable (the daemon removes such routes too, as Lustre does with the
    /// net's last NI), and our ping reply lists exactly `nids` (lnet_ping_target_update).
    pub fn set_node_nids(&mut self, nids: Vec<Nid>, board: NetAlive) {
        let mut nids = nids;
        for n in &self.nis {
            if !nids.contains(&n.nid) {
                nids.push(n.nid);
            }
        }
        let shared = board.len() == nids.len();
        self.alive.slot = self
            .nis
            .iter()
            .map(|n| nids.iter().position(|&x| x == n.nid).unwrap_or(usize::MAX))
            .collect();
        self.alive.judged = (0..nids.len())
            .map(|i| shared || self.alive.slot.contains(&i))
            .collect();
        self.alive.board = if shared {
            board
        } else {
            self.alive.board.carried(&self.node_nids, &nids)
        };
        self.pings.buffer =
            ping::ping_buffer(self.pid, &nids, ping::our_features(false), |_| false);
        self.forget_bulk_registrations(&nids);
        self.node_nids = nids;
        // A board made while our fabric was being lost may have missed the mark.
        if self.fabric_lost {
            for &slot in &self.alive.slot {
                self.alive.board.fail(slot);
            }
        }
    }

    /// Whether this runtime's fabric was lost ([`LnetNode::fabric_lost`]).
    pub fn is_fabric_lost(&self) -> bool {
        self.fabric_lost
    }

    /// Node-wide counters (`lnetctl stats show`).
    pub fn stats(&self) -> &LnetStats {
        &self.stats
    }

    /// `lnetctl stats reset`: every counter back to zero; the messages allocated now stay
    /// counted (a gauge), and become the new high-water mark.
    pub fn reset_stats(&mut self) {
        let alloc = self.stats.msgs_alloc;
        self.stats = LnetStats {
            msgs_alloc: alloc,
            msgs_max: alloc,
            ..LnetStats::default()
        };
    }

    /// Every local NI (`lnetctl net show -v`).
    pub fn nets(&self) -> Vec<NiInfo> {
        let down = self.nets_down(self.now);
        self.nis
            .iter()
            .enumerate()
            .map(|(i, n)| NiInfo {
                index: NiIndex(i),
                nid: n.nid,
                // As the ping reply says it (the NI's ns_status in Lustre).
                status: if down.get(self.alive.slot[i]).copied().unwrap_or(false) {
                    "down"
                } else {
                    "up"
                },
                credits: n.credits,
                peer_credits: n.peer_credits,
                available_tx_credits: n.tx_credits,
                min_tx_credits: n.min_tx_credits,
                send_count: n.send_count,
                recv_count: n.recv_count,
                drop_count: n.drop_count,
                lnd: n.lnd.info(),
                lnd_peers: n.lnd.peer_count(),
                health: n.health,
                hstats: n.hstats,
            })
            .collect()
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

    /// Whether `nid` is one of the node's NIDs that a sibling runtime runs, not this one (a
    /// message to it goes to that runtime: see [`Handover::Local`]).
    pub fn is_sibling_nid(&self, nid: Nid) -> bool {
        self.is_own(nid) && !self.nis.iter().any(|n| n.nid == nid)
    }

    /// Where a message to `dst` goes (lnet_select_pathway, without Multi-Rail): ourselves in
    /// memory; a peer on the net of one of our NIs directly; a peer on a sibling runtime's net
    /// through that runtime; else through the best live route's gateway
    /// ([`RouteTable::select`]), which this call records as used (round robin).
    fn route(&mut self, dst: Nid) -> Result<Route, LnetError> {
        self.route_leg(dst, Leg::Any)
    }

    /// Where `dst` is reached from here by a message that may take `leg` ([`Leg::of`]); the
    /// gateway chosen, if any, is recorded as used (round robin).
    fn route_leg(&mut self, dst: Nid, leg: Leg) -> Result<Route, LnetError> {
        let (route, gw) = self.peek_route(dst, leg)?;
        if let Some(gw) = gw {
            self.paths.seq += 1;
            self.paths.used.insert(gw, self.paths.seq);
        }
        Ok(route)
    }

    /// What `route_leg` would choose, without stamping the gateway as used (the round-robin
    /// tie-breaker): the route and, through a gateway, which.
    fn peek_route(&self, dst: Nid, leg: Leg) -> Result<(Route, Option<Nid>), LnetError> {
        if dst == Nid::LO_0 || self.nis.iter().any(|n| n.nid == dst) {
            return Ok((Route::Local(dst), None));
        }
        if self.is_own(dst) {
            // Another runtime's NI: delivered in memory there, not here (where it reached
            // this runtime's users in its sibling's name: a selftest from a second NI failed).
            return Ok((Route::SiblingNi, None));
        }
        if let Some(ni) = self.ni_on(dst.net()) {
            return Ok((Route::Remote { ni, next: dst }, None));
        }
        if self.node_nids.iter().any(|n| n.net() == dst.net()) {
            return Ok((Route::Sibling(dst.net()), None));
        }
        let select = |leg: Leg| {
            let (nis, peers, gateways, used) = (
                &self.nis,
                &self.peers,
                &self.paths.gateways,
                &self.paths.used,
            );
            let node_nids = &self.node_nids;
            self.paths
                .routes
                .select(
                    dst.net(),
                    |gw| {
                        if nis.iter().any(|n| n.nid.net() == gw.net()) {
                            let p = peers.get(&gw);
                            Some(GatewayState {
                                alive: true,
                                queued_bytes: p.map_or(0, |p| p.txqnob),
                                credits: p.map_or(i64::MAX, |p| p.tx_credits),
                                health: p.map_or(MAX_HEALTH, |p| p.health.value),
                            })
                        } else if node_nids.iter().any(|n| n.net() == gw.net()) {
                            // A sibling's gateway: usable, after our own at equal rank.
                            Some(GatewayState {
                                alive: true,
                                queued_bytes: u64::MAX,
                                credits: i64::MIN,
                                health: 0,
                            })
                        } else {
                            None
                        }
                    },
                    |gw| used.get(&gw).copied().unwrap_or(0),
                    |r| {
                        (!gateways.is_gateway(r.gateway) || gateways.route_alive(r))
                            && (leg == Leg::Any || gateways.is_last_hop(r))
                    },
                )
                .map(|r| r.gateway)
        };
        let Some(gw) = select(leg) else {
            return Err(if leg == Leg::Last && select(Leg::Any).is_some() {
                LnetError::HopLimit(dst)
            } else {
                LnetError::NoRoute(dst)
            });
        };
        Ok((
            match self.ni_on(gw.net()) {
                Some(ni) => Route::Remote { ni, next: gw },
                None => Route::Sibling(gw.net()),
            },
            Some(gw),
        ))
    }

    /// Our first NI on `net`.
    fn ni_on(&self, net: Net) -> Option<usize> {
        self.nis.iter().position(|n| n.nid.net() == net)
    }

    /// Routes a new user message and checks what the path can carry; a refusal is counted.
    fn route_checked(&mut self, dst: Nid, len: usize) -> Result<Route, LnetError> {
        let checked = if self.shutting_down {
            Err(LnetError::Shutdown)
        } else {
            self.route(dst).and_then(|r| {
                let max = match r {
                    Route::Local(_) | Route::SiblingNi => LNET_MTU as usize,
                    Route::Remote { ni, .. } => self.nis[ni].lnd.max_inline(),
                    // The daemon hands a user's message to the runtime on the right net; a
                    // runtime does not relay its own user's messages through a sibling.
                    Route::Sibling(_) => return Err(LnetError::NoRoute(dst)),
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
            Route::Remote { ni, .. } => self.nis[ni].nid,
            // From this runtime's NI, so that the answer comes back here.
            Route::SiblingNi => self.nis.first().map_or(Nid::ANY, |n| n.nid),
            // Not sent from here (see `route_checked`).
            Route::Sibling(_) => Nid::ANY,
        }
    }

    fn alloc_msg(&mut self) {
        self.stats.msgs_alloc += 1;
        self.stats.msgs_max = self.stats.msgs_max.max(self.stats.msgs_alloc);
    }

    fn free_msg(&mut self) {
        self.stats.msgs_alloc = self.stats.msgs_alloc.saturating_sub(1);
    }

    /// Starts a message on `route` (never `Route::Sibling`: callers hand those over).
    fn launch(&mut self, route: Route, hdr: LnetHdr, payload: Vec<u8>, purpose: Purpose) {
        self.alloc_msg();
        match route {
            Route::Local(_) => self.local.push_back(LocalMsg {
                hdr,
                payload,
                purpose,
                from_sibling: false,
            }),
            Route::SiblingNi => {
                // Sent as lolnd sends (no credits), the sibling runtime receives it in memory;
                // nobody waits for more than the handover (a GET's REPLY comes back the same
                // way, or its deadline ends it).
                let len = payload.len() as u64;
                self.stats.send_count += 1;
                self.stats.send_length += len;
                self.stats.loopback_count += 1;
                self.stats.loopback_length += len;
                self.free_msg();
                self.fwd
                    .handovers
                    .push_back(Handover::Local { hdr, payload });
                if let Purpose::Put(id) = purpose {
                    self.events
                        .push_back(LnetEvent::PutDone { id, result: Ok(()) });
                }
            }
            route => {
                // Why it cannot be sent, if it cannot: finished in `process` with that status,
                // holding no credit. A sibling's NI is not ours to send on (the daemon hands such
                // messages over before they get here).
                let (peer, ni, refusal) = match route {
                    Route::Remote { ni, next } => {
                        let known = self.peer_entry(next, ni).is_some();
                        let e = LnetError::Refused(SendError::PeerTableFull(next));
                        (next, ni, (!known).then_some(e))
                    }
                    _ => (hdr.dest_nid, 0, Some(LnetError::NoRoute(hdr.dest_nid))),
                };
                let cookie = self.msgs.insert(OutMsg {
                    peer,
                    ni,
                    hdr,
                    len: payload.len(),
                    payload,
                    bulk: None,
                    purpose,
                    peer_credit: false,
                    ni_credit: false,
                    retries: 0,
                    born: self.now,
                    rendezvous: false,
                });
                match refusal {
                    None => self.post_send(cookie),
                    Some(e) => self.refused.push_back((cookie, e)),
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
            // Our own answers only: what a router forwards is bounded by its buffers and
            // router credits already.
            let response = m.is_own_answer();
            let Some(p) = self.peers.get_mut(&peer_nid) else {
                return;
            };
            if response && p.txq_responses >= RESPONSE_BACKLOG {
                self.stats.drop_count += 1;
                self.stats.drop_length += len as u64;
                self.refused
                    .push_back((cookie, LnetError::Backlog(peer_nid)));
                return;
            }
            m.peer_credit = true;
            p.tx_credits -= 1;
            p.min_tx_credits = p.min_tx_credits.min(p.tx_credits);
            if p.tx_credits < 0 {
                p.txq.push_back(cookie);
                p.txq_responses += usize::from(response);
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
        let bulk = m.bulk.take();
        m.rendezvous |= bulk.is_some();
        let hdr = m.hdr;
        let now = self.now;
        let lnd = &mut self.nis[ni].lnd;
        let sent = match bulk {
            None => lnd.send(now, peer_nid, hdr, payload, cookie),
            Some(b) => lnd.send_bulk(now, peer_nid, hdr, b, cookie),
        };
        match sent {
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
        self.finish_out_returning(cookie, result, Vec::new());
    }

    /// [`LnetNode::finish_out`], with the payload the LND gave back if it failed the message
    /// (for a resend).
    fn finish_out_returning(
        &mut self,
        cookie: u64,
        result: Result<(), LnetError>,
        returned: Vec<u8>,
    ) {
        let Some(mut m) = self.msgs.remove(&cookie) else {
            debug!(cookie, "completion for an unknown message");
            self.recycle(returned);
            return;
        };
        match &result {
            Err(e) => match self.resend(m, e, returned) {
                None => return,
                Some(back) => m = back,
            },
            Ok(()) if m.retries > 0 => self.stats.successful_resends += 1,
            Ok(()) => {}
        }
        self.free_msg();
        self.return_credits(&m);
        // A bulk PUT to forward that did not come in is counted as the forward's drop.
        let forwarding = matches!(m.purpose, Purpose::ForwardIn(_));
        let recovery = match m.purpose {
            Purpose::PingGet(PingId(id)) => self
                .pings
                .kind(id)
                .is_some_and(|k| matches!(k, PingKind::Recovery | PingKind::LocalRecovery(_))),
            _ => false,
        };
        self.judge_health(m.ni, m.peer, result.as_ref().err(), recovery);
        if let Err(e) = &result {
            self.count_error(e);
            if !forwarding {
                self.nis[m.ni].drop_count += 1;
            }
            let routing = self.fwd.on;
            if let Some(p) = self.peers.get_mut(&m.peer).filter(|_| !forwarding) {
                p.drop_count += 1;
                // On a router, the LND failing to reach a peer (o2iblnd notifies LNet of a
                // failed connect, kiblnd_peer_connect_failed -> lnet_notify) marks it down until
                // the LND reports it up: lnet_check_message_drop then drops what is routed to it
                // (`drops_for_down_peer`). The LND reports a peer it never reached only once its
                // retries end, too late to spare the router's buffers.
                if routing
                    && matches!(
                        e,
                        LnetError::Lnd(
                            TxError::ConnectFailed
                                | TxError::ConnectRefused
                                | TxError::PeerUnreachable
                                | TxError::Timeout
                        )
                    )
                {
                    p.state = PeerState::Down;
                }
            }
        }
        let len = m.len as u32;
        match m.purpose {
            Purpose::Put(id) => self.events.push_back(LnetEvent::PutDone { id, result }),
            Purpose::GetBulk(id) => {
                if result.is_ok() {
                    self.stats.recv_count += 1;
                    self.stats.recv_length += u64::from(len);
                }
                let result = result.map(|()| len);
                self.events.push_back(LnetEvent::GetDone { id, result });
            }
            Purpose::SinkPut {
                md,
                match_bits,
                hdr_data,
                ack,
            } => {
                if result.is_ok() {
                    self.stats.recv_count += 1;
                    self.stats.recv_length += u64::from(len);
                    self.nis[m.ni].recv_count += 1;
                }
                if result.is_ok() {
                    // lnet_finalize -> lnet_ack: the PUT is in, tell its sender.
                    self.ack(&m.hdr, None, ack, match_bits, len as usize);
                }
                self.events.push_back(LnetEvent::BulkPut {
                    md,
                    from: m.hdr.src_nid,
                    match_bits,
                    hdr_data,
                    result: result.map(|()| len),
                });
            }
            Purpose::ForwardIn(key) => self.forward_received(key, result),
            Purpose::GetRouted(cookie) => {
                if let Err(e) = result {
                    self.end_bulk_get(cookie, Err(e), true);
                }
            }
            Purpose::ServeReply(md) => {
                self.events.push_back(LnetEvent::BulkGetServed {
                    md,
                    to: m.hdr.dest_nid,
                    result: result.map(|()| len),
                });
            }
            Purpose::ServeGet(md) => {
                if result.is_ok() {
                    self.stats.send_count += 1;
                    self.stats.send_length += u64::from(len);
                    self.nis[m.ni].send_count += 1;
                }
                self.events.push_back(LnetEvent::BulkGetServed {
                    md,
                    to: m.hdr.src_nid,
                    result: result.map(|()| len),
                });
            }
            Purpose::PingGet(PingId(id)) | Purpose::GatewayPing(PingId(id)) => {
                if let Err(e) = result {
                    // The GET never made it: fail the ping now rather than at its timeout.
                    self.complete_ping(id, Err(e));
                }
            }
            Purpose::Response => {}
            Purpose::Forward { origin, key, .. } => self.forward_sent(origin, key, result),
        }
    }

    /// A message failed locally: sent again if Lustre would (lib-msg.c lnet_health_check and
    /// lnet_attempt_msg_resend), else given back (`Some`) to be finished with its failure.
    /// Lustre resends a local failure only on a node with more than one NI, at most
    /// `retry_count` times, each attempt within `transaction_timeout` of its own start
    /// (msg_deadline is set at every commit), never a recovery ping and never while shutting
    /// down. With o2iblnd's statuses (kiblnd_abort_txs) the local failure that leaves a
    /// message unsent is LOCAL_TIMEOUT: it was still queued on a connection that timed out.
    /// One that was posted and failed is REMOTE_DROPPED (the peer may have it), and a remote
    /// failure is resent only to a peer with a second NI (Multi-Rail), which ulnet's peers
    /// never have. The new attempt picks its path again (another gateway, after health
    /// judged this one); a forward goes again to the next hop it had, unless LNet now holds
    /// that hop down. Messages by rendezvous (bulk) are not resent by ulnet.
    fn resend(&mut self, mut m: OutMsg, e: &LnetError, returned: Vec<u8>) -> Option<OutMsg> {
        let local = HStatus::of(e).is_some_and(HStatus::is_resendable);
        let shutdown = matches!(e, LnetError::Shutdown | LnetError::Lnd(TxError::Shutdown));
        let forward = matches!(m.purpose, Purpose::Forward { .. });
        let kind_ok = match m.purpose {
            Purpose::Put(_) | Purpose::Response | Purpose::Forward { .. } => true,
            Purpose::PingGet(PingId(id)) => {
                self.pings.kind(id).is_some_and(|k| k == PingKind::User)
            }
            _ => false,
        };
        let retry = self.recovery.cfg.retry_count;
        if !local
            || shutdown
            || self.shutting_down
            || !kind_ok
            || m.rendezvous
            || m.bulk.is_some()
            || retry == 0
            || self.node_nids.len() < 2
        {
            self.recycle(returned);
            return Some(m);
        }
        if m.retries >= retry {
            self.stats.failed_resends += 1;
            self.recycle(returned);
            return Some(m);
        }
        let deadline = m
            .born
            .saturating_add(Duration::from_secs(self.recovery.cfg.transaction_timeout));
        // Queued here, or given back by the LND: the payload to send again.
        let payload = if m.payload.is_empty() {
            returned
        } else {
            self.recycle(returned);
            std::mem::take(&mut m.payload)
        };
        let path = if self.now >= deadline || payload.len() != m.len {
            None
        } else if forward {
            // The hop it had (the one it came from was checked then), unless held down.
            (!self.drops_for_down_peer(m.peer, m.ni)).then_some((m.ni, m.peer))
        } else {
            match self.route(m.hdr.dest_nid) {
                Ok(Route::Remote { ni, next }) => Some((ni, next)),
                _ => None,
            }
        };
        let path = path.filter(|&(ni, next)| self.peer_entry(next, ni).is_some());
        let Some((ni, next)) = path else {
            m.payload = payload;
            return Some(m);
        };
        // This attempt's failure is judged and counted, as lnet_health_check does before it
        // queues the resend; its credits go back (lnet_msg_decommit_tx).
        self.judge_health(m.ni, m.peer, Some(e), false);
        self.count_status(e);
        self.return_credits(&m);
        debug!(dst = %m.hdr.dest_nid, via = %next, retry = m.retries + 1, "resending after {e}");
        if !forward && ni != m.ni {
            // Our own message leaves from the NI it now takes.
            m.hdr.src_nid = self.nis[ni].nid;
        }
        m.peer_credit = false;
        m.ni_credit = false;
        m.retries = m.retries.saturating_add(1);
        m.born = self.now;
        m.ni = ni;
        m.peer = next;
        m.payload = payload;
        let cookie = self.msgs.insert(m);
        self.stats.resend_count += 1;
        self.post_send(cookie);
        None
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
            // The oldest waiting goes now; one past its deadline is dropped instead (its
            // credit comes back with it) and the next is tried (lnet_post_send_locked's
            // lnet_check_message_drop). A loop, not a recursion: a peer that returned no
            // credit for a while may have a long queue of them.
            let timeout = Duration::from_secs(self.recovery.cfg.transaction_timeout);
            let now = self.now;
            while p.tx_credits <= 0 {
                let Some(next) = p.txq.pop_front() else {
                    break;
                };
                let Some(n) = self.msgs.get_mut(&next) else {
                    continue;
                };
                p.txqnob = p.txqnob.saturating_sub((n.len + LNET_HDR_LEN) as u64);
                let forward = matches!(n.purpose, Purpose::Forward { .. });
                if n.is_own_answer() {
                    p.txq_responses = p.txq_responses.saturating_sub(1);
                }
                if forward || now < n.born.saturating_add(timeout) {
                    self.post_send(next);
                    break;
                }
                n.peer_credit = false;
                p.tx_credits += 1;
                self.stats.drop_count += 1;
                self.stats.drop_length += n.len as u64;
                self.refused.push_back((next, LnetError::Expired));
            }
        }
    }

    fn count_error(&mut self, e: &LnetError) {
        let s = &mut self.stats;
        s.errors += 1;
        if matches!(e, LnetError::Timeout) {
            s.response_timeout_count += 1;
        }
        self.count_status(e);
    }

    /// The health status's counter of a failed attempt (lnet_incr_hstats: every attempt,
    /// resent or not).
    fn count_status(&mut self, e: &LnetError) {
        let s = &mut self.stats;
        // The health status's counter (lnet_incr_hstats), one mapping for these and for
        // the NI's and peer NI's `health stats` (`HStatus::of`).
        match HStatus::of(e) {
            Some(HStatus::LocalInterrupt) => s.local_interrupt_count += 1,
            Some(HStatus::LocalDropped) => s.local_dropped_count += 1,
            Some(HStatus::LocalAborted) => s.local_aborted_count += 1,
            Some(HStatus::LocalNoRoute) => s.local_no_route_count += 1,
            Some(HStatus::LocalTimeout) => s.local_timeout_count += 1,
            Some(HStatus::LocalError) => s.local_error_count += 1,
            Some(HStatus::RemoteDropped) => s.remote_dropped_count += 1,
            Some(HStatus::RemoteError) => s.remote_error_count += 1,
            Some(HStatus::RemoteTimeout) => s.remote_timeout_count += 1,
            Some(HStatus::NetworkTimeout) => s.network_timeout_count += 1,
            None => {}
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
                // The contract: hand every received message back exactly once. A message for
                // us goes back at once; one for another node when it has a router buffer
                // (`forwarding`).
                self.note_arrival(ni, from, &hdr);
                if hdr.dest_nid == self.nis[ni].nid {
                    self.nis[ni].lnd.recv_done(now, rx);
                    self.parse(Some(ni), from, hdr, payload);
                } else {
                    self.forward_arrived(ni, from, hdr, Arrival::Inline(payload), rx);
                }
            }
            LndEvent::SendDone {
                cookie,
                result,
                returned,
                ..
            } => {
                self.finish_out_returning(cookie, result.map_err(LnetError::Lnd), returned);
            }
            LndEvent::BulkRequest { from, hdr, op, rx } => {
                self.on_rdma_request(ni, from, hdr, op, rx);
            }
            LndEvent::BulkDone { cookie, result, .. } => self.on_rdma_done(cookie, result),
            LndEvent::PeerUp { nid } => {
                self.paths.gateways.notify(self.now, nid, true);
                if let Some(p) = self.peer_entry(nid, ni) {
                    p.state = PeerState::Up;
                }
                self.events.push_back(LnetEvent::PeerUp {
                    ni: NiIndex(ni),
                    nid,
                });
            }
            LndEvent::PeerDown { nid, reason } => {
                if self.paths.gateways.notify(self.now, nid, false) {
                    self.reroute_queued(nid);
                }
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

    /// What every message from a peer tells us, whatever it carries and whoever it is for
    /// (lnet_parse): the peer NI heard from (its health's recovery may end), our net alive
    /// (net_last_alive), and a gateway that forwards to us alive (passive revival).
    pub(super) fn note_arrival(&mut self, ni: usize, from: Nid, hdr: &LnetHdr) {
        let now = self.now;
        let mut unhealthy = self.nis[ni].health.value < MAX_HEALTH;
        if let Some(p) = self.peer_entry(from, ni) {
            p.recv_count += 1;
            p.last_heard = Some(now);
            unhealthy |= p.health.value < MAX_HEALTH;
        }
        if unhealthy {
            self.heard_from(ni, from);
        }
        self.alive.board.heard(self.alive.slot[ni], now);
        if hdr.src_nid != from && self.paths.gateways.is_gateway(from) {
            self.paths.gateways.notify(now, from, true);
        }
    }

    /// A message short-circuited in memory: sent and received at once, no credits (as Lustre's
    /// loopback LND: "no send credit hassles").
    fn deliver_local(&mut self, m: LocalMsg) {
        let len = m.payload.len() as u64;
        if !m.from_sibling {
            self.stats.send_count += 1;
            self.stats.send_length += len;
            self.stats.loopback_count += 1;
            self.stats.loopback_length += len;
        }
        let from = m.hdr.src_nid;
        self.parse(None, from, m.hdr, m.payload);
        self.free_msg();
        if let Purpose::Put(id) = m.purpose {
            self.events
                .push_back(LnetEvent::PutDone { id, result: Ok(()) });
        }
    }

    /// What we answer a ping with. A router reports each of its nets DOWN once it has heard
    /// no message on it for router_ping_timeout + alive_router_check_interval (router.c
    /// lnet_update_ni_status_locked), so that nodes routing through it to that net stop
    /// (`avoid_asym_router_failure`); a node that does not route says every NI is UP.
    fn ping_reply(&self) -> Vec<u8> {
        let down = self.nets_down(self.now);
        if !self.fwd.on && !down.contains(&true) {
            return self.pings.buffer.clone();
        }
        ping::ping_buffer(
            self.pid,
            &self.node_nids,
            ping::our_features(self.fwd.on),
            |i| down[i],
        )
    }

    /// For each NID of the node, whether a router would report it DOWN at `now` (a sibling's
    /// NI that this runtime cannot see, never).
    /// Its fabric failed ([`LnetNode::fabric_lost`]) on any node; on a router, also its net
    /// silent for too long.
    fn nets_down(&self, now: Instant) -> Vec<bool> {
        let cfg = self.paths.gateways.config();
        let bound = cfg.ping_timeout.saturating_add(cfg.check_interval);
        (0..self.node_nids.len())
            .map(|i| {
                self.alive.board.failed(i)
                    || (self.fwd.on
                        && self.alive.judged[i]
                        && !alive::net_alive(
                            self.alive.started,
                            self.alive.board.last(i),
                            now,
                            bound,
                        ))
            })
            .collect()
    }

    /// The NIDs of the node reported DOWN in its ping reply at `now`: a failed fabric, or on a
    /// router a net silent too long.
    pub fn silent_nids(&self, now: Instant) -> Vec<Nid> {
        let down = self.nets_down(now);
        self.node_nids
            .iter()
            .zip(down)
            .filter_map(|(&n, d)| d.then_some(n))
            .collect()
    }

    /// lnet_parse and the matching that follows, for one message (from the LND of NI `via`, or
    /// local when `None`).
    fn parse(&mut self, via: Option<usize>, from: Nid, hdr: LnetHdr, mut payload: Vec<u8>) {
        self.alloc_msg();
        let for_me = match via {
            Some(ni) => hdr.dest_nid == self.nis[ni].nid,
            None => self.is_own(hdr.dest_nid) || hdr.dest_nid == Nid::LO_0,
        };
        let announced = hdr.payload_length as usize;
        let verdict = if !for_me {
            // `on_lnd_event` sends everything else to `forward_arrived`.
            Err("not addressed to us")
        } else if payload.len() < announced {
            Err("payload shorter than its header says")
        } else {
            payload.truncate(announced);
            Ok(())
        };
        let verdict = verdict.and_then(|()| self.match_msg(via, from, &hdr, payload));
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
    fn match_msg(
        &mut self,
        via: Option<usize>,
        from: Nid,
        hdr: &LnetHdr,
        payload: Vec<u8>,
    ) -> Result<usize, &'static str> {
        let len = payload.len();
        // The way the request came, for our response (see `respond`).
        let back = via.map(|ni| (ni, from));
        match hdr.body {
            LnetBody::Put {
                ptl_index: LNET_RESERVED_PORTAL,
                match_bits: LNET_PING_MATCHBITS,
                ack_wmd,
                ..
            } => {
                // A discovery push: the sender's ping buffer, sent to a peer it takes for
                // Multi-Rail (a kernel `lnetctl peer add` without --non_mr, and its router
                // checker then pushes to its gateways every interval). The kernel's push target
                // takes it and lnet_parse_put ACKs it; without the ACK the sender's discovery
                // fails and it marks us dead with every route through us. We are not
                // Multi-Rail: its NIDs teach us nothing we use, so the payload is dropped here.
                self.ack(hdr, back, ack_wmd, LNET_PING_MATCHBITS, len);
                Ok(len)
            }
            LnetBody::Put {
                ptl_index: LNET_RESERVED_PORTAL,
                ..
            } => Err("PUT on the reserved portal that is not a discovery push"),
            LnetBody::Put {
                ack_wmd,
                match_bits,
                hdr_data,
                ptl_index,
                ..
            } => {
                // lnet_parse_put: a posted sink on (portal, match bits) takes it first, cut to
                // its length; else it goes up as a plain PUT.
                // In memory (from a sibling runtime), a sink on any NI of ours.
                let md = match via {
                    Some(ni) => self.mds.take(ni, ptl_index, match_bits, true),
                    None => (0..self.nis.len())
                        .find_map(|ni| self.mds.take(ni, ptl_index, match_bits, true)),
                };
                if let Some((md, m)) = md {
                    let mut payload = payload;
                    payload.truncate(m.buf.len as usize);
                    let n = payload.len();
                    self.events.push_back(LnetEvent::BulkPutInline {
                        md,
                        from: hdr.src_nid,
                        match_bits,
                        hdr_data,
                        payload,
                    });
                    self.ack(hdr, back, ack_wmd, match_bits, n);
                    return Ok(len);
                }
                self.events.push_back(LnetEvent::Put {
                    from: hdr.src_nid,
                    to: hdr.dest_nid,
                    portal: ptl_index,
                    match_bits,
                    hdr_data,
                    payload,
                });
                // lnet_parse_put then lnet_ack: when the sender asked for an ACK.
                self.ack(hdr, back, ack_wmd, match_bits, len);
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
                let mut reply = self.ping_reply();
                let n = reply.len().min(sink_length as usize);
                reply.truncate(n);
                self.respond(
                    hdr,
                    back,
                    n as u32,
                    LnetBody::Reply {
                        dst_wmd: return_wmd,
                    },
                    reply,
                );
                Ok(0)
            }
            LnetBody::Get { .. } => match via {
                // A GET that came through a router (LNet never routes an optimized one): its
                // REPLY comes from a posted source, by rendezvous.
                Some(ni) => self.serve_get_by_reply(ni, hdr),
                None => self.serve_get_in_memory(hdr),
            },
            LnetBody::Reply { dst_wmd } => {
                if dst_wmd.interface_cookie != self.interface_cookie {
                    return Err("REPLY for another instance");
                }
                let id = dst_wmd.object_cookie;
                let ours = self.bulk_gets.get(&id).map(|g| g.dst == hdr.src_nid);
                if ours == Some(false) {
                    return Err("REPLY for a GET of ours from another node");
                }
                if ours == Some(true) {
                    if len == 0 {
                        // Nothing to write: an empty REPLY is a complete one.
                        self.end_bulk_get(id, Ok(0), false);
                        return Ok(0);
                    }
                    // Answered inline: the user copies it into the GET's memory.
                    self.end_bulk_get_inline(id, payload);
                    return Ok(len);
                }
                let Some(target) = self.pings.target(id) else {
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

    /// An ACK for a PUT of `mlength` bytes, if its sender asked for one (`ack_wmd`).
    fn ack(
        &mut self,
        req: &LnetHdr,
        back: Option<(usize, Nid)>,
        ack_wmd: WireHandle,
        match_bits: u64,
        mlength: usize,
    ) {
        if ack_wmd == WireHandle::NONE {
            return;
        }
        let body = LnetBody::Ack {
            dst_wmd: ack_wmd,
            match_bits,
            mlength: mlength as u32,
        };
        self.respond(req, back, 0, body, Vec::new());
    }

    /// Sends a REPLY or ACK back to the originator of `req`, from the NID it addressed;
    /// `back` is the NI and the hop the request came by, when known.
    fn respond(
        &mut self,
        req: &LnetHdr,
        back: Option<(usize, Nid)>,
        len: u32,
        body: LnetBody,
        payload: Vec<u8>,
    ) {
        let dst = req.src_nid;
        let route = match self.route(dst) {
            // The way back leaves by another runtime's NI, which a response of ours cannot
            // take: back through the router that brought the request, as the kernel sends a
            // response through the gateway the request came from (lnet_select_pathway, for
            // REPLY and ACK). A remote node's ping of us failed with an asymmetric route.
            Ok(Route::Sibling(net)) => match back.filter(|&(_, hop)| hop != dst) {
                Some((ni, hop)) => Route::Remote { ni, next: hop },
                None => Route::Sibling(net),
            },
            Ok(r) => r,
            Err(e) => {
                self.count_error(&e);
                return;
            }
        };
        let src = match route {
            Route::Local(_) | Route::SiblingNi => req.dest_nid,
            Route::Remote { ni, .. } => self.nis[ni].nid,
            Route::Sibling(_) => {
                // The way back is through another runtime's NI: not for a response of ours.
                self.count_error(&LnetError::NoRoute(dst));
                return;
            }
        };
        let hdr = LnetHdr {
            dest_nid: dst,
            src_nid: src,
            dest_pid: req.src_pid,
            src_pid: self.pid,
            payload_length: len,
            body,
        };
        self.launch(route, hdr, payload, Purpose::Response);
    }

    fn complete_ping(&mut self, id: u64, result: Result<PingReply, LnetError>) {
        if let Some(p) = self.pings.finish(id) {
            self.timers.cancel(p.timer);
            if let PingKind::LocalRecovery(ni) = p.kind {
                // The GET's send and the REPLY's receipt raised the NI's health as they
                // happened; a failed ping costs it nothing more (lnet_health_check skips
                // recovery messages), the next one goes at its backoff.
                if let Some(n) = self.nis.get_mut(ni) {
                    n.health.pending = false;
                }
                if let Err(e) = &result {
                    debug!(nid = %p.target, "local NI recovery ping failed: {e}");
                }
                return;
            }
            if p.kind == PingKind::Recovery {
                if let Some(peer) = self.peers.get_mut(&p.target) {
                    peer.health.pending = false;
                }
                // A reply raised the peer NI's health when it came in (`heard_from`); a GET
                // the LND failed was judged when it ended (`judge_health`). What is left is a
                // GET that went and got no reply: the peer's failure, once.
                if let Err(e) = &result {
                    debug!(peer = %p.target, "recovery ping failed: {e}");
                    if matches!(e, LnetError::Timeout) {
                        self.peer_failed(p.target);
                    }
                }
                return;
            }
            if p.kind == PingKind::Gateway {
                if let Err(e) = &result {
                    debug!(gateway = %p.target, "gateway ping failed: {e}");
                }
                let now = self.now;
                if self
                    .paths
                    .gateways
                    .ping_done(now, p.target, id, result.as_ref().ok())
                {
                    self.reroute_queued(p.target);
                }
                return;
            }
            self.events.push_back(LnetEvent::PingDone {
                id: PingId(id),
                target: p.target,
                result,
            });
        }
    }

    // ------------------------------------------------------------------ router pinger

    /// Pings every gateway that is due (`alive_router_check_interval`), with
    /// `router_ping_timeout`. Never one of our own NIDs: a gateway is never ours (routes are
    /// checked), and a ping to ourselves would not go through an LND anyway.
    fn ping_gateways(&mut self) {
        if self.shutting_down {
            return;
        }
        let now = self.now;
        let mut next = self.pings.next;
        let nis: Vec<Net> = self.nis.iter().map(|n| n.nid.net()).collect();
        let due = self.paths.gateways.due(
            now,
            |g| nis.contains(&g.net()),
            || {
                let id = next;
                next += 1;
                id
            },
        );
        self.pings.next = next;
        let timeout = self.paths.gateways.config().ping_timeout;
        for (gw, id) in due {
            let Some(ni) = self.ni_on(gw.net()) else {
                continue;
            };
            let deadline = now.saturating_add(timeout);
            trace!(gateway = %gw, "router ping");
            self.launch_ping(
                id,
                gw,
                Route::Remote { ni, next: gw },
                deadline,
                PingKind::Gateway,
            );
        }
    }

    /// Registers ping `id` of `dst`, answered by `deadline` at the latest, and sends its GET
    /// on `route`: a user's ping, or the router pinger's (`gateway`).
    fn launch_ping(&mut self, id: u64, dst: Nid, route: Route, deadline: Instant, kind: PingKind) {
        let timer = self.timers.arm(deadline, NodeTimer::Ping(id));
        self.pings.start(
            id,
            PendingPing {
                target: dst,
                kind,
                timer,
            },
        );
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
        let purpose = if kind == PingKind::Gateway {
            Purpose::GatewayPing(PingId(id))
        } else {
            Purpose::PingGet(PingId(id))
        };
        self.launch(route, hdr, Vec::new(), purpose);
    }

    /// Gateway `gw` just died: the routed messages still waiting in LNet for one of its
    /// credits (never handed to its LND, so never sent) go by another route now, or fail with
    /// no route; those already in its LND end there (completion or LND timeout).
    fn reroute_queued(&mut self, gw: Nid) {
        let Some(p) = self.peers.get_mut(&gw) else {
            return;
        };
        let queued: Vec<u64> = p.txq.drain(..).collect();
        p.txqnob = 0;
        let mut keep = VecDeque::new();
        let mut moved = Vec::new();
        for cookie in queued {
            match self.msgs.get(&cookie) {
                Some(m) if m.hdr.dest_nid != gw => moved.push(cookie),
                Some(_) => keep.push_back(cookie),
                None => {}
            }
        }
        if let Some(p) = self.peers.get_mut(&gw) {
            // Each moved message had taken a credit it never used.
            p.tx_credits += moved.len() as i64;
            for &c in &keep {
                let len = self.msgs.get(&c).map_or(0, |m| m.len);
                p.txqnob += (len + LNET_HDR_LEN) as u64;
            }
            p.txq_responses = keep
                .iter()
                .filter(|c| self.msgs.get(c).is_some_and(OutMsg::is_own_answer))
                .count();
            p.txq = keep;
        }
        if !moved.is_empty() {
            debug!(gateway = %gw, messages = moved.len(), "rerouting messages queued for a dead gateway");
        }
        for cookie in moved {
            let Some(m) = self.msgs.remove(&cookie) else {
                continue;
            };
            self.free_msg();
            // A forward moves under the hop rule, as when it first left.
            let route = match m.purpose {
                Purpose::Forward { leg, .. } => self.route_leg(m.hdr.dest_nid, leg),
                _ => self.route(m.hdr.dest_nid),
            };
            match route {
                Ok(r @ Route::Remote { .. }) if m.bulk.is_none() => {
                    self.launch(r, m.hdr, m.payload, m.purpose)
                }
                // A bulk message keeps its registered memory, which belongs to its NI: it may
                // move to another gateway on that NI only.
                Ok(Route::Remote { ni, next }) if ni == m.ni => {
                    let purpose = m.purpose;
                    let bulk = m.bulk.expect("checked above");
                    self.launch_bulk(ni, next, m.hdr, bulk, purpose);
                }
                route => {
                    let cookie = self.msgs.insert(OutMsg {
                        peer_credit: false,
                        ni_credit: false,
                        retries: 0,
                        born: self.now,
                        rendezvous: false,
                        ..m
                    });
                    self.alloc_msg();
                    let dest = self.msgs.get(&cookie).map_or(gw, |m| m.hdr.dest_nid);
                    let e = match route {
                        Err(e @ LnetError::HopLimit(_)) => e,
                        _ => LnetError::NoRoute(dest),
                    };
                    self.refused.push_back((cookie, e));
                }
            }
        }
    }

    // ------------------------------------------------------------------ routing, upper layer

    /// Replaces the route table (`lnetctl route add|del`); the gateways follow it.
    pub fn set_routes(&mut self, now: Instant, routes: RouteTable) {
        self.advance(now);
        let mine: Vec<Nid> = routes
            .gateways()
            .into_iter()
            .filter(|g| self.ni_on(g.net()).is_some())
            .collect();
        self.paths.gateways.set(&mine, now);
        self.paths.routes = routes;
    }

    /// A message from a sibling runtime: a forward to send out of this NI, the end of one of
    /// ours that a sibling sent (both `forwarding`), or a message for our NI.
    pub fn handle_handover(&mut self, now: Instant, h: Handover) {
        self.advance(now);
        match h {
            Handover::Forward {
                origin,
                from,
                key,
                hdr,
                payload,
                bulk,
                ..
            } => self.forward_handed(origin, from, key, hdr, payload, bulk),
            Handover::Done { key, result, .. } => {
                self.forward_done(key, result.map_err(|e| FwdDrop::of(&e)));
            }
            Handover::Local { hdr, payload } => {
                self.alloc_msg();
                self.local.push_back(LocalMsg {
                    hdr,
                    payload,
                    purpose: Purpose::Response,
                    from_sibling: true,
                });
            }
        }
        self.process(now);
    }

    /// How the gateways of the routes are watched (`routing:`'s module parameters).
    pub fn gateway_health(&self) -> crate::GatewayHealthConfig {
        self.paths.gateways.config()
    }

    /// Changes how the gateways are watched, at run time (see `Gateways::set_config`).
    pub fn set_gateway_health(&mut self, now: Instant, cfg: crate::GatewayHealthConfig) {
        self.advance(now);
        self.paths.gateways.set_config(cfg, now);
    }

    /// The route table.
    pub fn routes(&self) -> &RouteTable {
        &self.paths.routes
    }

    /// Whether a route may be used now, as far as this runtime knows (a route through a
    /// sibling's gateway: `None`).
    pub fn route_state(&self, r: &RouteConfig) -> Option<bool> {
        self.paths
            .gateways
            .is_gateway(r.gateway)
            .then(|| self.paths.gateways.route_alive(r))
    }

    /// The gateways this runtime watches.
    pub fn gateways(&self) -> Vec<GatewayInfo> {
        self.paths.gateways.info()
    }
}

impl Ni {
    fn new(c: &NiConfig, lnd: Box<dyn Lnd>) -> Ni {
        let (credits, peer_credits) = c.effective_credits();
        Ni {
            nid: c.nid,
            credits,
            peer_credits,
            lnd,
            tx_credits: i64::from(credits),
            min_tx_credits: i64::from(credits),
            delayed: VecDeque::new(),
            send_count: 0,
            recv_count: 0,
            drop_count: 0,
            peer_timeout: c.peer_timeout,
            peer_limit: c.peer_limit,
            peers: 0,
            rtr_credits: c.effective_rtr_credits(),
            health: crate::health::Health::default(),
            hstats: crate::health::NiHealthStats::default(),
        }
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
            bulk: None,
            payload: vec![0; len],
            len,
            purpose: Purpose::Response,
            peer_credit: false,
            ni_credit: false,
            retries: 0,
            born: Instant::ZERO,
            rendezvous: false,
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

#[cfg(test)]
mod trim_tests {
    use super::*;
    use crate::{NiConfig, NodeConfig};

    /// The review of the trim: a queue left in the band a pass does not shrink (room above the
    /// floor, more than a quarter used: here 600 events the user has not taken, in room for
    /// 2,048) re-armed the pass after every pass, so an idle node kept a 5 s timer for ever.
    #[test]
    fn a_table_a_pass_leaves_alone_does_not_keep_the_node_awake() {
        let nid: Nid = "10.0.0.1@o2ib".parse().unwrap();
        let mut now = Instant::from_secs(1);
        let mut n = LnetNode::new(NodeConfig::new(vec![NiConfig::new(nid, 7)]), now);
        let lo: Nid = "0@lo".parse().unwrap();
        for _ in 0..1100 {
            n.ping(now, lo, Duration::from_secs(5)).unwrap();
        }
        while n.events.len() > 600 {
            n.poll_event();
        }
        assert!(n.events.capacity() > TRIM_FLOOR, "{}", n.events.capacity());
        let mut passes = 0;
        for _ in 0..40 {
            let Some(t) = n.poll_timeout() else { break };
            now = t;
            if n.timers.trim_at() == Some(t) {
                passes += 1;
            }
            n.handle_timeout(now);
        }
        assert_eq!(n.poll_timeout(), None, "after {passes} trim passes");
        assert!(passes <= 2, "{passes} trim passes");
    }
}
