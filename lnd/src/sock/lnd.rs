//! The socklnd engine as LNet sees it: [`SockEngine`] behind [`Lnd`]. A bulk payload streams
//! behind its header from LNet's memory (`SendPayload::Mem`); a GET is a plain message whose
//! REPLY (a separate message from the peer) lands in the GET's memory.

use core::any::Any;

use super::*;
use crate::iface::{BulkSend, Lnd, LndInfo, RxToken, SendError};
use crate::trim::Capacity;
use crate::wire::lnet::LNET_MTU;
use crate::wire::LnetBody;

impl SockEngine {
    fn take_tx(&mut self, peer: Nid, hdr: LnetHdr, payload: SendPayload, cookie: u64, get: bool) {
        let tx = Tx {
            peer,
            hdr,
            payload,
            cookie,
            get,
            queued_at: self.now,
        };
        self.queue_tx(tx);
    }
}

impl Lnd for SockEngine {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn nid(&self) -> Nid {
        self.cfg.nid
    }

    /// 4 KiB: a page, what LNet's small router buffers and most RPC requests fit, so a small
    /// message comes up in one read with its header, and anything larger lands straight in
    /// the memory LNet picks (a posted MD, a router's large buffer) without a copy.
    fn max_inline(&self) -> usize {
        self.cfg.max_inline as usize
    }

    fn send(
        &mut self,
        now: Instant,
        peer: Nid,
        hdr: LnetHdr,
        payload: Vec<u8>,
        cookie: u64,
    ) -> Result<(), SendError> {
        self.advance(now);
        self.check_peer(peer)?;
        if payload.len() > LNET_MTU as usize {
            return Err(SendError::PayloadTooLarge(payload.len()));
        }
        let p = if payload.is_empty() {
            SendPayload::None
        } else {
            SendPayload::Bytes(payload)
        };
        self.take_tx(peer, hdr, p, cookie, false);
        Ok(())
    }

    fn send_bulk(
        &mut self,
        now: Instant,
        peer: Nid,
        hdr: LnetHdr,
        bulk: BulkSend,
        cookie: u64,
    ) -> Result<(), SendError> {
        self.advance(now);
        self.check_peer(peer)?;
        match bulk {
            BulkSend::Put(src) => {
                let Some(mem) = src.mem else {
                    return Err(SendError::BadBulk);
                };
                let in_bounds = src.offset.saturating_add(u64::from(src.len)) <= mem.len() as u64;
                if src.len != hdr.payload_length || src.len > LNET_MTU || !in_bounds {
                    return Err(SendError::BadBulk);
                }
                let p = SendPayload::Mem {
                    mem,
                    offset: src.offset,
                    len: src.len,
                };
                self.take_tx(peer, hdr, p, cookie, false);
            }
            BulkSend::Get(sink) => {
                let LnetBody::Get { return_wmd, .. } = hdr.body else {
                    return Err(SendError::BadBulk);
                };
                if sink.mem.is_none() || self.gets.contains_key(&return_wmd) {
                    return Err(SendError::BadBulk);
                }
                self.gets.insert(
                    return_wmd,
                    GetWait {
                        peer,
                        cookie,
                        sink,
                        deadline: None,
                        landing: None,
                    },
                );
                self.take_tx(peer, hdr, SendPayload::None, cookie, true);
            }
        }
        Ok(())
    }

    fn recv_done(&mut self, now: Instant, rx: RxToken) {
        self.advance(now);
        self.rx_done(rx);
    }

    fn recv_failed(&mut self, now: Instant, rx: RxToken) {
        self.advance(now);
        self.rx_failed(rx);
    }

    fn accept_bulk(&mut self, now: Instant, rx: RxToken, sink: BulkMem, cookie: u64) {
        self.advance(now);
        self.rx_accept(rx, sink, cookie);
    }

    /// Never asked of this LND (a GET comes up as a plain message, and LNet answers with a
    /// REPLY it sends); accounted all the same: the request is released and the send fails.
    fn reply_bulk(&mut self, now: Instant, rx: RxToken, _src: BulkMem, cookie: u64) {
        self.advance(now);
        self.rx_done(rx);
        self.events.push_back(LndEvent::SendDone {
            cookie,
            peer: Nid::ANY,
            result: Err(TxError::Rdma(-crate::wire::errno::EPROTO)),
            returned: Vec::new(),
        });
    }

    fn refuse_bulk(&mut self, now: Instant, rx: RxToken, _errno: i32) {
        self.advance(now);
        // socklnd has no way to tell the sender: the payload is dropped as for no match.
        self.rx_done(rx);
    }

    fn poll_event(&mut self) -> Option<LndEvent> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.wheel.next_deadline()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.run_timers(now);
    }

    /// New sends refused, what waits fails, every connection closed gracefully (the peer sees
    /// FIN at a message boundary at once), the listener down.
    fn shutdown(&mut self, now: Instant) {
        self.advance(now);
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        if self.cfg.accept != AcceptMode::None {
            self.actions.push_back(StreamAction::Unlisten);
        }
        let queued: Vec<TxId> = self
            .peers
            .values_mut()
            .flat_map(|p| p.queue.drain(..))
            .collect();
        for k in queued {
            self.fail_tx(k, TxError::Shutdown);
        }
        let conns: Vec<StreamId> = self.conns.iter().map(|(s, _)| s).collect();
        for s in conns {
            self.close(s, ConnInput::Close, DownReason::Closed);
        }
        let gets: Vec<WireHandle> = self.gets.keys().copied().collect();
        for w in gets {
            if let Some(g) = self.gets.remove(&w) {
                self.bulk_done(g.cookie, g.peer, Err(TxError::Shutdown));
            }
        }
        self.peers.clear();
    }

    fn is_shut_down(&self) -> bool {
        self.shutting_down && self.conns.is_empty()
    }

    fn fabric_lost(&mut self, now: Instant) {
        self.advance(now);
        let conns: Vec<StreamId> = self.conns.iter().map(|(s, _)| s).collect();
        for s in conns {
            self.close(s, ConnInput::Ended, DownReason::ConnectionLost);
        }
        Lnd::shutdown(self, now);
    }

    fn peer_up(&self, peer: Nid) -> bool {
        peer == self.cfg.nid || self.peers.get(&peer).is_some_and(|p| p.up)
    }

    fn peer_count(&self) -> usize {
        self.peers.len()
    }

    fn timeout(&self) -> Duration {
        self.cfg.timeout
    }

    fn grant_timeout(&self) -> Duration {
        self.cfg.grant_timeout
    }

    /// Every byte lands through `Filled`, so a payload that came in short is seen.
    fn sees_writes(&self) -> bool {
        true
    }

    fn set_fabric_sees_writes(&mut self, _on: bool) {}

    fn info(&self) -> LndInfo {
        LndInfo::Sock {
            config: Box::new(self.cfg.clone()),
            stats: Box::new(self.stats.clone()),
        }
    }

    fn capacities(&self) -> Vec<Capacity> {
        Vec::new()
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        if self.recycled.len() < 64 && buf.capacity() <= self.cfg.max_inline as usize * 2 {
            self.recycled.push(buf);
        }
    }

    fn take_buffer(&mut self) -> Vec<u8> {
        let mut b = self.recycled.pop().unwrap_or_default();
        b.clear();
        b
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
