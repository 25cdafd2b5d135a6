//! `router`: ulnet's LNet layer, the part every node runs above its LNDs, and the library of the
//! `lnet-router` daemon (feature `daemon`): its YAML configuration, its control protocol and
//! socket, and [`runtime::NiRuntime`], one NI's node, driver and waker with the loop the daemon
//! runs on a thread per NI, and [`relay`], which hands messages between those runtimes (the
//! same code in the daemon, the simulator's routed storm and the tests).
//!
//! The node, [`LnetNode`], is sans-IO like the LND engine below it: time is passed in as
//! [`lnd::time::Instant`], nothing reads a clock, spawns a thread or does I/O, and every output
//! is drained with a `poll_*` call. It talks to one LND per NI through the LND interface,
//! [`lnd::iface::Lnd`] (kernel LNet's `lnet_lnd`), and names no LND's own types; [`o2ib`] is
//! the layer that gives an NI the o2ib engine and lets its fabric driver reach it. It provides:
//!
//! - **Sending** PUTs ([`LnetNode::send_put`], [`LnetNode::send_put_bulk`]), GETs and pings
//!   ([`LnetNode::ping`]) as LNet headers whose `src_nid` is the sending NI's NID, to one of
//!   our nets or through a gateway of the route table.
//! - **Local delivery by design**: a message to `0@lo` *or to any of our own NIDs* is delivered
//!   in memory and never reaches an LND. Lustre short-circuits only `0@lo`
//!   (lib-move.c, lnet_select_pathway hands it to the loopback LND) and sends to its own o2ib NID
//!   through o2iblnd, connecting over the HCA to itself; the reverted LU-7646 patch turned that
//!   self-connection into an endless CONN_RACE, so a self-ping hung (reference section 4.4).
//!   Here no message to our own NIDs touches an LND, not even LNet health's recovery ping of a
//!   local NI (lnet_recover_local_nis pings the NI's own NID): ours goes through the NI to a
//!   live peer on its net (`node/recovery.rs`).
//! - **LNet credits** (reference section 3.4; lib-move.c, lnet_post_send_locked and
//!   lnet_return_tx_credits_locked): a send takes a peer tx credit, then an NI tx credit; a
//!   counter that goes negative parks the message on that peer's (or NI's) queue; the LND's
//!   `SendDone` returns both, and a returned credit that leaves its counter at or below zero
//!   sends the first waiter. Low-water marks and queued bytes are kept for `peer show`.
//! - **Receiving**: every message an LND brings up is answered exactly once (`recv_done`,
//!   `recv_failed` or a bulk answer: the LNet <-> LND contract, reference section 1.6), then
//!   parsed: a ping GET is answered by the ping service, a REPLY completes its ping, a PUT lands
//!   in a posted MD or goes up as [`LnetEvent::Put`], and a message for another node is
//!   forwarded (router credits, router buffers, egress choice: [`forward`]) when routing is on,
//!   else dropped and counted.
//! - **Health and recovery**, **peer aging** and the **router pinger**, on one timer table.
//! - **Stats** under `lnetctl`'s names ([`LnetStats`], [`PeerInfo`], [`NiInfo`]).
//!
//! Driving a node: a driver pushes fabric events into NI `i`'s [`NiSink`]
//! ([`LnetNode::fabric_sink`]) and [`LnetNode::process`] hands what they produced to LNet (or,
//! one event at a time, [`LnetNode::handle_fabric`] does both); call
//! [`LnetNode::handle_timeout`] at [`LnetNode::poll_timeout`], and after any input drain
//! [`LnetNode::poll_action`] (fabric work, tagged with its NI), [`LnetNode::poll_handover`]
//! (work for sibling runtimes) and [`LnetNode::poll_event`].
//!
//! With the `sim` feature an [`LnetNode`] (one NI) is also a node of `lnd`'s deterministic
//! simulator (`lnd::sim::World<LnetNode>`), so LNet runs through its faults in virtual time.

pub mod alive;
pub mod bulk_pool;
mod config;
pub mod control;
#[cfg(feature = "daemon")]
pub mod daemon;
mod error;
pub mod forward;
pub mod gateway;
pub mod globals;
pub mod health;
mod ids;
mod node;
pub mod o2ib;
mod peer;
mod ping;
#[cfg(feature = "daemon")]
pub mod rdma;
pub mod relay;
pub mod routes;
pub mod runtime;
pub mod selftest;
#[cfg(feature = "sim")]
mod sim_node;
#[cfg(feature = "sim")]
pub mod sim_storm;
pub mod sock;
mod stats;
#[cfg(test)]
mod tests;
pub mod text;
#[cfg(feature = "daemon")]
pub mod yaml_config;

pub use config::{
    out_of_range, BufferCounts, BulkScrub, LndSettings, NiConfig, NodeConfig, RoutingConfig,
    BUFFERS_RANGE, DEFAULT_CREDITS, DEFAULT_PEER_CREDITS,
};
pub use error::LnetError;
pub use forward::{
    BulkBuffers, BulkRegion, ForwardStats, FwdDrop, HandedForward, Handover, HandoverTarget,
    PoolClass, RoutingInfo,
};
pub use gateway::{GatewayHealthConfig, GatewayInfo};
pub use globals::{GlobalError, GlobalTunables};
pub use ids::{MdId, MsgId, NiIndex, PingId};
pub use lnd::fabric::{FabricEvent, FabricSink};
pub use node::{BulkBuf, LnetEvent, LnetNode, SCRUB_BUDGET};
pub use o2ib::NiSink;
pub use ping::{PingReply, MAX_PING_NIS, OUR_FEATURES, PING_SEQUENCE, PING_SINK_LEN};
pub use routes::{RouteConfig, RouteError, RouteTable};
pub use stats::{LnetStats, NiInfo, PeerInfo, PeerState};
