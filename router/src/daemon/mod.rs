//! `lnet-router`: ulnet's LNet daemon. Reads a YAML configuration (`router::yaml_config`),
//! runs each NI on its own thread, serves `lnetctl` on a Unix control socket (`router::control`),
//! and on SIGTERM/SIGINT/SIGQUIT closes every connection gracefully (bounded) and exits 0.
//!
//! Threads: one per NI, each running that NI's [`NiRuntime`] (its `LnetNode`, which knows the
//! node's other NIDs as its own, its fabric: tcp on io_uring, or verbs with the `verbs` feature,
//! its waker) with [`NiRuntime::turn`], and answering the control requests for that NI; a slow or
//! frozen peer on one NI never holds another NI's loop. `lnetctl net add|del` (and `import`)
//! start and stop NI threads at run time: the NIs are a `state::NiSet` whose every change the loops
//! adopt at their next turn; a template node with no NI of its own keeps the node-wide
//! settings an added NI starts with, and answers while the daemon runs none (`--no-nis`).
//! The router's large buffers for bulk data follow the set the same way: one pool for the
//! node (`router::bulk_pool`), each loop registering them with its own fabric.
//! A control thread accepts `lnetctl`
//! connections, each served by a short-lived thread that sends each request to the NI loops it
//! concerns over a bounded channel and wakes them, then merges their answers (a ping goes to the
//! NI on the target's net; `net show`, `peer show`, `conn show` and `stats show` gather every
//! NI's). At most [`crate::control::MAX_CLIENTS`] connections are served at once (for the next, the
//! client idle longest is closed; only when none is idle are they refused with one line);
//! each reads its requests with a 64 KiB cap, an idle timeout and a request timeout
//! (`crate::control::read_request`). The main thread watches signals: TERM, INT and QUIT stop
//! every NI gracefully, HUP, USR1 and USR2 are logged and ignored.
//!
//! With `metrics: listen:` (or `--metrics-listen`), a `metrics` thread serves Prometheus scrapes
//! (`metrics`): each NI loop copies its counters at most once a second into a slot of its own,
//! which a scrape reads without asking the loop anything.
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

mod args;
mod capture;
mod config;
mod events;
mod fabric;
mod fan_out;
mod handovers;
mod metrics;
mod ni_loop;
mod ni_set;
mod notify;
mod selftest;
mod serve;
mod signals;
mod state;

pub use self::args::Args;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration as StdDuration, SystemTime, UNIX_EPOCH};

use crate::alive::NetAlive;
use crate::control::ControlCounters;
use crate::runtime::NiRuntime;
use crate::yaml_config::{DaemonConfig, FabricKind};
use crate::LnetNode;
use lnd::driver::MonotonicClock;
use lnd::wire::Nid;
use tracing::{info, warn};

use self::args::{LogFormat, NiThreads};
use self::config::{choose_fabric, extras_of, listen_clash};
use self::fabric::{fabric_supported, start_fabric, PeerAddrs};
use self::fan_out::Loops;
use self::ni_loop::{run_shared, NiLoop};
use self::notify::sd_notify;
use self::serve::{control_thread, ClientLimits};
use self::signals::Signals;
use self::state::{lock, Daemon, NiSet, NiThread, NodeSettings, Shutdown, MAX_WAIT};

/// Why the daemon did not start, or stopped with an error: the one line the binary writes
/// on stderr (after "lnet-router: "), and the exit status: 2 for a bad command line or
/// configuration, 1 for a runtime failure (socket, fabric).
#[derive(Debug)]
pub struct Failure {
    pub status: u8,
    pub message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Failure {
        Failure {
            status: 2,
            message: message.into(),
        }
    }
}

/// Runs the daemon with `args` until a stop. `before_threads` runs once logging is set up and
/// before any thread starts (the binary caps its allocator's background threads there; a
/// failure is logged, never fatal). Errors are returned, not printed: before the daemon runs
/// there is no log to keep, so the binary writes them to stderr once, as one line.
pub fn run(args: Args, before_threads: impl FnOnce() -> Result<(), String>) -> Result<(), Failure> {
    init_logging(args.log_format);
    if let Err(e) = before_threads() {
        warn!(error = %e, "cannot limit the allocator's background threads");
    }
    let cfg = load_config(&args)?;
    // A path lnetctl could not reach, or whose directory is more than one missing level away
    // (only the socket's own directory is created), is refused before anything starts.
    let socket = args
        .socket
        .unwrap_or_else(crate::control::default_socket_path);
    crate::control::check_socket_path_for_daemon(&socket)
        .map_err(|e| Failure::usage(e.to_string()))?;
    let limits = ClientLimits {
        idle: StdDuration::from_secs(args.control_idle_timeout),
        request: StdDuration::from_secs(args.control_request_timeout),
    };
    // Once, and whatever LNET_LOG filters (the log is on stderr too: logging it as well
    // printed it twice).
    start(cfg, socket, limits, args.ni_threads).map_err(|message| Failure { status: 1, message })
}

/// The configuration `args` name, checked against the command line and this build: each net's
/// fabric chosen, no two NIs on one listen address, every fabric available.
fn load_config(args: &Args) -> Result<DaemonConfig, Failure> {
    if args.no_nis && args.ni_threads == NiThreads::Shared {
        return Err(Failure::usage(
            "--no-nis needs --ni-threads per-ni (NIs added at run time each get a thread; a \
             shared thread is fixed at start)",
        ));
    }
    let loaded = if args.no_nis {
        DaemonConfig::load_allowing_no_nis(&args.config)
    } else {
        DaemonConfig::load(&args.config)
    };
    let mut cfg = loaded.map_err(|e| Failure::usage(e.to_string()))?;
    if let Some(listen) = args.metrics_listen {
        // The command line's address wins; the file's bounds stay.
        cfg.metrics = Some(match cfg.metrics {
            Some(m) => crate::yaml_config::MetricsConfig { listen, ..m },
            None => crate::yaml_config::MetricsConfig::on(listen),
        });
    }
    if cfg!(not(feature = "metrics")) && cfg.metrics.is_some() {
        return Err(Failure::usage(
            "metrics: this lnet-router was built without the metrics feature",
        ));
    }
    for net in cfg.nets.iter_mut().filter(|n| !n.fabric_given) {
        choose_fabric(net);
    }
    if let Some(msg) = listen_clash(&cfg) {
        return Err(Failure::usage(format!("{}: {msg}", args.config.display())));
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
        return Err(Failure::usage(match net.nis.first() {
            Some(ni) => format!("{}:{}: {msg}", args.config.display(), ni.line),
            None => format!("{}: {msg}", args.config.display()),
        }));
    }
    if args.ni_threads == NiThreads::Shared {
        if let Some((net, _)) = cfg.nis().find(|(n, _)| n.fabric != FabricKind::Tcp) {
            return Err(Failure::usage(format!(
                "--ni-threads shared: net {} is on fabric '{}'; only tcp NIs can share a \
                 thread (use --ni-threads per-ni)",
                net.net,
                net.fabric.as_str()
            )));
        }
    }
    Ok(cfg)
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

/// Removes the control socket file when the daemon ends, however it ends.
pub(super) struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn start(
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
    let Some(runtimes) = start_nis(&cfg, node_cfgs, &peers, &signals, clock)? else {
        return Ok(());
    };

    let listener = crate::control::bind_socket(&socket)
        .map_err(|e| format!("control socket {}: {e}", socket.display()))?;
    let _guard = SocketGuard(socket.clone());
    let nids: Vec<Nid> = cfg.nis().map(|(_, ni)| ni.ni.nid).collect();
    // The node without NIs of its own, knowing every NID: it keeps the node-wide settings
    // (routes, routing, buffers, globals) that an NI added later starts with, and answers for
    // the daemon while it runs no NI.
    let template = LnetNode::new(
        crate::NodeConfig {
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
    spawn_loops(&daemon, ni_loops, threading)?;
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
    start_metrics(&daemon, &counters)?;
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

    wait_for_stop(&daemon, &signals)
}

/// The metrics endpoint, if configured (`metrics:` or `--metrics-listen`).
#[cfg(feature = "metrics")]
fn start_metrics(daemon: &Arc<Daemon>, counters: &Arc<ControlCounters>) -> Result<(), String> {
    if let Some(m) = daemon.base.metrics {
        metrics::start(m, Arc::clone(daemon), Arc::clone(counters))?;
    }
    Ok(())
}

#[cfg(not(feature = "metrics"))]
fn start_metrics(_: &Arc<Daemon>, _: &Arc<ControlCounters>) -> Result<(), String> {
    Ok(())
}

/// One NI as started: its runtime and waker, its fabric, and what its control service shows.
type Started = (
    NiRuntime<Box<dyn lnd::driver::LndDriver + Send>>,
    lnd::driver::WakeHandle,
    FabricKind,
    crate::control::NiExtras,
);

/// Starts the fabric and runtime of every NI of `cfg` (with `node_cfgs`, one each); `None` if
/// a signal stopped the daemon meanwhile.
fn start_nis(
    cfg: &DaemonConfig,
    node_cfgs: Vec<crate::NodeConfig>,
    peers: &PeerAddrs,
    signals: &Signals,
    clock: MonotonicClock,
) -> Result<Option<Vec<Started>>, String> {
    let mut runtimes = Vec::new();
    for ((net, ni), node_cfg) in cfg.nis().zip(node_cfgs) {
        let stopping = || signals.term.load(Ordering::Relaxed);
        let f = match start_fabric(peers, net.fabric, ni, &stopping) {
            Ok(f) => f,
            // SIGTERM while an NI waited for its listen address: the stop asked for, not a
            // failure (the NIs started so far close as they are dropped).
            Err(_) if stopping() => {
                info!(nid = %ni.ni.nid, "stopped by a signal while starting");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let node = LnetNode::new(node_cfg, clock.now());
        let (rt, wake) = NiRuntime::new(node, f.driver, clock)
            .map_err(|e| format!("NI {}: cannot create its loop's waker: {e}", ni.ni.nid))?;
        runtimes.push((rt, wake, f.kind, extras_of(ni, f.listen)));
    }
    Ok(Some(runtimes))
}

/// Runs `ni_loops` as `threading` says: each on its own thread, or all on one.
fn spawn_loops(
    daemon: &Arc<Daemon>,
    mut ni_loops: Vec<NiLoop>,
    threading: NiThreads,
) -> Result<(), String> {
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
    Ok(())
}

/// The main thread's part: watches the signals, and ends once every NI thread has finished
/// after a stop; the first fatal error, if any.
fn wait_for_stop(daemon: &Daemon, signals: &Signals) -> Result<(), String> {
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
