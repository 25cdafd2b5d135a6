//! An NI loop's side of the handovers between NI threads: its inbox, and its relay to every
//! loop's channel (`crate::relay`).

use std::sync::Arc;

use crate::alive::NetAlive;
use crate::relay::{ChannelLink, Dest, Handed, Links, Relay};
use crate::runtime::NiRuntime;
use crate::Handover;
use lnd::driver::LndDriver;
use lnd::wire::Nid;

use super::state::Members;

/// One NI loop's side of the handovers: its inbox, and its relay ([`crate::relay`]) to every
/// loop's link.
pub(super) struct Handovers {
    pub(super) rx: crossbeam_channel::Receiver<Handover>,
    pub(super) links: MemberLinks,
    pub(super) relay: Relay,
}

impl Handovers {
    /// The loops as they are now (an NI added or removed).
    pub(super) fn adopt(&mut self, links: Arc<Members>) {
        self.links = MemberLinks::of(links);
    }

    /// Hands what the other loops handed over to this loop's node.
    pub(super) fn take_in(&mut self, rt: &mut NiRuntime<Box<dyn LndDriver + Send>>) {
        if self.rx.is_empty() {
            return;
        }
        let now = rt.now();
        while let Ok(h) = self.rx.try_recv() {
            rt.node_mut().handle_handover(now, h);
        }
    }

    /// Takes in what the other loops handed over, then relays out what the node produced
    /// (and what waited): never blocks, wakes each loop that got something, fails a forward
    /// for a loop that is gone back at its origin (see `crate::relay`).
    pub(super) fn relay(&mut self, rt: &mut NiRuntime<Box<dyn LndDriver + Send>>) {
        self.take_in(rt);
        rt.relay(&mut self.relay, &mut self.links);
    }
}

/// The daemon's loops as the relay reaches them: the published [`Members`] (their channels),
/// with their NIDs taken once per change rather than once per relay.
#[derive(Default)]
pub(super) struct MemberLinks {
    pub(super) members: Arc<Members>,
    pub(super) nids: Vec<Nid>,
    pub(super) leaving: Vec<Nid>,
}

impl MemberLinks {
    pub(super) fn of(members: Arc<Members>) -> MemberLinks {
        MemberLinks {
            nids: members.nids(),
            leaving: members.leaving.iter().map(|m| m.nid).collect(),
            members,
        }
    }

    pub(super) fn link(&self, to: Dest) -> Option<&ChannelLink> {
        match to {
            Dest::Sibling(i) => self.members.list.get(i),
            Dest::Leaving(j) => self.members.leaving.get(j),
        }
        .map(|m| &m.hand)
    }
}

impl Links for MemberLinks {
    fn nids(&self) -> &[Nid] {
        &self.nids
    }

    fn leaving(&self) -> &[Nid] {
        &self.leaving
    }

    fn board(&self) -> &NetAlive {
        &self.members.board
    }

    fn try_hand(&mut self, to: Dest, h: Handover) -> Handed {
        match self.link(to) {
            Some(l) => l.try_hand(h),
            None => Handed::Gone(h),
        }
    }

    fn wake(&mut self, to: Dest) {
        if let Some(l) = self.link(to) {
            l.wake();
        }
    }
}
