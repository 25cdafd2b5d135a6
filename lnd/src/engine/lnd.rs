//! The o2ib engine as LNet sees it: [`Endpoint`] behind the LND interface ([`crate::iface::Lnd`]).
//! Bulk payloads go by RDMA rendezvous: LNet's [`BulkMem`] becomes a write's local fragment (a
//! source) or an advertised sink (key and address); the memory itself is the fabric's business
//! (its registry), so a `BulkMem` without a registration of this NI's fabric cannot be used here.

use core::any::Any;

use super::*;
use crate::iface::{BulkMem, BulkSend, Lnd, LndInfo};
use crate::wire::RdmaFrag;

impl BulkMem {
    /// As the source of an RDMA write: its one local fragment (none for no bytes: a GET served
    /// with nothing).
    fn local_frags(&self) -> Vec<LocalFrag> {
        if self.len == 0 {
            return Vec::new();
        }
        vec![LocalFrag {
            region: self.region,
            offset: self.offset,
            len: self.len,
        }]
    }

    /// As a sink a peer writes into: key and address.
    fn rdma_sink(&self) -> RdmaSink {
        RdmaSink {
            key: self.key,
            frags: vec![RdmaFrag {
                nob: self.len,
                addr: self.addr.wrapping_add(self.offset),
            }],
        }
    }
}

impl Lnd for Endpoint {
    fn name(&self) -> &'static str {
        "o2ib"
    }

    fn nid(&self) -> Nid {
        self.cfg.nid
    }

    fn max_inline(&self) -> usize {
        MAX_INLINE
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
        if payload.len() > MAX_INLINE && !self.shutting_down {
            return Err(SendError::PayloadTooLarge(payload.len()));
        }
        let p = self.peer_for_send(peer)?;
        let key = self.new_tx(p, TxBody::Immediate { hdr, payload }, Some(cookie));
        self.launch_tx(key);
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
        match bulk {
            BulkSend::Put(src) => self.send_put_rdma(now, peer, hdr, src.local_frags(), cookie),
            BulkSend::Get(sink) => self.send_get_rdma(now, peer, hdr, sink.rdma_sink(), cookie),
        }
    }

    fn recv_done(&mut self, now: Instant, rx: RxToken) {
        Endpoint::recv_done(self, now, rx);
    }

    fn recv_failed(&mut self, now: Instant, rx: RxToken) {
        Endpoint::recv_failed(self, now, rx);
    }

    fn accept_bulk(&mut self, now: Instant, rx: RxToken, sink: BulkMem, cookie: u64) {
        self.accept_put_rdma(now, rx, sink.rdma_sink(), cookie);
    }

    fn reply_bulk(&mut self, now: Instant, rx: RxToken, src: BulkMem, cookie: u64) {
        self.reply_get_rdma(now, rx, src.local_frags(), cookie);
    }

    fn refuse_bulk(&mut self, now: Instant, rx: RxToken, errno: i32) {
        self.refuse_rdma(now, rx, errno);
    }

    crate::forward_lifecycle!(Endpoint, LndEvent);

    /// Every connection as if its queue pair went to error at once (what was in flight fails
    /// as on a transport error, the peers reported down), then a shutdown, which with no
    /// connection left finishes at once.
    fn fabric_lost(&mut self, now: Instant) {
        let conns: Vec<ConnId> = self.conn_ids();
        for c in conns {
            self.handle_disconnected(now, c, DisconnectReason::TransportError);
        }
        Endpoint::shutdown(self, now);
    }

    fn peer_up(&self, peer: Nid) -> bool {
        self.peer(peer).is_some_and(|v| v.up)
    }

    fn peer_count(&self) -> usize {
        Endpoint::peer_count(self)
    }

    fn timeout(&self) -> Duration {
        self.cfg.tunables.timeout
    }

    fn grant_timeout(&self) -> Duration {
        self.cfg.tunables.grant_timeout
    }

    fn sees_writes(&self) -> bool {
        self.fabric_sees_writes()
    }

    fn set_fabric_sees_writes(&mut self, on: bool) {
        Endpoint::set_fabric_sees_writes(self, on);
    }

    fn info(&self) -> LndInfo {
        LndInfo::O2ib {
            config: Box::new(self.cfg.clone()),
            stats: Box::new(self.stats.clone()),
        }
    }

    fn capacities(&self) -> Vec<Capacity> {
        Endpoint::capacities(self)
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        Endpoint::recycle(self, buf);
    }

    fn take_buffer(&mut self) -> Vec<u8> {
        Endpoint::take_buffer(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
