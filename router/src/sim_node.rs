//! An [`LnetNode`] as a node of `lnd`'s deterministic simulator (feature `sim`): the same LNet
//! layer the daemon runs, with one NI on the simulated fabric, so LNet (pings, PUTs, credits,
//! peer aging) can be run through the simulator's faults in virtual time.
//!
//! A simulated node has exactly one NI, whose NID is the node's NID in the world. The world
//! books the node's peer up/down events ([`World::peer_events`](lnd::sim::World::peer_events));
//! every other [`LnetEvent`] (PUTs, PUT and ping outcomes) is kept, with its time, in
//! [`World::node_events`](lnd::sim::World::node_events). LNet returns its receives to the LND
//! itself, so the world never does.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use lnd::engine::RxToken;
use lnd::fabric::{FabricAction, FabricEvent, FabricSink};
use lnd::sim::{Booking, SimNode};
use lnd::time::Instant;
use lnd::wire::Nid;

use crate::{LnetEvent, LnetNode, NiIndex, NodeConfig};

/// The one NI of a simulated node.
const NI: NiIndex = NiIndex(0);

/// The simulator's fabric is the NI's fabric.
impl FabricSink for LnetNode {
    fn fabric_event(&mut self, now: Instant, ev: FabricEvent<'_>) {
        self.handle_fabric(now, NI, ev);
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        LnetNode::recycle(self, buf);
    }
}

/// Panics (at `start`) on a configuration without exactly one NI.
impl SimNode for LnetNode {
    type Config = NodeConfig;
    type Event = LnetEvent;

    fn start(cfg: &NodeConfig, now: Instant) -> LnetNode {
        assert_eq!(
            cfg.nis.len(),
            1,
            "a simulated LNet node has exactly one NI (the world routes by one NID per node)"
        );
        LnetNode::new(cfg.clone(), now)
    }

    fn config_nid(cfg: &NodeConfig) -> Nid {
        cfg.nis
            .first()
            .expect("a simulated LNet node has one NI")
            .nid
    }

    fn config_incarnation(cfg: &NodeConfig) -> u64 {
        cfg.nis.first().map_or(0, |ni| ni.incarnation)
    }

    fn reincarnate(cfg: &mut NodeConfig, incarnation: u64) {
        for ni in &mut cfg.nis {
            ni.incarnation = incarnation;
        }
    }

    fn poll_action(&mut self) -> Option<FabricAction> {
        let (ni, action) = LnetNode::poll_action(self)?;
        debug_assert_eq!(ni, NI, "a simulated LNet node has one NI");
        Some(action)
    }

    fn book(ev: LnetEvent) -> Booking<LnetEvent> {
        match ev {
            LnetEvent::PeerUp { nid, .. } => Booking::PeerUp { nid },
            LnetEvent::PeerDown { nid, reason, .. } => Booking::PeerDown { nid, reason },
            ev => Booking::Other(ev),
        }
    }

    /// Never called: LNet hands every receive back to its LND itself, so nothing is booked with
    /// a token.
    fn recv_done(&mut self, _now: Instant, _rx: RxToken) {}

    lnd::forward_lifecycle!(LnetNode, LnetEvent);

    /// An o2ib NI's engine counts what it leaked; a socklnd NI's holds nothing the fabric
    /// must take back (the stream network closes what a removed host left open).
    fn leak_counter(&self) -> Arc<AtomicU64> {
        self.endpoint(NI)
            .map_or_else(|| Arc::new(AtomicU64::new(0)), |ep| ep.leak_counter())
    }

    /// A `tcp` NI (socklnd) is a host of the world's stream network at its NID's address.
    fn stream_addr(cfg: &NodeConfig) -> Option<std::net::Ipv4Addr> {
        let ni = cfg.nis.first()?;
        matches!(ni.lnd, crate::LndSettings::Sock(_))
            .then(|| std::net::Ipv4Addr::from(ni.nid.addr()))
    }

    fn poll_stream_action(&mut self) -> Option<lnd::stream::StreamAction> {
        self.lnd_mut(NI)?
            .as_any_mut()
            .downcast_mut::<lnd::sock::SockEngine>()?
            .poll_action()
    }

    fn stream_event(&mut self, now: Instant, ev: lnd::stream::StreamEvent<'_>) {
        if let Some(engine) = self
            .lnd_mut(NI)
            .and_then(|l| l.as_any_mut().downcast_mut::<lnd::sock::SockEngine>())
        {
            engine.handle_stream(now, ev);
        }
        self.process(now);
    }

    fn invalid_transitions(&self) -> u64 {
        (0..)
            .map_while(|i| self.endpoint(NiIndex(i)))
            .map(|ep| ep.stats().invalid_transitions)
            .sum()
    }
}
