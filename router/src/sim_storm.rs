//! LU-7646's router reboot storm with the real routing code, in the simulator (feature `sim`).
//!
//! Clients on `o2ib` (or on a `tcp` net, ksocklnd's wire: [`RoutedStormConfig::tcp_clients`])
//! ping a server on `o2ib1` through a router, and the server pings them back,
//! every 250 ms each; the router reboots (a new incarnation after `down_for`) while a share of
//! every node's connects never complete (LU-7646's stuck active connect on an mlx5 HCA). The
//! router is what the daemon runs: one [`LnetNode`] per NI (each knowing its sibling's NID as
//! its own), forwarding to each other through [`Handover`]s, which the daemon's relay
//! ([`crate::relay`]) hands from one to the other, here at once, in virtual time. Everything runs in virtual time, deterministic for a seed.
//!
//! A client has recovered once a ping it sent to the server and a ping the server sent to it,
//! both started after the router came back, have answered. Two figures: from the router's
//! return, and from the client's first connect to it after that (a client first waits for its
//! gateway re-ping, up to `alive_router_check_interval`, 1 s here). The engine's shields
//! (connect deadline, stale-attempt abandon, the race limit) bound the second by one connect
//! deadline (a stuck connect) plus a gateway ping and a ping period.

use std::collections::HashMap;

use lnd::sim::{NodeId, SimConfig, World};
use lnd::time::{Duration, Instant};
use lnd::wire::Nid;

use crate::alive::NetAlive;
use crate::relay::{Dest, Handed, Links, Relay};
use crate::{
    GatewayHealthConfig, Handover, LnetEvent, LnetNode, NiConfig, NiIndex, NodeConfig, PingId,
    RouteConfig,
};

/// The router's NIDs and the server's.
pub const STORM_ROUTER_A: &str = "10.0.0.254@o2ib";
/// The router's client-side NID when the clients are on a `tcp` net (socklnd).
pub const STORM_ROUTER_A_TCP: &str = "10.0.0.254@tcp";
pub const STORM_ROUTER_B: &str = "10.1.0.254@o2ib1";
pub const STORM_SERVER: &str = "10.1.0.2@o2ib1";

/// Every ping's timeout, and how often each side pings.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
const PING_PERIOD: Duration = Duration::from_millis(250);
/// How often connections are counted (for zombies).
const SAMPLE_PERIOD: Duration = Duration::from_millis(250);

/// One storm.
#[derive(Clone, Debug)]
pub struct RoutedStormConfig {
    pub clients: usize,
    pub seed: u64,
    /// Probability that a node's connect never completes.
    pub stuck: f64,
    /// How long the router stays down.
    pub down_for: Duration,
    /// How long after the router is back the run may take to recover.
    pub horizon: Duration,
    /// The clients and the router's client-side NI are on a `tcp` net (ksocklnd's wire, on the
    /// world's stream network) instead of `o2ib`: the router joins Ethernet to InfiniBand.
    /// Stuck connects are then the o2ib side's only (router to server).
    pub tcp_clients: bool,
}

impl RoutedStormConfig {
    /// `clients` clients, 10% stuck connects, the router down 3 s, a 60 s horizon.
    pub fn new(clients: usize, seed: u64) -> RoutedStormConfig {
        RoutedStormConfig {
            clients,
            seed,
            stuck: 0.1,
            down_for: Duration::from_secs(3),
            horizon: Duration::from_secs(60),
            tcp_clients: false,
        }
    }
}

/// What a storm measured.
#[derive(Clone, Debug, Default)]
pub struct RoutedStormReport {
    pub clients: usize,
    /// From the router's return until every client had recovered (`None`: not within the
    /// horizon).
    pub recovery: Option<Duration>,
    pub unrecovered: usize,
    /// The engine's connect deadline (the bound is this plus 2 s).
    pub connect_timeout: Duration,
    /// Pings started, answered, failed (at the call or later), and left without an outcome
    /// after every deadline passed (must be 0).
    pub pings_started: u64,
    pub pings_ok: u64,
    pub pings_failed: u64,
    pub pings_left: u64,
    /// The failed pings by error.
    pub failed_by_reason: std::collections::BTreeMap<String, u64>,
    /// The most CONN_RACE rejects between one pair of nodes over the whole run, and the most
    /// connections one node held to one peer at a sample (handshakes, live and zombies).
    pub max_race_rejects_per_pair: u64,
    pub peak_conns_per_pair: usize,
    /// The most zombies (closed connections not yet destroyed) any node held for one peer.
    pub peak_zombies_per_peer: u32,
    /// The router's books (both NIs) reconcile at the end; what they hold then.
    pub router_books_reconcile: bool,
    pub router_forwarded: u64,
    pub router_in_flight: u64,
    /// Connects the simulator left stuck (never completing).
    pub stuck_connects: u64,
    /// Connection state changes refused by the engines (must be 0).
    pub invalid_transitions: u64,
    /// Simulator events processed, and the wall time the run took.
    pub events: u64,
    pub wall: std::time::Duration,
}

fn nid(s: &str) -> Nid {
    s.parse().expect("a valid NID")
}

/// Client `i`'s NID (any number of clients: 250 hosts per third octet, then the second octet).
pub fn storm_client_nid(i: usize) -> Nid {
    client_nid(i, "o2ib")
}

/// Client `i`'s NID on `net`.
fn client_nid(i: usize, net: &str) -> Nid {
    let (hi, lo) = (i / 250, i % 250 + 1);
    nid(&format!("10.{}.{}.{lo}@{net}", 100 + hi / 250, hi % 250))
}

/// One pinger (a client, or the server towards one client): its pings in flight and the first
/// success of one started after the router came back.
#[derive(Default)]
struct Pinger {
    outstanding: HashMap<PingId, Instant>,
    recovered_at: Option<Instant>,
}

struct Storm {
    w: World<LnetNode>,
    ra: NodeId,
    rb: NodeId,
    server: NodeId,
    clients: Vec<NodeId>,
    /// The router's two runtimes as the relay sees them (board order: A, B), their shared
    /// liveness board, and each one's relay.
    router_nids: [Nid; 2],
    board: NetAlive,
    relays: [Relay; 2],
    /// Index into every node's event log already read.
    cursors: HashMap<NodeId, usize>,
    /// Each client's pings to the server, and the server's to each client.
    up: Vec<Pinger>,
    down: Vec<Pinger>,
    /// The server's outstanding pings: which client each is for.
    server_pings: HashMap<PingId, usize>,
    back: Option<Instant>,
    report: RoutedStormReport,
}

impl Storm {
    fn new(cfg: &RoutedStormConfig) -> Storm {
        let mut sim = SimConfig::with_seed(cfg.seed);
        sim.keep_logs = true;
        let mut w: World<LnetNode> = World::hosting(sim);
        let health = GatewayHealthConfig {
            check_interval: Duration::from_secs(1),
            ping_timeout: Duration::from_secs(1),
            avoid_asym: true,
        };
        let router_a = if cfg.tcp_clients {
            STORM_ROUTER_A_TCP
        } else {
            STORM_ROUTER_A
        };
        let client_net = if cfg.tcp_clients { "tcp" } else { "o2ib" };
        let (a, b, s) = (nid(router_a), nid(STORM_ROUTER_B), nid(STORM_SERVER));
        // The router: one node per NI, as the daemon runs it.
        // One liveness board for the router's two runtimes, as the daemon shares one (a
        // restarted router keeps it: a slot older than the node's start counts from the start).
        let board = NetAlive::new(2);
        let router_ni = |me: Nid, inc: u64| {
            let mut c = NodeConfig::new(vec![NiConfig::new(me, inc)]);
            c.node_nids = vec![a, b];
            c.net_alive = Some(board.clone());
            c.routing.enabled = true;
            c.gateway_health = health;
            c
        };
        let ra = w.add_node(router_ni(a, 1));
        let rb = w.add_node(router_ni(b, 1));
        // An end node: one NI, one route to the other net through the router.
        let end_node = |me: Nid, inc: u64, gateway: Nid| {
            let mut c = NodeConfig::new(vec![NiConfig::new(me, inc)]);
            c.routes = vec![RouteConfig {
                net: if gateway == a { b.net() } else { a.net() },
                gateway,
                hops: Some(1),
                priority: 0,
            }];
            c.gateway_health = health;
            c
        };
        let server = w.add_node(end_node(s, 2, b));
        let clients: Vec<NodeId> = (0..cfg.clients)
            .map(|i| w.add_node(end_node(client_nid(i, client_net), 10 + i as u64, a)))
            .collect();
        let ids: Vec<NodeId> = w.node_ids().collect();
        for &n in &ids {
            w.stuck_connects(n, cfg.stuck);
        }
        if cfg.tcp_clients {
            // The stream network's own faults, from the seed: reads and writes cut short.
            w.stream_partial_io(0.3);
        }
        let connect_timeout = w
            .node(rb)
            .and_then(|n| n.endpoint(NiIndex(0)))
            .map_or(Duration::from_secs(5), |ep| {
                ep.config().tunables.connect_timeout()
            });
        Storm {
            w,
            ra,
            rb,
            server,
            up: (0..cfg.clients).map(|_| Pinger::default()).collect(),
            down: (0..cfg.clients).map(|_| Pinger::default()).collect(),
            clients,
            router_nids: [a, b],
            board,
            relays: [Relay::new(), Relay::new()],
            cursors: HashMap::new(),
            server_pings: HashMap::new(),
            back: None,
            report: RoutedStormReport {
                clients: cfg.clients,
                connect_timeout,
                ..RoutedStormReport::default()
            },
        }
    }

    /// Relays every handover between the router's two NI nodes with the daemon's relay
    /// ([`crate::relay`]): delivered at once to a runtime that runs, and a Forward for one
    /// that is down (rebooting) fails back at its origin, as the daemon's does.
    fn relay(&mut self) {
        let ids = [self.ra, self.rb];
        for (k, &from) in ids.iter().enumerate() {
            let relay = &mut self.relays[k];
            if self.w.with_node(from, |n, _| relay.take(n)).is_none() {
                continue;
            }
            let back = relay.hand_out(&mut RouterLinks {
                w: &mut self.w,
                ids,
                nids: &self.router_nids,
                board: &self.board,
            });
            if !back.is_empty() {
                self.w.with_node(from, |n, now| {
                    for h in back {
                        n.handle_handover(now, h);
                    }
                });
            }
        }
    }

    /// Runs the world until `t`, relaying after every event, pinging every `PING_PERIOD` and
    /// sampling every `SAMPLE_PERIOD`.
    fn run_until(&mut self, t: Instant, pinging: bool) {
        let mut next_ping = self.w.now();
        let mut next_sample = self.w.now();
        loop {
            let now = self.w.now();
            if pinging && now >= next_ping {
                self.ping_round();
                next_ping = now + PING_PERIOD;
            }
            if now >= next_sample {
                self.sample();
                next_sample = now + SAMPLE_PERIOD;
            }
            let next = if pinging { next_ping } else { t }.min(next_sample).min(t);
            match self.w.next_event_at() {
                Some(at) if at <= next => {
                    self.w.step();
                    self.relay();
                }
                _ => {
                    self.w.run_until(next);
                    self.relay();
                }
            }
            self.read_events();
            if self.w.now() >= t {
                return;
            }
        }
    }

    fn ping_round(&mut self) {
        let s = self.w.nid_of(self.server);
        for i in 0..self.clients.len() {
            let c = self.clients[i];
            let cn = self.w.nid_of(c);
            if let Some(r) = self.w.with_node(c, |n, now| n.ping(now, s, PING_TIMEOUT)) {
                self.report.pings_started += 1;
                match r {
                    Ok(id) => {
                        self.up[i].outstanding.insert(id, self.w.now());
                    }
                    Err(e) => self.failed(e.to_string()),
                }
            }
            if let Some(r) = self
                .w
                .with_node(self.server, |n, now| n.ping(now, cn, PING_TIMEOUT))
            {
                self.report.pings_started += 1;
                match r {
                    Ok(id) => {
                        self.down[i].outstanding.insert(id, self.w.now());
                        self.server_pings.insert(id, i);
                    }
                    Err(e) => self.failed(e.to_string()),
                }
            }
        }
    }

    fn failed(&mut self, why: String) {
        self.report.pings_failed += 1;
        *self.report.failed_by_reason.entry(why).or_default() += 1;
    }

    /// Books every ping outcome logged since the last call.
    fn read_events(&mut self) {
        let back = self.back;
        let mut nodes = vec![self.server];
        nodes.extend(self.clients.iter().copied());
        for n in nodes {
            let from = self.cursors.get(&n).copied().unwrap_or(0);
            let evs = self.w.node_events(n);
            if evs.len() <= from {
                continue;
            }
            let done: Vec<(Instant, PingId, Result<(), String>)> = evs[from..]
                .iter()
                .filter_map(|(at, ev)| match ev {
                    LnetEvent::PingDone { id, result, .. } => Some((
                        *at,
                        *id,
                        result.as_ref().map(|_| ()).map_err(|e| e.to_string()),
                    )),
                    _ => None,
                })
                .collect();
            self.cursors.insert(n, evs.len());
            for (at, id, ok) in done {
                let pinger = if n == self.server {
                    match self.server_pings.remove(&id) {
                        Some(i) => &mut self.down[i],
                        None => continue,
                    }
                } else {
                    match self.clients.iter().position(|&c| c == n) {
                        Some(i) => &mut self.up[i],
                        None => continue,
                    }
                };
                let Some(started) = pinger.outstanding.remove(&id) else {
                    continue;
                };
                match ok {
                    Ok(()) => {
                        self.report.pings_ok += 1;
                        if back.is_some_and(|b| started >= b) && pinger.recovered_at.is_none() {
                            pinger.recovered_at = Some(at);
                        }
                    }
                    Err(e) => self.failed(e),
                }
            }
        }
    }

    /// Connections per (node, peer).
    fn sample(&mut self) {
        let ids: Vec<NodeId> = self.w.node_ids().collect();
        for n in ids {
            let Some(ep) = self.w.node(n).and_then(|x| x.endpoint(NiIndex(0))) else {
                continue;
            };
            let mut per: HashMap<Nid, usize> = HashMap::new();
            for c in ep.conns() {
                *per.entry(c.peer).or_default() += 1;
            }
            let peak = per.into_values().max().unwrap_or(0);
            let zombies = ep.peers().map(|p| p.peak_zombies).max().unwrap_or(0);
            let r = &mut self.report;
            r.peak_conns_per_pair = r.peak_conns_per_pair.max(peak);
            r.peak_zombies_per_peer = r.peak_zombies_per_peer.max(zombies);
        }
    }

    fn recovered(&self, i: usize) -> Option<Instant> {
        Some(self.up[i].recovered_at?.max(self.down[i].recovered_at?))
    }
}

/// The router's runtimes in the world, as the relay reaches them: a handover is handed to a
/// running node at once (the world's time does not move), and a node that is down is gone.
struct RouterLinks<'a> {
    w: &'a mut World<LnetNode>,
    ids: [NodeId; 2],
    nids: &'a [Nid],
    board: &'a NetAlive,
}

impl Links for RouterLinks<'_> {
    fn nids(&self) -> &[Nid] {
        self.nids
    }

    fn board(&self) -> &NetAlive {
        self.board
    }

    fn try_hand(&mut self, to: Dest, h: Handover) -> Handed {
        let Dest::Sibling(i) = to else {
            return Handed::Gone(h);
        };
        match self.ids.get(i) {
            Some(&id) if self.w.node(id).is_some() => {
                self.w.with_node(id, |n, now| n.handle_handover(now, h));
                Handed::Taken
            }
            _ => Handed::Gone(h),
        }
    }

    /// Nothing to wake: the world runs every node.
    fn wake(&mut self, _: Dest) {}
}

/// Runs one storm (see the module doc).
pub fn routed_reboot_storm(cfg: &RoutedStormConfig) -> RoutedStormReport {
    let wall = std::time::Instant::now();
    let mut s = Storm::new(cfg);
    // Warm up until every client reaches the server both ways (bounded), then a little more.
    let start = s.w.now();
    s.run_until(start + Duration::from_secs(10), true);
    // The reboot: both of the router's NIs at once, with pings in flight.
    let (ra, rb) = (s.ra, s.rb);
    let seed = cfg.seed;
    s.w.reboot(ra, cfg.down_for, 1000 + seed);
    s.w.reboot(rb, cfg.down_for, 1000 + seed);
    let back = s.w.now() + cfg.down_for;
    s.back = Some(back);
    let horizon = back + cfg.horizon;
    loop {
        let step = s.w.now() + Duration::from_secs(1);
        s.run_until(step.min(horizon), true);
        let done = (0..s.clients.len()).all(|i| s.recovered(i).is_some());
        if done || s.w.now() >= horizon {
            break;
        }
    }
    let times: Vec<Instant> = (0..s.clients.len())
        .filter_map(|i| s.recovered(i))
        .collect();
    s.report.unrecovered = s.clients.len() - times.len();
    if s.report.unrecovered == 0 {
        s.report.recovery = times
            .iter()
            .max()
            .map(|t| t.saturating_duration_since(back));
    }
    // Every ping's deadline passes: none may be left without an outcome.
    let end = s.w.now() + PING_TIMEOUT + Duration::from_secs(1);
    s.run_until(end, false);
    s.report.pings_left =
        s.up.iter()
            .chain(s.down.iter())
            .map(|p| p.outstanding.len() as u64)
            .sum();
    let books: Vec<_> = [ra, rb]
        .iter()
        .filter_map(|&n| s.w.node(n).map(|x| x.routing_info().stats))
        .collect();
    s.report.router_books_reconcile = books.len() == 2 && books.iter().all(|b| b.reconciles());
    s.report.router_forwarded = books.iter().map(|b| b.forwarded).sum();
    s.report.router_in_flight = books.iter().map(|b| b.in_flight).sum();
    s.report.invalid_transitions = s.w.invalid_transitions();
    s.report.max_race_rejects_per_pair =
        s.w.race_rejects_by_pair()
            .map(|(_, n)| n)
            .max()
            .unwrap_or(0);
    s.report.stuck_connects = s.w.stats().stuck_connects;
    s.report.events = s.w.stats().events;
    s.report.wall = wall.elapsed();
    s.report
}
