//! Faults and lifecycle: stuck connects, CM loss and delay, partitions, crashes, reboots,
//! restarts and shutdowns.

use super::*;

impl<N: SimNode> World<N> {
    // ------------------------------------------------------------------ faults and lifecycle

    /// Each outgoing connect of node `n` is, with probability `p`, stuck: it never produces any
    /// event (the LU-7646 mlx5 case). Only the engine's connect deadline can end it.
    pub fn stuck_connects(&mut self, n: NodeId, p: f64) {
        self.nodes[n.idx()].stuck_prob = p;
    }

    /// Node `n`'s next connect to `to` is stuck (one-shot; stacks).
    pub fn stuck_next_connect(&mut self, n: NodeId, to: Nid) {
        self.nodes[n.idx()].stuck_next.push(to);
    }

    /// Each connection-manager message (request, reply, reject, disconnect request) is lost with
    /// probability `p`: a lost connect exchange fails with `Unreachable` after
    /// `unreachable_after`; a lost disconnect request is never heard by the peer.
    pub fn cm_loss(&mut self, p: f64) {
        self.cm_loss = p;
    }

    /// Each connection-manager message takes an extra random delay in `[0, max]`.
    pub fn cm_delay(&mut self, max: Duration) {
        self.cm_delay = max;
    }

    /// Cuts `a` from `b`: nothing passes between a node of `a` and a node of `b` (CM messages and
    /// data alike, and on the stream network: dials fail, bytes are held) until healed. Up to 64
    /// partitions at once.
    ///
    /// # Panics
    /// If 64 partitions are already in force.
    pub fn partition(&mut self, a: &[NodeId], b: &[NodeId]) -> PartitionId {
        let k = (!self.partitions_used).trailing_zeros();
        assert!(k < 64, "at most 64 partitions at once");
        self.partitions_used |= 1 << k;
        for n in a {
            self.nodes[n.idx()].part_a |= 1 << k;
        }
        for n in b {
            self.nodes[n.idx()].part_b |= 1 << k;
        }
        debug!(at = %self.now, id = k, a = a.len(), b = b.len(), "partition");
        self.cut_streams(k as u8, a, b);
        PartitionId(k as u8)
    }

    /// Ends one partition.
    pub fn heal_partition(&mut self, id: PartitionId) {
        let bit = !(1u64 << id.0);
        self.partitions_used &= bit;
        for node in &mut self.nodes {
            node.part_a &= bit;
            node.part_b &= bit;
        }
        debug!(at = %self.now, id = id.0, "partition healed");
        self.heal_streams(id.0);
    }

    /// Ends every partition.
    pub fn heal(&mut self) {
        self.partitions_used = 0;
        for node in &mut self.nodes {
            node.part_a = 0;
            node.part_b = 0;
        }
        debug!(at = %self.now, "all partitions healed");
        self.heal_all_streams();
    }

    /// Node `n` vanishes without closing anything: its endpoint is dropped (its `Drop` logs and
    /// counts the connections it still owned, see [`World::leaked_conns`]) and all its fabric ends
    /// vanish; its unfinished sends are recorded as [`SendOutcome::LostInCrash`]. Its stream host
    /// goes down too (its connections vanish without FIN or RST). Peers find out through their
    /// own sends, keepalives and connects. A no-op if the host is already down.
    pub fn crash(&mut self, n: NodeId) {
        if self.nodes[n.idx()].state == NodeState::Crashed {
            return;
        }
        debug!(at = %self.now, node = %self.nid_of(n), "crash");
        self.stats.crashes += 1;
        self.take_down(n, NodeState::Crashed);
    }

    /// Crashes node `n` now and restarts it after `down_for` with the same configuration and
    /// `new_incarnation`.
    pub fn reboot(&mut self, n: NodeId, down_for: Duration, new_incarnation: u64) {
        self.crash(n);
        let epoch = self.nodes[n.idx()].epoch;
        self.push(
            self.now + down_for,
            Ev::Restart {
                node: n,
                epoch,
                incarnation: new_incarnation,
            },
        );
    }

    /// Starts a fresh endpoint on a crashed or stopped node now, with `new_incarnation`. Returns
    /// false (and does nothing) if the node's endpoint runs.
    pub fn restart(&mut self, n: NodeId, new_incarnation: u64) -> bool {
        let node = &mut self.nodes[n.idx()];
        if !matches!(node.state, NodeState::Crashed | NodeState::Stopped) {
            return false;
        }
        let was_crashed = node.state == NodeState::Crashed;
        N::reincarnate(&mut node.cfg, new_incarnation);
        if let (true, Some(h)) = (was_crashed, node.host) {
            // The host is back, with no connection and no listener: a peer's bytes for an old
            // connection are answered with RST.
            self.streams.set_now(self.now);
            self.streams.restart(h);
        }
        self.stats.restarts += 1;
        self.start_node(n);
        true
    }

    /// Graceful stop: `Endpoint::shutdown` now; once the endpoint reports `is_shut_down` it is
    /// removed and the node is [`NodeState::Stopped`]. A stream host's connections are the
    /// node's own to close; whatever it left open when it is removed the host's kernel closes
    /// ([`StreamNet::close_host`]).
    pub fn shutdown(&mut self, n: NodeId) {
        let now = self.now;
        let node = &mut self.nodes[n.idx()];
        if node.state != NodeState::Up {
            return;
        }
        let Some(ep) = node.ep.as_mut() else {
            return;
        };
        debug!(at = %now, node = %node.nid, "shutdown");
        self.stats.shutdowns += 1;
        node.state = NodeState::Stopping;
        ep.shutdown(now);
        self.drain(n, false);
    }
}
