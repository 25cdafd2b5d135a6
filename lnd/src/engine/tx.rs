//! A message's life: launched onto a connection or a peer's queue, its LND deadline, its
//! completion and its status (kiblnd_launch_tx, kiblnd_tx_done, kiblnd_check_txs_locked), and
//! what arrives (kiblnd_rx_complete, kiblnd_handle_rx).

use super::*;

impl Endpoint {
    /// A message arrived in receive slot `slot` of `conn` (kiblnd_rx_complete, kiblnd_handle_rx).
    pub fn handle_recv(&mut self, now: Instant, conn: ConnId, slot: u16, bytes: &[u8]) {
        self.advance(now);
        let now = self.now;
        let Some(c) = self.conn_mut(conn) else {
            return;
        };
        match c.state {
            ConnState::Established => {
                c.last_recv = now;
                if c.probation {
                    c.probation = false;
                    let p = c.peer;
                    self.flush_held(p);
                }
            }
            ConnState::PassiveWait => {
                // Data can beat the ESTABLISHED event (LU-8303); keep it for then.
                c.early_rx.push((slot, bytes.to_vec()));
                return;
            }
            _ => return,
        }
        self.stats.msgs_received += 1;
        let me = self.cfg.nid;
        let my_stamp = self.cfg.incarnation;
        let (msg, framing) = match KibMsg::parse(bytes) {
            Ok(m) => m,
            Err(e) => {
                self.stats.bad_msgs += 1;
                debug!(error = %e, "bad message, closing the connection");
                return self.close_conn(conn, Some(DownReason::ProtocolError));
            }
        };
        if framing.cksum.is_some() {
            if let Some(p) = self.conn(conn).map(|c| c.peer) {
                self.learn_cksum(p, &framing);
            }
        }
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        let peer_nid = self.peers[c.peer].nid;
        if self.capture.is_some() {
            self.record(CaptureDir::Received, conn, peer_nid, bytes);
        }
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        if msg.src_nid != peer_nid
            || msg.dst_nid != me
            || msg.src_stamp != c.peer_stamp
            || msg.dst_stamp != my_stamp
        {
            self.stats.stale_rx += 1;
            debug!(peer = %peer_nid, "stale rx, closing the connection");
            return self.close_conn(conn, Some(DownReason::ProtocolError));
        }
        if u32::from(c.credits) + u32::from(msg.credits) > u32::from(c.queue_depth) {
            let (credits, qd) = (c.credits, c.queue_depth);
            self.stats.credit_overflows += 1;
            warn!(peer = %peer_nid, credits, returned = msg.credits, qd,
                  "peer returned more credits than the queue depth");
            return self.close_conn(conn, Some(DownReason::ProtocolError));
        }
        c.credits += u16::from(msg.credits);
        match msg.body {
            KibBody::Noop => {
                // V2 NOOPs travel without a credit: repost, nothing to return.
                self.actions
                    .push_back(FabricAction::PostRecv { conn, slot });
            }
            KibBody::Immediate { hdr, payload } => {
                self.stats.bytes_received += payload.len() as u64;
                let mut buf = self.take_buffer();
                buf.extend_from_slice(payload);
                self.events.push_back(LndEvent::Received {
                    from: peer_nid,
                    hdr,
                    payload: buf,
                    rx: RxToken::of(conn, slot),
                });
            }
            KibBody::PutReq { hdr, cookie } => {
                self.on_rdma_request(conn, slot, hdr, cookie, None);
            }
            KibBody::GetReq { hdr, cookie, rd } => {
                let sink = RdmaSink {
                    key: rd.key,
                    frags: rd.frags.iter().collect(),
                };
                self.on_rdma_request(conn, slot, hdr, cookie, Some(sink));
            }
            KibBody::PutAck {
                src_cookie,
                dst_cookie,
                rd,
            } => {
                let sink = RdmaSink {
                    key: rd.key,
                    frags: rd.frags.iter().collect(),
                };
                self.on_put_ack(conn, slot, src_cookie, dst_cookie, sink);
            }
            KibBody::PutNak(done) => self.on_completion(conn, slot, KibMsgType::PutNak, done),
            KibBody::PutDone(done) => self.on_completion(conn, slot, KibMsgType::PutDone, done),
            KibBody::GetDone(done) => self.on_completion(conn, slot, KibMsgType::GetDone, done),
            KibBody::ConnReq(_) | KibBody::ConnAck(_) => {
                // Handshake messages travel in the CM's private data, never on a connection.
                self.stats.bad_msgs += 1;
                return self.close_conn(conn, Some(DownReason::ProtocolError));
            }
        }
        self.check_sends(conn, false);
    }

    /// A posted send completed.
    pub fn handle_send_complete(&mut self, now: Instant, conn: ConnId, wr: WrId, status: WcStatus) {
        self.advance(now);
        let key = TxKey::from_u64(wr.0);
        let Some(tx) = self.txs.get(key) else {
            return;
        };
        if !matches!(tx.place, TxPlace::Posted(c) if c == conn) {
            return;
        }
        let (is_noop, queued_at) = (matches!(tx.body, TxBody::Noop { .. }), tx.queued_at);
        if let Some(c) = self.conn_mut(conn) {
            c.nsends_posted = c.nsends_posted.saturating_sub(1);
            if is_noop {
                c.noops_posted = c.noops_posted.saturating_sub(1);
            }
            // A send queued since probation began got through: the far end is there.
            if status == WcStatus::Success && c.probation && queued_at >= c.probation_since {
                c.probation = false;
            }
        }
        match status {
            WcStatus::Success => {
                let tx = self.txs.get_mut(key).expect("live tx");
                if tx.waiting {
                    // Sent; the peer's answer finishes it (o2iblnd tx_waiting).
                    tx.place = TxPlace::Waiting(conn);
                } else {
                    self.finish_tx(key, Ok(()));
                }
            }
            failed => {
                let err = if failed == WcStatus::RetryExceeded {
                    TxError::PeerUnreachable
                } else {
                    TxError::SendFailed
                };
                self.finish_tx(key, Err(err));
                // Any failed completion means the queue pair is in error: the connection is done
                // (kiblnd_tx_complete closes on every failure, flushes included).
                self.close_conn(conn, Some(DownReason::Unreachable));
            }
        }
        self.check_sends(conn, false);
        if let Some(p) = self.conn(conn).map(|c| c.peer) {
            self.flush_held(p);
        }
    }

    pub(super) fn new_tx(&mut self, peer: PeerIdx, body: TxBody, cookie: Option<u64>) -> TxKey {
        let key = self.txs.insert(Tx {
            peer,
            body,
            cookie,
            timer: None,
            place: TxPlace::Peer,
            queued_at: self.now,
            waiting: false,
            status: 0,
            covered: 0,
            grant_timer: None,
        });
        // Every queue a burst grows holds these messages (or their actions and events), so the
        // message table is where a burst is noticed.
        self.note_growth(self.txs.capacity());
        key
    }

    pub(super) fn tx_live(&self, key: TxKey) -> bool {
        self.txs.contains(key)
    }

    pub(super) fn set_tx_deadline(&mut self, key: TxKey, at: Instant) {
        let t = self.wheel.insert(at, TimerEvent::Tx(key));
        if let Some(old) = self.txs.get_mut(key).expect("live tx").timer.replace(t) {
            self.wheel.cancel(old);
        }
    }

    /// Puts a message on its way: onto an established connection, or onto the peer's queue while
    /// one is made (kiblnd_launch_tx).
    pub(super) fn launch_tx(&mut self, key: TxKey) {
        let p = self.txs.get_mut(key).expect("live tx").peer;
        if let Some(conn) = self.pick_conn(p) {
            self.queue_on_conn(key, conn);
            self.check_sends(conn, false);
            return;
        }
        // Waiting for a connection: the deadline covers the connect and address/route resolution
        // (connect timeout + 2 x 5 s, as kiblnd_launch_tx).
        let wait = self.cfg.tunables.connect_timeout() + Duration::from_secs(10);
        let at = self.now + wait;
        self.set_tx_deadline(key, at);
        self.txs.get_mut(key).expect("live tx").place = TxPlace::Peer;
        self.peers[p].tx_queue.push_back(key);
        self.maybe_connect(p);
    }

    /// How the messages waiting for `p` fail when its connect did: refused or not reached.
    pub(super) fn connect_error(&self, p: PeerIdx) -> TxError {
        if self.peers[p].refused {
            TxError::ConnectRefused
        } else {
            TxError::ConnectFailed
        }
    }

    pub(super) fn fail_peer_queue(&mut self, p: PeerIdx, err: TxError) {
        let queued: Vec<TxKey> = self.peers[p].tx_queue.drain(..).collect();
        for key in queued {
            self.finish_tx(key, Err(err));
        }
    }

    pub(super) fn abort_queued(&mut self, conn: ConnId, err: TxError) {
        let Some(c) = self.conn_mut(conn) else {
            return;
        };
        let mut queued: Vec<TxKey> = c.tx_rsrvd.drain(..).collect();
        queued.extend(c.tx_cred.drain(..));
        queued.extend(c.tx_nocred.drain(..));
        for key in queued {
            self.finish_tx(key, Err(err));
        }
    }

    /// Fails the messages on `conn` that were sent and wait for the peer's rendezvous step.
    pub(super) fn abort_waiting(&mut self, conn: ConnId) {
        self.fail_placed(TxPlace::Waiting(conn), TxError::ConnAborted);
    }

    /// Fails with `err` every message at `place` (a connection's posted or waiting ones).
    pub(super) fn fail_placed(&mut self, place: TxPlace, err: TxError) {
        let keys: Vec<TxKey> = self
            .txs
            .iter()
            .filter(|(_, t)| t.place == place)
            .map(|(key, _)| key)
            .collect();
        for key in keys {
            self.finish_tx(key, Err(err));
        }
    }

    /// A message is finished: report it (unless LNet never saw it) and free it. `result` is how
    /// its own sending went; a rendezvous adds the status its completion carried.
    pub(super) fn finish_tx(&mut self, key: TxKey, result: Result<(), TxError>) {
        let Some(tx) = self.txs.remove(key) else {
            return;
        };
        if let Some(t) = tx.timer {
            self.wheel.cancel(t);
        }
        if let Some(t) = tx.grant_timer {
            self.wheel.cancel(t);
        }
        // The peer's writes into our sink are over, whatever the outcome: a late or forged
        // write over this connection is refused from now on (see post_tx's grant).
        if let (
            TxBody::GetReq { .. } | TxBody::PutAck { .. },
            TxPlace::Posted(conn) | TxPlace::Waiting(conn),
        ) = (&tx.body, tx.place)
        {
            self.actions.push_back(FabricAction::RevokeWrites {
                conn,
                id: wr_of(key),
            });
        }
        let Some(cookie) = tx.cookie else {
            return;
        };
        let peer = self.peers[tx.peer].nid;
        let status = tx.status;
        let rdma = |()| {
            if status < 0 {
                Err(TxError::Rdma(status))
            } else {
                Ok(status as u32)
            }
        };
        match tx.body {
            TxBody::Immediate { payload, .. } => {
                let returned = if result.is_ok() {
                    self.stats.bytes_sent += payload.len() as u64;
                    self.recycle(payload);
                    Vec::new()
                } else {
                    payload
                };
                self.events.push_back(LndEvent::SendDone {
                    cookie,
                    peer,
                    result,
                    returned,
                });
            }
            body => {
                let result = result.and_then(rdma);
                if let Ok(n) = result {
                    self.count_rdma(&body, n);
                }
                // Data written into our memory (the sink's side of a PUT, the requester's of a
                // GET) ends in BulkDone; our side of a rendezvous the peer asked for, in SendDone.
                let ev = if matches!(body, TxBody::PutAck { .. } | TxBody::GetReq { .. }) {
                    LndEvent::BulkDone {
                        cookie,
                        peer,
                        result,
                    }
                } else {
                    LndEvent::SendDone {
                        cookie,
                        peer,
                        result: result.map(|_| ()),
                        returned: Vec::new(),
                    }
                };
                self.events.push_back(ev);
            }
        }
    }

    /// Counts a rendezvous that moved `n` bytes, by the message of ours that ended it: into our
    /// memory (PUT_ACK, GET_REQ) or out of it (PUT_DONE, GET_DONE).
    fn count_rdma(&mut self, body: &TxBody, n: u32) {
        let s = &mut self.stats;
        let (transfers, bytes) = match body {
            TxBody::PutAck { .. } => (&mut s.rdma_puts_received, &mut s.rdma_bytes_received),
            TxBody::GetReq { .. } => (&mut s.rdma_gets_received, &mut s.rdma_bytes_received),
            TxBody::Completion {
                kind: KibMsgType::GetDone,
                ..
            } => (&mut s.rdma_gets_served, &mut s.rdma_bytes_sent),
            TxBody::Completion { .. } => (&mut s.rdma_puts_sent, &mut s.rdma_bytes_sent),
            _ => return,
        };
        *transfers += 1;
        *bytes += u64::from(n);
    }

    pub(super) fn on_tx_deadline(&mut self, key: TxKey) {
        let Some(tx) = self.txs.get_mut(key) else {
            return;
        };
        tx.timer = None;
        self.stats.tx_timeouts += 1;
        match tx.place {
            TxPlace::Peer => {
                let p = tx.peer;
                self.peers[p].tx_queue.retain(|&k| k != key);
                debug!(peer = %self.peers[p].nid, "timed out tx waiting for a connection");
                self.finish_tx(key, Err(TxError::Timeout));
                self.maybe_forget(p);
            }
            TxPlace::Queued(conn) | TxPlace::Posted(conn) | TxPlace::Waiting(conn) => {
                // "Timed out RDMA": the connection is no good (kiblnd_check_txs_locked). This is
                // how a peer that owes us something (credits for a queued message, a completion
                // for a posted one) and stays silent is declared dead.
                let queued_at = tx.queued_at;
                let unsent = matches!(tx.place, TxPlace::Queued(_));
                if self.conn(conn).is_some_and(|c| c.last_recv <= queued_at) {
                    self.stats.silent_peers += 1;
                }
                debug!(conn = ?conn, "timed out tx, closing the connection");
                // One still queued was never sent: the close fails it with the others queued
                // there, LOCAL_TIMEOUT (kiblnd_abort_txs), which LNet may resend. One posted
                // or waiting for the peer is a network timeout: the peer may have it.
                if !unsent {
                    self.finish_tx(key, Err(TxError::Timeout));
                }
                self.close_conn(conn, Some(DownReason::Timeout));
                if unsent {
                    // Already closing: nothing may stay queued on it (a no-op otherwise).
                    self.abort_queued(conn, TxError::ConnTimedOut);
                }
            }
        }
    }
}
