//! What the two fabric drivers (`tcp` and `verbs`) share of their plumbing: the reports a
//! fabric decides while it applies the engine's actions and delivers at the start of the next
//! `poll` (the engine is not re-entered from `apply`), and how a fabric finds a peer's address.

use std::net::SocketAddr;

use crate::fabric::{ConnId, ConnectFailure, DisconnectReason, WcStatus, WrId};
use crate::wire::Nid;

/// A report decided in `apply`, delivered at the start of the next `poll`.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Report {
    SendDone(ConnId, WrId, WcStatus),
    Disconnected(ConnId, DisconnectReason),
    ConnectFailed(ConnId, ConnectFailure),
}

impl Report {
    /// The connection it is about (nothing is reported for one destroyed meanwhile).
    pub(crate) fn conn(self) -> ConnId {
        match self {
            Report::SendDone(c, ..) | Report::Disconnected(c, _) | Report::ConnectFailed(c, _) => c,
        }
    }
}

/// Maps a peer's NID to the address its fabric listens on.
pub(crate) type Resolver = Box<dyn Fn(Nid) -> Option<SocketAddr> + Send>;
