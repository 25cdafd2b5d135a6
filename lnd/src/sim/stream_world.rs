//! The world's stream network: nodes with a stream address ([`SimNode::stream_addr`]) are its
//! hosts; their stream actions are applied as their fabric actions are, what it reports goes to
//! the node of each host, and the world's faults (crash, reboot, shutdown, partitions) reach it,
//! with faults of its own (partial reads and writes, stalls, resets).

use super::*;

impl<N: SimNode> World<N> {
    // ------------------------------------------------------------------ stream queries

    /// The stream network (its counters, the connections a host holds).
    pub fn streams(&self) -> &StreamNet {
        &self.streams
    }

    /// Node `n`'s host on the stream network, if it has a stream address.
    pub fn stream_host(&self, n: NodeId) -> Option<HostId> {
        self.nodes[n.idx()].host
    }

    /// Stream connections (ends, in any state) node `n`'s host holds now.
    pub fn stream_ends_of(&self, n: NodeId) -> usize {
        self.stream_host(n).map_or(0, |h| self.streams.ends_of(h))
    }

    // ------------------------------------------------------------------ stream faults

    /// With probability `p` each read takes only part of what has arrived, and each piece of a
    /// send leaves cut short (a send arrives as several segments): partial reads and writes.
    pub fn stream_partial_io(&mut self, p: f64) {
        self.streams.set_partial_io(p);
        self.streams.set_partial_writes(p);
    }

    /// Bytes from node `from` to node `to` are held on every stream between them (the other way
    /// flows) until [`World::unstall_streams`]: a peer whose stack stops ACKing. The sender's
    /// sends stop completing; its TCP_USER_TIMEOUT, if set, or its LND's own deadline ends it.
    pub fn stall_streams(&mut self, from: NodeId, to: NodeId) {
        let (at, f, t) = (self.now, self.nid_of(from), self.nid_of(to));
        self.between_stream_hosts(from, to, |net, a, b| {
            debug!(%at, from = %f, to = %t, "stall");
            net.stall(a, b);
        });
    }

    /// Node `n` stops reading its streams (`true`; a hung process: its stack still ACKs, so
    /// only its peers' own deadlines notice the windows filling), or reads again (`false`).
    pub fn stop_reading(&mut self, n: NodeId, stopped: bool) {
        if let Some(h) = self.stream_host(n) {
            debug!(at = %self.now, node = %self.nid_of(n), stopped, "stop reading");
            self.streams.set_now(self.now);
            self.streams.set_deaf(h, stopped);
            self.deliver_streams();
        }
    }

    /// Ends a stall made by [`World::stall_streams`].
    pub fn unstall_streams(&mut self, from: NodeId, to: NodeId) {
        self.between_stream_hosts(from, to, StreamNet::unstall);
    }

    /// Every stream between nodes `a` and `b` (dialled either way) is reset now: both sides hear
    /// RST (a middlebox, a stack that lost the connection's state).
    pub fn reset_streams(&mut self, a: NodeId, b: NodeId) {
        let (at, na, nb) = (self.now, self.nid_of(a), self.nid_of(b));
        self.between_stream_hosts(a, b, |net, x, y| {
            debug!(%at, a = %na, b = %nb, "reset streams");
            net.reset_between(x, y);
        });
    }

    // ------------------------------------------------------------------ internals

    /// A fault between the stream hosts of nodes `a` and `b` (nothing when either is none):
    /// `change` made to the stream network at the world's now, and what it set off delivered.
    fn between_stream_hosts(
        &mut self,
        a: NodeId,
        b: NodeId,
        change: impl FnOnce(&mut StreamNet, HostId, HostId),
    ) {
        if let (Some(x), Some(y)) = (self.stream_host(a), self.stream_host(b)) {
            self.streams.set_now(self.now);
            change(&mut self.streams, x, y);
            self.deliver_streams();
        }
    }

    /// Cuts the stream hosts of `a` from those of `b` as partition `bit` cuts the fabric.
    pub(super) fn cut_streams(&mut self, bit: u8, a: &[NodeId], b: &[NodeId]) {
        let hosts = |ns: &[NodeId]| -> Vec<HostId> {
            ns.iter().filter_map(|n| self.stream_host(*n)).collect()
        };
        let (ha, hb) = (hosts(a), hosts(b));
        let mut pairs = Vec::new();
        for &x in &ha {
            for &y in &hb {
                if x != y {
                    self.streams.partition(x, y);
                    pairs.push((x, y));
                }
            }
        }
        if !pairs.is_empty() {
            self.stream_cuts.insert(bit, pairs);
        }
    }

    /// Heals what partition `bit` cut on the stream network.
    pub(super) fn heal_streams(&mut self, bit: u8) {
        if let Some(pairs) = self.stream_cuts.remove(&bit) {
            self.streams.set_now(self.now);
            for (x, y) in pairs {
                self.streams.heal(x, y);
            }
            self.deliver_streams();
        }
    }

    /// Heals every stream partition.
    pub(super) fn heal_all_streams(&mut self) {
        if !self.stream_cuts.is_empty() {
            self.stream_cuts.clear();
            self.streams.set_now(self.now);
            self.streams.heal_all();
            self.deliver_streams();
        }
    }

    /// One stream action of node `n`. A node without a stream address has no streams: the
    /// action is counted as unknown and dropped.
    pub(super) fn apply_stream(&mut self, n: NodeId, a: StreamAction) {
        let Some(h) = self.nodes[n.idx()].host else {
            self.stats.unknown_actions += 1;
            return;
        };
        trace!(at = %self.now, node = %self.nodes[n.idx()].nid, ?a, "stream action");
        self.streams.set_now(self.now);
        self.streams.apply(h, a);
    }

    /// Hands every ready stream report to its host's node (which acts on it at once), until
    /// none is left. A node acting on a report may make more; a call made while reports are
    /// being handed out returns at once, the round already running takes them.
    pub(super) fn deliver_streams(&mut self) {
        if self.delivering {
            return;
        }
        self.delivering = true;
        while let Some(r) = self.streams.pop_report() {
            let n = self.host_nodes[r.host().0 as usize];
            let now = self.now;
            let Some(ep) = self.nodes[n.idx()].ep.as_mut() else {
                self.stats.stream_reports_dropped += 1;
                continue;
            };
            ep.stream_event(now, r.event());
            self.drain_node(n, false);
        }
        self.delivering = false;
    }
}
