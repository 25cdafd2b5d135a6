//! The daemon's configuration as the rest of the daemon sees it: nets and their NIs, peers'
//! addresses, routes, and which sections a document gave (for `lnetctl import`).

use std::collections::HashMap;
use std::net::SocketAddr;

use lnd::wire::{Net, Nid};
use serde::Deserialize;

use crate::config::{NiConfig, NodeConfig, RoutingConfig};
use crate::gateway::GatewayHealthConfig;
use crate::routes::RouteConfig;

pub const DEFAULT_BUSY_POLL_US: u32 = 50;

/// Which network carries a net's NIs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FabricKind {
    /// ulnet's o2iblnd over TCP sockets framed as RC queue pairs (`lnd::driver::tcp`): how
    /// ulnet runs `o2ib` nets without RDMA hardware. Only ulnet speaks it.
    Tcp,
    /// Plain TCP sockets for ksocklnd's wire (`lnd::driver::socket`): a `tcp` net's fabric, the
    /// one kernel Lustre's ksocklnd talks to.
    Socket,
    /// The deterministic simulator (tests).
    Sim,
    /// rdma_cm + verbs (`lnd::driver::verbs`, in a daemon built with the `verbs` feature).
    Verbs,
}

impl FabricKind {
    /// `tcp`, `sim` or `verbs`.
    pub fn as_str(self) -> &'static str {
        match self {
            FabricKind::Tcp => "tcp",
            FabricKind::Socket => "socket",
            FabricKind::Sim => "sim",
            FabricKind::Verbs => "verbs",
        }
    }
}

/// One local NI as configured.
#[derive(Clone, Debug)]
pub struct NiSettings {
    /// NID, credits and LND tunables (incarnation 0: [`DaemonConfig::node_config`] sets it).
    pub ni: NiConfig,
    /// Where the fabric listens for this NI (default: the NID's address, o2iblnd's port 987).
    pub listen: Option<SocketAddr>,
    /// `busy poll us` (ours): how long the NI's fabric spins on its completions before it
    /// sleeps, in microseconds (default 50; 0: never spin, for a router without cores of its
    /// own: a little latency for no idle CPU).
    pub busy_poll_us: u32,
    /// `handshake limit` (ours): accepted sockets that may be in their handshake at once on the
    /// NI's tcp fabric; the excess is closed at once and counted (default
    /// `lnd::driver::tcp::DEFAULT_HANDSHAKE_LIMIT`, 4096; 0: no limit).
    pub handshake_limit: u32,
    /// `tunables: peer_timeout` (seconds; shown by `net show -v`, not enforced yet).
    pub peer_timeout: u32,
    /// `tunables: peer_buffer_credits` (router buffer credits per upstream peer; also in
    /// `ni.peer_buffer_credits`).
    pub peer_buffer_credits: u32,
    /// The line of the NI's `nid:` key.
    pub line: u64,
}

/// One `net:` entry.
#[derive(Clone, Debug)]
pub struct NetSettings {
    pub net: Net,
    pub fabric: FabricKind,
    /// The file named the fabric (else tcp was taken).
    pub fabric_given: bool,
    pub nis: Vec<NiSettings>,
}

/// The whole file, checked.
#[derive(Clone, Debug, Default)]
pub struct DaemonConfig {
    pub nets: Vec<NetSettings>,
    /// Where peer NIDs listen on the tcp fabric (ours; the resolver's table).
    pub peers: HashMap<Nid, SocketAddr>,
    /// `route:`, checked against our NIDs, in file order.
    pub routes: Vec<RouteSettings>,
    /// `routing:` and `buffers:`.
    pub routing: RoutingConfig,
    /// `routing:`'s router-checking settings.
    pub gateway_health: GatewayHealthConfig,
    /// `selftest: enable: 1` (ours): the daemon runs lnet_selftest's service and console, as
    /// a Lustre node does once `lnet_selftest` is loaded. Off by default: a node without it
    /// answers no selftest RPC, so no console can make it send test traffic.
    pub selftest: bool,
    /// `global:` (and `numa: range:`): LNet's global tunables.
    pub globals: crate::GlobalTunables,
    /// `acceptor:` (ours; the lnet module's `accept*` parameters): how `tcp` NIs take and
    /// make connections. Already applied to every `tcp` NI's settings.
    pub acceptor: AcceptorSettings,
    /// `metrics:` (ours): the Prometheus endpoint, off unless given (docs/metrics.md).
    pub metrics: Option<MetricsConfig>,
    /// Which sections the document had (what `lnetctl import` applies).
    pub given: GivenSections,
}

/// The sections a document had, beyond its nets and routes: an import applies only these, and
/// leaves the rest of the running daemon as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GivenSections {
    /// `routing: enable:`.
    pub routing: bool,
    /// `buffers:`.
    pub buffers: bool,
    /// `peer:` entries (one NI each: what discovery would find, nothing to apply).
    pub peers: usize,
    /// `global:` keys (and `numa: range:`), settable ones only, in file order.
    pub globals: Vec<(String, i64)>,
    /// `routing:`'s module parameters the document gave, as given (seconds; an import sets
    /// these and leaves the others).
    pub router_checks: RouterChecksGiven,
    /// `selftest: enable:` as given.
    pub selftest: Option<bool>,
    /// `acceptor:`: a document without it leaves the running daemon's acceptor settings to
    /// the `tcp` NIs it adds (a `net add` says nothing of ports).
    pub acceptor: bool,
}

/// The `routing:` module parameters a document gave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouterChecksGiven {
    pub alive_router_check_interval: Option<u32>,
    pub router_ping_timeout: Option<u32>,
    pub avoid_asym_router_failure: Option<bool>,
}

impl RouterChecksGiven {
    /// How many were given.
    pub fn count(&self) -> usize {
        usize::from(self.alive_router_check_interval.is_some())
            + usize::from(self.router_ping_timeout.is_some())
            + usize::from(self.avoid_asym_router_failure.is_some())
    }
}

/// One `route:` entry and its line.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RouteSettings {
    pub route: RouteConfig,
    pub line: u64,
}

impl DaemonConfig {
    /// Every NI, in file order ([`NiIndex`](crate::NiIndex) `i` is the `i`th).
    pub fn nis(&self) -> impl Iterator<Item = (&NetSettings, &NiSettings)> + '_ {
        self.nets
            .iter()
            .flat_map(|n| n.nis.iter().map(move |ni| (n, ni)))
    }

    /// The node's configuration; NI `i` gets incarnation `incarnation + i`.
    pub fn node_config(&self, incarnation: u64) -> NodeConfig {
        let nis = self
            .nis()
            .enumerate()
            .map(|(i, (_, s))| {
                let mut c = s.ni.clone();
                c.incarnation = incarnation.wrapping_add(i as u64);
                c
            })
            .collect();
        // One transaction_timeout for the whole node when the file gives none: from the first
        // NI's LND timeout, so that every NI's runtime holds the same globals.
        let mut globals = self.globals.clone();
        if let Some((_, ni)) = self.nis().next() {
            globals.derive_transaction_timeout(ni.ni.tunables.timeout.as_secs());
        }
        NodeConfig {
            routes: self.routes.iter().map(|r| r.route).collect(),
            routing: self.routing,
            gateway_health: self.gateway_health,
            globals,
            ..NodeConfig::new(nis)
        }
    }

    /// The node split into one configuration per NI, for one runtime (thread) per NI: each
    /// knows every NID of the node (`NodeConfig::node_nids`), NI `i` gets incarnation
    /// `incarnation + i` as in [`DaemonConfig::node_config`], every runtime knows every route,
    /// and each gets an equal share of the router buffers (a runtime is a CPT).
    pub fn ni_node_configs(&self, incarnation: u64) -> Vec<NodeConfig> {
        self.node_config(incarnation).per_ni()
    }
}

/// The LNet acceptor's settings for `tcp` nets (`acceptor:`), the lnet module's `accept`,
/// `accept_port`, `accept_backlog`, `accept_timeout`, and the source ports a dial binds
/// (`acceptor.c:lnet_connect` tries 1023 down to 512).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptorSettings {
    pub accept: lnd::iface::sock::AcceptMode,
    pub port: u16,
    pub backlog: u32,
    pub timeout: lnd::time::Duration,
    /// Tried from the first down to the second; (0, 0): any port the system picks.
    pub source_ports: (u16, u16),
}

impl Default for AcceptorSettings {
    fn default() -> Self {
        let d = lnd::iface::sock::SockConfig::new(lnd::wire::Nid::ANY, 0);
        AcceptorSettings {
            accept: d.accept,
            port: d.accept_port,
            backlog: d.accept_backlog,
            timeout: d.accept_timeout,
            source_ports: (d.ports_from, d.ports_to),
        }
    }
}

/// `metrics:` (ours): where the daemon serves `GET /metrics`, and its bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricsConfig {
    /// The address and port to listen on: only as written (no default address, so never
    /// every interface unless `0.0.0.0` or `[::]` is written).
    pub listen: std::net::SocketAddr,
    /// How many peer NIs get series of their own, the busiest by messages (bounds the
    /// cardinality on a router with thousands of peers).
    pub top_peers: u32,
    /// Scrapes served at once; a connection beyond them is closed at accept and counted.
    pub max_connections: u32,
}

/// `metrics: top_peers:` when not given, and its range.
pub const DEFAULT_METRICS_TOP_PEERS: u32 = 10;
pub const METRICS_TOP_PEERS_MAX: u32 = 1000;
/// `metrics: max_connections:` when not given, and its range.
pub const DEFAULT_METRICS_MAX_CONNECTIONS: u32 = 4;
pub const METRICS_MAX_CONNECTIONS_MAX: u32 = 64;

impl MetricsConfig {
    /// Listening on `listen` with the default bounds (`--metrics-listen` without `metrics:`).
    pub fn on(listen: std::net::SocketAddr) -> MetricsConfig {
        MetricsConfig {
            listen,
            top_peers: DEFAULT_METRICS_TOP_PEERS,
            max_connections: DEFAULT_METRICS_MAX_CONNECTIONS,
        }
    }
}
