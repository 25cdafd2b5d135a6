//! LNet over the socklnd LND: the layer above the LNet core that builds a `tcp` NI's engine
//! ([`lnd::sock::SockEngine`], ksocklnd's wire) from the NI's settings, as [`crate::o2ib`] builds
//! an o2ib NI's. A stream driver (`lnd::driver::socket::SockFabric`, or the simulator's stream
//! network) reaches the engine through the LND interface (`lnd::driver::LndDriver`). The core
//! ([`crate::LnetNode`]) sees it only as an [`lnd::iface::Lnd`].

use lnd::iface::sock::SockConfig;
use lnd::iface::Lnd;
use lnd::sock::SockEngine;
use lnd::time::Instant;

use crate::NiConfig;

/// The socklnd engine for one NI: `sock`'s tunables and acceptor settings, with the NI's own
/// NID, incarnation and LNet credits (kernel LNet hands ksocklnd the NI's credits the same way:
/// `socklnd.c:ksocknal_startup` reads them from the NI's tunables).
pub fn sock_lnd(c: &NiConfig, sock: &SockConfig, now: Instant) -> Box<dyn Lnd> {
    let (credits, peer_credits) = c.effective_credits();
    let cfg = SockConfig {
        nid: c.nid,
        incarnation: c.incarnation,
        credits,
        peer_credits,
        peer_buffer_credits: c.peer_buffer_credits,
        peer_timeout: c.peer_timeout,
        ..sock.clone()
    };
    Box::new(SockEngine::new(cfg, now))
}

/// The engine of NI `ni` of `node` if it runs socklnd (its connections for `conn show`, its
/// counters).
pub fn sock_engine(node: &crate::LnetNode, ni: crate::NiIndex) -> Option<&SockEngine> {
    node.lnd(ni)?.as_any().downcast_ref::<SockEngine>()
}

/// [`sock_engine`], to change it (capture on and off, draining its records).
pub fn sock_engine_mut(node: &mut crate::LnetNode, ni: crate::NiIndex) -> Option<&mut SockEngine> {
    node.lnd_mut(ni)?.as_any_mut().downcast_mut::<SockEngine>()
}
