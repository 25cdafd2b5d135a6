//! [`LnetNode`]: the NIs, the send path with its credits, local delivery, the receive path and
//! the ping service.

use crate::health::{HStatus, MAX_HEALTH};
use std::collections::{BTreeMap, HashMap, VecDeque};

use lnd::handle::{Handle, HandleSlab, Tag};
use lnd::iface::{BulkSend, DownReason, Lnd, LndEvent, RxToken, SendError, TxError};
use lnd::time::{Duration, Instant};
use lnd::trim::{Capacity, CapacityReport, Trim, TRIM_FLOOR, TRIM_FLOOR_SMALL, TRIM_INTERVAL};
use lnd::wire::lnet::{LNET_HDR_LEN, LNET_MTU, LNET_PING_MATCHBITS, LNET_RESERVED_PORTAL};
use lnd::wire::{LnetBody, LnetHdr, Net, Nid, WireHandle};
use tracing::{debug, trace, warn};

use crate::alive::{self, NetAlive};
use crate::config::{NiConfig, NodeConfig};
use crate::error::LnetError;
use crate::forward::{
    ForwardStats, FwdDrop, FwdKey, HandedForward, Handover, PoolClass, PoolInfo, Pools, RoutingInfo,
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
mod pinger;
mod pings;
mod receive;
mod recovery;
mod send;
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
    /// A message handed to LNet at `born`, holding no credit yet, with nothing to carry: the
    /// caller adds its payload or bulk memory and its length.
    fn new(peer: Nid, ni: usize, hdr: LnetHdr, purpose: Purpose, born: Instant) -> OutMsg {
        OutMsg {
            peer,
            ni,
            hdr,
            payload: Vec::new(),
            bulk: None,
            len: 0,
            purpose,
            peer_credit: false,
            ni_credit: false,
            retries: 0,
            born,
            rendezvous: false,
        }
    }

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
        let id = self.next_msg_id();
        let hdr = self.put_hdr(
            self.src_nid(route),
            dst,
            payload.len() as u32,
            portal,
            match_bits,
        );
        self.launch(route, hdr, payload, Purpose::Put(id));
        self.process(now);
        Ok(id)
    }

    /// The id of the next PUT or GET the user sends.
    fn next_msg_id(&mut self) -> MsgId {
        let id = MsgId(self.next_msg);
        self.next_msg += 1;
        id
    }

    /// The header of a PUT of ours (from our PID, no ACK), as the user's sends build it.
    fn put_hdr(&self, src: Nid, dst: Nid, len: u32, portal: u32, match_bits: u64) -> LnetHdr {
        LnetHdr {
            src_pid: self.pid,
            ..LnetHdr::put(src, dst, len, portal, match_bits)
        }
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
        let hdr = LnetHdr::put(a, a, len as u32, 4, 0);
        OutMsg {
            payload: vec![0; len],
            len,
            ..OutMsg::new(a, 0, hdr, Purpose::Response, Instant::ZERO)
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
