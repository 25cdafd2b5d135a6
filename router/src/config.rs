//! Configuration of an [`LnetNode`](crate::LnetNode): its NIs and its PID.

use lnd::iface::o2ib::DEFAULT_PEER_LIMIT;
use lnd::iface::o2ib::{ChecksumConfig, RaceOrder, Tunables};
use lnd::wire::lnet::LNET_PID_LUSTRE;
use lnd::wire::Nid;

use crate::alive::NetAlive;
use crate::gateway::GatewayHealthConfig;
use crate::routes::{RouteConfig, RouteError, RouteTable};

/// LNet's default NI tx credits (`credits`, reference section 9.2).
pub const DEFAULT_CREDITS: u32 = 256;
/// LNet's default per-peer tx credits (`peer_credits`, reference section 9.1).
pub const DEFAULT_PEER_CREDITS: u32 = 8;
/// LNet's default peer_timeout in seconds (reference section 9.1).
pub const DEFAULT_PEER_TIMEOUT: u32 = 180;

/// One network interface: its NID, the LND's tunables, and LNet's credits for it.
#[derive(Clone, Debug)]
pub struct NiConfig {
    /// The NI's NID, e.g. `10.0.0.1@o2ib`.
    pub nid: Nid,
    /// This NI's incarnation (a fresh stamp per start); the driver chooses it, the library never
    /// reads a clock.
    pub incarnation: u64,
    /// The o2ib LND's tunables for this NI.
    pub tunables: Tunables,
    /// NI tx credits: messages this NI may have in its LND at once (`credits`, default 256).
    /// Clamped to at least 1.
    pub credits: u32,
    /// Per-peer tx credits: messages one peer may have in the LND at once (`peer_credits`,
    /// default 8). Clamped to at least 1 and at most `credits`, as o2iblnd clamps it
    /// (kiblnd_tunables_setup). In Lustre this is the same net tunable the LND uses as its queue
    /// depth; `NiConfig::new` keeps `tunables.peer_credits` equal to it.
    pub peer_credits: u32,
    /// Ours: the NID order the LND's race rule uses (`race order`, default Lustre 2.16's hash).
    pub race_order: RaceOrder,
    /// Ours: message checksums (`checksum`, `checksum default`; default off).
    pub checksum: ChecksumConfig,
    /// Ours: most peers the LND keeps at once (`peer limit`); LNet keeps at most as many
    /// peer NIs on this NI.
    pub peer_limit: usize,
    /// `tunables: peer_timeout`: LNet forgets a peer NI that has had no traffic and held no
    /// message for this long (our rule; default 180 s).
    pub peer_timeout: lnd::time::Duration,
    /// `tunables: peer_buffer_credits`: router buffers one upstream peer may hold at once on
    /// a routing node (lpni_rtrcredits); 0 means "as many as peer_credits".
    pub peer_buffer_credits: u32,
    /// Which LND the NI runs, with that LND's own settings: o2iblnd on `o2ib` nets (its
    /// settings are `tunables`, `race_order`, `checksum` above), ksocklnd's wire on `tcp` nets.
    pub lnd: LndSettings,
}

/// Which LND an NI runs ([`NiConfig::lnd`]), as kernel LNet picks the LND by the net's type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LndSettings {
    /// o2iblnd (`net type: o2ib`), settings in [`NiConfig::tunables`].
    O2ib,
    /// ksocklnd (`net type: tcp`): its tunables and the acceptor's settings. Its NID,
    /// incarnation, credits, peer credits, peer timeout and peer buffer credits are the NI's
    /// (the fields of [`NiConfig`]), whatever this copy says.
    Sock(Box<lnd::iface::sock::SockConfig>),
}

impl LndSettings {
    /// The LND a net of this type runs by default.
    pub fn for_nid(nid: Nid) -> LndSettings {
        if nid.net().lnd() == lnd::wire::LndType::Tcp {
            LndSettings::Sock(Box::new(lnd::iface::sock::SockConfig::new(nid, 0)))
        } else {
            LndSettings::O2ib
        }
    }
}

impl NiConfig {
    /// An NI with its LND's default tunables (o2iblnd's, or ksocklnd's on a `tcp` net) and
    /// LNet's default credits.
    pub fn new(nid: Nid, incarnation: u64) -> NiConfig {
        let tunables = Tunables {
            peer_credits: DEFAULT_PEER_CREDITS as u16,
            ..Tunables::default()
        };
        NiConfig {
            nid,
            incarnation,
            tunables,
            credits: DEFAULT_CREDITS,
            peer_credits: DEFAULT_PEER_CREDITS,
            race_order: RaceOrder::default(),
            checksum: ChecksumConfig::default(),
            peer_limit: DEFAULT_PEER_LIMIT,
            peer_timeout: lnd::time::Duration::from_secs(180),
            peer_buffer_credits: 0,
            lnd: LndSettings::for_nid(nid),
        }
    }

    /// The credits actually used: both at least 1, peer credits at most NI credits.
    pub(crate) fn effective_credits(&self) -> (u32, u32) {
        let credits = self.credits.max(1);
        let peer = self.peer_credits.clamp(1, credits);
        (credits, peer)
    }

    /// Router buffer credits per upstream peer, as used: peer_buffer_credits, or peer_credits
    /// when 0 (lnet_peer_buffer_credits).
    pub(crate) fn effective_rtr_credits(&self) -> u32 {
        if self.peer_buffer_credits == 0 {
            self.effective_credits().1
        } else {
            self.peer_buffer_credits
        }
    }
}

/// Lustre's router buffer totals (router.c: tiny 512 x 4, small 4096 x 4, large 256 x 4).
pub const DEFAULT_TINY_BUFFERS: u32 = 2048;
pub const DEFAULT_SMALL_BUFFERS: u32 = 16384;
pub const DEFAULT_LARGE_BUFFERS: u32 = 1024;

/// The range of router buffers of one size a node takes, for the whole node: the `buffers:`
/// section and `lnetctl set tiny_buffers|small_buffers|large_buffers` check against this one
/// range, so whatever `set` accepts, an export writes back and the daemon loads.
pub const BUFFERS_RANGE: std::ops::RangeInclusive<u32> = 1..=10_000_000;

/// `out of range` text for a value outside `range`, as the configuration file words it
/// (`KEY: VALUE is out of range LO..=HI`).
pub fn out_of_range<T: std::fmt::Display>(
    key: &str,
    value: impl std::fmt::Display,
    range: &std::ops::RangeInclusive<T>,
) -> String {
    format!(
        "{key}: {value} is out of range {}..={}",
        range.start(),
        range.end()
    )
}

/// Router buffers of each size (`buffers:`, `lnetctl set tiny_buffers|small_buffers|
/// large_buffers`): tiny for messages without payload, small for one page, large for up to
/// LNET_MTU. A node gives each of its NI runtimes its share (each runtime is a CPT).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BufferCounts {
    pub tiny: u32,
    pub small: u32,
    pub large: u32,
}

impl Default for BufferCounts {
    fn default() -> BufferCounts {
        BufferCounts {
            tiny: DEFAULT_TINY_BUFFERS,
            small: DEFAULT_SMALL_BUFFERS,
            large: DEFAULT_LARGE_BUFFERS,
        }
    }
}

impl BufferCounts {
    /// One of `n` equal shares (at least one buffer of each size).
    pub fn share(self, n: usize) -> BufferCounts {
        let n = n.max(1) as u32;
        BufferCounts {
            tiny: (self.tiny / n).max(1),
            small: (self.small / n).max(1),
            large: (self.large / n).max(1),
        }
    }
}

/// Forwarding: whether this node routes, and its router buffers.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutingConfig {
    /// `routing: enable`: forward messages for other nodes (Lustre: off unless configured).
    pub enabled: bool,
    /// This node's router buffers (the node's share when a daemon splits them across NIs).
    pub buffers: BufferCounts,
    /// Whether large buffers are scrubbed before they are lent again (`buffers: scrub:`).
    pub scrub: crate::BulkScrub,
}

/// A node: its NIs and the PID it answers as.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The NIs, in order; [`NiIndex`](crate::NiIndex) `i` is `nis[i]`. Their NIDs must be
    /// distinct; two NIs on one net are allowed, and the first one is used to send on that net.
    pub nis: Vec<NiConfig>,
    /// Our LNet PID: sent as `src_pid` and in the ping reply.
    ///
    /// Default [`LNET_PID_LUSTRE`] (12345), the well-known PID of a kernel LNet node, and not
    /// `LNET_PID_LUSTRE | LNET_PID_USERFLAG`: the userspace flag marks a userspace *client
    /// process* in front of kernel LNet, whereas this library is the whole LNet stack of its node,
    /// and kernel peers address a node's LNet (ping, routing) at 12345.
    pub pid: u32,
    /// Every NID of the whole node, in configuration order, when this `LnetNode` runs only some
    /// of its NIs (the daemon runs one NI per thread, each its own `LnetNode`): the others are
    /// ours too (a message or ping to them is local) and our ping reply lists them all. Empty:
    /// the node is just `nis`.
    pub node_nids: Vec<Nid>,
    /// Routes to remote nets (`route:`), checked by [`crate::RouteTable::new`] when the node
    /// starts; a bad one is refused there.
    pub routes: Vec<RouteConfig>,
    /// Forwarding for others (`routing:`, `buffers:`).
    pub routing: RoutingConfig,
    /// How the gateways of `routes` are watched.
    pub gateway_health: GatewayHealthConfig,
    /// When each NID of the node last heard a message, shared by the runtimes of one node
    /// (one per NI, see `node_nids`) so that a ping reply on any NI reports every net's
    /// liveness when routing (see [`crate::alive`]). `None`: the node keeps its own board and
    /// judges only its own NIs (a sibling's liveness it cannot see is reported UP).
    pub net_alive: Option<NetAlive>,
    /// LNet's global tunables (`global:`, `lnetctl set`).
    pub globals: crate::GlobalTunables,
}

impl NodeConfig {
    /// A node with these NIs and PID 12345.
    pub fn new(nis: Vec<NiConfig>) -> NodeConfig {
        NodeConfig {
            nis,
            pid: LNET_PID_LUSTRE,
            node_nids: Vec::new(),
            routes: Vec::new(),
            routing: RoutingConfig::default(),
            gateway_health: GatewayHealthConfig::default(),
            net_alive: None,
            globals: crate::GlobalTunables::default(),
        }
    }

    /// The node split into one configuration per NI, for one runtime (thread) per NI: each
    /// knows every NID of the node (`node_nids`) and shares one board of which nets are
    /// alive, and gets an equal share of the router buffers (a runtime is a CPT).
    pub fn per_ni(&self) -> Vec<NodeConfig> {
        let nids: Vec<Nid> = self.nis.iter().map(|n| n.nid).collect();
        let share = self.routing.buffers.share(self.nis.len());
        let board = crate::alive::NetAlive::new(nids.len());
        self.nis
            .iter()
            .map(|ni| NodeConfig {
                nis: vec![ni.clone()],
                node_nids: nids.clone(),
                net_alive: Some(board.clone()),
                routing: RoutingConfig {
                    buffers: share,
                    ..self.routing
                },
                ..self.clone()
            })
            .collect()
    }

    /// Checks `routes` against the node's NIDs (`node_nids`, else the NIs'): the first bad
    /// route's position and why.
    pub fn check_routes(&self) -> Result<RouteTable, (usize, RouteError)> {
        let own: Vec<Nid> = if self.node_nids.is_empty() {
            self.nis.iter().map(|n| n.nid).collect()
        } else {
            self.node_nids.clone()
        };
        RouteTable::new(&self.routes, &own)
    }
}

/// Whether a router's large buffers are cleared before they are lent again. A buffer lent to
/// a peer that writes less than it announced would otherwise pass on what its previous user
/// left there. A fabric that sees every write land (tcp) fails such a transfer instead
/// (`rdma_short_writes`), so nothing needs clearing there; on verbs a write is one-sided and
/// invisible to us, so the buffer is scrubbed (its granted length zeroed) by the NI thread
/// after the transfer is done and before the buffer goes back to the pool.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum BulkScrub {
    /// Scrub where the fabric the data came in on cannot see writes (verbs, the simulator).
    #[default]
    Auto,
    /// Always (to measure the cost on tcp, or for defence in depth).
    On,
    /// Never.
    Off,
}

impl BulkScrub {
    pub fn name(self) -> &'static str {
        match self {
            BulkScrub::Auto => "auto",
            BulkScrub::On => "on",
            BulkScrub::Off => "off",
        }
    }
}

impl std::str::FromStr for BulkScrub {
    type Err = String;
    fn from_str(s: &str) -> Result<BulkScrub, String> {
        match s {
            "auto" => Ok(BulkScrub::Auto),
            "on" | "1" => Ok(BulkScrub::On),
            "off" | "0" => Ok(BulkScrub::Off),
            _ => Err(format!("'{s}' is not auto, on or off")),
        }
    }
}
