//! `lnet-router`: ulnet's LNet daemon. Reads a YAML configuration (`router::yaml_config`),
//! starts one [`LnetNode`] whose NIs run on the tcp fabric (io_uring), serves `lnetctl` on a Unix
//! control socket (`router::control`), and on SIGTERM/SIGINT closes every connection gracefully
//! (bounded) and exits 0.
//!
//! Threads (first version): ONE event loop thread drives every NI's fabric (tcp on io_uring, or
//! verbs when built with the `verbs` feature) and the node (with several NIs each fabric's wait is
//! split so that none starves; per-NI loops come with forwarding), and a control thread accepts
//! `lnetctl` connections, each served by a short-lived thread that forwards requests to the loop
//! over a bounded channel and wakes it (a [`Waker`] every fabric watches), then waits for the
//! reply. At most [`control::MAX_CLIENTS`] connections are served at once (the next are refused
//! with one line); each reads its requests with a 64 KiB cap, an idle timeout and a request
//! timeout (`control::read_request`). The loop looks at signals at least every 20 ms: TERM, INT
//! and QUIT stop the daemon gracefully, HUP, USR1 and USR2 are logged and ignored.
//!
//! `lnetctl capture` takes over its connection: the loop turns capturing on in every NI's LND,
//! streams the records to that connection's thread through a bounded channel (never blocking on
//! it: a full channel drops and counts), and a watcher thread reading the client's side ends the
//! capture on `capture_stop` or when the client goes away. One capture at a time. Why lnetctl,
//! not the daemon, writes the file: see `router::control`'s capture section.
//!
//! Exit status: 0 after a clean shutdown, 1 on a runtime failure (socket, fabric),
//! 2 on a bad command line or configuration.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration as StdDuration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use lnd::driver::tcp::{TcpConfig, TcpFabric};
use lnd::driver::{Driver, MonotonicClock, WakeHandle, Waker};
use lnd::time::Duration;
use router::control::{
    self, errno, CaptureSession, CaptureSummary, Control, ControlCounters, ControlError, Delivery,
    NiExtras, ReadRequest, Request, Response,
};
use router::yaml_config::{DaemonConfig, FabricKind};
use router::{LnetEvent, LnetNode, NiIndex};
use tracing::{debug, error, info, warn};

/// How long the loop may block before it looks at control requests and signals again.
const MAX_WAIT: StdDuration = StdDuration::from_millis(20);
/// How long a graceful shutdown may take before the daemon exits anyway.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(5);
/// Control requests that may wait for the loop at once.
const CONTROL_QUEUE: usize = 64;

#[derive(Copy, Clone, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Parser, Debug)]
#[command(
    name = "lnet-router",
    version,
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
    /// $XDG_RUNTIME_DIR/ulnet/lnet-router.sock]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Log format on stderr
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Close a control client that sends nothing for this many seconds between requests
    /// (a client waiting for an answer or receiving a capture is not idle)
    #[arg(long, value_name = "SECS", default_value_t = control::DEFAULT_IDLE_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    control_idle_timeout: u64,
    /// Close a control client whose request line is not complete this many seconds after its
    /// first byte
    #[arg(long, value_name = "SECS", default_value_t = control::DEFAULT_REQUEST_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    control_request_timeout: u64,
}

/// A request and where its answer goes: one response, or for a capture the whole stream
/// (bounded: the loop never blocks on a slow client).
type ControlMsg = (Request, SyncSender<Response>);

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
    // Errors go to stderr once, as one line: before the daemon runs there is no log to keep.
    let cfg = match DaemonConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lnet-router: {e}");
            return ExitCode::from(2);
        }
    };
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
        eprintln!("lnet-router: {}: {msg}", args.config.display());
        return ExitCode::from(2);
    }
    let socket = args.socket.unwrap_or_else(control::default_socket_path);
    let limits = ClientLimits {
        idle: StdDuration::from_secs(args.control_idle_timeout),
        request: StdDuration::from_secs(args.control_request_timeout),
    };
    match run(cfg, socket, limits) {
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
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.json().init(),
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

fn run(cfg: DaemonConfig, socket: PathBuf, limits: ClientLimits) -> Result<(), String> {
    let signals = Signals::install()?;

    let clock = MonotonicClock::new();
    let incarnation = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64);
    let (waker, wake) = Waker::new().map_err(|e| format!("cannot create the loop's waker: {e}"))?;
    let mut fabrics: Vec<NiFabric> = Vec::new();
    let mut extras = Vec::new();
    for (net, ni) in cfg.nis() {
        let mut f = start_fabric(&cfg, net.fabric, ni)?;
        f.driver.set_waker(waker.fd());
        fabrics.push(f);
        extras.push(NiExtras {
            peer_timeout: ni.peer_timeout,
            peer_buffer_credits: ni.peer_buffer_credits,
        });
    }
    let mut node = LnetNode::new(cfg.node_config(incarnation), clock.now());

    let listener = control::bind_socket(&socket)
        .map_err(|e| format!("control socket {}: {e}", socket.display()))?;
    let _guard = SocketGuard(socket.clone());
    let (req_tx, req_rx) = mpsc::sync_channel::<ControlMsg>(CONTROL_QUEUE);
    let counters = Arc::new(ControlCounters::default());
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || control_thread(listener, req_tx, wake, limits, counters))
        .map_err(|e| format!("cannot start the control thread: {e}"))?;
    info!(socket = %socket.display(), nis = fabrics.len(), "lnet-router running");

    let mut control: Control<SyncSender<Response>> = Control::new(extras);
    event_loop(
        &mut node,
        &mut fabrics,
        &mut control,
        &req_rx,
        &waker,
        &clock,
        &signals,
    )?;
    info!("lnet-router stopped");
    Ok(())
}

/// One NI's fabric, as the loop drives it.
struct NiFabric {
    kind: FabricKind,
    driver: Box<dyn Driver + Send>,
    /// The fabric failed (an error from `poll`): it is no longer polled, and the daemon closes
    /// every other connection gracefully and exits 1.
    failed: bool,
}

fn fabric_supported(kind: FabricKind) -> bool {
    match kind {
        FabricKind::Tcp => true,
        FabricKind::Verbs => cfg!(feature = "verbs"),
        FabricKind::Sim => false,
    }
}

/// Starts the fabric of one NI: listening, ready for the loop.
fn start_fabric(
    cfg: &DaemonConfig,
    kind: FabricKind,
    ni: &router::yaml_config::NiSettings,
) -> Result<NiFabric, String> {
    let nid = ni.ni.nid;
    let peers = cfg.peers.clone();
    let driver: Box<dyn Driver + Send> = match kind {
        FabricKind::Tcp => {
            let Some(listen) = ni.listen else {
                return Err(format!("NI {nid} has no listen address"));
            };
            // The transport's retry horizon is the LND timeout, as an RC queue pair's retries are.
            let tcp = TcpConfig {
                user_timeout: ni.ni.tunables.timeout.into(),
                busy_poll: StdDuration::from_micros(ni.busy_poll_us.into()),
                handshake_limit: ni.handshake_limit as usize,
                ..TcpConfig::default()
            };
            let f = TcpFabric::bind_with(listen, move |nid| peers.get(&nid).copied(), tcp)
                .map_err(|e| format!("NI {nid}: cannot listen on {listen}: {e}"))?;
            info!(%nid, listen = %f.local_addr(), fabric = "tcp", "NI up");
            Box::new(f)
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
            let f = VerbsFabric::new(vc, move |nid| {
                peers.get(&nid).copied().or_else(|| Some(o2ib_address(nid)))
            })
            .map_err(|e| format!("NI {nid}: {e}"))?;
            info!(%nid, listen = %f.local_addr(), fabric = "verbs", "NI up");
            Box::new(f)
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
        failed: false,
    })
}

/// Where an o2ib peer listens by default: its NID's address, o2iblnd's service port 987.
#[cfg(feature = "verbs")]
fn o2ib_address(nid: lnd::wire::Nid) -> std::net::SocketAddr {
    let ip = std::net::Ipv4Addr::from(nid.addr());
    std::net::SocketAddr::new(ip.into(), 987)
}

/// The loop: fabrics, node, timers, control requests, until a signal and a finished shutdown.
#[allow(clippy::too_many_arguments)]
fn event_loop(
    node: &mut LnetNode,
    fabrics: &mut [NiFabric],
    control: &mut Control<SyncSender<Response>>,
    req_rx: &Receiver<ControlMsg>,
    waker: &Waker,
    clock: &MonotonicClock,
    signals: &Signals,
) -> Result<(), String> {
    let mut shutdown_deadline = None;
    let mut fatal: Option<String> = None;
    let mut capture = CaptureState::Idle;
    let mut next_capture = 1u64;
    let n = fabrics.len().max(1) as u32;
    loop {
        let now = clock.now();
        drain_actions(node, fabrics, now);
        let wait = node
            .poll_timeout()
            .map_or(MAX_WAIT, |d| d.saturating_duration_since(now).into())
            .min(MAX_WAIT)
            / n;
        if fabrics.is_empty() {
            std::thread::sleep(wait);
        }
        for i in 0..fabrics.len() {
            if fabrics[i].failed {
                continue;
            }
            let Some(mut sink) = node.fabric_sink(NiIndex(i)) else {
                continue;
            };
            if let Err(e) = fabrics[i]
                .driver
                .poll(Some(wait), &mut sink, &|| clock.now())
            {
                // One NI's fabric is broken: the others' peers must still see a graceful close
                // (not find out at their keepalive horizon), so shut down as on SIGTERM, then
                // exit with the error.
                error!(ni = i, "fabric failed: {e}; closing every other connection");
                fabrics[i].failed = true;
                fatal.get_or_insert_with(|| format!("fabric of NI {i}: {e}"));
                continue;
            }
            node.process(clock.now());
            // The fabric wants the endpoint's actions applied before it is polled again.
            drain_actions(node, fabrics, clock.now());
        }
        let now = clock.now();
        if node.poll_timeout().is_some_and(|d| d <= now) {
            node.handle_timeout(now);
        }
        drain_events(node, control);
        waker.drain();
        let mut refreshed = false;
        while let Ok((req, reply)) = req_rx.try_recv() {
            debug!(?req, "control request");
            if !refreshed {
                for (i, f) in fabrics.iter().enumerate() {
                    control.set_fabric_counters(i, f.kind.as_str(), f.driver.counters());
                }
                refreshed = true;
            }
            match req {
                Request::CaptureStart { duration_secs } => {
                    let resp = if !matches!(capture, CaptureState::Idle) {
                        Response::Error(ControlError::new(
                            errno::EBUSY,
                            "a capture is already running (one at a time); stop it first",
                        ))
                    } else if shutdown_deadline.is_some() {
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
                            next_capture,
                            clock.now(),
                            unix_ns,
                            duration_secs.map(Duration::from_secs),
                        );
                        next_capture += 1;
                        info!(id = s.id(), ?duration_secs, "capture started");
                        let started = Response::CaptureStarted(s.started());
                        capture = CaptureState::Running(s, reply.clone());
                        started
                    };
                    let _ = reply.try_send(resp);
                }
                Request::CaptureStop { id } => {
                    let resp = match std::mem::take(&mut capture) {
                        CaptureState::Running(s, out) if s.id() == id => {
                            let sum = end_capture(node, s, &out, "stopped");
                            capture = CaptureState::Ending(sum.clone(), out);
                            Response::CaptureDone(sum)
                        }
                        other => {
                            capture = other;
                            Response::Error(ControlError::new(
                                errno::ENOENT,
                                format!("no capture {id} is running"),
                            ))
                        }
                    };
                    let _ = reply.try_send(resp);
                }
                req => {
                    if let Some((reply, resp)) = control.handle(clock.now(), node, req, reply) {
                        let _ = reply.try_send(resp);
                    }
                }
            }
            drain_events(node, control);
        }
        capture = capture.step(node, clock.now());

        let stop = signals.check();
        if shutdown_deadline.is_none() && (stop || fatal.is_some()) {
            info!("closing every connection");
            let now = clock.now();
            node.shutdown(now);
            shutdown_deadline = Some(now.saturating_add(SHUTDOWN_BOUND));
        }
        if let Some(deadline) = shutdown_deadline {
            let now = clock.now();
            if node.is_shut_down() || now >= deadline {
                if !node.is_shut_down() {
                    warn!(
                        in_flight = node.messages_in_flight(),
                        "graceful shutdown did not finish within {SHUTDOWN_BOUND:?}; exiting anyway"
                    );
                }
                // The last actions (Destroys), and one more turn so they reach the sockets.
                drain_actions(node, fabrics, now);
                for (i, f) in fabrics.iter_mut().enumerate() {
                    if f.failed {
                        continue;
                    }
                    if let Some(mut sink) = node.fabric_sink(NiIndex(i)) {
                        let _ = f
                            .driver
                            .poll(Some(StdDuration::ZERO), &mut sink, &|| clock.now());
                    }
                }
                drain_events(node, control);
                if let CaptureState::Running(s, out) = std::mem::take(&mut capture) {
                    let sum = end_capture(node, s, &out, "daemon shutting down");
                    let _ = out.try_send(Response::CaptureDone(sum));
                }
                return fatal.map_or(Ok(()), Err);
            }
        }
    }
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

fn drain_actions(node: &mut LnetNode, fabrics: &mut [NiFabric], now: lnd::time::Instant) {
    while let Some((ni, a)) = node.poll_action() {
        if let Some(f) = fabrics.get_mut(ni.0) {
            f.driver.apply(now, a);
        }
    }
}

fn drain_events(node: &mut LnetNode, control: &mut Control<SyncSender<Response>>) {
    while let Some(ev) = node.poll_event() {
        match &ev {
            LnetEvent::PeerUp { nid, .. } => info!(%nid, "peer up"),
            LnetEvent::PeerDown { nid, reason, .. } => info!(%nid, ?reason, "peer down"),
            LnetEvent::Put { from, portal, .. } => debug!(%from, portal, "PUT (no consumer)"),
            _ => {}
        }
        if let Some((reply, resp)) = control.on_event(&ev) {
            let _ = reply.try_send(resp);
        }
    }
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

/// Accepts lnetctl connections. At most [`control::MAX_CLIENTS`] are served at once, each by
/// its own thread (a capture adds a watcher); the next are told "too many control clients" in
/// one line and closed at once, on this thread, so that idle or stuck clients cost a bounded
/// number of threads and fds. Each client thread reads with a size cap and timeouts
/// ([`control::read_request`]).
fn control_thread(
    listener: std::os::unix::net::UnixListener,
    req_tx: SyncSender<ControlMsg>,
    wake: WakeHandle,
    limits: ClientLimits,
    counters: Arc<ControlCounters>,
) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                warn!("control socket accept: {e}");
                std::thread::sleep(StdDuration::from_millis(100));
                continue;
            }
        };
        // Only this thread adds clients, so the check cannot be overtaken.
        if counters.active.load(Ordering::Relaxed) >= control::MAX_CLIENTS as u64 {
            ControlCounters::bump(&counters.refused);
            debug!(
                "control client refused: {} served already",
                control::MAX_CLIENTS
            );
            refuse(
                stream,
                &format!(
                    "too many control clients ({} at once); try again",
                    control::MAX_CLIENTS
                ),
            );
            continue;
        }
        counters.active.fetch_add(1, Ordering::Relaxed);
        let active = ActiveClient(Arc::clone(&counters));
        let (tx, wake, c) = (req_tx.clone(), wake.clone(), Arc::clone(&counters));
        let spawned = std::thread::Builder::new()
            .name("control-conn".into())
            .spawn(move || {
                let _active = active;
                ControlCounters::bump(&c.accepted);
                if let Err(e) = serve_client(stream, &tx, &wake, limits, &c) {
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
    tx: &SyncSender<ControlMsg>,
    wake: &WakeHandle,
    limits: ClientLimits,
    counters: &ControlCounters,
) -> std::io::Result<()> {
    // A client that does not read its answers is closed too, not waited for.
    stream.set_write_timeout(Some(limits.idle))?;
    // One fd per client: answers are written through the reader's stream.
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        let (counter, err) = match control::read_request(
            &mut reader,
            &mut line,
            Some(limits.idle),
            Some(limits.request),
        )? {
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
        let resp = match control::decode_request_bytes(&line) {
            Ok(req @ Request::CaptureStart { .. }) => {
                // The stream's pace is the client's: a capture is never idle.
                // The capture's watcher reads while this thread writes: a second fd, for the
                // one capture that runs at a time.
                let writer = reader.get_ref().try_clone()?;
                writer.set_write_timeout(None)?;
                return serve_capture(req, reader, writer, tx, wake);
            }
            Ok(req @ Request::StatsShow) => match forward(tx, wake, req) {
                Response::Stats(mut s) => {
                    s.control = Some(counters.snapshot());
                    Response::Stats(s)
                }
                other => other,
            },
            Ok(req) => forward(tx, wake, req),
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

/// A capture owns its connection: the loop's records are written to the client as they come,
/// while a watcher thread reads the client's side; a `capture_stop` line, or the client closing
/// (lnetctl killed, its host gone), ends the capture. So does a failed write: the stream's
/// receiver is dropped and the loop sees it at its next delivery.
fn serve_capture(
    req: Request,
    mut reader: BufReader<UnixStream>,
    mut writer: UnixStream,
    tx: &SyncSender<ControlMsg>,
    wake: &WakeHandle,
) -> std::io::Result<()> {
    let (out_tx, out_rx) = mpsc::sync_channel(control::CAPTURE_QUEUE);
    if let Err(e) = submit(tx, wake, req, out_tx) {
        return writer.write_all(control::encode_response(&Response::Error(e)).as_bytes());
    }
    let first = out_rx.recv().unwrap_or_else(|_| shutting_down());
    writer.write_all(control::encode_response(&first).as_bytes())?;
    let Response::CaptureStarted(started) = first else {
        return Ok(());
    };
    let (tx2, wake2, id) = (tx.clone(), wake.clone(), started.id);
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
            // The stop must get through, or the capture would run (and refuse every other)
            // until the daemon stops: retry while the control queue is full.
            loop {
                let (done_tx, _done_rx) = mpsc::sync_channel(1);
                match submit(&tx2, &wake2, Request::CaptureStop { id }, done_tx) {
                    Err(e) if e.errno == errno::EIO => {
                        std::thread::sleep(StdDuration::from_millis(10));
                    }
                    _ => break,
                }
            }
        })?;
    for resp in out_rx.iter() {
        let last = matches!(resp, Response::CaptureDone(_) | Response::Error(_));
        writer.write_all(control::encode_response(&resp).as_bytes())?;
        if last {
            break;
        }
    }
    // Ends the watcher's read too.
    let _ = writer.shutdown(std::net::Shutdown::Both);
    Ok(())
}

fn shutting_down() -> Response {
    Response::Error(ControlError::new(
        errno::ESHUTDOWN,
        "the daemon is shutting down",
    ))
}

/// Hands a request to the loop and wakes it; the answer comes on `reply`.
fn submit(
    tx: &SyncSender<ControlMsg>,
    wake: &WakeHandle,
    req: Request,
    reply: SyncSender<Response>,
) -> Result<(), ControlError> {
    match tx.try_send((req, reply)) {
        Ok(()) => {
            wake.wake();
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

/// One request through the loop and back.
fn forward(tx: &SyncSender<ControlMsg>, wake: &WakeHandle, req: Request) -> Response {
    let (reply_tx, reply_rx) = mpsc::sync_channel(1);
    if let Err(e) = submit(tx, wake, req, reply_tx) {
        return Response::Error(e);
    }
    reply_rx.recv().unwrap_or_else(|_| shutting_down())
}
