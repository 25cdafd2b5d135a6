//! The peer table's life, part of the node's state kept by concern: a peer NI's entry is made
//! on its first message (within its NI's share of the table, the LND's peer limit), marked
//! active on every use, and forgotten once it has been idle for `peer_timeout` and holds
//! nothing (lnet_peer_ni aging: ulnet's rule, as o2iblnd forgets a peer with no connection and
//! nothing queued). Its aging timer is on the node's timer table (`NodeTimer::PeerAge`).

use super::*;

impl LnetNode {
    /// Every peer NI we sent to or heard from, by NID (`lnetctl peer show`).
    pub fn peers(&self) -> Vec<PeerInfo> {
        self.peers.values().map(PeerNi::info).collect()
    }

    /// One peer NI.
    pub fn peer(&self, nid: Nid) -> Option<PeerInfo> {
        self.peers.get(&nid).map(PeerNi::info)
    }

    /// Peer NIs in the table now.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// The peer NI's entry, made if it is new; `None` when it is new and its NI's share of the
    /// table is full (counted). Every use marks it active.
    pub(super) fn peer_entry(&mut self, nid: Nid, ni: usize) -> Option<&mut PeerNi> {
        let now = self.now;
        if !self.peers.contains_key(&nid) {
            let n = &mut self.nis[ni];
            if n.peers >= n.peer_limit {
                self.stats.peer_table_full += 1;
                return None;
            }
            n.peers += 1;
            let mut p = PeerNi::new(nid, NiIndex(ni), n.peer_credits, n.rtr_credits, now);
            // A peer forgotten while its connection stayed up learns its state from the LND.
            if n.lnd.peer_up(nid) {
                p.state = PeerState::Up;
            }
            self.timers
                .arm(now + n.peer_timeout, NodeTimer::PeerAge(nid));
            self.peers.insert(nid, p);
        }
        let p = self.peers.get_mut(&nid)?;
        p.last_active = now;
        Some(p)
    }

    /// A peer NI's aging timer fired: forget it if it has been quiet for peer_timeout and holds
    /// nothing, else look again when it could next be.
    pub(super) fn age_peer(&mut self, nid: Nid) {
        let Some(p) = self.peers.get(&nid) else {
            return;
        };
        let ni = p.ni.0;
        let timeout = self.nis[ni].peer_timeout;
        let due = p.last_active + timeout;
        if self.now >= due && p.is_idle() {
            self.peers.remove(&nid);
            self.nis[ni].peers = self.nis[ni].peers.saturating_sub(1);
            self.stats.peers_aged += 1;
            trace!(peer = %nid, "peer aged out");
            return;
        }
        let next = if self.now >= due {
            self.now + timeout
        } else {
            due
        };
        self.timers.arm(next, NodeTimer::PeerAge(nid));
    }
}
