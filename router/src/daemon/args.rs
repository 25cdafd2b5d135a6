//! `lnet-router`'s command line ([`Args`], by clap): the configuration, the control socket and
//! its client timeouts, the log format, how NIs map to threads.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

#[derive(Copy, Clone, Debug, ValueEnum)]
pub(super) enum LogFormat {
    Text,
    Json,
}

/// `--version`: the crate's version, the git revision it was built from and the features
/// built in.
pub(super) const VERSION: &str = concat!(
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
pub(super) const MAX_CONTROL_TIMEOUT: u64 = 365 * 24 * 3600;

#[derive(Parser, Debug)]
#[command(
    name = "lnet-router",
    version = VERSION,
    about = "ulnet's LNet daemon: NIs on the tcp or verbs fabric, lnetctl's control socket",
    after_help = "Logging: LNET_LOG sets the filter (tracing EnvFilter syntax, default \"info\").\n\
                  Exit status: 0 clean shutdown, 1 runtime failure, 2 bad command line or configuration."
)]
pub struct Args {
    /// The YAML configuration (lnetctl export's shape plus fabric, listen and peers)
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/etc/ulnet/lnet-router.yaml"
    )]
    pub(super) config: PathBuf,
    /// The control socket [default: /run/ulnet/lnet-router.sock as root, else
    /// $XDG_RUNTIME_DIR/ulnet/lnet-router.sock]. At most 107 bytes (a Unix socket path); its
    /// directory is created (0700) if its parent exists
    #[arg(long, value_name = "PATH")]
    pub(super) socket: Option<PathBuf>,
    /// Log format on stderr
    #[arg(long, value_enum, default_value = "text")]
    pub(super) log_format: LogFormat,
    /// Close a control client that sends nothing for this many seconds between requests
    /// (a client waiting for an answer or receiving a capture is not idle)
    #[arg(long, value_name = "SECS", default_value_t = crate::control::DEFAULT_IDLE_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=MAX_CONTROL_TIMEOUT))]
    pub(super) control_idle_timeout: u64,
    /// Close a control client whose request line is not complete this many seconds after its
    /// first byte
    #[arg(long, value_name = "SECS", default_value_t = crate::control::DEFAULT_REQUEST_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=MAX_CONTROL_TIMEOUT))]
    pub(super) control_request_timeout: u64,
    /// How NIs map to threads: a thread per NI, or every NI on one thread (forwarded
    /// messages then never cross threads, which suits a router with fewer cores than NIs
    /// plus clients; tcp NIs only)
    #[arg(long, value_enum, default_value = "per-ni")]
    pub(super) ni_threads: NiThreads,
    /// Start even when the configuration names no NI, or is missing: NIs come later through
    /// lnetctl (`net add`, `import`), as with Lustre's lnet.service (`lnetctl lnet
    /// configure`, then `lnetctl import /etc/lnet.conf`). Needs --ni-threads per-ni
    #[arg(long)]
    pub(super) no_nis: bool,
    /// Serve Prometheus metrics (GET /metrics) on this address and port, e.g.
    /// 127.0.0.1:9170 (overrides `metrics: listen:`; off unless given either way)
    #[arg(long, value_name = "ADDR:PORT")]
    pub(super) metrics_listen: Option<std::net::SocketAddr>,
    /// Print this manual page (roff, section 8) on standard output and exit
    #[arg(long, hide = true)]
    pub print_man: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum NiThreads {
    PerNi,
    Shared,
}
