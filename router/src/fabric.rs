//! What a fabric driver reports for one NI, as one value: the arguments of the engine's
//! `handle_*` calls (lnd/src/fabric/mod.rs maps each to rdma_cm + verbs and to TCP).

use lnd::engine::Endpoint;
use lnd::fabric::{ConnId, ConnectFailure, PrivateData, RequestId, WcStatus, WrId};
use lnd::time::Instant;

/// A fabric event for one NI's endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FabricEvent {
    /// `Endpoint::handle_connect_request`.
    ConnectRequest {
        req: RequestId,
        private: PrivateData,
    },
    /// `Endpoint::handle_established` (the CONNACK on the active side, empty on the passive).
    Established { conn: ConnId, private: PrivateData },
    /// `Endpoint::handle_connect_failed`.
    ConnectFailed { conn: ConnId, why: ConnectFailure },
    /// `Endpoint::handle_recv`.
    Recv {
        conn: ConnId,
        slot: u16,
        bytes: Vec<u8>,
    },
    /// `Endpoint::handle_send_complete`.
    SendComplete {
        conn: ConnId,
        wr: WrId,
        status: WcStatus,
    },
    /// `Endpoint::handle_disconnected`.
    Disconnected { conn: ConnId },
}

impl FabricEvent {
    /// Feeds this event to `ep`.
    pub fn apply(self, now: Instant, ep: &mut Endpoint) {
        match self {
            FabricEvent::ConnectRequest { req, private } => {
                ep.handle_connect_request(now, req, private.as_bytes())
            }
            FabricEvent::Established { conn, private } => {
                ep.handle_established(now, conn, private.as_bytes())
            }
            FabricEvent::ConnectFailed { conn, why } => ep.handle_connect_failed(now, conn, why),
            FabricEvent::Recv { conn, slot, bytes } => ep.handle_recv(now, conn, slot, &bytes),
            FabricEvent::SendComplete { conn, wr, status } => {
                ep.handle_send_complete(now, conn, wr, status)
            }
            FabricEvent::Disconnected { conn } => ep.handle_disconnected(now, conn),
        }
    }
}
