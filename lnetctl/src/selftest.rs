//! `lnetctl selftest`: lst's commands against the daemon's selftest console, `lst stat`'s
//! report, and `run`: a whole session in one command (groups, a batch, one test, a live
//! progress line, the lst-style report and a YAML or JSON summary at the end).

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use router::control::{ClientError, ControlClient, Request, Response};
use router::selftest::{
    CheckSpec, LstCommand, LstLatency, LstNodeResult, LstNodeStat, LstReply, TestSpec,
};
use serde::Serialize;

use crate::{emit, exit};

#[derive(Subcommand, Debug)]
pub enum SelftestCmd {
    /// Open a session (the console is the daemon's first NI)
    #[command(name = "new_session", alias = "new-session")]
    NewSession {
        /// Seconds the console waits for a node's answer [default: 30]
        #[arg(long, value_name = "SECS")]
        timeout: Option<u32>,
        /// Take nodes that are in another console's session
        #[arg(long)]
        force: bool,
        name: String,
    },
    /// End the session (every node leaves it)
    #[command(name = "end_session", alias = "end-session")]
    EndSession,
    /// Show the session
    #[command(name = "show_session", alias = "show-session")]
    ShowSession,
    /// Add a group of nodes (NIDs; ranges as 10.0.0.[1-4]@tcp) and join them to the session
    #[command(name = "add_group", alias = "add-group")]
    AddGroup {
        name: String,
        #[arg(required = true, value_name = "NID")]
        nids: Vec<String>,
    },
    /// Delete a group no test uses
    #[command(name = "del_group", alias = "del-group")]
    DelGroup { name: String },
    /// List the groups and the state of their nodes
    #[command(name = "list_group", alias = "list-group")]
    ListGroup,
    /// Add a batch
    #[command(name = "add_batch", alias = "add-batch")]
    AddBatch { name: String },
    /// List the batches and their tests
    #[command(name = "list_batch", alias = "list-batch")]
    ListBatch,
    /// Add a test to a batch: `ping`, or `brw read|write [size=N[k|m]] [check=none|simple|full] [off=N]`
    #[command(name = "add_test", alias = "add-test")]
    AddTest {
        #[arg(long, value_name = "BATCH")]
        batch: String,
        #[command(flatten)]
        shape: Shape,
        /// The client group
        #[arg(long, value_name = "GROUP")]
        from: String,
        /// The server group
        #[arg(long, value_name = "GROUP")]
        to: String,
        /// The test and its parameters
        #[arg(required = true, num_args = 1.., value_name = "TEST")]
        test: Vec<String>,
    },
    /// Run a batch
    Run { batch: String },
    /// Stop a batch
    Stop {
        batch: String,
        /// Abort the RPCs in flight
        #[arg(long)]
        force: bool,
    },
    /// Show how many of a batch's tests are active on each client
    Query { batch: String },
    /// Ping every node of a group (session query)
    Ping { group: String },
    /// LNet rates and bandwidth of groups, as `lst stat` prints them
    Stat {
        #[command(flatten)]
        opts: StatOpts,
        #[arg(required = true, value_name = "GROUP")]
        groups: Vec<String>,
    },
    /// Error counters of groups' nodes, as `lst show_error` prints them
    #[command(name = "show_error", alias = "show-error")]
    ShowError {
        #[arg(required = true, value_name = "GROUP")]
        groups: Vec<String>,
    },
    /// Latency of the test RPCs this daemon ran as a client (p50/p99/p99.9)
    Latency,
    /// A whole session in one command: clients and servers, one test, a live progress line,
    /// the lst-style report and a summary
    #[command(name = "run-test", alias = "run_test")]
    RunTest {
        /// Client NIDs (they run the test; this daemon may be one of them)
        #[arg(long, required = true, value_name = "NID", value_delimiter = ',')]
        from: Vec<String>,
        /// Server NIDs
        #[arg(long, required = true, value_name = "NID", value_delimiter = ',')]
        to: Vec<String>,
        #[command(flatten)]
        shape: Shape,
        /// Seconds to run (ignored with --loop)
        #[arg(long, default_value_t = 10, value_name = "SECS")]
        duration: u64,
        /// Seconds between progress samples
        #[arg(long, default_value_t = 1, value_name = "SECS")]
        interval: u64,
        /// Also write the summary (YAML, JSON with --json) to this file
        #[arg(long, value_name = "FILE")]
        summary: Option<PathBuf>,
        /// The test [default: brw write size=1M check=simple]
        #[arg(num_args = 0.., value_name = "TEST")]
        test: Vec<String>,
    },
}

/// How a test runs: loops, concurrency, distribution.
#[derive(Args, Debug, Clone)]
pub struct Shape {
    /// RPCs per test unit (-1: until stopped)
    #[arg(long = "loop", value_name = "N", allow_hyphen_values = true)]
    loop_count: Option<i64>,
    /// Concurrent RPCs per destination (1-1024)
    #[arg(long, value_name = "N", default_value_t = 1)]
    concurrency: u32,
    /// D:S: each D clients share S servers
    #[arg(long, value_name = "D:S")]
    distribute: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct StatOpts {
    /// Bandwidth only
    #[arg(long)]
    bw: bool,
    /// Rates only
    #[arg(long)]
    rate: bool,
    /// Received ([R]) only
    #[arg(long)]
    read: bool,
    /// Sent ([W]) only
    #[arg(long)]
    write: bool,
    /// Averages only
    #[arg(long)]
    avg: bool,
    /// Minimums only
    #[arg(long)]
    min: bool,
    /// Maximums only
    #[arg(long)]
    max: bool,
    /// MB/s (10^6) instead of MiB/s
    #[arg(long)]
    mbs: bool,
    /// Seconds between samples
    #[arg(long, default_value_t = 5, value_name = "SECS")]
    delay: u64,
    /// Reports to print (0: until interrupted)
    #[arg(long, default_value_t = 1, value_name = "N")]
    count: u64,
}

impl Default for StatOpts {
    fn default() -> StatOpts {
        StatOpts {
            bw: false,
            rate: false,
            read: false,
            write: false,
            avg: false,
            min: false,
            max: false,
            mbs: false,
            delay: 5,
            count: 1,
        }
    }
}

/// Parses lst's test words: `ping` or `brw [read|write] [size=N[k|m]] [check=C] [off=N]`.
pub fn parse_test(words: &[String]) -> Result<TestSpec, String> {
    let mut it = words.iter().map(String::as_str);
    match it.next() {
        Some("ping") => match it.next() {
            None => Ok(TestSpec::Ping),
            Some(w) => Err(format!("ping takes no parameter ({w})")),
        },
        Some("brw") => {
            let (mut write, mut size, mut check, mut off) = (false, 4096u32, CheckSpec::None, 0u32);
            for w in it {
                match w.split_once('=') {
                    None if w == "read" => write = false,
                    None if w == "write" => write = true,
                    Some(("size", v)) => size = parse_size(v)?,
                    Some(("check", "none")) => check = CheckSpec::None,
                    Some(("check", "simple")) => check = CheckSpec::Simple,
                    Some(("check", "full")) => check = CheckSpec::Full,
                    Some(("off", v)) => {
                        off = v.parse().map_err(|_| format!("off={v}: not a number"))?
                    }
                    _ => return Err(format!("brw: unknown parameter {w}")),
                }
            }
            if size == 0 || size > 1 << 20 {
                return Err(format!("size={size}: 1 to 1M"));
            }
            if off % 8 != 0 || off >= 4096 {
                return Err(format!("off={off}: a multiple of 8 below 4096"));
            }
            Ok(TestSpec::Brw {
                write,
                size,
                check,
                off,
            })
        }
        Some(t) => Err(format!("unknown test {t} (ping or brw)")),
        None => Err("no test given (ping or brw)".into()),
    }
}

fn parse_size(v: &str) -> Result<u32, String> {
    let lower = v.to_ascii_lowercase();
    let (num, mult) = match lower.strip_suffix('k') {
        Some(n) => (n, 1024),
        None => match lower.strip_suffix('m') {
            Some(n) => (n, 1 << 20),
            None => (lower.as_str(), 1),
        },
    };
    num.parse::<u32>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("size={v}: not a size"))
}

fn parse_dist(d: &Option<String>) -> Result<Option<(u32, u32)>, String> {
    let Some(d) = d else { return Ok(None) };
    let bad = || format!("--distribute {d}: D:S with both at least 1");
    let (a, b) = d.split_once(':').ok_or_else(bad)?;
    let (a, b): (u32, u32) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if a == 0 || b == 0 {
        return Err(bad());
    }
    Ok(Some((a, b)))
}

/// A connection to the daemon that runs one console command at a time.
struct Console {
    client: ControlClient,
}

impl Console {
    fn call(&mut self, cmd: LstCommand) -> Result<LstReply, (u8, String)> {
        match self.client.call(&Request::Selftest { cmd }) {
            Ok(Response::Selftest(r)) => Ok(r),
            Ok(Response::Error(e)) => Err((exit::FAILED, e.to_string())),
            Ok(other) => Err((exit::FAILED, format!("unexpected answer {other:?}"))),
            Err(e @ ClientError::NoDaemon { .. }) => Err((exit::NO_DAEMON, e.to_string())),
            Err(e) => Err((exit::FAILED, e.to_string())),
        }
    }
}

/// Runs `lnetctl selftest ...`.
pub fn run(socket: &Path, json: bool, cmd: SelftestCmd) -> u8 {
    let client = match ControlClient::connect(socket) {
        Ok(c) => c,
        Err(e @ ClientError::NoDaemon { .. }) => {
            eprintln!("lnetctl: {e}");
            return exit::NO_DAEMON;
        }
        Err(e) => {
            eprintln!("lnetctl: {e}");
            return exit::FAILED;
        }
    };
    let mut c = Console { client };
    let r = match cmd {
        SelftestCmd::Stat { opts, groups } => stat_loop(&mut c, &opts, &groups),
        SelftestCmd::ShowError { groups } => show_error(&mut c, json, groups),
        SelftestCmd::RunTest {
            from,
            to,
            shape,
            duration,
            interval,
            summary,
            test,
        } => run_test(
            &mut c, json, from, to, shape, duration, interval, summary, test,
        ),
        cmd => one(&mut c, json, cmd),
    };
    match r {
        Ok(()) => exit::OK,
        Err((code, msg)) => {
            eprintln!("lnetctl: selftest: {msg}");
            code
        }
    }
}

fn one(c: &mut Console, json: bool, cmd: SelftestCmd) -> Result<(), (u8, String)> {
    let usage = |m: String| (exit::USAGE, m);
    let lst = match cmd {
        SelftestCmd::NewSession {
            timeout,
            force,
            name,
        } => LstCommand::NewSession {
            name,
            timeout,
            force,
        },
        SelftestCmd::EndSession => LstCommand::EndSession,
        SelftestCmd::ShowSession => LstCommand::ShowSession,
        SelftestCmd::AddGroup { name, nids } => LstCommand::AddGroup { name, nids },
        SelftestCmd::DelGroup { name } => LstCommand::DelGroup { name },
        SelftestCmd::ListGroup => LstCommand::ListGroup,
        SelftestCmd::AddBatch { name } => LstCommand::AddBatch { name },
        SelftestCmd::ListBatch => LstCommand::ListBatch,
        SelftestCmd::AddTest {
            batch,
            shape,
            from,
            to,
            test,
        } => LstCommand::AddTest {
            batch,
            loop_count: shape.loop_count,
            concurrency: Some(shape.concurrency),
            distribute: parse_dist(&shape.distribute).map_err(usage)?,
            from,
            to,
            stop_onerr: false,
            test: parse_test(&test).map_err(usage)?,
        },
        SelftestCmd::Run { batch } => LstCommand::Run { batch },
        SelftestCmd::Stop { batch, force } => LstCommand::Stop { batch, force },
        SelftestCmd::Query { batch } => LstCommand::Query { batch },
        SelftestCmd::Ping { group } => LstCommand::Ping { group },
        SelftestCmd::Latency => LstCommand::Latency,
        SelftestCmd::Stat { .. } | SelftestCmd::RunTest { .. } | SelftestCmd::ShowError { .. } => {
            unreachable!("handled by run")
        }
    };
    let r = c.call(lst)?;
    emit(&if json {
        serde_json::to_string_pretty(&r).unwrap_or_default() + "\n"
    } else {
        render_reply(&r)
    });
    let bad = r
        .nodes
        .iter()
        .filter(|n| n.state != "ok" && n.status != Some(0))
        .count();
    if bad > 0 {
        return Err((exit::FAILED, format!("{bad} node(s) failed")));
    }
    Ok(())
}

/// An answer as lst prints it: the message, then nodes, groups, batches, latency.
pub(crate) fn render_reply(r: &LstReply) -> String {
    let mut out = String::new();
    if !r.message.is_empty() {
        let _ = writeln!(out, "{}", r.message);
    }
    for n in &r.nodes {
        let mut line = format!("    {}: {}", n.nid, n.state);
        if let Some(a) = n.active {
            let _ = write!(line, ", active tests: {a}");
        }
        if let Some(d) = &n.detail {
            let _ = write!(line, ", {d}");
        }
        if let Some(e) = &n.error {
            let _ = write!(line, " ({e})");
        }
        let _ = writeln!(out, "{line}");
    }
    for g in &r.groups {
        let active = g.nodes.iter().filter(|n| n.state == "active").count();
        let _ = writeln!(
            out,
            "Group {}: {} node(s), {} active, {} busy, {} down, {} unknown",
            g.name,
            g.nodes.len(),
            active,
            g.nodes.iter().filter(|n| n.state == "busy").count(),
            g.nodes.iter().filter(|n| n.state == "down").count(),
            g.nodes.iter().filter(|n| n.state == "unknown").count(),
        );
        for n in &g.nodes {
            let _ = writeln!(out, "    {}: {}", n.nid, n.state);
        }
    }
    for b in &r.batches {
        let _ = writeln!(out, "Batch {}: {} test(s)", b.name, b.tests.len());
        for (i, t) in b.tests.iter().enumerate() {
            let _ = writeln!(out, "    test {}: {t}", i + 1);
        }
    }
    for l in &r.latency {
        let _ = writeln!(
            out,
            "{}: {} RPCs, p50 {} us, p99 {} us, p99.9 {} us, max {} us",
            l.test, l.count, l.p50_us, l.p99_us, l.p999_us, l.max_us
        );
    }
    out
}

/// `show_error`: each node's test errors (framework: brw and ping; RPC: failed, dropped,
/// expired) and the nodes that could not be asked; exit 1 if any node has errors.
fn show_error(c: &mut Console, json: bool, groups: Vec<String>) -> Result<(), (u8, String)> {
    let r = c.call(LstCommand::Stat { groups })?;
    if json {
        emit(&(serde_json::to_string_pretty(&r.stats).unwrap_or_default() + "\n"));
    } else {
        emit(&render_errors(&r.stats));
    }
    let bad = r
        .stats
        .iter()
        .filter(|s| s.error.is_some() || node_errors(s) > 0)
        .count();
    if bad > 0 {
        return Err((
            exit::FAILED,
            format!("{bad} node(s) with errors or unreachable"),
        ));
    }
    Ok(())
}

fn node_errors(s: &LstNodeStat) -> u64 {
    u64::from(s.brw_errors)
        + u64::from(s.ping_errors)
        + u64::from(s.rpc_errors)
        + u64::from(s.rpcs_dropped)
        + u64::from(s.rpcs_expired)
}

fn render_errors(stats: &[LstNodeStat]) -> String {
    let mut out = String::new();
    let mut group = "";
    let mut total = 0u64;
    for s in stats {
        if s.group != group {
            group = &s.group;
            let _ = writeln!(out, "{group}:");
        }
        match &s.error {
            Some(e) => {
                let _ = writeln!(out, "    {}: unreachable ({e})", s.nid);
            }
            None => {
                total += node_errors(s);
                let _ = writeln!(
                    out,
                    "    {}: [Session {} brw errors, {} ping errors] [RPC: {} errors, {} dropped, {} expired]",
                    s.nid,
                    s.brw_errors,
                    s.ping_errors,
                    s.rpc_errors,
                    s.rpcs_dropped,
                    s.rpcs_expired
                );
            }
        }
    }
    let _ = writeln!(out, "Total {total} error(s) in {} node(s)", stats.len());
    out
}

/// One node's rates over an interval: RPC/s and bytes/s received and sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
struct Rates {
    rpc_r: f64,
    rpc_w: f64,
    bw_r: f64,
    bw_w: f64,
}

/// A node's rates between two stat samples over its own session clock (running_ms, as lst
/// divides by the node's elapsed time); `None` without two good samples or elapsed time.
fn node_rates(old: &LstNodeStat, new: &LstNodeStat) -> Option<Rates> {
    if old.error.is_some() || new.error.is_some() {
        return None;
    }
    let ms = new.running_ms.checked_sub(old.running_ms)?;
    if ms == 0 {
        return None;
    }
    let s = f64::from(ms) / 1000.0;
    Some(Rates {
        rpc_r: f64::from(new.recv_count.wrapping_sub(old.recv_count)) / s,
        rpc_w: f64::from(new.send_count.wrapping_sub(old.send_count)) / s,
        bw_r: new.recv_length.wrapping_sub(old.recv_length) as f64 / s,
        bw_w: new.send_length.wrapping_sub(old.send_length) as f64 / s,
    })
}

/// Avg/min/max of one figure over a group's nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    pub avg: f64,
    pub min: f64,
    pub max: f64,
}

fn spread(v: &[f64]) -> Spread {
    if v.is_empty() {
        return Spread::default();
    }
    Spread {
        avg: v.iter().sum::<f64>() / v.len() as f64,
        min: v.iter().copied().fold(f64::INFINITY, f64::min),
        max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    }
}

/// A group's report over an interval (lst stat's four lines, and the nodes it could not stat),
/// with lst's error counters (`show_error`'s) over the same interval, per group and per node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GroupReport {
    pub group: String,
    pub nodes: usize,
    pub failed: usize,
    pub rpc_read: Spread,
    pub rpc_write: Spread,
    /// MiB/s (MB/s with --mbs)
    pub bw_read: Spread,
    pub bw_write: Spread,
    /// Test RPCs that failed on the group's nodes as clients (sfw's brw and ping errors).
    pub brw_errors: u64,
    pub ping_errors: u64,
    /// The RPC layer's counters (srpc's): RPCs or bulk transfers that failed, timed out, or
    /// came for nothing.
    pub rpc_errors: u64,
    pub rpcs_expired: u64,
    pub rpcs_dropped: u64,
    /// Test RPCs the group's nodes sent as clients (the console's own RPCs not counted), and
    /// of those the ones that completed (sent and not failed).
    pub rpcs_sent: u64,
    pub rpcs_completed: u64,
    /// The nodes with any error above, each with its counts.
    pub node_errors: Vec<NodeErrors>,
}

/// One node's error counters over an interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeErrors {
    pub nid: String,
    pub brw_errors: u64,
    pub ping_errors: u64,
    pub rpc_errors: u64,
    pub rpcs_expired: u64,
    pub rpcs_dropped: u64,
}

impl NodeErrors {
    fn total(&self) -> u64 {
        self.brw_errors + self.ping_errors + self.rpc_errors + self.rpcs_expired + self.rpcs_dropped
    }
}

impl GroupReport {
    /// RPCs that failed or never completed, as the exit code counts them: test RPCs that
    /// failed, and RPC-layer errors and expiries (a dropped message is not one of ours).
    pub fn errors(&self) -> u64 {
        self.brw_errors + self.ping_errors + self.rpc_errors + self.rpcs_expired
    }
}

/// The test RPCs a node sent: its RPC layer's count without its console's own.
fn test_rpcs_sent(s: &LstNodeStat) -> u32 {
    s.rpcs_sent.wrapping_sub(s.console_rpcs)
}

fn group_reports(old: &[LstNodeStat], new: &[LstNodeStat], mbs: bool) -> Vec<GroupReport> {
    let unit = if mbs { 1e6 } else { 1048576.0 };
    let mut groups: Vec<String> = Vec::new();
    for s in new {
        if !groups.contains(&s.group) {
            groups.push(s.group.clone());
        }
    }
    groups
        .into_iter()
        .map(|g| {
            let mut rates = Vec::new();
            let mut rep = GroupReport {
                group: g.clone(),
                ..GroupReport::default()
            };
            for n in new.iter().filter(|s| s.group == g) {
                rep.nodes += 1;
                let o = old.iter().find(|o| o.nid == n.nid && o.group == g);
                match o.and_then(|o| node_rates(o, n)) {
                    Some(r) => rates.push(r),
                    None => rep.failed += 1,
                }
                // Counters of a node that answered both samples (one that did not is in
                // `failed`; a counter that went back means the node's session restarted).
                let Some(o) = o.filter(|o| o.error.is_none() && n.error.is_none()) else {
                    continue;
                };
                let d = |a: u32, b: u32| u64::from(b.saturating_sub(a));
                let e = NodeErrors {
                    nid: n.nid.clone(),
                    brw_errors: d(o.brw_errors, n.brw_errors),
                    ping_errors: d(o.ping_errors, n.ping_errors),
                    rpc_errors: d(o.rpc_errors, n.rpc_errors),
                    rpcs_expired: d(o.rpcs_expired, n.rpcs_expired),
                    rpcs_dropped: d(o.rpcs_dropped, n.rpcs_dropped),
                };
                let sent = d(test_rpcs_sent(o), test_rpcs_sent(n));
                rep.rpcs_sent += sent;
                rep.rpcs_completed += sent.saturating_sub(e.brw_errors + e.ping_errors);
                rep.brw_errors += e.brw_errors;
                rep.ping_errors += e.ping_errors;
                rep.rpc_errors += e.rpc_errors;
                rep.rpcs_expired += e.rpcs_expired;
                rep.rpcs_dropped += e.rpcs_dropped;
                if e.total() > 0 {
                    rep.node_errors.push(e);
                }
            }
            let col = |f: &dyn Fn(&Rates) -> f64| rates.iter().map(f).collect::<Vec<_>>();
            rep.rpc_read = spread(&col(&|r| r.rpc_r));
            rep.rpc_write = spread(&col(&|r| r.rpc_w));
            rep.bw_read = spread(&col(&|r| r.bw_r / unit));
            rep.bw_write = spread(&col(&|r| r.bw_w / unit));
            rep
        })
        .collect()
}

/// lst stat's text for the groups' reports.
fn render_stat(reps: &[GroupReport], o: &StatOpts) -> String {
    let mut out = String::new();
    let (rate, bw) = (!o.bw || o.rate, !o.rate || o.bw);
    let (r, w) = (!o.write || o.read, !o.read || o.write);
    let all = !(o.avg || o.min || o.max);
    let unit = if o.mbs { "MB/s " } else { "MiB/s" };
    let line = |out: &mut String, tag: &str, s: &Spread, u: &str, prec: usize| {
        let mut l = format!("[{tag}]");
        if all || o.avg {
            let _ = write!(l, " Avg: {:<8.prec$} {u}", s.avg);
        }
        if all || o.min {
            let _ = write!(l, " Min: {:<8.prec$} {u}", s.min);
        }
        if all || o.max {
            let _ = write!(l, " Max: {:<8.prec$} {u}", s.max);
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    for g in reps {
        if rate {
            let _ = writeln!(out, "[LNet Rates of {}]", g.group);
            if r {
                line(&mut out, "R", &g.rpc_read, "RPC/s", 0);
            }
            if w {
                line(&mut out, "W", &g.rpc_write, "RPC/s", 0);
            }
        }
        if bw {
            let _ = writeln!(out, "[LNet Bandwidth of {}]", g.group);
            if r {
                line(&mut out, "R", &g.bw_read, unit, 2);
            }
            if w {
                line(&mut out, "W", &g.bw_write, unit, 2);
            }
        }
        if g.failed > 0 {
            let _ = writeln!(out, "Failed to stat on {} node(s) of {}", g.failed, g.group);
        }
        // lst's error counters (show_error's), only when there are any: a clean report keeps
        // lst stat's layout.
        if !g.node_errors.is_empty() {
            let _ = writeln!(out, "[Errors of {}]", g.group);
            for e in &g.node_errors {
                let _ = writeln!(out, "    {}: {}", e.nid, error_counts(e));
            }
        }
    }
    out
}

/// A node's error counters as `show_error` words them.
fn error_counts(e: &NodeErrors) -> String {
    format!(
        "[Session {} brw errors, {} ping errors] [RPC: {} errors, {} dropped, {} expired]",
        e.brw_errors, e.ping_errors, e.rpc_errors, e.rpcs_dropped, e.rpcs_expired
    )
}

fn stat_loop(c: &mut Console, o: &StatOpts, groups: &[String]) -> Result<(), (u8, String)> {
    let delay = Duration::from_secs(o.delay.max(1));
    let mut old = c
        .call(LstCommand::Stat {
            groups: groups.to_vec(),
        })?
        .stats;
    let mut n = 0;
    loop {
        std::thread::sleep(delay);
        let new = c
            .call(LstCommand::Stat {
                groups: groups.to_vec(),
            })?
            .stats;
        emit(&render_stat(&group_reports(&old, &new, o.mbs), o));
        emit("\n");
        old = new;
        n += 1;
        if o.count != 0 && n >= o.count {
            return Ok(());
        }
    }
}

/// What `run-test` reports at its end.
#[derive(Debug, Serialize)]
struct Summary {
    session: String,
    test: String,
    clients: Vec<String>,
    servers: Vec<String>,
    concurrency: u32,
    seconds: f64,
    /// Rates over the run; error counters over the run and the wait for its last RPCs.
    groups: Vec<GroupReport>,
    /// This daemon's test RPCs (when it is one of the clients), microseconds.
    latency: Vec<LstLatency>,
    /// The clients' test RPCs: sent, completed, failed (brw and ping errors).
    rpcs_sent: u64,
    rpcs_completed: u64,
    brw_errors: u64,
    ping_errors: u64,
    /// Every node's RPC-layer errors and expiries (servers' failed bulk transfers too).
    rpc_errors: u64,
    rpcs_expired: u64,
    /// Clients whose RPCs had not ended when the wait for them did: aborted, and failed.
    unfinished: Vec<String>,
    failed_nodes: Vec<String>,
}

impl Summary {
    /// Why the run is a failure, if it is one: an RPC failed or never completed, a node could
    /// not be asked, or no test RPC completed at all.
    fn verdict(&self) -> Option<String> {
        let mut why = Vec::new();
        let errors: u64 = self.groups.iter().map(GroupReport::errors).sum();
        if errors > 0 {
            why.push(format!("{errors} RPC error(s)"));
        }
        if !self.unfinished.is_empty() {
            why.push(format!(
                "RPCs never completed on {}",
                self.unfinished.join(", ")
            ));
        }
        if !self.failed_nodes.is_empty() {
            why.push(format!(
                "{} group(s) with nodes that failed",
                self.failed_nodes.len()
            ));
        }
        if self.rpcs_completed == 0 {
            why.push(format!("no test RPC completed ({} sent)", self.rpcs_sent));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

#[allow(clippy::too_many_arguments)]
fn run_test(
    c: &mut Console,
    json: bool,
    from: Vec<String>,
    to: Vec<String>,
    shape: Shape,
    duration: u64,
    interval: u64,
    summary_file: Option<PathBuf>,
    test: Vec<String>,
) -> Result<(), (u8, String)> {
    let usage = |m: String| (exit::USAGE, m);
    let words = if test.is_empty() {
        ["brw", "write", "size=1M", "check=simple"]
            .map(String::from)
            .to_vec()
    } else {
        test
    };
    let spec = parse_test(&words).map_err(usage)?;
    let distribute = parse_dist(&shape.distribute).map_err(usage)?;
    let session = format!("lnetctl-{}", std::process::id());
    c.call(LstCommand::NewSession {
        name: session.clone(),
        timeout: None,
        force: false,
    })?;
    let r = session_body(c, &from, &to, &shape, distribute, spec, duration, interval);
    // The session ends whatever happened, so that its nodes are free for the next one.
    let end = c.call(LstCommand::EndSession);
    let run = r?;
    if let Err((_, e)) = end {
        eprintln!("lnetctl: selftest: end_session: {e}");
    }
    let groups = run.groups;
    let failed_nodes: Vec<String> = groups
        .iter()
        .filter(|g| g.failed > 0)
        .map(|g| format!("{} node(s) of {}", g.failed, g.group))
        .collect();
    let clients = groups.iter().find(|g| g.group == "clients");
    let of_clients = |f: fn(&GroupReport) -> u64| clients.map_or(0, f);
    let summary = Summary {
        session,
        test: words.join(" "),
        clients: from,
        servers: to,
        concurrency: shape.concurrency,
        seconds: run.secs,
        rpcs_sent: of_clients(|g| g.rpcs_sent),
        rpcs_completed: of_clients(|g| g.rpcs_completed),
        brw_errors: of_clients(|g| g.brw_errors),
        ping_errors: of_clients(|g| g.ping_errors),
        rpc_errors: groups.iter().map(|g| g.rpc_errors).sum(),
        rpcs_expired: groups.iter().map(|g| g.rpcs_expired).sum(),
        groups,
        latency: run.latency,
        unfinished: run.unfinished,
        failed_nodes,
    };
    let mut text = render_stat(&summary.groups, &StatOpts::default());
    for l in &summary.latency {
        let _ = writeln!(
            text,
            "[Latency of {}] p50: {} us p99: {} us p99.9: {} us max: {} us ({} RPCs)",
            l.test, l.p50_us, l.p99_us, l.p999_us, l.max_us, l.count
        );
    }
    let doc = if json {
        serde_json::to_string_pretty(&summary).unwrap_or_default() + "\n"
    } else {
        summary_yaml(&summary)
    };
    emit(&text);
    emit("\n");
    emit(&doc);
    if let Some(p) = summary_file {
        if let Err(e) = std::fs::write(&p, &doc) {
            return Err((exit::FAILED, format!("{}: {e}", p.display())));
        }
    }
    match summary.verdict() {
        Some(why) => Err((exit::FAILED, why)),
        None => Ok(()),
    }
}

/// What a run measured: rates over the run, error counters to after its last RPCs ended.
struct RunResult {
    groups: Vec<GroupReport>,
    latency: Vec<LstLatency>,
    secs: f64,
    unfinished: Vec<String>,
}

/// How long run-test waits for the RPCs in flight once the batch is stopped, before it
/// aborts them (a test RPC may take lnet_selftest's rpc_timeout, 64 s, to fail on its own).
const DRAIN_POLLS: u32 = 100;
const DRAIN_POLL: Duration = Duration::from_millis(100);

#[allow(clippy::too_many_arguments)]
fn session_body(
    c: &mut Console,
    from: &[String],
    to: &[String],
    shape: &Shape,
    distribute: Option<(u32, u32)>,
    spec: TestSpec,
    duration: u64,
    interval: u64,
) -> Result<RunResult, (u8, String)> {
    for (g, nids) in [("clients", from), ("servers", to)] {
        let r = c.call(LstCommand::AddGroup {
            name: g.into(),
            nids: nids.to_vec(),
        })?;
        let bad: Vec<String> = r
            .nodes
            .iter()
            .filter(|n| n.status != Some(0))
            .map(|n| format!("{} {}", n.nid, n.error.clone().unwrap_or(n.state.clone())))
            .collect();
        if !bad.is_empty() {
            return Err((exit::FAILED, format!("{g}: {}", bad.join("; "))));
        }
    }
    c.call(LstCommand::AddBatch {
        name: "bulk".into(),
    })?;
    c.call(LstCommand::AddTest {
        batch: "bulk".into(),
        loop_count: shape.loop_count,
        concurrency: Some(shape.concurrency),
        distribute,
        from: "clients".into(),
        to: "servers".into(),
        stop_onerr: false,
        test: spec,
    })?;
    let groups = vec!["clients".to_string(), "servers".to_string()];
    let stat = |c: &mut Console| -> Result<Vec<LstNodeStat>, (u8, String)> {
        Ok(c.call(LstCommand::Stat {
            groups: groups.clone(),
        })?
        .stats)
    };
    let query = |c: &mut Console| -> Result<Vec<LstNodeResult>, (u8, String)> {
        Ok(c.call(LstCommand::Query {
            batch: "bulk".into(),
        })?
        .nodes)
    };
    let idle = |nodes: &[LstNodeResult]| nodes.iter().all(|n| n.active == Some(0));
    let first = stat(c)?;
    c.call(LstCommand::Run {
        batch: "bulk".into(),
    })?;
    let t0 = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut prev = first.clone();
    let step = Duration::from_secs(interval.max(1));
    let until = Duration::from_secs(duration.max(1));
    let mut last = first.clone();
    while t0.elapsed() < until || shape.loop_count.is_some_and(|l| l >= 0) {
        std::thread::sleep(
            step.min(
                until
                    .saturating_sub(t0.elapsed())
                    .max(Duration::from_millis(100)),
            ),
        );
        let now = stat(c)?;
        let reps = group_reports(&prev, &now, false);
        let line = progress_line(t0.elapsed(), until, &reps);
        if tty {
            eprint!("\r\x1b[K{line}");
        } else {
            eprintln!("{line}");
        }
        let _ = std::io::stderr().flush();
        prev = now.clone();
        last = now;
        if shape.loop_count.is_some_and(|l| l >= 0) && idle(&query(c)?) {
            break;
        }
    }
    if tty {
        eprintln!();
    }
    c.call(LstCommand::Stop {
        batch: "bulk".into(),
        force: false,
    })?;
    let secs = t0.elapsed().as_secs_f64();
    // Let the RPCs in flight end (each does within its timeout), so that the latency is whole
    // and every failure is counted; those still out when the wait ends never completed: they
    // are aborted (lst stop --force), which fails them on their clients, and named.
    let mut q = query(c)?;
    for _ in 0..DRAIN_POLLS {
        if idle(&q) {
            break;
        }
        std::thread::sleep(DRAIN_POLL);
        q = query(c)?;
    }
    let unfinished: Vec<String> = q
        .iter()
        .filter(|n| n.active != Some(0))
        .map(|n| n.nid.clone())
        .collect();
    if !unfinished.is_empty() {
        c.call(LstCommand::Stop {
            batch: "bulk".into(),
            force: true,
        })?;
        // An aborted RPC whose bulk is being moved ends with its bulk's event.
        for _ in 0..DRAIN_POLLS {
            if idle(&query(c)?) {
                break;
            }
            std::thread::sleep(DRAIN_POLL);
        }
    }
    let latency = c.call(LstCommand::Latency)?.latency;
    // The counters once every RPC ended: a failure after the last progress sample counts.
    let end = stat(c)?;
    let mut groups = group_reports(&first, &last, false);
    for (g, e) in groups.iter_mut().zip(group_reports(&first, &end, false)) {
        g.failed = g.failed.max(e.failed);
        g.brw_errors = e.brw_errors;
        g.ping_errors = e.ping_errors;
        g.rpc_errors = e.rpc_errors;
        g.rpcs_expired = e.rpcs_expired;
        g.rpcs_dropped = e.rpcs_dropped;
        g.rpcs_sent = e.rpcs_sent;
        g.rpcs_completed = e.rpcs_completed;
        g.node_errors = e.node_errors;
    }
    Ok(RunResult {
        groups,
        latency,
        secs,
        unfinished,
    })
}

fn progress_line(t: Duration, total: Duration, reps: &[GroupReport]) -> String {
    let mut s = format!("[{:>4.0}s/{}s]", t.as_secs_f64(), total.as_secs());
    for g in reps {
        let _ = write!(
            s,
            "  {}: R {:.1} W {:.1} MiB/s, {:.0}/{:.0} RPC/s",
            g.group,
            g.bw_read.avg * g.nodes.saturating_sub(g.failed) as f64,
            g.bw_write.avg * g.nodes.saturating_sub(g.failed) as f64,
            g.rpc_read.avg,
            g.rpc_write.avg
        );
        if g.errors() > 0 {
            let _ = write!(s, " errors {}", g.errors());
        }
    }
    s
}

fn summary_yaml(s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "selftest:");
    let _ = writeln!(out, "    session: {}", s.session);
    let _ = writeln!(out, "    test: {}", s.test);
    let _ = writeln!(out, "    clients: [{}]", s.clients.join(", "));
    let _ = writeln!(out, "    servers: [{}]", s.servers.join(", "));
    let _ = writeln!(out, "    concurrency: {}", s.concurrency);
    let _ = writeln!(out, "    seconds: {:.1}", s.seconds);
    let _ = writeln!(out, "    rpcs_sent: {}", s.rpcs_sent);
    let _ = writeln!(out, "    rpcs_completed: {}", s.rpcs_completed);
    let _ = writeln!(out, "    brw_errors: {}", s.brw_errors);
    let _ = writeln!(out, "    ping_errors: {}", s.ping_errors);
    let _ = writeln!(out, "    rpc_errors: {}", s.rpc_errors);
    let _ = writeln!(out, "    rpcs_expired: {}", s.rpcs_expired);
    let _ = writeln!(out, "    unfinished: [{}]", s.unfinished.join(", "));
    let _ = writeln!(out, "    groups:");
    for g in &s.groups {
        let _ = writeln!(out, "        - group: {}", g.group);
        let _ = writeln!(out, "          nodes: {}", g.nodes);
        let _ = writeln!(out, "          failed: {}", g.failed);
        for (k, v) in [
            ("rpcs_sent", g.rpcs_sent),
            ("rpcs_completed", g.rpcs_completed),
            ("brw_errors", g.brw_errors),
            ("ping_errors", g.ping_errors),
            ("rpc_errors", g.rpc_errors),
            ("rpcs_expired", g.rpcs_expired),
            ("rpcs_dropped", g.rpcs_dropped),
        ] {
            let _ = writeln!(out, "          {k}: {v}");
        }
        if !g.node_errors.is_empty() {
            let _ = writeln!(out, "          errors:");
            for e in &g.node_errors {
                let _ = writeln!(
                    out,
                    "              - {{nid: {}, brw_errors: {}, ping_errors: {}, rpc_errors: {}, rpcs_expired: {}, rpcs_dropped: {}}}",
                    e.nid, e.brw_errors, e.ping_errors, e.rpc_errors, e.rpcs_expired, e.rpcs_dropped
                );
            }
        }
        for (k, v, p) in [
            ("rpc_read", &g.rpc_read, 0),
            ("rpc_write", &g.rpc_write, 0),
            ("mib_read", &g.bw_read, 2),
            ("mib_write", &g.bw_write, 2),
        ] {
            let _ = writeln!(
                out,
                "          {k}: {{avg: {:.p$}, min: {:.p$}, max: {:.p$}}}",
                v.avg, v.min, v.max
            );
        }
    }
    let _ = writeln!(out, "    latency_us:");
    for l in &s.latency {
        let _ = writeln!(
            out,
            "        - {{test: {}, count: {}, p50: {}, p99: {}, p99.9: {}, max: {}}}",
            l.test, l.count, l.p50_us, l.p99_us, l.p999_us, l.max_us
        );
    }
    if !s.failed_nodes.is_empty() {
        let _ = writeln!(out, "    failed: [{}]", s.failed_nodes.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(nid: &str, g: &str, ms: u32, rc: u32, sc: u32, rl: u64, sl: u64) -> LstNodeStat {
        LstNodeStat {
            nid: nid.into(),
            group: g.into(),
            running_ms: ms,
            recv_count: rc,
            send_count: sc,
            recv_length: rl,
            send_length: sl,
            ..LstNodeStat::default()
        }
    }

    #[test]
    fn show_error_lists_every_node_and_the_unreachable() {
        let mut a = st("a", "s", 10, 0, 0, 0, 0);
        a.brw_errors = 2;
        a.rpcs_expired = 1;
        let mut b = st("b", "s", 10, 0, 0, 0, 0);
        b.error = Some("RPC timed out".into());
        let text = render_errors(&[a, b]);
        assert_eq!(
            text,
            "s:\n    a: [Session 2 brw errors, 0 ping errors] [RPC: 0 errors, 0 dropped, 1 expired]\n    b: unreachable (RPC timed out)\nTotal 3 error(s) in 2 node(s)\n"
        );
    }

    /// Errors and completions over an interval, per group and node: a client's test RPCs are
    /// its RPC layer's count without its console's, completed unless they failed; a node with
    /// errors is listed under the report as show_error words it; no RPC completed, or any
    /// error, is a failed run.
    #[test]
    fn errors_and_completions_are_counted_per_group_and_node() {
        let mut old = st("c", "clients", 1000, 0, 0, 0, 0);
        old.rpcs_sent = 10;
        old.console_rpcs = 10;
        let mut new = st("c", "clients", 2000, 0, 0, 0, 0);
        new.rpcs_sent = 25;
        new.console_rpcs = 13;
        new.brw_errors = 2;
        new.rpc_errors = 2;
        let srv_old = st("s", "servers", 1000, 0, 0, 0, 0);
        let mut srv_new = st("s", "servers", 2000, 0, 0, 0, 0);
        srv_new.rpcs_expired = 1;
        let reps = group_reports(&[old, srv_old], &[new, srv_new], false);
        let c = &reps[0];
        assert_eq!((c.rpcs_sent, c.rpcs_completed, c.brw_errors), (12, 10, 2));
        assert_eq!((c.errors(), reps[1].errors()), (4, 1));
        let text = render_stat(&reps, &StatOpts::default());
        assert!(
            text.contains("[Errors of clients]\n    c: [Session 2 brw errors, 0 ping errors] [RPC: 2 errors, 0 dropped, 0 expired]\n"),
            "{text}"
        );
        assert!(text.ends_with("[Errors of servers]\n    s: [Session 0 brw errors, 0 ping errors] [RPC: 0 errors, 0 dropped, 1 expired]\n"), "{text}");
        let mut sum = Summary {
            session: "s".into(),
            test: "brw".into(),
            clients: vec![],
            servers: vec![],
            concurrency: 1,
            seconds: 1.0,
            groups: reps,
            latency: vec![],
            rpcs_sent: 12,
            rpcs_completed: 10,
            brw_errors: 2,
            ping_errors: 0,
            rpc_errors: 2,
            rpcs_expired: 1,
            unfinished: vec![],
            failed_nodes: vec![],
        };
        assert_eq!(sum.verdict().as_deref(), Some("5 RPC error(s)"));
        sum.groups.clear();
        assert_eq!(sum.verdict(), None);
        sum.rpcs_completed = 0;
        assert_eq!(
            sum.verdict().as_deref(),
            Some("no test RPC completed (12 sent)")
        );
    }

    #[test]
    fn test_words_parse_as_lst_takes_them() {
        let w = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(parse_test(&w("ping")), Ok(TestSpec::Ping));
        assert_eq!(
            parse_test(&w("brw write size=1M check=full off=8")),
            Ok(TestSpec::Brw {
                write: true,
                size: 1 << 20,
                check: CheckSpec::Full,
                off: 8
            })
        );
        assert_eq!(
            parse_test(&w("brw")),
            Ok(TestSpec::Brw {
                write: false,
                size: 4096,
                check: CheckSpec::None,
                off: 0
            })
        );
        assert!(parse_test(&w("brw size=2M")).is_err());
        assert!(parse_test(&w("brw off=4")).is_err());
        assert!(parse_test(&w("brw check=paranoid")).is_err());
        assert!(parse_test(&w("dd")).is_err());
        assert_eq!(parse_dist(&Some("2:1".into())), Ok(Some((2, 1))));
        assert!(parse_dist(&Some("0:1".into())).is_err());
    }

    /// Rates are per node over its own elapsed time; avg/min/max across the group; a node
    /// without two samples is counted as failed, not as zero.
    #[test]
    fn stat_report_is_lst_shaped() {
        let old = vec![
            st("a", "s", 1000, 0, 0, 0, 0),
            st("b", "s", 1000, 0, 0, 0, 0),
        ];
        let mut dead = st("c", "s", 0, 0, 0, 0, 0);
        dead.error = Some("down".into());
        let new = vec![
            st("a", "s", 3000, 2000, 1000, 2 << 20, 4 << 20),
            st("b", "s", 2000, 500, 500, 1 << 20, 0),
            dead,
        ];
        let reps = group_reports(&old, &new, false);
        assert_eq!(reps.len(), 1);
        let g = &reps[0];
        assert_eq!((g.nodes, g.failed), (3, 1));
        assert_eq!(g.rpc_read.min, 500.0);
        assert_eq!(g.rpc_read.max, 1000.0);
        assert_eq!(g.rpc_read.avg, 750.0);
        assert_eq!(g.bw_read.avg, 1.0);
        let text = render_stat(&reps, &StatOpts::default());
        let want = "\
[LNet Rates of s]
[R] Avg: 750      RPC/s Min: 500      RPC/s Max: 1000     RPC/s
[W] Avg: 500      RPC/s Min: 500      RPC/s Max: 500      RPC/s
[LNet Bandwidth of s]
[R] Avg: 1.00     MiB/s Min: 1.00     MiB/s Max: 1.00     MiB/s
[W] Avg: 1.00     MiB/s Min: 0.00     MiB/s Max: 2.00     MiB/s
Failed to stat on 1 node(s) of s
";
        assert_eq!(text, want);
        let bw_only = StatOpts {
            bw: true,
            write: true,
            max: true,
            ..StatOpts::default()
        };
        assert_eq!(
            render_stat(&reps, &bw_only),
            "[LNet Bandwidth of s]\n[W] Max: 2.00     MiB/s\nFailed to stat on 1 node(s) of s\n"
        );
    }
}
