//! A router reboot storm with real processes: a swarm of client nodes (one process, one thread:
//! [`router::runtime::Swarm`], busy-polling off) pings a server through an `lnet-router` daemon;
//! once every client is healthy the router is SIGKILLed with pings in flight and restarted at
//! once on the same configuration. Every client must resume.
//!
//!     cargo build --release -p router -p benches
//!     target/release/router_storm --clients 1000 --router target/release/lnet-router
//!     target/release/router_storm --clients 1000 --interval-ms 0 --depth 4 ...   # loaded
//!
//! Each client starts a ping every `--interval-ms` (default 1000) while it has fewer than
//! `--depth` (default 1) outstanding.
//!
//! Topology (tcp fabric on loopback): clients `10.0.<i/250>.<i%250+1>@o2ib` on ports the OS
//! assigns, the router `10.0.0.254@o2ib` + `10.1.0.254@o2ib1` and the server `10.1.0.2@o2ib1`
//! (an `lnet-router` daemon too) on their own 127.152.x.y addresses, so that the restarted router
//! binds the addresses its predecessor had. Gateway health is checked every second.
//!
//! Prints `FIGURE` lines: the time until every client had a successful ping at start; the time
//! from the restart until every client had a successful ping started after it (full recovery),
//! with the median and the slowest client; every ping accounted for (started = ok + failed, by
//! reason; none left outstanding); the most CONN_RACE rejects any client received and the most
//! races any client counted (the engine's limit is 20); the most connections any client had to
//! the router at once, and the most any peer had at the router (2 = one zombie beside the live
//! one); the router's forwarding books; the swarm's RSS. Exit status 1 if a client never
//! recovers, a ping is unaccounted for, a race count reaches the limit, or a peer has more than
//! one zombie.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration as StdDuration, Instant as StdInstant};

use lnd::driver::tcp::{MonotonicClock, TcpConfig, TcpFabric};
use lnd::time::Duration;
use lnd::wire::{Nid, RejectReason};
use router::control::{ControlClient, Request, Response};
use router::gateway::GatewayHealthConfig;
use router::runtime::{NiRuntime, Swarm};
use router::{LnetEvent, LnetNode, NiConfig, NiIndex, NodeConfig, PingId, RouteConfig};

const SERVER: &str = "10.1.0.2@o2ib1";
const ROUTER_A: &str = "10.0.0.254@o2ib";
const ROUTER_B: &str = "10.1.0.254@o2ib1";
const PORT: u16 = 9990;
/// The engine's CONN_RACE limit (a peer that keeps racing is given in to after this many).
const RACE_LIMIT: u64 = 20;
const PING_TIMEOUT: Duration = Duration::from_secs(5);

struct Opts {
    clients: usize,
    router: PathBuf,
    /// Bound on the start and on the recovery.
    bound: StdDuration,
    /// The router's NIs' busy-poll budget.
    router_busy_poll_us: u64,
    /// Each client starts a ping this often ...
    interval: StdDuration,
    /// ... while it has fewer than this many outstanding.
    depth: usize,
}

fn parse_args() -> Option<Opts> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = Opts {
        clients: 1000,
        router: PathBuf::from("target/release/lnet-router"),
        bound: StdDuration::from_secs(120),
        router_busy_poll_us: 0,
        interval: StdDuration::from_secs(1),
        depth: 1,
    };
    let mut i = 0;
    while i < args.len() {
        let val = args.get(i + 1)?;
        match args[i].as_str() {
            "--clients" => o.clients = val.parse().ok().filter(|&n| (1..=60_000).contains(&n))?,
            "--router" => o.router = PathBuf::from(val),
            "--bound-secs" => o.bound = StdDuration::from_secs(val.parse().ok()?),
            "--router-busy-poll-us" => o.router_busy_poll_us = val.parse().ok()?,
            "--interval-ms" => o.interval = StdDuration::from_millis(val.parse().ok()?),
            "--depth" => o.depth = val.parse().ok().filter(|&d| (1..=64).contains(&d))?,
            _ => return None,
        }
        i += 2;
    }
    Some(o)
}

fn nid(s: &str) -> Nid {
    s.parse().expect("a valid NID")
}

fn client_nid(i: usize) -> Nid {
    nid(&format!("10.0.{}.{}@o2ib", i / 250, i % 250 + 1))
}

/// The loopback address of a daemon's NI, private to this process.
fn daemon_addr(host: u8) -> SocketAddr {
    let b = (std::process::id() % 250) as u8 + 1;
    SocketAddr::from(([127, 152, b, host], PORT))
}

/// One client's pings.
#[derive(Default)]
struct Client {
    /// Pings started and not finished, with when each was started.
    outstanding: Vec<(PingId, StdInstant)>,
    next_ping: Option<StdInstant>,
    /// When the last ping that succeeded had been started.
    last_ok_started: Option<StdInstant>,
    /// When the first ping started after the restart succeeded.
    recovered_at: Option<StdInstant>,
}

#[derive(Default)]
struct Tally {
    started: u64,
    ok: u64,
    failed: BTreeMap<String, u64>,
}

impl Tally {
    fn failed_total(&self) -> u64 {
        self.failed.values().sum()
    }
}

/// The swarm: every client's runtime on this thread, and their pings.
struct Clients {
    swarm: Swarm<TcpFabric>,
    state: Vec<Client>,
    tally: Tally,
    server: Nid,
    /// Pings are started (else only finished).
    pinging: bool,
    interval: StdDuration,
    depth: usize,
    restart: Option<StdInstant>,
    /// The most connections any client had to the router at once.
    peak_conns_to_router: usize,
}

impl Clients {
    fn new(opts: &Opts, peers: Arc<Mutex<HashMap<Nid, SocketAddr>>>) -> Result<Clients, String> {
        let n = opts.clients;
        let mut runtimes = Vec::with_capacity(n);
        let t0 = StdInstant::now();
        for i in 0..n {
            let me = client_nid(i);
            let resolver_peers = Arc::clone(&peers);
            let resolver = move |n: Nid| resolver_peers.lock().ok()?.get(&n).copied();
            let tcp = TcpConfig {
                busy_poll: StdDuration::ZERO,
                ring_entries: 64,
                ..TcpConfig::default()
            };
            let fabric = TcpFabric::bind_with(SocketAddr::from(([127, 0, 0, 1], 0)), resolver, tcp)
                .map_err(|e| format!("client {i}: cannot bind: {e}"))?;
            if let Ok(mut p) = peers.lock() {
                p.insert(me, fabric.local_addr());
            }
            let clock = MonotonicClock::new();
            let mut cfg = NodeConfig::new(vec![NiConfig::new(me, 0x570_0000 + i as u64)]);
            cfg.routes = vec![RouteConfig {
                net: "o2ib1".parse().expect("a net"),
                gateway: nid(ROUTER_A),
                hops: Some(1),
                priority: 0,
            }];
            cfg.gateway_health = GatewayHealthConfig {
                check_interval: Duration::from_secs(1),
                ping_timeout: Duration::from_secs(1),
                ..cfg.gateway_health
            };
            let node = LnetNode::new(cfg, clock.now());
            let (rt, _wake) = NiRuntime::new(node, fabric, clock)
                .map_err(|e| format!("client {i}: waker: {e}"))?;
            runtimes.push(rt);
        }
        eprintln!(
            "INFO {n} clients bound in {:.2} s",
            t0.elapsed().as_secs_f64()
        );
        let swarm = Swarm::new(runtimes).map_err(|e| format!("swarm: {e}"))?;
        Ok(Clients {
            swarm,
            state: (0..n).map(|_| Client::default()).collect(),
            tally: Tally::default(),
            server: nid(SERVER),
            pinging: true,
            interval: opts.interval,
            depth: opts.depth,
            restart: None,
            peak_conns_to_router: 0,
        })
    }

    /// One turn of the swarm; then every finished ping is recorded and due ones are started.
    fn turn(&mut self) -> Result<(), String> {
        self.swarm
            .turn(StdDuration::from_millis(20))
            .map_err(|e| format!("swarm: {e}"))?;
        let wall = StdInstant::now();
        let n = self.state.len();
        for (i, rt) in self.swarm.runtimes_mut().iter_mut().enumerate() {
            let c = &mut self.state[i];
            while let Some(ev) = rt.node_mut().poll_event() {
                match ev {
                    LnetEvent::PingDone { id, result, .. } => {
                        let Some(k) = c.outstanding.iter().position(|o| o.0 == id) else {
                            continue;
                        };
                        let (_, started) = c.outstanding.swap_remove(k);
                        match result {
                            Ok(_) => {
                                self.tally.ok += 1;
                                c.last_ok_started = Some(started);
                                if self.restart.is_some_and(|r| started >= r)
                                    && c.recovered_at.is_none()
                                {
                                    c.recovered_at = Some(wall);
                                }
                            }
                            Err(e) => {
                                *self.tally.failed.entry(e.to_string()).or_default() += 1;
                            }
                        }
                    }
                    LnetEvent::Put { payload, .. } => rt.node_mut().recycle(payload),
                    _ => {}
                }
            }
            if !self.pinging || c.outstanding.len() >= self.depth {
                continue;
            }
            // The first pings are spread over one interval.
            let due = *c
                .next_ping
                .get_or_insert(wall + self.interval.mul_f64(i as f64 / n as f64));
            if wall < due {
                continue;
            }
            c.next_ping = Some(wall + self.interval);
            let now = rt.now();
            self.tally.started += 1;
            match rt.node_mut().ping(now, self.server, PING_TIMEOUT) {
                Ok(id) => c.outstanding.push((id, wall)),
                Err(e) => *self.tally.failed.entry(e.to_string()).or_default() += 1,
            }
        }
        Ok(())
    }

    /// The most connections any one client has to the router now.
    fn sample_conns(&mut self) {
        let a = nid(ROUTER_A);
        for rt in self.swarm.runtimes() {
            if let Some(ep) = rt.node().endpoint(NiIndex(0)) {
                let k = ep.conns().filter(|c| c.peer == a).count();
                self.peak_conns_to_router = self.peak_conns_to_router.max(k);
            }
        }
    }

    /// (most CONN_RACE rejects any client received, most races any client counted)
    fn race_counters(&self) -> (u64, u64) {
        let race = usize::from(RejectReason::ConnRace.code());
        let mut worst = (0, 0);
        for rt in self.swarm.runtimes() {
            if let Some(ep) = rt.node().endpoint(NiIndex(0)) {
                let s = ep.stats();
                worst.0 = worst.0.max(s.rejects_received[race]);
                worst.1 = worst.1.max(s.races);
            }
        }
        worst
    }

    fn all_healthy_since(&self, t: StdInstant) -> bool {
        self.state
            .iter()
            .all(|c| c.last_ok_started.is_some_and(|s| s >= t))
    }
}

/// An `lnet-router` daemon of the storm.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn start(bin: &Path, dir: &Path, name: &str, yaml: &str) -> Result<Daemon, String> {
        let cfg = dir.join(format!("{name}.yaml"));
        std::fs::write(&cfg, yaml).map_err(|e| format!("{}: {e}", cfg.display()))?;
        let socket = dir.join(format!("{name}.sock"));
        let _ = std::fs::remove_file(&socket);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.log")))
            .map_err(|e| format!("{name}.log: {e}"))?;
        let child = Command::new(bin)
            .arg("--config")
            .arg(&cfg)
            .arg("--socket")
            .arg(&socket)
            .env("LNET_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let mut d = Daemon { child, socket };
        let t0 = StdInstant::now();
        while d.call(&Request::NetShow { verbose: false }).is_err() {
            if let Ok(Some(st)) = d.child.try_wait() {
                return Err(format!("{name} exited at start: {st} (see {name}.log)"));
            }
            if t0.elapsed() > StdDuration::from_secs(30) {
                return Err(format!("{name} did not answer within 30 s"));
            }
            std::thread::sleep(StdDuration::from_millis(5));
        }
        Ok(d)
    }

    fn call(&self, req: &Request) -> Result<Response, String> {
        ControlClient::connect(&self.socket)
            .and_then(|mut c| c.call(req))
            .map_err(|e| e.to_string())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The most connections any one peer has at this daemon now.
    fn peak_conns_per_peer(&self) -> usize {
        let Ok(Response::Conn(c)) = self.call(&Request::ConnShow) else {
            return 0;
        };
        let mut per: HashMap<String, usize> = HashMap::new();
        for e in c.conn {
            *per.entry(e.peer).or_default() += 1;
        }
        per.into_values().max().unwrap_or(0)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let t0 = StdInstant::now();
            while matches!(self.child.try_wait(), Ok(None)) {
                if t0.elapsed() > StdDuration::from_secs(10) {
                    self.kill();
                    break;
                }
                std::thread::sleep(StdDuration::from_millis(10));
            }
        }
    }
}

/// A daemon's YAML: its NIs, routes, routing, and the peers' addresses.
fn yaml(
    nis: &[(&str, SocketAddr)],
    route: Option<(&str, &str)>,
    routing: bool,
    busy_poll_us: u64,
    peers: &[(Nid, SocketAddr)],
) -> String {
    let mut y = String::from("net:\n");
    for (n, a) in nis {
        let net = n.split('@').nth(1).unwrap_or("o2ib");
        y.push_str(&format!(
            "    - net type: {net}\n      fabric: tcp\n      local NI(s):\n        - nid: {n}\n          listen: {a}\n          busy poll us: {busy_poll_us}\n"
        ));
    }
    if let Some((net, gw)) = route {
        y.push_str(&format!(
            "route:\n    - net: {net}\n      gateway: {gw}\n      hop: 1\n"
        ));
    }
    y.push_str(&format!(
        "routing:\n    enable: {}\n    alive_router_check_interval: 1\n    router_ping_timeout: 1\npeers:\n",
        u8::from(routing)
    ));
    for (n, a) in peers {
        y.push_str(&format!("    - nid: {n}\n      address: {a}\n"));
    }
    y
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> ExitCode {
    let Some(opts) = parse_args() else {
        eprintln!(
            "usage: router_storm [--clients N] [--router LNET_ROUTER_BIN] [--bound-secs S] \
             [--router-busy-poll-us US] [--interval-ms MS] [--depth K]"
        );
        return ExitCode::from(2);
    };
    match run(&opts) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("router_storm: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the swarm until `done` holds or `bound` passes, sampling connections every 250 ms
/// (`router`: the router's too, into `router_peak`). The time it took, or `None`.
fn run_until(
    clients: &mut Clients,
    bound: StdDuration,
    router: Option<&Daemon>,
    router_peak: &mut usize,
    mut done: impl FnMut(&Clients) -> bool,
) -> Result<Option<StdDuration>, String> {
    let t0 = StdInstant::now();
    let mut next_sample = t0;
    loop {
        clients.turn()?;
        if StdInstant::now() >= next_sample {
            clients.sample_conns();
            if let Some(r) = router {
                *router_peak = (*router_peak).max(r.peak_conns_per_peer());
            }
            next_sample += StdDuration::from_millis(250);
        }
        if done(clients) {
            return Ok(Some(t0.elapsed()));
        }
        if t0.elapsed() >= bound {
            return Ok(None);
        }
    }
}

/// The soft RLIMIT_NOFILE, from /proc (None if unreadable or unlimited).
fn nofile_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn run(opts: &Opts) -> Result<bool, String> {
    // Descriptors: a ring, a listener, a waker pair and a connection or two per client; the
    // router (which inherits the limit) holds one or two per client too.
    let need = 6 * opts.clients as u64 + 64;
    if let Some(have) = nofile_limit().filter(|&h| h < need) {
        return Err(format!(
            "{} clients need about {need} descriptors; the limit is {have} (ulimit -n {need})",
            opts.clients
        ));
    }
    let dir = std::env::temp_dir().join(format!("router_storm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let peers: Arc<Mutex<HashMap<Nid, SocketAddr>>> = Arc::default();
    let (server_addr, ra_addr, rb_addr) = (daemon_addr(2), daemon_addr(3), daemon_addr(4));
    if let Ok(mut p) = peers.lock() {
        p.insert(nid(ROUTER_A), ra_addr);
    }
    let mut clients = Clients::new(opts, Arc::clone(&peers))?;

    let server = Daemon::start(
        &opts.router,
        &dir,
        "server",
        &yaml(
            &[(SERVER, server_addr)],
            Some(("o2ib", ROUTER_B)),
            false,
            0,
            &[(nid(ROUTER_B), rb_addr)],
        ),
    )?;
    let mut router_peers: Vec<(Nid, SocketAddr)> = (0..opts.clients)
        .filter_map(|i| {
            let n = client_nid(i);
            Some((n, *peers.lock().ok()?.get(&n)?))
        })
        .collect();
    router_peers.push((nid(SERVER), server_addr));
    let router_yaml = yaml(
        &[(ROUTER_A, ra_addr), (ROUTER_B, rb_addr)],
        None,
        true,
        opts.router_busy_poll_us,
        &router_peers,
    );
    let mut router = Daemon::start(&opts.router, &dir, "router", &router_yaml)?;
    eprintln!(
        "INFO server and router up; {} clients pinging",
        opts.clients
    );

    let mut router_peak = 0;
    let t_start = StdInstant::now();
    let Some(healthy) = run_until(&mut clients, opts.bound, None, &mut router_peak, |c| {
        c.all_healthy_since(t_start)
    })?
    else {
        let n = clients
            .state
            .iter()
            .filter(|c| c.last_ok_started.is_none())
            .count();
        return Err(format!(
            "{n} of {} clients never pinged the server within {:?}",
            opts.clients, opts.bound
        ));
    };
    println!(
        "FIGURE storm_start_all_healthy seconds={:.2} clients={}",
        healthy.as_secs_f64(),
        opts.clients
    );
    // Steady traffic for a moment, then the kill with pings in flight.
    run_until(
        &mut clients,
        StdDuration::from_secs(2),
        Some(&router),
        &mut router_peak,
        |_| false,
    )?;
    let in_flight: usize = clients.state.iter().map(|c| c.outstanding.len()).sum();
    let router_held = match router.call(&Request::RoutingShow) {
        Ok(Response::Routing(r)) => r.forwarding.in_flight,
        _ => 0,
    };
    router.kill();
    let t_kill = StdInstant::now();
    drop(router);
    let router = Daemon::start(&opts.router, &dir, "router", &router_yaml)?;
    let t_restart = StdInstant::now();
    clients.restart = Some(t_restart);
    println!(
        "FIGURE storm_router_restart pings_outstanding_at_kill={in_flight} router_in_flight_just_before={router_held} restart_seconds={:.3}",
        t_restart.duration_since(t_kill).as_secs_f64()
    );
    let recovered = run_until(
        &mut clients,
        opts.bound,
        Some(&router),
        &mut router_peak,
        |c| c.state.iter().all(|s| s.recovered_at.is_some()),
    )?;
    let mut times: Vec<f64> = clients
        .state
        .iter()
        .filter_map(|c| c.recovered_at)
        .map(|t| t.duration_since(t_restart).as_secs_f64())
        .collect();
    times.sort_by(f64::total_cmp);
    let unrecovered = opts.clients - times.len();
    let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    let slowest = times.last().copied().unwrap_or(f64::NAN);
    println!(
        "FIGURE storm_recovery full_seconds={} median_client_seconds={median:.2} slowest_client_seconds={slowest:.2} unrecovered={unrecovered}",
        recovered.map_or("never".to_string(), |d| format!("{:.2}", d.as_secs_f64()))
    );

    // Every ping accounted for: stop starting them, let the outstanding ones finish.
    clients.pinging = false;
    let drained = run_until(
        &mut clients,
        StdDuration::from_secs(10),
        Some(&router),
        &mut router_peak,
        |c| c.state.iter().all(|s| s.outstanding.is_empty()),
    )?;
    let outstanding: u64 = clients
        .state
        .iter()
        .map(|c| c.outstanding.len() as u64)
        .sum();
    let t = &clients.tally;
    let failed: Vec<String> = t.failed.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!(
        "FIGURE storm_pings started={} ok={} failed={} outstanding={outstanding} failed_by_reason=[{}]",
        t.started,
        t.ok,
        t.failed_total(),
        failed.join("; ")
    );
    let (race_rejects, races) = clients.race_counters();
    println!(
        "FIGURE storm_races max_conn_race_rejects_per_client={race_rejects} max_races_per_client={races} limit={RACE_LIMIT}"
    );
    println!(
        "FIGURE storm_conns max_conns_client_to_router={} max_conns_per_peer_at_router={router_peak}",
        clients.peak_conns_to_router
    );
    let books = match router.call(&Request::RoutingShow) {
        Ok(Response::Routing(r)) => Some(r.forwarding),
        _ => None,
    };
    if let Some(f) = &books {
        println!(
            "FIGURE storm_router_books received={} forwarded={} dropped={} in_flight={}",
            f.received, f.forwarded, f.dropped, f.in_flight
        );
    }
    println!("FIGURE storm_swarm_peak_rss_kib {}", peak_rss_kib());

    let mut ok = true;
    let mut fail = |why: String| {
        eprintln!("router_storm: FAILED: {why}");
        ok = false;
    };
    if recovered.is_none() {
        fail(format!(
            "{unrecovered} clients did not recover within {:?}",
            opts.bound
        ));
    }
    if drained.is_none() || outstanding > 0 {
        fail(format!("{outstanding} pings never finished"));
    }
    if t.started != t.ok + t.failed_total() + outstanding {
        fail("pings started != ok + failed + outstanding".into());
    }
    if race_rejects >= RACE_LIMIT || races >= RACE_LIMIT {
        fail("a client reached the race limit".into());
    }
    if clients.peak_conns_to_router > 2 || router_peak > 2 {
        fail("a peer had more than one zombie".into());
    }
    match books {
        Some(f) if f.received == f.forwarded + f.dropped + f.in_flight => {}
        other => fail(format!("the router's books do not reconcile: {other:?}")),
    }
    drop((router, server));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ok)
}
