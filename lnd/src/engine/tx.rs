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
            ConnState::Established => c.last_recv = now,
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
                    rx: RxToken { conn, slot },
                });
            }
            KibBody::PutReq { hdr, cookie } => {
                self.refuse_rdma(conn, slot, KibMsgType::PutNak, cookie, &hdr);
            }
            KibBody::GetReq { hdr, cookie, .. } => {
                self.refuse_rdma(conn, slot, KibMsgType::GetDone, cookie, &hdr);
            }
            other => {
                // A completion for a rendezvous we never started (we send no PUT_REQ or GET_REQ
                // yet): o2iblnd closes a connection whose completion matches nothing (EPROTO).
                self.stats.unsupported_msgs += 1;
                warn!(peer = %peer_nid, kind = ?other.msg_type(), "RDMA completion matching nothing we sent");
                return self.close_conn(conn, Some(DownReason::ProtocolError));
            }
        }
        self.check_sends(conn, false);
    }

    /// A peer's RDMA rendezvous request (bulk over 3976 bytes) that this engine cannot serve
    /// yet: answered as o2iblnd's kiblnd_recv answers a request it cannot sink, with a
    /// completion (`PutNak` or `GetDone`) carrying -EPROTO, sent without a credit; the request's
    /// slot goes back with its credit. That one message fails at its sender; the connection and
    /// everything else on it go on (closing it would cost a kernel client all its traffic
    /// through us for each bulk request).
    fn refuse_rdma(
        &mut self,
        conn: ConnId,
        slot: u16,
        kind: KibMsgType,
        cookie: u64,
        hdr: &LnetHdr,
    ) {
        self.stats.rdma_refused += 1;
        debug!(?conn, ?kind, src = %hdr.src_nid, dst = %hdr.dest_nid, len = hdr.payload_length,
               "RDMA rendezvous refused: bulk transfers are not supported yet");
        let Some(c) = self.conn_mut(conn) else {
            return;
        };
        c.outstanding = c.outstanding.saturating_add(1);
        let p = c.peer;
        self.actions
            .push_back(FabricAction::PostRecv { conn, slot });
        let done = Completion {
            cookie,
            status: -EPROTO,
        };
        let key = self.new_tx(p, TxBody::Refusal { kind, done }, None);
        self.queue_on_conn(key, conn);
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
        if let Some(c) = self.conn_mut(conn) {
            c.nsends_posted = c.nsends_posted.saturating_sub(1);
        }
        let is_noop = matches!(
            self.txs.get_mut(key).expect("live tx").body,
            TxBody::Noop { .. }
        );
        if is_noop {
            if let Some(c) = self.conn_mut(conn) {
                c.noops_posted = c.noops_posted.saturating_sub(1);
            }
        }
        match status {
            WcStatus::Success => self.finish_tx(key, Ok(())),
            failed => {
                let err = if failed == WcStatus::RetryExceeded {
                    TxError::PeerUnreachable
                } else {
                    TxError::ConnAborted
                };
                self.finish_tx(key, Err(err));
                // Any failed completion means the queue pair is in error: the connection is done
                // (kiblnd_tx_complete closes on every failure, flushes included).
                self.close_conn(conn, Some(DownReason::Unreachable));
            }
        }
        self.check_sends(conn, false);
    }

    pub(super) fn new_tx(&mut self, peer: PeerIdx, body: TxBody, cookie: Option<u64>) -> TxKey {
        self.txs.insert(Tx {
            peer,
            body,
            cookie,
            timer: None,
            place: TxPlace::Peer,
            queued_at: self.now,
        })
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

    /// A message is finished: report it (unless it is a NOOP) and free it.
    pub(super) fn finish_tx(&mut self, key: TxKey, result: Result<(), TxError>) {
        let Some(tx) = self.txs.remove(key) else {
            return;
        };
        if let Some(t) = tx.timer {
            self.wheel.cancel(t);
        }
        if let Some(cookie) = tx.cookie {
            if result.is_ok() {
                if let TxBody::Immediate { payload, .. } = &tx.body {
                    self.stats.bytes_sent += payload.len() as u64;
                }
            }
            if let TxBody::Immediate { payload, .. } = tx.body {
                self.recycle(payload);
            }
            let peer = self.peers[tx.peer].nid;
            self.events.push_back(LndEvent::SendDone {
                cookie,
                peer,
                result,
            });
        }
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
            TxPlace::Queued(conn) | TxPlace::Posted(conn) => {
                // "Timed out RDMA": the connection is no good (kiblnd_check_txs_locked). This is
                // how a peer that owes us something (credits for a queued message, a completion
                // for a posted one) and stays silent is declared dead.
                let queued_at = tx.queued_at;
                if self.conn(conn).is_some_and(|c| c.last_recv <= queued_at) {
                    self.stats.silent_peers += 1;
                }
                debug!(conn = ?conn, "timed out tx, closing the connection");
                self.finish_tx(key, Err(TxError::Timeout));
                self.close_conn(conn, Some(DownReason::Timeout));
            }
        }
    }
}
