//! The `verbs` fabric: rdma_cm + ibverbs RC queue pairs (feature `verbs`). Needs an RDMA device
//! (a NIC, or Soft-RoCE `rdma_rxe`); without one [`VerbsFabric::new`] returns a clear error.
//!
//! Same driver shape as the tcp fabric: one [`VerbsFabric`] per NI event loop, single-threaded;
//! drain [`Endpoint::poll_action`](crate::engine::Endpoint::poll_action) into [`VerbsFabric::apply`], then call [`VerbsFabric::poll`],
//! which posts the send-queue work queued by `apply` (one chain per connection), busy-polls for
//! its budget (`VerbsConfig::busy_poll`), then blocks in poll(2) on the cm event channel, every connection's
//! completion channel and the waker, and feeds the endpoint what happened.
//! [`turn`] / [`run_endpoint`] are that loop (clock read only there, via [`MonotonicClock`]).
//!
//! | engine action / input    | verbs fabric                                                          |
//! |--------------------------|-----------------------------------------------------------------------|
//! | `Connect`                | cm_id (RDMA_PS_TCP), rdma_resolve_addr (5 s), rdma_resolve_route (5 s), then comp channel, CQ, RC QP on the device's PD, receive + send buffers, post `recv_slots` receives, rdma_connect(CONNREQ) |
//! | `handle_connect_request` | RDMA_CM_EVENT_CONNECT_REQUEST on the listener, with its private data |
//! | `Accept` / `Reject`      | resources as above + rdma_accept(CONNACK) / rdma_reject(reject bytes), then the id is destroyed |
//! | `handle_established`     | RDMA_CM_EVENT_ESTABLISHED (active: with the CONNACK private data)    |
//! | `handle_connect_failed`  | ADDR/ROUTE_ERROR, UNREACHABLE: `Unreachable`; REJECTED: reason 28 (consumer defined) `Rejected(private)`, 8 `NoListener`, 10 `StaleConn`; CONNECT_ERROR and failures to set up: `Error` |
//! | `PostRecv`               | ibv_post_recv of 4 KiB slot `slot` of the receive buffers            |
//! | `Send`                   | copy into a free 4 KiB send buffer, IBV_WR_SEND signaled; the Vec goes back to the engine (`Endpoint::recycle`) at the next `poll` |
//! | `RdmaWrite`              | one IBV_WR_RDMA_WRITE (one SGE, signaled) per piece where a local and a remote fragment overlap, from regions registered here (`impl Registry`); it completes once, when its last piece has, with the first failure |
//! | `handle_send_complete`   | send or write completion: SUCCESS, WR_FLUSH_ERR `Flushed`, RETRY_EXC_ERR `RetryExceeded`, others (REM_ACCESS_ERR, LOC_PROT_ERR, RNR) `Error` |
//! | `handle_recv`            | receive completion (those arriving before ESTABLISHED are parked and replayed after it) |
//! | `Disconnect`             | post what is queued, then rdma_disconnect                            |
//! | `handle_disconnected`    | RDMA_CM_EVENT_DISCONNECTED: `Closed` after the peer's DREQ or ours; `TransportError` (or `ProtocolError`, a message longer than a slot) once the QP went to error (a failed completion, a refused post) and we broke the connection; DEVICE_REMOVAL: `TransportError` |
//! | `Destroy`                | destroy QP, CQ, cm_id, free the connection's buffers (in that order) |
//!
//! # Send queue
//!
//! Sends and RDMA writes are queued per connection by `apply` and posted by the next `poll` as
//! one chain of work requests per connection (one doorbell), in the order the engine emitted
//! them, so completions come back in that order and a send queued behind a write reaches the
//! peer after the write's data is in place (RC ordering). At most the send queue's capacity is
//! outstanding; the rest waits in the connection's backlog and is posted as completions free
//! room. A write that falls outside its local region (or names one this fabric does not hold)
//! completes with `Error` without reaching the device; one outside the peer's region fails at
//! the peer's HCA (REM_ACCESS_ERR, `Error`) and puts the queue pair in error.
//!
//! # Sizing (o2iblnd, reference 3.1)
//!
//! Queue depth = (`recv_slots` - 2) / 2; receive WRs = `recv_slots` (2 x queue depth + 2); message
//! buffers = the same number; send WRs = messages + queue depth x [`VerbsConfig::max_frags`]
//! (o2iblnd's (1 + max_frags) x queue depth, room for every fragment of every RDMA descriptor
//! in flight); CQ entries = receive + send WRs. When that exceeds the device's `max_qp_wr` (or
//! `max_cqe`), or creating the QP fails with ENOMEM, the RDMA share of the send queue shrinks
//! (halved, down to none; counted in `qp_shrinks`). o2iblnd reduces the queue depth instead, but
//! ours is already negotiated by the engine when the QP is made; a smaller RDMA share only means
//! writes wait in the backlog.
//!
//! # Registered memory
//!
//! One protection domain per device, shared by every connection and region of the fabric (o2iblnd
//! keeps one per HCA). `impl Registry for VerbsFabric` registers a buffer (ibv_reg_mr with
//! LOCAL_WRITE | REMOTE_WRITE) on the NI's device and returns a [`Registration`] (region id,
//! rkey, address) a peer writes to; `read` copies its bytes out; `deregister` copies them back
//! and drops the fabric's hold (ibv_dereg_mr happens once no posted
//! write reads from it any more). [`VerbsFabric::rdma_write`] posts a write on behalf of a test,
//! as the simulator's `World::rdma_write` does (the engine does not drive bulk data yet).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use slab::Slab;
use tracing::{debug, trace, warn};

use crate::driver::Doorbell;
use crate::fabric::{
    check_rdma_write, rdma_pieces, ConnId, ConnectFailure, DisconnectReason, Fabric, FabricAction,
    FabricSink, LocalFrag, PrivateData, RegionId, Registration, Registry, RemoteFrag, RemoteRegion,
    RequestId, SharedMem, WcStatus, WrId,
};
use crate::handle::{Handle, HandleSlab, Tag};
use crate::sys::verbs::{
    self as v, CmEvent, CmEventKind, CmId, CompChannel, CompletionQueue, ConnParam, DeviceLimits,
    DeviceList, EventChannel, MemoryRegion, ProtectionDomain, SendOp, SendWr, Wc,
};
use crate::time::Instant;
use crate::wire::kib::{MAX_RDMA_FRAGS, MSG_SIZE};
use crate::wire::Nid;

pub use crate::driver::{run_endpoint, turn, MonotonicClock};

/// The verbs fabric's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Where the listener binds (o2iblnd's `service` port is 987).
    pub listen: SocketAddr,
    /// Bound on address resolution and on route resolution, each (5 s, RDMA_RESOLVE_TIMEOUT).
    pub resolve_timeout: std::time::Duration,
    /// rdma_connect / rdma_accept retry_count (5) and rnr_retry_count (6).
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// How long `poll` busy-polls the CQs and the cm channel before it arms the CQs and blocks
    /// in poll(2) (default 50 us, as the tcp fabric; zero: never spin). Waking from the
    /// completion channel costs tens of microseconds, more than the next completion on a busy
    /// link; the budget bounds what an idle link burns per loop turn.
    pub busy_poll: std::time::Duration,
    /// Listen backlog.
    pub backlog: i32,
    /// RDMA fragments per message the send queue has room for (IBLND_MAX_RDMA_FRAGS, 257): send
    /// WRs = messages + queue depth x `max_frags`, reduced to what the device allows.
    pub max_frags: u16,
    /// Most work requests posted in one chain (one ibv_post_send).
    pub max_chain: usize,
}

impl Default for VerbsConfig {
    fn default() -> VerbsConfig {
        VerbsConfig {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 987),
            resolve_timeout: std::time::Duration::from_secs(5),
            retry_count: 5,
            rnr_retry_count: 6,
            busy_poll: std::time::Duration::from_micros(50),
            backlog: 256,
            max_frags: MAX_RDMA_FRAGS as u16,
            max_chain: 64,
        }
    }
}

/// Why a verbs fabric could not start.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error("no RDMA device: ibv_get_device_list found none; fabric: verbs needs an RDMA NIC or Soft-RoCE (rdma_rxe)")]
    NoDevice,
    #[error("verbs fabric: {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> VerbsError {
    move |source| VerbsError::Io { what, source }
}

/// Counters. All only grow, except `regions` (a gauge).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerbsStats {
    pub connects: u64,
    pub connect_failures: u64,
    pub requests: u64,
    pub accepts: u64,
    pub rejects_sent: u64,
    pub rejects_received: u64,
    pub established: u64,
    pub disconnects: u64,
    pub msgs_tx: u64,
    pub msgs_rx: u64,
    pub early_rx: u64,
    pub send_errors: u64,
    pub recv_errors: u64,
    pub setup_errors: u64,
    pub unknown_actions: u64,
    pub bad_sends: u64,
    pub stale_events: u64,
    /// RDMA writes posted, and their bytes.
    pub rdma_writes: u64,
    pub rdma_write_bytes: u64,
    /// RDMA writes that completed with an error other than a flush, or were refused before
    /// reaching the device (outside their local region, unknown region).
    pub rdma_write_errors: u64,
    /// Regions registered, deregistered, and held now (gauge).
    pub regions_registered: u64,
    pub regions_deregistered: u64,
    pub regions: u64,
    /// ibv_post_send calls, and the work requests they carried.
    pub doorbells: u64,
    pub wrs_posted: u64,
    /// Times a connection's send queue was full and work waited in its backlog.
    pub sq_full: u64,
    /// Queue pairs made with a smaller RDMA share of the send queue than asked for.
    pub qp_shrinks: u64,
}

impl VerbsStats {
    /// Every counter under its field name.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("connects", self.connects),
            ("connect_failures", self.connect_failures),
            ("requests", self.requests),
            ("accepts", self.accepts),
            ("rejects_sent", self.rejects_sent),
            ("rejects_received", self.rejects_received),
            ("established", self.established),
            ("disconnects", self.disconnects),
            ("msgs_tx", self.msgs_tx),
            ("msgs_rx", self.msgs_rx),
            ("early_rx", self.early_rx),
            ("send_errors", self.send_errors),
            ("recv_errors", self.recv_errors),
            ("setup_errors", self.setup_errors),
            ("unknown_actions", self.unknown_actions),
            ("bad_sends", self.bad_sends),
            ("stale_events", self.stale_events),
            ("rdma_writes", self.rdma_writes),
            ("rdma_write_bytes", self.rdma_write_bytes),
            ("rdma_write_errors", self.rdma_write_errors),
            ("regions_registered", self.regions_registered),
            ("regions_deregistered", self.regions_deregistered),
            ("regions", self.regions),
            ("doorbells", self.doorbells),
            ("wrs_posted", self.wrs_posted),
            ("sq_full", self.sq_full),
            ("qp_shrinks", self.qp_shrinks),
        ]
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    ResolvingAddr,
    ResolvingRoute,
    Connecting,
    /// Passive: request handed to the engine.
    RequestPending,
    Accepting,
    Established,
    Closing,
}

/// Verbs resources of one connection, released in `Destroy` order: QP, CQ, cm_id, buffers.
struct Resources {
    cq: Arc<CompletionQueue>,
    chan: Arc<CompChannel>,
    rx: Arc<MemoryRegion>,
    tx: Arc<MemoryRegion>,
}

/// What a send-queue entry does once posted.
enum SqOp {
    /// A message in send buffer `buf`, `len` bytes.
    Send { buf: u16, len: u32 },
    /// An RDMA write of `len` bytes in `pieces` (where a local and a remote fragment overlap),
    /// one work request each; it completes once, when every piece has (`left` still to
    /// complete), with the first failure among them.
    Write {
        pieces: Vec<WritePiece>,
        len: u32,
        left: usize,
        status: WcStatus,
    },
}

/// One work request of an RDMA write: `len` bytes at `offset` of `local` to `remote`.
struct WritePiece {
    local: Arc<MemoryRegion>,
    offset: usize,
    len: u32,
    remote: RemoteRegion,
}

/// A send or write of one connection, from `apply` until its completion.
struct SqEntry {
    wr: WrId,
    op: SqOp,
}

struct VConn {
    id: Option<CmId>,
    res: Option<Resources>,
    conn: Option<ConnId>,
    phase: Phase,
    active: bool,
    private: PrivateData,
    recv_slots: u16,
    /// Free send buffers.
    free_tx: Vec<u16>,
    /// Sends and writes not yet completed (slab key = the work request's wr_id).
    sq: Slab<SqEntry>,
    /// Keys of `sq` entries not yet posted, in the engine's order.
    /// Work requests to post, in order: (slab key, piece of a write; 0 for a send).
    backlog: VecDeque<(usize, usize)>,
    /// Send-queue capacity and work requests posted and not completed.
    sq_cap: usize,
    sq_posted: usize,
    reported_up: bool,
    reported_down: bool,
    /// Why the QP went to error, if it did (a failed completion, a work request the device
    /// refused): the reason its disconnect is reported with, instead of a close.
    broken: Option<DisconnectReason>,
    early: Vec<(u16, Vec<u8>)>,
}

#[derive(Copy, Clone, Debug)]
enum Report {
    SendDone(ConnId, WrId, WcStatus),
    Disconnected(ConnId, DisconnectReason),
    ConnectFailed(ConnId, ConnectFailure),
}

type Resolver = Box<dyn Fn(Nid) -> Option<SocketAddr> + Send>;

const LISTENER: u64 = u64::MAX;

/// The verbs fabric of one NI (see the module doc).
pub struct VerbsFabric {
    // Field order = drop order: connections (their QPs and ids) before the regions, the listener,
    // the channel, and the PDs (which keep the device list open).
    conns: HandleSlab<VConn, VConnTag>,
    regions: HashMap<u64, Arc<MemoryRegion>>,
    /// Held until the fabric is dropped or abandoned: its events carry the `LISTENER` token.
    listener: Option<CmId>,
    ch: EventChannel,
    devices: Arc<DeviceList>,
    /// One PD per device (index in `devices`), made on first use.
    pds: Vec<Option<Arc<ProtectionDomain>>>,
    limits: Vec<Option<DeviceLimits>>,
    /// The NI's device: the listener's, else the first.
    home: usize,
    local: SocketAddr,
    resolver: Resolver,
    cfg: VerbsConfig,
    next_region: u64,
    next_injected: u64,
    /// Writes posted with `rdma_write`: their connection and, once completed, their status.
    injected: HashMap<u64, (ConnId, Option<WcStatus>)>,
    by_conn: HashMap<ConnId, VConnId>,
    out: VecDeque<Report>,
    /// Connections with work in their backlog.
    dirty: Vec<VConnId>,
    wcs: Vec<Wc>,
    /// Completions polled (by connection) and not yet handed to the engine.
    pending: Vec<(VConnId, Wc)>,
    stats: VerbsStats,
    /// Where a received message is copied out of its slot before the engine sees it.
    rx_scratch: Vec<u8>,
    /// Connections whose work the device refused: disconnected after the current flush.
    to_break: Vec<ConnId>,
    /// A descriptor whose readability ends a blocking wait (see `Driver::set_waker`).
    waker: Option<std::os::fd::RawFd>,
    /// The waker's flags, looked at in every busy-poll round (see `Driver::set_doorbell`).
    bell: Option<Doorbell>,
    /// The poll(2) saw the waker readable since the owner last asked (`Driver::take_woken`):
    /// the loop reads the waker only then, not every turn.
    woken: bool,
    /// Message buffers of applied sends (copied into registered memory), given back to the
    /// engine at the next `poll` (`Endpoint::recycle`).
    spare: Vec<Vec<u8>>,
}

/// The tag of [`VConnId`].
#[derive(Debug)]
enum VConnTag {}

impl Tag for VConnTag {
    const NAME: &'static str = "vconn";
}

/// A connection's (or pending request's) handle: its slot in `VerbsFabric::conns` and the
/// generation of the connection there. Its `as_u64` is the cm_id's context (the token its events
/// carry) and the `RequestId` of a connect request, so an event for a connection already gone is
/// recognised (`stale_events`) and never reaches the next one in its slot. Generation 0 is never
/// live: the 0 a cm_id is created with, before it has its token, names nothing.
type VConnId = Handle<VConnTag>;

/// Why a connection whose receive completed with error `status` (not a flush) is broken: a
/// message longer than a slot is the peer breaking the protocol, anything else the transport.
fn recv_error_reason(status: u32) -> DisconnectReason {
    match status {
        v::wc::LOC_LEN_ERR => DisconnectReason::ProtocolError,
        _ => DisconnectReason::TransportError,
    }
}

fn wc_status(status: u32) -> WcStatus {
    match status {
        v::wc::SUCCESS => WcStatus::Success,
        v::wc::WR_FLUSH_ERR => WcStatus::Flushed,
        v::wc::RETRY_EXC_ERR => WcStatus::RetryExceeded,
        _ => WcStatus::Error,
    }
}

/// Send-queue and CQ sizes for a connection of queue depth `qd` (see the module doc): (send
/// WRs, RDMA share per queue-depth unit), within `limits`.
fn sq_size(qd: u32, msgs: u32, max_frags: u32, limits: Option<DeviceLimits>) -> (u32, u32) {
    let mut frags = max_frags;
    if let Some(l) = limits {
        let fits = |f: u32| {
            let send = msgs + qd * f;
            send <= l.max_qp_wr && send + msgs <= l.max_cqe
        };
        while frags > 0 && !fits(frags) {
            frags /= 2;
        }
    }
    (msgs + qd * frags, frags)
}

impl VerbsFabric {
    /// Opens the event channel and listens on `cfg.listen`; `resolver` maps a peer NID to the
    /// address (IP and port) its fabric listens on.
    pub fn new(
        cfg: VerbsConfig,
        resolver: impl Fn(Nid) -> Option<SocketAddr> + Send + 'static,
    ) -> Result<VerbsFabric, VerbsError> {
        if v::device_count() == 0 {
            return Err(VerbsError::NoDevice);
        }
        let devices = DeviceList::new().map_err(io_err("rdma_get_devices"))?;
        if devices.is_empty() {
            return Err(VerbsError::NoDevice);
        }
        let ch = EventChannel::new().map_err(io_err("rdma_create_event_channel"))?;
        let mut listener = CmId::new(&ch, LISTENER).map_err(io_err("rdma_create_id"))?;
        listener
            .bind(cfg.listen)
            .map_err(io_err("rdma_bind_addr"))?;
        listener
            .listen(cfg.backlog)
            .map_err(io_err("rdma_listen"))?;
        let local = SocketAddr::new(cfg.listen.ip(), listener.src_port());
        let home = listener
            .device_key()
            .and_then(|k| devices.index_of(k))
            .unwrap_or(0);
        let n = devices.len();
        let mut f = VerbsFabric {
            conns: HandleSlab::new(),
            regions: HashMap::new(),
            listener: Some(listener),
            ch,
            devices,
            pds: vec![None; n],
            limits: vec![None; n],
            home,
            local,
            resolver: Box::new(resolver),
            cfg,
            next_region: 0,
            next_injected: 0,
            injected: HashMap::new(),
            by_conn: HashMap::new(),
            out: VecDeque::new(),
            dirty: Vec::new(),
            wcs: Vec::new(),
            pending: Vec::new(),
            stats: VerbsStats::default(),
            rx_scratch: Vec::with_capacity(MSG_SIZE),
            to_break: Vec::new(),
            waker: None,
            bell: None,
            woken: false,
            spare: Vec::new(),
        };
        f.pd(home).map_err(io_err("ibv_alloc_pd"))?;
        Ok(f)
    }

    /// The listening address (port resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn stats(&self) -> &VerbsStats {
        &self.stats
    }

    pub fn config(&self) -> &VerbsConfig {
        &self.cfg
    }

    /// Changes how long `poll` busy-polls before blocking (a latency-for-CPU trade).
    pub fn set_busy_poll(&mut self, budget: std::time::Duration) {
        self.cfg.busy_poll = budget;
    }

    /// Connections and pending requests held.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// The name of the NI's device (e.g. `rxe0`).
    pub fn device_name(&self) -> String {
        self.devices.name(self.home).unwrap_or_default()
    }

    /// The send-queue capacity of `conn` (0 if it has no queue pair).
    pub fn send_queue_capacity(&self, conn: ConnId) -> usize {
        self.lookup(conn).map_or(0, |k| self.conns[k].sq_cap)
    }

    fn pd(&mut self, dev: usize) -> io::Result<Arc<ProtectionDomain>> {
        if let Some(Some(pd)) = self.pds.get(dev) {
            return Ok(Arc::clone(pd));
        }
        let pd = self.devices.alloc_pd(dev)?;
        if let Some(slot) = self.pds.get_mut(dev) {
            *slot = Some(Arc::clone(&pd));
        }
        Ok(pd)
    }

    fn device_limits(&mut self, dev: usize) -> Option<DeviceLimits> {
        if let Some(Some(l)) = self.limits.get(dev) {
            return Some(*l);
        }
        match self.devices.limits(dev) {
            Ok(l) => {
                if let Some(slot) = self.limits.get_mut(dev) {
                    *slot = Some(l);
                }
                Some(l)
            }
            Err(e) => {
                debug!(error = %e, "verbs fabric: ibv_query_device");
                None
            }
        }
    }

    fn param(&self) -> ConnParam {
        ConnParam {
            retry_count: self.cfg.retry_count,
            rnr_retry_count: self.cfg.rnr_retry_count,
        }
    }

    fn timeout_ms(&self) -> i32 {
        i32::try_from(self.cfg.resolve_timeout.as_millis()).unwrap_or(i32::MAX)
    }

    fn new_vconn(&mut self, id: Option<CmId>, phase: Phase, active: bool) -> VConnId {
        let vc = self.conns.insert(VConn {
            id,
            res: None,
            conn: None,
            phase,
            active,
            private: PrivateData::EMPTY,
            recv_slots: 0,
            free_tx: Vec::new(),
            sq: Slab::new(),
            backlog: VecDeque::new(),
            sq_cap: 0,
            sq_posted: 0,
            reported_up: false,
            reported_down: false,
            broken: None,
            early: Vec::new(),
        });
        if let Some(id) = self.conns[vc].id.as_mut() {
            id.set_token(vc.as_u64());
        }
        vc
    }

    fn lookup(&self, conn: ConnId) -> Option<VConnId> {
        self.by_conn.get(&conn).copied()
    }

    // ------------------------------------------------------------------ registered memory

    fn region_of(&self, reg: &Registration) -> Option<&Arc<MemoryRegion>> {
        self.regions.get(&reg.id().0)
    }

    /// Copies `data` into a region at `offset` (do not change a range a posted write reads).
    pub fn write_region(&self, reg: &Registration, offset: usize, data: &[u8]) -> bool {
        let Some(r) = self.region_of(reg) else {
            return false;
        };
        if offset.checked_add(data.len()).is_none_or(|e| e > r.len()) {
            return false;
        }
        r.write(offset, data);
        true
    }

    /// Posts an RDMA write on `conn` as if the engine had emitted [`FabricAction::RdmaWrite`]
    /// (the engine does not drive bulk data yet): the fragments `local` onto the fragments
    /// `remote` on the peer. Its status is kept for [`VerbsFabric::rdma_status`] /
    /// [`VerbsFabric::take_rdma_completions`] and also handed to the endpoint, which ignores a
    /// WrId it does not know. A write on a connection this fabric does not know is counted in
    /// `unknown_actions` and never completes.
    pub fn rdma_write(&mut self, conn: ConnId, local: &[LocalFrag], remote: &[RemoteFrag]) -> WrId {
        self.next_injected += 1;
        let wr = WrId::injected(self.next_injected);
        if self.lookup(conn).is_some() {
            self.injected.insert(wr.0, (conn, None));
        }
        self.write(conn, wr, local, remote);
        wr
    }

    /// How write `wr` (from [`VerbsFabric::rdma_write`]) completed; `None` while it has not (or
    /// if its connection was destroyed first).
    pub fn rdma_status(&self, wr: WrId) -> Option<WcStatus> {
        self.injected.get(&wr.0)?.1
    }

    /// Every completed write from [`VerbsFabric::rdma_write`] not taken yet, forgetting them.
    pub fn take_rdma_completions(&mut self) -> Vec<(WrId, WcStatus)> {
        let done: Vec<(WrId, WcStatus)> = self
            .injected
            .iter()
            .filter_map(|(&wr, &(_, st))| st.map(|st| (WrId(wr), st)))
            .collect();
        for (wr, _) in &done {
            self.injected.remove(&wr.0);
        }
        done
    }

    /// Writes from [`VerbsFabric::rdma_write`] not completed yet.
    pub fn rdma_in_flight(&self) -> usize {
        self.injected
            .values()
            .filter(|(_, st)| st.is_none())
            .count()
    }

    // ------------------------------------------------------------------ engine actions

    /// Applies one engine action; results are reported by the next [`VerbsFabric::poll`].
    pub fn apply(&mut self, now: Instant, action: FabricAction) {
        trace!(%now, ?action, "verbs fabric apply");
        Fabric::apply(self, now, action);
    }

    fn connect(&mut self, conn: ConnId, peer: Nid, private: PrivateData, recv_slots: u16) {
        self.stats.connects += 1;
        let fail = |f: &mut VerbsFabric, why| {
            f.stats.connect_failures += 1;
            f.out.push_back(Report::ConnectFailed(conn, why));
        };
        let Some(addr) = (self.resolver)(peer) else {
            debug!(%peer, "verbs fabric: no address for peer");
            return fail(self, ConnectFailure::Unreachable);
        };
        let id = match CmId::new(&self.ch, 0) {
            Ok(id) => id,
            Err(e) => {
                debug!(error = %e, "verbs fabric: rdma_create_id");
                return fail(self, ConnectFailure::Error);
            }
        };
        let vc = self.new_vconn(Some(id), Phase::ResolvingAddr, true);
        let tmo = self.timeout_ms();
        let c = &mut self.conns[vc];
        c.conn = Some(conn);
        c.private = private;
        c.recv_slots = recv_slots;
        self.by_conn.insert(conn, vc);
        if let Err(e) =
            c.id.as_mut()
                .map_or(Ok(()), |id| id.resolve_addr(addr, tmo))
        {
            debug!(%peer, %addr, error = %e, "verbs fabric: rdma_resolve_addr");
            self.conns[vc].reported_down = true;
            fail(self, ConnectFailure::Unreachable);
        }
    }

    /// Completion channel, CQ, QP on the device's PD, buffers; posts receives 0..recv_slots.
    fn setup(&mut self, vc: VConnId) -> io::Result<()> {
        let dev = {
            let c = &self.conns[vc];
            let id = c.id.as_ref().ok_or_else(|| io::Error::other("no cm_id"))?;
            let dk = id
                .device_key()
                .ok_or_else(|| io::Error::other("cm_id has no device"))?;
            self.devices
                .index_of(dk)
                .ok_or_else(|| io::Error::other("cm_id on a device librdmacm did not list"))?
        };
        let pd = self.pd(dev)?;
        let limits = self.device_limits(dev);
        let max_frags = u32::from(self.cfg.max_frags);
        let c = &mut self.conns[vc];
        let id = c.id.as_mut().ok_or_else(|| io::Error::other("no cm_id"))?;
        let recv_wr = u32::from(c.recv_slots.max(2));
        let qd = (recv_wr.saturating_sub(2) / 2).max(1);
        let msgs = recv_wr;
        let (mut send_wr, mut frags) = sq_size(qd, msgs, max_frags, limits);
        let mut shrunk = frags < max_frags;
        let chan = id.comp_channel()?;
        let (cq, caps) = loop {
            let cq = id.create_cq(recv_wr + send_wr, &chan)?;
            match id.create_qp(&pd, &cq, send_wr, recv_wr) {
                Ok(caps) => break (cq, caps),
                Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && frags > 0 => {
                    frags /= 2;
                    send_wr = msgs + qd * frags;
                    shrunk = true;
                    debug!(
                        send_wr,
                        "verbs fabric: QP refused (ENOMEM), shrinking its send queue"
                    );
                }
                Err(e) => return Err(e),
            }
        };
        if shrunk {
            self.stats.qp_shrinks += 1;
        }
        let rx = MemoryRegion::new(&pd, recv_wr as usize * MSG_SIZE, false)?;
        let tx = MemoryRegion::new(&pd, msgs as usize * MSG_SIZE, false)?;
        for slot in 0..c.recv_slots {
            id.post_recv(
                &rx,
                usize::from(slot) * MSG_SIZE,
                MSG_SIZE as u32,
                u64::from(slot),
            )?;
        }
        cq.req_notify()?;
        c.free_tx = (0..msgs as u16).rev().collect();
        // What we asked for, not what the provider rounded it up to: the CQ was sized from the
        // request, and every work request is signaled, so posting beyond it could overrun the CQ.
        c.sq_cap = send_wr.min(caps.send_wr) as usize;
        c.res = Some(Resources { cq, chan, rx, tx });
        trace!(
            qd,
            recv_wr,
            send_wr = caps.send_wr,
            frags,
            "verbs fabric: queue pair made"
        );
        Ok(())
    }

    fn accept(&mut self, req: RequestId, conn: ConnId, private: PrivateData, recv_slots: u16) {
        let vc = VConnId::from_u64(req.0);
        let ok = self
            .conns
            .get(vc)
            .is_some_and(|c| c.phase == Phase::RequestPending);
        if !ok {
            self.stats.unknown_actions += 1;
            self.out
                .push_back(Report::ConnectFailed(conn, ConnectFailure::Error));
            return;
        }
        self.stats.accepts += 1;
        {
            let c = &mut self.conns[vc];
            c.conn = Some(conn);
            c.recv_slots = recv_slots;
            c.phase = Phase::Accepting;
        }
        self.by_conn.insert(conn, vc);
        let param = self.param();
        let r = self.setup(vc).and_then(|()| {
            let c = &mut self.conns[vc];
            c.id.as_mut()
                .map_or(Ok(()), |id| id.accept(private.as_bytes(), param))
        });
        if let Err(e) = r {
            debug!(error = %e, "verbs fabric: accept failed");
            self.stats.setup_errors += 1;
            self.conns[vc].reported_down = true;
            self.out
                .push_back(Report::Disconnected(conn, DisconnectReason::TransportError));
        }
    }

    fn reject(&mut self, req: RequestId, private: PrivateData) {
        let vc = VConnId::from_u64(req.0);
        let ok = self
            .conns
            .get(vc)
            .is_some_and(|c| c.phase == Phase::RequestPending);
        if !ok {
            self.stats.unknown_actions += 1;
            return;
        }
        self.stats.rejects_sent += 1;
        let mut c = self.conns.remove(vc).expect("the request was just found");
        if let Some(id) = c.id.as_mut() {
            if let Err(e) = id.reject(private.as_bytes()) {
                debug!(error = %e, "verbs fabric: rdma_reject");
            }
        }
    }

    fn post_recv(&mut self, conn: ConnId, slot: u16) {
        let Some(vc) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let c = &mut self.conns[vc];
        let (Some(id), Some(res)) = (c.id.as_mut(), c.res.as_ref()) else {
            return;
        };
        if let Err(e) = id.post_recv(
            &res.rx,
            usize::from(slot) * MSG_SIZE,
            MSG_SIZE as u32,
            u64::from(slot),
        ) {
            debug!(?conn, slot, error = %e, "verbs fabric: ibv_post_recv");
            self.stats.recv_errors += 1;
        }
    }

    /// True if `c` can take send-queue work.
    fn usable(c: &VConn) -> bool {
        c.res.is_some()
            && matches!(
                c.phase,
                Phase::Established | Phase::Accepting | Phase::Connecting
            )
    }

    fn send(&mut self, conn: ConnId, wr: WrId, bytes: &[u8]) {
        let Some(vc) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        if bytes.is_empty() || bytes.len() > MSG_SIZE {
            self.stats.bad_sends += 1;
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Error));
            return;
        }
        let c = &mut self.conns[vc];
        if !Self::usable(c) {
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Flushed));
            return;
        }
        let Some(buf) = c.free_tx.pop() else {
            self.stats.send_errors += 1;
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Error));
            return;
        };
        if let Some(res) = c.res.as_ref() {
            res.tx.write(usize::from(buf) * MSG_SIZE, bytes);
        }
        let e = c.sq.insert(SqEntry {
            wr,
            op: SqOp::Send {
                buf,
                len: bytes.len() as u32,
            },
        });
        c.backlog.push_back((e, 0));
        self.dirty.push(vc);
    }

    fn write(&mut self, conn: ConnId, wr: WrId, local: &[LocalFrag], remote: &[RemoteFrag]) {
        let Some(vc) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let c = &mut self.conns[vc];
        if !Self::usable(c) {
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Flushed));
            return;
        }
        // The lists and the local side are checked here (the device would say LOC_PROT_ERR);
        // the remote side is the peer HCA's to check.
        let regions = &self.regions;
        let in_region = |f: &LocalFrag| {
            regions.get(&f.region.0).filter(|mr| {
                usize::try_from(f.offset)
                    .ok()
                    .and_then(|o| o.checked_add(f.len as usize))
                    .is_some_and(|end| end <= mr.len())
            })
        };
        let len = check_rdma_write(local, remote)
            .ok()
            .filter(|_| local.iter().all(|f| in_region(f).is_some()));
        let Some(len) = len else {
            debug!(
                ?conn,
                ?local,
                ?remote,
                "verbs fabric: RDMA write malformed or outside its local region"
            );
            self.stats.rdma_write_errors += 1;
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Error));
            // Caught before posting, like an ibv_post_send that fails synchronously: the QP never
            // sees it, so the connection stays usable (the tcp fabric, which has no such
            // pre-check, closes the connection instead). It completes before work posted
            // earlier may have.
            return;
        };
        // One work request per piece (one SGE each): a remote fragment split at the local
        // boundaries inside it. Each is signaled; the write completes when the last has.
        let pieces: Vec<WritePiece> = rdma_pieces(local, remote)
            .map(|p| WritePiece {
                local: Arc::clone(&regions[&p.region.0]),
                offset: p.offset as usize,
                len: p.len,
                remote: RemoteRegion {
                    key: p.key,
                    addr: p.addr,
                },
            })
            .collect();
        let n = pieces.len();
        let e = c.sq.insert(SqEntry {
            wr,
            op: SqOp::Write {
                pieces,
                len,
                left: n,
                status: WcStatus::Success,
            },
        });
        c.backlog.extend((0..n).map(|i| (e, i)));
        self.dirty.push(vc);
    }

    /// One work request of entry `k` of `sq` is done with `st`: the entry's completion once it is
    /// whole (always for a send; for a write, when its last piece is, with its first failure).
    fn retire(sq: &mut Slab<SqEntry>, k: usize, st: WcStatus) -> Option<(SqEntry, WcStatus)> {
        let e = sq.get_mut(k)?;
        if let SqOp::Write { left, status, .. } = &mut e.op {
            if *status == WcStatus::Success {
                *status = st;
            }
            *left = left.saturating_sub(1);
            if *left > 0 {
                return None;
            }
        }
        let e = sq.remove(k);
        let st = match e.op {
            SqOp::Write { status, .. } => status,
            SqOp::Send { .. } => st,
        };
        Some((e, st))
    }

    /// Posts as much of every dirty connection's backlog as its send queue has room for.
    fn flush_dirty(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for vc in dirty.drain(..) {
            self.flush(vc);
        }
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
    }

    /// Posts connection `vc`'s backlog, in chains of at most `max_chain`, within the send
    /// queue's capacity. A request the device refuses completes with `Error`.
    fn flush(&mut self, vc: VConnId) {
        let max_chain = self.cfg.max_chain.max(1);
        let Some(c) = self.conns.get_mut(vc) else {
            return;
        };
        let Some(conn) = c.conn else { return };
        let VConn {
            id,
            res,
            sq,
            backlog,
            sq_cap,
            sq_posted,
            free_tx,
            broken,
            ..
        } = c;
        let (Some(id), Some(res)) = (id.as_mut(), res.as_ref()) else {
            return;
        };
        while !backlog.is_empty() {
            let room = sq_cap.saturating_sub(*sq_posted);
            if room == 0 {
                self.stats.sq_full += 1;
                break;
            }
            let n = backlog.len().min(room).min(max_chain);
            let wrs: Vec<SendWr<'_>> = backlog
                .iter()
                .take(n)
                .map(|&(k, piece)| {
                    let e = &sq[k];
                    match &e.op {
                        SqOp::Send { buf, len } => SendWr {
                            wr_id: k as u64,
                            mr: &res.tx,
                            offset: usize::from(*buf) * MSG_SIZE,
                            len: *len,
                            op: SendOp::Send,
                        },
                        SqOp::Write { pieces, .. } => {
                            let p = &pieces[piece];
                            SendWr {
                                wr_id: k as u64,
                                mr: &p.local,
                                offset: p.offset,
                                len: p.len,
                                op: SendOp::Write {
                                    remote_addr: p.remote.addr,
                                    rkey: p.remote.key,
                                },
                            }
                        }
                    }
                })
                .collect();
            let (posted, failed) = match id.post_sends(&wrs) {
                Ok(()) => (n, None),
                Err(e) => (e.posted, Some(e.error)),
            };
            drop(wrs);
            self.stats.doorbells += 1;
            self.stats.wrs_posted += posted as u64;
            *sq_posted += posted;
            for (k, piece) in backlog.drain(..posted) {
                match &sq[k].op {
                    SqOp::Send { .. } => self.stats.msgs_tx += 1,
                    SqOp::Write { len, .. } if piece == 0 => {
                        self.stats.rdma_writes += 1;
                        self.stats.rdma_write_bytes += u64::from(*len);
                    }
                    SqOp::Write { .. } => {}
                }
            }
            if let Some(err) = failed {
                // The first request not posted fails; posting what follows it would leave a gap
                // in the stream the peer sees, so the rest flush and the connection is broken
                // (after this flush: `poll` disconnects it).
                let mut status = WcStatus::Error;
                while let Some((k, _)) = backlog.pop_front() {
                    // A write some of whose pieces are posted completes with their completions.
                    let Some((e, st)) = Self::retire(sq, k, status) else {
                        status = WcStatus::Flushed;
                        continue;
                    };
                    match e.op {
                        SqOp::Send { buf, .. } => {
                            free_tx.push(buf);
                            if status == WcStatus::Error {
                                self.stats.send_errors += 1;
                            }
                        }
                        SqOp::Write { .. } => {
                            if status == WcStatus::Error {
                                self.stats.rdma_write_errors += 1;
                            }
                        }
                    }
                    self.out.push_back(Report::SendDone(conn, e.wr, st));
                    status = WcStatus::Flushed;
                }
                warn!(?conn, error = %err,
                      "verbs fabric: ibv_post_send refused a work request; breaking the connection");
                broken.get_or_insert(DisconnectReason::TransportError);
                self.to_break.push(conn);
                break;
            }
        }
    }

    fn disconnect(&mut self, conn: ConnId) {
        let Some(vc) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        // What the engine posted before the disconnect goes first.
        self.flush(vc);
        let c = &mut self.conns[vc];
        let was = c.phase;
        c.phase = Phase::Closing;
        let r = match (was, c.id.as_mut()) {
            (Phase::Established | Phase::Accepting | Phase::Connecting, Some(id)) => {
                id.disconnect()
            }
            _ => Err(io::Error::other("not connected")),
        };
        if let Err(e) = r {
            debug!(?conn, error = %e, "verbs fabric: rdma_disconnect; reporting disconnected");
            if !c.reported_down {
                c.reported_down = true;
                let why = c.broken.unwrap_or(DisconnectReason::Closed);
                self.out.push_back(Report::Disconnected(conn, why));
            }
        }
    }

    /// The fabric failed for good and is polled no more ([`crate::driver::Driver::abandon`]):
    /// each connection is disconnected (a DREQ, so the peer learns at once rather than at its
    /// keepalive horizon: the 3FS #426 lesson) and each request not yet answered is rejected,
    /// without posting what is queued: the failed machinery is not trusted with more work.
    /// Best effort: on a dead HCA nothing leaves, and the peer's own timeouts end them. The
    /// listener is destroyed, so that a peer's later connect is refused by the CM at once (a
    /// REJ, "no listener": its sends fail ConnectRefused) instead of reaching a listener whose
    /// events nobody reads and waiting out its connect deadline, as the tcp fabric closes its
    /// listening socket. Destroying it does not wait: every event of it read was acked on the
    /// spot (`EventChannel::next_event`), and those not read are the kernel's to discard.
    pub fn abandon(&mut self) {
        drop(self.listener.take());
        for vc in self.conns.handles() {
            let c = &mut self.conns[vc];
            let was = c.phase;
            c.phase = Phase::Closing;
            let Some(id) = c.id.as_mut() else { continue };
            let r = match was {
                Phase::Established | Phase::Accepting | Phase::Connecting => id.disconnect(),
                Phase::RequestPending => id.reject(&[]),
                Phase::ResolvingAddr | Phase::ResolvingRoute | Phase::Closing => Ok(()),
            };
            if let Err(e) = r {
                debug!(error = %e, "verbs fabric: abandoning a connection");
            }
        }
    }

    fn destroy(&mut self, conn: ConnId) {
        let Some(vc) = self.by_conn.remove(&conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let mut c = self
            .conns
            .remove(vc)
            .expect("a mapped connection is in the table");
        // QP (releasing what its outstanding work pinned), then CQ and its channel, then the
        // cm_id, then the connection's buffers; the PD is the fabric's.
        if let Some(id) = c.id.as_mut() {
            id.destroy_qp();
        }
        let res = c.res.take();
        let bufs = res.map(|Resources { cq, chan, rx, tx }| {
            drop(cq);
            drop(chan);
            (rx, tx)
        });
        drop(c.id.take());
        drop(bufs);
        self.injected
            .retain(|_, (c, st)| *c != conn || st.is_some());
        self.out
            .retain(|r| !matches!(r, Report::SendDone(c, ..) | Report::Disconnected(c, _) | Report::ConnectFailed(c, _) if *c == conn));
    }

    // ------------------------------------------------------------------ driving

    /// True if `poll` has reports to deliver without waiting.
    pub fn has_work(&self) -> bool {
        !self.out.is_empty() || !self.dirty.is_empty()
    }

    /// Posts queued send-queue work, busy-polls the cm channel and every CQ for up to
    /// `busy_poll` (bounded by `timeout`), yielding between rounds so that an oversubscribed
    /// machine still runs the peer; if nothing came, arms the CQs and blocks in poll(2) for up to
    /// `timeout` (`None`: without limit), then reads the clock once with `now_fn` and feeds `sink`
    /// everything that happened.
    pub fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        sink: &mut dyn FabricSink,
        now_fn: impl Fn() -> Instant,
    ) -> io::Result<()> {
        self.flush_dirty();
        for conn in std::mem::take(&mut self.to_break) {
            self.disconnect(conn);
        }
        let mut got = !self.out.is_empty();
        let spin = timeout.map_or(self.cfg.busy_poll, |t| t.min(self.cfg.busy_poll));
        let start = std::time::Instant::now();
        let mut rounds = 0u32;
        let mut rung = false;
        if !got && !spin.is_zero() {
            // The doorbell: work handed over by another thread (a forward to this NI) ends the
            // spin in the round it comes, as a flag (see `Doorbell`); the waker's descriptor is
            // only watched by the poll(2) below, so without it a handover waited out the spin.
            if let Some(b) = &self.bell {
                b.spin_begin();
            }
            let spun = loop {
                match self.any_ready(rounds % 16 == 0) {
                    Ok(g) => got = g,
                    Err(e) => break Err(e),
                }
                rounds = rounds.wrapping_add(1);
                if got || self.bell.as_ref().is_some_and(Doorbell::rung) || start.elapsed() >= spin
                {
                    break Ok(());
                }
                std::thread::yield_now();
            };
            rung = self.bell.as_ref().is_some_and(Doorbell::spin_end);
            spun?;
        }
        if !got && !rung {
            // Arm, then check once more (a completion may have slipped in before arming).
            for (_, c) in self.conns.iter() {
                if let Some(r) = c.res.as_ref() {
                    r.cq.req_notify()?;
                }
            }
            if !self.any_ready(true)? {
                let mut fds = vec![self.ch.fd()];
                fds.extend(self.waker);
                fds.extend(
                    self.conns
                        .iter()
                        .filter_map(|(_, c)| c.res.as_ref().map(|r| r.chan.fd())),
                );
                let ms = timeout.map_or(-1, |t| {
                    i32::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
                });
                let ready = v::poll_ready(&fds, ms)?;
                // The waker is the second descriptor, when there is one.
                self.woken |= self.waker.is_some() && ready.get(1) == Some(&true);
            }
        }
        for (_, c) in self.conns.iter() {
            if let Some(r) = c.res.as_ref() {
                r.chan.drain();
            }
        }
        for b in self.spare.drain(..) {
            sink.recycle(b);
        }
        let now = now_fn();
        self.flush_out(sink, now);
        while let Some(ev) = self.ch.next_event()? {
            self.cm_event(ev, sink, now);
            self.flush_out(sink, now);
        }
        self.poll_cqs(sink, now)?;
        self.flush_out(sink, now);
        // Completions made room: post what waited (the engine's reaction goes next turn).
        self.flush_dirty();
        for conn in std::mem::take(&mut self.to_break) {
            self.disconnect(conn);
        }
        self.flush_out(sink, now);
        Ok(())
    }

    /// Non-destructive readiness check: a completion (polled into `pending`) or, when
    /// `check_cm`, a cm event is waiting. Polling a CQ is a userspace read on most providers;
    /// the cm channel costs a system call, so busy rounds look at it only every few rounds.
    fn any_ready(&mut self, check_cm: bool) -> io::Result<bool> {
        let mut found = false;
        for (vc, c) in self.conns.iter_mut() {
            if let Some(id) = c.id.as_mut() {
                let before = self.wcs.len();
                id.poll_cq(&mut self.wcs, 16)?;
                if self.wcs.len() > before {
                    found = true;
                    self.pending
                        .extend(self.wcs.drain(before..).map(|w| (vc, w)));
                }
            }
        }
        if !found && check_cm && v::poll_readable(&[self.ch.fd()], 0)? > 0 {
            return Ok(true);
        }
        Ok(found)
    }

    fn poll_cqs(&mut self, sink: &mut dyn FabricSink, now: Instant) -> io::Result<()> {
        for (vc, c) in self.conns.iter_mut() {
            if let Some(id) = c.id.as_mut() {
                while id.poll_cq(&mut self.wcs, 32)? > 0 {}
                self.pending.extend(self.wcs.drain(..).map(|w| (vc, w)));
            }
        }
        let pending = std::mem::take(&mut self.pending);
        for (vc, w) in pending {
            self.completion(vc, w, sink, now);
            self.flush_out(sink, now);
        }
        Ok(())
    }

    /// Hands a send-queue completion to the endpoint, recording it first if it is one of
    /// [`VerbsFabric::rdma_write`]'s.
    fn send_done(
        &mut self,
        sink: &mut dyn FabricSink,
        now: Instant,
        conn: ConnId,
        wr: WrId,
        st: WcStatus,
    ) {
        if wr.is_injected() {
            if let Some(e) = self.injected.get_mut(&wr.0) {
                e.1 = Some(st);
            }
        }
        sink.handle_send_complete(now, conn, wr, st);
    }

    fn completion(&mut self, vc: VConnId, w: Wc, sink: &mut dyn FabricSink, now: Instant) {
        let Some(c) = self.conns.get_mut(vc) else {
            return;
        };
        let Some(conn) = c.conn else {
            return;
        };
        if w.is_send {
            let k = w.wr_id as usize;
            if !c.sq.contains(k) {
                return;
            }
            c.sq_posted = c.sq_posted.saturating_sub(1);
            if !c.backlog.is_empty() {
                self.dirty.push(vc);
            }
            let Some((e, st)) = Self::retire(&mut c.sq, k, wc_status(w.status)) else {
                return;
            };
            match e.op {
                SqOp::Send { buf, .. } => {
                    c.free_tx.push(buf);
                    if st != WcStatus::Success {
                        self.stats.send_errors += 1;
                    }
                }
                SqOp::Write { .. } => {
                    if !matches!(st, WcStatus::Success | WcStatus::Flushed) {
                        self.stats.rdma_write_errors += 1;
                    }
                }
            }
            if st != WcStatus::Success {
                debug!(?conn, status = %v::wc::name(w.status), "verbs fabric: send-queue completion failed");
            }
            if !matches!(st, WcStatus::Success | WcStatus::Flushed) {
                // The QP is in error: its disconnect is no close.
                c.broken.get_or_insert(DisconnectReason::TransportError);
            }
            self.send_done(sink, now, conn, e.wr, st);
            return;
        }
        let slot = w.wr_id as u16;
        if w.status != v::wc::SUCCESS {
            if w.status != v::wc::WR_FLUSH_ERR {
                // The QP is in error and this slot is gone: the connection is dead, say so now
                // (kiblnd_rx_complete closes the connection) rather than leave the peer to the
                // keepalive horizon. A message longer than a slot gets here, for one.
                self.stats.recv_errors += 1;
                debug!(?conn, status = %v::wc::name(w.status),
                       "verbs fabric: receive error, breaking the connection");
                c.broken.get_or_insert(recv_error_reason(w.status));
                self.disconnect(conn);
            }
            return;
        }
        let Some(res) = c.res.as_ref() else {
            return;
        };
        let n = (w.byte_len as usize).min(MSG_SIZE);
        self.stats.msgs_rx += 1;
        if !c.reported_up {
            let mut bytes = vec![0u8; n];
            res.rx.read(usize::from(slot) * MSG_SIZE, &mut bytes);
            self.stats.early_rx += 1;
            if c.early.is_empty() && !c.active && c.phase == Phase::Accepting {
                // The data proves the connection up: have the CM say ESTABLISHED now, so that
                // a lost RTU does not fail the accept and drop this (LU-8303).
                if let Some(Err(e)) = c.id.as_mut().map(CmId::notify_established) {
                    debug!(?conn, "verbs fabric: rdma_notify(COMM_EST): {e}");
                }
            }
            c.early.push((slot, bytes));
            return;
        }
        // Copied out of the slot into a reused buffer: no allocation per message.
        let mut bytes = std::mem::take(&mut self.rx_scratch);
        bytes.resize(n, 0);
        res.rx.read(usize::from(slot) * MSG_SIZE, &mut bytes);
        sink.handle_recv(now, conn, slot, &bytes);
        self.rx_scratch = bytes;
    }

    fn flush_out(&mut self, sink: &mut dyn FabricSink, now: Instant) {
        while let Some(r) = self.out.pop_front() {
            match r {
                Report::SendDone(c, wr, st) => self.send_done(sink, now, c, wr, st),
                Report::Disconnected(c, why) => sink.handle_disconnected(now, c, why),
                Report::ConnectFailed(c, why) => sink.handle_connect_failed(now, c, why),
            }
        }
    }

    fn cm_event(&mut self, ev: CmEvent, sink: &mut dyn FabricSink, now: Instant) {
        trace!(local = %self.local, kind = ?ev.kind, status = ev.status, token = ev.token,
               private = ev.private.len(), "verbs fabric: cm event");
        if ev.kind == CmEventKind::ConnectRequest {
            let Some(id) = ev.new_id else { return };
            self.stats.requests += 1;
            let vc = self.new_vconn(Some(id), Phase::RequestPending, false);
            let req = RequestId(vc.as_u64());
            sink.handle_connect_request(now, req, &ev.private);
            return;
        }
        if ev.token == LISTENER {
            return;
        }
        let vc = VConnId::from_u64(ev.token);
        let Some(c) = self.conns.get_mut(vc) else {
            self.stats.stale_events += 1;
            return;
        };
        let conn = c.conn;
        match ev.kind {
            CmEventKind::AddrResolved if c.phase == Phase::ResolvingAddr => {
                c.phase = Phase::ResolvingRoute;
                let tmo = self.timeout_ms();
                let c = &mut self.conns[vc];
                if let Some(Err(e)) = c.id.as_mut().map(|id| id.resolve_route(tmo)) {
                    debug!(error = %e, "verbs fabric: rdma_resolve_route");
                    self.connect_failed(vc, ConnectFailure::Unreachable);
                }
            }
            CmEventKind::RouteResolved if c.phase == Phase::ResolvingRoute => {
                c.phase = Phase::Connecting;
                let param = self.param();
                let r = self.setup(vc).and_then(|()| {
                    let c = &mut self.conns[vc];
                    let private = c.private;
                    c.id.as_mut()
                        .map_or(Ok(()), |id| id.connect(private.as_bytes(), param))
                });
                if let Err(e) = r {
                    debug!(error = %e, "verbs fabric: connect setup");
                    self.stats.setup_errors += 1;
                    self.connect_failed(vc, ConnectFailure::Error);
                }
            }
            CmEventKind::AddrError | CmEventKind::RouteError | CmEventKind::Unreachable => {
                self.connect_failed(vc, ConnectFailure::Unreachable)
            }
            CmEventKind::ConnectError => self.connect_failed(vc, ConnectFailure::Error),
            CmEventKind::Rejected => {
                self.stats.rejects_received += 1;
                let why = match ev.status {
                    8 => ConnectFailure::NoListener,
                    10 => ConnectFailure::StaleConn,
                    _ if !ev.private.is_empty() => {
                        ConnectFailure::Rejected(PrivateData::new(&ev.private))
                    }
                    _ => ConnectFailure::Error,
                };
                self.connect_failed(vc, why);
            }
            CmEventKind::Established => {
                let Some(conn) = conn else { return };
                if c.reported_up || c.reported_down {
                    return;
                }
                c.phase = Phase::Established;
                c.reported_up = true;
                self.stats.established += 1;
                let private = if c.active { ev.private } else { Vec::new() };
                let early = std::mem::take(&mut c.early);
                sink.handle_established(now, conn, &private);
                for (slot, bytes) in early {
                    sink.handle_recv(now, conn, slot, &bytes);
                }
            }
            CmEventKind::Disconnected | CmEventKind::DeviceRemoval => {
                self.stats.disconnects += 1;
                let Some(conn) = conn else {
                    // A request the engine has not answered: drop it.
                    if c.phase == Phase::RequestPending {
                        self.conns.remove(vc);
                    }
                    return;
                };
                if c.reported_down {
                    return;
                }
                c.reported_down = true;
                if c.reported_up {
                    c.phase = Phase::Closing;
                    // A DREQ (the peer's, or the answer to ours) is a close, unless the QP had
                    // gone to error first; a device gone is not.
                    let why = match ev.kind {
                        CmEventKind::DeviceRemoval => DisconnectReason::TransportError,
                        _ => c.broken.unwrap_or(DisconnectReason::Closed),
                    };
                    sink.handle_disconnected(now, conn, why);
                } else {
                    self.connect_failed(vc, ConnectFailure::Error);
                }
            }
            _ => {}
        }
    }

    fn connect_failed(&mut self, vc: VConnId, why: ConnectFailure) {
        let Some(c) = self.conns.get_mut(vc) else {
            return;
        };
        c.phase = Phase::Closing;
        let Some(conn) = c.conn else { return };
        if c.reported_up {
            if !c.reported_down {
                c.reported_down = true;
                self.out
                    .push_back(Report::Disconnected(conn, DisconnectReason::TransportError));
            }
            return;
        }
        c.reported_down = true;
        if c.active {
            self.stats.connect_failures += 1;
            self.out.push_back(Report::ConnectFailed(conn, why));
        } else {
            self.out
                .push_back(Report::Disconnected(conn, DisconnectReason::TransportError));
        }
    }
}

/// What each engine action means on rdma_cm + ibverbs; results come with the next
/// [`VerbsFabric::poll`].
impl Fabric for VerbsFabric {
    fn connect(&mut self, _: Instant, conn: ConnId, peer: Nid, private: PrivateData, slots: u16) {
        VerbsFabric::connect(self, conn, peer, private, slots)
    }

    fn accept(
        &mut self,
        _: Instant,
        req: RequestId,
        conn: ConnId,
        private: PrivateData,
        slots: u16,
    ) {
        VerbsFabric::accept(self, req, conn, private, slots)
    }

    fn reject(&mut self, _: Instant, req: RequestId, private: PrivateData) {
        VerbsFabric::reject(self, req, private)
    }

    fn post_recv(&mut self, _: Instant, conn: ConnId, slot: u16) {
        VerbsFabric::post_recv(self, conn, slot)
    }

    fn send(&mut self, _: Instant, conn: ConnId, wr: WrId, bytes: Vec<u8>) {
        // Copied into the registered send buffer: back to the engine at the next poll.
        VerbsFabric::send(self, conn, wr, &bytes);
        self.spare.push(bytes);
    }

    fn rdma_write(
        &mut self,
        _: Instant,
        conn: ConnId,
        wr: WrId,
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
    ) {
        self.write(conn, wr, &local, &remote)
    }

    // The rkey is the protection on verbs (see `FabricAction::GrantWrites`).
    fn grant_writes(&mut self, _: Instant, _: ConnId, _: WrId, _: Vec<RemoteFrag>) {}

    fn revoke_writes(&mut self, _: Instant, _: ConnId, _: WrId) {}

    fn disconnect(&mut self, _: Instant, conn: ConnId) {
        VerbsFabric::disconnect(self, conn)
    }

    fn destroy(&mut self, _: Instant, conn: ConnId) {
        VerbsFabric::destroy(self, conn)
    }
}

impl crate::driver::Driver for VerbsFabric {
    fn apply(&mut self, now: Instant, action: FabricAction) {
        VerbsFabric::apply(self, now, action);
    }

    fn registry(&mut self) -> Option<&mut dyn Registry> {
        Some(self)
    }

    fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        sink: &mut dyn FabricSink,
        now: &dyn Fn() -> Instant,
    ) -> io::Result<()> {
        VerbsFabric::poll(self, timeout, sink, now)
    }

    fn set_waker(&mut self, fd: std::os::fd::RawFd) {
        self.waker = Some(fd);
    }

    fn set_doorbell(&mut self, bell: Doorbell) {
        self.bell = Some(bell);
    }

    fn take_woken(&mut self) -> bool {
        std::mem::take(&mut self.woken)
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.stats.counters()
    }

    fn abandon(&mut self) {
        VerbsFabric::abandon(self);
    }
}

/// Registration on the NI's device: ibv_reg_mr with LOCAL_WRITE | REMOTE_WRITE on the fabric's
/// protection domain, the bytes copied into the registered buffer. Deregistering copies the bytes
/// back out and drops the fabric's hold on the MR: later writes from it are refused, later writes
/// to its key fail at the HCA; ibv_dereg_mr happens once no posted write reads from it any more,
/// and if it fails the buffer is leaked (rather than freed while a peer may still write into it)
/// and counted ([`v::dereg_failures`]).
impl Registry for VerbsFabric {
    fn register(&mut self, bytes: Vec<u8>) -> io::Result<Registration> {
        let pd = self.pd(self.home)?;
        let mr = MemoryRegion::new(&pd, bytes.len(), true)?;
        mr.write(0, &bytes);
        self.next_region += 1;
        let id = self.next_region;
        let reg = Registration::new(RegionId(id), mr.rkey(), mr.addr(0), bytes.len() as u64);
        self.regions.insert(id, mr);
        self.stats.regions_registered += 1;
        self.stats.regions = self.regions.len() as u64;
        Ok(reg)
    }

    fn register_shared(&mut self, mem: &SharedMem) -> io::Result<Registration> {
        let pd = self.pd(self.home)?;
        let mr = MemoryRegion::shared(&pd, mem, true)?;
        self.next_region += 1;
        let id = self.next_region;
        let reg = Registration::new(RegionId(id), mr.rkey(), mr.addr(0), mr.len() as u64);
        self.regions.insert(id, mr);
        self.stats.regions_registered += 1;
        self.stats.regions = self.regions.len() as u64;
        Ok(reg)
    }

    fn read(&self, reg: &Registration, offset: u64, out: &mut [u8]) -> bool {
        let Some(r) = self.region_of(reg) else {
            return false;
        };
        let Ok(offset) = usize::try_from(offset) else {
            return false;
        };
        if offset.checked_add(out.len()).is_none_or(|e| e > r.len()) {
            return false;
        }
        r.read(offset, out);
        true
    }

    fn deregister(&mut self, reg: Registration) -> Option<Vec<u8>> {
        let bytes = self.contents(&reg);
        let found = self.regions.remove(&reg.id().0).is_some();
        if found {
            self.stats.regions_deregistered += 1;
            self.stats.regions = self.regions.len() as u64;
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a host without an RDMA device the fabric refuses to start with a clear error.
    #[test]
    fn no_device_gives_a_clear_error() {
        if v::device_count() > 0 {
            eprintln!("an RDMA device exists: skipping the no-device assertion");
            return;
        }
        let Err(e) = VerbsFabric::new(VerbsConfig::default(), |_| None) else {
            panic!("VerbsFabric::new succeeded without a device");
        };
        assert!(matches!(e, VerbsError::NoDevice));
        let msg = e.to_string();
        assert!(msg.contains("no RDMA device"), "{msg}");
        assert!(msg.contains("rdma_rxe"), "{msg}");
    }

    /// o2iblnd's sizing: messages + queue depth x fragments, the RDMA share halved until the
    /// device's limits hold.
    #[test]
    fn send_queue_sizing() {
        // Queue depth 8: 18 receives and message buffers, 8 x 257 fragments.
        assert_eq!(sq_size(8, 18, 257, None), (18 + 8 * 257, 257));
        let roomy = DeviceLimits {
            max_qp_wr: 16384,
            max_cqe: 32767,
            max_sge: 32,
            max_mr_size: u64::MAX,
        };
        assert_eq!(sq_size(8, 18, 257, Some(roomy)), (2074, 257));
        // A device with 1024 WRs per queue: 257 and 128 fragments do not fit (18 + 1024 = 1042),
        // 64 do (18 + 512 = 530).
        let small = DeviceLimits {
            max_qp_wr: 1024,
            ..roomy
        };
        assert_eq!(sq_size(8, 18, 257, Some(small)), (18 + 8 * 64, 64));
        // The CQ bound counts too: send + receive entries.
        let tiny_cq = DeviceLimits {
            max_cqe: 100,
            ..roomy
        };
        let (send, frags) = sq_size(8, 18, 257, Some(tiny_cq));
        assert!(send + 18 <= 100 && frags == 8, "{send} {frags}");
        // Nothing fits: messages only.
        let none = DeviceLimits {
            max_qp_wr: 10,
            ..roomy
        };
        assert_eq!(sq_size(8, 18, 257, Some(none)), (18, 0));
    }

    #[test]
    fn completion_statuses_map_to_the_engine() {
        assert_eq!(wc_status(v::wc::SUCCESS), WcStatus::Success);
        assert_eq!(wc_status(v::wc::WR_FLUSH_ERR), WcStatus::Flushed);
        assert_eq!(wc_status(v::wc::RETRY_EXC_ERR), WcStatus::RetryExceeded);
        assert_eq!(wc_status(v::wc::REM_ACCESS_ERR), WcStatus::Error);
        assert_eq!(wc_status(v::wc::LOC_PROT_ERR), WcStatus::Error);
        assert_eq!(wc_status(v::wc::RNR_RETRY_EXC_ERR), WcStatus::Error);
        assert!(v::wc::name(v::wc::REM_ACCESS_ERR).contains("remote access"));
    }

    /// A receive that fails (not flushed) breaks the connection: for a message too long for its
    /// slot that is the peer's protocol error, anything else the transport; never a close.
    #[test]
    fn receive_errors_name_why_the_connection_broke() {
        assert_eq!(
            recv_error_reason(v::wc::LOC_LEN_ERR),
            DisconnectReason::ProtocolError
        );
        for st in [
            v::wc::REM_ACCESS_ERR,
            v::wc::LOC_PROT_ERR,
            v::wc::RETRY_EXC_ERR,
        ] {
            assert_eq!(recv_error_reason(st), DisconnectReason::TransportError);
        }
    }

    #[test]
    fn verbs_fabric_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<VerbsFabric>();
    }
}
