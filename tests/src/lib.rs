//! Shared scenario machinery for the `tests` crate and the bench binaries: the LU-7646 router
//! reboot storm, run on the deterministic simulator under any race policy.

use lnd::engine::{EndpointConfig, RaceOrder, RacePolicy};
use lnd::sim::{NodeId, NodeState, SimConfig, World};
use lnd::time::{Duration, Instant};
use lnd::wire::{LnetHdr, Nid};

/// A small LNet PUT header, enough for traffic in scenarios.
pub fn put_hdr(from: Nid, to: Nid, len: usize) -> LnetHdr {
    LnetHdr::put(from, to, len as u32, 4, 0x5eed)
}

/// Node `from` sends node `to` an 8-byte PUT with match bits `bits`; the cookie of its outcome.
pub fn send_put(w: &mut World, from: NodeId, to: NodeId, bits: u64) -> u64 {
    let (s, d) = (w.nid_of(from), w.nid_of(to));
    w.send(from, d, LnetHdr::put(s, d, 8, 4, bits), vec![0; 8])
}

/// How many of the messages `msgs` (cookies) have no outcome yet or one other than delivered.
pub fn undelivered(w: &World, msgs: &[u64]) -> usize {
    msgs.iter()
        .filter(|&&m| !w.outcome(m).is_some_and(|(_, o)| o.is_delivered()))
        .count()
}

/// `10.0.0.1@o2ib`: the router in scenarios; lower than every client under both race orders.
pub fn router_nid() -> Nid {
    "10.0.0.1@o2ib".parse().expect("valid NID")
}

/// A router NID on which the two race orders disagree with (almost) every client: lower by raw
/// NID (`10.0.0.x` against `10.1+.y.z`), higher by nidhash (`0xff05_000a`, above every client
/// whose last octet is below 255). With it, a client on the raw order and a router on nidhash
/// both think they are the higher side: both refuse each other's connect (double rejects).
pub const ROUTER_NID_ORDERS_DISAGREE: &str = "10.0.0.255@o2ib";

/// Clients per value of the second octet: last octet 2..=255, third octet 0..=255.
const CLIENTS_PER_SECOND_OCTET: usize = 254 * 256;

/// The NID of client `i`: `10.x.y.z@o2ib` with `z = 2 + i % 254`, `y = (i / 254) % 256`,
/// `x = 1 + i / (254 * 256)`: distinct for every `i` below 254 * 256 * 255 (about 16.5 million).
///
/// The router is strictly lower than every client under both race orders, which is the shape of
/// LU-7646 (a client whose connect to the router is stuck refuses the router's connects):
/// - raw NID: same net, and `10.x...` with `x >= 1` is above `10.0.0.1`;
/// - nidhash (`net ^ addr.swap_bytes()`): the last octet becomes the top byte, `z >= 2` gives a
///   hash of at least `0x0200_000a`, above the router's `0x0105_000a`.
///
/// # Panics
/// If `i` is beyond the distinct range.
pub fn client_nid(i: usize) -> Nid {
    let x = 1 + i / CLIENTS_PER_SECOND_OCTET;
    assert!(
        x <= 255,
        "client index {i} beyond the NID space of 10.0.0.0/8"
    );
    let y = (i / 254) % 256;
    let z = 2 + i % 254;
    let addr = 0x0a00_0000 | (x as u32) << 16 | (y as u32) << 8 | z as u32;
    Nid::new(router_nid().net(), addr)
}

/// Which race order each client uses in a storm.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ClientOrders {
    /// Every client uses the router's order.
    SameAsRouter,
    /// Half on each order: client `i` uses the router's order when `i + i / 10` is even and the
    /// other one otherwise, so the stuck clients (every tenth) are split too.
    Alternating,
    /// Every client uses this order.
    All(RaceOrder),
}

impl ClientOrders {
    /// The order of client `i` when the router uses `router`.
    pub fn order_of(self, i: usize, router: RaceOrder) -> RaceOrder {
        match self {
            ClientOrders::SameAsRouter => router,
            ClientOrders::Alternating if (i + i / 10) % 2 == 0 => router,
            ClientOrders::Alternating => router.other(),
            ClientOrders::All(o) => o,
        }
    }
}

/// Parameters of the router reboot storm (LU-7646).
#[derive(Clone, Debug)]
pub struct StormConfig {
    pub clients: usize,
    /// The router's NID: [`router_nid`] (lower than every client under both orders), or one
    /// such as [`ROUTER_NID_ORDERS_DISAGREE`] to make the two orders disagree.
    pub router_nid: Nid,
    /// The router's race policy, and the clients' unless `client_policy` is set.
    pub policy: RacePolicy,
    /// The clients' policy when it differs from the router's (kernel clients around a ulnet
    /// router).
    pub client_policy: Option<RacePolicy>,
    /// The router's race order.
    pub router_order: RaceOrder,
    /// The clients' race orders.
    pub client_orders: ClientOrders,
    /// Every `1/stuck_every` client's first connect to the rebooted router never gets an event.
    pub stuck_every: usize,
    pub seed: u64,
    /// How long the router is down.
    pub down_for: Duration,
    /// How long to wait for recovery after the router is back.
    pub horizon: Duration,
    /// Keep the simulator's logs (off for very large runs).
    pub keep_logs: bool,
}

impl StormConfig {
    /// The acceptance storm: 10% stuck connects, router down 5 s, 60 s to recover; every node on
    /// `policy` and the default race order.
    pub fn new(clients: usize, policy: RacePolicy, seed: u64) -> StormConfig {
        StormConfig {
            clients,
            router_nid: router_nid(),
            policy,
            client_policy: None,
            router_order: RaceOrder::default(),
            client_orders: ClientOrders::SameAsRouter,
            stuck_every: 10,
            seed,
            down_for: Duration::from_secs(5),
            horizon: Duration::from_secs(60),
            keep_logs: clients <= 2000,
        }
    }

    /// The clients' race policy.
    pub fn client_policy(&self) -> RacePolicy {
        self.client_policy.unwrap_or(self.policy)
    }
}

/// What a storm showed.
#[derive(Clone, Debug)]
pub struct StormReport {
    pub policy: RacePolicy,
    pub client_policy: RacePolicy,
    pub clients: usize,
    /// Time from the router being back to the last client connected to its new instance;
    /// `None` if some client never was within the horizon.
    pub recovery: Option<Duration>,
    pub unrecovered: usize,
    /// Active connects made by everyone after the reboot.
    pub connect_attempts: u64,
    /// CONN_RACE rejects sent by everyone after the reboot.
    pub race_rejects: u64,
    /// The most CONN_RACE rejects any node received from one peer between two connections.
    pub max_races_per_peer: u32,
    /// The most zombie connections any node ever had for one peer.
    pub peak_zombies: u32,
    /// The most connect attempts any node made to one peer within one second, after the reboot.
    pub max_attempts_per_second: usize,
    /// Messages that ended without a status (must be 0).
    pub unaccounted: usize,
    /// Connection state changes outside the transition table, all nodes (must be 0).
    pub invalid_transitions: u64,
    pub events: u64,
    pub wall: std::time::Duration,
    /// Engine state of the router per connection it holds.
    pub router_bytes_per_conn: usize,
    pub rnr: u64,
    /// The most CONN_RACE rejects the router and one client exchanged after the reboot, both
    /// directions together (counted by the simulator).
    pub max_race_rejects_per_pair: u64,
    /// The most established connections the router and one client keep at the end, as either
    /// side sees it.
    pub max_conns_per_pair: usize,
    /// `race_order_disagreements` and `race_order_adoptions` summed over every node.
    pub race_order_disagreements: u64,
    pub race_order_adoptions: u64,
    /// Peak resident memory of this process so far (VmHWM), in KiB, where the OS reports it.
    pub peak_rss_kib: Option<u64>,
}

/// The peak resident set of this process (`VmHWM` in /proc/self/status), in KiB.
pub fn peak_rss_kib() -> Option<u64> {
    proc_status_kib("self", "VmHWM")
}

/// A memory field of `/proc/<pid>/status` (`pid`: a process id, or `self`), in KiB: `VmRSS`,
/// `VmHWM`, ... `None` where the OS does not report it.
pub fn proc_status_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs the storm: clients connected to a router, the router reboots, 10% of the clients'
/// connects to it hang, the router comes back with traffic for every client, clients keep
/// sending to it; then measures how long until every client is connected to the new instance.
pub fn router_reboot_storm(cfg: &StormConfig) -> StormReport {
    let wall = std::time::Instant::now();
    let mut world = World::new(SimConfig {
        keep_logs: cfg.keep_logs,
        ..SimConfig::with_seed(cfg.seed)
    });
    let node_cfg =
        |nid: Nid, inc: u64, seed: u64, policy: RacePolicy, order: RaceOrder| EndpointConfig {
            race_policy: policy,
            race_order: order,
            seed,
            ..EndpointConfig::new(nid, inc)
        };
    let rnid = cfg.router_nid;
    let router = world.add_node(node_cfg(
        rnid,
        1_000,
        cfg.seed,
        cfg.policy,
        cfg.router_order,
    ));
    let clients: Vec<NodeId> = (0..cfg.clients)
        .map(|i| {
            world.add_node(node_cfg(
                client_nid(i),
                10_000 + i as u64,
                cfg.seed ^ i as u64,
                cfg.client_policy(),
                cfg.client_orders.order_of(i, cfg.router_order),
            ))
        })
        .collect();

    // Everyone connected to the router's first instance.
    for &c in &clients {
        let nid = world.nid_of(c);
        world.send(c, rnid, put_hdr(nid, rnid, 64), vec![0; 64]);
    }
    let settle = world.now() + Duration::from_secs(5);
    world.run_until(settle);

    // The reboot.
    let t0 = world.now();
    let rejects_before: Vec<u64> = clients
        .iter()
        .map(|&c| world.race_rejects_between(router, c))
        .collect();
    for (i, &c) in clients.iter().enumerate() {
        if cfg.stuck_every > 0 && i % cfg.stuck_every == 0 {
            world.stuck_next_connect(c, rnid);
        }
    }
    let new_incarnation = 2_000;
    world.reboot(router, cfg.down_for, new_incarnation);
    let back = t0 + cfg.down_for;
    let end = back + cfg.horizon;

    let mut recovered_at: Vec<Option<Instant>> = vec![None; clients.len()];
    let mut router_sent = false;
    let mut next_traffic = t0;
    let tick = Duration::from_millis(50);
    let mut t = t0;
    while t < end {
        if t >= next_traffic {
            // Clients keep traffic queued for the router: one message a second each.
            for &c in &clients {
                let nid = world.nid_of(c);
                world.send(c, rnid, put_hdr(nid, rnid, 64), vec![1; 64]);
            }
            next_traffic += Duration::from_secs(1);
        }
        if !router_sent && t >= back && world.node_state(router) == NodeState::Up {
            // The router is back with traffic for every client.
            for &c in &clients {
                let nid = world.nid_of(c);
                world.send(router, nid, put_hdr(rnid, nid, 64), vec![2; 64]);
            }
            router_sent = true;
        }
        t += tick;
        world.run_until(t);
        if router_sent {
            for (i, &c) in clients.iter().enumerate() {
                if recovered_at[i].is_some() {
                    continue;
                }
                let ok = world
                    .endpoint(c)
                    .and_then(|e| e.peer(rnid))
                    .is_some_and(|p| p.established > 0 && p.incarnation == new_incarnation);
                if ok {
                    recovered_at[i] = Some(world.now());
                }
            }
            if recovered_at.iter().all(Option::is_some) {
                break;
            }
        }
    }
    // Let the last traffic finish so every message has a status.
    world.run_for(Duration::from_secs(60));

    let unrecovered = recovered_at.iter().filter(|r| r.is_none()).count();
    let recovery = if unrecovered == 0 {
        recovered_at
            .iter()
            .flatten()
            .max()
            .map(|&t| t.saturating_duration_since(back))
    } else {
        None
    };
    let max_race_rejects_per_pair = clients
        .iter()
        .zip(&rejects_before)
        .map(|(&c, &before)| world.race_rejects_between(router, c) - before)
        .max()
        .unwrap_or(0);
    let router_ep = world.endpoint(router);
    let max_conns_per_pair = clients
        .iter()
        .map(|&c| {
            let nid = world.nid_of(c);
            let at_router = router_ep
                .and_then(|e| e.peer(nid))
                .map_or(0, |p| p.established);
            let at_client = world
                .endpoint(c)
                .and_then(|e| e.peer(rnid))
                .map_or(0, |p| p.established);
            at_router.max(at_client)
        })
        .max()
        .unwrap_or(0);
    let mut race_order_disagreements = 0;
    let mut race_order_adoptions = 0;
    let mut connect_attempts = 0;
    let mut race_rejects = 0;
    let mut max_races_per_peer = 0;
    let mut peak_zombies = 0;
    for n in std::iter::once(router).chain(clients.iter().copied()) {
        if let Some(e) = world.endpoint(n) {
            connect_attempts += e.stats().connects;
            race_rejects += e.stats().races;
            race_order_disagreements += e.stats().race_order_disagreements;
            race_order_adoptions += e.stats().race_order_adoptions;
            for p in e.peers() {
                max_races_per_peer = max_races_per_peer.max(p.peak_races_received);
                peak_zombies = peak_zombies.max(p.peak_zombies);
            }
        }
    }
    let mut max_attempts_per_second = 0;
    for n in std::iter::once(router).chain(clients.iter().copied()) {
        max_attempts_per_second = max_attempts_per_second.max(max_connects_in_window(
            world.connect_log(n),
            t0,
            Duration::from_secs(1),
        ));
    }
    let router_bytes_per_conn = world
        .endpoint(router)
        .map(|e| e.state_bytes() / e.conns().count().max(1))
        .unwrap_or(0);
    StormReport {
        policy: cfg.policy,
        client_policy: cfg.client_policy(),
        clients: cfg.clients,
        recovery,
        unrecovered,
        connect_attempts,
        race_rejects,
        max_races_per_peer,
        peak_zombies,
        max_attempts_per_second,
        unaccounted: world.pending_sends(),
        invalid_transitions: world.invalid_transitions(),
        events: world.stats().events,
        wall: wall.elapsed(),
        router_bytes_per_conn,
        rnr: world.stats().rnr,
        max_race_rejects_per_pair,
        max_conns_per_pair,
        race_order_disagreements,
        race_order_adoptions,
        peak_rss_kib: peak_rss_kib(),
    }
}

/// The most connect attempts to one peer inside any `window`, from `since` on.
pub fn max_connects_in_window(log: &[(Instant, Nid)], since: Instant, window: Duration) -> usize {
    let mut per_peer: std::collections::HashMap<Nid, Vec<Instant>> = Default::default();
    for &(t, nid) in log {
        if t >= since {
            per_peer.entry(nid).or_default().push(t);
        }
    }
    let mut worst = 0;
    for times in per_peer.values_mut() {
        times.sort();
        let mut lo = 0;
        for hi in 0..times.len() {
            while times[hi].saturating_duration_since(times[lo]) >= window {
                lo += 1;
            }
            worst = worst.max(hi - lo + 1);
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Client NIDs are distinct, and the router is strictly lower than each under both orders.
    #[test]
    fn client_nids_distinct_and_above_the_router_under_both_orders() {
        let r = router_nid();
        assert_eq!(r.nidhash(), 0x0105_000a);
        let mut seen = std::collections::HashSet::new();
        let check = |i: usize, seen: &mut std::collections::HashSet<Nid>| {
            let c = client_nid(i);
            assert!(seen.insert(c), "client {i}: {c} allocated twice");
            assert_ne!(c, r);
            for order in RaceOrder::ALL {
                assert!(
                    order.lower(r, c),
                    "client {i}: {c} not above the router under {order:?}"
                );
            }
        };
        for i in 0..100_000 {
            check(i, &mut seen);
        }
        // Beyond: a strided sample up to millions, and the edges of the octet wraps.
        for i in (100_000..5_000_000).step_by(997) {
            check(i, &mut seen);
        }
        for k in 1..80 {
            let edge = k * CLIENTS_PER_SECOND_OCTET;
            for i in edge.saturating_sub(2)..edge + 2 {
                if i >= 100_000 {
                    seen.remove(&client_nid(i));
                    check(i, &mut seen);
                }
            }
        }
        assert_eq!(client_nid(0).to_string(), "10.1.0.2@o2ib");
        assert_eq!(client_nid(253).to_string(), "10.1.0.255@o2ib");
        assert_eq!(client_nid(254).to_string(), "10.1.1.2@o2ib");
        assert_eq!(
            client_nid(CLIENTS_PER_SECOND_OCTET).to_string(),
            "10.2.0.2@o2ib"
        );
    }

    /// The disagreeing router: lower than every client by raw NID, higher by nidhash than every
    /// client whose last octet is below 255.
    #[test]
    fn router_nid_orders_disagree_with_clients() {
        let r: Nid = ROUTER_NID_ORDERS_DISAGREE.parse().expect("valid NID");
        for i in (0..100_000).step_by(7) {
            let c = client_nid(i);
            assert!(RaceOrder::Nid.lower(r, c), "{c}");
            if i % 254 != 253 {
                assert!(RaceOrder::NidHash.lower(c, r), "{c}");
            }
        }
    }

    #[test]
    fn alternating_orders_split_clients_and_stuck_clients_in_half() {
        let o = |i| ClientOrders::Alternating.order_of(i, RaceOrder::NidHash);
        let on_router = (0..1000).filter(|&i| o(i) == RaceOrder::NidHash).count();
        assert_eq!(on_router, 500);
        let stuck_on_router = (0..1000)
            .step_by(10)
            .filter(|&i| o(i) == RaceOrder::NidHash)
            .count();
        assert_eq!(stuck_on_router, 50);
    }
}
