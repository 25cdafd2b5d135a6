//! `lnetctl`: ulnet's control tool. It asks the `lnet-router` daemon over its control socket
//! (JSON lines, `router::control`) and prints the answer as YAML in real lnetctl's layout, or as
//! JSON with `--json`. Without a daemon, `ping` runs an in-process LNet that has only `0@lo`.
//! `capture` writes the daemon's o2iblnd traffic into a pcap file (`capture.rs`). `demo` walks
//! one LNet ping exchange through the real wire encoders and decoders.

mod capture;
mod demo;
mod export;
#[cfg(test)]
mod golden;
mod import;
mod render;
mod selftest;
mod tree;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lnd::wire::Nid;
use router::control::{
    self, default_socket_path, errno, ClientError, ControlClient, ImportOp, ImportReport, Request,
    Response,
};
use router::{LnetNode, NodeConfig};

/// The exit codes a script can rely on.
pub(crate) mod exit {
    /// The command worked (every ping answered).
    pub const OK: u8 = 0;
    /// The operation failed: a ping failed or timed out, a peer is unknown, the daemon refused.
    pub const FAILED: u8 = 1;
    /// Bad command line (clap's own code).
    pub const USAGE: u8 = 2;
    /// No daemon: the control socket is missing or refuses connections.
    pub const NO_DAEMON: u8 = 3;
    /// A NID on the command line does not parse.
    pub const BAD_NID: u8 = 4;
}

const EXIT_CODES: &str = "\
Exit status:
  0  success (for ping: every NID answered)
  1  the operation failed (a ping failed or timed out, unknown peer, daemon error)
  2  usage error (bad command line)
  3  no daemon: the control socket is missing or refused the connection (for ping: a NID
     other than 0@lo was asked for)
  4  a NID on the command line is malformed

Without a daemon, `ping` answers from an in-process LNet that has only 0@lo (so `lnetctl ping
0@lo` works anywhere); remote NIDs need the lnet-router daemon.";

#[derive(Parser, Debug)]
#[command(
    name = "lnetctl",
    version,
    about = "ulnet's lnetctl: ping, nets, peers, connections and counters of the lnet-router daemon",
    after_help = EXIT_CODES
)]
struct Cli {
    /// The daemon's control socket [default: /run/ulnet/lnet-router.sock as root, else
    /// $XDG_RUNTIME_DIR/ulnet/lnet-router.sock]
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Print JSON instead of YAML
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Ping NIDs (NID,NID... or several arguments)
    Ping {
        #[arg(required = true, value_name = "NID")]
        nids: Vec<String>,
        /// Seconds to wait for each reply (at most 180, Lustre's cap; 0: the default, as in
        /// lnetctl) [default: 180]
        #[arg(short = 't', long, value_name = "SECS")]
        timeout: Option<u64>,
        /// Send from this local NID
        #[arg(short = 's', long, value_name = "NID")]
        source: Option<String>,
    },
    /// Discover peers: ping each NID and show its NIs (ulnet has no Multi-Rail discovery, so
    /// this is a ping under discover's names)
    Discover {
        #[arg(required = true, value_name = "NID")]
        nids: Vec<String>,
        /// Accepted for lnetctl's sake; every discover here is a fresh ping
        #[arg(short, long)]
        force: bool,
    },
    /// The LNet service: configure (the daemon is configured when it runs), unconfigure
    Lnet {
        #[command(subcommand)]
        cmd: LnetCmd,
    },
    /// Debugging views: recovery queues
    Debug {
        #[command(subcommand)]
        cmd: DebugCmd,
    },
    /// Local networks and NIs
    Net {
        #[command(subcommand)]
        cmd: NetCmd,
    },
    /// Peers: credits, queues, state
    Peer {
        #[command(subcommand)]
        cmd: PeerCmd,
    },
    /// LND connections (ours): state, credits, queue depth, races, incarnation, age
    Conn {
        #[command(subcommand)]
        cmd: ShowOnly,
    },
    /// LNet's counters
    Stats {
        #[command(subcommand)]
        cmd: StatsCmd,
    },
    /// Global settings
    Global {
        #[command(subcommand)]
        cmd: GlobalCmd,
    },
    /// Routes to remote networks: add, del, show
    Route {
        #[command(subcommand)]
        cmd: RouteCmd,
    },
    /// Router buffers and forwarding
    Routing {
        #[command(subcommand)]
        cmd: Plain,
    },
    /// Change a setting at run time: routing, router buffers, LNet's global tunables
    #[command(after_help = SET_NOTES)]
    Set {
        #[command(subcommand)]
        cmd: SetCmd,
    },
    /// Write the running configuration as YAML (net, route, peer, routing, buffers, global), in
    /// the layout `lnetctl export` writes; `lnet-router --config` loads it, `import` applies it
    Export {
        /// Only what reconfigures the node: no loopback net, status or statistics
        #[arg(short, long)]
        backup: bool,
        /// Write into FILE instead of standard output
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// Apply a YAML document (an export, lnet.conf) to the running daemon: routes, routing,
    /// buffers and globals change at once, item by item, and its nets' NIs are started or
    /// stopped. Reads standard input without FILE (or with -)
    #[command(group(clap::ArgGroup::new("mode").args(["add", "del", "show", "exec"])))]
    Import {
        /// Configure what the document names (the default)
        #[arg(short, long)]
        add: bool,
        /// Remove what the document names (its routes)
        #[arg(short, long)]
        del: bool,
        /// Change nothing: say what --add would do
        #[arg(short, long)]
        show: bool,
        /// Run the document's ping and discover sections (silent when every NID answers); its
        /// other sections are applied as by --add
        #[arg(short, long)]
        exec: bool,
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// Record every o2iblnd message the daemon's NIs send and receive into a pcap file that
    /// Wireshark/tshark's LNet dissector decodes. Runs until Ctrl-C (or --duration), then prints
    /// how many messages were captured and dropped.
    Capture {
        /// The pcap file to write (`-`: standard output, e.g. `| tshark -r -`). An existing
        /// file is not overwritten without --force.
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
        /// Stop after this many seconds [default: until Ctrl-C]
        #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
        duration: Option<u64>,
        /// Overwrite FILE if it exists
        #[arg(long)]
        force: bool,
    },
    /// lnet_selftest: lst's commands (sessions, groups, batches, ping and brw tests, stat),
    /// run by the daemon's console, and `run-test` for a whole session in one command (every
    /// node's daemon needs `selftest: enable: 1` in its config)
    Selftest {
        #[command(subcommand)]
        cmd: selftest::SelftestCmd,
    },
    /// Print lnetctl's manual page (roff, section 8) on standard output
    #[command(hide = true)]
    Man,
    /// Print a completion script for SHELL on standard output
    #[command(hide = true)]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Encode, decode and print an LNet ping exchange between two NIDs as o2iblnd carries it
    Demo {
        #[arg(default_value = "10.0.0.1@o2ib")]
        src: String,
        #[arg(default_value = "10.0.0.2@o2ib")]
        dst: String,
    },
}

#[derive(Subcommand, Debug)]
enum ShowOnly {
    /// Show
    Show {
        /// Verbose: statistics and tunables
        #[arg(short, long)]
        verbose: bool,
    },
}

#[derive(Subcommand, Debug)]
enum LnetCmd {
    /// Succeeds when the daemon runs: LNet is up with the NIs of its configuration (none
    /// for a daemon started with --no-nis: `import` or `net add` give it its NIs)
    Configure {
        /// Bring back what the daemon's configuration file names (as loaded at start) and no
        /// longer runs: its NIs, then its routes (after `lnet unconfigure`, say)
        #[arg(short, long)]
        all: bool,
        /// Accepted for lnetctl's sake (large NIDs: ulnet's are IPv4)
        #[arg(short, long)]
        large: bool,
    },
    /// Removes every NI, each closing its connections gracefully; the daemon keeps running
    /// with none (to stop it: systemctl stop lnet-router)
    Unconfigure,
}

#[derive(Subcommand, Debug)]
enum DebugCmd {
    /// The NIDs in LNet health's recovery queue: our NIs below the maximum health (--local),
    /// or peer NIs getting recovery pings (--peer); nothing for an empty queue, as lnetctl
    Recovery {
        #[arg(short, long)]
        local: bool,
        #[arg(short, long)]
        peer: bool,
    },
}

#[derive(Subcommand, Debug)]
enum NetCmd {
    /// Add an NI to the running daemon: --net and --if (its address is the interface's), or
    /// --nid; it listens at once, with the daemon's routes, routing and globals
    Add {
        /// The net (e.g. o2ib1)
        #[arg(short, long, value_name = "NET")]
        net: Option<String>,
        /// The interface whose IPv4 address the NI takes (one; ulnet has no Multi-Rail)
        #[arg(short, long, value_name = "IF")]
        r#if: Option<String>,
        /// The NI's NID (instead of --net and --if)
        #[arg(long, value_name = "NID")]
        nid: Option<String>,
        /// Seconds without traffic before a peer is judged dead
        #[arg(short = 't', long, value_name = "SECS")]
        peer_timeout: Option<u32>,
        /// Credits per peer
        #[arg(short = 'c', long, value_name = "N")]
        peer_credits: Option<u32>,
        /// Router buffer credits per peer
        #[arg(short = 'b', long, value_name = "N")]
        peer_buffer_credits: Option<u32>,
        /// The NI's send credits
        #[arg(short = 'r', long, value_name = "N")]
        credits: Option<u32>,
        /// Accepted and ignored (one NI is one loop, on its own thread)
        #[arg(short = 's', long, value_name = "EXPR")]
        cpt: Option<String>,
        /// Connections the NI opens to each peer (o2iblnd's conns_per_peer, 1-127; 0 or unset:
        /// 1). Each has its own peer credits: a router towards a busy server takes more
        #[arg(short = 'm', long, value_name = "N")]
        conns_per_peer: Option<u32>,
        /// Accepted and ignored (no Multi-Rail routes to set up)
        #[arg(short = 'k', long)]
        skip_mr_route_setup: bool,
        /// Refused: ip2nets is not supported; give --net and --if, or --nid
        #[arg(short = 'p', long, value_name = "SPEC")]
        ip2net: Option<String>,
        /// ulnet's own: the fabric (tcp or verbs; default: verbs if the address is on an RDMA
        /// device and the daemon has verbs, else tcp)
        #[arg(long, value_name = "FABRIC")]
        fabric: Option<String>,
        /// ulnet's own: where the NI listens (default: its NID's address, port 987)
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<String>,
    },
    /// Remove NIs from the running daemon: every NI of --net, or the one --nid; each closes
    /// its connections gracefully first
    Del {
        /// The net whose NIs go
        #[arg(short, long, value_name = "NET")]
        net: Option<String>,
        /// Refused: ulnet keeps no interface names; give --nid
        #[arg(short, long, value_name = "IF")]
        r#if: Option<String>,
        /// The one NI that goes
        #[arg(long, value_name = "NID")]
        nid: Option<String>,
    },
    /// Show
    Show {
        /// Only this net (e.g. o2ib1)
        #[arg(short, long, value_name = "NET")]
        net: Option<String>,
        /// Verbose: statistics and tunables (levels 1-4, as lnetctl's); 5 adds ulnet's own:
        /// the LND's counters, the fabric's, and ulnet's NI settings
        #[arg(short, long, value_name = "LEVEL", num_args = 0..=1, default_missing_value = "1")]
        verbose: Option<u8>,
    },
}

#[derive(Subcommand, Debug)]
enum PeerCmd {
    /// Refused: ulnet has no Multi-Rail; a peer with one NI is created when first used
    Add {
        #[arg(long = "prim_nid", value_name = "NID")]
        prim_nid: Option<String>,
        #[arg(long, value_name = "NID")]
        nid: Option<String>,
        #[arg(long = "non_mr")]
        non_mr: bool,
    },
    /// Refused: ulnet has no Multi-Rail; peers age out after peer_timeout without traffic
    Del {
        #[arg(long = "prim_nid", value_name = "NID")]
        prim_nid: Option<String>,
        #[arg(long, value_name = "NID")]
        nid: Option<String>,
    },
    /// Show peers
    Show {
        /// Only this peer
        #[arg(short, long, value_name = "NID")]
        nid: Option<String>,
        /// Verbose: credits and statistics; level 2 adds `health stats`
        #[arg(short, long, value_name = "LEVEL", num_args = 0..=1, default_missing_value = "1")]
        verbose: Option<u8>,
    },
}

#[derive(Subcommand, Debug)]
enum RouteCmd {
    /// Add a route
    Add {
        /// The remote net, e.g. o2ib1
        #[arg(short, long, value_name = "NET")]
        net: String,
        /// The gateway: a router's NID on one of our nets
        #[arg(short, long, value_name = "NID")]
        gateway: String,
        /// Hops to the remote net (1-255; -1: undefined)
        #[arg(
            short = 'c',
            long,
            alias = "hop-count",
            value_name = "N",
            allow_hyphen_values = true
        )]
        hop: Option<i64>,
        /// Priority (0 is the most preferred; -1: the default, 0)
        #[arg(short, long, value_name = "N", allow_hyphen_values = true)]
        priority: Option<i64>,
        /// Accepted for lnetctl's sake and ignored: a gateway's health follows the global
        /// health_sensitivity (`lnetctl set health_sensitivity`)
        #[arg(
            long = "health_sensitivity",
            value_name = "N",
            allow_hyphen_values = true
        )]
        health_sensitivity: Option<i64>,
    },
    /// Delete routes to a net (through one gateway, or all)
    Del {
        #[arg(short, long, value_name = "NET")]
        net: String,
        #[arg(short, long, value_name = "NID")]
        gateway: Option<String>,
    },
    /// Show routes
    Show {
        /// Only routes to this net
        #[arg(short, long, value_name = "NET")]
        net: Option<String>,
        /// Only routes through this gateway
        #[arg(short, long, value_name = "NID")]
        gateway: Option<String>,
        /// Only routes of this hop count (-1: undefined, as lnetctl: no filter)
        #[arg(
            short = 'c',
            long,
            alias = "hop-count",
            value_name = "N",
            allow_hyphen_values = true
        )]
        hop: Option<i64>,
        /// Only routes of this priority (-1: no filter, as lnetctl)
        #[arg(short, long, value_name = "N", allow_hyphen_values = true)]
        priority: Option<i64>,
        /// Verbose: hop, priority, state, type
        #[arg(short, long)]
        verbose: bool,
    },
}

#[derive(Subcommand, Debug)]
enum SetCmd {
    /// Forward messages for other nodes: 1 on, 0 off
    Routing {
        #[arg(value_parser = clap::value_parser!(u32).range(0..=1))]
        value: u32,
    },
    /// Router buffers for messages without payload (the node's total)
    #[command(name = "tiny_buffers")]
    TinyBuffers {
        #[arg(value_parser = buffers_range())]
        value: u32,
    },
    /// Router buffers of one page
    #[command(name = "small_buffers")]
    SmallBuffers {
        #[arg(value_parser = buffers_range())]
        value: u32,
    },
    /// Router buffers of LNET_MTU (1 MiB)
    #[command(name = "large_buffers")]
    LargeBuffers {
        #[arg(value_parser = buffers_range())]
        value: u32,
    },
    /// NUMA range for NI selection (0 and up)
    #[command(name = "numa_range")]
    NumaRange(GlobalValue),
    /// Most NIs a ping reply lists (16 and up)
    #[command(name = "max_interfaces")]
    MaxInterfaces(GlobalValue),
    /// Peer discovery: 1 on, 0 off
    #[command(name = "discovery")]
    Discovery(GlobalValue),
    /// Drop messages that arrive through an unexpected router: 1 on, 0 off
    #[command(name = "drop_asym_route")]
    DropAsymRoute(GlobalValue),
    /// Resends of a failed message (0 and up)
    #[command(name = "retry_count")]
    RetryCount(GlobalValue),
    /// Seconds a message and its resends may take (1 and up)
    #[command(name = "transaction_timeout")]
    TransactionTimeout(GlobalValue),
    /// Health value lost per failure (0-1000; 0 turns health off)
    #[command(name = "health_sensitivity")]
    HealthSensitivity(GlobalValue),
    /// Seconds between recovery pings of unhealthy NIs (1 and up)
    #[command(name = "recovery_interval")]
    RecoveryInterval(GlobalValue),
    /// Percent of health a route's gateway needs to be used (0-100)
    #[command(name = "router_sensitivity")]
    RouterSensitivity(GlobalValue),
    /// 0 none, 1 REPLY, 2 ACK, 3 both
    #[command(name = "response_tracking")]
    ResponseTracking(GlobalValue),
    /// Seconds to keep pinging an unhealthy NI (0: forever)
    #[command(name = "recovery_limit")]
    RecoveryLimit(GlobalValue),
    /// Most seconds between recovery pings (1 and up)
    #[command(name = "max_recovery_ping_interval")]
    MaxRecoveryPingInterval(GlobalValue),
}

/// A router buffer count: the configuration's range (`router::BUFFERS_RANGE`), which the
/// daemon checks too, so `set` takes nothing an export could not give back.
fn buffers_range() -> clap::builder::RangedI64ValueParser<u32> {
    let r = router::BUFFERS_RANGE;
    clap::value_parser!(u32).range(i64::from(*r.start())..=i64::from(*r.end()))
}

/// The value of a global tunable; the daemon checks it against Lustre's range.
#[derive(clap::Args, Debug)]
struct GlobalValue {
    #[arg(allow_hyphen_values = true)]
    value: i64,
}

impl SetCmd {
    /// The request that makes the change.
    fn request(&self) -> Request {
        let buffers = |pool: &str, count: u32| Request::SetBuffers {
            pool: pool.into(),
            count,
        };
        let (name, v) = match self {
            SetCmd::Routing { value } => {
                return Request::SetRouting {
                    enable: *value == 1,
                }
            }
            SetCmd::TinyBuffers { value } => return buffers("tiny", *value),
            SetCmd::SmallBuffers { value } => return buffers("small", *value),
            SetCmd::LargeBuffers { value } => return buffers("large", *value),
            SetCmd::NumaRange(v) => ("numa_range", v),
            SetCmd::MaxInterfaces(v) => ("max_interfaces", v),
            SetCmd::Discovery(v) => ("discovery", v),
            SetCmd::DropAsymRoute(v) => ("drop_asym_route", v),
            SetCmd::RetryCount(v) => ("retry_count", v),
            SetCmd::TransactionTimeout(v) => ("transaction_timeout", v),
            SetCmd::HealthSensitivity(v) => ("health_sensitivity", v),
            SetCmd::RecoveryInterval(v) => ("recovery_interval", v),
            SetCmd::RouterSensitivity(v) => ("router_sensitivity", v),
            SetCmd::ResponseTracking(v) => ("response_tracking", v),
            SetCmd::RecoveryLimit(v) => ("recovery_limit", v),
            SetCmd::MaxRecoveryPingInterval(v) => ("max_recovery_ping_interval", v),
        };
        Request::SetGlobals {
            values: vec![(name.to_string(), v.value)],
        }
    }
}

/// What each global does in ulnet (`router::globals::TUNABLES`; a test checks the two agree).
const SET_NOTES: &str = "\
In ulnet:
  routing, *_buffers           take effect at once, without dropping connections
  health_sensitivity           LNet health: what a failure costs an NI or a gateway's (a router's: any) peer NI, and a success gives back; 0 turns it off
  recovery_limit               seconds a peer NI in recovery gets recovery pings (0: for ever)
  max_recovery_ping_interval   the longest gap between two recovery pings of a peer NI
  transaction_timeout          the recovery pings' timeout; LND timeouts stay as each NI's config sets them
  retry_count                  resends a local failure (a message still queued on a connection that timed out) on a node with two NIs or more; never a remote one (Lustre resends those only to Multi-Rail peers)
  recovery_interval            accepted and ignored, as in Lustre (deprecated there)
  router_sensitivity           kept and shown; no effect (deprecated in Lustre too)
  response_tracking            kept and shown; no effect: ulnet tracks no ACK or REPLY deadlines beyond its pings
  max_interfaces               kept and shown; a ping reply lists the node's NIs (at most 200)
  numa_range                   kept and shown; no effect: ulnet runs each NI on its own thread, not by NUMA
  discovery                    kept and shown; no effect yet: ulnet has no peer discovery (no Multi-Rail)
  drop_asym_route              kept and shown; no effect yet: routed messages are not checked for asymmetry
As in Lustre: max_interfaces under 16 means 4096; discovery and drop_asym_route take any
non-zero value as 1; retry_count stays below transaction_timeout and is 0 while
health_sensitivity is 0 (setting health_sensitivity 0 sets it to 0).
Values outside Lustre's range are refused (exit status 1) and change nothing.";

#[derive(Subcommand, Debug)]
enum StatsCmd {
    /// Show (-v: also ulnet's own counters: loopback, the peer table, the control socket)
    Show {
        #[arg(short, long, value_name = "LEVEL", num_args = 0..=1, default_missing_value = "1")]
        verbose: Option<u8>,
    },
    /// Reset LNet's counters to zero
    Reset,
}

#[derive(Subcommand, Debug)]
enum GlobalCmd {
    /// Show (-v: also ulnet's own: routing and the LNet PID, the process id LNet messages
    /// carry, 12345 as kernel Lustre's; not the daemon's process id)
    Show {
        #[arg(short, long, value_name = "LEVEL", num_args = 0..=1, default_missing_value = "1")]
        verbose: Option<u8>,
    },
}

#[derive(Subcommand, Debug)]
enum Plain {
    /// Show
    Show,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    ExitCode::from(run(cli))
}

/// Writes `text` to standard output. A reader that went away (`lnetctl peer show | head`) is
/// not an error worth a panic: the rest is dropped, as the shell tools do.
fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("lnetctl: writing the output: {e}");
        }
    }
}

/// Writes `text` to standard error: lnetctl's YAML error blocks go there, as Lustre 2.16's
/// lnetctl writes them (lnetctl.c, yaml_lnet_print_error emits on stderr), so that a script
/// reading standard output never takes a failure for output.
fn emit_err(text: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// A ping's (or discover's, `what`) answer: the NIDs that answered on standard output, the
/// `manage:` block of those that did not on standard error.
fn emit_ping(p: &control::PingShow, what: &str, json: bool) {
    let text = |p: &control::PingShow| {
        let doc = render::ping_as(p, what);
        if json {
            tree::to_json(&doc)
        } else {
            tree::to_yaml_as(&doc, tree::PING)
        }
    };
    if !p.ping.is_empty() {
        emit(&text(&control::PingShow {
            ping: p.ping.clone(),
            manage: Vec::new(),
        }));
    }
    if !p.manage.is_empty() {
        emit_err(&text(&control::PingShow {
            ping: Vec::new(),
            manage: p.manage.clone(),
        }));
    }
}

/// A failed call to the daemon, said on stderr, as the exit status it means.
fn client_failed(e: &ClientError) -> u8 {
    eprintln!("lnetctl: {}", cut_quotes(&e.to_string()));
    match e {
        ClientError::NoDaemon { .. } => exit::NO_DAEMON,
        _ => exit::FAILED,
    }
}

/// NIDs given as `A,B` or as several arguments.
fn split_nids(args: &[String]) -> Vec<String> {
    args.iter()
        .flat_map(|a| a.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// LNet's process id of kernel Lustre, the only one ulnet's pings go to.
const LNET_PID_LUSTRE: u32 = lnd::wire::lnet::LNET_PID_LUSTRE;
/// LNET_PID_ANY: "whichever", which LNet's ping turns into LNET_PID_LUSTRE.
const LNET_PID_ANY: u32 = u32::MAX;

/// A ping target as LNet's `libcfs_strid` takes it: `NID` or `PID-NID`. ulnet's pings go to
/// PID 12345 (LNET_PID_LUSTRE), as LNet's do for a NID given alone; so a PID of 12345 (or
/// LNET_PID_ANY) is taken and dropped, and another is refused rather than silently pinged at
/// 12345. Returns the NID's text.
fn ping_target(s: &str) -> Result<String, u8> {
    let s = s.trim();
    let Some((pid, nid)) = s
        .split_once('-')
        .filter(|(p, _)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    else {
        check_nid(s)?;
        return Ok(s.to_string());
    };
    check_nid(nid)?;
    match pid.parse::<u32>() {
        Ok(LNET_PID_LUSTRE | LNET_PID_ANY) => Ok(nid.to_string()),
        _ => {
            eprintln!(
                "lnetctl: {}: ulnet pings LNet's PID {LNET_PID_LUSTRE} only (give the NID alone, \
                 or {LNET_PID_LUSTRE}-NID)",
                arg_excerpt(s)
            );
            Err(exit::FAILED)
        }
    }
}

/// Parses a NID given on the command line, or says why not.
fn check_nid(s: &str) -> Result<Nid, u8> {
    s.trim().parse::<Nid>().map_err(|e| {
        eprintln!("lnetctl: {}", cut_quotes(&e.to_string()));
        exit::BAD_NID
    })
}

/// An argument as an error message quotes it: cut at `router::text::EXCERPT_CHARS`
/// characters, as the daemon's configuration errors are.
fn arg_excerpt(s: &str) -> std::borrow::Cow<'_, str> {
    router::text::excerpt(s, router::text::EXCERPT_CHARS)
}

/// `msg` with every quoted ('...') part longer than an excerpt cut to one: a 100 kB NID on
/// the command line made a 200 kB error line (it is quoted whole, twice).
fn cut_quotes(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len().min(4096));
    let mut rest = msg;
    while let Some(open) = rest.find('\'') {
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        // The closing quote: the first one followed by a space, a colon, a comma, a bracket
        // or the end, so that a quote inside the argument does not end it early.
        let close = ["' ", "':", "',", "')"]
            .iter()
            .filter_map(|p| rest.find(p))
            .min()
            .or_else(|| rest.ends_with('\'').then(|| rest.len() - 1))
            .unwrap_or(rest.len());
        out.push_str(&arg_excerpt(&rest[..close]));
        rest = &rest[close..];
        if let Some(r) = rest.strip_prefix('\'') {
            out.push('\'');
            rest = r;
        }
    }
    out.push_str(rest);
    out
}

fn run(cli: Cli) -> u8 {
    // `net show --net N`: the daemon's answer, cut to that net here.
    let mut net_filter: Option<String> = None;
    // `-v LEVEL`: ulnet's own keys from render::ULNET_LEVEL up (net show), at any -v (stats,
    // global show).
    let mut level = 0u8;
    // `route show --hop/--priority`: the daemon's verbose answer, cut here.
    let mut route_filter = RouteFilter::default();
    let req = match cli.cmd {
        Cmd::Capture {
            file,
            duration,
            force,
        } => {
            let path = cli.socket.unwrap_or_else(default_socket_path);
            return capture::run(&path, &file, duration, force, cli.json);
        }
        Cmd::Selftest { cmd } => {
            let path = cli.socket.unwrap_or_else(default_socket_path);
            return selftest::run(&path, cli.json, cmd);
        }
        Cmd::Discover { nids, force: _ } => {
            let nids = match split_nids(&nids)
                .iter()
                .map(|n| ping_target(n))
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(n) => n,
                Err(c) => return c,
            };
            let path = cli.socket.unwrap_or_else(default_socket_path);
            let req = Request::Ping {
                nids,
                timeout_secs: None,
                source: None,
            };
            let resp = match ControlClient::connect(&path).and_then(|mut c| c.call(&req)) {
                Ok(r) => r,
                Err(e) => return client_failed(&e),
            };
            return match resp {
                Response::Ping(p) => {
                    emit_ping(&p, "discover", cli.json);
                    if p.manage.is_empty() {
                        exit::OK
                    } else {
                        exit::FAILED
                    }
                }
                Response::Error(e) => {
                    eprintln!("lnetctl: discover: {}", cut_quotes(&e.to_string()));
                    exit::FAILED
                }
                other => {
                    eprintln!("lnetctl: discover: unexpected answer: {other:?}");
                    exit::FAILED
                }
            };
        }
        Cmd::Lnet { cmd } => {
            let path = cli.socket.unwrap_or_else(default_socket_path);
            return match cmd {
                LnetCmd::Configure { all, large: _ } => {
                    match ControlClient::connect(&path)
                        .and_then(|mut c| c.call(&Request::LnetConfigure { all }))
                    {
                        Ok(Response::Done) => exit::OK,
                        // -a: what the daemon's file names came back; what could not, said
                        // on stderr, one line each.
                        Ok(Response::Import(r)) => {
                            for f in &r.failed {
                                eprintln!(
                                    "lnetctl: lnet configure: {}: {} (errno {})",
                                    f.section,
                                    cut_quotes(&f.descr),
                                    f.errno
                                );
                            }
                            if r.failed.is_empty() {
                                exit::OK
                            } else {
                                exit::FAILED
                            }
                        }
                        Ok(Response::Error(e)) => {
                            eprintln!("lnetctl: lnet configure: {}", cut_quotes(&e.to_string()));
                            exit::FAILED
                        }
                        Ok(other) => {
                            eprintln!("lnetctl: lnet configure: the daemon answered {other:?}");
                            exit::FAILED
                        }
                        Err(e @ ClientError::NoDaemon { .. }) => {
                            eprintln!("lnetctl: {e} (lnet configure: start the lnet-router service, which configures LNet from its file)");
                            exit::NO_DAEMON
                        }
                        Err(e) => client_failed(&e),
                    }
                }
                LnetCmd::Unconfigure => {
                    // Every net but lo, one `net del` each (LNet with no NI, as after Lustre's
                    // unconfigure; the daemon stays to take them back).
                    let mut c = match ControlClient::connect(&path) {
                        Ok(c) => c,
                        Err(e) => return client_failed(&e),
                    };
                    let nets = match c.call(&Request::NetShow { verbose: false }) {
                        Ok(Response::Net(n)) => n.net,
                        Ok(Response::Error(e)) => {
                            eprintln!("lnetctl: lnet unconfigure: {e}");
                            return exit::FAILED;
                        }
                        Ok(other) => {
                            eprintln!("lnetctl: lnet unconfigure: unexpected answer: {other:?}");
                            return exit::FAILED;
                        }
                        Err(e) => return client_failed(&e),
                    };
                    let mut code = exit::OK;
                    for n in nets.iter().filter(|n| n.net_type != "lo") {
                        let req = Request::NetDel {
                            net: Some(n.net_type.clone()),
                            nid: None,
                        };
                        match c.call(&req) {
                            Ok(Response::Done) => {}
                            Ok(Response::Error(e)) => {
                                eprintln!("lnetctl: lnet unconfigure: {}: {e}", n.net_type);
                                code = exit::FAILED;
                            }
                            Ok(other) => {
                                eprintln!(
                                    "lnetctl: lnet unconfigure: unexpected answer: {other:?}"
                                );
                                code = exit::FAILED;
                            }
                            Err(e) => return client_failed(&e),
                        }
                    }
                    code
                }
            };
        }
        Cmd::Debug {
            cmd: DebugCmd::Recovery { local, peer },
        } => {
            if local == peer {
                eprintln!("lnetctl: debug recovery: give --local or --peer");
                return exit::USAGE;
            }
            Request::DebugRecovery { local }
        }
        Cmd::Net {
            cmd:
                NetCmd::Add {
                    net,
                    r#if,
                    nid,
                    peer_timeout,
                    peer_credits,
                    peer_buffer_credits,
                    credits,
                    cpt: _,
                    conns_per_peer,
                    skip_mr_route_setup: _,
                    ip2net,
                    fabric,
                    listen,
                },
        } => {
            if ip2net.is_some() {
                eprintln!("lnetctl: net add: --ip2net is not supported by ulnet; give --net and --if, or --nid");
                return exit::FAILED;
            }
            let ni = import::NiToAdd {
                net,
                interface: r#if,
                nid,
                tunables: [
                    ("peer_timeout", peer_timeout),
                    ("peer_credits", peer_credits),
                    ("peer_buffer_credits", peer_buffer_credits),
                    ("credits", credits),
                ],
                conns_per_peer,
                fabric,
                listen,
            };
            let yaml = match ni.document() {
                Ok(y) => y,
                Err(e) => {
                    eprintln!("lnetctl: net add: {e}");
                    return exit::USAGE;
                }
            };
            let path = cli.socket.unwrap_or_else(default_socket_path);
            let req = Request::Import {
                yaml,
                op: ImportOp::Add,
                nets: None,
            };
            return match ControlClient::connect(&path).and_then(|mut c| c.call(&req)) {
                Ok(Response::Import(r)) => {
                    for f in &r.failed {
                        // The daemon's reason names the change ("net add NID: ..."): once.
                        let descr = cut_quotes(&f.descr);
                        if descr.starts_with("net add") {
                            eprintln!("lnetctl: {descr}");
                        } else {
                            eprintln!("lnetctl: net add: {descr}");
                        }
                    }
                    if !r.failed.is_empty() {
                        exit::FAILED
                    } else if r.applied == 0 {
                        eprintln!("lnetctl: net add: the NI exists");
                        exit::FAILED
                    } else {
                        exit::OK
                    }
                }
                Ok(Response::Error(e)) => {
                    // The document is ours: what the daemon says of it is about the options
                    // (its `import:LINE:` says nothing to the user).
                    let msg = e.message.strip_prefix("import:").map_or(&*e.message, |m| {
                        m.trim_start_matches(|c: char| c.is_ascii_digit())
                            .trim_start_matches(':')
                    });
                    eprintln!("lnetctl: net add: {}", cut_quotes(msg.trim_start()));
                    exit::FAILED
                }
                Ok(other) => {
                    eprintln!("lnetctl: net add: unexpected answer from the daemon: {other:?}");
                    exit::FAILED
                }
                Err(e) => client_failed(&e),
            };
        }
        Cmd::Net {
            cmd: NetCmd::Del { net, r#if, nid },
        } => {
            if r#if.is_some() {
                eprintln!(
                    "lnetctl: net del: --if: ulnet does not keep the interface names of its NIs; \
                     give --nid (lnetctl net show lists them)"
                );
                return exit::FAILED;
            }
            if net.is_some() && nid.is_some() {
                eprintln!("lnetctl: net del: --net is invalid with --nid option");
                return exit::USAGE;
            }
            if net.is_none() && nid.is_none() {
                eprintln!("lnetctl: net del: missing mandatory parameter: --net or --nid");
                return exit::USAGE;
            }
            if let Some(n) = &nid {
                if let Err(c) = check_nid(n) {
                    return c;
                }
            }
            Request::NetDel { net, nid }
        }
        Cmd::Peer {
            cmd: PeerCmd::Add { .. } | PeerCmd::Del { .. },
        } => {
            eprintln!(
                "lnetctl: peer add/del: ulnet has no Multi-Rail peers; a peer with one NI is \
                 created when first used and forgotten after peer_timeout without traffic"
            );
            return exit::FAILED;
        }
        Cmd::Export { backup, file } => {
            let path = cli.socket.unwrap_or_else(default_socket_path);
            return run_export(&path, cli.json, backup, file.as_deref());
        }
        Cmd::Import {
            add: _,
            del,
            show,
            exec,
            file,
        } => {
            let op = match (del, show) {
                (true, _) => ImportOp::Del,
                (_, true) => ImportOp::Show,
                _ => ImportOp::Add,
            };
            let path = cli.socket.unwrap_or_else(default_socket_path);
            return run_import(&path, cli.json, op, exec, file.as_deref());
        }
        Cmd::Man => {
            let mut out = Vec::new();
            let cmd = <Cli as clap::CommandFactory>::command();
            return match clap_mangen::Man::new(cmd).section("8").render(&mut out) {
                Ok(()) => {
                    emit(&String::from_utf8_lossy(&out));
                    exit::OK
                }
                Err(e) => {
                    eprintln!("lnetctl: man: {e}");
                    exit::FAILED
                }
            };
        }
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut cmd, "lnetctl", &mut out);
            emit(&String::from_utf8_lossy(&out));
            return exit::OK;
        }
        Cmd::Demo { src, dst } => {
            let (src, dst) = match (check_nid(&src), check_nid(&dst)) {
                (Ok(s), Ok(d)) => (s, d),
                (Err(c), _) | (_, Err(c)) => return c,
            };
            return match demo::demo(src, dst) {
                Ok(text) => {
                    emit(&text);
                    exit::OK
                }
                Err(e) => {
                    eprintln!("lnetctl: demo failed: {e}");
                    exit::FAILED
                }
            };
        }
        Cmd::Ping {
            nids,
            timeout,
            source,
        } => {
            let nids = match split_nids(&nids)
                .iter()
                .map(|n| ping_target(n))
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(n) => n,
                Err(c) => return c,
            };
            if nids.is_empty() {
                eprintln!("lnetctl: ping: no NID given");
                return exit::USAGE;
            }
            if let Some(Err(c)) = source.as_deref().map(check_nid) {
                return c;
            }
            Request::Ping {
                nids,
                timeout_secs: timeout,
                source,
            }
        }
        Cmd::Net {
            cmd: NetCmd::Show { net, verbose },
        } => {
            net_filter = net;
            level = verbose.unwrap_or(0);
            Request::NetShow {
                verbose: verbose.is_some(),
            }
        }
        Cmd::Peer {
            cmd: PeerCmd::Show { nid, verbose },
        } => {
            level = verbose.unwrap_or(0);
            if let Some(n) = &nid {
                if let Err(c) = check_nid(n) {
                    return c;
                }
            }
            Request::PeerShow {
                nid,
                verbose: verbose.is_some(),
            }
        }
        Cmd::Conn { .. } => Request::ConnShow,
        Cmd::Stats {
            cmd: StatsCmd::Show { verbose },
        } => {
            level = verbose.unwrap_or(0);
            Request::StatsShow
        }
        Cmd::Stats {
            cmd: StatsCmd::Reset,
        } => Request::StatsReset,
        Cmd::Global {
            cmd: GlobalCmd::Show { verbose },
        } => {
            level = verbose.unwrap_or(0);
            Request::GlobalShow
        }
        Cmd::Route { cmd } => match cmd {
            RouteCmd::Add {
                net,
                gateway,
                hop,
                priority,
                health_sensitivity: _,
            } => {
                if let Err(c) = check_nid(&gateway) {
                    return c;
                }
                // lustre_lnet_config_route: -1 is the default priority, 0; below, refused.
                let priority = match priority {
                    None | Some(-1) => None,
                    Some(p) => match u32::try_from(p) {
                        Ok(p) => Some(p),
                        Err(_) => {
                            eprintln!("lnetctl: invalid priority {p}, must be 0 or greater (-1: the default)");
                            return exit::USAGE;
                        }
                    },
                };
                Request::RouteAdd {
                    net,
                    gateway,
                    hop,
                    priority,
                }
            }
            RouteCmd::Del { net, gateway } => {
                if let Some(Err(c)) = gateway.as_deref().map(check_nid) {
                    return c;
                }
                Request::RouteDel { net, gateway }
            }
            RouteCmd::Show {
                net,
                gateway,
                hop,
                priority,
                verbose,
            } => {
                // As lnetctl: -1 filters nothing. The daemon filters by net and gateway; hop
                // and priority are filtered here, from the verbose answer.
                route_filter = RouteFilter {
                    hop: hop.filter(|&h| h != -1),
                    priority: priority.filter(|&p| p != -1),
                    verbose,
                };
                Request::RouteShow {
                    net,
                    gateway,
                    verbose: verbose || route_filter.active(),
                }
            }
        },
        Cmd::Routing { .. } => Request::RoutingShow,
        Cmd::Set { cmd } => cmd.request(),
    };
    let path = cli.socket.unwrap_or_else(default_socket_path);
    let mut no_daemon = false;
    let resp = match ControlClient::connect(&path).and_then(|mut c| c.call(&req)) {
        Ok(Response::Net(mut n)) => {
            if let Some(want) = &net_filter {
                n.net.retain(|e| &e.net_type == want);
                if n.net.is_empty() {
                    eprintln!("lnetctl: net show: no net {want} here");
                    return exit::FAILED;
                }
            }
            Response::Net(n)
        }
        Ok(Response::Route(r)) => Response::Route(route_filter.apply(r)),
        Ok(r) => r,
        Err(ClientError::NoDaemon { .. }) if matches!(req, Request::Ping { .. }) => {
            no_daemon = true;
            ping_without_daemon(req, &path)
        }
        Err(e) => return client_failed(&e),
    };
    if let Response::Ping(p) = &resp {
        emit_ping(p, "ping", cli.json);
        // Without a daemon only 0@lo answers: a NID that did not is the "no daemon" of every
        // other command.
        return if p.manage.is_empty() {
            exit::OK
        } else if no_daemon {
            exit::NO_DAEMON
        } else {
            exit::FAILED
        };
    }
    let out = if cli.json {
        render::json_at(&resp, level)
    } else {
        render::yaml_at(&resp, level)
    };
    match (&resp, out) {
        (Response::Error(e), _) => {
            eprintln!("lnetctl: {}", cut_quotes(&e.to_string()));
            if e.errno == errno::EINVAL && e.message.contains("bad NID") {
                exit::BAD_NID
            } else {
                exit::FAILED
            }
        }
        (_, Some(text)) => {
            emit(&text);
            exit::OK
        }
        (_, None) => exit::FAILED,
    }
}

/// `route show --hop N --priority N`, which the daemon's request does not carry: the routes
/// are asked for verbose (they carry their hop and priority only then), kept when they match,
/// and shown as asked.
#[derive(Debug, Default)]
struct RouteFilter {
    hop: Option<i64>,
    priority: Option<i64>,
    verbose: bool,
}

impl RouteFilter {
    fn active(&self) -> bool {
        self.hop.is_some() || self.priority.is_some()
    }

    fn apply(&self, mut r: control::RouteShow) -> control::RouteShow {
        if !self.active() {
            return r;
        }
        r.route.retain(|e| {
            self.hop.is_none_or(|h| e.hop == Some(h))
                && self
                    .priority
                    .is_none_or(|p| e.priority.map(i64::from) == Some(p))
        });
        if !self.verbose {
            for e in &mut r.route {
                *e = control::RouteEntry {
                    net: std::mem::take(&mut e.net),
                    gateway: std::mem::take(&mut e.gateway),
                    hop: None,
                    priority: None,
                    health_sensitivity: None,
                    state: None,
                    kind: None,
                };
            }
        }
        r
    }
}

/// `lnetctl export`: the shows an export is made of, on one connection, as one document.
fn run_export(
    path: &std::path::Path,
    json: bool,
    backup: bool,
    file: Option<&std::path::Path>,
) -> u8 {
    let answers = ControlClient::connect(path).and_then(|mut c| {
        export::requests()
            .iter()
            .map(|r| c.call(r))
            .collect::<Result<Vec<_>, _>>()
    });
    let running = match answers.map(export::Running::from_answers) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            eprintln!("lnetctl: export: {e}");
            return exit::FAILED;
        }
        Err(e) => return client_failed(&e),
    };
    let doc = export::export(&running, backup);
    let text = if json {
        export::to_json_text(&doc)
    } else {
        export::to_text(&doc)
    };
    match file.filter(|f| f.as_os_str() != "-") {
        None => {
            emit(&text);
            exit::OK
        }
        Some(f) => match std::fs::write(f, text) {
            Ok(()) => exit::OK,
            Err(e) => {
                eprintln!("lnetctl: export: cannot write {}: {e}", f.display());
                exit::FAILED
            }
        },
    }
}

/// `lnetctl import`: the document goes to the daemon, which checks it as a configuration and
/// applies it item by item; what failed is said on stderr, one line each. A big document goes
/// in parts as it is read ([`import::split_document`]); `--exec` documents are small and read
/// whole.
fn run_import(
    path: &std::path::Path,
    json: bool,
    op: ImportOp,
    exec: bool,
    file: Option<&std::path::Path>,
) -> u8 {
    if !exec {
        return import_in_parts(path, json, op, file);
    }
    let text = match file.filter(|f| f.as_os_str() != "-") {
        Some(f) => router::text::read_config_file(f)
            .map_err(|e| format!("cannot read {}: {e}", f.display())),
        None => router::text::read_config(std::io::stdin().lock())
            .map_err(|e| format!("cannot read standard input: {e}")),
    };
    let origin = file
        .filter(|f| f.as_os_str() != "-")
        .map_or_else(|| "<stdin>".to_string(), |f| f.display().to_string());
    let mut stripped = match text.and_then(|t| import::strip_peers(&t, &origin)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lnetctl: import: {e}");
            return exit::FAILED;
        }
    };
    if exec {
        // The `ping:` and `discover:` sections run (silent when every NID answers, as
        // lnetctl); the rest of the document is applied as by --add.
        let doc = match import::take_exec_sections(&stripped.text) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("lnetctl: import --exec: {origin}: {e}");
                return exit::FAILED;
            }
        };
        let (rest, nids) = (doc.rest, doc.nids);
        for n in &nids {
            if let Err(c) = check_nid(n) {
                return c;
            }
        }
        if !rest.trim().is_empty() {
            stripped.text = rest;
            let code = send_import(path, json, ImportOp::Add, &mut stripped, &origin);
            if code != exit::OK {
                return code;
            }
        }
        if nids.is_empty() {
            return exit::OK;
        }
        let req = Request::Ping {
            nids,
            timeout_secs: doc.timeout,
            source: None,
        };
        return match ControlClient::connect(path).and_then(|mut c| c.call(&req)) {
            Ok(Response::Ping(p)) if p.manage.is_empty() => exit::OK,
            Ok(Response::Ping(p)) => {
                for f in &p.manage {
                    eprintln!(
                        "lnetctl: import --exec: ping {}: {} (errno {})",
                        f.ping, f.descr, f.errno
                    );
                }
                exit::FAILED
            }
            Ok(Response::Error(e)) => {
                eprintln!("lnetctl: import --exec: {e}");
                exit::FAILED
            }
            Ok(other) => {
                eprintln!("lnetctl: import --exec: unexpected answer: {other:?}");
                exit::FAILED
            }
            Err(e) => client_failed(&e),
        };
    }
    send_import(path, json, op, &mut stripped, &origin)
}

/// `lnetctl import` (not `--exec`): the document read a line at a time and sent in parts.
fn import_in_parts(
    path: &std::path::Path,
    json: bool,
    op: ImportOp,
    file: Option<&std::path::Path>,
) -> u8 {
    let file = file.filter(|f| f.as_os_str() != "-");
    let origin = file.map_or_else(|| "<stdin>".to_string(), |f| f.display().to_string());
    let input: Box<dyn std::io::BufRead> = match file {
        Some(f) => match std::fs::File::open(f) {
            Ok(h) => Box::new(std::io::BufReader::new(h)),
            Err(e) => {
                eprintln!("lnetctl: import: cannot read {}: {e}", f.display());
                return exit::FAILED;
            }
        },
        None => Box::new(std::io::stdin().lock()),
    };
    let mut tally = Tally::new(path, op, &origin);
    let del = op == ImportOp::Del;
    match import::split_document(input, &origin, del, |p| tally.send(p)) {
        Ok(peers) => tally.finish(json, peers),
        Err(import::SplitError::Input(e)) => {
            eprintln!("lnetctl: import: {e}");
            tally.stopped();
            exit::FAILED
        }
        Err(import::SplitError::Stopped) => tally.code,
    }
}

/// Sends the document (its `peer:` section taken out) as one import and reports what failed.
fn send_import(
    path: &std::path::Path,
    json: bool,
    op: ImportOp,
    stripped: &mut import::Stripped,
    origin: &str,
) -> u8 {
    let mut tally = Tally::new(path, op, origin);
    let part = import::Part {
        body: import::Stripped {
            text: std::mem::take(&mut stripped.text),
            peers: 0,
            lines: std::mem::take(&mut stripped.lines),
        },
        nets: None,
    };
    match tally.send(part) {
        Ok(()) => tally.finish(json, stripped.peers),
        Err(()) => tally.code,
    }
}

/// An import's parts as the daemon answers them: their reports summed, each failure said on
/// stderr as its answer comes (`--show` prints the sum at the end).
struct Tally<'a> {
    path: &'a std::path::Path,
    origin: &'a str,
    report: ImportReport,
    /// Parts the daemon applied.
    parts: usize,
    /// The exit status when a part stops the import.
    code: u8,
}

impl<'a> Tally<'a> {
    fn new(path: &'a std::path::Path, op: ImportOp, origin: &'a str) -> Tally<'a> {
        Tally {
            path,
            origin,
            report: ImportReport {
                op,
                ..ImportReport::default()
            },
            parts: 0,
            code: exit::FAILED,
        }
    }

    /// Sends one part (the document itself when it is small); `Err` once it has said why the
    /// import stops there.
    fn send(&mut self, part: import::Part) -> Result<(), ()> {
        let op = self.report.op;
        let (origin, mut body) = (self.origin, part.body);
        let first = body.lines.first().copied().unwrap_or(1);
        let req = Request::Import {
            yaml: std::mem::take(&mut body.text),
            op,
            nets: part.nets.filter(|n| op == ImportOp::Show && !n.is_empty()),
        };
        if let Ok(line) = control::encode_request(&req) {
            if line.len() > control::MAX_REQUEST {
                eprintln!(
                    "lnetctl: import: {origin}:{first}: {} KiB to send at once without its \
                     peers (only route: items are sent in parts); the daemon takes at most {} \
                     KiB: split it",
                    line.len() >> 10,
                    control::MAX_REQUEST >> 10
                );
                self.stopped();
                return Err(());
            }
        }
        let r = match ControlClient::connect(self.path).and_then(|mut c| c.call(&req)) {
            Ok(Response::Import(r)) => r,
            Ok(Response::Error(e)) => {
                eprintln!("lnetctl: import: {}", body.locate(&e.message, origin));
                self.stopped();
                return Err(());
            }
            Ok(other) => {
                eprintln!("lnetctl: import: unexpected answer from the daemon: {other:?}");
                self.stopped();
                return Err(());
            }
            Err(e) => {
                self.code = client_failed(&e);
                self.stopped();
                return Err(());
            }
        };
        self.parts += 1;
        self.report.applied += r.applied;
        self.report.unchanged += r.unchanged;
        for mut f in r.failed {
            // The part's line, as the user's document numbers it.
            f.line = f
                .line
                .map(|n| body.lines.get(n as usize - 1).map_or(n, |&l| l as u64));
            if op != ImportOp::Show {
                match f.line {
                    Some(l) => eprintln!(
                        "lnetctl: import: {origin}:{l}: {}: {} (errno {})",
                        f.section, f.descr, f.errno
                    ),
                    None => eprintln!(
                        "lnetctl: import: {}: {} (errno {})",
                        f.section, f.descr, f.errno
                    ),
                }
            }
            self.report.failed.push(f);
        }
        Ok(())
    }

    /// Says what the parts before a stop did, when there were any: a document sent in parts
    /// is applied up to where it stopped.
    fn stopped(&self) {
        if self.parts > 0 {
            eprintln!(
                "lnetctl: import: stopped after {} part(s) of {}: {} applied, {} already so, {} \
                 failed before it",
                self.parts,
                self.origin,
                self.report.applied,
                self.report.unchanged,
                self.report.failed.len()
            );
        }
    }

    /// The import's end: `--show`'s report, or the count of what failed; the exit status.
    fn finish(mut self, json: bool, peers: u32) -> u8 {
        self.report.unchanged += peers;
        let report = self.report;
        let failed = !report.failed.is_empty();
        if report.op == ImportOp::Show {
            let resp = Response::Import(report);
            let out = if json {
                render::json(&resp)
            } else {
                render::yaml(&resp)
            };
            emit(&out.unwrap_or_default());
        } else if failed {
            eprintln!(
                "lnetctl: import: {} applied, {} already so, {} failed",
                report.applied,
                report.unchanged,
                report.failed.len()
            );
        }
        if failed {
            exit::FAILED
        } else {
            exit::OK
        }
    }
}

/// `ping` with no daemon: an in-process LNet with no NIs, so only `0@lo` answers; every other
/// NID fails with a message saying why.
fn ping_without_daemon(req: Request, path: &std::path::Path) -> Response {
    let t0 = std::time::Instant::now();
    let clock = move || lnd::time::Instant::from_nanos(t0.elapsed().as_nanos() as u64 + 1);
    let mut node = LnetNode::new(NodeConfig::new(Vec::new()), clock());
    let mut resp = control::call_local(&mut node, req, clock);
    if let Response::Ping(p) = &mut resp {
        for f in &mut p.manage {
            f.descr = format!(
                "{} (no lnet-router daemon at {}; without one only 0@lo is reachable)",
                f.descr,
                path.display()
            );
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn set_help_says_what_each_global_does_here() {
        for t in router::globals::TUNABLES {
            assert!(SET_NOTES.contains(t.name), "{} not in the notes", t.name);
            assert!(SET_NOTES.contains(t.effect), "{}: {}", t.name, t.effect);
            let cmd = Cli::try_parse_from(["lnetctl", "set", t.name, "7"]).unwrap();
            match cmd.cmd {
                Cmd::Set { cmd } => assert_eq!(
                    cmd.request(),
                    Request::SetGlobals {
                        values: vec![(t.name.into(), 7)]
                    }
                ),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn exit_codes_are_documented() {
        for code in [
            exit::OK,
            exit::FAILED,
            exit::USAGE,
            exit::NO_DAEMON,
            exit::BAD_NID,
        ] {
            assert!(EXIT_CODES.contains(&format!("  {code}  ")));
        }
    }
}
