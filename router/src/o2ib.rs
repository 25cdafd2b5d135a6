//! LNet over the o2ib LND: the layer above the LNet core that knows which LND each NI runs and
//! what drives it. [`LnetNode::new`] starts a node whose NIs all run the o2ib engine
//! ([`lnd::engine::Endpoint`]); a fabric driver (tcp, verbs, the simulator) reaches an NI's
//! engine through [`LnetNode::fabric_sink`] and drains its work with [`LnetNode::poll_action`].
//! The core ([`LnetNode`]) sees each engine only as an [`lnd::iface::Lnd`].

use lnd::engine::{Captured, Endpoint, EndpointConfig};
use lnd::fabric::{FabricAction, FabricEvent, FabricSink};
use lnd::iface::Lnd;
use lnd::time::Instant;

use crate::config::LndSettings;
use crate::{LnetNode, NiConfig, NiIndex, NodeConfig};

/// The o2ib engine for one NI, with the NI's tunables and policies.
pub fn o2ib_lnd(c: &NiConfig, now: Instant) -> Box<dyn Lnd> {
    let mut ecfg = EndpointConfig::new(c.nid, c.incarnation);
    ecfg.tunables = c.tunables.clone();
    ecfg.race_order = c.race_order;
    ecfg.checksum = c.checksum;
    ecfg.peer_limit = c.peer_limit;
    Box::new(Endpoint::new(ecfg, now))
}

impl LnetNode {
    /// Starts a node at `now` whose NIs each run the LND of their net (o2iblnd, or socklnd on a
    /// `tcp` net: [`NiConfig::lnd`]), with the NI's tunables.
    pub fn new(cfg: NodeConfig, now: Instant) -> LnetNode {
        let lnds = cfg
            .nis
            .iter()
            .map(|c| match &c.lnd {
                LndSettings::O2ib => o2ib_lnd(c, now),
                LndSettings::Sock(sock) => crate::sock::sock_lnd(c, sock, now),
            })
            .collect();
        LnetNode::with_lnds(cfg, lnds, now)
    }

    /// NI `ni`'s o2ib engine (read-only: stats, peers, connections); `None` if the NI runs
    /// another LND.
    pub fn endpoint(&self, ni: NiIndex) -> Option<&Endpoint> {
        self.lnd(ni)?.as_any().downcast_ref::<Endpoint>()
    }

    fn endpoint_mut(&mut self, ni: NiIndex) -> Option<&mut Endpoint> {
        self.lnd_mut(ni)?.as_any_mut().downcast_mut::<Endpoint>()
    }

    /// Feeds one fabric event to NI `ni`'s engine, then processes what it produced.
    pub fn handle_fabric(&mut self, now: Instant, ni: NiIndex, ev: FabricEvent<'_>) {
        if let Some(ep) = self.endpoint_mut(ni) {
            ep.fabric_event(now, ev);
        }
        self.process(now);
    }

    /// NI `ni` as its driver's [`FabricSink`]: what the driver reports goes to that NI's engine,
    /// and nothing else of the engine is reachable through it. Call [`LnetNode::process`] after
    /// the driver's poll.
    pub fn fabric_sink(&mut self, ni: NiIndex) -> Option<NiSink<'_>> {
        self.endpoint_mut(ni).map(|ep| NiSink { ep })
    }

    /// The next fabric action of any o2ib NI, with the NI it is for.
    pub fn poll_action(&mut self) -> Option<(NiIndex, FabricAction)> {
        (0..self.ni_count()).find_map(|i| {
            let a = self.endpoint_mut(NiIndex(i))?.poll_action()?;
            Some((NiIndex(i), a))
        })
    }

    /// Starts (`true`) or stops recording every kib message NI `ni` sends and receives
    /// (`lnetctl capture`); records not drained are dropped when it stops.
    pub fn set_capture(&mut self, ni: NiIndex, on: bool) {
        if let Some(ep) = self.endpoint_mut(ni) {
            ep.set_capture(on);
        } else if let Some(engine) = crate::sock::sock_engine_mut(self, ni) {
            engine.set_capture(on);
        }
    }

    /// The next message NI `ni` recorded, oldest first.
    pub fn poll_captured(&mut self, ni: NiIndex) -> Option<Captured> {
        self.endpoint_mut(ni)?.poll_captured()
    }
}

/// One o2ib NI of an [`LnetNode`] as its driver sees it: a [`FabricSink`] and nothing more.
pub struct NiSink<'a> {
    ep: &'a mut Endpoint,
}

impl FabricSink for NiSink<'_> {
    fn fabric_event(&mut self, now: Instant, ev: FabricEvent<'_>) {
        self.ep.fabric_event(now, ev);
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        self.ep.recycle(buf);
    }
}
