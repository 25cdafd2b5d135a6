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
//! Other options: `--warmup N` (pings before measuring, default 1000), `--window W`,
//! `--peer-credits C` (LNet and LND peer credits, default LNet's 8), `--payload BYTES` (default
//! 64), `--busy-poll-us US` (the tcp fabric's busy-poll budget, default 50). Each node thread runs its own loop: apply the node's actions to its fabric, poll the
//! fabric with a short timeout, run timers when due, drain events. Results come back to the main
//! thread over channels; both nodes shut down gracefully at the end (bounded), and the main
//! thread gives up (exit 1) if a phase overruns its time bound.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use lnd::driver::tcp::{MonotonicClock, TcpFabric};
use lnd::time::Duration;
use lnd::wire::Nid;
use router::runtime::NiRuntime;
use router::{LnetEvent, LnetNode, NiConfig, NiIndex, NodeConfig, DEFAULT_PEER_CREDITS};

/// Longest single wait in a node loop (stop flags are looked at least this often).
const MAX_WAIT: StdDuration = StdDuration::from_millis(2);
/// Bound on a graceful shutdown.
const SHUTDOWN_BOUND: StdDuration = StdDuration::from_secs(5);
/// Per-ping timeout.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// The portal the benchmark PUTs go to (any non-reserved portal).
const BENCH_PORTAL: u32 = 4;

#[derive(Copy, Clone, Debug)]
enum Mode {
    Rtt(usize),
    PutRate(f64),
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
}

/// State both node threads and the main thread see.
struct Shared {
    /// Each node's listen address, set by its thread once bound.
    addrs: [OnceLock<SocketAddr>; 2],
    /// Main asks A to stop its PUT stream (or, on a failure, everything to stop).
    stop_client: AtomicBool,
    /// Main asks B to stop, once A is done (so that A's last PUTs still find B up).
    stop: AtomicBool,
    /// PUTs B received (in B's process) or A saw complete (in A's).
    received: AtomicU64,
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
        "usage: lnet_perf (--rtt N | --put-rate SECS) [--warmup N] [--window W] \
         [--peer-credits C] [--payload BYTES] [--max-wait-us US] [--busy-poll-us US]"
    );
    ExitCode::from(2)
}

fn parse_args() -> Option<Opts> {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
    };
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
            "--warmup" => opts.warmup = val?.parse().ok()?,
            "--window" => opts.window = val?.parse().ok().filter(|&w| w > 0)?,
            "--peer-credits" => opts.peer_credits = val?.parse().ok().filter(|&c| c > 0)?,
            "--payload" => opts.payload = val?.parse().ok()?,
            "--max-wait-us" => opts.max_wait = StdDuration::from_micros(val?.parse().ok()?),
            "--busy-poll-us" => opts.busy_poll = StdDuration::from_micros(val?.parse().ok()?),
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
    Some(opts)
}

fn main() -> ExitCode {
    let Some(opts) = parse_args() else {
        return usage();
    };
    let shared = Arc::new(Shared {
        addrs: [OnceLock::new(), OnceLock::new()],
        stop_client: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        received: AtomicU64::new(0),
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
    let _ = shared.addrs[1].set(server.addr);
    let (tx, rx) = mpsc::channel::<Report>();
    let client = match spawn_node(0, &opts, &shared, tx) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lnet_perf: cannot start node A: {e}");
            return ExitCode::FAILURE;
        }
    };

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
            recv(bound).and_then(|r| match r {
                Report::Rtt(samples) => {
                    print_rtt(&samples);
                    Ok(())
                }
                _ => Err("unexpected report".into()),
            })
        }
        Mode::PutRate(secs) => measure_puts(&shared, secs, &opts, recv),
    };
    shared.stop_client.store(true, Ordering::Relaxed);
    shared.stop.store(true, Ordering::Relaxed);
    if let Err(e) = &result {
        eprintln!("lnet_perf: {e}");
        // Do not wait for threads that may be stuck: the process exit closes every socket.
        return ExitCode::FAILURE;
    }
    // Both nodes shut down gracefully (each bounded by SHUTDOWN_BOUND): A first, then B
    // (closing its stdin), which reports what it received.
    let mut ok = true;
    match join_bounded(client, SHUTDOWN_BOUND + StdDuration::from_secs(5)) {
        Some(Ok(())) => {}
        Some(Err(e)) => {
            eprintln!("lnet_perf: node A: {e}");
            ok = false;
        }
        None => {
            eprintln!("lnet_perf: node A did not stop in time");
            ok = false;
        }
    }
    match server.stop(SHUTDOWN_BOUND + StdDuration::from_secs(5)) {
        Ok(received) => {
            let completed = shared.received.load(Ordering::Relaxed);
            eprintln!("INFO node B received {received} PUTs; A saw {completed} complete");
            if matches!(opts.mode, Mode::PutRate(_)) && received != completed {
                eprintln!("lnet_perf: B received {received} PUTs but A saw {completed} complete");
                ok = false;
            }
        }
        Err(e) => {
            eprintln!("lnet_perf: node B: {e}");
            ok = false;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Node B as a child process (see the module doc).
struct Server {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    addr: SocketAddr,
}

impl Server {
    fn start(opts: &Opts) -> Result<Server, String> {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut child = Command::new(exe)
            .args([
                "--serve".to_string(),
                "--peer-credits".into(),
                opts.peer_credits.to_string(),
                "--max-wait-us".into(),
                opts.max_wait.as_micros().to_string(),
                "--busy-poll-us".into(),
                opts.busy_poll.as_micros().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let first = lines
            .recv_timeout(StdDuration::from_secs(10))
            .map_err(|_| "node B did not report its address".to_string())?;
        let addr = first
            .strip_prefix("LISTEN ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("node B said '{first}', not LISTEN <addr>"))?;
        Ok(Server { child, lines, addr })
    }

    /// Closes B's stdin (its signal to shut down) and returns what it received.
    fn stop(&mut self, bound: StdDuration) -> Result<u64, String> {
        drop(self.child.stdin.take());
        let deadline = StdInstant::now() + bound;
        let mut received = None;
        while received.is_none() {
            let left = deadline.saturating_duration_since(StdInstant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => received = l.strip_prefix("RECEIVED ").and_then(|n| n.parse().ok()),
                Err(_) => break,
            }
        }
        while StdInstant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return match (st.success(), received) {
                    (true, Some(n)) => Ok(n),
                    (true, None) => Err("exited without reporting RECEIVED".into()),
                    (false, _) => Err(format!("exited with {st}")),
                };
            }
            std::thread::sleep(StdDuration::from_millis(5));
        }
        let _ = self.child.kill();
        Err("did not stop in time (killed)".into())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `--serve`: node B until stdin closes.
fn serve_main(opts: &Opts, shared: &Arc<Shared>) -> ExitCode {
    let stop_on_eof = Arc::clone(shared);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        stop_on_eof.stop.store(true, Ordering::Relaxed);
    });
    let (tx, _rx) = mpsc::channel();
    let r = node_thread(1, opts, shared, &tx);
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
) -> Result<(), String> {
    let bound = StdDuration::from_secs(30) + StdDuration::from_millis(5) * opts.warmup as u32;
    match recv(bound)? {
        Report::Streaming => {}
        _ => return Err("unexpected report".into()),
    }
    // Let the stream settle, then count what B receives over the window.
    std::thread::sleep(StdDuration::from_millis(500));
    let (c0, t0) = (shared.received.load(Ordering::Relaxed), StdInstant::now());
    std::thread::sleep(StdDuration::from_secs_f64(secs));
    let (c1, t1) = (shared.received.load(Ordering::Relaxed), StdInstant::now());
    shared.stop_client.store(true, Ordering::Relaxed);
    let dt = t1.duration_since(t0).as_secs_f64();
    let rate = (c1 - c0) as f64 / dt;
    match recv(StdDuration::from_secs(10))? {
        Report::PutsDone { sent, done, errors } => {
            eprintln!(
                "INFO put stream: window {} peer_credits {} payload {} B; A sent {sent}, \
                 completed {done}, errors {errors}; {} completed in total, {} in {dt:.3} s",
                opts.window,
                opts.peer_credits,
                opts.payload,
                shared.received.load(Ordering::Relaxed),
                c1 - c0
            );
            if errors > 0 {
                return Err(format!("{errors} PUTs failed"));
            }
        }
        _ => return Err("unexpected report".into()),
    }
    println!(
        "FIGURE ulnet_put{}_rate msgs/s value={rate:.0}",
        opts.payload
    );
    Ok(())
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
    idx: usize,
    opts: &Opts,
    shared: &Arc<Shared>,
    tx: Sender<Report>,
) -> std::io::Result<JoinHandle<Result<(), String>>> {
    let opts = opts.clone();
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name(if idx == 0 { "node-a" } else { "node-b" }.into())
        .spawn(move || {
            let r = node_thread(idx, &opts, &shared, &tx);
            if let Err(e) = &r {
                let _ = tx.send(Report::Failed(format!("node {}: {e}", ["A", "B"][idx])));
                shared.stop_client.store(true, Ordering::Relaxed);
                shared.stop.store(true, Ordering::Relaxed);
            }
            r
        })
}

/// One node's runtime (its node, fabric, clock and waker: `router::runtime::NiRuntime`, the
/// same loop the daemon's NI threads run), and how long a turn may wait.
struct Driver {
    rt: NiRuntime<TcpFabric>,
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

    /// Graceful shutdown, bounded; the last actions reach the sockets.
    fn shutdown(&mut self) {
        if let Some(ep) = self.rt.node().endpoint(NiIndex(0)) {
            let s = ep.stats();
            let f = self.rt.driver().stats();
            eprintln!(
                "INFO node {} LND: msgs sent {} received {}, credit NOOPs {}, keepalives {}; \
                 fabric: bytes tx {} rx {}, rx stalls {}; ring enters {}",
                self.rt.node().nids()[0],
                s.msgs_sent,
                s.msgs_received,
                s.credit_noops,
                s.keepalives,
                f.bytes_tx,
                f.bytes_rx,
                f.rx_stalls,
                self.rt.driver().ring_stats().enters,
            );
        }
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
    idx: usize,
    opts: &Opts,
    shared: &Arc<Shared>,
    tx: &Sender<Report>,
) -> Result<(), String> {
    let nids = [nid("10.0.0.1@o2ib"), nid("10.0.0.2@o2ib")];
    let me = nids[idx];
    let other = nids[1 - idx];
    let resolver_shared = Arc::clone(shared);
    let resolver = move |n: Nid| {
        if n == other {
            resolver_shared.addrs[1 - idx].get().copied()
        } else {
            None
        }
    };
    let tcp = lnd::driver::tcp::TcpConfig {
        busy_poll: opts.busy_poll,
        ..Default::default()
    };
    let fabric = TcpFabric::bind_with("127.0.0.1:0".parse().expect("address"), resolver, tcp)
        .map_err(|e| format!("cannot bind the tcp fabric: {e}"))?;
    let _ = shared.addrs[idx].set(fabric.local_addr());
    if opts.serve {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "LISTEN {}", fabric.local_addr());
        let _ = out.flush();
    }

    let clock = MonotonicClock::new();
    let mut ni = NiConfig::new(me, 0x5eed_0000 + idx as u64 + 1);
    ni.peer_credits = opts.peer_credits;
    ni.tunables.peer_credits = opts.peer_credits.min(255) as u16;
    ni.credits = ni.credits.max(opts.peer_credits);
    let node = LnetNode::new(NodeConfig::new(vec![ni]), clock.now());
    let (rt, _wake) = NiRuntime::new(node, fabric, clock)
        .map_err(|e| format!("cannot make the node's waker: {e}"))?;
    let mut d = Driver {
        rt,
        max_wait: opts.max_wait,
    };

    let r = if idx == 1 {
        run_server(&mut d, shared)
    } else {
        run_client(&mut d, opts, shared, tx, other)
    };
    d.shutdown();
    r
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

/// One ping from A to `dst`, driven to completion; its round trip in nanoseconds.
fn ping_once(d: &mut Driver, dst: Nid, shared: &Shared) -> Result<u64, String> {
    let t0 = StdInstant::now();
    let now = d.rt.now();
    let id = d
        .node()
        .ping(now, dst, PING_TIMEOUT)
        .map_err(|e| format!("ping: {e}"))?;
    loop {
        d.turn(d.max_wait)?;
        while let Some(ev) = d.node().poll_event() {
            if let LnetEvent::PingDone {
                id: got, result, ..
            } = ev
            {
                if got == id {
                    let rtt = t0.elapsed().as_nanos() as u64;
                    return result.map(|_| rtt).map_err(|e| format!("ping {dst}: {e}"));
                }
            }
        }
        if shared.stop_client.load(Ordering::Relaxed) {
            return Err("stopped".into());
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
    // The peer's address must be known before the first connect.
    let deadline = StdInstant::now() + StdDuration::from_secs(5);
    while shared.addrs[1].get().is_none() {
        if StdInstant::now() >= deadline {
            return Err("node B never bound its fabric".into());
        }
        std::thread::sleep(StdDuration::from_millis(1));
    }
    for _ in 0..opts.warmup.max(1) {
        ping_once(d, dst, shared)?;
    }
    match opts.mode {
        Mode::Rtt(n) => {
            let mut samples = Vec::with_capacity(n);
            for _ in 0..n {
                samples.push(ping_once(d, dst, shared)?);
            }
            let _ = tx.send(Report::Rtt(samples));
        }
        Mode::PutRate(_) => {
            let _ = tx.send(Report::Streaming);
            let (sent, done, errors) = stream_puts(d, opts, shared, dst)?;
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
    let mut drain_deadline = None;
    loop {
        let stopping = shared.stop_client.load(Ordering::Relaxed);
        if stopping && drain_deadline.is_none() {
            drain_deadline = Some(StdInstant::now() + StdDuration::from_secs(5));
        }
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
        if let Some(dl) = drain_deadline {
            if outstanding == 0 || StdInstant::now() >= dl {
                return Ok((sent, done, errors));
            }
        }
    }
}
