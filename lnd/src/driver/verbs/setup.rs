//! Opening the fabric and the connection manager: devices, protection domains, the listener,
//! active connects, accept / reject, and the rdma_cm events that move a connection on.

use super::*;

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

    pub(super) fn pd(&mut self, dev: usize) -> io::Result<Arc<ProtectionDomain>> {
        if let Some(Some(pd)) = self.pds.get(dev) {
            return Ok(Arc::clone(pd));
        }
        let pd = self.devices.alloc_pd(dev)?;
        if let Some(slot) = self.pds.get_mut(dev) {
            *slot = Some(Arc::clone(&pd));
        }
        Ok(pd)
    }

    pub(super) fn device_limits(&mut self, dev: usize) -> Option<DeviceLimits> {
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

    pub(super) fn param(&self) -> ConnParam {
        ConnParam {
            retry_count: self.cfg.retry_count,
            rnr_retry_count: self.cfg.rnr_retry_count,
        }
    }

    pub(super) fn timeout_ms(&self) -> i32 {
        i32::try_from(self.cfg.resolve_timeout.as_millis()).unwrap_or(i32::MAX)
    }

    pub(super) fn new_vconn(&mut self, id: Option<CmId>, phase: Phase, active: bool) -> VConnId {
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

    pub(super) fn lookup(&self, conn: ConnId) -> Option<VConnId> {
        self.by_conn.get(&conn).copied()
    }

    /// The connection an action of the engine names; `None`, counted as an unknown action, for
    /// one this fabric does not hold (destroyed already).
    pub(super) fn known(&mut self, conn: ConnId) -> Option<VConnId> {
        let vc = self.lookup(conn);
        if vc.is_none() {
            self.stats.unknown_actions += 1;
        }
        vc
    }

    /// Whether connection `vc` takes new work; if not (its queue pair is going or gone), `wr`
    /// completes `Flushed`, as work on a queue pair in error does.
    pub(super) fn takes_work(&mut self, vc: VConnId, conn: ConnId, wr: WrId) -> bool {
        let usable = Self::usable(&self.conns[vc]);
        if !usable {
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Flushed));
        }
        usable
    }

    pub(super) fn connect(
        &mut self,
        conn: ConnId,
        peer: Nid,
        private: PrivateData,
        recv_slots: u16,
    ) {
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
    pub(super) fn setup(&mut self, vc: VConnId) -> io::Result<()> {
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

    /// The connection whose connect request `req` waits for the engine's answer; `None`,
    /// counted as an unknown action, when there is none (answered already, or the peer went
    /// away meanwhile).
    fn pending_request(&mut self, req: RequestId) -> Option<VConnId> {
        let vc = VConnId::from_u64(req.0);
        let ok = self
            .conns
            .get(vc)
            .is_some_and(|c| c.phase == Phase::RequestPending);
        if !ok {
            self.stats.unknown_actions += 1;
        }
        ok.then_some(vc)
    }

    pub(super) fn accept(
        &mut self,
        req: RequestId,
        conn: ConnId,
        private: PrivateData,
        recv_slots: u16,
    ) {
        let Some(vc) = self.pending_request(req) else {
            self.out
                .push_back(Report::ConnectFailed(conn, ConnectFailure::Error));
            return;
        };
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

    pub(super) fn reject(&mut self, req: RequestId, private: PrivateData) {
        let Some(vc) = self.pending_request(req) else {
            return;
        };
        self.stats.rejects_sent += 1;
        let mut c = self.conns.remove(vc).expect("the request was just found");
        if let Some(id) = c.id.as_mut() {
            if let Err(e) = id.reject(private.as_bytes()) {
                debug!(error = %e, "verbs fabric: rdma_reject");
            }
        }
    }

    pub(super) fn cm_event(&mut self, ev: CmEvent, sink: &mut dyn FabricSink, now: Instant) {
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

    pub(super) fn connect_failed(&mut self, vc: VConnId, why: ConnectFailure) {
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
