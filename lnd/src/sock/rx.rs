//! KSOCK messages in (reference 5.1-5.5): headers gather in a small carry buffer (several small
//! messages may come in one read), inline payloads go up with their header, bulk payloads wait
//! for LNet to say where they land and then go straight there (`Recv { Mem }`), surplus and
//! unwanted payloads are read and dropped. Nothing is read while LNet has not answered a bulk
//! request or holds `peer_credits` messages of the connection: socklnd's back-pressure.

use super::tx::land_bytes;
use super::*;
use crate::iface::{BulkOp, RxToken};
use crate::stream::RecvTarget;
use crate::wire::lnet::LNET_HDR_LEN;
use crate::wire::sock::{KsockType, ZcAcks, KSOCK_HDR_LEN};
use crate::wire::{LnetBody, LnetMsgType};

const MSG_HDR: usize = KSOCK_HDR_LEN + LNET_HDR_LEN;

/// What a checksum says.
fn csum_ok(msg: &RxMsg) -> bool {
    match msg.csum {
        None => true,
        Some(c) => c.value() == msg.ksock.csum,
    }
}

impl SockEngine {
    pub(super) fn on_data(&mut self, id: StreamId, bytes: &[u8]) {
        self.capture_bytes(id, false, &[bytes], 0);
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if !bytes.is_empty() {
            c.last_rx = self.now;
        }
        if c.state.handshaking() {
            self.hs_data(id, bytes);
            return;
        }
        c.posted = false;
        c.carry.extend_from_slice(bytes);
        self.rx_pump(id);
        self.arm_conn(id);
    }

    pub(super) fn on_filled(&mut self, id: StreamId, n: u32) {
        // The payload landed in LNet's memory: counted, not copied.
        self.capture_bytes(id, false, &[], n);
        let now = self.now;
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        c.last_rx = now;
        let RxPhase::Mem(l) = &mut c.rx else {
            return;
        };
        let n = n.min(c.mem_left);
        let start = l.offset + u64::from(l.landed);
        if let Some(cs) = l.msg.csum.as_mut() {
            l.mem.with(|b| {
                let s = start as usize;
                if let Some(x) = b.get(s..s + n as usize) {
                    cs.update(x);
                }
            });
        }
        l.landed += n;
        self.stats.bulk_bytes_received += u64::from(n);
        c.mem_left -= n;
        if c.mem_left == 0 {
            c.posted = false;
            self.rx_pump(id);
        }
        self.arm_conn(id);
    }

    /// Consumes what the carry holds as far as the phase allows, then posts the next Recv.
    pub(super) fn rx_pump(&mut self, id: StreamId) {
        loop {
            let Some(c) = self.conns.get_mut(id) else {
                return;
            };
            if c.state != ConnState::Established || c.posted {
                return;
            }
            match &mut c.rx {
                RxPhase::AwaitLnet => return,
                RxPhase::Header => {
                    if c.held >= self.cfg.peer_credits.max(1) {
                        return;
                    }
                    if !self.rx_header(id) {
                        return;
                    }
                }
                RxPhase::Discard { left, msg } => {
                    let k = (*left as usize).min(c.carry.len());
                    if let Some(cs) = msg.csum.as_mut() {
                        cs.update(&c.carry[..k]);
                    }
                    c.carry.drain(..k);
                    *left -= k as u32;
                    if *left > 0 {
                        let max = (*left).min(RX_CHUNK);
                        drop_if_empty(&mut c.carry);
                        self.post_bytes(id, max);
                        return;
                    }
                    let RxPhase::Discard { msg, .. } =
                        core::mem::replace(&mut c.rx, RxPhase::Header)
                    else {
                        return;
                    };
                    drop_if_empty(&mut c.carry);
                    if !self.message_done(id, &msg) {
                        return;
                    }
                }
                RxPhase::Mem(l) => {
                    // Bytes of the payload already in the carry land first.
                    let k = ((l.len - l.landed) as usize).min(c.carry.len());
                    if k > 0 {
                        let start = (l.offset + u64::from(l.landed)) as usize;
                        let ok = l.mem.with(|b| match b.get_mut(start..start + k) {
                            Some(dst) => {
                                dst.copy_from_slice(&c.carry[..k]);
                                true
                            }
                            None => false,
                        });
                        if !ok {
                            // A sink smaller than LNet said: nothing lands outside it.
                            self.stats.protocol_errors += 1;
                            self.close_siblings(
                                id,
                                ConnInput::ProtocolError,
                                DownReason::ProtocolError,
                            );
                            return;
                        }
                        if let Some(cs) = l.msg.csum.as_mut() {
                            cs.update(&c.carry[..k]);
                        }
                        c.carry.drain(..k);
                        l.landed += k as u32;
                        self.stats.bulk_bytes_received += k as u64;
                    }
                    if l.landed < l.len {
                        let left = l.len - l.landed;
                        let target = RecvTarget::Mem {
                            mem: l.mem.clone(),
                            offset: l.offset + u64::from(l.landed),
                            len: left,
                        };
                        c.mem_left = left;
                        c.posted = true;
                        drop_if_empty(&mut c.carry);
                        self.actions
                            .push_back(StreamAction::Recv { stream: id, target });
                        return;
                    }
                    let RxPhase::Mem(l) = core::mem::replace(&mut c.rx, RxPhase::Header) else {
                        return;
                    };
                    let l = *l;
                    let peer = c.peer.unwrap_or(Nid::ANY);
                    if l.surplus > 0 {
                        // The rest is read and dropped; the landing is reported once the
                        // whole message is in (its checksum covers the surplus too).
                        let (cookie, get, len) = (l.cookie, l.get, l.len);
                        c.rx = RxPhase::Discard {
                            left: l.surplus,
                            msg: Box::new(l.msg),
                        };
                        self.pending_landing(id, cookie, get, len);
                        continue;
                    }
                    let ok = csum_ok(&l.msg);
                    self.finish_landing(id, peer, l.cookie, l.get, l.len, ok);
                    if !self.message_done(id, &l.msg) {
                        return;
                    }
                }
            }
        }
    }

    /// Parses the next message header from the carry. True if it consumed one and the loop
    /// may go on; false when it needs bytes (a Recv is posted) or the connection closed.
    fn rx_header(&mut self, id: StreamId) -> bool {
        let max_inline = self.cfg.max_inline as usize;
        let Some(c) = self.conns.get_mut(id) else {
            return false;
        };
        let have = c.carry.len();
        if have < KSOCK_HDR_LEN {
            drop_if_empty(&mut c.carry);
            let max = RX_CHUNK - have as u32;
            self.post_bytes(id, max);
            return false;
        }
        let ksock = match KsockHdr::parse(&c.carry[..KSOCK_HDR_LEN]) {
            Ok(k) => k,
            Err(e) => return self.rx_error(id, &e),
        };
        let version = c.version;
        let from = c.peer.unwrap_or(Nid::ANY);
        // We never ask for a zero-copy ACK (cookie 0 always), so any ACK a peer sends us
        // acknowledges nothing of ours: -EPROTO as `ksocknal_handle_zcack` says for an unknown
        // cookie. A keepalive (cookie 1) is not an ACK.
        let acks = ZcAcks::from_hdr(&ksock);
        if acks.count() > 0 {
            c.zc_acks_received += acks.count();
            warn!(?id, peer = %from, ?acks, "socklnd: ZC-ACK for a request we never made");
            self.stats.protocol_errors += 1;
            self.close_siblings(id, ConnInput::ProtocolError, DownReason::ProtocolError);
            return false;
        }
        if ksock.kind == KsockType::Noop {
            // V3: a NOOP's checksum is 0 or ~0 (no payload to sum); V2: it covers the header.
            let ok = match (version, ksock.csum) {
                (_, 0) => true,
                (HelloVersion::V2, c) => ksock.csum_start().value() == c,
                (_, 0xFFFF_FFFF) => true,
                _ => false,
            };
            if !ok {
                self.stats.checksum_errors += 1;
                self.stats.protocol_errors += 1;
                self.close_siblings(id, ConnInput::ProtocolError, DownReason::ProtocolError);
                return false;
            }
            c.carry.drain(..KSOCK_HDR_LEN);
            drop_if_empty(&mut c.carry);
            self.stats.noops_received += 1;
            return true;
        }
        if have < MSG_HDR {
            let max = (RX_CHUNK as usize).saturating_sub(have).max(MSG_HDR - have);
            self.post_bytes(id, max as u32);
            return false;
        }
        let hdr = match LnetHdr::parse(&c.carry[KSOCK_HDR_LEN..MSG_HDR]) {
            Ok(h) if h.msg_type() != LnetMsgType::Hello => h,
            Ok(_) => {
                // Type HELLO never appears after the handshake (5.2).
                self.stats.protocol_errors += 1;
                self.close_siblings(id, ConnInput::ProtocolError, DownReason::ProtocolError);
                return false;
            }
            Err(e) => return self.rx_error(id, &e),
        };
        let plen = hdr.payload_length as usize;
        // V2 sums the headers too (csum field 0); V3/V4 only the payload (5.4).
        let csum = (ksock.csum != 0).then(|| match version {
            HelloVersion::V2 => {
                let mut cs = ksock.csum_start();
                cs.update(&c.carry[KSOCK_HDR_LEN..MSG_HDR]);
                cs
            }
            _ => KsockCsum::new(),
        });
        let msg = RxMsg { ksock, hdr, csum };
        // A REPLY to a GET of ours lands in the GET's memory.
        let get = match hdr.body {
            LnetBody::Reply { dst_wmd } => self
                .gets
                .get(&dst_wmd)
                .filter(|g| g.peer == from && g.landing.is_none())
                .map(|_| dst_wmd),
            _ => None,
        };
        let Some(c) = self.conns.get_mut(id) else {
            return false;
        };
        if let Some(wmd) = get {
            c.carry.drain(..MSG_HDR);
            let Some(g) = self.gets.get_mut(&wmd) else {
                return false;
            };
            g.landing = Some(id);
            let (sink, cookie) = (g.sink.clone(), g.cookie);
            self.start_landing(id, msg, sink, cookie, Some(wmd));
            return true;
        }
        if plen <= max_inline {
            if have < MSG_HDR + plen {
                let max = (MSG_HDR + plen - have) as u32;
                self.post_bytes(id, max);
                return false;
            }
            // From the buffers LNet gave back (`Lnd::recycle`): no allocation per message.
            let mut payload = self.recycled.pop().unwrap_or_default();
            payload.clear();
            payload.extend_from_slice(&c.carry[MSG_HDR..MSG_HDR + plen]);
            c.carry.drain(..MSG_HDR + plen);
            drop_if_empty(&mut c.carry);
            let mut msg = msg;
            if let Some(cs) = msg.csum.as_mut() {
                cs.update(&payload);
            }
            if !csum_ok(&msg) {
                self.stats.checksum_errors += 1;
                self.close_siblings(id, ConnInput::ProtocolError, DownReason::ProtocolError);
                return false;
            }
            if !self.message_done(id, &msg) {
                return false;
            }
            let slot = self.next_slot();
            let rx = RxToken::new(id.as_u64(), slot);
            if let Some(c) = self.conns.get_mut(id) {
                c.held += 1;
            }
            self.held
                .insert((id.as_u64(), slot), Held::Inline { stream: id });
            self.stats.msgs_received += 1;
            self.events.push_back(LndEvent::Received {
                from,
                hdr,
                payload,
                rx,
            });
            return true;
        }
        // A bulk payload: LNet says where it lands (accept_bulk) or that nothing wants it
        // (recv_done). Nothing more is read until then.
        c.carry.drain(..MSG_HDR);
        c.rx = RxPhase::AwaitLnet;
        let slot = self.next_slot();
        let rx = RxToken::new(id.as_u64(), slot);
        self.held.insert(
            (id.as_u64(), slot),
            Held::Bulk {
                stream: id,
                msg: Box::new(msg),
                from,
            },
        );
        self.stats.msgs_received += 1;
        self.events.push_back(LndEvent::BulkRequest {
            from,
            hdr,
            op: BulkOp::Put,
            rx,
        });
        false
    }

    fn rx_error(&mut self, id: StreamId, e: &dyn core::fmt::Debug) -> bool {
        warn!(?id, ?e, "socklnd: bad message, closing");
        self.stats.protocol_errors += 1;
        self.close_siblings(id, ConnInput::ProtocolError, DownReason::ProtocolError);
        false
    }

    /// Starts landing `msg`'s payload in `sink` (as much as it takes; the rest is dropped).
    pub(super) fn start_landing(
        &mut self,
        id: StreamId,
        msg: RxMsg,
        sink: BulkMem,
        cookie: u64,
        get: Option<WireHandle>,
    ) {
        let plen = msg.hdr.payload_length;
        let deadline = self.now.saturating_add(self.cfg.grant_timeout);
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let fits = sink
            .mem
            .as_ref()
            .is_some_and(|m| sink.offset.saturating_add(u64::from(sink.len)) <= m.len() as u64);
        match (sink.mem, fits) {
            (Some(mem), true) => {
                let len = sink.len.min(plen);
                c.rx = RxPhase::Mem(Box::new(Landing {
                    msg,
                    mem,
                    offset: sink.offset,
                    len,
                    landed: 0,
                    surplus: plen - len,
                    cookie,
                    get,
                    deadline,
                }));
            }
            _ => {
                // No memory to land in (a sink without a SharedMem, or out of its bounds):
                // the transfer fails and the payload is dropped.
                c.rx = RxPhase::Discard {
                    left: plen,
                    msg: Box::new(msg),
                };
                let peer = c.peer.unwrap_or(Nid::ANY);
                if let Some(w) = get {
                    self.gets.remove(&w);
                }
                self.bulk_done(
                    cookie,
                    peer,
                    Err(TxError::Rdma(-crate::wire::errno::EPROTO)),
                );
            }
        }
        self.rx_pump(id);
        self.arm_conn(id);
    }

    /// A landing whose surplus is still to be read: reported when the surplus is in.
    fn pending_landing(&mut self, id: StreamId, cookie: u64, get: Option<WireHandle>, len: u32) {
        self.landings.insert(id, (cookie, get, len));
    }

    /// The payload is in: LNet hears how much landed (or that the checksum failed).
    fn finish_landing(
        &mut self,
        id: StreamId,
        peer: Nid,
        cookie: u64,
        get: Option<WireHandle>,
        len: u32,
        ok: bool,
    ) {
        if let Some(w) = get {
            self.gets.remove(&w);
        }
        // A bad sum is counted where the connection is closed for it (message_done).
        let result = if ok {
            Ok(len)
        } else {
            Err(TxError::Rdma(-crate::wire::errno::EIO))
        };
        let _ = id;
        self.bulk_done(cookie, peer, result);
    }

    /// The end of a whole message: its checksum, then the ZC-ACK it asked for (5.5: as soon
    /// as the payload is in, also when LNet dropped it). False if the connection closed.
    fn message_done(&mut self, id: StreamId, msg: &RxMsg) -> bool {
        let peer = self.conns.get(id).and_then(|c| c.peer).unwrap_or(Nid::ANY);
        if let Some((cookie, get, len)) = self.landings.remove(&id) {
            self.finish_landing(id, peer, cookie, get, len, csum_ok(msg));
        }
        if !csum_ok(msg) {
            self.stats.checksum_errors += 1;
            self.close_siblings(id, ConnInput::ProtocolError, DownReason::ProtocolError);
            return false;
        }
        if msg.ksock.zc_req != 0 {
            self.send_zc_ack(id, peer, msg.ksock.zc_req);
        }
        true
    }

    /// A landing cut short (its connection closed or stalled): LNet hears once.
    pub(super) fn end_landing(&mut self, l: Landing, peer: Nid, result: Result<u32, TxError>) {
        if let Some(w) = l.get {
            self.gets.remove(&w);
        }
        self.bulk_done(l.cookie, peer, result);
    }

    // ------------------------------------------------------------------ LNet's answers

    pub(super) fn rx_done(&mut self, rx: RxToken) {
        let (conn, slot) = rx.parts();
        match self.held.remove(&(conn, slot)) {
            Some(Held::Inline { stream }) => {
                if let Some(c) = self.conns.get_mut(stream) {
                    c.held = c.held.saturating_sub(1);
                }
                self.rx_pump(stream);
                self.arm_conn(stream);
            }
            Some(Held::Bulk { stream, msg, .. }) => {
                // Nothing matched: the payload is read and dropped (ksocknal_recv with no
                // buffer), and its ZC request still answered.
                if let Some(c) = self.conns.get_mut(stream) {
                    if matches!(c.rx, RxPhase::AwaitLnet) {
                        c.rx = RxPhase::Discard {
                            left: msg.hdr.payload_length,
                            msg,
                        };
                    }
                }
                self.rx_pump(stream);
                self.arm_conn(stream);
            }
            Some(Held::Local { .. }) | None => {}
        }
    }

    pub(super) fn rx_failed(&mut self, rx: RxToken) {
        let (conn, slot) = rx.parts();
        match self.held.remove(&(conn, slot)) {
            Some(Held::Inline { stream } | Held::Bulk { stream, .. }) => {
                self.stats.protocol_errors += 1;
                self.close_siblings(stream, ConnInput::ProtocolError, DownReason::ProtocolError);
            }
            Some(Held::Local { .. }) | None => {}
        }
    }

    pub(super) fn rx_accept(&mut self, rx: RxToken, sink: BulkMem, cookie: u64) {
        let (conn, slot) = rx.parts();
        match self.held.remove(&(conn, slot)) {
            Some(Held::Bulk { stream, msg, from }) => {
                let live = self
                    .conns
                    .get(stream)
                    .is_some_and(|c| matches!(c.rx, RxPhase::AwaitLnet));
                if !live {
                    self.bulk_done(cookie, from, Err(TxError::ConnAborted));
                    return;
                }
                self.start_landing(stream, *msg, sink, cookie, None);
            }
            Some(Held::Local { payload, bulk, .. }) => {
                let me = self.cfg.nid;
                let n = if bulk {
                    land_bytes(&sink, &payload)
                } else {
                    None
                };
                self.bulk_done(
                    cookie,
                    me,
                    n.ok_or(TxError::Rdma(-crate::wire::errno::EPROTO)),
                );
            }
            Some(Held::Inline { stream }) => {
                // Not a bulk request: answer it as done, and fail the transfer.
                if let Some(c) = self.conns.get_mut(stream) {
                    c.held = c.held.saturating_sub(1);
                }
                let peer = self
                    .conns
                    .get(stream)
                    .and_then(|c| c.peer)
                    .unwrap_or(Nid::ANY);
                self.bulk_done(
                    cookie,
                    peer,
                    Err(TxError::Rdma(-crate::wire::errno::EPROTO)),
                );
                self.rx_pump(stream);
            }
            None => self.bulk_done(cookie, Nid::ANY, Err(TxError::ConnAborted)),
        }
    }
}

fn drop_if_empty(v: &mut Vec<u8>) {
    if v.is_empty() && v.capacity() > 0 {
        *v = Vec::new();
    }
}
