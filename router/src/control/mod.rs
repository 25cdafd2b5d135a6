//! The control protocol between `lnetctl` and the `lnet-router` daemon: one JSON object per line
//! over a Unix socket (mode 0600), a [`Request`] from the client, one [`Response`] back.
//!
//! Server side, [`Control`] turns requests into responses against an [`LnetNode`]. Show commands
//! are answered at once from snapshots; a ping starts node pings and is answered when their
//! [`LnetEvent::PingDone`]s arrive: the daemon loop hands every node event to
//! [`Control::on_event`], which returns the finished replies with the token the request came with
//! (a reply channel, a connection id: whatever the driver needs to route the answer).
//!
//! Client side, [`ControlClient`] is a small blocking client; [`call_local`] answers a request
//! with an in-process node instead (what `lnetctl ping` does when no daemon runs).
//!
//! The response data carries lnetctl's own key names (`primary nid`, `Multi-Rail`, `peer ni`, ...)
//! so that `lnetctl --json` prints the same data as its YAML.
//!
//! The pieces, each re-exported here (`router::control::X`):
//!
//! - `protocol`: [`Request`], [`Response`], [`errno`], the show structs a response carries, the
//!   line encoders and decoders ([`encode_request`], [`decode_request_bytes`],
//!   [`encode_response`], [`MAX_REQUEST`]) and [`default_socket_path`].
//! - `views`: the show structs built from an [`LnetNode`] ([`net_show`], [`peer_show`],
//!   [`conn_show`], [`stats_show`], [`global_show`], [`LndCounters::from_stats`]).
//! - `service`: [`Control`] and [`call_local`].
//! - `capture`: `lnetctl capture`'s records, [`CaptureSession`] and [`CaptureWriter`].
//! - `client`: [`ControlClient`].
//! - `server` (feature `daemon`): the daemon's socket: `bind_socket`, `read_request` with its
//!   cap and timeouts, `MAX_CLIENTS`, `ControlCounters`.
//!
//! [`LnetNode`]: crate::LnetNode
//! [`LnetEvent::PingDone`]: crate::LnetEvent::PingDone

mod capture;
mod client;
#[cfg(feature = "daemon")]
mod import;
mod protocol;
#[cfg(feature = "daemon")]
mod server;
mod service;
mod views;

pub use capture::*;
pub use client::*;
#[cfg(feature = "daemon")]
pub use import::{apply_routes, import, NetChange, RouteBatch, RouteOutcome, RoutesOp};
pub use protocol::*;
#[cfg(feature = "daemon")]
pub use server::*;
pub use service::*;
pub use views::*;

#[cfg(test)]
mod testutil {
    use lnd::time::Instant;

    use crate::{LnetNode, NiConfig, NodeConfig};

    pub(super) use testkit::nid;

    pub(super) fn node() -> LnetNode {
        LnetNode::new(
            NodeConfig::new(vec![NiConfig::new(nid("10.0.0.1@o2ib"), 7)]),
            Instant::from_secs(1),
        )
    }
}
