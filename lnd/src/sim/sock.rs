//! A bare socklnd engine ([`SockEngine`]) as a node of the world: `World<SockEngine>` runs
//! engines on the world's stream network, as `World<Endpoint>` runs o2ib endpoints on its
//! fabric. The world plays LNet above each engine as it does above an endpoint: it books
//! received messages and returns them at once (or after the node's receive delay), records
//! send outcomes under cookies, and keeps everything else (bulk requests, bulk completions) in
//! [`World::node_events`], where a test plays LNet's side of a bulk transfer.

use super::*;
use crate::iface::{BulkSend, Lnd};
use crate::sock::{SockConfig, SockEngine};

/// A socklnd engine has no fabric: nothing on the simulated fabric names it (its NID is routed
/// there, but it never connects, so no event ever comes).
impl FabricSink for SockEngine {
    fn fabric_event(&mut self, _now: Instant, _ev: FabricEvent<'_>) {}
    fn recycle(&mut self, buf: Vec<u8>) {
        Lnd::recycle(self, buf);
    }
}

impl SimNode for SockEngine {
    type Config = SockConfig;
    type Event = LndEvent;

    fn start(cfg: &SockConfig, now: Instant) -> SockEngine {
        SockEngine::new(cfg.clone(), now)
    }
    fn config_nid(cfg: &SockConfig) -> Nid {
        cfg.nid
    }
    fn config_incarnation(cfg: &SockConfig) -> u64 {
        cfg.incarnation
    }
    fn reincarnate(cfg: &mut SockConfig, incarnation: u64) {
        cfg.incarnation = incarnation;
    }
    fn poll_action(&mut self) -> Option<FabricAction> {
        None
    }
    fn book(ev: LndEvent) -> Booking<LndEvent> {
        <Endpoint as SimNode>::book(ev)
    }
    fn recv_done(&mut self, now: Instant, rx: RxToken) {
        Lnd::recv_done(self, now, rx);
    }
    crate::forward_lifecycle!(Lnd, LndEvent);
    /// The engine keeps no count of what it owned when dropped (its connections are the
    /// stream network's, which the host's crash or exit takes care of): always zero.
    fn leak_counter(&self) -> Arc<AtomicU64> {
        Arc::new(AtomicU64::new(0))
    }
    /// The engine's table refuses nothing it is asked (a refused input is ignored, not
    /// counted): zero.
    fn invalid_transitions(&self) -> u64 {
        0
    }

    fn stream_addr(cfg: &SockConfig) -> Option<Ipv4Addr> {
        Some(Ipv4Addr::from(cfg.nid.addr()))
    }
    fn poll_stream_action(&mut self) -> Option<StreamAction> {
        SockEngine::poll_action(self)
    }
    fn stream_event(&mut self, now: Instant, ev: StreamEvent<'_>) {
        self.handle_stream(now, ev);
    }
}

impl World<SockEngine> {
    /// Node `from` sends an LNet message with its payload inline to `to` now (`Lnd::send`).
    /// Returns the cookie its outcome is recorded under; a refusal is the outcome at once.
    pub fn send(&mut self, from: NodeId, to: Nid, hdr: LnetHdr, payload: Vec<u8>) -> u64 {
        self.start_send(from, to, |e, now, cookie| {
            Lnd::send(e, now, to, hdr, payload, cookie)
        })
    }

    /// Node `from` sends a message whose payload is LNet's memory (`Lnd::send_bulk`): a PUT
    /// streamed from it, or a GET whose REPLY lands in it. Recorded as [`World::send`] records.
    pub fn send_bulk(&mut self, from: NodeId, to: Nid, hdr: LnetHdr, bulk: BulkSend) -> u64 {
        self.start_send(from, to, |e, now, cookie| {
            Lnd::send_bulk(e, now, to, hdr, bulk, cookie)
        })
    }
}

#[cfg(test)]
#[path = "sock_tests.rs"]
mod tests;
