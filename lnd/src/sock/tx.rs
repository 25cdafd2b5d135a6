//! Messages out: queues waiting for a connection, the connection choice of reference 4.3,
//! completions (a send is done when the driver says its bytes are in the socket, as ksocklnd
//! finalizes on the last byte written), keepalive NOOPs and ZC-ACKs, and delivery to ourselves.

use super::*;
use crate::iface::SendError;
use crate::wire::lnet::LNET_HDR_LEN;
use crate::wire::sock::KSOCK_HDR_LEN;
use crate::wire::{LnetBody, LnetMsgType};

/// How well a connection suits a message (`ksocknal_find_conn_locked` / `pro_match_tx`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fit {
    No,
    May,
    Yes,
}

/// The match table of 4.3 for an LNET message of `nob` bytes (24 + 72 + payload). V3 and
/// later never pick ANY for a kernel; we do (our `typed_conns = 0` sets are ANY), which no
/// kernel peer sees since a kernel only dials typed sets.
fn fit(version: HelloVersion, t: ConnType, nob: u64, min_bulk: u32) -> Fit {
    let big = nob >= u64::from(min_bulk);
    match (version, t, big) {
        (_, ConnType::Any, _) => Fit::Yes,
        (HelloVersion::V2 | HelloVersion::V1, ConnType::BulkIn, _) => Fit::May,
        (_, ConnType::BulkIn, _) => Fit::No,
        (_, ConnType::Control, false) | (_, ConnType::BulkOut, true) => Fit::Yes,
        (_, ConnType::Control, true) | (_, ConnType::BulkOut, false) => Fit::May,
    }
}

impl SockEngine {
    /// The checks every send makes of its destination.
    pub(super) fn check_peer(&self, peer: Nid) -> Result<(), SendError> {
        if self.shutting_down {
            return Err(SendError::Shutdown);
        }
        if peer.is_any() || peer.net() != self.cfg.nid.net() {
            return Err(SendError::BadPeer(peer));
        }
        if peer != self.cfg.nid
            && !self.peers.contains_key(&peer)
            && self.peers.len() >= self.cfg.max_peers as usize
        {
            return Err(SendError::PeerTableFull(peer));
        }
        Ok(())
    }

    /// Takes a message: to ourselves at once, otherwise on a connection or queued for one.
    pub(super) fn queue_tx(&mut self, tx: Tx) {
        let nid = tx.peer;
        if nid == self.cfg.nid {
            self.deliver_local(tx);
            return;
        }
        let k = self.txs.insert(tx);
        let cpp = self.cfg.conns_per_peer();
        let p = self.peers.entry(nid).or_default();
        if p.cpp == 0 {
            p.cpp = cpp;
        }
        p.queue.push_back(k);
        self.drain_queue(nid);
        // Missing types are dialed on every send (reference 4.4), within the backoff.
        self.kick_peer(nid);
        self.arm_peer(nid);
    }

    /// Puts whatever queued messages of `nid` a connection suits on it, in order.
    pub(super) fn drain_queue(&mut self, nid: Nid) {
        let Some(p) = self.peers.get(&nid) else {
            return;
        };
        if p.queue.is_empty() {
            return;
        }
        let queue: Vec<TxId> = p.queue.iter().copied().collect();
        let mut left = VecDeque::new();
        for k in queue {
            let Some(tx) = self.txs.get(k) else { continue };
            let nob = (KSOCK_HDR_LEN + LNET_HDR_LEN + tx.payload.len()) as u64;
            match self.choose_conn(nid, nob) {
                Some(c) => self.start_send(c, k),
                None => left.push_back(k),
            }
        }
        if let Some(p) = self.peers.get_mut(&nid) {
            p.queue = left;
        }
    }

    /// Among `nid`'s established connections, a "yes" one with the fewest queued bytes
    /// (ties to the least recently used), else a "may" one.
    fn choose_conn(&self, nid: Nid, nob: u64) -> Option<StreamId> {
        let p = self.peers.get(&nid)?;
        p.conns
            .iter()
            .filter_map(|&s| Some((s, self.conns.get(s)?)))
            .filter(|(_, c)| c.state == ConnState::Established)
            .map(|(s, c)| (fit(c.version, c.ctype, nob, self.cfg.min_bulk), s, c))
            .filter(|(f, _, _)| *f != Fit::No)
            .min_by_key(|(f, _, c)| (core::cmp::Reverse(*f), c.queued_bytes, c.last_used))
            .map(|(_, s, _)| s)
    }

    /// Hands a message to the driver on `id`: the KSOCK header (csum 0, no ZC request: a
    /// userspace sender frees its buffer on the local completion) and the LNet header, then
    /// the payload.
    fn start_send(&mut self, id: StreamId, k: TxId) {
        let Some(tx) = self.txs.get_mut(k) else {
            return;
        };
        let mut head = Vec::with_capacity(KSOCK_HDR_LEN + LNET_HDR_LEN);
        head.extend_from_slice(&KsockHdr::LNET.emit());
        head.resize(KSOCK_HDR_LEN + LNET_HDR_LEN, 0);
        if tx.hdr.emit(&mut head[KSOCK_HDR_LEN..]).is_err() {
            self.fail_tx(k, TxError::SendFailed);
            return;
        }
        let payload = core::mem::replace(&mut tx.payload, SendPayload::None);
        self.send_raw(id, head, payload, Some(k));
    }

    /// One `Send` on `id`, tracked until its `Sent`.
    pub(super) fn send_raw(
        &mut self,
        id: StreamId,
        head: Vec<u8>,
        payload: SendPayload,
        tx: Option<TxId>,
    ) {
        let sid = self.next_send_id();
        let now = self.now;
        let Some(c) = self.conns.get_mut(id) else {
            if let Some(k) = tx {
                self.fail_tx(k, TxError::ConnAborted);
            }
            return;
        };
        let nob = (head.len() + payload.len()) as u32;
        if c.inflight.is_empty() {
            c.last_tx_progress = now;
        }
        c.inflight.push_back((sid, tx, nob));
        c.queued_bytes += u64::from(nob);
        c.last_used = now;
        if self.capture.is_some() {
            match &payload {
                SendPayload::None => self.capture_bytes(id, true, &[&head], 0),
                SendPayload::Bytes(b) => self.capture_bytes(id, true, &[&head, b], 0),
                SendPayload::Mem { mem, offset, len } => {
                    let (offset, len) = (*offset as usize, *len as usize);
                    let kept = len.min(CAPTURE_BYTES.saturating_sub(head.len()));
                    let first = mem.with(|m| {
                        m.get(offset..offset.saturating_add(kept))
                            .map(<[u8]>::to_vec)
                            .unwrap_or_default()
                    });
                    let elided = (len - first.len()) as u32;
                    self.capture_bytes(id, true, &[&head, &first], elided);
                }
            }
        }
        self.actions.push_back(StreamAction::Send {
            stream: id,
            id: sid,
            head,
            payload,
        });
    }

    pub(super) fn on_sent(
        &mut self,
        id: StreamId,
        sid: SendId,
        result: Result<(), crate::stream::EndReason>,
    ) {
        let now = self.now;
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let Some(i) = c.inflight.iter().position(|(s, _, _)| *s == sid) else {
            return;
        };
        let Some((_, tx, nob)) = c.inflight.remove(i) else {
            return;
        };
        c.queued_bytes = c.queued_bytes.saturating_sub(u64::from(nob));
        c.last_tx_progress = now;
        if let Some(k) = tx {
            match result {
                Ok(()) => self.complete_tx(k),
                Err(_) => self.fail_tx(k, TxError::SendFailed),
            }
        }
        // A message that waited for room may go now (fewest queued bytes).
        if let Some(nid) = self.conns.get(id).and_then(|c| c.peer) {
            self.drain_queue(nid);
        }
        self.arm_conn(id);
    }

    /// A GET (`hdr`) is out: its outcome is its REPLY's landing, due within `timeout`.
    fn await_reply(&mut self, hdr: &LnetHdr) {
        if let LnetBody::Get { return_wmd, .. } = hdr.body {
            let d = self.now.saturating_add(self.cfg.timeout);
            if let Some(g) = self.gets.get_mut(&return_wmd) {
                g.deadline = Some(d);
                self.wheel.insert(d, Timer::Get(return_wmd));
            }
        }
    }

    /// A message's bytes are all in the socket.
    fn complete_tx(&mut self, k: TxId) {
        let Some(tx) = self.txs.remove(k) else { return };
        self.stats.msgs_sent += 1;
        if tx.get {
            self.await_reply(&tx.hdr);
            return;
        }
        self.events.push_back(LndEvent::SendDone {
            cookie: tx.cookie,
            peer: tx.peer,
            result: Ok(()),
            returned: Vec::new(),
        });
    }

    /// A message failed: its one completion, with the payload given back if we still have it.
    pub(super) fn fail_tx(&mut self, k: TxId, err: TxError) {
        let Some(tx) = self.txs.remove(k) else { return };
        self.stats.send_failures += 1;
        if let Some(p) = self.peers.get_mut(&tx.peer) {
            p.queue.retain(|&q| q != k);
        }
        if tx.get {
            if let LnetBody::Get { return_wmd, .. } = tx.hdr.body {
                if self.gets.remove(&return_wmd).is_some() {
                    self.bulk_done(tx.cookie, tx.peer, Err(err));
                }
            }
            return;
        }
        let returned = match tx.payload {
            SendPayload::Bytes(b) => b,
            _ => Vec::new(),
        };
        self.events.push_back(LndEvent::SendDone {
            cookie: tx.cookie,
            peer: tx.peer,
            result: Err(err),
            returned,
        });
    }

    /// Whether `c` is where our keepalive NOOPs go: the non-blocking NOOP's connection of 4.3
    /// (our BULK_IN, or an ANY one), on V3 (V2 has no keepalive).
    pub(super) fn keepalive_conn(&self, c: &Conn) -> bool {
        !self.cfg.keepalive.is_zero()
            && c.state == ConnState::Established
            && c.version >= HelloVersion::V3
            && matches!(c.ctype, ConnType::BulkIn | ConnType::Any)
    }

    /// When `c` owes a keepalive: `keepalive` after the last byte in and the last keepalive
    /// (`ksocknal_send_keepalive_locked`; a kernel was seen sending them >= 30 s apart).
    pub(super) fn keepalive_due(&self, c: &Conn) -> Instant {
        c.last_rx
            .max(c.last_keepalive)
            .saturating_add(self.cfg.keepalive)
    }

    pub(super) fn send_keepalive(&mut self, id: StreamId) {
        let now = self.now;
        let keepalive = self.cfg.keepalive;
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if !c.inflight.is_empty() {
            // Something is queued there already: retry in 10 s (as the kernel's reaper does
            // when the ACK connection is busy), never in a loop.
            c.last_keepalive = now
                .saturating_sub(keepalive)
                .saturating_add(KEEPALIVE_RETRY)
                .max(c.last_keepalive);
            return;
        }
        c.last_keepalive = now;
        self.stats.keepalives_sent += 1;
        let head = KsockHdr::KEEPALIVE.emit().to_vec();
        self.send_raw(id, head, SendPayload::None, None);
    }

    /// Acknowledges the peer's zero-copy request `cookie` (reference 5.5) at once, on the
    /// connection the kernel treats as its ACK connection (its BULK_IN: our BULK_OUT), or on
    /// `on` if there is none (the receiver does not check which).
    pub(super) fn send_zc_ack(&mut self, on: StreamId, nid: Nid, cookie: u64) {
        let target = self
            .peers
            .get(&nid)
            .and_then(|p| {
                p.conns
                    .iter()
                    .filter_map(|&s| Some((s, self.conns.get(s)?)))
                    .filter(|(_, c)| {
                        c.state == ConnState::Established && c.ctype == ConnType::BulkOut
                    })
                    .min_by_key(|(_, c)| c.queued_bytes)
                    .map(|(s, _)| s)
            })
            .unwrap_or(on);
        let hdr = KsockHdr {
            kind: crate::wire::sock::KsockType::Noop,
            csum: 0,
            zc_req: 0,
            zc_ack: cookie,
        };
        if let Some(c) = self.conns.get_mut(target) {
            c.zc_acks_sent += 1;
        }
        self.stats.zc_acks_sent += 1;
        self.send_raw(target, hdr.emit().to_vec(), SendPayload::None, None);
    }

    /// A message to our own NID: delivered here, no connection (see the module doc).
    fn deliver_local(&mut self, tx: Tx) {
        self.stats.loopback_msgs += 1;
        let payload = match tx.payload {
            SendPayload::None => Vec::new(),
            SendPayload::Bytes(b) => b,
            SendPayload::Mem { mem, offset, len } => mem
                .with(|b| {
                    let s = offset as usize;
                    b.get(s..s + len as usize).map(<[u8]>::to_vec)
                })
                .unwrap_or_default(),
        };
        let me = self.cfg.nid;
        if tx.get {
            self.await_reply(&tx.hdr);
        } else {
            self.events.push_back(LndEvent::SendDone {
                cookie: tx.cookie,
                peer: me,
                result: Ok(()),
                returned: Vec::new(),
            });
        }
        let hdr = tx.hdr;
        if let LnetBody::Reply { dst_wmd } = hdr.body {
            if self.gets.get(&dst_wmd).is_some_and(|g| g.peer == me) {
                if let Some(g) = self.gets.remove(&dst_wmd) {
                    let n = land_bytes(&g.sink, &payload);
                    self.bulk_done(
                        g.cookie,
                        me,
                        n.ok_or(TxError::Rdma(-crate::wire::errno::EPROTO)),
                    );
                }
                return;
            }
        }
        let slot = self.next_slot();
        let rx = crate::iface::RxToken::new(LOCAL_CONN, slot);
        let bulk = payload.len() > self.cfg.max_inline as usize
            && matches!(hdr.msg_type(), LnetMsgType::Put | LnetMsgType::Reply);
        let ev = if bulk {
            LndEvent::BulkRequest {
                from: me,
                hdr,
                op: crate::iface::BulkOp::Put,
                rx,
            }
        } else {
            LndEvent::Received {
                from: me,
                hdr,
                payload: payload.clone(),
                rx,
            }
        };
        let payload = if bulk { payload } else { Vec::new() };
        self.held
            .insert((LOCAL_CONN, slot), Held::Local { payload, bulk });
        self.events.push_back(ev);
    }

    pub(super) fn next_slot(&mut self) -> u32 {
        self.next_slot = self.next_slot.wrapping_add(1);
        self.next_slot
    }
}

/// Copies `payload` into `sink`'s memory (as much as it takes); the bytes landed, or None if
/// the sink has no memory or lies about its bounds.
pub(super) fn land_bytes(sink: &BulkMem, payload: &[u8]) -> Option<u32> {
    let mem = sink.mem.as_ref()?;
    let n = (sink.len as usize).min(payload.len());
    let s = sink.offset as usize;
    mem.with(|b| {
        let dst = b.get_mut(s..s.checked_add(n)?)?;
        dst.copy_from_slice(&payload[..n]);
        Some(n as u32)
    })
}
