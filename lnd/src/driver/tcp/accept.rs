//! Connection setup: active connects, the listening socket and its handshakes (accept, back-off
//! when out of descriptors), CONNACK / REJECT.

use super::*;

impl TcpFabric {
    pub(super) fn connect(
        &mut self,
        conn: ConnId,
        peer: Nid,
        private: PrivateData,
        recv_slots: u16,
    ) {
        self.stats.connects += 1;
        let Some(addr) = (self.resolver)(peer) else {
            debug!(%peer, "tcp fabric: no address for peer");
            self.stats.connect_failures += 1;
            return self.dead_conn(
                conn,
                Report::ConnectFailed(conn, ConnectFailure::Unreachable),
            );
        };
        let stream = match self.open_socket(addr) {
            Ok(s) => s,
            Err(e) => {
                debug!(%peer, %addr, error = %e, "tcp fabric: cannot create a socket");
                self.stats.connect_failures += 1;
                return self.dead_conn(conn, Report::ConnectFailed(conn, ConnectFailure::Error));
            }
        };
        let sock = self.new_sock(Some(stream), Phase::Connecting, true, Some(conn));
        self.map(conn, sock);
        let s = &mut self.socks[sock];
        s.slots.post_first(recv_slots);
        s.queue_frame(FrameKind::ConnReq, private.as_bytes(), None);
        let t = tag(OpTag::Connect, sock);
        if let Some(stream) = &s.stream {
            self.ring.connect(stream.as_fd(), addr, t);
            s.ops += 1;
        }
    }

    pub(super) fn accept(
        &mut self,
        req: RequestId,
        conn: ConnId,
        private: PrivateData,
        recv_slots: u16,
    ) {
        let Some(sock) = self.request_sock(req) else {
            self.stats.unknown_actions += 1;
            return self.dead_conn(
                conn,
                Report::Disconnected(conn, DisconnectReason::TransportError),
            );
        };
        self.map(conn, sock);
        let s = &mut self.socks[sock];
        s.conn = Some(conn);
        if s.phase != Phase::RequestPending {
            // The requester went away meanwhile.
            s.reported_down = true;
            self.out
                .push_back(Report::Disconnected(conn, DisconnectReason::TransportError));
            return;
        }
        s.slots.post_first(recv_slots);
        self.end_handshake(sock);
        let s = &mut self.socks[sock];
        s.queue_frame(
            FrameKind::ConnAck,
            private.as_bytes(),
            Some(Done::Established),
        );
        s.phase = Phase::Open;
        self.arm_send(sock);
        self.make_ready(sock);
    }

    pub(super) fn reject(&mut self, req: RequestId, private: PrivateData) {
        let Some(sock) = self.request_sock(req) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let s = &mut self.socks[sock];
        if s.phase == Phase::RequestPending {
            s.queue_frame(
                FrameKind::Reject,
                private.as_bytes(),
                Some(Done::RejectSent),
            );
            s.phase = Phase::Rejecting;
            self.stats.rejects_sent += 1;
            self.arm_send(sock);
        }
        self.maybe_free(sock);
    }

    pub(super) fn on_accept(&mut self, c: Completion, now: Instant) {
        if !c.more {
            self.accept_armed = false;
        }
        let Some(fd) = c.fd else {
            let errors = &mut self.stats.accept_errors;
            if let Some(errno) = accept_failed(c.result, errors, "tcp fabric") {
                self.pause_accept(errno);
            }
            return;
        };
        self.stats.accepted += 1;
        if self.fd_short(fd.as_raw_fd()) {
            // Keep the last descriptors for the rest of the process (the control socket).
            self.stats.accepts_shed += 1;
            drop(fd);
            self.pause_accept(libc::EMFILE);
            return;
        }
        if self.cfg.handshake_limit > 0 && self.handshakes >= self.cfg.handshake_limit {
            self.stats.handshakes_refused += 1;
            trace!(
                limit = self.cfg.handshake_limit,
                "tcp fabric: too many handshakes, accepted socket closed"
            );
            return;
        }
        if self.accept_pause.is_none() {
            self.accept_backoff = ACCEPT_BACKOFF_MIN;
            self.accept_probe = false;
        }
        let stream = TcpStream::from(fd);
        let source = stream.peer_addr().ok().map(|a| a.ip());
        let per_source = self.cfg.handshake_limit_per_source;
        if let Some(ip) = source.filter(|_| per_source > 0) {
            if self.handshakes_by_source.get(&ip).copied().unwrap_or(0) >= per_source {
                self.stats.handshakes_refused += 1;
                self.stats.handshakes_refused_source += 1;
                trace!(%ip, per_source, "tcp fabric: too many handshakes from one source, closed");
                return;
            }
        }
        if let Err(e) = self.configure(&stream) {
            self.stats.socket_errors += 1;
            debug!(error = %e, "tcp fabric: cannot configure an accepted socket");
        }
        let sock = self.new_sock(Some(stream), Phase::AwaitConnReq, false, None);
        let s = &mut self.socks[sock];
        s.since = now;
        s.handshake = true;
        s.source = source;
        self.handshakes += 1;
        if let Some(ip) = source {
            *self.handshakes_by_source.entry(ip).or_insert(0) += 1;
        }
        self.arm_recv(sock);
    }

    /// True if accepting descriptor `fd` leaves fewer than `fd_reserve` descriptors under
    /// RLIMIT_NOFILE. Descriptors are allocated lowest first, so every number below `fd` is
    /// open: at most `limit - fd - 1` remain.
    pub(super) fn fd_short(&self, fd: std::os::fd::RawFd) -> bool {
        let reserve = u64::from(self.cfg.fd_reserve);
        if reserve == 0 {
            return false;
        }
        match uring::nofile_limit() {
            Ok(Some(limit)) => u64::try_from(fd).unwrap_or(0) + reserve >= limit,
            _ => false,
        }
    }

    /// Stops accepting for the current back-off (then doubles it, capped), counted in
    /// `accept_backoffs`, and warns at most once per `FD_WARN_INTERVAL`. Connections wait in
    /// the listen backlog meanwhile.
    pub(super) fn pause_accept(&mut self, errno: i32) {
        if self.accept_pause.is_some() {
            return; // Already paused: a socket the kernel accepted before the cancel landed.
        }
        let pause = self.accept_backoff;
        self.accept_backoff = (pause * 2).min(ACCEPT_BACKOFF_MAX);
        let t = std::time::Instant::now();
        self.accept_pause = Some(t + pause);
        self.accept_probe = true;
        self.stats.accept_backoffs += 1;
        if self.accept_armed {
            self.ring
                .cancel_fd(self.listener.as_fd(), tag(OpTag::AcceptCancel, NO_SOCK));
        }
        match self.fd_warned {
            Some(last) if t.duration_since(last) < FD_WARN_INTERVAL => self.fd_suppressed += 1,
            _ => {
                warn!(
                    errno,
                    pause_ms = pause.as_millis() as u64,
                    not_logged_since = self.fd_suppressed,
                    accept_errors = self.stats.accept_errors,
                    accepts_shed = self.stats.accepts_shed,
                    reserve = self.cfg.fd_reserve,
                    "tcp fabric: at the descriptor limit (RLIMIT_NOFILE); accepting paused \
                     (logged at most once per {FD_WARN_INTERVAL:?})"
                );
                self.fd_warned = Some(t);
                self.fd_suppressed = 0;
            }
        }
    }

    /// The socket's handshake is over (established or shut): it no longer counts against the
    /// limit.
    pub(super) fn end_handshake(&mut self, sock: SockId) {
        let s = &mut self.socks[sock];
        if s.handshake {
            s.handshake = false;
            self.handshakes -= 1;
            let source = s.source;
            self.source_done(source);
        }
    }

    /// One handshake from `source` is over.
    pub(super) fn source_done(&mut self, source: Option<std::net::IpAddr>) {
        if let Some(ip) = source {
            if let Some(n) = self.handshakes_by_source.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    self.handshakes_by_source.remove(&ip);
                }
            }
        }
    }

    pub(super) fn on_connect(
        &mut self,
        sock: SockId,
        res: i32,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        let s = &mut self.socks[sock];
        if s.shut {
            return;
        }
        if res == 0 {
            s.phase = Phase::AwaitReply;
            self.arm_send(sock);
            self.arm_recv(sock);
            return;
        }
        self.stats.connect_failures += 1;
        let errno = -res;
        let why = match errno {
            // Nothing listens there: refused, as rdma_cm's REJECTED with reason 8.
            libc::ECONNREFUSED => ConnectFailure::NoListener,
            libc::ETIMEDOUT
            | libc::EHOSTUNREACH
            | libc::ENETUNREACH
            | libc::ECONNRESET
            | libc::EADDRNOTAVAIL => ConnectFailure::Unreachable,
            _ => ConnectFailure::Error,
        };
        debug!(errno, "tcp fabric: connect failed");
        self.broken(sock, WcStatus::Flushed, (why, TRANSPORT), sink, now);
    }
}
