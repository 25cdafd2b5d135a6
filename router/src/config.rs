//! Configuration of an [`LnetNode`](crate::LnetNode): its NIs and its PID.

use lnd::engine::config::DEFAULT_PEER_LIMIT;
use lnd::engine::{ChecksumConfig, RaceOrder, Tunables};
use lnd::wire::lnet::LNET_PID_LUSTRE;
use lnd::wire::Nid;

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
}

impl NiConfig {
    /// An NI with o2iblnd's default tunables and LNet's default credits.
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
        }
    }

    /// The credits actually used: both at least 1, peer credits at most NI credits.
    pub(crate) fn effective_credits(&self) -> (u32, u32) {
        let credits = self.credits.max(1);
        let peer = self.peer_credits.clamp(1, credits);
        (credits, peer)
    }
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
}

impl NodeConfig {
    /// A node with these NIs and PID 12345.
    pub fn new(nis: Vec<NiConfig>) -> NodeConfig {
        NodeConfig {
            nis,
            pid: LNET_PID_LUSTRE,
            node_nids: Vec::new(),
        }
    }
}
