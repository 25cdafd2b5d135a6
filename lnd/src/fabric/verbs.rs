//! The `verbs` fabric: rdma_cm + ibverbs RC queue pairs (feature `verbs`). Needs an RDMA device
//! (a NIC, or Soft-RoCE `rdma_rxe`); without one [`VerbsFabric::new`] returns a clear error.
//!
//! Same driver shape as the tcp fabric: one [`VerbsFabric`] per NI event loop, single-threaded;
//! drain [`Endpoint::poll_action`] into [`VerbsFabric::apply`], then call [`VerbsFabric::poll`],
//! which busy-polls for a bounded number of rounds, then blocks in poll(2) on the cm event
//! channel and every connection's completion channel, and feeds the endpoint what happened.
//! [`turn`] / [`run_endpoint`] are that loop (clock read only there, via [`MonotonicClock`]).
//!
//! | engine action / input    | verbs fabric                                                          |
//! |--------------------------|-----------------------------------------------------------------------|
//! | `Connect`                | cm_id (RDMA_PS_TCP), rdma_resolve_addr (5 s), rdma_resolve_route (5 s), then PD, comp channel, CQ, RC QP, receive + send regions, post `recv_slots` receives, rdma_connect(CONNREQ) |
//! | `handle_connect_request` | RDMA_CM_EVENT_CONNECT_REQUEST on the listener, with its private data |
//! | `Accept` / `Reject`      | resources as above + rdma_accept(CONNACK) / rdma_reject(reject bytes), then the id is destroyed |
//! | `handle_established`     | RDMA_CM_EVENT_ESTABLISHED (active: with the CONNACK private data)    |
//! | `handle_connect_failed`  | ADDR/ROUTE_ERROR, UNREACHABLE: `Unreachable`; REJECTED: reason 28 (consumer defined) `Rejected(private)`, 8 `NoListener`, 10 `StaleConn`; CONNECT_ERROR and failures to set up: `Error` |
//! | `PostRecv`               | ibv_post_recv of 4 KiB slot `slot` of the receive region             |
//! | `Send`                   | copy into a free 4 KiB buffer of the send region, IBV_WR_SEND signaled |
//! | `handle_send_complete`   | send completion: SUCCESS, WR_FLUSH_ERR `Flushed`, RETRY_EXC_ERR `RetryExceeded`, others `Error` |
//! | `handle_recv`            | receive completion (those arriving before ESTABLISHED are parked and replayed after it) |
//! | `Disconnect`             | rdma_disconnect                                                       |
//! | `handle_disconnected`    | RDMA_CM_EVENT_DISCONNECTED (or DEVICE_REMOVAL)                        |
//! | `Destroy`                | destroy QP, CQ, cm_id, deregister the regions (in that order)        |
//! | `RdmaWrite`              | **not implemented yet**: completes with `Error` (counted)             |
//!
//! Sizing (o2iblnd): recv WRs = `recv_slots` (2 x queue depth + 2); queue depth = (recv_slots -
//! 2) / 2; send WRs = 2 x queue depth + 2 (messages only: no RDMA writes yet); CQ entries = recv +
//! send WRs. One receive region of `recv_slots` x 4 KiB and one send region of `send WRs` x 4 KiB
//! per connection.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use slab::Slab;
use tracing::{debug, trace};

use crate::engine::Endpoint;
use crate::fabric::{ConnId, ConnectFailure, FabricAction, PrivateData, RequestId, WcStatus, WrId};
use crate::sys::verbs::{
    self as v, CmEvent, CmEventKind, CmId, CompChannel, CompletionQueue, ConnParam, EventChannel,
    MemoryRegion, ProtectionDomain, Wc,
};
use crate::time::Instant;
use crate::wire::kib::MSG_SIZE;
use crate::wire::Nid;

pub use crate::fabric::driver::{run_endpoint, turn, MonotonicClock};

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
    /// Rounds of non-blocking polling in `poll` before blocking in poll(2).
    pub busy_poll_rounds: u32,
    /// Listen backlog.
    pub backlog: i32,
    /// Print every cm event to stderr (bring-up aid; tracing carries them at `trace` too).
    pub log_cm_events: bool,
}

impl Default for VerbsConfig {
    fn default() -> VerbsConfig {
        VerbsConfig {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 987),
            resolve_timeout: std::time::Duration::from_secs(5),
            retry_count: 5,
            rnr_retry_count: 6,
            busy_poll_rounds: 64,
            backlog: 256,
            log_cm_events: false,
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

/// Counters. All only grow.
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
    pub rdma_writes_refused: u64,
    pub bad_sends: u64,
    pub stale_events: u64,
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
            ("rdma_writes_refused", self.rdma_writes_refused),
            ("bad_sends", self.bad_sends),
            ("stale_events", self.stale_events),
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

/// Verbs resources of one connection, released in `Destroy` order: QP, CQ, cm_id, regions.
struct Resources {
    cq: Arc<CompletionQueue>,
    chan: Arc<CompChannel>,
    rx: Arc<MemoryRegion>,
    tx: Arc<MemoryRegion>,
    _pd: Arc<ProtectionDomain>,
}

struct VConn {
    generation: u32,
    id: Option<CmId>,
    res: Option<Resources>,
    conn: Option<ConnId>,
    phase: Phase,
    active: bool,
    private: PrivateData,
    recv_slots: u16,
    /// Send buffers: free indices, and the engine's WrId of each busy one.
    free_tx: Vec<u16>,
    tx_wr: Vec<Option<WrId>>,
    reported_up: bool,
    reported_down: bool,
    early: Vec<(u16, Vec<u8>)>,
}

#[derive(Copy, Clone, Debug)]
enum Report {
    SendDone(ConnId, WrId, WcStatus),
    Disconnected(ConnId),
    ConnectFailed(ConnId, ConnectFailure),
}

type Resolver = Box<dyn Fn(Nid) -> Option<SocketAddr> + Send>;

const LISTENER: u64 = u64::MAX;
const SEND_BIT: u64 = 1 << 63;

/// The verbs fabric of one NI (see the module doc).
pub struct VerbsFabric {
    // Field order = drop order: connections (their ids) before the listener, before the channel.
    conns: Slab<VConn>,
    /// Held for its lifetime: its events carry the `LISTENER` token.
    _listener: CmId,
    ch: EventChannel,
    local: SocketAddr,
    resolver: Resolver,
    cfg: VerbsConfig,
    next_generation: u32,
    by_conn: std::collections::HashMap<ConnId, usize>,
    out: VecDeque<Report>,
    wcs: Vec<Wc>,
    /// Completions polled (by connection key) and not yet handed to the engine.
    pending: Vec<(usize, Wc)>,
    stats: VerbsStats,
    /// A descriptor whose readability ends a blocking wait (see `Driver::set_waker`).
    waker: Option<std::os::fd::RawFd>,
}

fn token(key: usize, generation: u32) -> u64 {
    u64::from(generation) << 32 | key as u64
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
        let ch = EventChannel::new().map_err(io_err("rdma_create_event_channel"))?;
        let mut listener = CmId::new(&ch, LISTENER).map_err(io_err("rdma_create_id"))?;
        listener
            .bind(cfg.listen)
            .map_err(io_err("rdma_bind_addr"))?;
        listener
            .listen(cfg.backlog)
            .map_err(io_err("rdma_listen"))?;
        let local = SocketAddr::new(cfg.listen.ip(), listener.src_port());
        Ok(VerbsFabric {
            conns: Slab::new(),
            _listener: listener,
            ch,
            local,
            resolver: Box::new(resolver),
            cfg,
            next_generation: 1,
            by_conn: Default::default(),
            out: VecDeque::new(),
            wcs: Vec::new(),
            pending: Vec::new(),
            stats: VerbsStats::default(),
            waker: None,
        })
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

    /// Connections and pending requests held.
    pub fn connections(&self) -> usize {
        self.conns.len()
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

    fn new_vconn(&mut self, id: Option<CmId>, phase: Phase, active: bool) -> usize {
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        let key = self.conns.insert(VConn {
            generation,
            id,
            res: None,
            conn: None,
            phase,
            active,
            private: PrivateData::EMPTY,
            recv_slots: 0,
            free_tx: Vec::new(),
            tx_wr: Vec::new(),
            reported_up: false,
            reported_down: false,
            early: Vec::new(),
        });
        if let Some(id) = self.conns[key].id.as_mut() {
            id.set_token(token(key, generation));
        }
        key
    }

    fn lookup(&self, conn: ConnId) -> Option<usize> {
        self.by_conn.get(&conn).copied()
    }

    // ------------------------------------------------------------------ engine actions

    /// Applies one engine action; results are reported by the next [`VerbsFabric::poll`].
    pub fn apply(&mut self, now: Instant, action: FabricAction) {
        trace!(%now, ?action, "verbs fabric apply");
        match action {
            FabricAction::Connect {
                conn,
                peer,
                private,
                recv_slots,
            } => self.connect(conn, peer, private, recv_slots),
            FabricAction::Accept {
                req,
                conn,
                private,
                recv_slots,
            } => self.accept(req, conn, private, recv_slots),
            FabricAction::Reject { req, private } => self.reject(req, private),
            FabricAction::PostRecv { conn, slot } => self.post_recv(conn, slot),
            FabricAction::Send { conn, wr, bytes } => self.send(conn, wr, &bytes),
            FabricAction::RdmaWrite { conn, wr, .. } => {
                self.stats.rdma_writes_refused += 1;
                if self.lookup(conn).is_some() {
                    self.out
                        .push_back(Report::SendDone(conn, wr, WcStatus::Error));
                } else {
                    self.stats.unknown_actions += 1;
                }
            }
            FabricAction::Disconnect { conn } => self.disconnect(conn),
            FabricAction::Destroy { conn } => self.destroy(conn),
        }
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
        let key = self.new_vconn(Some(id), Phase::ResolvingAddr, true);
        let tmo = self.timeout_ms();
        let c = &mut self.conns[key];
        c.conn = Some(conn);
        c.private = private;
        c.recv_slots = recv_slots;
        self.by_conn.insert(conn, key);
        if let Err(e) =
            c.id.as_mut()
                .map_or(Ok(()), |id| id.resolve_addr(addr, tmo))
        {
            debug!(%peer, %addr, error = %e, "verbs fabric: rdma_resolve_addr");
            self.conns[key].reported_down = true;
            fail(self, ConnectFailure::Unreachable);
        }
    }

    /// PD, completion channel, CQ, QP, regions; posts receives 0..recv_slots.
    fn setup(&mut self, key: usize) -> io::Result<()> {
        let c = &mut self.conns[key];
        let id = c.id.as_mut().ok_or_else(|| io::Error::other("no cm_id"))?;
        let recv_wr = u32::from(c.recv_slots.max(2));
        let qd = (recv_wr.saturating_sub(2) / 2).max(1);
        let send_wr = 2 * qd + 2;
        let pd = id.alloc_pd()?;
        let chan = id.comp_channel()?;
        let cq = id.create_cq(recv_wr + send_wr, &chan)?;
        id.create_qp(&pd, &cq, send_wr, recv_wr)?;
        let rx = MemoryRegion::new(&pd, recv_wr as usize * MSG_SIZE, false)?;
        let tx = MemoryRegion::new(&pd, send_wr as usize * MSG_SIZE, false)?;
        for slot in 0..c.recv_slots {
            id.post_recv(
                &rx,
                usize::from(slot) * MSG_SIZE,
                MSG_SIZE as u32,
                u64::from(slot),
            )?;
        }
        cq.req_notify()?;
        c.free_tx = (0..send_wr as u16).rev().collect();
        c.tx_wr = vec![None; send_wr as usize];
        c.res = Some(Resources {
            cq,
            chan,
            rx,
            tx,
            _pd: pd,
        });
        Ok(())
    }

    fn accept(&mut self, req: RequestId, conn: ConnId, private: PrivateData, recv_slots: u16) {
        let key = (req.0 & 0xffff_ffff) as usize;
        let ok = self
            .conns
            .get(key)
            .is_some_and(|c| token(key, c.generation) == req.0 && c.phase == Phase::RequestPending);
        if !ok {
            self.stats.unknown_actions += 1;
            self.out
                .push_back(Report::ConnectFailed(conn, ConnectFailure::Error));
            return;
        }
        self.stats.accepts += 1;
        {
            let c = &mut self.conns[key];
            c.conn = Some(conn);
            c.recv_slots = recv_slots;
            c.phase = Phase::Accepting;
        }
        self.by_conn.insert(conn, key);
        let param = self.param();
        let r = self.setup(key).and_then(|()| {
            let c = &mut self.conns[key];
            c.id.as_mut()
                .map_or(Ok(()), |id| id.accept(private.as_bytes(), param))
        });
        if let Err(e) = r {
            debug!(error = %e, "verbs fabric: accept failed");
            self.stats.setup_errors += 1;
            self.conns[key].reported_down = true;
            self.out.push_back(Report::Disconnected(conn));
        }
    }

    fn reject(&mut self, req: RequestId, private: PrivateData) {
        let key = (req.0 & 0xffff_ffff) as usize;
        let ok = self
            .conns
            .get(key)
            .is_some_and(|c| token(key, c.generation) == req.0 && c.phase == Phase::RequestPending);
        if !ok {
            self.stats.unknown_actions += 1;
            return;
        }
        self.stats.rejects_sent += 1;
        let mut c = self.conns.remove(key);
        if let Some(id) = c.id.as_mut() {
            if let Err(e) = id.reject(private.as_bytes()) {
                debug!(error = %e, "verbs fabric: rdma_reject");
            }
        }
    }

    fn post_recv(&mut self, conn: ConnId, slot: u16) {
        let Some(key) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let c = &mut self.conns[key];
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

    fn send(&mut self, conn: ConnId, wr: WrId, bytes: &[u8]) {
        let Some(key) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        if bytes.is_empty() || bytes.len() > MSG_SIZE {
            self.stats.bad_sends += 1;
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Error));
            return;
        }
        let c = &mut self.conns[key];
        let usable = matches!(
            c.phase,
            Phase::Established | Phase::Accepting | Phase::Connecting
        );
        let (Some(id), Some(res), true) = (c.id.as_mut(), c.res.as_ref(), usable) else {
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Flushed));
            return;
        };
        let Some(buf) = c.free_tx.pop() else {
            self.stats.send_errors += 1;
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Error));
            return;
        };
        let off = usize::from(buf) * MSG_SIZE;
        res.tx.write(off, bytes);
        match id.post_send(&res.tx, off, bytes.len() as u32, SEND_BIT | u64::from(buf)) {
            Ok(()) => {
                c.tx_wr[usize::from(buf)] = Some(wr);
                self.stats.msgs_tx += 1;
            }
            Err(e) => {
                debug!(?conn, error = %e, "verbs fabric: ibv_post_send");
                c.free_tx.push(buf);
                self.stats.send_errors += 1;
                self.out
                    .push_back(Report::SendDone(conn, wr, WcStatus::Error));
            }
        }
    }

    fn disconnect(&mut self, conn: ConnId) {
        let Some(key) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let c = &mut self.conns[key];
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
                self.out.push_back(Report::Disconnected(conn));
            }
        }
    }

    fn destroy(&mut self, conn: ConnId) {
        let Some(key) = self.by_conn.remove(&conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let mut c = self.conns.remove(key);
        // QP, then CQ (and its channel), then the cm_id, then the regions and the PD.
        if let Some(id) = c.id.as_mut() {
            id.destroy_qp();
        }
        let res = c.res.take();
        let (rx, tx, pd) = match res {
            Some(Resources {
                cq,
                chan,
                rx,
                tx,
                _pd,
            }) => {
                drop(cq);
                drop(chan);
                (Some(rx), Some(tx), Some(_pd))
            }
            None => (None, None, None),
        };
        drop(c.id.take());
        drop((rx, tx, pd));
        self.out
            .retain(|r| !matches!(r, Report::SendDone(c, ..) | Report::Disconnected(c) | Report::ConnectFailed(c, _) if *c == conn));
    }

    // ------------------------------------------------------------------ driving

    /// True if `poll` has reports to deliver without waiting.
    pub fn has_work(&self) -> bool {
        !self.out.is_empty()
    }

    /// Busy-polls the cm channel and every CQ for up to `busy_poll_rounds` rounds; if nothing
    /// came, arms the CQs and blocks in poll(2) for up to `timeout` (`None`: without limit), then
    /// reads the clock once with `now_fn` and feeds `ep` everything that happened.
    pub fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        ep: &mut Endpoint,
        now_fn: impl Fn() -> Instant,
    ) -> io::Result<()> {
        let mut got = self.has_work();
        let mut rounds = 0;
        while !got && rounds < self.cfg.busy_poll_rounds {
            got = self.any_ready()?;
            rounds += 1;
        }
        if !got {
            // Arm, then check once more (a completion may have slipped in before arming).
            for (_, c) in self.conns.iter() {
                if let Some(r) = c.res.as_ref() {
                    r.cq.req_notify()?;
                }
            }
            if !self.any_ready()? {
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
                v::poll_readable(&fds, ms)?;
            }
        }
        for (_, c) in self.conns.iter() {
            if let Some(r) = c.res.as_ref() {
                r.chan.drain();
            }
        }
        let now = now_fn();
        self.flush_out(ep, now);
        while let Some(ev) = self.ch.next_event()? {
            self.cm_event(ev, ep, now);
            self.flush_out(ep, now);
        }
        self.poll_cqs(ep, now)?;
        self.flush_out(ep, now);
        Ok(())
    }

    /// Non-destructive readiness check: a cm event or a completion is waiting.
    fn any_ready(&mut self) -> io::Result<bool> {
        if v::poll_readable(&[self.ch.fd()], 0)? > 0 {
            return Ok(true);
        }
        // Completions: poll into the buffer, kept for `poll_cqs`.
        let mut found = false;
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            if let Some(r) = self.conns[key].res.as_ref() {
                let before = self.wcs.len();
                r.cq.poll(&mut self.wcs, 16)?;
                if self.wcs.len() > before {
                    found = true;
                    self.stash(key, before);
                }
            }
        }
        Ok(found)
    }

    /// Moves completions polled into `wcs` (from index `from`) to `pending`, tagged with `key`.
    fn stash(&mut self, key: usize, from: usize) {
        let wcs: Vec<Wc> = self.wcs.drain(from..).collect();
        self.pending.extend(wcs.into_iter().map(|w| (key, w)));
    }

    fn poll_cqs(&mut self, ep: &mut Endpoint, now: Instant) -> io::Result<()> {
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            while let Some(r) = self.conns.get(key).and_then(|c| c.res.as_ref()) {
                if r.cq.poll(&mut self.wcs, 16)? == 0 {
                    break;
                }
                self.stash(key, 0);
            }
        }
        let pending = std::mem::take(&mut self.pending);
        for (key, w) in pending {
            self.completion(key, w, ep, now);
            self.flush_out(ep, now);
        }
        Ok(())
    }

    fn completion(&mut self, key: usize, w: Wc, ep: &mut Endpoint, now: Instant) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        let Some(conn) = c.conn else {
            return;
        };
        if w.wr_id & SEND_BIT != 0 {
            let buf = (w.wr_id & 0xffff) as usize;
            let Some(wr) = c.tx_wr.get_mut(buf).and_then(Option::take) else {
                return;
            };
            c.free_tx.push(buf as u16);
            let st = match w.status {
                v::wc::SUCCESS => WcStatus::Success,
                v::wc::WR_FLUSH_ERR => WcStatus::Flushed,
                v::wc::RETRY_EXC_ERR => WcStatus::RetryExceeded,
                _ => WcStatus::Error,
            };
            if st != WcStatus::Success {
                self.stats.send_errors += 1;
            }
            ep.handle_send_complete(now, conn, wr, st);
            return;
        }
        let slot = w.wr_id as u16;
        if w.status != v::wc::SUCCESS {
            if w.status != v::wc::WR_FLUSH_ERR {
                self.stats.recv_errors += 1;
                debug!(?conn, status = w.status, "verbs fabric: receive error");
            }
            return;
        }
        let Some(res) = c.res.as_ref() else {
            return;
        };
        let n = (w.byte_len as usize).min(MSG_SIZE);
        let mut bytes = vec![0u8; n];
        res.rx.read(usize::from(slot) * MSG_SIZE, &mut bytes);
        self.stats.msgs_rx += 1;
        if !c.reported_up {
            self.stats.early_rx += 1;
            c.early.push((slot, bytes));
            return;
        }
        ep.handle_recv(now, conn, slot, &bytes);
    }

    fn flush_out(&mut self, ep: &mut Endpoint, now: Instant) {
        while let Some(r) = self.out.pop_front() {
            match r {
                Report::SendDone(c, wr, st) => ep.handle_send_complete(now, c, wr, st),
                Report::Disconnected(c) => ep.handle_disconnected(now, c),
                Report::ConnectFailed(c, why) => ep.handle_connect_failed(now, c, why),
            }
        }
    }

    fn cm_event(&mut self, ev: CmEvent, ep: &mut Endpoint, now: Instant) {
        trace!(kind = ?ev.kind, status = ev.status, token = ev.token, "verbs fabric: cm event");
        if self.cfg.log_cm_events {
            eprintln!(
                "verbs fabric {}: cm event {:?} status {} token {:#x} private {} bytes",
                self.local,
                ev.kind,
                ev.status,
                ev.token,
                ev.private.len()
            );
        }
        if ev.kind == CmEventKind::ConnectRequest {
            let Some(id) = ev.new_id else { return };
            self.stats.requests += 1;
            let key = self.new_vconn(Some(id), Phase::RequestPending, false);
            let req = RequestId(token(key, self.conns[key].generation));
            ep.handle_connect_request(now, req, &ev.private);
            return;
        }
        if ev.token == LISTENER {
            return;
        }
        let key = (ev.token & 0xffff_ffff) as usize;
        let generation = (ev.token >> 32) as u32;
        let Some(c) = self
            .conns
            .get_mut(key)
            .filter(|c| c.generation == generation)
        else {
            self.stats.stale_events += 1;
            return;
        };
        let conn = c.conn;
        match ev.kind {
            CmEventKind::AddrResolved if c.phase == Phase::ResolvingAddr => {
                c.phase = Phase::ResolvingRoute;
                let tmo = self.timeout_ms();
                let c = &mut self.conns[key];
                if let Some(Err(e)) = c.id.as_mut().map(|id| id.resolve_route(tmo)) {
                    debug!(error = %e, "verbs fabric: rdma_resolve_route");
                    self.connect_failed(key, ConnectFailure::Unreachable);
                }
            }
            CmEventKind::RouteResolved if c.phase == Phase::ResolvingRoute => {
                c.phase = Phase::Connecting;
                let param = self.param();
                let r = self.setup(key).and_then(|()| {
                    let c = &mut self.conns[key];
                    let private = c.private;
                    c.id.as_mut()
                        .map_or(Ok(()), |id| id.connect(private.as_bytes(), param))
                });
                if let Err(e) = r {
                    debug!(error = %e, "verbs fabric: connect setup");
                    self.stats.setup_errors += 1;
                    self.connect_failed(key, ConnectFailure::Error);
                }
            }
            CmEventKind::AddrError | CmEventKind::RouteError | CmEventKind::Unreachable => {
                self.connect_failed(key, ConnectFailure::Unreachable)
            }
            CmEventKind::ConnectError => self.connect_failed(key, ConnectFailure::Error),
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
                self.connect_failed(key, why);
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
                ep.handle_established(now, conn, &private);
                for (slot, bytes) in early {
                    ep.handle_recv(now, conn, slot, &bytes);
                }
            }
            CmEventKind::Disconnected | CmEventKind::DeviceRemoval => {
                self.stats.disconnects += 1;
                let Some(conn) = conn else {
                    // A request the engine has not answered: drop it.
                    if c.phase == Phase::RequestPending {
                        self.conns.remove(key);
                    }
                    return;
                };
                if c.reported_down {
                    return;
                }
                c.reported_down = true;
                if c.reported_up {
                    c.phase = Phase::Closing;
                    ep.handle_disconnected(now, conn);
                } else {
                    self.connect_failed(key, ConnectFailure::Error);
                }
            }
            _ => {}
        }
    }

    fn connect_failed(&mut self, key: usize, why: ConnectFailure) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        c.phase = Phase::Closing;
        let Some(conn) = c.conn else { return };
        if c.reported_up {
            if !c.reported_down {
                c.reported_down = true;
                self.out.push_back(Report::Disconnected(conn));
            }
            return;
        }
        c.reported_down = true;
        if c.active {
            self.stats.connect_failures += 1;
            self.out.push_back(Report::ConnectFailed(conn, why));
        } else {
            self.out.push_back(Report::Disconnected(conn));
        }
    }
}

impl crate::fabric::driver::Driver for VerbsFabric {
    fn apply(&mut self, now: Instant, action: FabricAction) {
        VerbsFabric::apply(self, now, action);
    }

    fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        ep: &mut Endpoint,
        now: &dyn Fn() -> Instant,
    ) -> io::Result<()> {
        VerbsFabric::poll(self, timeout, ep, now)
    }

    fn set_waker(&mut self, fd: std::os::fd::RawFd) {
        self.waker = Some(fd);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.stats.counters()
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

    #[test]
    fn verbs_fabric_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<VerbsFabric>();
    }
}
