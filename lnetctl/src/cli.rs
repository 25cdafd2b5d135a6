//! The command line: every command and option, as clap reads them (the man page and the shell
//! completions are made from it too), and the `man` and `completions` commands.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use router::control::Request;

use crate::{emit, exit, selftest};

pub(crate) const EXIT_CODES: &str = "\
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
pub(crate) struct Cli {
    /// The daemon's control socket [default: /run/ulnet/lnet-router.sock as root, else
    /// $XDG_RUNTIME_DIR/ulnet/lnet-router.sock]
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
    /// Print JSON instead of YAML
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
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
pub(crate) enum ShowOnly {
    /// Show
    Show {
        /// Verbose: statistics and tunables
        #[arg(short, long)]
        verbose: bool,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum LnetCmd {
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
pub(crate) enum DebugCmd {
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
pub(crate) enum NetCmd {
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
        /// ulnet's own: the fabric. A tcp net: socket (ksocklnd's wire, the default). An o2ib
        /// net: tcp or verbs (default: verbs if the address is on an RDMA device and the daemon
        /// has verbs, else tcp)
        #[arg(long, value_name = "FABRIC")]
        fabric: Option<String>,
        /// ulnet's own: where an o2ib NI listens (default: its NID's address, port 987; a tcp NI
        /// listens on its NID's address and the daemon's acceptor port)
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
pub(crate) enum PeerCmd {
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
pub(crate) enum RouteCmd {
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
pub(crate) enum SetCmd {
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
pub(crate) fn buffers_range() -> clap::builder::RangedI64ValueParser<u32> {
    let r = router::BUFFERS_RANGE;
    clap::value_parser!(u32).range(i64::from(*r.start())..=i64::from(*r.end()))
}

/// The value of a global tunable; the daemon checks it against Lustre's range.
#[derive(clap::Args, Debug)]
pub(crate) struct GlobalValue {
    #[arg(allow_hyphen_values = true)]
    pub(crate) value: i64,
}

impl SetCmd {
    /// The request that makes the change.
    pub(crate) fn request(&self) -> Request {
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
pub(crate) const SET_NOTES: &str = "\
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
pub(crate) enum StatsCmd {
    /// Show (-v: also ulnet's own counters: loopback, the peer table, the control socket)
    Show {
        #[arg(short, long, value_name = "LEVEL", num_args = 0..=1, default_missing_value = "1")]
        verbose: Option<u8>,
    },
    /// Reset LNet's counters to zero
    Reset,
}

#[derive(Subcommand, Debug)]
pub(crate) enum GlobalCmd {
    /// Show (-v: also ulnet's own: routing and the LNet PID, the process id LNet messages
    /// carry, 12345 as kernel Lustre's; not the daemon's process id)
    Show {
        #[arg(short, long, value_name = "LEVEL", num_args = 0..=1, default_missing_value = "1")]
        verbose: Option<u8>,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum Plain {
    /// Show
    Show,
}

/// `lnetctl man`: the man page, section 8, from the command line's definition.
pub(crate) fn man() -> u8 {
    let mut out = Vec::new();
    let cmd = <Cli as clap::CommandFactory>::command();
    match clap_mangen::Man::new(cmd).section("8").render(&mut out) {
        Ok(()) => {
            emit(&String::from_utf8_lossy(&out));
            exit::OK
        }
        Err(e) => {
            eprintln!("lnetctl: man: {e}");
            exit::FAILED
        }
    }
}

/// `lnetctl completions SHELL`: the shell's completion script.
pub(crate) fn completions(shell: clap_complete::Shell) -> u8 {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "lnetctl", &mut out);
    emit(&String::from_utf8_lossy(&out));
    exit::OK
}
