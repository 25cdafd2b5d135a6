//! Send and receive queues: posting receive slots, sends and RDMA writes (cut into work requests
//! that fit the send queue), flushing what waits for room.

use super::*;

impl VerbsFabric {
    /// The send-queue capacity of `conn` (0 if it has no queue pair).
    pub fn send_queue_capacity(&self, conn: ConnId) -> usize {
        self.lookup(conn).map_or(0, |k| self.conns[k].sq_cap)
    }

    pub(super) fn post_recv(&mut self, conn: ConnId, slot: u16) {
        let Some(vc) = self.known(conn) else {
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
    pub(super) fn usable(c: &VConn) -> bool {
        c.res.is_some()
            && matches!(
                c.phase,
                Phase::Established | Phase::Accepting | Phase::Connecting
            )
    }

    pub(super) fn send(&mut self, conn: ConnId, wr: WrId, bytes: &[u8]) {
        let Some(vc) = self.known(conn) else {
            return;
        };
        if bytes.is_empty() || bytes.len() > MSG_SIZE {
            self.stats.bad_sends += 1;
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Error));
            return;
        }
        if !self.takes_work(vc, conn, wr) {
            return;
        }
        let c = &mut self.conns[vc];
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

    pub(super) fn write(
        &mut self,
        conn: ConnId,
        wr: WrId,
        local: &[LocalFrag],
        remote: &[RemoteFrag],
    ) {
        let Some(vc) = self.known(conn) else {
            return;
        };
        if !self.takes_work(vc, conn, wr) {
            return;
        }
        let c = &mut self.conns[vc];
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
    pub(super) fn retire(
        sq: &mut Slab<SqEntry>,
        k: usize,
        st: WcStatus,
    ) -> Option<(SqEntry, WcStatus)> {
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
    pub(super) fn flush_dirty(&mut self) {
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
    pub(super) fn flush(&mut self, vc: VConnId) {
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

    /// Posts an RDMA write on `conn` as [`FabricAction::RdmaWrite`] does, for tests that write
    /// without a rendezvous: the fragments `local` onto the fragments `remote` on the peer. Its
    /// status is kept for [`VerbsFabric::rdma_status`] / [`VerbsFabric::take_rdma_completions`]
    /// and also handed to the endpoint, which ignores a WrId it does not know. A write on a connection this fabric does not know is counted in
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
}
