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
//! as the simulator's `World::rdma_write` does (tests write without a rendezvous; the engine drives bulk data through `apply`).
//!
//! Layout: `config` (what is set, the start errors, the counters), `setup` (opening, the connection
//! manager and its events), `sq` (receive slots, sends, RDMA writes on the send queue), `cq` (the
//! poll loop and completions), `close` (disconnect, destroy, abandon), `regions` (registered
//! memory); the connection state and the [`Fabric`] impl are here.

mod close;
mod config;
mod cq;
mod regions;
mod setup;
mod sq;

pub use config::*;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use slab::Slab;
use tracing::{debug, trace, warn};

use crate::driver::report::{Report, Resolver};
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
    /// Applies one engine action; results are reported by the next [`VerbsFabric::poll`].
    pub fn apply(&mut self, now: Instant, action: FabricAction) {
        trace!(%now, ?action, "verbs fabric apply");
        Fabric::apply(self, now, action);
    }
}

/// What each engine action means on rdma_cm + ibverbs; results come with the next
/// [`VerbsFabric::poll`].
impl Fabric for VerbsFabric {
    forward_fabric_cm!(self, VerbsFabric);

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
}

impl crate::driver::Driver for VerbsFabric {
    forward_driver_io!(self, VerbsFabric, self);

    fn registry(&mut self) -> Option<&mut dyn Registry> {
        Some(self)
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

#[cfg(test)]
mod tests;
