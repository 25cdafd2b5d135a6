//! `lnet-router`: ulnet's LNet daemon. Reads a YAML configuration (`router::yaml_config`),
//! runs each NI on its own thread, serves `lnetctl` on a Unix control socket (`router::control`),
//! and on SIGTERM/SIGINT/SIGQUIT closes every connection gracefully (bounded) and exits 0.
//!
//! Threads: one per NI, each running that NI's [`NiRuntime`] (its `LnetNode`, which knows the
//! node's other NIDs as its own, its fabric: tcp on io_uring, or verbs with the `verbs` feature,
//! its waker) with [`NiRuntime::turn`], and answering the control requests for that NI; a slow or
//! frozen peer on one NI never holds another NI's loop. `lnetctl net add|del` (and `import`)
//! start and stop NI threads at run time: the NIs are a [`NiSet`] whose every change the loops
//! adopt at their next turn; a template node with no NI of its own keeps the node-wide
//! settings an added NI starts with, and answers while the daemon runs none (`--no-nis`).
//! The router's large buffers for bulk data follow the set the same way: one pool for the
//! node (`router::bulk_pool`), each loop registering them with its own fabric.
//! A control thread accepts `lnetctl`
//! connections, each served by a short-lived thread that sends each request to the NI loops it
//! concerns over a bounded channel and wakes them, then merges their answers (a ping goes to the
//! NI on the target's net; `net show`, `peer show`, `conn show` and `stats show` gather every
//! NI's). At most [`control::MAX_CLIENTS`] connections are served at once (for the next, the
//! client idle longest is closed; only when none is idle are they refused with one line);
//! each reads its requests with a 64 KiB cap, an idle timeout and a request timeout
//! (`control::read_request`). The main thread watches signals: TERM, INT and QUIT stop
//! every NI gracefully, HUP, USR1 and USR2 are logged and ignored.
//!
//! `lnetctl capture` takes over its connection: every NI loop turns capturing on in its LND and
//! streams the records to that connection's thread through a bounded channel (never blocking on
//! it: a full channel drops and counts), the connection's thread merges them, and a watcher
//! thread reading the client's side ends the capture on `capture_stop` or when the client goes
//! away. One capture at a time. Why lnetctl, not the daemon, writes the file: see
//! `router::control`'s capture section.
//!
//! Exit status: 0 after a clean shutdown, 1 on a runtime failure (socket, fabric),
//! 2 on a bad command line or configuration.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration as StdDuration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use lnd::driver::tcp::{TcpConfig, TcpFabric};
use lnd::driver::{Driver, MonotonicClock, WakeHandle};
use lnd::time::Duration;
use lnd::wire::Nid;
use router::alive::NetAlive;
use router::bulk_pool::{BulkPlan, BulkPool, LoopId, MAX_BULK_BUFFERS};
use router::control::{
    self, errno, CaptureSession, CaptureSummary, Control, ControlCounters, ControlError, Delivery,
    NetChange, NiExtras, ReadRequest, Request, Response,
};
use router::relay::{ChannelLink, Dest, Handed, Links, Relay};
use router::runtime::{shared_round, NiRuntime, SharedLoop};
use router::selftest::{ConsoleStart, Selftest};
use router::yaml_config::{DaemonConfig, FabricKind};
use router::{BufferCounts, Handover, LnetEvent, LnetNode};
use tracing::{debug, error, info, warn};

/// jemalloc rather than glibc's malloc: after a burst (tens of thousands of messages or peers),
/// the tables give their room back (`lnd::trim`), but glibc keeps the freed pages of an NI
/// thread's arena as long as anything above them lives, so the daemon's RSS stayed at its peak
/// (20,000 pings to unreachable peers: 8 -> 90 MB, and 77 MB for good). jemalloc returns freed
/// pages to the system after a short decay.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's purging threads: one is enough for a daemon whose allocations come from a few NI
/// threads (jemalloc's default is one per CPU: 64 idle threads in `ps` on a 64-core router).
const ALLOCATOR_THREADS: usize = 1;

/// Caps jemalloc's background threads before any other thread starts (they are created
/// lazily, per arena in use; the allocator's build turns them on). A failure only costs idle
/// threads: logged, never fatal.
fn limit_allocator_threads() -> Result<(), String> {
    tikv_jemalloc_ctl::max_background_threads::write(ALLOCATOR_THREADS).map_err(|e| e.to_string())
}

/// How long the loop may block before it looks at control requests and signals again.
const MAX_WAIT: StdDuration = StdDuration::from_millis(20);
/// How long a graceful shutdown may take before the daemon exits anyway.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(5);
/// Control requests that may wait for the loop at once.
const CONTROL_QUEUE: usize = 64;
/// Handovers (forwarded messages and their releases) that may wait for an NI's loop at once.
/// A full channel never blocks the sender: what does not fit waits in the sender's outbox
/// (bounded by its router buffers) and goes at its next turn.
const HANDOVER_QUEUE: usize = 4096;
/// How long a change of the NIs or the node-wide settings waits for every NI loop to take it
/// (each is woken for it: a turn or two).
const ADOPT_BOUND: StdDuration = StdDuration::from_secs(2);
/// The most rounds a change publishes for the router buffers for bulk data: the buffers, the
/// table once every NI has them, what an NI gave back handed to another, and one to spare
/// (`router::bulk_pool`; what is still lent then follows when it comes back).
const BULK_ROUNDS: usize = 4;
/// How often a loop whose node has router buffers still to give back looks for them.
const RELEASE_CHECK: StdDuration = StdDuration::from_millis(50);

#[derive(Copy, Clone, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// `--version`: the crate's version, the git revision it was built from and the features
/// built in.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("ULNET_GIT_REV"),
    "; fabrics: tcp",
    verbs_feature!(),
    ")"
);

#[cfg(feature = "verbs")]
macro_rules! verbs_feature {
    () => {
        ", verbs"
    };
}
#[cfg(not(feature = "verbs"))]
macro_rules! verbs_feature {
    () => {
        ""
    };
}
use verbs_feature;

/// The longest control timeout taken (a year, in seconds): an absurd one is refused at the
/// command line rather than overflowing a deadline and panicking every control client.
const MAX_CONTROL_TIMEOUT: u64 = 365 * 24 * 3600;

#[derive(Parser, Debug)]
#[command(
    name = "lnet-router",
    version = VERSION,
    about = "ulnet's LNet daemon: NIs on the tcp or verbs fabric, lnetctl's control socket",
    after_help = "Logging: LNET_LOG sets the filter (tracing EnvFilter syntax, default \"info\").\n\
                  Exit status: 0 clean shutdown, 1 runtime failure, 2 bad command line or configuration."
)]
struct Args {
    /// The YAML configuration (lnetctl export's shape plus fabric, listen and peers)
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/etc/ulnet/lnet-router.yaml"
    )]
    config: PathBuf,
    /// The control socket [default: /run/ulnet/lnet-router.sock as root, else
    /// $XDG_RUNTIME_DIR/ulnet/lnet-router.sock]. At most 107 bytes (a Unix socket path); its
    /// directory is created (0700) if its parent exists
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Log format on stderr
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Close a control client that sends nothing for this many seconds between requests
    /// (a client waiting for an answer or receiving a capture is not idle)
    #[arg(long, value_name = "SECS", default_value_t = control::DEFAULT_IDLE_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=MAX_CONTROL_TIMEOUT))]
    control_idle_timeout: u64,
    /// Close a control client whose request line is not complete this many seconds after its
    /// first byte
    #[arg(long, value_name = "SECS", default_value_t = control::DEFAULT_REQUEST_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=MAX_CONTROL_TIMEOUT))]
    control_request_timeout: u64,
    /// How NIs map to threads: a thread per NI, or every NI on one thread (forwarded
    /// messages then never cross threads, which suits a router with fewer cores than NIs
    /// plus clients; tcp NIs only)
    #[arg(long, value_enum, default_value = "per-ni")]
    ni_threads: NiThreads,
    /// Start even when the configuration names no NI, or is missing: NIs come later through
    /// lnetctl (`net add`, `import`), as with Lustre's lnet.service (`lnetctl lnet
    /// configure`, then `lnetctl import /etc/lnet.conf`). Needs --ni-threads per-ni
    #[arg(long)]
    no_nis: bool,
    /// Print this manual page (roff, section 8) on standard output and exit
    #[arg(long, hide = true)]
    print_man: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum NiThreads {
    PerNi,
    Shared,
}

/// A request and where its answer goes: one response, or for a capture the whole stream
/// (bounded: the loop never blocks on a slow client).
type ControlMsg = (Request, SyncSender<Response>);

fn main() -> ExitCode {
    let args = Args::parse();
    if args.print_man {
        let mut out = Vec::new();
        let cmd = <Args as clap::CommandFactory>::command();
        if let Err(e) = clap_mangen::Man::new(cmd).section("8").render(&mut out) {
            eprintln!("lnet-router: man page: {e}");
            return ExitCode::FAILURE;
        }
        let _ = std::io::Write::write_all(&mut std::io::stdout(), &out);
        return ExitCode::SUCCESS;
    }
    init_logging(args.log_format);
    if let Err(e) = limit_allocator_threads() {
        warn!(error = %e, "cannot limit the allocator's background threads");
    }
    // Errors go to stderr once, as one line: before the daemon runs there is no log to keep.
    if args.no_nis && args.ni_threads == NiThreads::Shared {
        eprintln!(
            "lnet-router: --no-nis needs --ni-threads per-ni (NIs added at run time each get \
             a thread; a shared thread is fixed at start)"
        );
        return ExitCode::from(2);
    }
    let loaded = if args.no_nis {
        DaemonConfig::load_allowing_no_nis(&args.config)
    } else {
        DaemonConfig::load(&args.config)
    };
    let mut cfg = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lnet-router: {e}");
            return ExitCode::from(2);
        }
    };
    for net in cfg.nets.iter_mut().filter(|n| !n.fabric_given) {
        choose_fabric(net);
    }
    if let Some(msg) = listen_clash(&cfg) {
        eprintln!("lnet-router: {}: {msg}", args.config.display());
        return ExitCode::from(2);
    }
    if let Some((net, _)) = cfg.nis().find(|(n, _)| !fabric_supported(n.fabric)) {
        let msg = match net.fabric {
            FabricKind::Verbs => format!(
                "net {}: fabric 'verbs' needs an lnet-router built with the verbs feature \
                 (cargo build -p router --features verbs)",
                net.net
            ),
            other => format!(
                "net {}: fabric '{}' runs only inside the simulator, not in lnet-router \
                 (use tcp or verbs)",
                net.net,
                other.as_str()
            ),
        };
        // The line of the net's first NI: the file's lines of a net are not kept, its NIs' are.
        match net.nis.first() {
            Some(ni) => eprintln!("lnet-router: {}:{}: {msg}", args.config.display(), ni.line),
            None => eprintln!("lnet-router: {}: {msg}", args.config.display()),
        }
        return ExitCode::from(2);
    }
    if args.ni_threads == NiThreads::Shared {
        if let Some((net, _)) = cfg.nis().find(|(n, _)| n.fabric != FabricKind::Tcp) {
            eprintln!(
                "lnet-router: --ni-threads shared: net {} is on fabric '{}'; only tcp NIs can \
                 share a thread (use --ni-threads per-ni)",
                net.net,
                net.fabric.as_str()
            );
            return ExitCode::from(2);
        }
    }
    // A path lnetctl could not reach, or whose directory is more than one missing level away
    // (only the socket's own directory is created), is refused before anything starts.
    let socket = args.socket.unwrap_or_else(control::default_socket_path);
    if let Err(e) = control::check_socket_path_for_daemon(&socket) {
        eprintln!("lnet-router: {e}");
        return ExitCode::from(2);
    }
    let limits = ClientLimits {
        idle: StdDuration::from_secs(args.control_idle_timeout),
        request: StdDuration::from_secs(args.control_request_timeout),
    };
    match run(cfg, socket, limits, args.ni_threads) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Once, and whatever LNET_LOG filters (the log is on stderr too: logging it as well
            // printed it twice).
            eprintln!("lnet-router: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LNET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: a log redirected to a file or the journal gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.json().init(),
    }
}

/// Sends `state` to the service manager's notification socket ($NOTIFY_SOCKET, sd_notify's
/// protocol: one datagram of newline-separated assignments; a name starting with '@' is in
/// the abstract namespace). Without $NOTIFY_SOCKET (not run by systemd with Type=notify) it
/// does nothing; a failure is logged, never fatal.
fn sd_notify(state: &str) {
    use std::os::unix::net::UnixDatagram;
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|sock| {
        let bytes = path.as_encoded_bytes();
        match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                sock.send_to_addr(state.as_bytes(), &addr)
            }
            None => sock.send_to(state.as_bytes(), &path),
        }
    });
    match sent {
        Ok(_) => debug!(state, "notified the service manager"),
        Err(e) => warn!("cannot notify the service manager at {path:?}: {e}"),
    }
}

/// Removes the control socket file when the daemon ends, however it ends.
struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The signals the daemon handles. SIGTERM, SIGINT and SIGQUIT stop it gracefully; SIGHUP,
/// SIGUSR1 and SIGUSR2 are logged (once per delivery) and ignored, so that a service manager
/// reloading or a closed terminal never kills it uncleanly (configuration changes go through
/// lnetctl). SIGPIPE stays ignored as Rust's runtime sets it at start: a client that goes away
/// is an EPIPE on its connection, nothing more.
struct Signals {
    term: Arc<AtomicBool>,
    hup: Arc<AtomicBool>,
    usr1: Arc<AtomicBool>,
    usr2: Arc<AtomicBool>,
}

impl Signals {
    fn install() -> Result<Signals, String> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
        let s = Signals {
            term: Arc::default(),
            hup: Arc::default(),
            usr1: Arc::default(),
            usr2: Arc::default(),
        };
        let reg = |sig, flag: &Arc<AtomicBool>| {
            signal_hook::flag::register(sig, Arc::clone(flag))
                .map(|_| ())
                .map_err(|e| format!("cannot install a signal handler: {e}"))
        };
        for sig in [SIGTERM, SIGINT, SIGQUIT] {
            reg(sig, &s.term)?;
        }
        reg(SIGHUP, &s.hup)?;
        reg(SIGUSR1, &s.usr1)?;
        reg(SIGUSR2, &s.usr2)?;
        Ok(s)
    }

    /// Logs the ignored signals that arrived since the last look; true once a stop was asked.
    fn check(&self) -> bool {
        if self.hup.swap(false, Ordering::Relaxed) {
            warn!("SIGHUP ignored: configuration changes go through lnetctl");
        }
        if self.usr1.swap(false, Ordering::Relaxed) {
            warn!("SIGUSR1 ignored");
        }
        if self.usr2.swap(false, Ordering::Relaxed) {
            warn!("SIGUSR2 ignored");
        }
        self.term.load(Ordering::Relaxed)
    }
}

fn run(
    cfg: DaemonConfig,
    socket: PathBuf,
    limits: ClientLimits,
    threading: NiThreads,
) -> Result<(), String> {
    let signals = Signals::install()?;

    let clock = MonotonicClock::new();
    let incarnation = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64);
    let node_cfgs = cfg.ni_node_configs(incarnation);
    let board = node_cfgs
        .first()
        .and_then(|c| c.net_alive.clone())
        .unwrap_or_else(|| NetAlive::new(0));
    let peers = PeerAddrs::default();
    peers.merge(&cfg.peers);
    let mut runtimes = Vec::new();
    for ((net, ni), node_cfg) in cfg.nis().zip(node_cfgs) {
        let stopping = || signals.term.load(Ordering::Relaxed);
        let f = match start_fabric(&peers, net.fabric, ni, &stopping) {
            Ok(f) => f,
            // SIGTERM while an NI waited for its listen address: the stop asked for, not a
            // failure (the NIs started so far close as they are dropped).
            Err(_) if stopping() => {
                info!(nid = %ni.ni.nid, "stopped by a signal while starting");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let node = LnetNode::new(node_cfg, clock.now());
        let (rt, wake) = NiRuntime::new(node, f.driver, clock)
            .map_err(|e| format!("NI {}: cannot create its loop's waker: {e}", ni.ni.nid))?;
        runtimes.push((rt, wake, f.kind, extras_of(ni, f.listen)));
    }

    let listener = control::bind_socket(&socket)
        .map_err(|e| format!("control socket {}: {e}", socket.display()))?;
    let _guard = SocketGuard(socket.clone());
    let nids: Vec<Nid> = cfg.nis().map(|(_, ni)| ni.ni.nid).collect();
    // The node without NIs of its own, knowing every NID: it keeps the node-wide settings
    // (routes, routing, buffers, globals) that an NI added later starts with, and answers for
    // the daemon while it runs no NI.
    let template = LnetNode::new(
        router::NodeConfig {
            nis: Vec::new(),
            node_nids: nids.clone(),
            net_alive: Some(board.clone()),
            ..cfg.node_config(incarnation)
        },
        clock.now(),
    );
    let daemon = Arc::new(Daemon {
        set: NiSet::default(),
        shared: Shutdown::default(),
        next_incarnation: AtomicU64::new(incarnation.wrapping_add(nids.len() as u64)),
        peers,
        bulk: Mutex::default(),
        next_loop: AtomicU64::new(1),
        base: cfg,
        clock,
        threading,
        template: Mutex::new(template),
    });
    let mut ni_loops = Vec::new();
    let mut members = Vec::new();
    for (rt, wake, kind, extras) in runtimes {
        let (l, m) = daemon.make_loop(rt, wake, kind, extras);
        ni_loops.push(l);
        members.push(m);
    }
    {
        let settings = Arc::new(NodeSettings::of(&lock(&daemon.template)));
        let bulk = lock(&daemon.bulk).current();
        daemon
            .set
            .publish(members, Vec::new(), board, settings, bulk);
    }
    let nis = ni_loops.len();
    match threading {
        NiThreads::PerNi => {
            for l in ni_loops {
                daemon.spawn(l)?;
            }
        }
        NiThreads::Shared if ni_loops.is_empty() => {}
        NiThreads::Shared => {
            let (first, rest) = ni_loops.split_first_mut().ok_or("no NI is configured")?;
            if let Err(i) = first.rt.watch_all(rest.iter().map(|l| &l.rt)) {
                return Err(format!(
                    "--ni-threads shared: NI {} cannot share a thread (its fabric, {}, \
                     cannot be watched from another; only tcp can)",
                    rest[i].nid,
                    rest[i].kind.as_str()
                ));
            }
            let t = std::thread::Builder::new()
                .name("nis".into())
                .spawn(move || run_shared(ni_loops))
                .map_err(|e| format!("cannot start the NIs' thread: {e}"))?;
            lock(&daemon.set.threads).push(NiThread {
                nid: None,
                handle: t,
            });
        }
    }
    // The router buffers for bulk data, registered by each NI loop with its own fabric (a
    // router starts forwarding bulk at once, not at its first change).
    {
        let _one = lock(&daemon.set.change);
        let m = daemon.set.snapshot();
        daemon.publish(m.list.clone(), m.leaving.clone(), m.board.clone());
    }
    let loops = Loops {
        daemon: Arc::clone(&daemon),
        import: Arc::new(Mutex::new(())),
    };
    let counters = Arc::new(ControlCounters::default());
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || control_thread(listener, loops, limits, counters))
        .map_err(|e| format!("cannot start the control thread: {e}"))?;
    info!(socket = %socket.display(), nis, "lnet-router running");
    // Every NI listens and the control socket answers: tell the service manager.
    sd_notify(&format!(
        "READY=1\nSTATUS=running: {nis} NI(s), control socket {}\nMAINPID={}",
        socket.display(),
        std::process::id()
    ));

    // The main thread: signals, and the end once every NI thread has finished after a stop
    // (a signal, or a failed fabric, which stops everyone). A thread started after the stop
    // is refused under the same lock, so none is missed.
    let shared = &daemon.shared;
    loop {
        if signals.check() && !shared.stop.swap(true, Ordering::Relaxed) {
            info!("closing every connection");
            sd_notify("STOPPING=1\nSTATUS=closing every connection");
            daemon.wake_all();
        }
        // Router buffers an NI let go (or registered late) since the last change: handed on
        // or retired now, not at the next change.
        if lock(&daemon.bulk).dirty() && !shared.stop.load(Ordering::Relaxed) {
            daemon.tidy_bulk();
        }
        if shared.stop.load(Ordering::Relaxed)
            && lock(&daemon.set.threads)
                .iter()
                .all(|t| t.handle.is_finished())
        {
            break;
        }
        std::thread::sleep(MAX_WAIT);
    }
    for t in std::mem::take(&mut *lock(&daemon.set.threads)) {
        if t.handle.join().is_err() {
            let which = t.nid.map_or("the NIs' thread".to_string(), |n| {
                format!("the thread of NI {n}")
            });
            shared.fail(format!("{which} panicked"));
        }
    }
    info!("lnet-router stopped");
    let fatal = lock(&shared.fatal).clone();
    fatal.map_or(Ok(()), Err)
}

/// A lock that a panicked holder left poisoned is still the daemon's state: taken anyway.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A net without `fabric`: verbs when built with it and every NI's address is on an RDMA
/// device, else tcp with one warning saying why.
fn choose_fabric(net: &mut router::yaml_config::NetSettings) {
    let devices: Vec<Option<String>> = net
        .nis
        .iter()
        .map(|ni| {
            let ip = std::net::Ipv4Addr::from(ni.ni.nid.addr());
            router::rdma::interface_of(ip)
                .and_then(|ifname| router::rdma::rdma_device_of(&ifname, Path::new("/sys")))
        })
        .collect();
    let all_rdma = !devices.is_empty() && devices.iter().all(Option::is_some);
    if all_rdma && fabric_supported(FabricKind::Verbs) {
        info!(net = %net.net, devices = ?devices, "no 'fabric' for this net: its NIs are on RDMA devices, using verbs");
        net.fabric = FabricKind::Verbs;
        return;
    }
    let why = if all_rdma {
        "its NIs are on RDMA devices but this daemon is built without verbs"
    } else if devices.iter().any(Option::is_some) {
        "not every NI of it is on an RDMA device"
    } else {
        "no NI of it is on an RDMA device"
    };
    warn!(
        net = %net.net,
        "no 'fabric' for this net: using tcp (o2iblnd over TCP sockets): {why}; set \
         'fabric: verbs' for RDMA"
    );
}

/// Where NI `ni` listens before it is bound: its `listen:`, else its NID's address, port 987.
fn listen_of(ni: &router::yaml_config::NiSettings) -> std::net::SocketAddr {
    ni.listen.unwrap_or_else(|| o2ib_address(ni.ni.nid))
}

/// Whether two NIs listening on `a` and `b` (on one fabric) would take the same address: one
/// port, not 0 (the OS picks a free one), and one IP or a wildcard on either side.
fn listens_clash(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Two NIs of the configuration on one listen address: a configuration error, said at once
/// (binding the second only failed after the 10 s wait meant for a restarted daemon's
/// lingering socket, with a warning about a killed process that never was).
fn listen_clash(cfg: &DaemonConfig) -> Option<String> {
    let nis: Vec<_> = cfg.nis().collect();
    nis.iter().enumerate().find_map(|(i, (net, ni))| {
        nis[..i]
            .iter()
            .find(|(n, o)| n.fabric == net.fabric && listens_clash(listen_of(o), listen_of(ni)))
            .map(|(_, o)| {
                format!(
                    "NIs {} and {} both listen on {} (give each NI its own `listen:` address \
                     or port)",
                    o.ni.nid,
                    ni.ni.nid,
                    listen_of(ni)
                )
            })
    })
}

fn extras_of(ni: &router::yaml_config::NiSettings, listen: std::net::SocketAddr) -> NiExtras {
    NiExtras {
        peer_timeout: ni.peer_timeout,
        peer_buffer_credits: ni.peer_buffer_credits,
        listen: Some(listen),
        busy_poll_us: Some(ni.busy_poll_us),
        handshake_limit: Some(ni.handshake_limit),
    }
}

/// The daemon as its threads share it: the NIs it runs, the stop, the settings an NI added at
/// run time starts with.
struct Daemon {
    set: NiSet,
    shared: Shutdown,
    /// The configuration the daemon started with: what an added NI takes from it besides its
    /// own settings (gateway health, selftest, where peers listen).
    base: DaemonConfig,
    clock: MonotonicClock,
    /// The next NI's incarnation: every NI started gets its own, so that a NID removed and
    /// added again is a new instance to its peers (they drop what they held for the old one).
    next_incarnation: AtomicU64,
    threading: NiThreads,
    /// Where peers listen: the file's `peers:` and every imported document's since, read by
    /// every NI's fabric at each connect.
    peers: PeerAddrs,
    /// The router's large buffers for bulk data, for the whole node: planned here, registered
    /// by each NI loop with its own fabric (see `router::bulk_pool`).
    bulk: Mutex<BulkPool>,
    /// The next NI loop's id in the pool (a NID removed and added again is another loop).
    next_loop: AtomicU64,
    /// A node with no NI of its own that knows every NID: it checks and keeps the node-wide
    /// settings (`route`, `set`, `routing`, buffers), which every NI then adopts
    /// ([`NodeSettings`]), and answers while the daemon runs no NI.
    template: Mutex<LnetNode>,
}

/// The NIs the daemon runs now, as the control side and every NI loop reach them. `net
/// add|del` change it at run time: each change publishes a new [`Members`] and bumps
/// `epoch`, so that a loop notices with one load per turn and then adopts it (its node's
/// NIDs, its handover links).
#[derive(Default)]
struct NiSet {
    epoch: AtomicU64,
    members: Mutex<Arc<Members>>,
    /// Every NI thread not yet joined: the main thread joins them at the end, `net del` the
    /// ones it stopped. A thread is added only while no stop is asked, under this lock.
    threads: Mutex<Vec<NiThread>>,
    /// One NI change at a time (held through a whole `net add|del`, its join included).
    change: Mutex<()>,
}

struct NiThread {
    /// `None`: the one thread of `--ni-threads shared`.
    nid: Option<Nid>,
    handle: std::thread::JoinHandle<()>,
}

/// The NIs at one epoch, in order (the configuration's, then as added), their nets' liveness
/// board (one slot per NID, in the same order; see `router::alive`), and the node-wide
/// settings every one of them holds.
struct Members {
    epoch: u64,
    list: Vec<Member>,
    /// NIs being removed: gone from every table, but still closing, and owed the ends of
    /// what they forwarded (only `Handover::Done`s go to them).
    leaving: Vec<Member>,
    board: NetAlive,
    settings: Arc<NodeSettings>,
    /// The router buffers for bulk data: what each NI registers and lends out.
    bulk: Arc<BulkPlan>,
}

impl Default for Members {
    fn default() -> Members {
        Members {
            epoch: 0,
            list: Vec::new(),
            leaving: Vec::new(),
            board: NetAlive::new(0),
            settings: Arc::default(),
            bulk: Arc::default(),
        }
    }
}

/// What every NI runtime of the daemon holds the same: the routes, LNet's globals, whether it
/// routes, and the router buffers' totals (each runtime is a CPT with an equal share). The
/// template node checks and keeps them; a change is published with the NIs and each loop
/// adopts it at its next turn, so an NI added later starts with them too, and no loop can
/// miss a change another took.
#[derive(Clone, Debug, Default, PartialEq)]
struct NodeSettings {
    routes: Vec<router::RouteConfig>,
    globals: router::GlobalTunables,
    routing: bool,
    buffers: BufferCounts,
    /// `routing:`'s module parameters (the router pinger's).
    gateway_health: router::GatewayHealthConfig,
}

impl NodeSettings {
    fn of(t: &LnetNode) -> NodeSettings {
        NodeSettings {
            routes: t.routes().routes().copied().collect(),
            globals: t.globals().clone(),
            routing: t.routing_enabled(),
            buffers: t.routing_info().buffers(),
            gateway_health: t.gateway_health(),
        }
    }
}

/// The NI loops of `list` as the bulk pool knows them.
fn pool_members(list: &[Member]) -> Vec<(LoopId, Nid)> {
    list.iter().map(|m| (m.id, m.nid)).collect()
}

impl Members {
    fn nids(&self) -> Vec<Nid> {
        self.list.iter().map(|m| m.nid).collect()
    }

    fn index_of(&self, nid: &str) -> Option<usize> {
        self.list.iter().position(|l| l.nid.to_string() == nid)
    }
}

/// One NI's loop as the control side and the other loops reach it.
#[derive(Clone)]
struct Member {
    nid: Nid,
    /// Its loop, in the bulk pool.
    id: LoopId,
    /// Its fabric, and the address it listens on, as bound (`net add` refuses another NI on it).
    kind: FabricKind,
    listen: Option<std::net::SocketAddr>,
    /// Its control requests, and its waker.
    ctl: SyncSender<ControlMsg>,
    wake: WakeHandle,
    /// Its handovers (forwarded messages and their releases), and whether a handover wakes
    /// it (not when every loop shares one thread: each is stepped every round).
    hand: ChannelLink,
    /// Set by `net del`: the loop shuts its NI down gracefully and ends.
    stop: Arc<AtomicBool>,
    /// The last epoch this loop adopted: once every loop has adopted a change, none acts on
    /// what it replaced (a removed NI is handed nothing more).
    adopted: Arc<AtomicU64>,
    /// Cleared when the loop ends, however it ends: nobody waits for it to adopt anything.
    running: Arc<AtomicBool>,
}

impl Member {
    /// Whether this loop has yet to adopt `epoch` (false for one that has ended).
    fn behind(&self, epoch: u64) -> bool {
        self.running.load(Ordering::Acquire) && self.adopted.load(Ordering::Acquire) < epoch
    }
}

impl Member {
    /// Hands a request to this loop and wakes it; the answer comes on `reply`.
    fn submit(&self, req: Request, reply: SyncSender<Response>) -> Result<(), ControlError> {
        match self.ctl.try_send((req, reply)) {
            Ok(()) => {
                self.wake.wake();
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(ControlError::new(
                errno::EIO,
                "the daemon is busy (control queue full); try again",
            )),
            Err(TrySendError::Disconnected(_)) => Err(ControlError::new(
                errno::ESHUTDOWN,
                "the daemon is shutting down",
            )),
        }
    }
}

impl NiSet {
    fn snapshot(&self) -> Arc<Members> {
        Arc::clone(&lock(&self.members))
    }

    /// Publishes these NIs (and those leaving) with these settings and this plan of the bulk
    /// buffers as the next epoch; returns it.
    fn publish(
        &self,
        list: Vec<Member>,
        leaving: Vec<Member>,
        board: NetAlive,
        settings: Arc<NodeSettings>,
        bulk: Arc<BulkPlan>,
    ) -> u64 {
        let mut m = lock(&self.members);
        let epoch = m.epoch + 1;
        *m = Arc::new(Members {
            epoch,
            list,
            leaving,
            board,
            settings,
            bulk,
        });
        self.epoch.store(epoch, Ordering::Release);
        epoch
    }
}

impl Daemon {
    fn wake_all(&self) {
        for m in &self.set.snapshot().list {
            m.wake.wake();
        }
    }

    /// Publishes `list` (on `board`; `leaving` as in [`Members`]) with the template's
    /// settings, wakes every loop and waits (bounded) until each has adopted it, so that what
    /// the caller answers is what every NI holds. The router buffers for bulk data follow in
    /// a few more rounds, each waited for the same way: every NI registers the buffers the
    /// change needs, then the table that names them (with every NI that has them) is
    /// published, then what an NI gave back goes to another (`router::bulk_pool`). Called
    /// with `set.change` held.
    fn publish(&self, list: Vec<Member>, leaving: Vec<Member>, board: NetAlive) {
        let settings = Arc::new(NodeSettings::of(&lock(&self.template)));
        let waiting: Vec<Member> = list.iter().chain(&leaving).cloned().collect();
        let started = std::time::Instant::now();
        for round in 0..BULK_ROUNDS {
            let plan = lock(&self.bulk).plan(
                &pool_members(&list),
                &leaving.iter().map(|m| m.id).collect::<Vec<_>>(),
                settings.routing,
                settings.buffers.large,
                round == 0,
            );
            let Some(plan) = plan else { break };
            let epoch = self.set.publish(
                list.clone(),
                leaving.clone(),
                board.clone(),
                Arc::clone(&settings),
                plan,
            );
            for m in &waiting {
                m.wake.wake();
            }
            for m in &waiting {
                while m.behind(epoch) {
                    if started.elapsed() >= ADOPT_BOUND || self.shared.stop.load(Ordering::Relaxed)
                    {
                        warn!(nid = %m.nid, "an NI loop has not taken the daemon's change yet; it will at its next turn");
                        return;
                    }
                    std::thread::sleep(StdDuration::from_millis(1));
                }
            }
        }
    }

    /// The bulk buffers' next round outside any change: what NIs released or registered since
    /// (a buffer lent when `set large_buffers` shrank the pool, an NI slow to adopt) is handed
    /// on or retired. Published without waiting; skipped while a change is under way (its own
    /// rounds see it).
    fn tidy_bulk(&self) {
        let _one = match self.set.change.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        let m = self.set.snapshot();
        let plan = lock(&self.bulk).plan(
            &pool_members(&m.list),
            &m.leaving.iter().map(|m| m.id).collect::<Vec<_>>(),
            m.settings.routing,
            m.settings.buffers.large,
            false,
        );
        if let Some(plan) = plan {
            self.set.publish(
                m.list.clone(),
                m.leaving.clone(),
                m.board.clone(),
                Arc::clone(&m.settings),
                plan,
            );
            for x in m.list.iter().chain(&m.leaving) {
                x.wake.wake();
            }
        }
    }

    /// A loop for `rt`, and the member the others reach it by.
    fn make_loop(
        self: &Arc<Self>,
        rt: NiRuntime<Box<dyn Driver + Send>>,
        wake: WakeHandle,
        kind: FabricKind,
        extras: NiExtras,
    ) -> (NiLoop, Member) {
        let nid = rt.node().nids()[0];
        let id = self.next_loop.fetch_add(1, Ordering::Relaxed);
        let (tx, req_rx) = mpsc::sync_channel::<ControlMsg>(CONTROL_QUEUE);
        let (hand_tx, hand_rx) = crossbeam_channel::bounded::<Handover>(HANDOVER_QUEUE);
        let stop = Arc::new(AtomicBool::new(false));
        let adopted = Arc::new(AtomicU64::new(0));
        let running = Arc::new(AtomicBool::new(true));
        let member = Member {
            nid,
            id,
            kind,
            listen: extras.listen,
            ctl: tx,
            wake: wake.clone(),
            hand: ChannelLink {
                tx: hand_tx,
                wake: (self.threading == NiThreads::PerNi).then(|| wake.clone()),
            },
            stop: Arc::clone(&stop),
            adopted: Arc::clone(&adopted),
            running: Arc::clone(&running),
        };
        let incarnation = rt
            .node()
            .endpoint(router::NiIndex(0))
            .map_or(0, |e| e.incarnation());
        let l = NiLoop {
            nid,
            rt,
            kind,
            control: Control::new(vec![extras]),
            req_rx,
            hands: Handovers {
                rx: hand_rx,
                links: MemberLinks::default(),
                relay: Relay::new(),
            },
            daemon: Arc::clone(self),
            adopted,
            running,
            applied: None,
            stop,
            removed_at: None,
            shutdown_deadline: None,
            failed: false,
            capture: CaptureState::Idle,
            next_capture: 1,
            peer_log: PeerLog::default(),
            bulk: LoopBulk::new(id),
            lst: NiSelftest {
                st: self.base.selftest.then(|| {
                    Selftest::new(
                        router::NiIndex(0),
                        nid,
                        incarnation,
                        router::selftest::DEFAULT_BUFFER_LIMIT,
                    )
                }),
                pending: HashMap::new(),
            },
        };
        (l, member)
    }

    /// Runs `l` on a thread of its own, unless a stop was asked.
    fn spawn(&self, l: NiLoop) -> Result<(), String> {
        let nid = l.nid;
        let mut threads = lock(&self.set.threads);
        if self.shared.stop.load(Ordering::Relaxed) {
            return Err("the daemon is shutting down".into());
        }
        let t = std::thread::Builder::new()
            .name(format!("ni {nid}"))
            .spawn(move || l.run())
            .map_err(|e| format!("cannot start the thread of NI {nid}: {e}"))?;
        threads.push(NiThread {
            nid: Some(nid),
            handle: t,
        });
        Ok(())
    }

    fn fixed_nis(&self, what: &str) -> Option<ControlError> {
        (self.threading == NiThreads::Shared).then(|| {
            ControlError::new(
                errno::EOPNOTSUPP,
                format!(
                    "{what}: this daemon runs every NI on one thread (--ni-threads shared), \
                     fixed at start; change its configuration and restart it, or run it \
                     with --ni-threads per-ni"
                ),
            )
        })
    }

    /// The template node answers `req` (in the calling thread: it has no fabric).
    fn on_template(&self, req: Request) -> Response {
        let clock = self.clock;
        control::call_local(&mut lock(&self.template), req, || clock.now())
    }

    /// A change of the node-wide settings (`route add|del`, `set`, `routing`, buffers): the
    /// template checks and keeps it (its answer is the answer), then every NI adopts the
    /// settings as they now are. One change at a time, and never halfway through an NI's
    /// start, so that no NI misses one.
    fn change_settings(&self, req: Request) -> Response {
        let _one = lock(&self.set.change);
        if let Some(e) = self.beyond_registered(&req) {
            return Response::Error(e);
        }
        let resp = self.on_template(req);
        if matches!(resp, Response::Done) {
            let m = self.set.snapshot();
            self.publish(m.list.clone(), m.leaving.clone(), m.board.clone());
        }
        resp
    }

    /// An import's routes as one change of the node-wide settings: the template judges and
    /// takes each ([`control::apply_routes`]), then every NI adopts them in one publish (a
    /// publish per route, each waiting for every loop, cost 1-2 ms a route). Other clients
    /// are served meanwhile: only changes of the settings wait for this one.
    fn change_routes(&self, batch: &control::RouteBatch<'_>) -> Vec<control::RouteOutcome> {
        let _one = lock(&self.set.change);
        let now = self.clock.now();
        let out = control::apply_routes(now, &mut lock(&self.template), batch);
        let changed = out.contains(&control::RouteOutcome::Applied);
        if changed && batch.op != control::RoutesOp::Check {
            let m = self.set.snapshot();
            self.publish(m.list.clone(), m.leaving.clone(), m.board.clone());
        }
        out
    }

    /// `set large_buffers N` above what the daemon registers ([`MAX_BULK_BUFFERS`]): refused
    /// with ENOMEM, as Lustre's `set large_buffers` is when it cannot allocate them
    /// (lnet_rtrpools_adjust), naming the cap, rather than accepted and capped where only the
    /// log would say so.
    fn beyond_registered(&self, req: &Request) -> Option<ControlError> {
        let Request::SetBuffers { pool, count } = req else {
            return None;
        };
        let cap = MAX_BULK_BUFFERS;
        (pool.trim_end_matches("_buffers") == "large" && *count > cap).then(|| {
            ControlError::new(
                errno::ENOMEM,
                format!(
                    "large_buffers: {count} is more than the {cap} this daemon registers (each \
                     is 1 MiB of memory registered with every NI's fabric, pinned on verbs): \
                     set at most {cap}"
                ),
            )
        })
    }

    /// `net add` (an import's new NI): starts NI `ni` of `net` on its own thread with the
    /// node-wide settings as they are, and tells every other loop its NID. As
    /// lnet_add_net_common: a NID already running is EEXIST, and a net that a route leads to
    /// is EUSERS (adding it would invalidate the routing configuration). The NI registers the
    /// router buffers for bulk data before the answer (the publish's rounds), so it forwards
    /// bulk at once.
    fn add_ni(
        self: &Arc<Self>,
        net: &router::yaml_config::NetSettings,
        ni: &router::yaml_config::NiSettings,
        doc: &DaemonConfig,
    ) -> Result<(), ControlError> {
        let nid = ni.ni.nid;
        let what = format!("net add {nid}");
        if let Some(e) = self.fixed_nis(&what) {
            return Err(e);
        }
        let _one = lock(&self.set.change);
        let m = self.set.snapshot();
        if m.list.iter().any(|x| x.nid == nid) {
            return Err(ControlError::new(
                errno::EEXIST,
                format!("{what}: the NI exists"),
            ));
        }
        {
            let t = lock(&self.template);
            let why = if !t.routes().to_net(nid.net()).is_empty() {
                Some(format!("a route leads to {}", nid.net()))
            } else {
                t.routes()
                    .routes()
                    .find(|r| r.gateway == nid)
                    .map(|r| format!("it is the gateway of the route to {}", r.net))
            };
            if let Some(why) = why {
                return Err(ControlError::new(
                    errno::EUSERS,
                    format!(
                        "{what}: {why}; adding it would invalidate the routing configuration \
                         (delete the route first)"
                    ),
                ));
            }
        }
        let mut nids = m.nids();
        nids.push(nid);
        let board = m.board.carried(&m.nids(), &nids);
        let incarnation = self.next_incarnation.fetch_add(1, Ordering::Relaxed);
        let mut net = net.clone();
        net.nis = vec![ni.clone()];
        // The node as it is now; the loop adopts the settings again at its first turn.
        let node_cfg = {
            let t = lock(&self.template);
            let settings = NodeSettings::of(&t);
            let single = DaemonConfig {
                nets: vec![net.clone()],
                ..self.base.clone()
            };
            let mut c = single.node_config(incarnation);
            c.routes = settings.routes;
            c.globals = settings.globals;
            c.gateway_health = settings.gateway_health;
            c.routing = router::RoutingConfig {
                enabled: settings.routing,
                buffers: settings.buffers.share(nids.len()),
                ..c.routing
            };
            c.node_nids = nids.clone();
            c.net_alive = Some(board.clone());
            c
        };
        if !net.fabric_given {
            choose_fabric(&mut net);
        }
        if !fabric_supported(net.fabric) {
            return Err(ControlError::new(
                errno::EINVAL,
                format!(
                    "{what}: fabric '{}' is not available in this lnet-router",
                    net.fabric.as_str()
                ),
            ));
        }
        // Another NI of ours on its listen address: refused at once (binding it would wait
        // 10 s for an address that is not going away).
        let listen = listen_of(ni);
        if let Some(other) = m
            .list
            .iter()
            .find(|x| x.kind == net.fabric && x.listen.is_some_and(|a| listens_clash(a, listen)))
        {
            return Err(ControlError::new(
                errno::EADDRINUSE,
                format!(
                    "{what}: NI {} of this daemon already listens on {listen} (give another \
                     --listen address or port)",
                    other.nid
                ),
            ));
        }
        // Where peers listen: every document's `peers:` so far, this one's last.
        self.peers.merge(&doc.peers);
        let stopping = || self.shared.stop.load(Ordering::Relaxed);
        let f = start_fabric(&self.peers, net.fabric, ni, &stopping).map_err(|e| {
            // start_fabric names the NI ("NI NID: ..."), which `what` names already.
            let e = e.strip_prefix(&format!("NI {nid}: ")).unwrap_or(&e);
            ControlError::new(errno::EADDRNOTAVAIL, format!("{what}: {e}"))
        })?;
        let node = LnetNode::new(node_cfg, self.clock.now());
        let (rt, wake) = NiRuntime::new(node, f.driver, self.clock)
            .map_err(|e| ControlError::new(errno::EIO, format!("{what}: {e}")))?;
        let (l, member) = self.make_loop(rt, wake, f.kind, extras_of(ni, f.listen));
        // Running first, published next: nobody hands it anything before it runs, and a
        // failed start leaves nothing to undo. Its first turn may adopt the set without it
        // (its own NID stays its own), then this one.
        self.spawn(l)
            .map_err(|e| ControlError::new(errno::ESHUTDOWN, format!("{what}: {e}")))?;
        lock(&self.template).set_node_nids(nids, board.clone());
        let mut list = m.list.clone();
        list.push(member);
        self.publish(list, m.leaving.clone(), board);
        info!(%nid, fabric = f.kind.as_str(), listen = %f.listen, "NI added");
        Ok(())
    }

    /// `net del`: stops the NIs `which` picks, after every other loop has stopped counting on
    /// them, each closing its connections gracefully (within the shutdown bound); returns how
    /// many. When a net loses its last NI, the routes through it go too, as in Lustre
    /// (lnet_shutdown_lndnet -> lnet_peer_tables_cleanup deletes the routes of the gateways on
    /// that net).
    fn del_nis(&self, what: &str, which: impl Fn(Nid) -> bool) -> Result<usize, ControlError> {
        if let Some(e) = self.fixed_nis(what) {
            return Err(e);
        }
        let _one = lock(&self.set.change);
        let m = self.set.snapshot();
        let (gone, stay): (Vec<Member>, Vec<Member>) =
            m.list.iter().cloned().partition(|x| which(x.nid));
        if gone.is_empty() {
            return Err(ControlError::new(
                errno::ENOENT,
                format!("{what}: no such NI"),
            ));
        }
        let nids: Vec<Nid> = stay.iter().map(|x| x.nid).collect();
        let board = m.board.carried(&m.nids(), &nids);
        let dead: Vec<router::RouteConfig> = lock(&self.template)
            .routes()
            .routes()
            .filter(|r| !nids.iter().any(|n| n.net() == r.gateway.net()))
            .copied()
            .collect();
        for r in dead {
            let _ = self.on_template(Request::RouteDel {
                net: r.net.to_string(),
                gateway: Some(r.gateway.to_string()),
            });
            info!(net = %r.net, gateway = %r.gateway, "route removed with the last NI of its gateway's net");
        }
        lock(&self.template).set_node_nids(nids, board.clone());
        let mut leaving = m.leaving.clone();
        leaving.extend(gone.iter().cloned());
        self.publish(stay, leaving, board);
        for g in &gone {
            g.stop.store(true, Ordering::Release);
            g.wake.wake();
        }
        // Each ends within the shutdown bound; waited for here so that the NID and its port are
        // free when the answer comes (a `net add` of it may follow at once). The handle stays
        // in the list until it is joined, so a stop meanwhile still waits for it.
        let bound = StdDuration::from_nanos(SHUTDOWN_BOUND.as_nanos()) + ADOPT_BOUND * 2;
        let started = std::time::Instant::now();
        for g in &gone {
            loop {
                let finished = {
                    let mut threads = lock(&self.set.threads);
                    let i = threads.iter().position(|t| t.nid == Some(g.nid));
                    match i {
                        Some(i) if threads[i].handle.is_finished() => {
                            Some(Some(threads.swap_remove(i)))
                        }
                        Some(_) => None,
                        // The main thread joined it (a stop).
                        None => Some(None),
                    }
                };
                match finished {
                    Some(Some(t)) => {
                        if t.handle.join().is_err() {
                            error!(nid = %g.nid, "the thread of the NI removed panicked");
                        }
                        break;
                    }
                    Some(None) => break,
                    None if started.elapsed() >= bound => {
                        warn!(nid = %g.nid, "the NI removed has not finished closing; left to end by itself");
                        break;
                    }
                    None => std::thread::sleep(StdDuration::from_millis(5)),
                }
            }
            info!(nid = %g.nid, "NI removed");
        }
        // Ended: owed nothing more.
        let m = self.set.snapshot();
        let leaving: Vec<Member> = m
            .leaving
            .iter()
            .filter(|x| x.running.load(Ordering::Acquire))
            .cloned()
            .collect();
        if leaving.len() != m.leaving.len() {
            self.publish(m.list.clone(), leaving, m.board.clone());
        }
        Ok(gone.len())
    }
}

/// What the NI threads share: the stop every one of them obeys, and the first fatal error.
#[derive(Default)]
struct Shutdown {
    stop: AtomicBool,
    fatal: Mutex<Option<String>>,
}

impl Shutdown {
    /// Records a fatal error (the first one is reported) and stops every NI.
    fn fail(&self, e: String) {
        lock(&self.fatal).get_or_insert(e);
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One NI's loop: its runtime's turns, its control requests, its capture, until a stop and a
/// finished (bounded) graceful shutdown. It runs on a thread of its own ([`NiLoop::run`]) or
/// beside other NIs' loops on one thread ([`run_shared`]).
struct NiLoop {
    nid: Nid,
    rt: NiRuntime<Box<dyn Driver + Send>>,
    kind: FabricKind,
    control: Control<SyncSender<Response>>,
    req_rx: Receiver<ControlMsg>,
    hands: Handovers,
    daemon: Arc<Daemon>,
    /// The [`NiSet`] epoch this loop last adopted (the daemon reads it: [`Member::adopted`]).
    adopted: Arc<AtomicU64>,
    /// [`Member::running`]: cleared when this loop ends.
    running: Arc<AtomicBool>,
    /// The node-wide settings last applied, and the NI count its buffer share was for.
    applied: Option<(Arc<NodeSettings>, usize)>,
    /// This NI alone is to stop (`net del`).
    stop: Arc<AtomicBool>,
    /// The epoch that removed this NI, once it noticed: it ends only after every other loop
    /// has adopted it, so that none can hand it anything it would not answer.
    removed_at: Option<u64>,
    shutdown_deadline: Option<lnd::time::Instant>,
    failed: bool,
    capture: CaptureState,
    next_capture: u64,
    lst: NiSelftest,
    peer_log: PeerLog,
    bulk: LoopBulk,
}

/// One NI loop's side of the router buffers for bulk data (`router::bulk_pool`): its fabric's
/// registrations of them, and the plan it last took.
struct LoopBulk {
    id: LoopId,
    regs: HashMap<usize, lnd::fabric::Registration>,
    views: HashMap<usize, router::BulkRegion>,
    plan: Option<Arc<BulkPlan>>,
    /// The table revision last handed to the node.
    rev: Option<u64>,
    /// The plan generation at which a registration failed: not tried again before the next
    /// change (a failing registration is not retried every round).
    failed_gen: Option<u64>,
    next_release_check: std::time::Instant,
}

impl LoopBulk {
    fn new(id: LoopId) -> LoopBulk {
        LoopBulk {
            id,
            regs: HashMap::new(),
            views: HashMap::new(),
            plan: None,
            rev: None,
            failed_gen: None,
            next_release_check: std::time::Instant::now(),
        }
    }
}

/// Ends an NI loop's run, however it ends: its member no longer counts as running, and a
/// panic stops the daemon (every other NI closes gracefully) rather than leave a dead NI
/// in the tables.
struct LoopEnd {
    nid: Nid,
    running: Arc<AtomicBool>,
    daemon: Arc<Daemon>,
}

impl Drop for LoopEnd {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Release);
        if std::thread::panicking() {
            self.daemon
                .shared
                .fail(format!("the thread of NI {} panicked", self.nid));
            self.daemon.wake_all();
        }
    }
}

impl NiLoop {
    fn run(mut self) {
        let _end = LoopEnd {
            nid: self.nid,
            running: Arc::clone(&self.running),
            daemon: Arc::clone(&self.daemon),
        };
        while !self.step(MAX_WAIT) {}
    }

    /// Takes the NIs and the node-wide settings as they are now, if they changed since.
    fn adopt(&mut self) {
        let epoch = self.daemon.set.epoch.load(Ordering::Acquire);
        if epoch == self.adopted.load(Ordering::Relaxed) {
            return;
        }
        let m = self.daemon.set.snapshot();
        self.rt.node_mut().set_node_nids(m.nids(), m.board.clone());
        self.apply_settings(&m);
        self.adopt_bulk(&m);
        let e = m.epoch;
        self.hands.adopt(m);
        self.adopted.store(e, Ordering::Release);
    }

    /// Takes the bulk buffers' plan of `m`: registers with this NI's fabric every buffer it
    /// lists (not when this NI is leaving), deregisters the ones it retired, tells the pool,
    /// and gives the node the table and its share when they changed. A registration that
    /// fails: one warning, and this NI stays out of the table (bulk through it is refused as
    /// `no_bulk_buffer`) until the next change tries again.
    fn adopt_bulk(&mut self, m: &Members) {
        let plan = &m.bulk;
        let b = &mut self.bulk;
        if b.plan.as_ref().is_some_and(|p| Arc::ptr_eq(p, plan)) {
            return;
        }
        b.plan = Some(Arc::clone(plan));
        let member = m.list.iter().any(|x| x.id == b.id);
        let live: std::collections::HashSet<usize> = plan.slots.iter().map(|(k, _)| *k).collect();
        let mut changed = false;
        let retired: Vec<usize> = b
            .regs
            .keys()
            .copied()
            .filter(|k| !live.contains(k))
            .collect();
        for k in retired {
            if let (Some(reg), Some(r)) = (b.regs.remove(&k), self.rt.driver_mut().registry()) {
                r.deregister(reg);
            }
            b.views.remove(&k);
            changed = true;
        }
        if member && b.failed_gen != Some(plan.gen) {
            changed |= b.failed_gen.take().is_some();
            for (k, mem) in &plan.slots {
                if b.regs.contains_key(k) {
                    continue;
                }
                let reg = match self.rt.driver_mut().registry() {
                    Some(r) => r.register_shared(mem),
                    None => Err(std::io::Error::other("this fabric registers no memory")),
                };
                changed = true;
                match reg {
                    Ok(reg) => {
                        b.views.insert(*k, router::BulkRegion::of(&reg));
                        b.regs.insert(*k, reg);
                    }
                    Err(e) => {
                        warn!(
                            nid = %self.nid,
                            registered = b.regs.len(),
                            wanted = plan.slots.len(),
                            "cannot register the router buffers for bulk data ({e}): bulk PUTs \
                             forwarded through this NI are refused (no_bulk_buffer)"
                        );
                        b.failed_gen = Some(plan.gen);
                        break;
                    }
                }
            }
        }
        if changed {
            lock(&self.daemon.bulk).set_registered(b.id, b.views.clone(), b.failed_gen.is_some());
        }
        if b.rev != Some(plan.rev) {
            b.rev = Some(plan.rev);
            let owned = match member {
                true => plan.owned.get(&b.id).cloned().unwrap_or_default(),
                false => Vec::new(),
            };
            let now = self.rt.now();
            self.rt
                .node_mut()
                .set_bulk_buffers(now, Arc::clone(&plan.table), owned);
            self.report_released();
        }
    }

    /// Hands the pool the router buffers the node let go since the last look.
    fn report_released(&mut self) {
        let ks = self.rt.node_mut().take_released_bulk();
        if !ks.is_empty() {
            lock(&self.daemon.bulk).release(self.bulk.id, &ks);
        }
    }

    /// The loop is ending: the buffers its node lends go back to the pool, but the ones a
    /// forward still holds (it may still be written on from them by another NI) are never lent
    /// again.
    fn end_bulk(&mut self) {
        if let Some(plan) = self.bulk.plan.clone() {
            let now = self.rt.now();
            self.rt
                .node_mut()
                .set_bulk_buffers(now, Arc::clone(&plan.table), Vec::new());
        }
        self.report_released();
        let held = self.rt.node().bulk_held();
        let stranded = lock(&self.daemon.bulk).end(self.bulk.id, &held);
        if stranded > 0 {
            warn!(nid = %self.nid, stranded, "router buffers for bulk data still held by forwards when this NI ended: not lent again");
        }
    }

    /// Takes the node-wide settings of `m` (what changed since the last ones): the route
    /// table, the globals, routing on or off, and this NI's share of the router buffers.
    fn apply_settings(&mut self, m: &Members) {
        let n = m.list.len().max(1);
        let s = &m.settings;
        let before = self.applied.take();
        let unchanged = before
            .as_ref()
            .is_some_and(|(a, count)| (Arc::ptr_eq(a, s) || **a == **s) && *count == n);
        self.applied = Some((Arc::clone(s), n));
        if unchanged {
            return;
        }
        let now = self.rt.now();
        let node = self.rt.node_mut();
        if !node.routes().routes().copied().eq(s.routes.iter().copied()) {
            let mut table = router::RouteTable::default();
            for r in &s.routes {
                // Checked by the template against the same NIDs.
                if let Err(e) = table.add(*r, node.node_nids()) {
                    warn!(net = %r.net, gateway = %r.gateway, "route not taken: {e}");
                }
            }
            node.set_routes(now, table);
        }
        node.adopt_globals(s.globals.clone());
        node.set_routing(now, s.routing);
        if node.gateway_health() != s.gateway_health {
            node.set_gateway_health(now, s.gateway_health);
        }
        let share = s.buffers.share(n);
        let had = before.map(|(a, count)| a.buffers.share(count));
        let has = node.routing_info().buffers();
        for (class, pick) in [
            (
                router::PoolClass::Tiny,
                (|b| b.tiny) as fn(BufferCounts) -> u32,
            ),
            (router::PoolClass::Small, |b| b.small),
            (router::PoolClass::Large, |b| b.large),
        ] {
            let want = pick(share);
            // Only a change of the share: a large pool capped at its registered buffers is
            // not asked again every time.
            if had.map(pick) != Some(want) && pick(has) != want {
                node.set_buffers(now, class, want);
            }
        }
    }

    /// One turn (waiting at most `wait`) and what follows it: handovers, events, control
    /// requests, the capture, the shutdown. True once this loop is finished.
    fn step(&mut self, wait: StdDuration) -> bool {
        let nid = self.nid;
        // An NI added or removed, or a node-wide setting changed: adopt them as they are now.
        self.adopt();
        // Handovers from the other NIs first, so that what they produce (a forward's send) goes
        // out in this turn's submission rather than a turn later; and out, what the last step
        // produced after its relay (a selftest's answer to a sibling NI, made from the events
        // or timers that step handled), which else waited for whatever woke this loop next
        // (RPCs between two NIs of a daemon took 20-40 ms).
        self.hands.relay(&mut self.rt);
        if !self.failed {
            let wait = self.lst.bound(wait, &self.rt);
            if let Err(e) = self.rt.turn(wait) {
                // The daemon stops only when this was its last working NI: one published (not
                // being added or removed) and no other NI of the set still has its fabric.
                let m = self.daemon.set.snapshot();
                let published = m.list.iter().any(|x| x.nid == nid);
                let others = m
                    .list
                    .iter()
                    .enumerate()
                    .any(|(i, x)| x.nid != nid && !m.board.failed(i));
                if others || !published {
                    // The NI is down (its siblings' ping replies say so, as Lustre reports an
                    // NI with a fatal HCA error), what it held fails, and the daemon's other
                    // NIs go on.
                    error!(%nid, "fabric failed: {e}; this NI is down, the other NIs go on (net del and net add it to start it again)");
                    self.rt.lose_fabric();
                } else {
                    // The daemon's only NI: its peers must still see a graceful close of
                    // anything left (not find out at their keepalive horizon), so it shuts
                    // down as on SIGTERM, then the daemon exits with the error.
                    error!(%nid, "fabric failed: {e}; closing every other connection");
                    self.failed = true;
                    self.daemon.shared.fail(format!("fabric of NI {nid}: {e}"));
                    self.daemon.wake_all();
                }
            }
        } else {
            std::thread::sleep(wait);
        }
        // A change published during the turn is taken before the requests are answered (a
        // `route show` right after a `route add` sees it).
        self.adopt();
        if self.rt.node().bulk_leaving() {
            let now = std::time::Instant::now();
            if now >= self.bulk.next_release_check {
                self.bulk.next_release_check = now + RELEASE_CHECK;
                self.report_released();
            }
        }
        let rt = &mut self.rt;
        let control = &mut self.control;
        self.hands.relay(rt);
        drain_events(rt, control, &mut self.lst, &mut self.peer_log);
        self.lst.tick(rt);
        let mut refreshed = false;
        while let Ok((req, reply)) = self.req_rx.try_recv() {
            debug!(?req, "control request");
            if !refreshed {
                control.set_fabric_counters(0, self.kind.as_str(), rt.driver().counters());
                refreshed = true;
            }
            let now = rt.now();
            let node = rt.node_mut();
            match req {
                Request::CaptureStart { duration_secs } => {
                    let resp = if !matches!(self.capture, CaptureState::Idle) {
                        Response::Error(ControlError::new(
                            errno::EBUSY,
                            "a capture is already running (one at a time); stop it first",
                        ))
                    } else if self.shutdown_deadline.is_some() {
                        Response::Error(ControlError::new(
                            errno::ESHUTDOWN,
                            "the daemon is shutting down",
                        ))
                    } else {
                        let unix_ns = SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| d.as_nanos() as u64);
                        let s = CaptureSession::start(
                            node,
                            self.next_capture,
                            now,
                            unix_ns,
                            duration_secs.map(Duration::from_secs),
                        );
                        self.next_capture += 1;
                        info!(id = s.id(), ?duration_secs, "capture started");
                        let started = Response::CaptureStarted(s.started());
                        self.capture = CaptureState::Running(s, reply.clone());
                        started
                    };
                    let _ = reply.try_send(resp);
                }
                Request::CaptureStop { id } => {
                    let resp = match std::mem::take(&mut self.capture) {
                        CaptureState::Running(s, out) if s.id() == id => {
                            let sum = end_capture(node, s, &out, "stopped");
                            self.capture = CaptureState::Ending(sum.clone(), out);
                            Response::CaptureDone(sum)
                        }
                        other => {
                            self.capture = other;
                            Response::Error(ControlError::new(
                                errno::ENOENT,
                                format!("no capture {id} is running"),
                            ))
                        }
                    };
                    let _ = reply.try_send(resp);
                }
                Request::Selftest { cmd } => {
                    if self.shutdown_deadline.is_some() {
                        let _ = reply.try_send(shutting_down());
                    } else {
                        self.lst.command(rt, cmd, reply);
                    }
                }
                req => {
                    if let Some((reply, resp)) = control.handle(now, node, req, reply) {
                        let _ = reply.try_send(resp);
                    }
                }
            }
            drain_events(rt, control, &mut self.lst, &mut self.peer_log);
        }
        // The clock only for what needs it: a loop comes here every turn.
        if !matches!(self.capture, CaptureState::Idle) {
            let now = rt.now();
            self.capture = std::mem::take(&mut self.capture).step(rt.node_mut(), now);
        }

        if self.removed_at.is_none() && self.stop.load(Ordering::Acquire) {
            // `net del` published the set without this NI before it asked it to stop.
            self.removed_at = Some(self.daemon.set.epoch.load(Ordering::Acquire));
        }
        if self.shutdown_deadline.is_none()
            && (self.daemon.shared.stop.load(Ordering::Relaxed) || self.removed_at.is_some())
        {
            let now = rt.now();
            rt.node_mut().shutdown(now);
            self.shutdown_deadline = Some(now.saturating_add(SHUTDOWN_BOUND));
        }
        let Some(deadline) = self.shutdown_deadline else {
            return false;
        };
        let now = rt.now();
        let node = rt.node_mut();
        if !node.is_shut_down() && now < deadline {
            return false;
        }
        // Removed alone (`net del`): not before every other loop has stopped handing this one
        // work (bounded: a loop takes a change at its next turn).
        if let Some(removed) = self.removed_at {
            let others = self.daemon.set.snapshot();
            let pending = others
                .list
                .iter()
                .chain(&others.leaving)
                .any(|m| m.nid != nid && m.behind(removed));
            let bound =
                deadline.saturating_add(Duration::from_nanos(ADOPT_BOUND.as_nanos() as u64));
            if pending && now < bound && !self.daemon.shared.stop.load(Ordering::Relaxed) {
                return false;
            }
        }
        let node = rt.node_mut();
        if !node.is_shut_down() {
            warn!(
                %nid,
                in_flight = node.messages_in_flight(),
                "graceful shutdown did not finish within {SHUTDOWN_BOUND:?}; exiting anyway"
            );
        }
        // The last actions (Destroys), and one more poll so they reach the wire.
        if !self.failed {
            rt.flush();
        }
        drain_events(rt, control, &mut self.lst, &mut self.peer_log);
        // Whatever this runtime still sends for the other loops is failed back to them (their
        // router buffers and credits come back), as is what they handed it before they let it
        // go; then the last of it is handed out before the channel closes (bounded: a full
        // channel is retried, a loop that is gone takes nothing).
        if !rt.node().is_shut_down() {
            rt.node_mut().abandon_forwards();
        }
        let started = std::time::Instant::now();
        loop {
            self.hands.relay(rt);
            if (self.hands.relay.waiting() == 0 && self.hands.rx.is_empty())
                || started.elapsed() >= ADOPT_BOUND
            {
                break;
            }
            std::thread::sleep(StdDuration::from_millis(1));
        }
        if let CaptureState::Running(s, out) = std::mem::take(&mut self.capture) {
            let sum = end_capture(rt.node_mut(), s, &out, "daemon shutting down");
            let _ = out.try_send(Response::CaptureDone(sum));
        }
        // Requests still queued get an answer rather than a dropped channel.
        while let Ok((_, reply)) = self.req_rx.try_recv() {
            let _ = reply.try_send(shutting_down());
        }
        for (_, reply) in self.lst.pending.drain() {
            let _ = reply.try_send(shutting_down());
        }
        self.end_bulk();
        true
    }
}

/// Every NI's loop on the calling thread (`--ni-threads shared`), in rounds of
/// [`router::runtime::shared_round`]: the first loop sleeps, for as long as the least any loop
/// may (its own deadline, the others' deadlines and queued work, and not at all while a
/// handover waits for any loop), and its driver watches the others' readiness descriptors, so
/// that work for any NI ends the sleep; the others are polled without waiting. Messages
/// forwarded between NIs then never cross threads. Needs drivers that can be watched (tcp).
fn run_shared(loops: Vec<NiLoop>) {
    let mut loops: Vec<SharedNi> = loops
        .into_iter()
        .map(|l| SharedNi { l, done: false })
        .collect();
    while loops.iter().any(|l| !l.done) {
        match shared_round(&mut loops, MAX_WAIT) {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }
    // Dropped together: a finished loop's ring stays open while another still watches it.
    drop(loops);
}

/// An NI loop in a shared thread's rounds: stepped until it has finished.
struct SharedNi {
    l: NiLoop,
    done: bool,
}

impl SharedLoop for SharedNi {
    type Error = std::convert::Infallible;

    fn turn(&mut self, wait: StdDuration) -> Result<(), Self::Error> {
        self.done = self.l.step(wait);
        Ok(())
    }

    fn wait_hint(&mut self, max_wait: StdDuration) -> StdDuration {
        self.l.rt.wait_hint(max_wait)
    }

    /// Handovers waiting for this loop, not only the sleeper's: a loop stepped before the one
    /// that handed it something (three NIs or more) takes it only in the next round, which
    /// must not wait out the sleep (found in review: up to MAX_WAIT per forward).
    fn has_pending(&self) -> bool {
        !self.l.hands.rx.is_empty()
    }

    fn finished(&self) -> bool {
        self.done
    }
}

/// One NI loop's side of the handovers: its inbox, and its relay ([`router::relay`]) to every
/// loop's link.
struct Handovers {
    rx: crossbeam_channel::Receiver<Handover>,
    links: MemberLinks,
    relay: Relay,
}

impl Handovers {
    /// The loops as they are now (an NI added or removed).
    fn adopt(&mut self, links: Arc<Members>) {
        self.links = MemberLinks::of(links);
    }

    /// Hands what the other loops handed over to this loop's node.
    fn take_in(&mut self, rt: &mut NiRuntime<Box<dyn Driver + Send>>) {
        if self.rx.is_empty() {
            return;
        }
        let now = rt.now();
        while let Ok(h) = self.rx.try_recv() {
            rt.node_mut().handle_handover(now, h);
        }
    }

    /// Takes in what the other loops handed over, then relays out what the node produced
    /// (and what waited): never blocks, wakes each loop that got something, fails a forward
    /// for a loop that is gone back at its origin (see `router::relay`).
    fn relay(&mut self, rt: &mut NiRuntime<Box<dyn Driver + Send>>) {
        self.take_in(rt);
        rt.relay(&mut self.relay, &mut self.links);
    }
}

/// The daemon's loops as the relay reaches them: the published [`Members`] (their channels),
/// with their NIDs taken once per change rather than once per relay.
#[derive(Default)]
struct MemberLinks {
    members: Arc<Members>,
    nids: Vec<Nid>,
    leaving: Vec<Nid>,
}

impl MemberLinks {
    fn of(members: Arc<Members>) -> MemberLinks {
        MemberLinks {
            nids: members.nids(),
            leaving: members.leaving.iter().map(|m| m.nid).collect(),
            members,
        }
    }

    fn link(&self, to: Dest) -> Option<&ChannelLink> {
        match to {
            Dest::Sibling(i) => self.members.list.get(i),
            Dest::Leaving(j) => self.members.leaving.get(j),
        }
        .map(|m| &m.hand)
    }
}

impl Links for MemberLinks {
    fn nids(&self) -> &[Nid] {
        &self.nids
    }

    fn leaving(&self) -> &[Nid] {
        &self.leaving
    }

    fn board(&self) -> &NetAlive {
        &self.members.board
    }

    fn try_hand(&mut self, to: Dest, h: Handover) -> Handed {
        match self.link(to) {
            Some(l) => l.try_hand(h),
            None => Handed::Gone(h),
        }
    }

    fn wake(&mut self, to: Dest) {
        if let Some(l) = self.link(to) {
            l.wake();
        }
    }
}

/// One NI's fabric, started.
struct NiFabric {
    kind: FabricKind,
    driver: Box<dyn Driver + Send>,
    /// The address it listens on, as bound (`net show -v` shows it: a port 0 resolved).
    listen: std::net::SocketAddr,
}

fn fabric_supported(kind: FabricKind) -> bool {
    match kind {
        FabricKind::Tcp => true,
        FabricKind::Verbs => cfg!(feature = "verbs"),
        FabricKind::Sim => false,
    }
}

/// How long an NI's tcp fabric retries a listen address in use. Right after a crash the dead
/// process's listening socket may linger (its io_uring's files are released asynchronously),
/// and a router restarted by systemd must come back; but the holder may as well be a live
/// process, which nothing here can tell.
const BIND_RETRY: StdDuration = StdDuration::from_secs(10);
/// The pause between two tries.
const BIND_RETRY_STEP: StdDuration = StdDuration::from_millis(100);

/// Where peers listen (`peers:` of the configuration and of every import since), shared by
/// every NI's fabric: a fabric asks at each connect, so an address imported later is used by
/// the NIs already running (they kept a copy from their start, and went on connecting to the
/// NID's own address, port 987).
#[derive(Clone, Default)]
struct PeerAddrs(Arc<std::sync::RwLock<HashMap<Nid, std::net::SocketAddr>>>);

impl PeerAddrs {
    fn get(&self, nid: Nid) -> Option<std::net::SocketAddr> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&nid)
            .copied()
    }

    /// Adds or replaces `given`'s addresses; returns how many were new or different.
    fn merge(&self, given: &HashMap<Nid, std::net::SocketAddr>) -> usize {
        let mut known = self.0.write().unwrap_or_else(|e| e.into_inner());
        given
            .iter()
            .filter(|&(nid, addr)| known.insert(*nid, *addr) != Some(*addr))
            .count()
    }

    /// How many of `given`'s addresses [`PeerAddrs::merge`] would add or change.
    fn differ(&self, given: &HashMap<Nid, std::net::SocketAddr>) -> usize {
        let known = self.0.read().unwrap_or_else(|e| e.into_inner());
        given
            .iter()
            .filter(|&(nid, addr)| known.get(nid) != Some(addr))
            .count()
    }

    fn all(&self) -> Vec<(Nid, std::net::SocketAddr)> {
        let known = self.0.read().unwrap_or_else(|e| e.into_inner());
        known.iter().map(|(n, a)| (*n, *a)).collect()
    }
}

/// Starts the fabric of one NI: listening, ready for the loop. A tcp listen address in use is
/// retried for up to [`BIND_RETRY`], unless `stopping` says the daemon is asked to stop (a
/// SIGTERM during the wait was ignored until its end).
fn start_fabric(
    peers: &PeerAddrs,
    kind: FabricKind,
    ni: &router::yaml_config::NiSettings,
    stopping: &dyn Fn() -> bool,
) -> Result<NiFabric, String> {
    let nid = ni.ni.nid;
    if nid.net().lnd() != lnd::wire::LndType::O2ib {
        // Kernel Lustre speaks another LND on such a net (ksocklnd on tcp nets, port 988): its
        // nodes would fail to connect here with nothing on either side saying why.
        warn!(
            %nid,
            "net {} is not an o2ib net: ulnet speaks o2iblnd on every NI, so kernel Lustre \
             nodes on this net ({}) cannot connect to this NI; only ulnet nodes can",
            nid.net(),
            if nid.net().lnd() == lnd::wire::LndType::Tcp { "ksocklnd" } else { "another LND" }
        );
    }
    let peers = peers.clone();
    let (driver, bound): (Box<dyn Driver + Send>, _) = match kind {
        FabricKind::Tcp => {
            // As o2iblnd: the NID's address and port 987 unless the file says otherwise.
            let listen = ni.listen.unwrap_or_else(|| o2ib_address(nid));
            // The transport's retry horizon is the LND timeout, as an RC queue pair's retries are.
            let tcp = TcpConfig {
                user_timeout: ni.ni.tunables.timeout.into(),
                busy_poll: StdDuration::from_micros(ni.busy_poll_us.into()),
                handshake_limit: ni.handshake_limit as usize,
                // Retried here, where a stop can cut the wait short.
                bind_retry: StdDuration::ZERO,
                ..TcpConfig::default()
            };
            // Our own NID is where we listen, as bound (port 0 resolved): LNet health's
            // recovery pings of this NI go to it through the fabric (a self-connection).
            let own: Arc<std::sync::OnceLock<std::net::SocketAddr>> = Arc::default();
            let own_addr = Arc::clone(&own);
            let me = nid;
            let resolve = move |n: Nid| {
                if n == me {
                    return Some(own_addr.get().copied().unwrap_or(listen));
                }
                peers.get(n).or_else(|| Some(o2ib_address(n)))
            };
            let started = std::time::Instant::now();
            let mut warned = false;
            let f = loop {
                match TcpFabric::bind_with(listen, resolve.clone(), tcp.clone()) {
                    Ok(f) => break f,
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                        let waited = started.elapsed();
                        if waited >= BIND_RETRY || stopping() {
                            let after = if waited >= BIND_RETRY {
                                format!(" (still, after retrying for {BIND_RETRY:?})")
                            } else {
                                String::new()
                            };
                            return Err(format!("NI {nid}: cannot listen on {listen}: {e}{after}"));
                        }
                        if !std::mem::replace(&mut warned, true) {
                            warn!(
                                %nid,
                                %listen,
                                "listen address in use; retrying for up to {BIND_RETRY:?} in \
                                 case its holder is going away"
                            );
                        }
                        std::thread::sleep(BIND_RETRY_STEP);
                    }
                    Err(e) => return Err(format!("NI {nid}: cannot listen on {listen}: {e}")),
                }
            };
            info!(%nid, listen = %f.local_addr(), fabric = "tcp", "NI up");
            let bound = f.local_addr();
            let _ = own.set(bound);
            (Box::new(f), bound)
        }
        #[cfg(feature = "verbs")]
        FabricKind::Verbs => {
            use lnd::driver::verbs::{VerbsConfig, VerbsFabric};
            // o2iblnd's convention: a peer listens on its NID's IPv4 address, port 987 (the
            // `service` parameter), unless the peers table says otherwise.
            let listen = ni.listen.unwrap_or_else(|| o2ib_address(nid));
            let vc = VerbsConfig {
                listen,
                busy_poll: StdDuration::from_micros(ni.busy_poll_us.into()),
                ..VerbsConfig::default()
            };
            let me = nid;
            let own: Arc<std::sync::OnceLock<std::net::SocketAddr>> = Arc::default();
            let own_addr = Arc::clone(&own);
            let f = VerbsFabric::new(vc, move |n| {
                if n == me {
                    // Ourselves (a local NI's recovery ping): where we listen, as bound.
                    return Some(own_addr.get().copied().unwrap_or(listen));
                }
                peers.get(n).or_else(|| Some(o2ib_address(n)))
            })
            .map_err(|e| format!("NI {nid}: {e}"))?;
            info!(%nid, listen = %f.local_addr(), fabric = "verbs", "NI up");
            let bound = f.local_addr();
            let _ = own.set(bound);
            (Box::new(f), bound)
        }
        other => {
            return Err(format!(
                "NI {nid}: fabric '{}' is not available in this lnet-router",
                other.as_str()
            ))
        }
    };
    Ok(NiFabric {
        kind,
        driver,
        listen: bound,
    })
}

/// Where an o2ib peer listens by default: its NID's address, o2iblnd's service port 987 (on
/// either fabric, unless `listen:` / `peers:` say otherwise).
fn o2ib_address(nid: lnd::wire::Nid) -> std::net::SocketAddr {
    let ip = std::net::Ipv4Addr::from(nid.addr());
    std::net::SocketAddr::new(ip.into(), 987)
}

/// The one capture the daemon runs at a time (`lnetctl capture`).
#[derive(Default)]
enum CaptureState {
    #[default]
    Idle,
    /// Streaming records to the capturing connection.
    Running(CaptureSession, SyncSender<Response>),
    /// Finished; the summary waits for room in the stream.
    Ending(CaptureSummary, SyncSender<Response>),
}

impl CaptureState {
    /// One turn of the loop: stream what the engines captured, end the capture when its
    /// duration is over or its client is gone, deliver the final summary.
    fn step(self, node: &mut LnetNode, now: lnd::time::Instant) -> CaptureState {
        match self {
            CaptureState::Idle => CaptureState::Idle,
            CaptureState::Running(mut s, out) => {
                if !s.drain(node, |chunk| deliver(&out, Response::CaptureData(chunk))) {
                    let sum = s.finish(node, "lnetctl went away");
                    info!(
                        captured = sum.captured,
                        dropped = sum.dropped,
                        "capture ended: {}",
                        sum.reason
                    );
                    return CaptureState::Idle;
                }
                if s.expired(now) {
                    let sum = end_capture(node, s, &out, "duration elapsed");
                    return CaptureState::Ending(sum, out).step(node, now);
                }
                CaptureState::Running(s, out)
            }
            CaptureState::Ending(sum, out) => {
                match deliver(&out, Response::CaptureDone(sum.clone())) {
                    Delivery::Full => CaptureState::Ending(sum, out),
                    Delivery::Queued | Delivery::Gone => CaptureState::Idle,
                }
            }
        }
    }
}

/// Streams the records still held, then turns capturing off.
fn end_capture(
    node: &mut LnetNode,
    mut s: CaptureSession,
    out: &SyncSender<Response>,
    reason: &str,
) -> CaptureSummary {
    s.drain(node, |chunk| deliver(out, Response::CaptureData(chunk)));
    let sum = s.finish(node, reason);
    info!(
        captured = sum.captured,
        dropped = sum.dropped,
        "capture ended: {reason}"
    );
    sum
}

fn deliver(out: &SyncSender<Response>, r: Response) -> Delivery {
    match out.try_send(r) {
        Ok(()) => Delivery::Queued,
        Err(TrySendError::Full(_)) => Delivery::Full,
        Err(TrySendError::Disconnected(_)) => Delivery::Gone,
    }
}

/// A registry for a driver that registers nothing: the selftest then answers brw with
/// ENOMEM rather than moving data.
struct NoRegistry;

impl lnd::fabric::Registry for NoRegistry {
    fn register(&mut self, _: Vec<u8>) -> std::io::Result<lnd::fabric::Registration> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this fabric registers no memory",
        ))
    }

    fn read(&self, _: &lnd::fabric::Registration, _: u64, _: &mut [u8]) -> bool {
        false
    }

    fn deregister(&mut self, _: lnd::fabric::Registration) -> Option<Vec<u8>> {
        None
    }
}

/// The driver's memory registration, or `none`'s refusals for a driver that has none.
fn registry<'a>(
    driver: &'a mut Box<dyn Driver + Send>,
    none: &'a mut NoRegistry,
) -> &'a mut dyn lnd::fabric::Registry {
    match driver.registry() {
        Some(r) => r,
        None => none,
    }
}

/// One NI loop's selftest: the service, test client and console (none unless the config
/// says `selftest: enable: 1`), and the control requests whose console command is still
/// running.
struct NiSelftest {
    st: Option<Selftest>,
    pending: HashMap<u64, SyncSender<Response>>,
}

impl NiSelftest {
    /// Bounds a turn's wait by the selftest's next deadline.
    fn bound(&self, wait: StdDuration, rt: &NiRuntime<Box<dyn Driver + Send>>) -> StdDuration {
        let Some(st) = &self.st else {
            return wait;
        };
        let now = rt.now();
        [st.poll_timeout(), st.console_timeout()]
            .into_iter()
            .flatten()
            .map(|d| StdDuration::from(d.saturating_duration_since(now)))
            .fold(wait, StdDuration::min)
    }

    /// Runs the selftest's timers that are due, and answers finished console commands.
    fn tick(&mut self, rt: &mut NiRuntime<Box<dyn Driver + Send>>) {
        let Some(st) = self.st.as_mut() else {
            return;
        };
        let now = rt.now();
        let due = [st.poll_timeout(), st.console_timeout()]
            .into_iter()
            .flatten()
            .any(|d| d <= now);
        if due {
            let (node, driver) = rt.parts();
            let mut none = NoRegistry;
            let reg = registry(driver, &mut none);
            st.handle_timeout(now, node, reg);
            st.console_tick(now, node, reg);
        }
        self.answer();
    }

    /// Runs a console command: answered now, or once its transaction ends.
    fn command(
        &mut self,
        rt: &mut NiRuntime<Box<dyn Driver + Send>>,
        cmd: router::selftest::LstCommand,
        reply: SyncSender<Response>,
    ) {
        let Some(st) = self.st.as_mut() else {
            let _ = reply.try_send(Response::Error(ControlError::new(
                errno::EOPNOTSUPP,
                "lnet_selftest is not enabled on this daemon ('selftest: enable: 1' in its \
                 config, as a Lustre node loads lnet_selftest)",
            )));
            return;
        };
        let now = rt.now();
        let (node, driver) = rt.parts();
        let mut none = NoRegistry;
        let reg = registry(driver, &mut none);
        match st.console(now, node, reg, cmd) {
            ConsoleStart::Done(r) => {
                let _ = reply.try_send(lst_response(r));
            }
            ConsoleStart::Pending(id) => {
                self.pending.insert(id, reply);
            }
        }
        self.answer();
    }

    fn answer(&mut self) {
        let Some(st) = self.st.as_mut() else {
            return;
        };
        while let Some((id, r)) = st.poll_console() {
            if let Some(reply) = self.pending.remove(&id) {
                let _ = reply.try_send(lst_response(r));
            }
        }
    }
}

fn lst_response(r: Result<router::selftest::LstReply, router::selftest::LstError>) -> Response {
    match r {
        Ok(r) => Response::Selftest(r),
        Err(e) => Response::Error(ControlError::new(e.errno, e.message)),
    }
}

/// Peer up/down lines at info level, at most [`PeerLog::BUDGET`] per [`PeerLog::WINDOW`] per
/// NI; the rest are counted and summed up in one line when the window ends. A peer churning
/// connections (or a hostile one: the audit's 10,000 connections in 0.9 s wrote 20,001 lines,
/// 1.7 MB) must not flood the log; the peers' counters keep every event.
#[derive(Debug, Default)]
struct PeerLog {
    window_start: Option<std::time::Instant>,
    lines: u32,
    suppressed: u64,
}

impl PeerLog {
    const WINDOW: StdDuration = StdDuration::from_secs(10);
    const BUDGET: u32 = 100;

    /// Whether a line may be written at `now`; when a window with suppressed lines ends,
    /// the count of what was suppressed comes back to be logged.
    fn admit(&mut self, now: std::time::Instant) -> (bool, Option<u64>) {
        let mut ended = None;
        match self.window_start {
            Some(t) if now.saturating_duration_since(t) < Self::WINDOW => {}
            _ => {
                if self.suppressed > 0 {
                    ended = Some(self.suppressed);
                }
                self.window_start = Some(now);
                self.lines = 0;
                self.suppressed = 0;
            }
        }
        if self.lines < Self::BUDGET {
            self.lines += 1;
            (true, ended)
        } else {
            self.suppressed += 1;
            (false, ended)
        }
    }
}

fn drain_events(
    rt: &mut NiRuntime<Box<dyn Driver + Send>>,
    control: &mut Control<SyncSender<Response>>,
    lst: &mut NiSelftest,
    peer_log: &mut PeerLog,
) {
    // The clock only when there is an event to handle: a loop comes here every turn.
    if !rt.node().has_events() {
        lst.answer();
        return;
    }
    let now = rt.now();
    let (node, driver) = rt.parts();
    let mut none = NoRegistry;
    while let Some(ev) = node.poll_event() {
        let reg = registry(driver, &mut none);
        if let Some(st) = lst.st.as_mut() {
            if st.handle_event(now, node, reg, &ev) {
                continue;
            }
        }
        match &ev {
            LnetEvent::PeerUp { .. } | LnetEvent::PeerDown { .. } => {
                let (write, ended) = peer_log.admit(std::time::Instant::now());
                if let Some(n) = ended {
                    info!(
                        suppressed = n,
                        "peer up/down lines over {} per {} s were not logged (counters keep them)",
                        PeerLog::BUDGET,
                        PeerLog::WINDOW.as_secs()
                    );
                }
                match &ev {
                    LnetEvent::PeerUp { nid, .. } if write => info!(%nid, "peer up"),
                    LnetEvent::PeerDown { nid, reason, .. } if write => {
                        info!(%nid, ?reason, "peer down")
                    }
                    _ => debug!(?ev, "peer event"),
                }
            }
            LnetEvent::Put { from, portal, .. } => debug!(%from, portal, "PUT (no consumer)"),
            _ => {}
        }
        if let Some((reply, resp)) = control.on_event(&ev) {
            let _ = reply.try_send(resp);
        }
    }
    lst.answer();
}

/// How long a control client may idle between requests, and take to send one.
#[derive(Copy, Clone, Debug)]
struct ClientLimits {
    idle: StdDuration,
    request: StdDuration,
}

/// Takes one client off [`ControlCounters::active`] when its thread ends, however it ends.
struct ActiveClient(Arc<ControlCounters>);

impl Drop for ActiveClient {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The control clients holding the [`control::MAX_CLIENTS`] slots, as the control thread sees
/// them when a new one comes and every slot is taken. A client with no request in flight (a
/// stuck monitoring script, a leaked descriptor) held its slot until the idle timeout, so an
/// operator's `lnetctl net show` or `ping` failed for up to 30 s: now the client idle longest
/// is closed to make room, at once, and counted (`evicted`). Never one being answered, nor one
/// receiving a stream: a capture's records, or a selftest session's progress (`run-test` polls
/// its statistics on the connection that opened the session).
#[derive(Default)]
struct Clients {
    next: u64,
    served: HashMap<u64, Served>,
}

struct Served {
    /// Since when it has waited for its next request with none in flight; `None` while one is
    /// being answered.
    idle_since: Option<std::time::Instant>,
    /// Receiving a stream: never closed to make room.
    streaming: bool,
    /// Its socket (a second descriptor), to end its reading side when it is closed to make
    /// room: its thread's read then ends, and the thread tells it why and closes.
    stream: UnixStream,
}

impl Clients {
    /// Takes a slot for a client served from now on (idle: it has sent nothing yet).
    fn add(&mut self, stream: UnixStream) -> u64 {
        let id = self.next;
        self.next += 1;
        self.served.insert(
            id,
            Served {
                idle_since: Some(std::time::Instant::now()),
                streaming: false,
                stream,
            },
        );
        id
    }

    /// Client `id` waits for its next request; false if it was closed to make room.
    fn waiting(&mut self, id: u64) -> bool {
        self.served.get_mut(&id).is_some_and(|c| {
            c.idle_since.get_or_insert_with(std::time::Instant::now);
            true
        })
    }

    /// Client `id` has a request in flight (or is done reading); false if it was closed to
    /// make room before the request came.
    fn answering(&mut self, id: u64) -> bool {
        self.served.get_mut(&id).is_some_and(|c| {
            c.idle_since = None;
            true
        })
    }

    fn set_streaming(&mut self, id: u64, on: bool) {
        if let Some(c) = self.served.get_mut(&id) {
            c.streaming = on;
        }
    }

    /// Closes the client idle longest, not streaming, to make room: takes its slot and ends
    /// its socket's reading side. False if every client is being answered or streams.
    fn evict(&mut self) -> bool {
        let idlest = self
            .served
            .iter()
            .filter(|(_, c)| !c.streaming)
            .filter_map(|(id, c)| Some((c.idle_since?, *id)))
            .min();
        let Some((since, id)) = idlest else {
            return false;
        };
        if let Some(c) = self.served.remove(&id) {
            debug!(
                idle_ms = since.elapsed().as_millis() as u64,
                "control client closed to make room for a new one"
            );
            let _ = c.stream.shutdown(std::net::Shutdown::Read);
        }
        true
    }
}

/// The longest the control thread waits for the thread of a client it closed to make room
/// (which writes one line with a 1 s timeout, then ends).
const EVICT_WAIT: StdDuration = StdDuration::from_secs(2);

/// Gives a client's slot back when its thread ends, however it ends (a no-op for one closed to
/// make room, whose slot went then).
struct Slot {
    clients: Arc<Mutex<Clients>>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.clients).served.remove(&self.id);
    }
}

/// Accepts lnetctl connections. At most [`control::MAX_CLIENTS`] are served at once, each by
/// its own thread (a capture adds a watcher); when all are taken, the one idle longest is
/// closed to make room ([`Clients`]), and only if none is idle the next are told "too many
/// control clients" in one line and closed at once, on this thread, so that idle or stuck
/// clients cost a bounded number of threads and fds and never lock the operator out. Each
/// client thread reads with a size cap and timeouts ([`control::read_request`]).
fn control_thread(
    listener: std::os::unix::net::UnixListener,
    loops: Loops,
    limits: ClientLimits,
    counters: Arc<ControlCounters>,
) {
    let clients = Arc::new(Mutex::new(Clients::default()));
    // Accept failures (at the descriptor limit, say) are counted, and logged at most once per
    // ACCEPT_LOG_EVERY with how many were not.
    const ACCEPT_LOG_EVERY: StdDuration = StdDuration::from_secs(10);
    let mut last_log: Option<std::time::Instant> = None;
    let mut unlogged = 0u64;
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                ControlCounters::bump(&counters.accept_errors);
                if last_log.is_none_or(|t| t.elapsed() >= ACCEPT_LOG_EVERY) {
                    warn!(
                        more_since_last_log = unlogged,
                        "control socket accept: {e}; retrying every 100 ms"
                    );
                    last_log = Some(std::time::Instant::now());
                    unlogged = 0;
                } else {
                    unlogged += 1;
                }
                std::thread::sleep(StdDuration::from_millis(100));
                continue;
            }
        };
        // Only this thread adds clients, so the check cannot be overtaken. Every slot taken:
        // the client idle longest makes room (see `Clients`); refused only when each is being
        // answered or streams.
        let slot = {
            let mut table = lock(&clients);
            let full = table.served.len() >= control::MAX_CLIENTS;
            let room = !full || table.evict();
            if full && room {
                ControlCounters::bump(&counters.evicted);
            }
            match stream.try_clone() {
                Ok(handle) if room => Some(table.add(handle)),
                _ => None,
            }
        };
        let Some(id) = slot else {
            ControlCounters::bump(&counters.refused);
            debug!(
                "control client refused: {} served already, none idle",
                control::MAX_CLIENTS
            );
            refuse(
                stream,
                &format!(
                    "too many control clients ({} at once, none idle); try again",
                    control::MAX_CLIENTS
                ),
            );
            continue;
        };
        let slot = Slot {
            clients: Arc::clone(&clients),
            id,
        };
        // A client closed to make room ends its thread at once (its read has ended; its one
        // error line waits 1 s at most): waited for, so that the threads stay bounded too.
        let t0 = std::time::Instant::now();
        while counters.active.load(Ordering::Relaxed) >= control::MAX_CLIENTS as u64
            && t0.elapsed() < EVICT_WAIT
        {
            std::thread::sleep(StdDuration::from_millis(1));
        }
        counters.active.fetch_add(1, Ordering::Relaxed);
        let active = ActiveClient(Arc::clone(&counters));
        let (loops, c) = (loops.clone(), Arc::clone(&counters));
        let spawned = std::thread::Builder::new()
            .name("control-conn".into())
            .spawn(move || {
                let _active = active;
                ControlCounters::bump(&c.accepted);
                if let Err(e) = serve_client(stream, &loops, limits, &c, &slot) {
                    debug!("control connection: {e}");
                }
            });
        if let Err(e) = spawned {
            // The closure (and with it the stream and the active count) was dropped.
            warn!("cannot serve a control connection: {e}");
        }
    }
}

/// Answers a client we do not serve with one error line and closes it, never blocking long
/// (a fresh connection's send buffer is empty; the write timeout is a belt for the braces).
fn refuse(stream: UnixStream, message: &str) {
    let _ = stream.set_write_timeout(Some(StdDuration::from_millis(100)));
    let resp = Response::Error(ControlError::new(errno::EBUSY, message));
    let _ = (&stream).write_all(control::encode_response(&resp).as_bytes());
}

/// Serves one lnetctl connection: request lines in, one response line each, until the client
/// closes, idles past `limits.idle`, takes longer than `limits.request` to send a line, or
/// sends a line over [`control::MAX_REQUEST`] (each of these gets an error line and is closed).
/// A `capture_start` hands the connection over to the capture ([`serve_capture`]).
fn serve_client(
    stream: UnixStream,
    loops: &Loops,
    limits: ClientLimits,
    counters: &ControlCounters,
    slot: &Slot,
) -> std::io::Result<()> {
    // A client that does not read its answers is closed too, not waited for.
    stream.set_write_timeout(Some(limits.idle))?;
    // One fd per client for its requests and answers (and one the control thread holds to
    // close it to make room).
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        let waiting = lock(&slot.clients).waiting(slot.id);
        let read = if waiting {
            control::read_request(
                &mut reader,
                &mut line,
                Some(limits.idle),
                Some(limits.request),
            )
        } else {
            Ok(ReadRequest::Eof)
        };
        // Closed to make room while it waited (its read ended): told so, whatever it sent.
        if !lock(&slot.clients).answering(slot.id) {
            let e = ControlError::new(
                errno::EBUSY,
                format!(
                    "closed to make room for another control client: this one was idle \
                     longest of {} (at most {} at once)",
                    control::MAX_CLIENTS,
                    control::MAX_CLIENTS
                ),
            );
            debug!("control client closed: {e}");
            let mut writer = reader.get_ref();
            let _ = writer.set_write_timeout(Some(StdDuration::from_secs(1)));
            let _ = writer.write_all(control::encode_response(&Response::Error(e)).as_bytes());
            return Ok(());
        }
        let (counter, err) = match read? {
            ReadRequest::Line => (None, None),
            ReadRequest::Eof => return Ok(()),
            ReadRequest::Idle => (
                Some(&counters.idle_timeouts),
                Some(ControlError::new(
                    errno::ETIMEDOUT,
                    format!("idle for {} s; closing", limits.idle.as_secs()),
                )),
            ),
            ReadRequest::Stalled => (
                Some(&counters.request_timeouts),
                Some(ControlError::new(
                    errno::ETIMEDOUT,
                    format!(
                        "request not complete within {} s; closing",
                        limits.request.as_secs()
                    ),
                )),
            ),
            ReadRequest::TooLong => (Some(&counters.oversized), Some(control::too_long())),
        };
        if let Some(e) = err {
            if let Some(c) = counter {
                ControlCounters::bump(c);
            }
            debug!("control client closed: {e}");
            // Best effort: the client may be gone or not reading. What it still sends is never
            // read (closing with unread data resets its side).
            let mut writer = reader.get_ref();
            let _ = writer.set_write_timeout(Some(StdDuration::from_secs(1)));
            let _ = writer.write_all(control::encode_response(&Response::Error(e)).as_bytes());
            return Ok(());
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        let decoded = control::decode_request_bytes(&line);
        // A big request (an import) leaves no big buffer behind it for the connection's life.
        if line.capacity() > 64 * 1024 {
            line = Vec::new();
        }
        let resp = match decoded {
            Ok(req @ Request::CaptureStart { .. }) => {
                // The stream's pace is the client's: a capture is never idle, nor closed to
                // make room.
                lock(&slot.clients).set_streaming(slot.id, true);
                // The capture's watcher reads while this thread writes: a second fd, for the
                // one capture that runs at a time.
                let writer = reader.get_ref().try_clone()?;
                writer.set_write_timeout(None)?;
                return serve_capture(req, reader, writer, loops);
            }
            Ok(req @ Request::StatsShow) => match loops.call(req) {
                Response::Stats(mut s) => {
                    s.control = Some(counters.snapshot());
                    Response::Stats(s)
                }
                other => other,
            },
            Ok(req @ Request::Selftest { .. }) => {
                // A selftest session's console (`run-test`) polls its progress on this
                // connection: from its new session to its end, it is never closed to make room.
                let session = match &req {
                    Request::Selftest {
                        cmd: router::selftest::LstCommand::NewSession { .. },
                    } => Some(true),
                    Request::Selftest {
                        cmd: router::selftest::LstCommand::EndSession,
                    } => Some(false),
                    _ => None,
                };
                let resp = loops.call(req);
                if let Some(on) = session.filter(|_| !matches!(resp, Response::Error(_))) {
                    lock(&slot.clients).set_streaming(slot.id, on);
                }
                resp
            }
            Ok(req) => loops.call(req),
            Err(e) => {
                ControlCounters::bump(&counters.bad_requests);
                Response::Error(e)
            }
        };
        reader
            .get_ref()
            .write_all(control::encode_response(&resp).as_bytes())?;
    }
}

/// A capture owns its connection: every NI loop's records are written to the client as they
/// come, while a watcher thread reads the client's side; a `capture_stop` line, or the client
/// closing (lnetctl killed, its host gone), ends the capture on every NI. So does a failed write:
/// the stream's receiver is dropped and each loop sees it at its next delivery. The NI loops
/// share one bounded stream; this thread merges their starts and their summaries into one each.
fn serve_capture(
    req: Request,
    mut reader: BufReader<UnixStream>,
    mut writer: UnixStream,
    loops: &Loops,
) -> std::io::Result<()> {
    let (out_tx, out_rx) = mpsc::sync_channel(control::CAPTURE_QUEUE);
    // The NIs as they are when the capture starts: the capture is theirs (an NI added later
    // is not captured; one removed ends its part with its loop).
    let m = loops.members();
    if m.list.is_empty() {
        let e = no_ni();
        return writer.write_all(control::encode_response(&Response::Error(e)).as_bytes());
    }
    let mut asked = Vec::new();
    for (i, member) in m.list.iter().enumerate() {
        match member.submit(req.clone(), out_tx.clone()) {
            Ok(()) => asked.push(i),
            Err(e) => {
                stop_captures(&m, &asked, &HashMap::new());
                return writer.write_all(control::encode_response(&Response::Error(e)).as_bytes());
            }
        }
    }
    drop(out_tx);
    // Every NI's start (each names its own capture), with the records that beat the last one.
    let mut ids: HashMap<usize, u64> = HashMap::new();
    let mut early = Vec::new();
    let mut failure = None;
    while ids.len() + usize::from(failure.is_some()) < asked.len() {
        match out_rx.recv() {
            Ok(Response::CaptureStarted(s)) => {
                if let Some(i) = s.nis.first().and_then(|n| m.index_of(n)) {
                    ids.insert(i, s.id);
                }
            }
            Ok(Response::Error(e)) => {
                failure.get_or_insert(e);
            }
            Ok(other) => early.push(other),
            Err(_) => {
                failure.get_or_insert_with(|| match shutting_down() {
                    Response::Error(e) => e,
                    _ => ControlError::new(errno::ESHUTDOWN, "the daemon is shutting down"),
                });
                break;
            }
        }
    }
    if let Some(e) = failure {
        stop_captures(&m, &asked, &ids);
        return writer.write_all(control::encode_response(&Response::Error(e)).as_bytes());
    }
    let started = control::CaptureStarted {
        id: ids.get(&0).copied().unwrap_or(1),
        nis: m.list.iter().map(|l| l.nid.to_string()).collect(),
    };
    writer.write_all(control::encode_response(&Response::CaptureStarted(started)).as_bytes())?;
    let (m2, ids2) = (Arc::clone(&m), ids.clone());
    std::thread::Builder::new()
        .name("capture-watch".into())
        .spawn(move || {
            let mut line = Vec::new();
            // No timeouts: the capture's client only ever sends its stop. A line over the cap
            // ends the capture like a closed connection.
            while let Ok(ReadRequest::Line) =
                control::read_request(&mut reader, &mut line, None, None)
            {
                if let Ok(Request::CaptureStop { .. }) = control::decode_request_bytes(&line) {
                    break;
                }
                // Anything else is ignored: the connection belongs to the capture.
            }
            let all: Vec<usize> = ids2.keys().copied().collect();
            stop_captures(&m2, &all, &ids2);
        })?;
    let mut done: Option<control::CaptureSummary> = None;
    let mut ended = 0;
    for resp in early.into_iter().chain(out_rx.iter()) {
        match resp {
            Response::CaptureDone(sum) => {
                ended += 1;
                let d = done.get_or_insert_with(|| control::CaptureSummary {
                    reason: sum.reason.clone(),
                    ..Default::default()
                });
                d.captured += sum.captured;
                d.dropped += sum.dropped;
                if ended == ids.len() {
                    break;
                }
            }
            Response::Error(_) => {}
            other => writer.write_all(control::encode_response(&other).as_bytes())?,
        }
    }
    let sum = done.unwrap_or_else(|| control::CaptureSummary {
        reason: "daemon shutting down".into(),
        ..Default::default()
    });
    writer.write_all(control::encode_response(&Response::CaptureDone(sum)).as_bytes())?;
    // Ends the watcher's read too.
    let _ = writer.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// Asks NI loops `which` to end their capture (ids as each named it). The stop must get through,
/// or a capture would run (and refuse every other) until the daemon stops: retried while a
/// control queue is full.
fn stop_captures(m: &Members, which: &[usize], ids: &HashMap<usize, u64>) {
    for &i in which {
        let Some(&id) = ids.get(&i) else {
            continue;
        };
        loop {
            let (done_tx, _done_rx) = mpsc::sync_channel(1);
            let Some(member) = m.list.get(i) else { break };
            match member.submit(Request::CaptureStop { id }, done_tx) {
                Err(e) if e.errno == errno::EIO => {
                    std::thread::sleep(StdDuration::from_millis(10));
                }
                _ => break,
            }
        }
    }
}

fn shutting_down() -> Response {
    Response::Error(ControlError::new(
        errno::ESHUTDOWN,
        "the daemon is shutting down",
    ))
}

/// The daemon as the control side reaches it: every NI's loop (as [`NiSet`] has them now) and
/// the template node that keeps the node-wide settings.
#[derive(Clone)]
struct Loops {
    daemon: Arc<Daemon>,
    /// One import at a time: each compares the daemon's state with its document, then changes
    /// it; two at once would each see the other's half.
    import: Arc<Mutex<()>>,
}

fn no_ni() -> ControlError {
    ControlError::new(
        errno::ENETDOWN,
        "the daemon runs no NI (add one: lnetctl net add, or lnetctl import a configuration)",
    )
}

impl Loops {
    fn members(&self) -> Arc<Members> {
        self.daemon.set.snapshot()
    }

    /// Asks the loops in `which` of `m` at once (each is woken), then waits for every answer.
    fn ask(&self, m: &Members, which: &[usize], req: &Request) -> Vec<Response> {
        let mut pending = Vec::new();
        for &i in which {
            let (tx, rx) = mpsc::sync_channel(1);
            match m.list.get(i).map(|l| l.submit(req.clone(), tx)) {
                Some(Ok(())) => pending.push(Ok(rx)),
                Some(Err(e)) => pending.push(Err(e)),
                None => pending.push(Err(no_ni())),
            }
        }
        pending
            .into_iter()
            .map(|p| match p {
                Ok(rx) => rx.recv().unwrap_or_else(|_| shutting_down()),
                Err(e) => Response::Error(e),
            })
            .collect()
    }

    /// A request for the whole node: a ping goes to the NI on each target's net, `global show`
    /// to the first NI, the other shows to every NI, merged; a change of node-wide settings
    /// goes to the template, which every NI then follows. With no NI, the template answers.
    fn call(&self, req: Request) -> Response {
        let peers = matches!(req, Request::NetShow { verbose: true });
        let mut resp = self.call_nodes(req);
        match &mut resp {
            // What the daemon keeps, not its nodes: where peers listen, whether selftest runs.
            Response::Net(n) if peers => {
                let mut table: Vec<_> = self
                    .daemon
                    .peers
                    .all()
                    .into_iter()
                    .map(|(nid, addr)| control::PeerAddress {
                        nid: nid.to_string(),
                        address: addr.to_string(),
                    })
                    .collect();
                table.sort_by(|a, b| a.nid.cmp(&b.nid));
                n.peers = table;
            }
            Response::Global(g) => g.global.selftest = u32::from(self.daemon.base.selftest),
            _ => {}
        }
        resp
    }

    /// [`Loops::call`] as the NI loops (or the template) answer it.
    fn call_nodes(&self, req: Request) -> Response {
        let m = self.members();
        let all: Vec<usize> = (0..m.list.len()).collect();
        match req {
            req @ (Request::RouteAdd { .. }
            | Request::RouteDel { .. }
            | Request::SetGlobals { .. }
            | Request::SetRouting { .. }
            | Request::SetBuffers { .. }
            | Request::SetRouterChecks { .. }) => self.daemon.change_settings(req),
            Request::Import { yaml, op, nets } => {
                let _one = lock(&self.import);
                // The NIs as they are once this import has the lock.
                let own = self.members().nids();
                drop(m);
                control::import(
                    &yaml,
                    op,
                    nets.as_deref(),
                    &own,
                    |r| self.call(r),
                    |change| match change {
                        NetChange::Add { net, ni, doc } => {
                            self.daemon.add_ni(net, ni, doc).map(|()| 1)
                        }
                        NetChange::Del(nid) => {
                            self.daemon.del_nis(&format!("net del {nid}"), |x| x == nid)
                        }
                        NetChange::Addresses { given, apply: true } => {
                            Ok(self.daemon.peers.merge(given))
                        }
                        NetChange::Addresses {
                            given,
                            apply: false,
                        } => Ok(self.daemon.peers.differ(given)),
                    },
                    |batch| self.daemon.change_routes(&batch),
                )
            }
            Request::NetDel { net, nid } => self.net_del(net, nid),
            Request::LnetConfigure { all: false } => Response::Done,
            Request::LnetConfigure { all: true } => {
                drop(m);
                self.configure_all()
            }
            req @ (Request::Selftest { .. } | Request::CaptureStart { .. })
                if m.list.is_empty() =>
            {
                let _ = req;
                Response::Error(no_ni())
            }
            req if m.list.is_empty() => self.daemon.on_template(req),
            Request::Ping {
                nids,
                timeout_secs,
                source,
            } => self.ping(&m, nids, timeout_secs, source),
            Request::GlobalShow => self.ask(&m, &[0], &Request::GlobalShow).remove(0),
            // The console is the first NI's: one session per daemon, one console NID.
            req @ Request::Selftest { .. } => self.ask(&m, &[0], &req).remove(0),
            req => merge(self.ask(&m, &all, &req)),
        }
    }

    /// `lnet configure -a`: as Lustre's (`lnetctl lnet configure --all` configures LNet from its
    /// module parameters, its `networks` then its `routes`: LNetNIInit), what the daemon's
    /// configuration file named, as loaded at start, and no longer runs comes back: each NI as
    /// a `net add` would start it, then each route as a `route add`. What runs already is left
    /// as it is (counted unchanged), so that after `lnet unconfigure` an operator gets the
    /// router back as its file describes it, and on a running router it changes nothing.
    fn configure_all(&self) -> Response {
        let _one = lock(&self.import);
        let base = &self.daemon.base;
        let mut report = control::ImportReport {
            op: control::ImportOp::Add,
            applied: 0,
            unchanged: 0,
            failed: Vec::new(),
        };
        let mut fail = |section: &str, e: &ControlError| {
            report.failed.push(control::ImportFailure {
                section: section.to_string(),
                errno: -e.errno,
                descr: e.message.clone(),
                line: None,
            });
        };
        let mut applied = 0;
        let mut unchanged = 0;
        for (net, ni) in base.nis() {
            if self.members().list.iter().any(|x| x.nid == ni.ni.nid) {
                unchanged += 1;
                continue;
            }
            match self.daemon.add_ni(net, ni, base) {
                Ok(()) => applied += 1,
                Err(e) => fail("net", &e),
            }
        }
        for r in base.routes.iter().map(|r| r.route) {
            let known = lock(&self.daemon.template)
                .routes()
                .routes()
                .any(|x| x.net == r.net && x.gateway == r.gateway);
            if known {
                unchanged += 1;
                continue;
            }
            let req = Request::RouteAdd {
                net: r.net.to_string(),
                gateway: r.gateway.to_string(),
                hop: r.hops.map(i64::from),
                priority: Some(r.priority),
            };
            match self.daemon.change_settings(req) {
                Response::Done => applied += 1,
                Response::Error(e) => fail("route", &e),
                other => fail(
                    "route",
                    &ControlError::new(errno::EIO, format!("unexpected answer {other:?}")),
                ),
            }
        }
        report.applied = applied;
        report.unchanged = unchanged;
        if applied > 0 {
            info!(
                applied,
                unchanged, "lnet configure -a: the configuration's NIs and routes back"
            );
        }
        Response::Import(report)
    }

    /// `net del --net NET` (every NI of it) or `--nid NID`.
    fn net_del(&self, net: Option<String>, nid: Option<String>) -> Response {
        let bad = |what: &str, v: &str| {
            Response::Error(ControlError::new(
                errno::EINVAL,
                format!("net del: bad {what} '{}'", router::text::excerpt(v, 64)),
            ))
        };
        let r = match (net, nid) {
            (_, Some(nid)) => match nid.trim().parse::<Nid>() {
                Ok(n) if n == Nid::LO_0 => {
                    return Response::Error(ControlError::new(
                        errno::EINVAL,
                        "net del: lo cannot be removed",
                    ))
                }
                Ok(n) => self.daemon.del_nis(&format!("net del {n}"), |x| x == n),
                Err(_) => return bad("NID", &nid),
            },
            // lo is LNet's own (lnet_dyn_del_net refuses LOLND with EINVAL).
            (Some(net), None) if net.trim() == "lo" => {
                return Response::Error(ControlError::new(
                    errno::EINVAL,
                    "net del: lo cannot be removed",
                ))
            }
            (Some(net), None) => match net.trim().parse::<lnd::wire::Net>() {
                Ok(n) => self
                    .daemon
                    .del_nis(&format!("net del {n}"), |x| x.net() == n),
                Err(_) => return bad("net", &net),
            },
            (None, None) => {
                return Response::Error(ControlError::new(
                    errno::EINVAL,
                    "net del: give the net or the NID",
                ))
            }
        };
        match r {
            Ok(_) => Response::Done,
            Err(e) => Response::Error(e),
        }
    }

    /// The loop that sends to `t`: the NI on its net; for a remote net, the NI on the net of
    /// one of its routes' gateways (the first such route; that loop's node then picks the
    /// best of its routes); else the first.
    fn loop_for(&self, m: &Members, t: Nid) -> usize {
        if t == Nid::LO_0 || m.list.iter().any(|l| l.nid == t) {
            return 0;
        }
        if let Some(i) = m.list.iter().position(|l| l.nid.net() == t.net()) {
            return i;
        }
        let t_net = t.net();
        let template = lock(&self.daemon.template);
        template
            .routes()
            .to_net(t_net)
            .iter()
            .find_map(|r| m.list.iter().position(|l| l.nid.net() == r.gateway.net()))
            .unwrap_or(0)
    }

    /// Each target pinged by the loop of the NI on its net (our own NIDs and `0@lo` by the
    /// first, which knows them all), all at once: one request per loop carrying all of its
    /// targets (a request per NID filled the loop's control queue at 64: the operator audit's
    /// 70-NID ping was "busy"); the answers in the order asked.
    fn ping(
        &self,
        m: &Members,
        nids: Vec<String>,
        timeout_secs: Option<u64>,
        source: Option<String>,
    ) -> Response {
        let targets: Result<Vec<Nid>, _> = nids.iter().map(|s| s.trim().parse::<Nid>()).collect();
        let targets = match targets {
            Ok(t) if !t.is_empty() => t,
            // The first loop says what is wrong with the request, as a single node would.
            _ => {
                let req = Request::Ping {
                    nids,
                    timeout_secs,
                    source,
                };
                return self.ask(m, &[0], &req).remove(0);
            }
        };
        let by_loop: Vec<usize> = targets.iter().map(|t| self.loop_for(m, *t)).collect();
        let mut groups: Vec<(usize, Vec<Nid>)> = Vec::new();
        for (t, &i) in targets.iter().zip(&by_loop) {
            match groups.iter_mut().find(|g| g.0 == i) {
                Some(g) => g.1.push(*t),
                None => groups.push((i, vec![*t])),
            }
        }
        let pending: Vec<_> = groups
            .iter()
            .map(|(i, ts)| {
                let req = Request::Ping {
                    nids: ts.iter().map(Nid::to_string).collect(),
                    timeout_secs,
                    source: source.clone(),
                };
                let (tx, rx) = mpsc::sync_channel(1);
                m.list[*i].submit(req, tx).map(|()| rx)
            })
            .collect();
        let mut answers = Vec::new();
        for p in pending {
            let r = match p {
                Ok(rx) => rx.recv().unwrap_or_else(|_| shutting_down()),
                Err(e) => Response::Error(e),
            };
            match r {
                Response::Ping(one) => answers.push((one.ping.into_iter(), one.manage.into_iter())),
                other => return other,
            }
        }
        // Back in the order asked: a loop answers its targets in its order, each a success
        // (`ping`) or a failure naming the target (`manage`).
        let mut out = control::PingShow::default();
        let mut next_fail: Vec<_> = answers.iter_mut().map(|a| a.1.next()).collect();
        for (t, i) in targets.iter().zip(by_loop) {
            let g = groups.iter().position(|g| g.0 == i).unwrap_or(0);
            if next_fail[g]
                .as_ref()
                .is_some_and(|f| f.ping == t.to_string())
            {
                out.manage.extend(next_fail[g].take());
                next_fail[g] = answers[g].1.next();
            } else {
                out.ping.extend(answers[g].0.next());
            }
        }
        for (g, a) in answers.iter_mut().enumerate() {
            out.ping.extend(a.0.by_ref());
            out.manage.extend(next_fail[g].take());
            out.manage.extend(a.1.by_ref());
        }
        Response::Ping(out)
    }
}

/// One answer from the answers of every NI loop to the same show request: the first error if
/// any, else their union (the `lo` NI once, its loopback counts summed; counters summed).
fn merge(mut answers: Vec<Response>) -> Response {
    if let Some(i) = answers.iter().position(|r| matches!(r, Response::Error(_))) {
        // `peer show --nid` is an error on every NI but the one that knows the peer.
        if let Some(ok) = answers
            .iter()
            .position(|r| !matches!(r, Response::Error(_)))
        {
            if matches!(answers[ok], Response::Peer(_)) {
                return answers.swap_remove(ok);
            }
        }
        return answers.swap_remove(i);
    }
    let mut it = answers.into_iter();
    let Some(first) = it.next() else {
        return Response::Error(ControlError::new(errno::ESHUTDOWN, "the daemon runs no NI"));
    };
    it.fold(first, |acc, r| match (acc, r) {
        (Response::Net(mut a), Response::Net(b)) => {
            for e in b.net {
                if e.net_type == "lo" {
                    if let (Some(lo), Some(x)) = (
                        a.net.iter_mut().find(|n| n.net_type == "lo"),
                        e.local_nis.first(),
                    ) {
                        if let (Some(s), Some(t)) = (
                            lo.local_nis.first_mut().and_then(|n| n.statistics.as_mut()),
                            x.statistics.as_ref(),
                        ) {
                            s.send_count += t.send_count;
                            s.recv_count += t.recv_count;
                            s.drop_count += t.drop_count;
                        }
                    }
                    continue;
                }
                match a.net.iter_mut().find(|n| n.net_type == e.net_type) {
                    Some(n) => n.local_nis.extend(e.local_nis),
                    None => a.net.push(e),
                }
            }
            Response::Net(a)
        }
        (Response::Peer(mut a), Response::Peer(b)) => {
            // A peer two of our NIs talk to (two NIs on one net) is one peer, as in Lustre:
            // one entry per primary NID (an export listed it twice, which no lnetctl loads).
            for e in b.peer {
                match a.peer.iter_mut().find(|x| x.primary_nid == e.primary_nid) {
                    Some(x) => merge_peer(x, e),
                    None => a.peer.push(e),
                }
            }
            Response::Peer(a)
        }
        (Response::Recovery(mut a), Response::Recovery(b)) => {
            a.nids.extend(b.nids);
            Response::Recovery(a)
        }
        (Response::Conn(mut a), Response::Conn(b)) => {
            a.conn.extend(b.conn);
            Response::Conn(a)
        }
        (Response::Stats(a), Response::Stats(b)) => Response::Stats(sum_stats(a, b)),
        (Response::Route(mut a), Response::Route(b)) => {
            // Every loop lists every route; the state comes from the loop that watches the
            // route's gateway (the others have none).
            for e in b.route {
                match a
                    .route
                    .iter_mut()
                    .find(|x| x.net == e.net && x.gateway == e.gateway)
                {
                    Some(x) => {
                        if x.state.is_none() {
                            x.state = e.state;
                        }
                    }
                    None => a.route.push(e),
                }
            }
            Response::Route(a)
        }
        (Response::Routing(mut a), Response::Routing(b)) => {
            a.cpts.extend(b.cpts);
            a.enable = a.enable.max(b.enable);
            let (x, y) = (&mut a.forwarding, &b.forwarding);
            x.received += y.received;
            x.forwarded += y.forwarded;
            x.forwarded_bytes += y.forwarded_bytes;
            x.in_flight += y.in_flight;
            x.dropped += y.dropped;
            for (slot, (_, n)) in x.dropped_by_reason.iter_mut().zip(&y.dropped_by_reason) {
                slot.1 += n;
            }
            x.waited_rtr_credit += y.waited_rtr_credit;
            x.waited_buffer += y.waited_buffer;
            x.waited_unproven += y.waited_unproven;
            x.scrubbed += y.scrubbed;
            x.scrubbed_bytes += y.scrubbed_bytes;
            Response::Routing(a)
        }
        (a, _) => a,
    })
}

/// Two NI loops' views of one peer, as one: its peer NIs by NID, each up if either loop has
/// it up; their counters and credits added (each loop keeps its own credits towards the peer
/// NI, so together they bound what is in flight to it); the lower health and the sooner
/// recovery ping.
fn merge_peer(a: &mut control::PeerEntry, b: control::PeerEntry) {
    a.multi_rail |= b.multi_rail;
    for n in b.peer_ni {
        let Some(x) = a.peer_ni.iter_mut().find(|x| x.nid == n.nid) else {
            a.peer_ni.push(n);
            continue;
        };
        if n.state == "up" || x.state == "NA" {
            x.state = n.state;
        }
        match (&mut x.detail, n.detail) {
            (Some(d), Some(e)) => {
                d.max_ni_tx_credits += e.max_ni_tx_credits;
                d.available_tx_credits += e.available_tx_credits;
                d.min_tx_credits += e.min_tx_credits;
                d.tx_q_num_of_buf += e.tx_q_num_of_buf;
                d.available_rtr_credits += e.available_rtr_credits;
                d.min_rtr_credits += e.min_rtr_credits;
                let (c, f) = (&mut d.statistics, &e.statistics);
                c.send_count += f.send_count;
                c.recv_count += f.recv_count;
                c.drop_count += f.drop_count;
                let (h, g) = (&mut d.health_stats, &e.health_stats);
                h.health_value = h.health_value.min(g.health_value);
                h.dropped += g.dropped;
                h.timeout += g.timeout;
                h.error += g.error;
                h.network_timeout += g.network_timeout;
                h.ping_count += g.ping_count;
                h.next_ping = match (h.next_ping, g.next_ping) {
                    (0, t) | (t, 0) => t,
                    (s, t) => s.min(t),
                };
            }
            (None, Some(e)) => x.detail = Some(e),
            _ => {}
        }
    }
}

/// Two NI loops' `stats show`, added field by field (through their JSON form, so a counter
/// added to either struct is summed too).
fn sum_stats(a: control::StatsShow, b: control::StatsShow) -> control::StatsShow {
    fn add(a: &mut serde_json::Value, b: &serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                for (k, v) in y {
                    match x.get_mut(k) {
                        Some(slot) => add(slot, v),
                        None => {
                            x.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            (slot @ serde_json::Value::Number(_), serde_json::Value::Number(n)) => {
                let sum = slot.as_u64().unwrap_or(0) + n.as_u64().unwrap_or(0);
                *slot = serde_json::Value::from(sum);
            }
            _ => {}
        }
    }
    let (Ok(mut x), Ok(y)) = (serde_json::to_value(&a), serde_json::to_value(&b)) else {
        return a;
    };
    add(&mut x, &y);
    serde_json::from_value(x).unwrap_or(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32, item 4: with every slot taken, the client idle longest makes room, never one
    /// being answered or receiving a stream; none idle, none is closed.
    #[test]
    fn the_client_idle_longest_makes_room() {
        let mut t = Clients::default();
        let mut ends = Vec::new();
        let mut add = |t: &mut Clients| {
            let (ours, theirs) = UnixStream::pair().unwrap();
            ends.push(theirs);
            t.add(ours)
        };
        let streaming = add(&mut t);
        t.set_streaming(streaming, true);
        let idle_old = add(&mut t);
        let busy = add(&mut t);
        assert!(t.answering(busy));
        let idle_new = add(&mut t);
        assert!(t.evict());
        assert!(!t.served.contains_key(&idle_old));
        assert!(!t.waiting(idle_old), "its thread learns it was closed");
        assert!(t.evict());
        assert!(!t.served.contains_key(&idle_new));
        assert!(
            !t.evict(),
            "one answering and one streaming: nobody to close"
        );
        assert_eq!(t.served.len(), 2);
        // Its answer sent, the busy one waits again: now it may go.
        assert!(t.waiting(busy));
        assert!(t.evict());
        assert_eq!(
            t.served.keys().copied().collect::<Vec<_>>(),
            vec![streaming]
        );
        // A slot's guard gives it back.
        drop(Slot {
            clients: Arc::new(Mutex::new(std::mem::take(&mut t))),
            id: streaming,
        });
    }

    /// An operator's audit: a daemon with two NIs on one net listed each peer once per NI in
    /// `peer show` and `export` (an export no lnetctl loads). One entry per primary NID, the
    /// two loops' counters and credits added.
    #[test]
    fn a_peer_two_nis_talk_to_is_shown_once() {
        use control::{Counts, PeerEntry, PeerHealthShow, PeerNiDetail, PeerNiEntry, PeerShow};
        let entry = |nid: &str, state: &str, sent: u64, health: u32| PeerEntry {
            primary_nid: nid.into(),
            multi_rail: false,
            peer_ni: vec![PeerNiEntry {
                nid: nid.into(),
                state: state.into(),
                detail: Some(PeerNiDetail {
                    max_ni_tx_credits: 8,
                    available_tx_credits: 8,
                    min_tx_credits: 7,
                    tx_q_num_of_buf: 0,
                    available_rtr_credits: 8,
                    min_rtr_credits: 8,
                    statistics: Counts {
                        send_count: sent,
                        recv_count: sent,
                        drop_count: 0,
                    },
                    health_stats: PeerHealthShow {
                        health_value: health,
                        ..PeerHealthShow::default()
                    },
                }),
            }],
        };
        let a = Response::Peer(PeerShow {
            peer: vec![entry("10.0.0.254@o2ib", "NA", 3, 1000)],
        });
        let b = Response::Peer(PeerShow {
            peer: vec![
                entry("10.0.0.254@o2ib", "up", 4, 900),
                entry("10.0.0.9@o2ib", "up", 1, 1000),
            ],
        });
        let Response::Peer(m) = merge(vec![a, b]) else {
            panic!("not a peer show")
        };
        assert_eq!(m.peer.len(), 2, "{m:?}");
        let p = &m.peer[0];
        assert_eq!(
            (p.primary_nid.as_str(), p.peer_ni.len()),
            ("10.0.0.254@o2ib", 1)
        );
        let n = &p.peer_ni[0];
        assert_eq!(n.state, "up");
        let d = n.detail.as_ref().unwrap();
        assert_eq!((d.statistics.send_count, d.max_ni_tx_credits), (7, 16));
        assert_eq!(d.health_stats.health_value, 900);
    }

    /// The hostile-peer audit's log flood: peer up/down lines are written up to the budget
    /// per window, the rest counted, and the count reported once when the window ends.
    #[test]
    fn peer_up_down_lines_are_budgeted_per_window() {
        let mut log = PeerLog::default();
        let t0 = std::time::Instant::now();
        let written = (0..10_000).filter(|_| log.admit(t0).0).count();
        assert_eq!(written, PeerLog::BUDGET as usize);
        // Still inside the window: nothing reported, still suppressed.
        assert_eq!(log.admit(t0 + StdDuration::from_secs(9)), (false, None));
        // The next window: the suppressed count comes back once, and lines flow again.
        let later = t0 + PeerLog::WINDOW + StdDuration::from_secs(1);
        assert_eq!(
            log.admit(later),
            (true, Some(10_000 - u64::from(PeerLog::BUDGET) + 1))
        );
        assert_eq!(log.admit(later), (true, None));
    }
}
