//! Shared scenario machinery for the `tests` crate and the bench binaries: the LU-7646 router
//! reboot storm, run on the deterministic simulator under any race policy.

use lnd::engine::{EndpointConfig, RacePolicy};
use lnd::fabric::sim::{NodeId, NodeState, SimConfig, World};
use lnd::time::{Duration, Instant};
use lnd::wire::{LnetHdr, Nid};

/// A small LNet PUT header, enough for traffic in scenarios.
pub fn put_hdr(from: Nid, to: Nid, len: usize) -> LnetHdr {
    LnetHdr::put(from, to, len as u32, 4, 0x5eed)
}

/// `10.0.0.1@o2ib`: the router in scenarios; lower than every client.
pub fn router_nid() -> Nid {
    "10.0.0.1@o2ib".parse().expect("valid NID")
}

/// The NID of client `i`: `10.1.x.y@o2ib`, higher than the router's.
pub fn client_nid(i: usize) -> Nid {
    let i = i as u32 + 1;
    Nid::new(router_nid().net(), 0x0a01_0000 | i)
}

/// Parameters of the router reboot storm (LU-7646).
#[derive(Clone, Debug)]
pub struct StormConfig {
    pub clients: usize,
    pub policy: RacePolicy,
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
    /// The acceptance storm: 10% stuck connects, router down 5 s, 60 s to recover.
    pub fn new(clients: usize, policy: RacePolicy, seed: u64) -> StormConfig {
        StormConfig {
            clients,
            policy,
            stuck_every: 10,
            seed,
            down_for: Duration::from_secs(5),
            horizon: Duration::from_secs(60),
            keep_logs: clients <= 2000,
        }
    }
}

/// What a storm showed.
#[derive(Clone, Debug)]
pub struct StormReport {
    pub policy: RacePolicy,
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
    pub events: u64,
    pub wall: std::time::Duration,
    /// Engine state of the router per connection it holds.
    pub router_bytes_per_conn: usize,
    pub rnr: u64,
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
    let node_cfg = |nid: Nid, inc: u64, seed: u64| EndpointConfig {
        race_policy: cfg.policy,
        seed,
        ..EndpointConfig::new(nid, inc)
    };
    let rnid = router_nid();
    let router = world.add_node(node_cfg(rnid, 1_000, cfg.seed));
    let clients: Vec<NodeId> = (0..cfg.clients)
        .map(|i| {
            world.add_node(node_cfg(
                client_nid(i),
                10_000 + i as u64,
                cfg.seed ^ i as u64,
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
    let mut connect_attempts = 0;
    let mut race_rejects = 0;
    let mut max_races_per_peer = 0;
    let mut peak_zombies = 0;
    for n in std::iter::once(router).chain(clients.iter().copied()) {
        if let Some(e) = world.endpoint(n) {
            connect_attempts += e.stats().connects;
            race_rejects += e.stats().races;
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
        clients: cfg.clients,
        recovery,
        unrecovered,
        connect_attempts,
        race_rejects,
        max_races_per_peer,
        peak_zombies,
        max_attempts_per_second,
        unaccounted: world.pending_sends(),
        events: world.stats().events,
        wall: wall.elapsed(),
        router_bytes_per_conn,
        rnr: world.stats().rnr,
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
