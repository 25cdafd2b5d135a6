//! A router reboot storm with real processes: a swarm of client nodes and a server (one process,
//! one thread: [`router::runtime::Swarm`], busy-polling off) ping each other through an
//! `lnet-router` daemon; once every ping stream answers, the router is SIGKILLed with pings in
//! flight and restarted at once on the same configuration. Every client must resume both ways.
//!
//!     cargo build --release -p router -p benches
//!     target/release/router_storm --clients 1000 --router target/release/lnet-router
//!     target/release/router_storm --clients 1000 --interval-ms 0 --depth 4 ...   # loaded
//!
//! Each client starts a ping every `--interval-ms` (default 1000) while it has fewer than
//! `--depth` (default 8) outstanding.
//!
//! Topology (tcp fabric on loopback): clients `10.0.<i/250>.<i%250+1>@o2ib` on ports the OS
//! assigns, the router `10.0.0.254@o2ib` + `10.1.0.254@o2ib1` and the server `10.1.0.2@o2ib1`
//! on their own 127.152.x.y addresses, so that the restarted router binds the addresses its
//! predecessor had. Gateway health is checked every second.
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
/// Credits on the server's net (the server's NI and the router's NI there). Every client's
/// traffic to the server crosses the one router-server connection, and the server shares the
/// swarm's thread with the clients, so it takes in a batch only once per swarm turn (every
/// several milliseconds at 1,000 clients): with o2iblnd's default of 8 that connection carries
/// about 1,100 messages a second (measured: the router's tiny buffers ran out and clients'
/// pings starved), a quarter of what 1,000 clients pinging both ways each second need. Sites
/// raise peer_credits on routers and servers for the same reason.
const SERVER_SIDE_CREDITS: u32 = 128;

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
        // More than the pings one timeout spans: a ping lost with the router (it fails at its
        // 5 s timeout) does not hold back the next one.
        depth: 8,
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

/// One stream of pings: a client's to the server, or the server's to one client.
#[derive(Default)]
struct Pinger {
    /// The runtime that pings, and whom.
    from: usize,
    to: Option<Nid>,
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
    /// Counts a failure under its error with NIDs reduced to their nets (one line per kind).
    fn fail(&mut self, e: &router::LnetError) {
        let why: Vec<String> = e
            .to_string()
            .split_whitespace()
            .map(|w| match w.split_once('@') {
                Some((_, net)) => format!("*@{net}"),
                None => w.to_string(),
            })
            .collect();
        *self.failed.entry(why.join(" ")).or_default() += 1;
    }

    fn failed_total(&self) -> u64 {
        self.failed.values().sum()
    }
}

/// The swarm: every client's runtime and the server's on this thread, and their pings. The
/// server pings every client back, so that after the restart the router has traffic for the
/// clients too and connects to them while they connect to it (LU-7646's races).
struct Clients {
    swarm: Swarm<TcpFabric>,
    /// Pinger `i` < n: client `i` to the server; `n + i`: the server to client `i`.
    pingers: Vec<Pinger>,
    /// Which pinger each outstanding ping is, by (runtime, ping).
    owner: HashMap<(usize, PingId), usize>,
    clients: usize,
    tally: Tally,
    /// Pings are started (else only finished).
    pinging: bool,
    interval: StdDuration,
    depth: usize,
    restart: Option<StdInstant>,
    /// The most connections any node had to one peer at once (2: one zombie beside the live
    /// connection).
    peak_conns_per_peer: usize,
}

/// A node of the swarm: one NI on `listen`, one route to the other net through `gateway`.
fn swarm_node(
    me: Nid,
    incarnation: u64,
    listen: SocketAddr,
    gateway: &str,
    peers: &Arc<Mutex<HashMap<Nid, SocketAddr>>>,
) -> Result<NiRuntime<TcpFabric>, String> {
    let resolver_peers = Arc::clone(peers);
    let resolver = move |n: Nid| resolver_peers.lock().ok()?.get(&n).copied();
    let tcp = TcpConfig {
        busy_poll: StdDuration::ZERO,
        ring_entries: 64,
        ..TcpConfig::default()
    };
    let fabric = TcpFabric::bind_with(listen, resolver, tcp)
        .map_err(|e| format!("{me}: cannot bind {listen}: {e}"))?;
    if let Ok(mut p) = peers.lock() {
        p.insert(me, fabric.local_addr());
    }
    let clock = MonotonicClock::new();
    let mut ni = NiConfig::new(me, incarnation);
    if me.net() == nid(SERVER).net() {
        // The server's side: one connection to the router carries every client's traffic.
        ni.peer_credits = SERVER_SIDE_CREDITS;
        ni.tunables.peer_credits = SERVER_SIDE_CREDITS as u16;
        ni.credits = ni.credits.max(SERVER_SIDE_CREDITS * 4);
    }
    let mut cfg = NodeConfig::new(vec![ni]);
    let gateway = nid(gateway);
    cfg.routes = vec![RouteConfig {
        net: if me.net() == gateway.net() {
            nid(if gateway == nid(ROUTER_A) {
                ROUTER_B
            } else {
                ROUTER_A
            })
            .net()
        } else {
            gateway.net()
        },
        gateway,
        hops: Some(1),
        priority: 0,
    }];
    cfg.gateway_health = GatewayHealthConfig {
        check_interval: Duration::from_secs(1),
        ping_timeout: Duration::from_secs(1),
        ..cfg.gateway_health
    };
    let node = LnetNode::new(cfg, clock.now());
    let (rt, _wake) =
        NiRuntime::new(node, fabric, clock).map_err(|e| format!("{me}: waker: {e}"))?;
    Ok(rt)
}

impl Clients {
    fn new(
        opts: &Opts,
        server_addr: SocketAddr,
        peers: &Arc<Mutex<HashMap<Nid, SocketAddr>>>,
    ) -> Result<Clients, String> {
        let n = opts.clients;
        let mut runtimes = Vec::with_capacity(n + 1);
        let t0 = StdInstant::now();
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        for i in 0..n {
            runtimes.push(swarm_node(
                client_nid(i),
                0x570_0000 + i as u64,
                any,
                ROUTER_A,
                peers,
            )?);
        }
        runtimes.push(swarm_node(
            nid(SERVER),
            0x570_0000 + n as u64,
            server_addr,
            ROUTER_B,
            peers,
        )?);
        eprintln!(
            "INFO {n} clients and the server bound in {:.2} s",
            t0.elapsed().as_secs_f64()
        );
        let swarm = Swarm::new(runtimes).map_err(|e| format!("swarm: {e}"))?;
        let pingers = (0..n)
            .map(|i| Pinger {
                from: i,
                to: Some(nid(SERVER)),
                ..Pinger::default()
            })
            .chain((0..n).map(|i| Pinger {
                from: n,
                to: Some(client_nid(i)),
                ..Pinger::default()
            }))
            .collect();
        Ok(Clients {
            swarm,
            pingers,
            owner: HashMap::new(),
            clients: n,
            tally: Tally::default(),
            pinging: true,
            interval: opts.interval,
            depth: opts.depth,
            restart: None,
            peak_conns_per_peer: 0,
        })
    }

    /// One turn of the swarm; then every finished ping is recorded and due ones are started.
    fn turn(&mut self) -> Result<(), String> {
        self.swarm
            .turn(StdDuration::from_millis(20))
            .map_err(|e| format!("swarm: {e}"))?;
        let wall = StdInstant::now();
        for (r, rt) in self.swarm.runtimes_mut().iter_mut().enumerate() {
            while let Some(ev) = rt.node_mut().poll_event() {
                match ev {
                    LnetEvent::PingDone { id, result, .. } => {
                        let Some(k) = self.owner.remove(&(r, id)) else {
                            continue;
                        };
                        let p = &mut self.pingers[k];
                        let Some(j) = p.outstanding.iter().position(|o| o.0 == id) else {
                            continue;
                        };
                        let (_, started) = p.outstanding.swap_remove(j);
                        match result {
                            Ok(_) => {
                                self.tally.ok += 1;
                                p.last_ok_started = Some(started);
                                if self.restart.is_some_and(|r| started >= r)
                                    && p.recovered_at.is_none()
                                {
                                    p.recovered_at = Some(wall);
                                }
                            }
                            Err(e) => self.tally.fail(&e),
                        }
                    }
                    LnetEvent::Put { payload, .. } => rt.node_mut().recycle(payload),
                    _ => {}
                }
            }
        }
        if !self.pinging {
            return Ok(());
        }
        let n = self.clients;
        let runtimes = self.swarm.runtimes_mut();
        for (k, p) in self.pingers.iter_mut().enumerate() {
            let Some(to) = p.to else {
                continue;
            };
            if p.outstanding.len() >= self.depth {
                continue;
            }
            // The first pings are spread over one interval.
            let due = *p
                .next_ping
                .get_or_insert(wall + self.interval.mul_f64((k % n) as f64 / n as f64));
            if wall < due {
                continue;
            }
            p.next_ping = Some(wall + self.interval);
            let rt = &mut runtimes[p.from];
            let now = rt.now();
            self.tally.started += 1;
            match rt.node_mut().ping(now, to, PING_TIMEOUT) {
                Ok(id) => {
                    p.outstanding.push((id, wall));
                    self.owner.insert((p.from, id), k);
                }
                Err(e) => self.tally.fail(&e),
            }
        }
        Ok(())
    }

    /// Why streams never answered: the failures by reason, and for the first few such streams
    /// what their pinging node sees (its gateways, its peer and LND state for the next hop).
    fn explain_unanswered(&self) {
        self.explain(|p| p.last_ok_started.is_none());
    }

    fn explain(&self, stuck: impl Fn(&Pinger) -> bool) {
        eprintln!(
            "pings started {} ok {} failed {:?}",
            self.tally.started, self.tally.ok, self.tally.failed
        );
        let runtimes = self.swarm.runtimes();
        for p in self.pingers.iter().filter(|p| stuck(p)).take(5) {
            let node = runtimes[p.from].node();
            let to = p.to.map(|n| n.to_string()).unwrap_or_default();
            eprintln!(
                "  stream {} -> {to}: outstanding {}, gateways {:?}",
                node.nids()[0],
                p.outstanding.len(),
                node.gateways()
            );
            for peer in node.peers().iter().take(3) {
                eprintln!("    peer {peer:?}");
            }
            if let Some(ep) = node.endpoint(NiIndex(0)) {
                for c in ep.conns().take(4) {
                    eprintln!("    conn {c:?}");
                }
            }
        }
    }

    /// The most connections any one node of the swarm has to one peer now.
    fn sample_conns(&mut self) {
        for rt in self.swarm.runtimes() {
            if let Some(ep) = rt.node().endpoint(NiIndex(0)) {
                let mut per: HashMap<Nid, usize> = HashMap::new();
                for c in ep.conns() {
                    *per.entry(c.peer).or_default() += 1;
                }
                let k = per.into_values().max().unwrap_or(0);
                self.peak_conns_per_peer = self.peak_conns_per_peer.max(k);
            }
        }
    }

    /// (most CONN_RACE rejects any node received, most races any node counted)
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
        self.pingers
            .iter()
            .all(|p| p.last_ok_started.is_some_and(|s| s >= t))
    }

    fn outstanding(&self) -> usize {
        self.pingers.iter().map(|p| p.outstanding.len()).sum()
    }

    /// When client `i` had recovered both ways.
    fn recovered(&self, i: usize) -> Option<StdInstant> {
        let up = self.pingers[i].recovered_at?;
        let down = self.pingers[self.clients + i].recovered_at?;
        Some(up.max(down))
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

/// The router's YAML: its NIs, routing on, and the peers' addresses.
fn router_yaml(
    nis: &[(&str, SocketAddr)],
    busy_poll_us: u64,
    peers: &[(Nid, SocketAddr)],
) -> String {
    let mut y = String::from("net:\n");
    for (n, a) in nis {
        let net = n.split('@').nth(1).unwrap_or("o2ib");
        y.push_str(&format!(
            "    - net type: {net}\n      fabric: tcp\n      local NI(s):\n        - nid: {n}\n          listen: {a}\n          busy poll us: {busy_poll_us}\n"
        ));
        if *n == ROUTER_B {
            y.push_str(&format!(
                "          tunables:\n              peer_credits: {SERVER_SIDE_CREDITS}\n              credits: {}\n",
                SERVER_SIDE_CREDITS * 4
            ));
        }
    }
    y.push_str("routing:\n    enable: 1\npeers:\n");
    for (n, a) in peers {
        y.push_str(&format!("    - nid: {n}\n      address: {a}\n"));
    }
    y
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
    if let Ok(mut p) = peers.lock() {
        p.insert(nid(ROUTER_B), rb_addr);
    }
    let mut clients = Clients::new(opts, server_addr, &peers)?;
    let mut router_peers: Vec<(Nid, SocketAddr)> = (0..opts.clients)
        .filter_map(|i| {
            let n = client_nid(i);
            Some((n, *peers.lock().ok()?.get(&n)?))
        })
        .collect();
    router_peers.push((nid(SERVER), server_addr));
    let router_yaml = router_yaml(
        &[(ROUTER_A, ra_addr), (ROUTER_B, rb_addr)],
        opts.router_busy_poll_us,
        &router_peers,
    );
    let mut router = Daemon::start(&opts.router, &dir, "router", &router_yaml)?;
    eprintln!(
        "INFO router up; {} clients and the server pinging each other",
        opts.clients
    );

    let mut router_peak = 0;
    let t_start = StdInstant::now();
    let Some(healthy) = run_until(&mut clients, opts.bound, None, &mut router_peak, |c| {
        c.all_healthy_since(t_start)
    })?
    else {
        let n = clients
            .pingers
            .iter()
            .filter(|c| c.last_ok_started.is_none())
            .count();
        clients.explain_unanswered();
        if let Ok(r) = router.call(&Request::RoutingShow) {
            eprintln!("router: {r:?}");
        }
        return Err(format!(
            "{n} of {} ping streams (clients to the server and back) never answered within {:?}",
            2 * opts.clients,
            opts.bound
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
    let in_flight = clients.outstanding();
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
        |c| (0..c.clients).all(|i| c.recovered(i).is_some()),
    )?;
    let mut times: Vec<f64> = (0..clients.clients)
        .filter_map(|i| clients.recovered(i))
        .map(|t| t.duration_since(t_restart).as_secs_f64())
        .collect();
    times.sort_by(f64::total_cmp);
    let unrecovered = opts.clients - times.len();
    if unrecovered > 0 {
        clients.explain(|p| p.recovered_at.is_none());
    }
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
        |c| c.outstanding() == 0,
    )?;
    let outstanding = clients.outstanding() as u64;
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
        "FIGURE storm_races max_conn_race_rejects_per_node={race_rejects} max_races_per_node={races} limit={RACE_LIMIT}"
    );
    println!(
        "FIGURE storm_conns max_conns_per_peer_in_swarm={} max_conns_per_peer_at_router={router_peak}",
        clients.peak_conns_per_peer
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
    println!(
        "FIGURE storm_swarm_peak_rss_kib {}",
        ulnet_tests::peak_rss_kib().unwrap_or(0)
    );

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
    if clients.peak_conns_per_peer > 2 || router_peak > 2 {
        fail("a peer had more than one zombie".into());
    }
    match books {
        Some(f) if f.received == f.forwarded + f.dropped + f.in_flight => {}
        other => fail(format!("the router's books do not reconcile: {other:?}")),
    }
    drop(router);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ok)
}
