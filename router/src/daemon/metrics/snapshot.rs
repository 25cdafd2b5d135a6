//! What each NI loop publishes for the metrics endpoint ([`NiSnapshot`]): a copy of its
//! counters, taken by the loop itself at most once a second ([`LoopMetrics::maybe_publish`]) and
//! swapped into a slot the scrape only reads. A scrape therefore never waits on an NI loop: a
//! wedged loop stops publishing, and its snapshot's age grows (`ulnet_ni_snapshot_age_seconds`).

// Built with the daemon whether or not the endpoint is (the NI loops hold a slot either way;
// without the `metrics` feature nothing reads it).
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::control::{route_show, routing_show, stats_show, RouteEntry, RoutingShow, StatsShow};
use crate::runtime::NiRuntime;
use crate::{GatewayInfo, LnetNode, NiInfo, PeerInfo};
use lnd::driver::LndDriver;

/// How often an NI loop copies its counters at most: Prometheus scrapes every 15 s or so;
/// once a second keeps the copy's cost off the data path and a test's wait short.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// One NI loop's counters as it last published them.
#[derive(Debug)]
pub(crate) struct NiSnapshot {
    pub(crate) taken: Instant,
    /// The fabric under the NI (`tcp`, `verbs`).
    pub(crate) fabric: &'static str,
    /// `stats show` of this loop's node, every counter a total since the daemon started
    /// (what `lnetctl stats reset` cleared is carried: Prometheus wants counters that only
    /// grow); `msgs_alloc` and `msgs_max` are the node's as they are (gauges).
    pub(crate) stats: StatsShow,
    /// `routing show` of this loop's node (its router buffer pools, its forwarding books).
    pub(crate) routing: RoutingShow,
    /// `net show -v` of its NIs (one: the daemon runs one NI per runtime).
    pub(crate) nis: Vec<NiInfo>,
    /// The fabric's counters (`net show -v`'s `fabric:`).
    pub(crate) fabric_counters: Vec<(&'static str, u64)>,
    /// `route show -v` as this loop sees it (a route's state only where the loop watches its
    /// gateway).
    pub(crate) routes: Vec<RouteEntry>,
    pub(crate) gateways: Vec<GatewayInfo>,
    /// The LND's connections, counted by state.
    pub(crate) conns: Vec<(String, u64)>,
    /// The busiest peer NIs by messages sent and received, at most `metrics: top_peers`.
    pub(crate) top_peers: Vec<PeerInfo>,
    /// Peer NIs and local NIs in LNet health recovery (`debug recovery --peer` / `--local`).
    pub(crate) peers_in_recovery: u64,
    pub(crate) nis_in_recovery: u64,
}

/// Where an NI loop publishes: the scrape clones the `Arc` under the lock and lets go (the lock
/// is held for a pointer swap on either side, never while anything is built).
#[derive(Default, Debug)]
pub(crate) struct SnapshotSlot(Mutex<Option<Arc<NiSnapshot>>>);

impl SnapshotSlot {
    pub(crate) fn get(&self) -> Option<Arc<NiSnapshot>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn put(&self, s: NiSnapshot) {
        let s = Some(Arc::new(s));
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
    }
}

/// An NI loop's side: its slot, when it next publishes, and what `stats reset` cleared.
pub(crate) struct LoopMetrics {
    pub(crate) slot: Arc<SnapshotSlot>,
    /// `None`: the daemon serves no metrics; the loop copies nothing.
    top_peers: Option<usize>,
    next: Instant,
    /// The sum of `stats show` at every `stats reset` so far.
    carried: Option<StatsShow>,
}

impl LoopMetrics {
    pub(crate) fn new(top_peers: Option<u32>) -> LoopMetrics {
        LoopMetrics {
            slot: Arc::default(),
            top_peers: top_peers.map(|n| n as usize),
            next: Instant::now(),
            carried: None,
        }
    }

    /// `lnetctl stats reset` is about to clear `node`'s counters: what they counted is kept,
    /// so that the exported totals never go back.
    pub(crate) fn before_stats_reset(&mut self, node: &LnetNode) {
        if self.top_peers.is_none() {
            return;
        }
        let now = counters_only(stats_show(node));
        self.carried = Some(match self.carried.take() {
            Some(c) => sum_stats(c, now),
            None => now,
        });
    }

    /// Publishes a copy of the loop's counters if the last is [`PUBLISH_EVERY`] old.
    pub(crate) fn maybe_publish(
        &mut self,
        rt: &NiRuntime<Box<dyn LndDriver + Send>>,
        fabric: &'static str,
    ) {
        let Some(top) = self.top_peers else { return };
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + PUBLISH_EVERY;
        self.slot
            .put(take(rt, fabric, top, self.carried.as_ref(), now));
    }
}

/// `s` with its gauges zeroed (what a reset carries is counters only).
fn counters_only(mut s: StatsShow) -> StatsShow {
    s.statistics.msgs_alloc = 0;
    s.statistics.msgs_max = 0;
    if let Some(t) = s.peer_table.as_mut() {
        t.0.retain(|(k, _)| k != "peers");
    }
    s
}

fn take(
    rt: &NiRuntime<Box<dyn LndDriver + Send>>,
    fabric: &'static str,
    top: usize,
    carried: Option<&StatsShow>,
    now: Instant,
) -> NiSnapshot {
    let node = rt.node();
    let current = stats_show(node);
    let stats = match carried {
        Some(c) => {
            let mut t = sum_stats(c.clone(), current.clone());
            t.statistics.msgs_alloc = current.statistics.msgs_alloc;
            t.statistics.msgs_max = current.statistics.msgs_max;
            t
        }
        None => current,
    };
    let mut conns: Vec<(String, u64)> = Vec::new();
    let mut count = |state: String| match conns.iter_mut().find(|(s, _)| *s == state) {
        Some(e) => e.1 += 1,
        None => conns.push((state, 1)),
    };
    for i in 0..node.nids().len() {
        let ni = crate::NiIndex(i);
        if let Some(ep) = node.endpoint(ni) {
            ep.conns().for_each(|c| count(format!("{:?}", c.state)));
        } else if let Some(engine) = crate::sock::sock_engine(node, ni) {
            engine
                .conn_views()
                .iter()
                .for_each(|c| count(c.state.to_string()));
        }
    }
    let mut top_peers = if top > 0 { node.peers() } else { Vec::new() };
    // The busiest first; ties by NID, so that the set is stable between scrapes.
    top_peers.sort_by(|a, b| {
        (b.send_count + b.recv_count)
            .cmp(&(a.send_count + a.recv_count))
            .then_with(|| a.nid.cmp(&b.nid))
    });
    top_peers.truncate(top);
    NiSnapshot {
        taken: now,
        fabric,
        stats,
        routing: routing_show(node),
        nis: node.nets(),
        fabric_counters: rt.driver().counters(),
        routes: route_show(node, None, None, true)
            .map(|r| r.route)
            .unwrap_or_default(),
        gateways: node.gateways(),
        conns,
        top_peers,
        peers_in_recovery: node.recovery_queue(false).len() as u64,
        nis_in_recovery: node.recovery_queue(true).len() as u64,
    }
}

/// Two `stats show`s added field by field, as the daemon's merge of its NI loops' answers does
/// ([`crate::stats::sum_counters`]), so that a counter added to either struct is summed too.
pub(crate) fn sum_stats(a: StatsShow, b: StatsShow) -> StatsShow {
    crate::stats::sum_counters(a, b)
}
