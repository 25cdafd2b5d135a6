//! LNet over the tcp fabric on loopback between two processes, as between two daemons: this
//! process runs node A (the client, `10.0.0.1@o2ib`) and starts itself again with `--serve` as
//! node B (the server, `10.0.0.2@o2ib`); each has its own [`LnetNode`] and [`TcpFabric`] on an
//! ephemeral 127.0.0.1 port and runs the same loop shape as `lnet-router` (apply actions, poll
//! the fabric, process, timers). B prints `LISTEN <addr>` when bound, serves until its stdin
//! closes, shuts down gracefully and prints `RECEIVED <n>`: A checks that every PUT it saw
//! complete was received (nothing lost).
//!
//!     cargo run --release -p benches --bin lnet_perf -- --rtt 20000
//!     cargo run --release -p benches --bin lnet_perf -- --put-rate 10
//!
//! `--rtt N`: N sequential LNet pings (GET/REPLY round trips) from A to B after a warm-up;
//! prints `FIGURE ulnet_ping_rtt usec median=.. p99=.. min=..`.
//!
//! `--put-rate SECS`: a one-way stream of 64-byte PUTs from A to B for SECS seconds, with up to
//! `--window` (default 256) PUTs outstanding at A (LNet's peer and NI credits bound what is
//! actually in the LND; the rest waits in LNet's queues); the rate is the PUTs completed at A in
//! the measured window (a PUT completes when B's LND has it; the LND credits keep at most
//! peer_credits of them between A's completion and B's receipt); prints
//! `FIGURE ulnet_put64_rate msgs/s value=..`.
//!
//! `--bulk-put SECS` / `--bulk-get SECS`: bulk data by RDMA rendezvous (the LND's PUT_REQ /
//! PUT_ACK / write / PUT_DONE, or GET_REQ / write / GET_DONE) for SECS seconds: A keeps up to
//! `--window` (default 8) transfers of `--size` bytes (default 1 MiB) outstanding between its
//! registered memory and B's, where B keeps twice that many sinks (PUT) or sources (GET)
//! posted, reposting each as it is used; prints `FIGURE ulnet_bulk_put_<size> MiB/s value=..`
//! (or `bulk_get`), counted at A from completions, and B's bytes must agree. At the end A checks
//! the last transferred buffer byte for byte (GET: in its own memory; PUT: B checks its sink).
//!
//! `--via-router BIN`: the same through a router: the `lnet-router` daemon at BIN (a third
//! process) with NIs on o2ib and o2ib1; A is on o2ib, B on o2ib1, each with a route through it.
//! `--clients N`: N client nodes in A's process (`10.0.0.1@o2ib`, `.2`, ...; B is `.250`), each
//! its own thread and fabric, each pinging or streaming as above; the RTT figure is over every
//! client's samples, the rate their sum. At the end: `FIGURE cpu_seconds client=.. server=..
//! router=..` (user + system time of each process over the whole run), and with a router
//! `FIGURE router_books received=.. forwarded=.. dropped=.. in_flight=..` (its counters after
//! the run; exit 1 if they do not reconcile). `--router-arg ARG` passes ARG to the router;
//! `--router-conns-per-peer N` gives its NIs o2iblnd's `conns_per_peer` (default 1).
//! `--server-peer-credits C` gives B and the router's NIs peer_credits C (as a site tunes its
//! servers and routers), the clients keeping `--peer-credits`; a connection's queue depth is
//! its active side's, so client connections stay at the clients' credits.
//! `--stall-server SECS` (put-rate): B is stopped (SIGSTOP) for SECS once the stream runs, with
//! a `SAMPLE stall` line every 250 ms (PUTs completed at the clients, the router's RSS and held
//! messages) and `FIGURE router_rss_kib`; then B continues and the rate is measured.
//!
//! `--attackers N` (routed bulk modes): N more nodes in A's process (`10.0.3.1@o2ib`, ...,
//! in the router's peers like the clients), all on one extra thread, each on its own tcp fabric
//! behind a driver that swallows its RDMA writes and its PUT_DONEs and reports them done: the
//! router's grants to them are never filled. From `--attack-after SECS` into the measured
//! window (default a third of it) each keeps one 1 MiB bulk PUT to B outstanding, sending the
//! next as soon as the last ends, whatever its result. Prints the rate before the attack and
//! during it (`FIGURE ulnet_bulk_put_under_attack MiB/s value=..`), their ratio, a `SAMPLE
//! attack` line every 500 ms, and the router's defence counters when the window ends
//! (`FIGURE router_attack_counters`: routing show's bulk_stalled, bulk_refused,
//! waited_unproven; net show -v's grants_reclaimed on its o2ib NI). `--router-large N` sets the
//! router's pool of large buffers (`buffers: large:`), so that the attackers can press on it.
//!
//! `--net tcp` (or `--client-net tcp` / `--server-net tcp` for one side of a routed run): the
//! nodes on that net run socklnd (ksocklnd's wire) over the io_uring socket driver instead of
//! o2iblnd over the tcp fabric, as a daemon's `net type: tcp` NI does: NIDs `127.0.1.N@tcp`
//! (`127.0.2.N@tcp1` behind the router), each node listening on its NID's address at one
//! acceptor port A picks (`--accept-port`), unprivileged (`accept: all`, any source port).
//! `--zero-copy` sends socklnd's bulk payloads with IORING_OP_SEND_ZC (`SocketConfig::zero_copy`).
//!
//! Other options: `--warmup N` (pings before measuring, default 1000), `--window W`,
//! `--peer-credits C` (LNet and LND peer credits, default LNet's 8), `--payload BYTES` (default
//! 64), `--busy-poll-us US` (the tcp fabric's busy-poll budget, default 50). Each node thread runs its own loop: apply the node's actions to its fabric, poll the
//! fabric with a short timeout, run timers when due, drain events. Results come back to the main
//! thread over channels; both nodes shut down gracefully at the end (bounded), and the main
//! thread gives up (exit 1) if a phase overruns its time bound.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use lnd::driver::tcp::{MonotonicClock, TcpFabric};
use lnd::driver::LndDriver;
use lnd::time::Duration;
use lnd::wire::Nid;
use router::runtime::NiRuntime;
use router::{
    LnetError, LnetEvent, LnetNode, NiConfig, NiIndex, NodeConfig, RouteConfig,
    DEFAULT_PEER_CREDITS,
};

/// Longest single wait in a node loop (stop flags are looked at least this often).
mod bulk;
mod processes;
use bulk::*;
use processes::*;

const MAX_WAIT: StdDuration = StdDuration::from_millis(2);
/// Bound on a graceful shutdown.
const SHUTDOWN_BOUND: StdDuration = StdDuration::from_secs(5);
/// Per-ping timeout.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// The portal the benchmark PUTs go to (any non-reserved portal).
const BENCH_PORTAL: u32 = 4;
/// The router's NIDs on the clients' net and on the server's.
/// The router's host number on either side (`10.0.0.254@o2ib`, `127.0.2.254@tcp1`).
const ROUTER_HOST: usize = 254;
/// The server's host number (`10.0.0.250@o2ib` direct, `10.1.0.250@o2ib1` behind a router).
const SERVER_HOST: usize = 250;

/// Which LND a side of the run speaks: o2iblnd over ulnet's o2ib-over-TCP fabric, or ksocklnd's
/// wire over the socket driver (`--net`, `--client-net`, `--server-net`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum NetKind {
    O2ib,
    Tcp,
}

/// Side 0: the clients' net (and the server's when direct); side 1: the server's net behind a
/// router.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Side {
    Clients,
    Server,
}

impl NetKind {
    fn parse(s: &str) -> Option<NetKind> {
        match s {
            "o2ib" => Some(NetKind::O2ib),
            "tcp" => Some(NetKind::Tcp),
            _ => None,
        }
    }

    /// Its name on the command line (and its net type).
    fn name(self) -> &'static str {
        match self {
            NetKind::O2ib => "o2ib",
            NetKind::Tcp => "tcp",
        }
    }

    /// The net's name: `o2ib`/`tcp` on the clients' side, `o2ib1`/`tcp1` behind the router.
    fn net(self, side: Side) -> String {
        let base = self.name();
        match side {
            Side::Clients => base.to_string(),
            Side::Server => format!("{base}1"),
        }
    }

    /// NID `host` on `side`: o2ib NIDs in 10.x (the tcp fabric resolves them through the
    /// peers table); tcp NIDs on a 127.0.x.y address of their own, since ksocklnd dials the
    /// NID's address at the shared acceptor port (as kernel nodes share 988).
    fn nid(self, side: Side, host: usize) -> Nid {
        let prefix = match (self, side) {
            (NetKind::O2ib, Side::Clients) => "10.0.0",
            (NetKind::O2ib, Side::Server) => "10.1.0",
            (NetKind::Tcp, Side::Clients) => "127.0.1",
            (NetKind::Tcp, Side::Server) => "127.0.2",
        };
        nid(&format!("{prefix}.{host}@{}", self.net(side)))
    }
}

/// The router's NID on the clients' net.
fn router_a(opts: &Opts) -> Nid {
    opts.client_net.nid(Side::Clients, ROUTER_HOST)
}

/// The router's NID on the server's net.
fn router_b(opts: &Opts) -> Nid {
    opts.server_net.nid(Side::Server, ROUTER_HOST)
}

/// Who a node thread is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Role {
    Client(usize),
    Server,
}

/// Client `i`'s NID.
fn client_nid(opts: &Opts, i: usize) -> Nid {
    opts.client_net.nid(Side::Clients, i + 1)
}

/// The server's NID: on the clients' net, or behind the router on the server's.
fn server_nid(opts: &Opts) -> Nid {
    if opts.routed {
        opts.server_net.nid(Side::Server, SERVER_HOST)
    } else {
        opts.client_net.nid(Side::Clients, SERVER_HOST)
    }
}

#[derive(Copy, Clone, Debug)]
enum Mode {
    Rtt(usize),
    PutRate(f64),
    /// Bulk transfers for this many seconds; GETs if `get`, else PUTs.
    Bulk {
        secs: f64,
        get: bool,
    },
}

impl Mode {
    /// A streaming mode: A reports `Streaming`, then `PutsDone`.
    fn streams(self) -> bool {
        matches!(self, Mode::PutRate(_) | Mode::Bulk { .. })
    }
}

#[derive(Clone, Debug)]
struct Opts {
    mode: Mode,
    warmup: usize,
    window: usize,
    peer_credits: u32,
    payload: usize,
    max_wait: StdDuration,
    /// Run as node B (started by A).
    serve: bool,
    /// The tcp fabric's busy-poll budget (`TcpConfig::busy_poll`).
    busy_poll: StdDuration,
    /// `--via-router BIN`: route through this `lnet-router` binary.
    router: Option<PathBuf>,
    /// B: it sits behind a router (started with `--routed`).
    routed: bool,
    /// Client nodes in A's process.
    clients: usize,
    /// The router's NIs' busy-poll budget (default: the same as the nodes').
    router_busy_poll: Option<StdDuration>,
    /// `--router-conns-per-peer N`: the router's NIs open N connections to each peer
    /// (o2iblnd's conns_per_peer; default 1).
    router_conns_per_peer: u16,
    /// `--server-peer-credits C`: peer_credits of B and of the router's NIs (the servers and
    /// routers a site tunes), the clients keeping `--peer-credits`.
    server_peer_credits: Option<u32>,
    /// `--router-arg ARG` (repeatable): more arguments for the router daemon.
    router_args: Vec<String>,
    /// `--router-scrub auto|on|off`: the router's `buffers: scrub:` (its large buffers zeroed
    /// before they are lent again; default auto, which on tcp scrubs nothing).
    router_scrub: Option<String>,
    /// `--router-large N`: the router's `buffers: large:` (its pool of large buffers, which
    /// the attackers of `--attackers` try to drain).
    router_large: Option<u32>,
    /// `--via-relay BIN`: A reaches B through this `tcp_relay` (a byte-stream relay; same net,
    /// no router): the ceiling a forwarding process reaches with ulnet's own endpoints.
    relay: Option<PathBuf>,
    /// `--relay-arg ARG` (repeatable): more arguments for the relay (`--spin`).
    relay_args: Vec<String>,
    /// `--stall-server SECS` (put-rate): B is stopped (SIGSTOP) this long once the stream
    /// runs, then continued, before the rate is measured.
    stall_server: Option<StdDuration>,
    /// Bulk transfer size (`--size`).
    size: u32,
    /// B: keep sinks and sources of `size` posted (bulk modes; started with `--bulk-serve`).
    bulk_serve: bool,
    /// `--attackers N`: hostile nodes that never fill the router's grants (routed bulk).
    attackers: usize,
    /// `--attack-after SECS`: when, into the measured window, the attack starts (default a
    /// third of the window).
    attack_after: Option<f64>,
    /// `--client-net KIND` / `--server-net KIND` (`--net KIND`: both): the LND of the clients'
    /// net and of the server's (behind the router; direct, both must be the same).
    client_net: NetKind,
    server_net: NetKind,
    /// The acceptor port of every tcp NI (ksocklnd's `accept_port`, shared by all the nodes
    /// as 988 is; A picks a free one and hands it to B and the router).
    accept_port: u16,
    /// `--zero-copy`: the socket driver sends bulk payloads with IORING_OP_SEND_ZC
    /// (`SocketConfig::zero_copy`).
    zero_copy: bool,
}

impl Opts {
    /// Some node of the run is on a tcp net.
    fn any_tcp(&self) -> bool {
        self.client_net == NetKind::Tcp || (self.routed && self.server_net == NetKind::Tcp)
    }
}

/// The end of a streaming client: once main asks it to stop (`stop_client`) it starts nothing
/// new and waits at most `grace` for what it has outstanding.
struct Drain {
    grace: StdDuration,
    deadline: Option<StdInstant>,
}

impl Drain {
    fn new(grace: StdDuration) -> Self {
        Drain {
            grace,
            deadline: None,
        }
    }

    /// Whether the client was told to stop; the first time it is, the grace period starts.
    fn stopping(&mut self, shared: &Shared) -> bool {
        let stopping = shared.stop_client.load(Ordering::Relaxed);
        if stopping && self.deadline.is_none() {
            self.deadline = Some(StdInstant::now() + self.grace);
        }
        stopping
    }

    /// Whether the stream is over: told to stop, and nothing is outstanding (`idle`) or the
    /// grace period is spent.
    fn over(&self, idle: bool) -> bool {
        self.deadline
            .is_some_and(|dl| idle || StdInstant::now() >= dl)
    }
}

/// State the node threads and the main thread see.
struct Shared {
    /// Where each NID listens (the fabrics' resolver): each node adds its own once bound; main
    /// adds the server's and the router's.
    peers: Mutex<HashMap<Nid, SocketAddr>>,
    /// The clients may start (their peers' addresses are known).
    go: AtomicBool,
    /// Main asks A to stop its PUT stream (or, on a failure, everything to stop).
    stop_client: AtomicBool,
    /// Main asks B to stop, once A is done (so that A's last PUTs still find B up).
    stop: AtomicBool,
    /// PUTs B received (in B's process) or A saw complete (in A's).
    received: AtomicU64,
    /// The attackers may start their PUTs.
    attack: AtomicBool,
    /// The attackers' bulk PUTs: started, ended done (at the attacker: its LND believes it
    /// wrote), ended failed (refused, reclaimed, connection lost), not started (no route yet).
    attack_sent: AtomicU64,
    attack_done: AtomicU64,
    attack_failed: AtomicU64,
    attack_unsent: AtomicU64,
}

/// What the node threads tell the main thread.
enum Report {
    /// A's warm-up is over and the PUT stream runs.
    Streaming,
    /// A finished its RTT samples (nanoseconds each).
    Rtt(Vec<u64>),
    /// A stopped streaming.
    PutsDone { sent: u64, done: u64, errors: u64 },
    /// A node thread failed.
    Failed(String),
}

fn nid(s: &str) -> Nid {
    s.parse().expect("a valid NID")
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: lnet_perf (--rtt N | --put-rate SECS | --bulk-put SECS | --bulk-get SECS) \
         [--size BYTES] [--warmup N] [--window W] \
         [--peer-credits C] [--payload BYTES] [--max-wait-us US] [--busy-poll-us US] \
         [--clients N] [--via-router LNET_ROUTER_BIN [--router-busy-poll-us US] \
         [--router-conns-per-peer N] [--router-scrub auto|on|off] [--router-large N] [--server-peer-credits C] \
         [--router-arg ARG]...] [--via-relay TCP_RELAY_BIN [--relay-arg ARG]...] \
         [--stall-server SECS] [--attackers N [--attack-after SECS]] \
         [--net o2ib|tcp] [--client-net o2ib|tcp] [--server-net o2ib|tcp] [--zero-copy]"
    );
    ExitCode::from(2)
}

fn parse_args() -> Option<Opts> {
    parse_args_from(std::env::args().skip(1).collect())
}

fn parse_args_from(args: Vec<String>) -> Option<Opts> {
    let mut mode = None;
    let mut opts = Opts {
        mode: Mode::Rtt(0),
        warmup: 1000,
        window: 256,
        peer_credits: DEFAULT_PEER_CREDITS,
        payload: 64,
        max_wait: MAX_WAIT,
        serve: false,
        busy_poll: lnd::driver::tcp::TcpConfig::default().busy_poll,
        router: None,
        routed: false,
        clients: 1,
        router_busy_poll: None,
        router_conns_per_peer: 1,
        router_scrub: None,
        router_large: None,
        server_peer_credits: None,
        router_args: Vec::new(),
        relay: None,
        relay_args: Vec::new(),
        stall_server: None,
        size: 1 << 20,
        bulk_serve: false,
        attackers: 0,
        attack_after: None,
        client_net: NetKind::O2ib,
        server_net: NetKind::O2ib,
        accept_port: 0,
        zero_copy: false,
    };
    let mut window = None;
    let mut server_net = None;
    let mut i = 0;
    while i < args.len() {
        let val = args.get(i + 1);
        match args[i].as_str() {
            "--rtt" => mode = Some(Mode::Rtt(val?.parse().ok().filter(|&n| n > 0)?)),
            "--put-rate" => {
                mode = Some(Mode::PutRate(
                    val?.parse()
                        .ok()
                        .filter(|&s: &f64| s > 0.0 && s <= 3600.0)?,
                ))
            }
            "--bulk-put" | "--bulk-get" => {
                mode = Some(Mode::Bulk {
                    secs: val?
                        .parse()
                        .ok()
                        .filter(|&s: &f64| s > 0.0 && s <= 3600.0)?,
                    get: args[i] == "--bulk-get",
                })
            }
            "--size" => {
                opts.size = val?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0 && n <= lnd::wire::lnet::LNET_MTU)?
            }
            "--bulk-serve" => {
                opts.bulk_serve = true;
                i += 1;
                continue;
            }
            "--warmup" => opts.warmup = val?.parse().ok()?,
            "--window" => window = Some(val?.parse().ok().filter(|&w| w > 0)?),
            "--peer-credits" => opts.peer_credits = val?.parse().ok().filter(|&c| c > 0)?,
            "--payload" => opts.payload = val?.parse().ok()?,
            "--max-wait-us" => opts.max_wait = StdDuration::from_micros(val?.parse().ok()?),
            "--busy-poll-us" => opts.busy_poll = StdDuration::from_micros(val?.parse().ok()?),
            "--clients" => opts.clients = val?.parse().ok().filter(|&n| (1..=200).contains(&n))?,
            "--via-router" => opts.router = Some(PathBuf::from(val?)),
            "--router-busy-poll-us" => {
                opts.router_busy_poll = Some(StdDuration::from_micros(val?.parse().ok()?))
            }
            "--router-arg" => opts.router_args.push(val?.clone()),
            "--via-relay" => opts.relay = Some(PathBuf::from(val?)),
            "--relay-arg" => opts.relay_args.push(val?.clone()),
            "--server-peer-credits" => {
                opts.server_peer_credits = Some(val?.parse().ok().filter(|&c| c > 0)?)
            }
            "--router-scrub" => {
                opts.router_scrub =
                    Some(val?.clone()).filter(|s| ["auto", "on", "off"].contains(&s.as_str()))
            }
            "--router-large" => opts.router_large = Some(val?.parse().ok().filter(|&n| n > 0)?),
            "--router-conns-per-peer" => {
                opts.router_conns_per_peer = val?.parse().ok().filter(|n| (1..=127).contains(n))?
            }
            "--stall-server" => {
                opts.stall_server = Some(StdDuration::from_secs_f64(
                    val?.parse().ok().filter(|&s: &f64| s > 0.0 && s <= 600.0)?,
                ))
            }
            "--attackers" => {
                opts.attackers = val?.parse().ok().filter(|&n| (1..=250).contains(&n))?
            }
            "--attack-after" => {
                opts.attack_after = Some(val?.parse().ok().filter(|&s: &f64| s > 0.0)?)
            }
            "--routed" => {
                opts.routed = true;
                i += 1;
                continue;
            }
            "--zero-copy" => {
                opts.zero_copy = true;
                i += 1;
                continue;
            }
            "--net" => {
                opts.client_net = NetKind::parse(val?)?;
                server_net = server_net.or(Some(opts.client_net));
            }
            "--client-net" => opts.client_net = NetKind::parse(val?)?,
            "--server-net" => server_net = Some(NetKind::parse(val?)?),
            "--accept-port" => opts.accept_port = val?.parse().ok().filter(|&p| p > 0)?,
            "--serve" => {
                opts.serve = true;
                mode = mode.or(Some(Mode::Rtt(1)));
                i += 1;
                continue;
            }
            other => {
                eprintln!("lnet_perf: unknown argument '{other}'");
                return None;
            }
        }
        i += 2;
    }
    opts.mode = mode?;
    opts.server_net = server_net.unwrap_or(opts.client_net);
    opts.routed = opts.routed || opts.router.is_some();
    if !opts.routed && opts.server_net != opts.client_net {
        eprintln!("lnet_perf: the server is on the clients' net unless routed (--via-router)");
        return None;
    }
    if opts.any_tcp() && opts.relay.is_some() {
        // ksocklnd dials the NID's own address: a relay cannot stand in for the server.
        eprintln!("lnet_perf: --via-relay is for o2ib nets");
        return None;
    }
    if opts.attackers > 0 && opts.client_net != NetKind::O2ib {
        eprintln!("lnet_perf: --attackers are o2ib clients (--client-net o2ib)");
        return None;
    }
    if opts.attackers > 0 && (opts.router.is_none() || !matches!(opts.mode, Mode::Bulk { .. })) {
        eprintln!("lnet_perf: --attackers needs a routed bulk mode (--via-router, --bulk-*)");
        return None;
    }
    if let (Some(after), Mode::Bulk { secs, .. }) = (opts.attack_after, opts.mode) {
        if after >= secs {
            eprintln!("lnet_perf: --attack-after must be within the measured window");
            return None;
        }
    }
    // Bulk keeps few large transfers in flight; small messages many.
    let bulk = matches!(opts.mode, Mode::Bulk { .. }) || opts.bulk_serve;
    opts.window = window.unwrap_or(if bulk { 8 } else { opts.window });
    Some(opts)
}

fn main() -> ExitCode {
    let Some(mut opts) = parse_args() else {
        return usage();
    };
    if opts.any_tcp() && opts.accept_port == 0 {
        match free_port() {
            Ok(p) => opts.accept_port = p,
            Err(e) => {
                eprintln!("lnet_perf: no free acceptor port: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let shared = Arc::new(Shared {
        peers: Mutex::new(HashMap::new()),
        go: AtomicBool::new(false),
        stop_client: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        received: AtomicU64::new(0),
        attack: AtomicBool::new(false),
        attack_sent: AtomicU64::new(0),
        attack_done: AtomicU64::new(0),
        attack_failed: AtomicU64::new(0),
        attack_unsent: AtomicU64::new(0),
    });
    if opts.serve {
        return serve_main(&opts, &shared);
    }
    let mut server = match Server::start(&opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lnet_perf: cannot start node B: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut relay = None;
    if let Some(bin) = &opts.relay {
        if opts.router.is_some() {
            eprintln!("lnet_perf: --via-relay and --via-router exclude each other");
            return ExitCode::from(2);
        }
        match Relay::start(bin, &opts.relay_args, server.addr) {
            Ok(r) => {
                // A connects to the relay as if it were B; the relay connects on to B.
                shared.add_peer(server_nid(&opts), r.addr);
                relay = Some(r);
            }
            Err(e) => {
                eprintln!("lnet_perf: cannot start the relay: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        shared.add_peer(server_nid(&opts), server.addr);
    }
    let (tx, rx) = mpsc::channel::<Report>();
    let mut clients = Vec::new();
    for i in 0..opts.clients {
        match spawn_node(Role::Client(i), &opts, &shared, tx.clone()) {
            Ok(c) => clients.push(c),
            Err(e) => {
                eprintln!("lnet_perf: cannot start client {i}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    drop(tx);
    let attackers = if opts.attackers > 0 {
        match spawn_attackers(&opts, &shared) {
            Ok(h) => Some(h),
            Err(e) => {
                eprintln!("lnet_perf: cannot start the attackers: {e}");
                shared.stop_client.store(true, Ordering::Relaxed);
                shared.stop.store(true, Ordering::Relaxed);
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let mut router = None;
    if let Some(bin) = &opts.router {
        match Router::start(bin, &opts, &shared, &mut server) {
            Ok(r) => router = Some(r),
            Err(e) => {
                eprintln!("lnet_perf: cannot start the router: {e}");
                shared.stop_client.store(true, Ordering::Relaxed);
                shared.stop.store(true, Ordering::Relaxed);
                return ExitCode::FAILURE;
            }
        }
    }
    shared.go.store(true, Ordering::Relaxed);

    // A bound on every phase; a run that overruns exits without waiting for its threads.
    let recv = |bound: StdDuration| -> Result<Report, String> {
        match rx.recv_timeout(bound) {
            Ok(Report::Failed(e)) => Err(e),
            Ok(r) => Ok(r),
            Err(RecvTimeoutError::Timeout) => Err(format!("no result within {bound:?}")),
            Err(RecvTimeoutError::Disconnected) => Err("the node threads ended early".into()),
        }
    };
    let result = match opts.mode {
        Mode::Rtt(n) => {
            // Warm-up plus samples; generous for a slow machine (5 ms a ping), plus setup.
            let bound =
                StdDuration::from_secs(30) + StdDuration::from_millis(5) * (n + opts.warmup) as u32;
            let mut all = Vec::new();
            let mut r = Ok(());
            for _ in 0..opts.clients {
                match recv(bound) {
                    Ok(Report::Rtt(mut samples)) => all.append(&mut samples),
                    Ok(_) => r = Err("unexpected report".to_string()),
                    Err(e) => r = Err(e),
                }
                if r.is_err() {
                    break;
                }
            }
            r.map(|()| print_rtt(&all))
        }
        Mode::PutRate(secs) | Mode::Bulk { secs, .. } => measure_puts(
            &shared,
            secs,
            &opts,
            recv,
            server.child.id(),
            router.as_ref(),
        ),
    };
    shared.stop_client.store(true, Ordering::Relaxed);
    if let Err(e) = &result {
        shared.stop.store(true, Ordering::Relaxed);
        eprintln!("lnet_perf: {e}");
        // Do not wait for threads that may be stuck: the process exit closes every socket.
        return ExitCode::FAILURE;
    }
    // Every node shuts down gracefully (each bounded by SHUTDOWN_BOUND): the clients first,
    // then B (closing its stdin), which reports what it received, then the router.
    let mut ok = true;
    for (i, c) in clients.into_iter().enumerate() {
        match join_bounded(c, SHUTDOWN_BOUND + StdDuration::from_secs(5)) {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                eprintln!("lnet_perf: client {i}: {e}");
                ok = false;
            }
            None => {
                eprintln!("lnet_perf: client {i} did not stop in time");
                ok = false;
            }
        }
    }
    if let Some(h) = attackers {
        match join_bounded(h, SHUTDOWN_BOUND) {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                eprintln!("lnet_perf: attackers: {e}");
                ok = false;
            }
            None => eprintln!("WARN the attackers' thread did not stop in time"),
        }
    }
    if router.is_some() {
        // What the router still forwards reaches B before B stops.
        std::thread::sleep(StdDuration::from_millis(300));
    }
    let cpu_server = cpu_seconds(server.child.id());
    match server.stop(SHUTDOWN_BOUND + StdDuration::from_secs(5)) {
        Ok(received) => {
            let completed = shared.received.load(Ordering::Relaxed);
            eprintln!("INFO node B received {received} PUTs; the clients saw {completed} complete");
            if opts.mode.streams() && received != completed {
                eprintln!(
                    "lnet_perf: B received {received} PUTs but the clients saw {completed} complete"
                );
                ok = false;
            }
        }
        Err(e) => {
            eprintln!("lnet_perf: node B: {e}");
            ok = false;
        }
    }
    let cpu_router = router
        .as_ref()
        .map(|r| cpu_seconds(r.child.id()))
        .or_else(|| relay.as_ref().map(|r| cpu_seconds(r.child.id())));
    drop(relay);
    if let Some(r) = &router {
        // Every message the router accepted was forwarded or dropped with a reason.
        match r.books() {
            Ok(f) => {
                println!(
                    "FIGURE router_books received={} forwarded={} dropped={} in_flight={}",
                    f.received, f.forwarded, f.dropped, f.in_flight
                );
                if f.received != f.forwarded + f.dropped + f.in_flight {
                    eprintln!("lnet_perf: the router's books do not reconcile: {f:?}");
                    ok = false;
                }
            }
            Err(e) => {
                eprintln!("lnet_perf: router: {e}");
                ok = false;
            }
        }
    }
    if let Some(mut r) = router {
        if let Err(e) = r.stop() {
            eprintln!("lnet_perf: router: {e}");
            ok = false;
        }
    }
    println!(
        "FIGURE cpu_seconds client={:.2} server={:.2} router={}",
        cpu_seconds(std::process::id()),
        cpu_server,
        cpu_router.map_or("-".to_string(), |c| format!("{c:.2}"))
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

impl Shared {
    fn add_peer(&self, nid: Nid, addr: SocketAddr) {
        if let Ok(mut p) = self.peers.lock() {
            p.insert(nid, addr);
        }
    }

    fn peer(&self, nid: Nid) -> Option<SocketAddr> {
        self.peers.lock().ok()?.get(&nid).copied()
    }
}

/// A slow consumer: B stops (SIGSTOP: it neither reads nor returns credits) for `stall` while
/// the clients keep streaming. Prints a sample every 250 ms: the PUTs completed at the clients
/// (which must stop growing once credits run out), and the router's RSS and forwarding
/// counters (which must stay flat: held messages are bounded by its buffers and credits).
/// Then B continues.
fn stall_server(
    shared: &Shared,
    stall: StdDuration,
    server_pid: u32,
    router: Option<&Router>,
) -> Result<(), String> {
    let signal = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &server_pid.to_string()])
            .status()
            .map_err(|e| format!("kill {sig}: {e}"))
    };
    signal("-STOP")?;
    let t0 = StdInstant::now();
    let mut rss_max = 0;
    let mut rss_first = None;
    while t0.elapsed() < stall {
        let rss = router.map_or(0, |r| {
            ulnet_tests::proc_status_kib(&r.child.id().to_string(), "VmRSS").unwrap_or(0)
        });
        rss_max = rss_max.max(rss);
        let held = router
            .and_then(|r| r.books().ok())
            .map_or("-".to_string(), |f| {
                format!("received={} in_flight={}", f.received, f.in_flight)
            });
        println!(
            "SAMPLE stall t={:.2} client_completed={} router_rss_kib={rss} router {held}",
            t0.elapsed().as_secs_f64(),
            shared.received.load(Ordering::Relaxed),
        );
        if t0.elapsed() >= StdDuration::from_secs(1) {
            rss_first.get_or_insert(rss);
        }
        std::thread::sleep(StdDuration::from_millis(250));
    }
    signal("-CONT")?;
    if router.is_some() {
        println!(
            "FIGURE router_rss_kib during_stall after_1s={} max={rss_max}",
            rss_first.unwrap_or(rss_max)
        );
    }
    Ok(())
}

/// `--serve`: node B until stdin closes. A line `PEER <nid> <addr>` on stdin tells it where a
/// peer listens (the router, in routed mode).
fn serve_main(opts: &Opts, shared: &Arc<Shared>) -> ExitCode {
    let stop_on_eof = Arc::clone(shared);
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let mut w = line.split_whitespace();
            if let (Some("PEER"), Some(n), Some(a)) = (w.next(), w.next(), w.next()) {
                if let (Ok(n), Ok(a)) = (n.parse(), a.parse()) {
                    stop_on_eof.add_peer(n, a);
                }
            }
        }
        stop_on_eof.stop.store(true, Ordering::Relaxed);
    });
    let (tx, _rx) = mpsc::channel();
    let r = node_thread(Role::Server, opts, shared, &tx);
    println!("RECEIVED {}", shared.received.load(Ordering::Relaxed));
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lnet_perf --serve: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Joins `h`, waiting at most `bound`.
fn join_bounded(
    h: JoinHandle<Result<(), String>>,
    bound: StdDuration,
) -> Option<Result<(), String>> {
    let deadline = StdInstant::now() + bound;
    while !h.is_finished() {
        if StdInstant::now() >= deadline {
            return None;
        }
        std::thread::sleep(StdDuration::from_millis(5));
    }
    Some(h.join().unwrap_or_else(|_| Err("thread panicked".into())))
}

fn measure_puts(
    shared: &Shared,
    secs: f64,
    opts: &Opts,
    recv: impl Fn(StdDuration) -> Result<Report, String>,
    server_pid: u32,
    router: Option<&Router>,
) -> Result<(), String> {
    let bound = StdDuration::from_secs(30) + StdDuration::from_millis(5) * opts.warmup as u32;
    for _ in 0..opts.clients {
        match recv(bound)? {
            Report::Streaming => {}
            _ => return Err("unexpected report".into()),
        }
    }
    // Let the stream settle, then count what B receives over the window.
    std::thread::sleep(StdDuration::from_millis(500));
    if let Some(stall) = opts.stall_server {
        stall_server(shared, stall, server_pid, router)?;
    }
    let (c0, t0) = (shared.received.load(Ordering::Relaxed), StdInstant::now());
    let attack = if opts.attackers > 0 {
        Some(attack_window(shared, secs, opts, router, t0)?)
    } else {
        std::thread::sleep(StdDuration::from_secs_f64(secs));
        None
    };
    let (c1, t1) = (shared.received.load(Ordering::Relaxed), StdInstant::now());
    // The router's defences as the window ends, the attack still running.
    let defences = attack.and(router).map(Router::defence_counters);
    shared.stop_client.store(true, Ordering::Relaxed);
    let dt = t1.duration_since(t0).as_secs_f64();
    let rate = (c1 - c0) as f64 / dt;
    let (mut sent, mut done, mut errors) = (0, 0, 0);
    for _ in 0..opts.clients {
        match recv(StdDuration::from_secs(10))? {
            Report::PutsDone {
                sent: s,
                done: d,
                errors: e,
            } => {
                sent += s;
                done += d;
                errors += e;
            }
            _ => return Err("unexpected report".into()),
        }
    }
    eprintln!(
        "INFO put stream: {} client(s), window {} peer_credits {} payload {} B; sent {sent}, \
         completed {done}, errors {errors}; {} completed in total, {} in {dt:.3} s",
        opts.clients,
        opts.window,
        opts.peer_credits,
        opts.payload,
        shared.received.load(Ordering::Relaxed),
        c1 - c0
    );
    let mib = |n: u64, dt: f64| n as f64 * f64::from(opts.size) / f64::from(1u32 << 20) / dt;
    if let Some((ca, ta)) = attack {
        let before = mib(ca - c0, ta.duration_since(t0).as_secs_f64());
        let during = mib(c1 - ca, t1.duration_since(ta).as_secs_f64());
        println!("FIGURE ulnet_bulk_put_before_attack MiB/s value={before:.1}");
        println!("FIGURE ulnet_bulk_put_under_attack MiB/s value={during:.1}");
        println!(
            "FIGURE attack_ratio during/before value={:.3}",
            if before > 0.0 { during / before } else { 0.0 }
        );
        println!(
            "FIGURE attackers n={} puts_sent={} ended_done={} ended_failed={} not_routed={}",
            opts.attackers,
            shared.attack_sent.load(Ordering::Relaxed),
            shared.attack_done.load(Ordering::Relaxed),
            shared.attack_failed.load(Ordering::Relaxed),
            shared.attack_unsent.load(Ordering::Relaxed),
        );
        match defences {
            Some(Ok(d)) => println!("FIGURE router_attack_counters {d}"),
            Some(Err(e)) => eprintln!("WARN router counters: {e}"),
            None => {}
        }
    }
    if errors > 0 {
        return Err(format!("{errors} PUTs failed"));
    }
    match opts.mode {
        Mode::Bulk { get, .. } => println!(
            "FIGURE ulnet_bulk_{}_{} MiB/s value={:.1}",
            if get { "get" } else { "put" },
            opts.size,
            rate * f64::from(opts.size) / f64::from(1u32 << 20)
        ),
        _ => println!(
            "FIGURE ulnet_put{}_rate msgs/s value={rate:.0}",
            opts.payload
        ),
    }
    Ok(())
}

/// The measured window with an attack: unattacked until `--attack-after`, then the attackers
/// go, with a `SAMPLE attack` line every 500 ms (the legitimate rate over the last interval,
/// the attackers' PUTs and the router's defences). Returns the count and time at the start of
/// the attack.
fn attack_window(
    shared: &Shared,
    secs: f64,
    opts: &Opts,
    router: Option<&Router>,
    t0: StdInstant,
) -> Result<(u64, StdInstant), String> {
    let after = opts.attack_after.unwrap_or(secs / 3.0);
    let end = t0 + StdDuration::from_secs_f64(secs);
    std::thread::sleep(StdDuration::from_secs_f64(after));
    let (ca, ta) = (shared.received.load(Ordering::Relaxed), StdInstant::now());
    shared.attack.store(true, Ordering::Relaxed);
    let mut last = (ca, ta);
    loop {
        let left = end.saturating_duration_since(StdInstant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(StdDuration::from_millis(500)));
        let (c, t) = (shared.received.load(Ordering::Relaxed), StdInstant::now());
        let rate = (c - last.0) as f64 * f64::from(opts.size)
            / f64::from(1u32 << 20)
            / t.duration_since(last.1).as_secs_f64();
        last = (c, t);
        let d = router.map_or_else(|| Ok(String::new()), Router::defence_counters);
        println!(
            "SAMPLE attack t={:.2} legit_MiB/s={rate:.1} attackers sent={} done={} failed={} \
             router {}",
            t.duration_since(ta).as_secs_f64(),
            shared.attack_sent.load(Ordering::Relaxed),
            shared.attack_done.load(Ordering::Relaxed),
            shared.attack_failed.load(Ordering::Relaxed),
            d.unwrap_or_else(|e| e),
        );
    }
    Ok((ca, ta))
}

fn print_rtt(samples: &[u64]) {
    let mut s = samples.to_vec();
    s.sort_unstable();
    let us = |ns: u64| ns as f64 / 1000.0;
    let n = s.len();
    let pct = |p: f64| s[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
    let mean = s.iter().map(|&v| v as f64).sum::<f64>() / n as f64 / 1000.0;
    eprintln!(
        "INFO ping rtt: {n} samples, mean {mean:.2} us, p90 {:.2} us, p999 {:.2} us, max {:.2} us",
        us(pct(0.9)),
        us(pct(0.999)),
        us(s[n - 1])
    );
    println!(
        "FIGURE ulnet_ping_rtt usec median={:.2} p99={:.2} min={:.2}",
        us(pct(0.5)),
        us(pct(0.99)),
        us(s[0])
    );
}

fn spawn_node(
    role: Role,
    opts: &Opts,
    shared: &Arc<Shared>,
    tx: Sender<Report>,
) -> std::io::Result<JoinHandle<Result<(), String>>> {
    let opts = opts.clone();
    let shared = Arc::clone(shared);
    let name = match role {
        Role::Client(i) => format!("client-{i}"),
        Role::Server => "node-b".into(),
    };
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            let r = node_thread(role, &opts, &shared, &tx);
            if let Err(e) = &r {
                let _ = tx.send(Report::Failed(format!("{name}: {e}")));
                shared.stop_client.store(true, Ordering::Relaxed);
                shared.stop.store(true, Ordering::Relaxed);
            }
            r
        })
}

/// Memory registered for bulk transfers, and the memory itself.
struct Region {
    reg: lnd::fabric::Registration,
    mem: lnd::fabric::SharedMem,
}

impl Region {
    /// `[offset, offset + len)` of it, as NI `ni`'s bulk source or sink.
    fn buf(&self, ni: NiIndex, offset: u64, len: u32) -> Option<router::BulkBuf> {
        Some(router::BulkBuf::new(ni, &self.reg, offset, len)?.shared(self.mem.clone()))
    }
}

/// One node's runtime (its node, fabric, clock and waker: `router::runtime::NiRuntime`, the
/// same loop the daemon's NI threads run), and how long a turn may wait.
struct Driver {
    /// Boxed: a tcp fabric (o2iblnd) or a socket driver (socklnd), as the daemon keeps them.
    rt: NiRuntime<Box<dyn LndDriver + Send>>,
    max_wait: StdDuration,
}

impl Driver {
    /// One turn of the runtime's loop; the caller drains `node().poll_event()` afterwards.
    fn turn(&mut self, max_wait: StdDuration) -> Result<(), String> {
        self.rt.turn(max_wait).map_err(|e| format!("fabric: {e}"))
    }

    fn node(&mut self) -> &mut LnetNode {
        self.rt.node_mut()
    }

    /// Registers `bytes` with the driver's memory registry (the tcp fabric's regions, or the
    /// socket driver's plain shared memory), keeping the memory itself as the selftest does:
    /// socklnd streams a payload from and into it (its `BulkBuf` must carry it).
    fn register(&mut self, bytes: Vec<u8>) -> Result<Region, String> {
        let mem = lnd::fabric::SharedMem::from_vec(bytes);
        let reg = self
            .rt
            .driver_mut()
            .registry()
            .ok_or("the driver has no memory registry")?
            .register_shared(&mem)
            .map_err(|e| format!("register: {e}"))?;
        Ok(Region { reg, mem })
    }

    /// Reads registered memory (false: out of range, or no registry).
    fn read(&mut self, region: &Region, off: u64, out: &mut [u8]) -> bool {
        self.rt
            .driver_mut()
            .registry()
            .is_some_and(|r| r.read(&region.reg, off, out))
    }

    /// Graceful shutdown, bounded; the last actions reach the sockets.
    fn shutdown(&mut self) {
        if let Some(ep) = self.rt.node().endpoint(NiIndex(0)) {
            let s = ep.stats();
            eprintln!(
                "INFO node {} LND: msgs sent {} received {}, credit NOOPs {}, keepalives {}",
                self.rt.node().nids()[0],
                s.msgs_sent,
                s.msgs_received,
                s.credit_noops,
                s.keepalives,
            );
        }
        let wanted = [
            "bytes_tx",
            "bytes_rx",
            "rx_stalls",
            "bytes_in",
            "bytes_out",
            "zc_sends",
            "zc_copied",
        ];
        let f: Vec<String> = self
            .rt
            .driver()
            .counters()
            .into_iter()
            .filter(|(k, _)| wanted.contains(k))
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        eprintln!(
            "INFO node {} driver: {}",
            self.rt.node().nids()[0],
            f.join(", ")
        );
        let now = self.rt.now();
        self.node().shutdown(now);
        let deadline = StdInstant::now() + SHUTDOWN_BOUND;
        while !self.rt.node().is_shut_down() && StdInstant::now() < deadline {
            if self.turn(StdDuration::from_millis(20)).is_err() {
                break;
            }
            while self.node().poll_event().is_some() {}
        }
        if !self.rt.node().is_shut_down() {
            eprintln!(
                "WARN node {}: shutdown did not finish within {SHUTDOWN_BOUND:?}",
                self.rt.node().nids()[0]
            );
        }
        self.rt.flush();
    }
}

fn node_thread(
    role: Role,
    opts: &Opts,
    shared: &Arc<Shared>,
    tx: &Sender<Report>,
) -> Result<(), String> {
    let server = server_nid(opts);
    let (me, kind, routes) = match role {
        Role::Client(i) => (
            client_nid(opts, i),
            opts.client_net,
            (opts.server_net.net(Side::Server), router_a(opts)),
        ),
        Role::Server if opts.routed => (
            server,
            opts.server_net,
            (opts.client_net.net(Side::Clients), router_b(opts)),
        ),
        Role::Server => (server, opts.client_net, (String::new(), router_a(opts))),
    };
    let idx = match role {
        Role::Client(i) => i as u64 + 1,
        Role::Server => 1000,
    };
    let mut ni = NiConfig::new(me, 0x5eed_0000 + idx);
    ni.peer_credits = opts.peer_credits;
    ni.tunables.peer_credits = opts.peer_credits.min(255) as u16;
    ni.credits = ni.credits.max(opts.peer_credits);
    let (driver, listen) = node_driver(kind, &mut ni, opts, shared)?;
    shared.add_peer(me, listen);

    let clock = MonotonicClock::new();
    let mut cfg = NodeConfig::new(vec![ni]);
    if opts.routed {
        cfg.routes = vec![RouteConfig {
            net: routes.0.parse().expect("a net"),
            gateway: routes.1,
            hops: Some(1),
            priority: 0,
        }];
    }
    let node = LnetNode::new(cfg, clock.now());
    let (rt, _wake) = NiRuntime::new(node, driver, clock)
        .map_err(|e| format!("cannot make the node's waker: {e}"))?;
    let mut d = Driver {
        rt,
        max_wait: opts.max_wait,
    };
    if opts.serve {
        // socklnd's listener is bound when the engine's first actions reach the driver: a
        // turn first, so that A's first dial finds it.
        d.turn(StdDuration::ZERO)?;
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "LISTEN {listen}");
        let _ = out.flush();
    }

    let r = match role {
        Role::Server if opts.bulk_serve => serve_bulk(&mut d, opts, shared),
        Role::Server => run_server(&mut d, shared),
        Role::Client(_) => run_client(&mut d, opts, shared, tx, server),
    };
    d.shutdown();
    r
}

/// A node's driver for an NI on a net of `kind`, and where it listens: o2ib on the tcp fabric
/// (an ephemeral 127.0.0.1 port, found by the peers through `shared`); tcp on the socket driver
/// under socklnd, which listens on the NID's address at the run's acceptor port and dials its
/// peers' NIDs there (as the daemon's `start_socket` builds it), from any source port and
/// accepting any (`accept: all`, `source ports: 0`: the run is unprivileged).
fn node_driver(
    kind: NetKind,
    ni: &mut NiConfig,
    opts: &Opts,
    shared: &Arc<Shared>,
) -> Result<(Box<dyn LndDriver + Send>, SocketAddr), String> {
    match kind {
        NetKind::O2ib => {
            let resolver_shared = Arc::clone(shared);
            let resolver = move |n: Nid| resolver_shared.peer(n);
            let tcp = lnd::driver::tcp::TcpConfig {
                busy_poll: opts.busy_poll,
                ..Default::default()
            };
            let fabric =
                TcpFabric::bind_with("127.0.0.1:0".parse().expect("address"), resolver, tcp)
                    .map_err(|e| format!("cannot bind the tcp fabric: {e}"))?;
            let at = fabric.local_addr();
            Ok((Box::new(fabric), at))
        }
        NetKind::Tcp => {
            use lnd::driver::socket::{SockFabric, SocketConfig, SocketDriver};
            let router::LndSettings::Sock(sock) = &mut ni.lnd else {
                return Err(format!("{}: not a socklnd NI", ni.nid));
            };
            sock_bench_settings(sock, opts.accept_port);
            let cfg = SocketConfig {
                busy_poll: opts.busy_poll,
                zero_copy: opts.zero_copy,
                ..SocketConfig::default()
            };
            let driver = SocketDriver::new(cfg)
                .map_err(|e| format!("cannot start the socket driver: {e}"))?;
            let at = SocketAddr::new(
                std::net::Ipv4Addr::from(ni.nid.addr()).into(),
                opts.accept_port,
            );
            Ok((Box::new(SockFabric::new(driver)), at))
        }
    }
}

/// ksocklnd's settings for a benchmark node: the run's acceptor port, any source port, every
/// dialler accepted (the router daemon gets the same from `acceptor: accept: all, port: P,
/// source ports: 0`).
fn sock_bench_settings(sock: &mut lnd::iface::sock::SockConfig, port: u16) {
    sock.accept = lnd::iface::sock::AcceptMode::All;
    sock.accept_port = port;
    sock.ports_from = 0;
    sock.ports_to = 0;
}

/// A TCP port free on loopback now, for the run's acceptors (each node binds its own
/// 127.0.x.y address at it).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// B: answers pings (the node's ping service) and counts PUTs until told to stop.
fn run_server(d: &mut Driver, shared: &Shared) -> Result<(), String> {
    while !shared.stop.load(Ordering::Relaxed) {
        d.turn(d.max_wait)?;
        let mut n = 0;
        while let Some(ev) = d.node().poll_event() {
            if let LnetEvent::Put { payload, .. } = ev {
                n += 1;
                d.node().recycle(payload);
            }
        }
        if n > 0 {
            shared.received.fetch_add(n, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Why a ping did not answer.
enum PingFail {
    Lnet(LnetError),
    Other(String),
}

impl std::fmt::Display for PingFail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PingFail::Lnet(e) => write!(f, "ping: {e}"),
            PingFail::Other(e) => f.write_str(e),
        }
    }
}

/// Runs the node's loop for `d` (events dropped).
fn turn_for(d: &mut Driver, t: StdDuration) -> Result<(), String> {
    let end = StdInstant::now() + t;
    while StdInstant::now() < end {
        d.turn(d.max_wait)?;
        while d.node().poll_event().is_some() {}
    }
    Ok(())
}

/// One ping from a client to `dst`, driven to completion; its round trip in nanoseconds.
fn ping_once(d: &mut Driver, dst: Nid, shared: &Shared) -> Result<u64, PingFail> {
    let t0 = StdInstant::now();
    let now = d.rt.now();
    let id = d
        .node()
        .ping(now, dst, PING_TIMEOUT)
        .map_err(PingFail::Lnet)?;
    loop {
        d.turn(d.max_wait).map_err(PingFail::Other)?;
        while let Some(ev) = d.node().poll_event() {
            if let LnetEvent::PingDone {
                id: got, result, ..
            } = ev
            {
                if got == id {
                    let rtt = t0.elapsed().as_nanos() as u64;
                    return result.map(|_| rtt).map_err(PingFail::Lnet);
                }
            }
        }
        if shared.stop_client.load(Ordering::Relaxed) {
            return Err(PingFail::Other("stopped".into()));
        }
    }
}

/// A: warm-up pings (which also set up the connection), then the measurement.
fn run_client(
    d: &mut Driver,
    opts: &Opts,
    shared: &Shared,
    tx: &Sender<Report>,
    dst: Nid,
) -> Result<(), String> {
    // The peers' addresses must be known before the first connect.
    let deadline = StdInstant::now() + StdDuration::from_secs(15);
    while !shared.go.load(Ordering::Relaxed) {
        if StdInstant::now() >= deadline || shared.stop_client.load(Ordering::Relaxed) {
            return Err("the peers never bound their fabrics".into());
        }
        std::thread::sleep(StdDuration::from_millis(1));
    }
    // Through a router, the first pings may find no live route yet (the router pingers of
    // this node and of B have not found the router): retried for a while.
    loop {
        match ping_once(d, dst, shared) {
            Ok(_) => break,
            Err(PingFail::Lnet(LnetError::NoRoute(_) | LnetError::Timeout))
                if opts.routed && StdInstant::now() < deadline + StdDuration::from_secs(15) =>
            {
                turn_for(d, StdDuration::from_millis(50))?;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    for _ in 0..opts.warmup {
        ping_once(d, dst, shared).map_err(|e| e.to_string())?;
    }
    match opts.mode {
        Mode::Rtt(n) => {
            let mut samples = Vec::with_capacity(n);
            for _ in 0..n {
                samples.push(ping_once(d, dst, shared).map_err(|e| e.to_string())?);
            }
            let _ = tx.send(Report::Rtt(samples));
        }
        Mode::PutRate(_) => {
            let _ = tx.send(Report::Streaming);
            let (sent, done, errors) = stream_puts(d, opts, shared, dst)?;
            let _ = tx.send(Report::PutsDone { sent, done, errors });
        }
        Mode::Bulk { get, .. } => {
            let (sent, done, errors) = stream_bulk(d, opts, shared, tx, dst, get)?;
            let _ = tx.send(Report::PutsDone { sent, done, errors });
        }
    }
    Ok(())
}

/// Keeps up to `opts.window` PUTs outstanding until told to stop, then lets the outstanding ones
/// finish (bounded). Returns (sent, completed, failed).
fn stream_puts(
    d: &mut Driver,
    opts: &Opts,
    shared: &Shared,
    dst: Nid,
) -> Result<(u64, u64, u64), String> {
    let (mut sent, mut done, mut errors) = (0u64, 0u64, 0u64);
    let mut outstanding = 0usize;
    let mut drain = Drain::new(StdDuration::from_secs(5));
    loop {
        let stopping = drain.stopping(shared);
        if !stopping {
            let now = d.rt.now();
            while outstanding < opts.window {
                let mut payload = d.node().take_buffer();
                payload.resize(opts.payload, 0x5a);
                d.node()
                    .send_put(now, dst, BENCH_PORTAL, sent, payload)
                    .map_err(|e| format!("send_put: {e}"))?;
                sent += 1;
                outstanding += 1;
            }
        }
        d.turn(d.max_wait)?;
        while let Some(ev) = d.node().poll_event() {
            match ev {
                LnetEvent::PutDone { result, .. } => {
                    outstanding -= 1;
                    match result {
                        Ok(()) => {
                            done += 1;
                            shared.received.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => errors += 1,
                    }
                }
                LnetEvent::PeerDown { nid, reason, .. } => {
                    eprintln!("WARN peer {nid} down during the stream: {reason:?}");
                }
                _ => {}
            }
        }
        if drain.over(outstanding == 0) {
            return Ok((sent, done, errors));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &str) -> Option<Opts> {
        parse_args_from(args.split_whitespace().map(String::from).collect())
    }

    #[test]
    fn o2ib_stays_the_default_with_its_nids() {
        let o = parse("--rtt 10").expect("valid");
        assert_eq!((o.client_net, o.server_net), (NetKind::O2ib, NetKind::O2ib));
        assert_eq!(client_nid(&o, 0), nid("10.0.0.1@o2ib"));
        assert_eq!(server_nid(&o), nid("10.0.0.250@o2ib"));
        assert!(!o.any_tcp());
        let r = parse("--bulk-put 1 --via-router /bin/true").expect("valid");
        assert_eq!(server_nid(&r), nid("10.1.0.250@o2ib1"));
        assert_eq!(router_a(&r), nid("10.0.0.254@o2ib"));
        assert_eq!(router_b(&r), nid("10.1.0.254@o2ib1"));
    }

    #[test]
    fn net_tcp_puts_every_node_on_its_own_loopback_address() {
        let o = parse("--net tcp --bulk-put 2").expect("valid");
        assert_eq!((o.client_net, o.server_net), (NetKind::Tcp, NetKind::Tcp));
        assert!(o.any_tcp());
        assert_eq!(client_nid(&o, 0), nid("127.0.1.1@tcp"));
        assert_eq!(client_nid(&o, 2), nid("127.0.1.3@tcp"));
        assert_eq!(server_nid(&o), nid("127.0.1.250@tcp"));
    }

    #[test]
    fn routed_sides_pick_their_own_lnd() {
        let o =
            parse("--client-net tcp --server-net o2ib --via-router R --bulk-put 1").expect("valid");
        assert!(o.routed);
        assert_eq!(client_nid(&o, 0), nid("127.0.1.1@tcp"));
        assert_eq!(router_a(&o), nid("127.0.1.254@tcp"));
        assert_eq!(router_b(&o), nid("10.1.0.254@o2ib1"));
        assert_eq!(server_nid(&o), nid("10.1.0.250@o2ib1"));
        let back =
            parse("--client-net o2ib --server-net tcp --via-router R --rtt 5").expect("valid");
        assert_eq!(router_a(&back), nid("10.0.0.254@o2ib"));
        assert_eq!(router_b(&back), nid("127.0.2.254@tcp1"));
        assert_eq!(server_nid(&back), nid("127.0.2.250@tcp1"));
        // B, started with --routed and both nets, finds the same NIDs.
        let b = parse("--routed --client-net o2ib --server-net tcp --accept-port 9988 --serve")
            .expect("valid");
        assert_eq!(server_nid(&b), server_nid(&back));
        assert_eq!(router_b(&b), router_b(&back));
        assert_eq!(b.accept_port, 9988);
    }

    #[test]
    fn inconsistent_net_choices_are_refused() {
        // Direct, the server is on the clients' net.
        assert!(parse("--client-net tcp --server-net o2ib --rtt 5").is_none());
        assert!(parse("--net udp --rtt 5").is_none());
        // ksocklnd dials the NID's address: no relay in between.
        assert!(parse("--net tcp --via-relay R --rtt 5").is_none());
        assert!(parse("--net tcp --accept-port 0 --rtt 5").is_none());
        assert!(parse(
            "--client-net tcp --server-net o2ib --via-router R --bulk-put 3 --attackers 2"
        )
        .is_none());
    }

    #[test]
    fn zero_copy_reaches_the_socket_driver_settings() {
        assert!(
            parse("--net tcp --zero-copy --bulk-put 1")
                .expect("valid")
                .zero_copy
        );
        assert!(!parse("--net tcp --bulk-put 1").expect("valid").zero_copy);
    }

    #[test]
    fn bench_socklnd_settings_run_unprivileged() {
        let mut s = lnd::iface::sock::SockConfig::new(nid("127.0.1.1@tcp"), 1);
        sock_bench_settings(&mut s, 4242);
        assert_eq!(s.accept, lnd::iface::sock::AcceptMode::All);
        assert_eq!((s.accept_port, s.ports_from, s.ports_to), (4242, 0, 0));
    }

    #[test]
    fn router_nis_by_kind() {
        let o =
            parse("--client-net tcp --server-net o2ib --via-router R --bulk-put 1").expect("valid");
        let tcp = router_ni(&o, NetKind::Tcp, router_a(&o), 8);
        assert!(tcp.contains("net type: tcp\n"), "{tcp}");
        assert!(tcp.contains("nid: 127.0.1.254@tcp\n"), "{tcp}");
        assert!(!tcp.contains("fabric:"), "{tcp}");
        let ib = router_ni(&o, NetKind::O2ib, router_b(&o), 8);
        assert!(ib.contains("net type: o2ib1\n"), "{ib}");
        assert!(ib.contains("fabric: tcp\n"), "{ib}");
        assert!(ib.contains("listen: 127.0.0.1:0\n"), "{ib}");
        assert!(is_tcp(router_a(&o)) && !is_tcp(router_b(&o)));
    }
}
