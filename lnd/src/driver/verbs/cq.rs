//! Driving: the poll loop over the completion queues and the event channel, and what each
//! completion means for the engine.

use super::*;

impl VerbsFabric {
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
    pub(super) fn any_ready(&mut self, check_cm: bool) -> io::Result<bool> {
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

    pub(super) fn poll_cqs(&mut self, sink: &mut dyn FabricSink, now: Instant) -> io::Result<()> {
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
    pub(super) fn send_done(
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

    pub(super) fn completion(
        &mut self,
        vc: VConnId,
        w: Wc,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
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

    pub(super) fn flush_out(&mut self, sink: &mut dyn FabricSink, now: Instant) {
        while let Some(r) = self.out.pop_front() {
            match r {
                Report::SendDone(c, wr, st) => self.send_done(sink, now, c, wr, st),
                Report::Disconnected(c, why) => sink.handle_disconnected(now, c, why),
                Report::ConnectFailed(c, why) => sink.handle_connect_failed(now, c, why),
            }
        }
    }
}
