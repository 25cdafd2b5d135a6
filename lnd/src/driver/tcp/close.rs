//! Ending connections: disconnect and destroy, and every failure path (errno counting, protocol
//! and access errors, flushing what was not sent, reporting the connection down).

use super::*;

impl TcpFabric {
    pub(super) fn disconnect(&mut self, conn: ConnId) {
        let Some(sock) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let s = &mut self.socks[sock];
        if s.local_disconnect {
            return;
        }
        s.local_disconnect = true;
        if s.phase == Phase::Open && !s.tx_dead && !s.shut {
            // Written after what is queued; the peer's DISCONNECT or EOF confirms.
            if s.backlog.is_empty() && !s.faulted {
                s.queue_frame(FrameKind::Disconnect, &[], Some(Done::ShutWr));
            } else {
                s.backlog.push_back(Tx::Disconnect);
            }
            let stalled = s.stalled;
            self.arm_send(sock);
            if stalled {
                // Parse on (dropping MSGs) so the peer's DISCONNECT or EOF is seen.
                self.make_ready(sock);
            }
            return;
        }
        self.shut(sock);
        let s = &mut self.socks[sock];
        if !s.reported_down {
            // Never open, or already broken (then reported): our close is all there is.
            s.reported_down = true;
            self.out
                .push_back(Report::Disconnected(conn, DisconnectReason::Closed));
        }
    }

    pub(super) fn destroy(&mut self, conn: ConnId) {
        let Some(sock) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        if let Some(e) = self.by_conn.get_mut(conn.index() as usize) {
            *e = None;
        }
        // The table is indexed by the engine's connection keys, which settle low once a storm
        // is over (`lnd::slots`): the entries above the highest live one go, and so does the
        // room a storm left (each entry is popped once, so this costs nothing over time).
        while self.by_conn.last().is_some_and(Option::is_none) {
            self.by_conn.pop();
        }
        if self.by_conn.capacity() > BY_CONN_FLOOR
            && self.by_conn.len() * 4 < self.by_conn.capacity()
        {
            self.by_conn
                .shrink_to((self.by_conn.len() * 2).max(BY_CONN_FLOOR));
        }
        self.socks[sock].destroyed = true;
        self.shut(sock);
        self.maybe_free(sock);
    }

    pub(super) fn count_errno(&mut self, errno: i32) -> WcStatus {
        match errno {
            libc::ETIMEDOUT => {
                self.stats.user_timeouts += 1;
                WcStatus::RetryExceeded
            }
            libc::ECONNRESET | libc::EPIPE => {
                self.stats.resets += 1;
                WcStatus::Error
            }
            _ => {
                self.stats.socket_errors += 1;
                WcStatus::Error
            }
        }
    }

    /// A peer's RDMA write names memory we do not have (IBV_WC_REM_ACCESS_ERR at the writer):
    /// nothing is written, and the connection goes to error as an RC queue pair would. Our own
    /// pending sends flush; the writer sees the socket close.
    pub(super) fn access_error(
        &mut self,
        sock: SockId,
        why: &'static str,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        self.stats.rdma_access_errors += 1;
        let conn = self.socks[sock].conn;
        debug!(
            why,
            ?conn,
            "tcp fabric: RDMA write access error, closing the connection"
        );
        self.socks[sock].rx_write = None;
        self.broken_by_peer(sock, WcStatus::Flushed, sink, now);
    }

    pub(super) fn protocol_error(
        &mut self,
        sock: SockId,
        e: FrameError,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        self.stats.count(e);
        let (phase, conn) = {
            let s = &self.socks[sock];
            (s.phase, s.conn)
        };
        debug!(error = %e, ?phase, ?conn, "tcp fabric: protocol error, closing the connection");
        self.broken_by_peer(sock, WcStatus::Error, sink, now);
    }

    /// The peer's DISCONNECT arrived (its DREQ: our queue pair goes to error): every send and
    /// write not yet completed completes `Flushed`, in posting order, and what is not handed to
    /// the socket yet is dropped (the peer discards whatever arrives after its DISCONNECT).
    pub(super) fn flush_unsent(&mut self, sock: SockId, sink: &mut dyn FabricSink, now: Instant) {
        let s = &mut self.socks[sock];
        if s.local_disconnect || s.tx_dead {
            return;
        }
        s.queued -= s.wq.len() as u64;
        s.wq.clear();
        s.faulted = false;
        let conn = s.live_conn();
        let log = &mut self.wc_log;
        s.markers.retain(|&(_, done)| match done {
            Done::Send(wr) | Done::Write(wr, _) | Done::Fault(wr) => {
                if let Some(c) = conn {
                    complete_wr(log, sink, now, c, wr, WcStatus::Flushed);
                }
                false
            }
            Done::Established | Done::ShutWr | Done::RejectSent => true,
        });
        for wr in s.drain_backlog(&mut self.spare) {
            if let Some(c) = conn {
                complete_wr(log, sink, now, c, wr, WcStatus::Flushed);
            }
        }
    }

    /// The peer broke the protocol (garbage, a write it has no grant for, credits overrun):
    /// [`Self::broken`], reported as a protocol error.
    pub(super) fn broken_by_peer(
        &mut self,
        sock: SockId,
        first: WcStatus,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        self.broken(sock, first, (ConnectFailure::Error, PROTOCOL), sink, now);
    }

    /// The connection is unusable: fail its queued sends (the first with `first`, the rest
    /// flushed), shut the socket and tell the engine once (`why`: see [`Self::report_down`]).
    pub(super) fn broken(
        &mut self,
        sock: SockId,
        first: WcStatus,
        why: (ConnectFailure, DisconnectReason),
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        let s = &mut self.socks[sock];
        s.tx_dead = true;
        s.wq.clear();
        let conn = s.live_conn();
        let mut status = first;
        while let Some((_, done)) = s.markers.pop_front() {
            let wr = match done {
                Done::Send(wr) | Done::Write(wr, _) | Done::Fault(wr) => wr,
                Done::Established | Done::ShutWr | Done::RejectSent => continue,
            };
            if let Some(c) = conn {
                complete_wr(&mut self.wc_log, sink, now, c, wr, status);
                status = WcStatus::Flushed;
            }
        }
        for wr in s.drain_backlog(&mut self.spare) {
            if let Some(c) = conn {
                complete_wr(&mut self.wc_log, sink, now, c, wr, status);
                status = WcStatus::Flushed;
            }
        }
        self.shut(sock);
        self.report_down(sock, why, sink, now);
    }

    /// Tells the engine, once, that the connection is gone, and why (`why.1`); or, for an active
    /// connect before its reply, that the connect failed (`why.0`).
    pub(super) fn report_down(
        &mut self,
        sock: SockId,
        why: (ConnectFailure, DisconnectReason),
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        let s = &mut self.socks[sock];
        if s.reported_down {
            return;
        }
        s.reported_down = true;
        let Some(conn) = s.live_conn() else {
            return;
        };
        if s.active && !s.established {
            sink.handle_connect_failed(now, conn, why.0);
        } else {
            sink.handle_disconnected(now, conn, why.1);
        }
    }

    /// Shuts the socket down and cancels its I/O; it is closed once the kernel lets go.
    pub(super) fn shut(&mut self, sock: SockId) {
        let s = &mut self.socks[sock];
        if s.shut {
            return;
        }
        s.shut = true;
        s.phase = Phase::Closed;
        s.stalled = false;
        if s.handshake {
            s.handshake = false;
            self.handshakes -= 1;
            let source = s.source;
            self.source_done(source);
        }
        let s = &mut self.socks[sock];
        if let Some(stream) = &s.stream {
            let _ = stream.shutdown(Shutdown::Both);
            if s.ops > 0 {
                self.ring
                    .cancel_fd(stream.as_fd(), tag(OpTag::Cancel, sock));
                s.ops += 1;
            }
        }
    }

    pub(super) fn maybe_free(&mut self, sock: SockId) {
        let Some(s) = self.socks.get(sock) else {
            return;
        };
        if s.ops == 0 && s.shut && (s.conn.is_none() || s.destroyed) {
            let Some(s) = self.socks.remove(sock) else {
                unreachable!("the socket was just found")
            };
            debug_assert!(
                !s.handshake,
                "a freed socket still counted in its handshake"
            );
            for mut b in [s.rbuf, s.spare, Some(s.wq)].into_iter().flatten() {
                // Small buffers (a handshake's) are freed: only the size worth reusing is kept.
                if self.pool.len() < POOL_MAX && b.capacity() >= self.cfg.recv_buffer {
                    b.clear();
                    self.pool.push(b);
                }
            }
        }
    }
}
