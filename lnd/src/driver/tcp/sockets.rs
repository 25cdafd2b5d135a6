//! Sockets and the ring: binding, the poll loop (submit, reap, dispatch by op tag), and the
//! bookkeeping of sockets (connection map, arming receives and sends).

use super::*;

impl TcpFabric {
    /// Listens on `listen` (port 0 for an ephemeral one, see [`TcpFabric::local_addr`]);
    /// `resolver` maps a peer NID to the address its fabric listens on.
    pub fn bind(
        listen: SocketAddr,
        resolver: impl Fn(Nid) -> Option<SocketAddr> + Send + 'static,
    ) -> io::Result<TcpFabric> {
        TcpFabric::bind_with(listen, resolver, TcpConfig::default())
    }

    /// [`TcpFabric::bind`] with explicit settings.
    pub fn bind_with(
        listen: SocketAddr,
        resolver: impl Fn(Nid) -> Option<SocketAddr> + Send + 'static,
        mut cfg: TcpConfig,
    ) -> io::Result<TcpFabric> {
        cfg.recv_buffer = cfg.recv_buffer.max(2 * MAX_FRAME);
        // Room for a whole CONNREQ frame (and its compaction), never more than the full buffer.
        cfg.handshake_buffer = cfg
            .handshake_buffer
            .clamp(2 * (HEAD_LEN + PrivateData::MAX), cfg.recv_buffer);
        let listener = bind_listener(listen, cfg.bind_retry)?;
        // std listens with a backlog of 128: a burst of reconnecting clients beyond that has
        // its SYNs dropped and retried a second later, however fast we accept.
        uring::set_listen_backlog(listener.as_fd(), LISTEN_BACKLOG)?;
        let ring = Ring::new(cfg.ring_entries.max(8))?;
        let local = listener.local_addr()?;
        let mut f = TcpFabric {
            ring,
            listener,
            local,
            accept_armed: false,
            accept_pause: None,
            overruns: Vec::new(),
            accept_backoff: ACCEPT_BACKOFF_MIN,
            accept_probe: false,
            fd_warned: None,
            fd_suppressed: 0,
            handshakes: 0,
            handshakes_by_source: HashMap::new(),
            resolver: Box::new(resolver),
            cfg,
            socks: HandleSlab::with_generation_bits(GEN_BITS),
            next_sweep: Instant::ZERO,
            scratch: Vec::new(),
            by_conn: Vec::new(),
            out: VecDeque::new(),
            ready: Vec::new(),
            tx_pending: Vec::new(),
            cqes: Vec::new(),
            pool: Vec::new(),
            watched: Vec::new(),
            woken: false,
            waker_fd: None,
            bell: None,
            spare: Vec::new(),
            regions: HashMap::new(),
            next_region: region_seed(),
            keys: RegionKeys::new(),
            next_region_addr: REGION_BASE,
            wc_log: WcLog::default(),
            stats: TcpStats::default(),
        };
        f.arm_accept();
        Ok(f)
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters.
    pub fn stats(&self) -> &TcpStats {
        &self.stats
    }

    /// The io_uring counters.
    pub fn ring_stats(&self) -> &RingStats {
        self.ring.stats()
    }

    /// The settings.
    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }

    /// Sockets this fabric still holds (connections, pending requests, closing sockets).
    pub fn sockets(&self) -> usize {
        self.socks.len()
    }

    /// Accepted sockets in their handshake now (waiting for the CONNREQ, for the engine's
    /// answer, or for our REJECT to go out): what [`TcpConfig::handshake_limit`] bounds.
    pub fn handshakes(&self) -> usize {
        self.handshakes
    }

    /// Bytes of receive buffers the sockets hold now (buffers kept for reuse not included).
    pub fn rx_buffer_bytes(&self) -> usize {
        self.socks.iter().map(|(_, s)| s.rbuf_len).sum()
    }

    /// The counters of [`TcpStats::counters`], then the gauges `handshakes` and
    /// `rx_buffer_bytes` (for `lnetctl net show -v`).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut v = self.stats.counters();
        v.push(("handshakes", self.handshakes as u64));
        v.push(("rx_buffer_bytes", self.rx_buffer_bytes() as u64));
        v
    }

    /// True if `poll` has work that needs no waiting (reports to deliver, parsing to resume).
    pub fn has_work(&self) -> bool {
        !self.out.is_empty() || !self.ready.is_empty()
    }

    /// Submits queued I/O, waits up to `timeout` for a completion (`None`: without limit; no wait
    /// at all if [`TcpFabric::has_work`]), then reads the clock once with `now_fn` and feeds `sink`
    /// everything that happened. Drain `sink`'s actions into [`TcpFabric::apply`] before calling it
    /// again.
    pub fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        sink: &mut dyn FabricSink,
        now_fn: impl Fn() -> Instant,
    ) -> io::Result<()> {
        self.arm_pending_sends();
        let mut timeout = timeout;
        if let Some(until) = self.next_overrun() {
            let left = until.saturating_duration_since(std::time::Instant::now());
            timeout = Some(timeout.map_or(left, |t| t.min(left)));
        }
        if let Some(until) = self.accept_pause {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                self.accept_pause = None;
            } else {
                // Wake up in time to accept again.
                timeout = Some(timeout.map_or(left, |t| t.min(left)));
            }
        }
        if !self.accept_armed && self.accept_pause.is_none() {
            self.arm_accept();
        }
        for (i, w) in self.watched.iter_mut().enumerate() {
            if w.0 >= 0 && !w.1 {
                self.ring
                    .poll_readable(w.0, tag(OpTag::Waker, SockId::from_parts(i as u32, 0)));
                w.1 = true;
            }
        }
        let timeout = if self.has_work() {
            Some(std::time::Duration::ZERO)
        } else {
            timeout
        };
        // Busy-poll first (bounded by `busy_poll` and by the caller's timeout; see
        // `spin_on_ring` for why and how), then sleep in the kernel for the rest.
        let spin = timeout.map_or(self.cfg.busy_poll, |t| t.min(self.cfg.busy_poll));
        let waited = crate::driver::spin_on_ring(&mut self.ring, self.bell.as_ref(), spin)?;
        if !waited {
            let rest = timeout.map(|t| t.saturating_sub(spin));
            self.ring.submit_and_wait(rest)?;
        }
        for b in self.spare.drain(..) {
            sink.recycle(b);
        }
        let now = now_fn();
        self.flush_out(sink, now);
        self.run_ready(sink, now);
        let mut cqes = std::mem::take(&mut self.cqes);
        self.ring.reap(&mut cqes);
        for c in cqes.drain(..) {
            self.complete(c, sink, now);
        }
        self.cqes = cqes;
        self.run_ready(sink, now);
        self.break_overruns(sink, now);
        self.sweep(now);
        Ok(())
    }

    /// The earliest instant a connection breaks for a credit overrun, if one waits.
    pub(super) fn next_overrun(&self) -> Option<std::time::Instant> {
        self.overruns
            .iter()
            .filter_map(|&sock| self.socks.get(sock).and_then(|s| s.overrun_deadline))
            .min()
    }

    /// Breaks the connections whose peer sent past its credits and got no slot within
    /// `rnr_horizon`, as RC breaks the sender's queue pair once its RNR retries are spent
    /// (o2iblnd asks for 6, kiblnd_connect_peer / kiblnd_passive_connect); and forgets the
    /// sockets whose frame got a slot. An honest peer never gets here: credits bound what it
    /// may send to the slots posted. Failing it fast (the 3FS lesson: rnr_retry 0, "a credit
    /// bug fails fast instead of stalling") names the fault, where a stall hid it.
    pub(super) fn break_overruns(&mut self, sink: &mut dyn FabricSink, now: Instant) {
        if self.overruns.is_empty() {
            return;
        }
        let at = std::time::Instant::now();
        let mut due = Vec::new();
        self.overruns.retain(
            |&sock| match self.socks.get(sock).and_then(|s| s.overrun_deadline) {
                Some(d) if d <= at => {
                    due.push(sock);
                    false
                }
                Some(_) => true,
                None => false,
            },
        );
        for sock in due {
            // Taken once: a socket that stalled, got a slot and stalled again between two
            // passes is listed twice, and is broken and counted once.
            let Some(s) = self.socks.get_mut(sock) else {
                continue;
            };
            if s.overrun_deadline.take().is_none() || s.shut {
                continue;
            }
            self.stats.credit_overruns += 1;
            debug!(conn = ?s.conn, "tcp fabric: the peer sent past its credits, closing the connection");
            self.broken_by_peer(sock, WcStatus::Error, sink, now);
        }
    }

    /// See `Driver::set_waker`.
    pub fn set_waker(&mut self, fd: std::os::fd::RawFd) {
        self.waker_fd = Some(fd);
        self.watch(fd);
    }

    /// See `Driver::set_doorbell`: the busy-poll looks at its flag in every round.
    pub fn set_doorbell(&mut self, bell: Doorbell) {
        self.bell = Some(bell);
    }

    /// Ends a wait also when `fd` becomes readable (see `Driver::watch`).
    pub fn watch(&mut self, fd: std::os::fd::RawFd) {
        self.watched.push((fd, false));
    }

    /// A descriptor that is readable whenever this fabric has completions to reap (its
    /// io_uring): another loop on the same thread watches it (see `Driver::readiness_fd`).
    pub fn readiness_fd(&self) -> std::os::fd::RawFd {
        self.ring.raw_fd()
    }

    /// Closes accepted sockets that did not finish their handshake in time (at most a few times
    /// per `handshake_timeout`, so the scan's cost does not follow the message rate).
    pub(super) fn sweep(&mut self, now: Instant) {
        if now < self.next_sweep {
            return;
        }
        let limit = crate::time::Duration::from(self.cfg.handshake_timeout);
        self.next_sweep = now
            + crate::time::Duration::from_nanos(limit.as_nanos() / 4)
                .max(crate::time::Duration::from_millis(10));
        let mut stale = std::mem::take(&mut self.scratch);
        stale.extend(self.socks.iter().filter_map(|(sock, s)| {
            let waiting = matches!(s.phase, Phase::AwaitConnReq | Phase::Rejecting);
            (waiting && !s.shut && now.saturating_duration_since(s.since) >= limit).then_some(sock)
        }));
        for sock in stale.drain(..) {
            self.stats.handshake_timeouts += 1;
            debug!(
                ?sock,
                "tcp fabric: accepted socket did not finish its handshake"
            );
            self.shut(sock);
            self.maybe_free(sock);
        }
        self.scratch = stale;
        // A burst of sockets (a reconnect storm, a flood of silent ones) leaves the slab's
        // capacity behind when it is over: give it back (keys of live sockets stay valid; the
        // slab shrinks down to its highest live key).
        if self.socks.capacity() > 1024 && self.socks.len() * 4 < self.socks.capacity() {
            self.socks.shrink_to_fit();
        }
    }

    pub(super) fn flush_out(&mut self, sink: &mut dyn FabricSink, now: Instant) {
        while let Some(r) = self.out.pop_front() {
            if self.lookup(r.conn()).is_none() {
                continue; // destroyed since: nothing more is reported for it
            }
            match r {
                Report::SendDone(c, wr, st) => complete_wr(&mut self.wc_log, sink, now, c, wr, st),
                Report::Disconnected(c, why) => sink.handle_disconnected(now, c, why),
                Report::ConnectFailed(c, why) => sink.handle_connect_failed(now, c, why),
            }
        }
    }

    pub(super) fn run_ready(&mut self, sink: &mut dyn FabricSink, now: Instant) {
        let mut ready = std::mem::take(&mut self.ready);
        for sock in ready.drain(..) {
            let Some(s) = self.socks.get_mut(sock) else {
                continue; // freed since it was queued
            };
            s.in_ready = false;
            if s.faulted {
                self.run_markers(sock, sink, now);
                let Some(s) = self.socks.get_mut(sock) else {
                    continue;
                };
                if s.shut {
                    continue;
                }
            }
            let s = &mut self.socks[sock];
            if s.rbuf.is_some() && !s.recv_armed {
                s.stalled = false;
                self.parse(sock, sink, now);
            }
        }
        if self.ready.is_empty() {
            self.ready = ready;
        }
    }

    pub(super) fn complete(&mut self, c: Completion, sink: &mut dyn FabricSink, now: Instant) {
        let (op, sock): (Option<OpTag>, SockId) = untag(c.tag);
        if op == Some(OpTag::Accept) {
            return self.on_accept(c, now);
        }
        if op == Some(OpTag::AcceptCancel) {
            return; // the accept itself completes with ECANCELED
        }
        if op == Some(OpTag::Waker) {
            let Some(w) = self.watched.get_mut(sock.index() as usize) else {
                return;
            };
            self.woken |= crate::driver::watch_fired(w, self.waker_fd, c.result, "tcp fabric");
            return;
        }
        let Some(s) = self.socks.get_mut(sock) else {
            return; // a late completion for a freed socket
        };
        s.ops = s.ops.saturating_sub(1);
        match op {
            Some(OpTag::Recv) => {
                s.recv_armed = false;
                s.rbuf = c.buf;
                self.on_recv(sock, c.result, sink, now);
            }
            Some(OpTag::Send) => {
                s.send_armed = false;
                self.on_send(sock, c.result, c.buf, sink, now);
            }
            Some(OpTag::Connect) => self.on_connect(sock, c.result, sink, now),
            Some(OpTag::Cancel)
            | Some(OpTag::Accept)
            | Some(OpTag::Waker)
            | Some(OpTag::AcceptCancel)
            | None => {}
        }
        self.maybe_free(sock);
    }

    pub(super) fn open_socket(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let stream = TcpStream::from(uring::tcp_socket(addr)?);
        self.configure(&stream)?;
        Ok(stream)
    }

    pub(super) fn configure(&self, stream: &TcpStream) -> io::Result<()> {
        stream.set_nodelay(true)?;
        uring::set_tcp_user_timeout(stream.as_fd(), self.cfg.user_timeout)
    }

    pub(super) fn new_sock(
        &mut self,
        stream: Option<TcpStream>,
        phase: Phase,
        active: bool,
        conn: Option<ConnId>,
    ) -> SockId {
        let shut = stream.is_none();
        // An accepted socket is unauthenticated until its handshake is done: a small receive
        // buffer and no write buffers from the pool (its CONNACK or REJECT allocates a little).
        let small = !active && phase == Phase::AwaitConnReq;
        let rbuf = if shut {
            None
        } else if small {
            Some(vec![0; self.cfg.handshake_buffer])
        } else {
            let mut b = self.pool.pop().unwrap_or_default();
            b.resize(self.cfg.recv_buffer, 0);
            Some(b)
        };
        let rbuf_len = rbuf.as_ref().map_or(0, Vec::len);
        let spare = (!shut).then(|| {
            if small {
                Vec::new()
            } else {
                self.pool.pop().unwrap_or_default()
            }
        });
        let wq = if shut || small {
            Vec::new()
        } else {
            self.pool.pop().unwrap_or_default()
        };
        self.socks.insert(Sock {
            stream,
            phase: if shut { Phase::Closed } else { phase },
            active,
            conn,
            ops: 0,
            destroyed: false,
            shut,
            established: false,
            reported_down: false,
            local_disconnect: false,
            peer_disconnect: false,
            rx_eof: false,
            in_ready: false,
            tx_pending: false,
            since: Instant::ZERO,
            handshake: false,
            source: None,
            rbuf_len,
            grants: grants::Grants::default(),
            rx_write: None,
            heads_only: false,
            rbuf,
            rstart: 0,
            rend: 0,
            recv_armed: false,
            stalled: false,
            overrun_deadline: None,
            slots: Slots::default(),
            wq,
            spare,
            w_off: 0,
            send_armed: false,
            tx_dead: shut,
            backlog: VecDeque::new(),
            faulted: false,
            markers: VecDeque::new(),
            queued: 0,
            written: 0,
        })
    }

    /// A connection that failed before it had a socket: held until its Destroy so that the
    /// report stays valid.
    pub(super) fn dead_conn(&mut self, conn: ConnId, report: Report) {
        if self.lookup(conn).is_some() {
            return;
        }
        let sock = self.new_sock(None, Phase::Closed, true, Some(conn));
        self.socks[sock].reported_down = true;
        self.map(conn, sock);
        self.out.push_back(report);
    }

    pub(super) fn map(&mut self, conn: ConnId, sock: SockId) {
        let i = conn.index() as usize;
        if self.by_conn.len() <= i {
            self.by_conn.resize(i + 1, None);
        }
        self.by_conn[i] = Some((conn, sock));
    }

    pub(super) fn lookup(&self, conn: ConnId) -> Option<SockId> {
        match self.by_conn.get(conn.index() as usize) {
            Some(&Some((c, sock))) if c == conn => Some(sock),
            _ => None,
        }
    }

    /// The socket of connect request `req` (its handle's `as_u64`), if it still waits for the
    /// engine's answer (or closed meanwhile and nobody took it).
    pub(super) fn request_sock(&self, req: RequestId) -> Option<SockId> {
        let sock = SockId::from_u64(req.0);
        let s = self.socks.get(sock)?;
        (s.conn.is_none() && matches!(s.phase, Phase::RequestPending | Phase::Closed))
            .then_some(sock)
    }

    /// Arms the socket's send at the start of the next `poll` rather than now: SQEs are only
    /// submitted there anyway, and a send armed at the first of several frames applied in a row
    /// would carry that frame alone, the rest waiting a round through the kernel for its
    /// completion.
    pub(super) fn defer_send(&mut self, sock: SockId) {
        enlist(&mut self.socks[sock].tx_pending, &mut self.tx_pending, sock);
    }

    /// Arms the sends deferred by `defer_send`.
    pub(super) fn arm_pending_sends(&mut self) {
        let mut pending = std::mem::take(&mut self.tx_pending);
        for sock in pending.drain(..) {
            let Some(s) = self.socks.get_mut(sock) else {
                continue; // freed since
            };
            s.tx_pending = false;
            self.arm_send(sock);
        }
        self.tx_pending = pending;
    }

    pub(super) fn make_ready(&mut self, sock: SockId) {
        enlist(&mut self.socks[sock].in_ready, &mut self.ready, sock);
    }

    pub(super) fn arm_accept(&mut self) {
        let t = tag(OpTag::Accept, NO_SOCK);
        if self.accept_probe {
            self.ring.accept_one(self.listener.as_fd(), t);
        } else {
            self.ring.accept_multi(self.listener.as_fd(), t);
        }
        self.accept_armed = true;
    }

    pub(super) fn arm_recv(&mut self, sock: SockId) {
        let s = &mut self.socks[sock];
        if s.recv_armed || s.shut || s.rx_eof || s.stalled || s.phase == Phase::Connecting {
            return;
        }
        let Some(stream) = &s.stream else {
            return;
        };
        let Some(buf) = s.rbuf.take() else {
            return;
        };
        if s.rend >= buf.len() {
            s.rbuf = Some(buf);
            return;
        }
        let t = tag(OpTag::Recv, sock);
        let max = if std::mem::take(&mut s.heads_only) {
            HEAD_LEN + WRITE_HEAD_LEN
        } else {
            usize::MAX
        };
        self.ring.recv(stream.as_fd(), buf, s.rend, max, t);
        s.recv_armed = true;
        s.ops += 1;
    }

    pub(super) fn arm_send(&mut self, sock: SockId) {
        let s = &self.socks[sock];
        if !s.send_armed && !s.backlog.is_empty() && !s.tx_dead && !s.shut {
            self.fill(sock);
        }
        let s = &mut self.socks[sock];
        if s.send_armed || s.tx_dead || s.shut || s.wq.is_empty() || s.phase == Phase::Connecting {
            return;
        }
        let Some(stream) = &s.stream else {
            return;
        };
        let Some(mut buf) = s.spare.take() else {
            return;
        };
        std::mem::swap(&mut buf, &mut s.wq);
        s.w_off = 0;
        let t = tag(OpTag::Send, sock);
        self.ring.send(stream.as_fd(), buf, 0, t);
        s.send_armed = true;
        s.ops += 1;
    }
}
