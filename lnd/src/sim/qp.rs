//! Queue pairs: registered memory, send queues, RDMA writes landing in a peer's regions, and the
//! completions, in RC order.

use super::*;

/// Node `n`'s memory registration ([`World::registry`]): what its driver would register. Keys
/// and addresses are unique in the world, so a key of a region that is gone (or of another node)
/// never matches a new one. A region lives until it is deregistered, or until the node crashes,
/// reboots or shuts down (the driver that owned the registrations is gone: deregistering it
/// later gives `None`). A write into a deregistered region, or from one, fails with
/// [`WcStatus::Error`].
pub struct NodeRegistry<'a, N: SimNode = Endpoint> {
    w: &'a mut World<N>,
    n: NodeId,
}

impl<N: SimNode> Registry for NodeRegistry<'_, N> {
    /// Fails if the node has no running endpoint (crashed or stopped): there is no driver to
    /// register with.
    fn register(&mut self, bytes: Vec<u8>) -> std::io::Result<Registration> {
        let w = &mut *self.w;
        let node = &mut w.nodes[self.n.idx()];
        if node.ep.is_none() {
            return Err(std::io::Error::other(format!(
                "register on node {} without a running endpoint",
                node.nid
            )));
        }
        w.next_region += 1;
        let id = w.next_region;
        // An odd multiplier is a bijection on u32: distinct ids give distinct keys.
        let key = (id as u32).wrapping_mul(0x9e37_79b1);
        let addr = w.next_region_addr;
        let len = bytes.len() as u64;
        let pages = len.div_ceil(PAGE) + 1;
        w.next_region_addr += pages * PAGE;
        node.rkeys.insert(key, id);
        node.regions.insert(id, Region { key, addr, bytes });
        Ok(Registration::new(RegionId(id), key, addr, len))
    }

    fn read(&self, reg: &Registration, offset: u64, out: &mut [u8]) -> bool {
        let Some(b) = self.w.region(self.n, reg) else {
            return false;
        };
        let Ok(len) = u32::try_from(out.len()) else {
            return false;
        };
        match span(b, offset, len) {
            Some(r) => {
                out.copy_from_slice(&b[r]);
                true
            }
            None => false,
        }
    }

    fn deregister(&mut self, reg: Registration) -> Option<Vec<u8>> {
        let node = &mut self.w.nodes[self.n.idx()];
        let r = node.regions.remove(&reg.id().0)?;
        node.rkeys.remove(&r.key);
        Some(r.bytes)
    }
}

impl<N: SimNode> World<N> {
    // ------------------------------------------------------------------ registered memory, RDMA

    /// Node `n`'s memory registration, as its driver would do it (ibv_reg_mr): see
    /// [`NodeRegistry`].
    pub fn registry(&mut self, n: NodeId) -> NodeRegistry<'_, N> {
        NodeRegistry { w: self, n }
    }

    /// The contents of node `n`'s region `reg`, in place (`None` if it is not registered there).
    pub fn region(&self, n: NodeId, reg: &Registration) -> Option<&[u8]> {
        Some(&self.nodes[n.idx()].regions.get(&reg.id().0)?.bytes)
    }

    /// Node `from` posts an RDMA write on its connection `conn`, as if its endpoint had emitted
    /// [`FabricAction::RdmaWrite`] (for tests that write without a rendezvous): the fragments
    /// `local` go onto the fragments `remote` on the peer. The write goes through the same
    /// path as the engine's actions; its completion is recorded ([`World::rdma_status`]) and then
    /// handed to the endpoint's `handle_send_complete`, which ignores a WrId it does not know.
    ///
    /// The returned WrId has its top bit set and its low 32 bits all ones (see [`WrId::injected`]), so
    /// it cannot be taken for one of the engine's. A write on a connection the fabric does not
    /// know is counted in [`SimStats::unknown_actions`] and never completes. The engine is not
    /// told when such a write puts the queue pair in error.
    pub fn rdma_write(
        &mut self,
        from: NodeId,
        conn: ConnId,
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
    ) -> WrId {
        self.next_rdma += 1;
        let wr = WrId::injected(self.next_rdma);
        if let Some(end) = self.end_uid(from, conn) {
            self.rdma.insert(
                wr.0,
                RdmaRecord {
                    node: from,
                    end,
                    status: None,
                },
            );
        }
        self.apply(
            from,
            FabricAction::RdmaWrite {
                conn,
                wr,
                local,
                remote,
            },
        );
        wr
    }

    /// How node `n`'s write `wr` (from [`World::rdma_write`]) completed; `None` while it has not
    /// (or if its connection was destroyed first, or `wr` is not one of `n`'s).
    pub fn rdma_status(&self, n: NodeId, wr: WrId) -> Option<WcStatus> {
        self.rdma.get(&wr.0).filter(|r| r.node == n)?.status
    }

    // ------------------------------------------------------------------ internals: actions

    /// Queues a send or an RDMA write of node `n` on `conn`'s send queue.
    pub(super) fn post(&mut self, n: NodeId, conn: ConnId, wr: WrId, op: WqeOp) {
        let now = self.now;
        let Some(uid) = self.end_uid(n, conn) else {
            self.stats.unknown_actions += 1;
            debug!(node = %self.nid_of(n), ?conn, "send or write on an unknown connection");
            return;
        };
        let latency = self.cfg.latency;
        let transfer = match &op {
            WqeOp::Send(_) => None,
            WqeOp::Write(w) => Some(self.transfer_time(w.len.unwrap_or(0))),
        };
        let e = self.ends.get_mut(&uid).expect("indexed end exists");
        match e.state {
            EndState::Established | EndState::Accepting => {
                let due = match transfer {
                    None => now + latency,
                    Some(t) => {
                        let start = now.max(e.link_free);
                        e.link_free = start + t;
                        start + t + latency
                    }
                };
                e.sq.push_back(Wqe { wr, op, due });
                if e.sq.len() == 1 {
                    self.schedule_pump(uid, due);
                }
            }
            EndState::Error => {
                self.stats.flushed += 1;
                self.complete(uid, wr, WcStatus::Flushed, now);
            }
            EndState::Connecting => {
                self.stats.premature_sends += 1;
                debug!(node = %self.nid_of(n), ?conn, "send or write before the connection is up");
                self.complete(uid, wr, WcStatus::Error, now);
            }
        }
    }

    /// How long `len` bytes of RDMA write occupy a link.
    pub(super) fn transfer_time(&self, len: u32) -> Duration {
        match self.cfg.bandwidth {
            0 => Duration::ZERO,
            bw => {
                let ns = (u128::from(len) * 1_000_000_000).div_ceil(u128::from(bw));
                Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64)
            }
        }
    }

    /// Copies write `w` of node `from` into node `to`'s memory, or says why it may not. Every
    /// fragment is checked before a byte is copied, so a refused write places nothing.
    pub(super) fn place_write(
        &mut self,
        from: NodeId,
        to: NodeId,
        w: &Write,
    ) -> Result<u32, &'static str> {
        let len = check_rdma_write(&w.local, &w.remote).map_err(|_| "malformed write")?;
        let src = &self.nodes[from.idx()].regions;
        for f in &w.local {
            let r = src.get(&f.region.0).ok_or("local region not registered")?;
            span(&r.bytes, f.offset, f.len).ok_or("outside the local region")?;
        }
        let dst_node = &self.nodes[to.idx()];
        for f in &w.remote {
            let id = dst_node
                .rkeys
                .get(&f.key)
                .ok_or("no region under the remote key")?;
            let dst = &dst_node.regions[id];
            let off = f
                .addr
                .checked_sub(dst.addr)
                .ok_or("below the remote region")?;
            span(&dst.bytes, off, f.len).ok_or("past the end of the remote region")?;
        }
        for p in rdma_pieces(&w.local, &w.remote) {
            let src = &self.nodes[from.idx()].regions[&p.region.0];
            let data = src.bytes[span(&src.bytes, p.offset, p.len).expect("checked")].to_vec();
            let dst_node = &mut self.nodes[to.idx()];
            let id = dst_node.rkeys[&p.key];
            let dst = dst_node.regions.get_mut(&id).expect("keyed region exists");
            let r = span(&dst.bytes, p.addr - dst.addr, p.len).expect("checked");
            dst.bytes[r].copy_from_slice(&data);
        }
        Ok(len)
    }

    pub(super) fn schedule_pump(&mut self, uid: u64, at: Instant) {
        let Some(e) = self.ends.get_mut(&uid) else {
            return;
        };
        if e.pump_at.is_none_or(|t| at < t) {
            e.pump_at = Some(at);
            self.push(at, Ev::Pump { end: uid });
        }
    }

    /// Schedules a completion on end `uid`, in order after the ones already scheduled.
    pub(super) fn complete(&mut self, uid: u64, wr: WrId, status: WcStatus, at: Instant) {
        let Some(e) = self.ends.get_mut(&uid) else {
            return;
        };
        let at = at.max(e.last_cq);
        e.last_cq = at;
        self.push(
            at,
            Ev::SendDone {
                end: uid,
                wr,
                status,
            },
        );
    }

    /// End `uid`'s queue pair goes to error: what is still queued flushes.
    pub(super) fn qp_error(&mut self, uid: u64) {
        let now = self.now;
        let Some(e) = self.ends.get_mut(&uid) else {
            return;
        };
        if e.state == EndState::Error {
            return;
        }
        e.state = EndState::Error;
        e.pump_at = None;
        e.retry_deadline = None;
        let flushed: Vec<WrId> = e.sq.drain(..).map(|w| w.wr).collect();
        self.stats.flushed += flushed.len() as u64;
        for wr in flushed {
            self.complete(uid, wr, WcStatus::Flushed, now);
        }
    }

    /// The end that a message from node `from` on a connection whose other end is `peer` would
    /// land in, if it can land now.
    pub(super) fn receiver(&self, from: NodeId, peer: Option<u64>) -> Option<u64> {
        let p = peer?;
        let e = self.ends.get(&p)?;
        if !matches!(e.state, EndState::Established | EndState::Accepting) {
            return None;
        }
        if self.blocked(from, e.node) {
            return None;
        }
        Some(p)
    }

    /// Moves end `uid`'s send queue: delivers what is due, retries or fails a blocked head.
    pub(super) fn pump(&mut self, uid: u64) {
        let now = self.now;
        let latency = self.cfg.latency;
        loop {
            let Some(e) = self.ends.get(&uid) else {
                return;
            };
            if e.state == EndState::Error {
                return;
            }
            let Some(head) = e.sq.front() else {
                return;
            };
            let due = head.due;
            if due > now {
                self.schedule_pump(uid, due);
                return;
            }
            let Some(p) = self.receiver(e.node, e.peer) else {
                // The peer does not answer: the transport retries until the horizon.
                let horizon = self.cfg.retry_horizon.saturating_sub(latency);
                let interval = self.cfg.retry_interval.max(Duration::from_nanos(1));
                let e = self.ends.get_mut(&uid).expect("checked above");
                let (n, conn) = (e.node, e.conn);
                let deadline = *e.retry_deadline.get_or_insert(now + horizon);
                if now >= deadline {
                    let wqe = e.sq.pop_front().expect("checked above");
                    e.retry_deadline = None;
                    self.stats.retry_exceeded += 1;
                    debug!(at = %now, node = %self.nid_of(n), ?conn, "retry exceeded");
                    self.complete(uid, wqe.wr, WcStatus::RetryExceeded, now);
                    self.qp_error(uid);
                } else {
                    self.schedule_pump(uid, (now + interval).min(deadline));
                }
                return;
            };
            let e = self.ends.get_mut(&uid).expect("checked above");
            let (n, conn) = (e.node, e.conn);
            let wqe = e.sq.pop_front().expect("checked above");
            e.retry_deadline = None;
            let (pn, pconn) = {
                let pe = &self.ends[&p];
                (pe.node, pe.conn)
            };
            let bytes = match wqe.op {
                WqeOp::Send(bytes) => bytes,
                WqeOp::Write(w) => {
                    let len = match self.place_write(n, pn, &w) {
                        Ok(len) => len,
                        Err(why) => {
                            self.stats.rdma_errors += 1;
                            debug!(at = %now, node = %self.nid_of(n), ?conn, local = ?w.local,
                                   remote = ?w.remote, why, "RDMA write refused");
                            self.complete(uid, wqe.wr, WcStatus::Error, now + latency);
                            self.qp_error(uid);
                            return;
                        }
                    };
                    self.stats.rdma_writes += 1;
                    self.stats.rdma_bytes += u64::from(len);
                    self.complete(uid, wqe.wr, WcStatus::Success, now + latency);
                    continue;
                }
            };
            let slot = self.ends.get_mut(&p).and_then(|pe| pe.posted.take_lowest());
            let Some(slot) = slot else {
                self.stats.rnr += 1;
                debug!(at = %now, node = %self.nid_of(n), ?conn,
                       "receiver not ready: no posted slot");
                self.complete(uid, wqe.wr, WcStatus::Error, now + latency);
                self.qp_error(uid);
                return;
            };
            self.stats.messages += 1;
            self.stats.bytes += bytes.len() as u64;
            self.complete(uid, wqe.wr, WcStatus::Success, now + latency);
            if self
                .ends
                .get(&p)
                .is_some_and(|pe| pe.state == EndState::Accepting)
            {
                // COMM_EST: a message on a passive queue pair whose RTU has not come proves
                // the connection up (o2iblnd: kiblnd_qp_event -> rdma_notify -> ESTABLISHED).
                self.stats.comm_est += 1;
                self.establish_passive(p, "established (passive, COMM_EST)");
            }
            if let Some(ep) = self.nodes[pn.idx()].ep.as_mut() {
                ep.fabric_event(
                    now,
                    FabricEvent::Recv {
                        conn: pconn,
                        slot,
                        bytes: &bytes,
                    },
                );
            }
            self.drain(pn, false);
        }
    }
}
