//! The receive side: posted slots, reads into the connection buffer, and the frames parsed from
//! it in place (messages into slots, RDMA writes into regions, the handshake frames).

use super::*;

impl TcpFabric {
    pub(super) fn post_recv(&mut self, conn: ConnId, slot: u16) {
        let Some(sock) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let s = &mut self.socks[sock];
        if !s.slots.post(slot) {
            self.stats.unknown_actions += 1;
            return;
        }
        if s.stalled {
            self.make_ready(sock);
        }
    }

    /// Gives an established connection its full receive buffer (the bytes not parsed yet move
    /// along); the small handshake buffer is freed, never pooled. A buffer lent to the ring is
    /// grown when it comes back (every parse starts here).
    pub(super) fn grow_rbuf(&mut self, sock: SockId) {
        let full = self.cfg.recv_buffer;
        let s = &mut self.socks[sock];
        if s.phase != Phase::Open || s.rbuf_len >= full {
            return;
        }
        let Some(old) = s.rbuf.take() else {
            return;
        };
        let mut b = self.pool.pop().unwrap_or_default();
        b.clear();
        b.resize(full, 0);
        let n = s.rend - s.rstart;
        b[..n].copy_from_slice(&old[s.rstart..s.rend]);
        s.rstart = 0;
        s.rend = n;
        s.rbuf = Some(b);
        s.rbuf_len = full;
    }

    pub(super) fn on_recv(
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
        if res > 0 {
            s.rend += res as usize;
            self.stats.bytes_rx += res as u64;
            return self.parse(sock, sink, now);
        }
        if res == 0 {
            s.rx_eof = true;
            if s.rstart < s.rend || s.rx_write.is_some() {
                return self.protocol_error(sock, FrameError::Truncated, sink, now);
            }
            if !s.peer_disconnect {
                self.stats.eof_without_disconnect += 1;
            }
            match s.phase {
                // The peer died (it sends DISCONNECT before any orderly EOF): what is queued
                // cannot arrive. Fail it as an RST would, without waiting for a write to fail.
                // Not a close: the transport failed under us (3FS #426).
                Phase::Open if !s.peer_disconnect && !s.local_disconnect => self.broken(
                    sock,
                    WcStatus::Error,
                    (ConnectFailure::Error, TRANSPORT),
                    sink,
                    now,
                ),
                Phase::Open => self.report_down(sock, (ConnectFailure::Error, CLOSED), sink, now),
                Phase::AwaitReply => self.broken(
                    sock,
                    WcStatus::Flushed,
                    (ConnectFailure::Unreachable, TRANSPORT),
                    sink,
                    now,
                ),
                Phase::Rejecting => {} // closes once the REJECT is written
                _ => self.shut(sock),
            }
            return;
        }
        let errno = -res;
        if errno == libc::ECANCELED {
            return;
        }
        let status = self.count_errno(errno);
        debug!(errno, "tcp fabric: receive failed");
        self.broken(
            sock,
            status,
            (ConnectFailure::Unreachable, TRANSPORT),
            sink,
            now,
        );
    }

    /// Parses complete frames out of the receive buffer and acts on them, then posts the next
    /// read unless a frame is stalled (see the module doc).
    pub(super) fn parse(&mut self, sock: SockId, sink: &mut dyn FabricSink, now: Instant) {
        if self.socks.contains(sock) {
            self.grow_rbuf(sock);
        }
        loop {
            let Some(s) = self.socks.get_mut(sock) else {
                return;
            };
            if s.shut || s.rbuf.is_none() {
                return;
            }
            let step = if s.rx_write.is_some() {
                self.rx_write_data(sock, sink, now)
            } else {
                self.parse_frame(sock, sink, now)
            };
            match step {
                Step::Next => {}
                Step::Wait => break,
                Step::Stop => return,
            }
        }
        // Only an incomplete frame (or nothing) is left: compact and read on.
        let Some(s) = self.socks.get_mut(sock) else {
            return;
        };
        s.stalled = false;
        if s.rstart == s.rend {
            s.rstart = 0;
            s.rend = 0;
        } else if let Some(buf) = s.rbuf.as_mut() {
            if buf.len() - s.rend < MAX_FRAME {
                buf.copy_within(s.rstart..s.rend, 0);
                s.rend -= s.rstart;
                s.rstart = 0;
            }
        }
        self.arm_recv(sock);
    }

    /// The data of the RDMA_WRITE being received: from the receive buffer into the region, then
    /// (when the rest is still in the socket) straight from the socket.
    fn rx_write_data(&mut self, sock: SockId, sink: &mut dyn FabricSink, now: Instant) -> Step {
        match self.rx_write_copy(sock, sink, now) {
            Err(step) => return step,
            Ok(true) => {
                if let Some(step) = self.rx_write_direct(sock, sink, now) {
                    return step;
                }
            }
            Ok(false) => {}
        }
        let Some(s) = self.socks.get_mut(sock) else {
            return Step::Stop;
        };
        let Some(w) = s.rx_write.as_ref() else {
            return Step::Stop;
        };
        if w.left > 0 {
            return Step::Wait;
        }
        if !w.discard {
            self.stats.rdma_frames_rx += 1;
        }
        s.rx_write = None;
        Step::Next
    }

    /// Copies what the receive buffer holds of the current write into its region; says whether
    /// the rest is worth reading straight from the socket.
    fn rx_write_copy(
        &mut self,
        sock: SockId,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) -> Result<bool, Step> {
        let Some(s) = self.socks.get_mut(sock) else {
            return Err(Step::Stop);
        };
        let (Some(buf), Some(w)) = (s.rbuf.as_ref(), s.rx_write.as_mut()) else {
            return Err(Step::Stop);
        };
        let n = w.left.min(s.rend - s.rstart);
        let src = &buf[s.rstart..s.rstart + n];
        if !w.discard {
            let landed = self.regions.get_mut(&w.key).is_some_and(|r| {
                r.with(|b| {
                    b.get_mut(w.off..w.off + n)
                        .map(|dst| dst.copy_from_slice(src))
                        .is_some()
                })
            });
            if !landed {
                // Deregistered while the write was streaming in.
                self.access_error(sock, "region deregistered", sink, now);
                return Err(Step::Stop);
            }
            self.stats.rdma_bytes_rx += n as u64;
        }
        w.off += n;
        w.left -= n;
        s.rstart += n;
        Ok(w.left > 0 && !w.discard && s.rstart == s.rend && w.grant_end - w.off >= DIRECT_MIN)
    }

    /// The rest of the write's data is still in the socket: reads it straight into the region
    /// (no recv is in flight: the ring holds `rbuf` while one is), not through `rbuf` and a
    /// copy. Non-blocking: what has not arrived comes by the ring as usual. `Some` ends the
    /// current parse step.
    fn rx_write_direct(
        &mut self,
        sock: SockId,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) -> Option<Step> {
        let s = self.socks.get_mut(sock)?;
        let w = s.rx_write.as_mut()?;
        let Some(stream) = s.stream.as_ref() else {
            return Some(Step::Wait);
        };
        while w.left > 0 {
            let Some(region) = self.regions.get_mut(&w.key) else {
                self.access_error(sock, "region deregistered", sink, now);
                return Some(Step::Stop);
            };
            let (off, left) = (w.off, w.left);
            let got = region.with(|b| {
                b.get_mut(off..off + left)
                    .map(|dst| rustix::net::recv(stream, dst, rustix::net::RecvFlags::DONTWAIT))
            });
            match got {
                None => {
                    self.access_error(sock, "region deregistered", sink, now);
                    return Some(Step::Stop);
                }
                Some(Ok((0, _))) => {
                    self.on_recv(sock, 0, sink, now);
                    return Some(Step::Stop);
                }
                Some(Ok((n, _))) => {
                    self.stats.bytes_rx += n as u64;
                    self.stats.rdma_bytes_rx += n as u64;
                    self.stats.rdma_direct_bytes_rx += n as u64;
                    w.off += n;
                    w.left -= n;
                }
                Some(Err(rustix::io::Errno::INTR)) => {}
                Some(Err(rustix::io::Errno::AGAIN)) => break,
                Some(Err(e)) => {
                    self.on_recv(sock, -e.raw_os_error(), sink, now);
                    return Some(Step::Stop);
                }
            }
        }
        // The next frame's data straight too, if the write goes on long enough.
        s.heads_only = w.left == 0 && w.grant_end - w.off >= DIRECT_MIN;
        None
    }

    /// One frame (of an RDMA_WRITE: its heads) at the front of the receive buffer, by the
    /// connection's phase.
    fn parse_frame(&mut self, sock: SockId, sink: &mut dyn FabricSink, now: Instant) -> Step {
        let Some(s) = self.socks.get_mut(sock) else {
            return Step::Stop;
        };
        let Some(buf) = s.rbuf.as_ref() else {
            return Step::Stop;
        };
        let avail = &buf[s.rstart..s.rend];
        let head = match frame::parse_head(avail) {
            Ok(Some(h)) => h,
            Ok(None) => return Step::Wait,
            Err(e) => {
                self.protocol_error(sock, e, sink, now);
                return Step::Stop;
            }
        };
        if s.phase == Phase::AwaitConnReq && head.kind != FrameKind::ConnReq {
            // Refused on its head: the handshake buffer only ever holds a CONNREQ.
            self.protocol_error(sock, FrameError::Unexpected(head.kind), sink, now);
            return Step::Stop;
        }
        // An RDMA_WRITE's data streams: only its write head must be here.
        let need = if head.kind == FrameKind::RdmaWrite {
            HEAD_LEN + WRITE_HEAD_LEN
        } else {
            head.frame_len()
        };
        if avail.len() < need {
            return Step::Wait;
        }
        let body = s.rstart + HEAD_LEN..s.rstart + head.frame_len();
        let next = s.rstart + head.frame_len();
        let conn = s.live_conn();
        match (s.phase, head.kind) {
            (Phase::RequestPending | Phase::Rejecting, _) => {
                // Nothing may follow a CONNREQ before the answer: wait for the engine.
                s.stalled = true;
                Step::Stop
            }
            (Phase::AwaitConnReq, FrameKind::ConnReq) => {
                s.rstart = next;
                s.phase = Phase::RequestPending;
                let req = RequestId(sock.as_u64());
                sink.handle_connect_request(now, req, &buf[body]);
                Step::Next
            }
            (Phase::AwaitReply, FrameKind::ConnAck) => {
                s.rstart = next;
                s.phase = Phase::Open;
                s.established = true;
                self.stats.established += 1;
                if let Some(c) = conn {
                    sink.handle_established(now, c, &buf[body]);
                }
                Step::Next
            }
            (Phase::AwaitReply, FrameKind::Reject) => {
                s.rstart = next;
                s.reported_down = true;
                let private = PrivateData::new(&buf[body]);
                self.rx_reject(sock, conn, private, sink, now)
            }
            (Phase::Open, FrameKind::Msg) if !s.peer_disconnect => {
                self.rx_msg(sock, next, body, sink, now)
            }
            (Phase::Open, FrameKind::RdmaWrite) if !s.peer_disconnect => {
                self.rx_write_head(sock, body.start, head.body_len, sink, now)
            }
            (Phase::Open, FrameKind::Disconnect) if !s.peer_disconnect => {
                s.rstart = next;
                s.peer_disconnect = true;
                self.stats.peer_disconnects += 1;
                self.flush_unsent(sock, sink, now);
                self.report_down(sock, (ConnectFailure::Error, CLOSED), sink, now);
                Step::Next
            }
            (_, kind) => {
                self.protocol_error(sock, FrameError::Unexpected(kind), sink, now);
                Step::Stop
            }
        }
    }

    /// The peer refused our connect: the socket closes and the engine hears why.
    fn rx_reject(
        &mut self,
        sock: SockId,
        conn: Option<ConnId>,
        private: PrivateData,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) -> Step {
        self.stats.rejects_received += 1;
        self.shut(sock);
        if let Some(c) = conn {
            sink.handle_connect_failed(now, c, ConnectFailure::Rejected(private));
        }
        Step::Stop
    }

    /// A MSG frame (`body` in the receive buffer, `next` the frame after it) into the lowest
    /// posted slot, or the connection stalls until one is posted.
    fn rx_msg(
        &mut self,
        sock: SockId,
        next: usize,
        body: std::ops::Range<usize>,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) -> Step {
        let Some(s) = self.socks.get_mut(sock) else {
            return Step::Stop;
        };
        let Some(buf) = s.rbuf.as_ref() else {
            return Step::Stop;
        };
        if s.local_disconnect {
            s.rstart = next;
            self.stats.discarded_msgs += 1;
            return Step::Next;
        }
        let Some(slot) = s.slots.take_lowest() else {
            s.stalled = true;
            self.stats.rx_stalls += 1;
            if s.overrun_deadline.is_none() {
                s.overrun_deadline = Some(std::time::Instant::now() + self.cfg.rnr_horizon);
                self.overruns.push(sock);
            }
            return Step::Stop;
        };
        s.overrun_deadline = None;
        s.rstart = next;
        self.stats.msgs_rx += 1;
        if let Some(c) = s.live_conn() {
            // What the writes before this message covered, first: it may be the PUT_DONE or
            // GET_DONE that ends them.
            if s.grants.has_changed() {
                for (id, prefix) in s.grants.take_changed() {
                    sink.handle_writes_covered(now, c, id, prefix);
                }
            }
            sink.handle_recv(now, c, slot, &buf[body]);
        }
        Step::Next
    }

    /// The heads of an RDMA_WRITE frame (its body from `body_start`, `body_len` long): key,
    /// bounds and grant are checked before a byte of its data is written.
    fn rx_write_head(
        &mut self,
        sock: SockId,
        body_start: usize,
        body_len: usize,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) -> Step {
        let Some(s) = self.socks.get_mut(sock) else {
            return Step::Stop;
        };
        let Some(buf) = s.rbuf.as_ref() else {
            return Step::Stop;
        };
        let Some((rkey, addr)) = frame::parse_write_head(&buf[body_start..]) else {
            unreachable!("the write head is in the buffer");
        };
        let len = body_len - WRITE_HEAD_LEN;
        s.rstart += HEAD_LEN + WRITE_HEAD_LEN;
        if s.local_disconnect {
            self.stats.discarded_writes += 1;
            s.rx_write = Some(RxWrite {
                key: rkey,
                off: 0,
                left: len,
                discard: true,
                grant_end: 0,
            });
            return Step::Next;
        }
        // A frame lies within one remote fragment (writes are cut at every fragment boundary).
        // How far past the frame its grant reaches: the most of the grants that hold it.
        let past_frame = s.grants.reach_past(rkey, addr, len as u64);
        let off = match self.regions.get(&rkey) {
            None => Err("no region under the key"),
            Some(r) => addr
                .checked_sub(r.addr)
                .and_then(|off| span(r.len(), off, len as u64))
                .map(|range| range.start)
                .ok_or("outside the region"),
        };
        let off = match off {
            Ok(_) if past_frame.is_none() => {
                self.stats.rdma_ungranted += 1;
                Err("not granted to this connection")
            }
            other => other,
        };
        match off {
            Ok(off) => {
                // Its bytes land before anything behind it is read: counted written now (see
                // grants.rs).
                s.grants.mark(rkey, addr, len as u32);
                let past = usize::try_from(past_frame.unwrap_or(0)).unwrap_or(0);
                s.rx_write = Some(RxWrite {
                    key: rkey,
                    off,
                    left: len,
                    discard: false,
                    grant_end: off + len + past,
                });
                Step::Next
            }
            Err(why) => {
                debug!(rkey, addr, len, "tcp fabric: RDMA write refused");
                self.access_error(sock, why, sink, now);
                Step::Stop
            }
        }
    }
}

/// What one step of [`TcpFabric::parse`] leaves it to do.
enum Step {
    /// Parse on: the next frame may be complete.
    Next,
    /// Only an incomplete frame is left: compact the buffer and read on.
    Wait,
    /// Stop parsing, reading nothing more now (stalled, closed, or handed over).
    Stop,
}
