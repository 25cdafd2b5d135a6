//! The send scheduler and credits (kiblnd_check_sends_locked, kiblnd_post_tx_locked,
//! kiblnd_need_noop): the reserved / credit / no-credit queues, credits piggy-backed on every
//! message, NOOPs at the high-water mark, concurrent_sends, and how a message is encoded.

use super::*;
use crate::wire::RdmaDesc;

/// Which of a connection's send queues a message waits on (kiblnd_queue_tx_locked).
enum Queue {
    Reserved,
    Credit,
    NoCredit,
}

impl Endpoint {
    /// How to encode what we send to peer `p`: checksummed in its flavour when checksums are
    /// on, in the configured default until its flavour is known.
    pub(super) fn emit_opts(&self, p: PeerIdx) -> EmitOpts {
        let ck = self.cfg.checksum;
        EmitOpts {
            order: Default::default(),
            checksum: if ck.emit {
                self.peers
                    .get(p)
                    .and_then(|peer| peer.cksum)
                    .or(ck.default_flavour)
            } else {
                None
            },
        }
    }

    /// The connection a new message goes on: the oldest established one. Always the same one
    /// while it lives, so messages to a peer stay in order, and a self-connection (both of whose
    /// ends are ours) stays one stream. Not "our active end first": when both sides connect at
    /// once and both accept, our passive end can come up first and take the queued messages
    /// (kiblnd_connreq_done); switching to the active end when it comes up would let a new
    /// message overtake those still waiting for credits on the passive one. (o2iblnd round-robins
    /// over `ibp_conns`; LNet does not need order, ulnet keeps it.) A connection on probation
    /// (the peer asked for a new one while it was up, and may have lost its end) is passed over
    /// while another is up, until the peer is heard on it again.
    /// With `conns_per_peer` above 1, messages take the connections in turn instead, as
    /// o2iblnd's do, so each connection's credits are used.
    pub(super) fn pick_conn(&mut self, p: PeerIdx) -> Option<ConnId> {
        let peer = &self.peers[p];
        let n = peer.conns.len();
        if n == 0 {
            return None;
        }
        // LNet messages still on a connection on probation must not be overtaken by a newer
        // one: hold new ones at the peer until the probe answers (or the connection closes).
        if peer
            .conns
            .iter()
            .any(|&c| self.conn(c).is_some_and(|x| x.probation) && self.carries_messages(c))
        {
            return None;
        }
        let spread = self.cfg.tunables.conns_per_peer > 1;
        let start = if spread { peer.next_conn % n } else { 0 };
        let usable = (0..n)
            .map(|i| (start + i) % n)
            .find(|&i| self.conn(peer.conns[i]).is_some_and(|c| !c.probation));
        if let Some(i) = usable {
            if spread {
                self.peers[p].next_conn = i + 1;
            }
            return Some(self.peers[p].conns[i]);
        }
        if !peer.accepting.is_empty() {
            return None;
        }
        peer.conns.first().copied()
    }

    /// Whether anything but NOOPs is queued or posted on `c`: what a newer connection must not
    /// overtake. Read off the connection's own queues and counters, not the message table, as
    /// it is asked for every new message while a connection is on probation.
    fn carries_messages(&self, c: ConnId) -> bool {
        self.conn(c).is_some_and(|c| {
            c.nsends_posted > c.noops_posted
                || !c.tx_rsrvd.is_empty()
                || !c.tx_cred.is_empty()
                || c.tx_nocred.iter().any(|&k| {
                    self.txs
                        .get(k)
                        .is_some_and(|t| !matches!(t.body, TxBody::Noop { .. }))
                })
        })
    }

    /// Messages held at the peer go out once a connection may take them.
    pub(super) fn flush_held(&mut self, p: PeerIdx) {
        let Some(peer) = self.peers.get(p) else {
            return;
        };
        if peer.tx_queue.is_empty() || peer.conns.is_empty() {
            return;
        }
        let Some(conn) = self.pick_conn(p) else {
            return;
        };
        let queued: Vec<TxKey> = self.peers[p].tx_queue.drain(..).collect();
        for key in queued {
            if self.tx_live(key) {
                self.queue_on_conn(key, conn);
            }
        }
        self.check_sends(conn, false);
    }

    pub(super) fn queue_on_conn(&mut self, key: TxKey, conn: ConnId) {
        let at = self.now + self.cfg.tunables.timeout;
        self.set_tx_deadline(key, at);
        let tx = &mut self.txs.get_mut(key).expect("live tx");
        tx.place = TxPlace::Queued(conn);
        tx.queued_at = self.now;
        let queue = match tx.body {
            TxBody::Immediate { .. } => Queue::Credit,
            // A request's answer lands in a slot of ours without a credit: it also needs a
            // reserved credit.
            TxBody::PutReq { .. } | TxBody::GetReq { .. } => Queue::Reserved,
            // V2 NOOPs, the answers, and a write (no receive slot at the peer).
            TxBody::Noop { .. }
            | TxBody::PutAck { .. }
            | TxBody::Completion { .. }
            | TxBody::Write { .. } => Queue::NoCredit,
        };
        let Some(c) = self.conn_mut(conn) else {
            return;
        };
        match queue {
            Queue::Reserved => c.tx_rsrvd.push_back(key),
            Queue::Credit => c.tx_cred.push_back(key),
            Queue::NoCredit => c.tx_nocred.push_back(key),
        }
    }

    /// The send scheduler (kiblnd_check_sends_locked): reserved -> credit queue while reserved
    /// credits last, maybe a NOOP, then post from the no-credit queue, then the credit queue,
    /// stopping at concurrent_sends or when credits run out.
    pub(super) fn check_sends(&mut self, conn: ConnId, keepalive: bool) {
        let concurrent = self.cfg.tunables.concurrent_sends();
        let Some(c) = self.conn(conn) else {
            return;
        };
        if c.state != ConnState::Established {
            return;
        }
        let hiw = self.cfg.tunables.credits_hiw(c.queue_depth);
        let p = c.peer;
        {
            let c = self.conn_mut(conn).expect("checked above");
            while c.reserved > 0 {
                let Some(k) = c.tx_rsrvd.pop_front() else {
                    break;
                };
                c.reserved -= 1;
                c.tx_cred.push_back(k);
            }
        }
        let c = self.conn(conn).expect("checked above");
        let need_noop = (keepalive || c.outstanding >= hiw)
            && c.tx_nocred.is_empty()
            && (c.tx_cred.is_empty() || c.credits == 0)
            && c.noops_posted < MAX_NOOPS_POSTED;
        if need_noop {
            let key = self.new_tx(p, TxBody::Noop { keepalive }, None);
            self.queue_on_conn(key, conn);
        }
        loop {
            let c = self.conn_mut(conn).expect("checked above");
            if c.nsends_posted >= concurrent {
                break;
            }
            let (key, credit) = if let Some(&k) = c.tx_nocred.front() {
                (k, false)
            } else if let Some(&k) = c.tx_cred.front() {
                if c.credits == 0 {
                    break;
                }
                (k, true)
            } else {
                break;
            };
            if credit {
                c.tx_cred.pop_front();
            } else {
                c.tx_nocred.pop_front();
            }
            // A key whose message already finished (its deadline fired) is skipped.
            let Some(tx) = self.txs.get(key) else {
                continue;
            };
            // A NOOP made redundant by what went before it is dropped (kiblnd_post_tx_locked).
            if let TxBody::Noop { keepalive } = tx.body {
                let c = self.conn(conn).expect("checked above");
                if (!keepalive && c.outstanding < hiw) || c.noops_posted >= MAX_NOOPS_POSTED {
                    self.finish_tx(key, Ok(()));
                    continue;
                }
            }
            self.post_tx(conn, key, credit);
        }
    }

    pub(super) fn post_tx(&mut self, conn: ConnId, key: TxKey, credit: bool) {
        let me = self.cfg.nid;
        let Some(p) = self.conn(conn).map(|c| c.peer) else {
            return;
        };
        if let Some(TxBody::Write { local, remote }) = self.txs.get_mut(key).map(|t| &mut t.body) {
            // Data, not a message: it lands in the peer's sink without a receive slot, carries
            // no credits, and is not a sign of life to the peer's LND.
            let (local, remote) = (std::mem::take(local), std::mem::take(remote));
            self.txs.get_mut(key).expect("live tx").place = TxPlace::Posted(conn);
            self.conns.get_mut(conn).expect("live conn").nsends_posted += 1;
            self.actions.push_back(FabricAction::RdmaWrite {
                conn,
                wr: wr_of(key),
                local,
                remote,
            });
            return;
        }
        let opts = self.emit_opts(p);
        let my_stamp = self.cfg.incarnation;
        let now = self.now;
        let c = self.conns.get_mut(conn).expect("live conn");
        let returned = c.outstanding.min(255) as u8;
        c.outstanding -= u16::from(returned);
        if credit {
            c.credits -= 1;
        }
        c.nsends_posted += 1;
        c.last_send = now;
        let (peer_stamp, p) = (c.peer_stamp, c.peer);
        let tx = &mut self.txs.get_mut(key).expect("live tx");
        tx.place = TxPlace::Posted(conn);
        let cookie = key.as_u64();
        // Our sink is open to this connection's peer from its PUT_ACK / GET_REQ on, and to
        // nobody else (closed in finish_tx).
        if let TxBody::GetReq { sink, .. } | TxBody::PutAck { sink, .. } = &tx.body {
            self.actions.push_back(FabricAction::GrantWrites {
                conn,
                id: wr_of(key),
                sink: sink.remote(),
            });
            // The peer has this long to fill it (see Tunables::grant_timeout).
            let wait = self.cfg.tunables.grant_timeout;
            if !wait.is_zero() {
                let t = self.wheel.insert(now + wait, TimerEvent::Grant(key));
                if let Some(old) = tx.grant_timer.replace(t) {
                    self.wheel.cancel(old);
                }
            }
        }
        let rd_frags;
        let body = match &mut tx.body {
            // Posted above, before any credit was touched.
            TxBody::Write { .. } => return,
            TxBody::PutReq { hdr, .. } => KibBody::PutReq { hdr: *hdr, cookie },
            TxBody::GetReq { hdr, sink } => {
                rd_frags = &sink.frags;
                KibBody::GetReq {
                    hdr: *hdr,
                    cookie,
                    rd: RdmaDesc::new(sink.key, rd_frags),
                }
            }
            TxBody::PutAck { src_cookie, sink } => {
                rd_frags = &sink.frags;
                KibBody::PutAck {
                    src_cookie: *src_cookie,
                    dst_cookie: cookie,
                    rd: RdmaDesc::new(sink.key, rd_frags),
                }
            }
            TxBody::Completion { kind, done } => match kind {
                KibMsgType::GetDone => KibBody::GetDone(*done),
                KibMsgType::PutDone => KibBody::PutDone(*done),
                _ => KibBody::PutNak(*done),
            },
            TxBody::Immediate { hdr, payload } => KibBody::Immediate { hdr: *hdr, payload },
            TxBody::Noop { keepalive } => {
                if *keepalive {
                    self.stats.keepalives += 1;
                } else {
                    self.stats.credit_noops += 1;
                }
                KibBody::Noop
            }
        };
        let is_noop = matches!(body, KibBody::Noop);
        let msg = KibMsg {
            version: VERSION_2,
            credits: returned,
            src_nid: me,
            src_stamp: my_stamp,
            dst_nid: self.peers[p].nid,
            dst_stamp: peer_stamp,
            body,
        };
        let mut bytes = self
            .pool
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(MSG_SIZE));
        bytes.resize(msg.wire_len(), 0);
        if let Err(e) = msg.emit(&mut bytes, opts) {
            // Unreachable by construction: payloads are checked in `send`.
            error!(error = %e, "cannot encode a message");
        }
        self.stats.msgs_sent += 1;
        if is_noop {
            if let Some(c) = self.conn_mut(conn) {
                c.noops_posted += 1;
            }
        }
        if self.capture.is_some() {
            let peer = self.peers[p].nid;
            self.record(CaptureDir::Sent, conn, peer, &bytes);
        }
        self.actions.push_back(FabricAction::Send {
            conn,
            wr: wr_of(key),
            bytes,
        });
    }
}
