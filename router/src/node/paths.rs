//! The way to other nets, one of the sub-states an [`LnetNode`](crate::LnetNode) is built from:
//! the route table, the gateways (their liveness from the router pinger), and which gateway was
//! chosen last among equal routes (lnet_find_route_locked's round robin by sequence number).

use std::collections::HashMap;

use lnd::wire::Nid;

use crate::gateway::Gateways;
use crate::routes::RouteTable;

pub(super) struct Paths {
    pub(super) routes: RouteTable,
    pub(super) gateways: Gateways,
    /// When each gateway was last chosen (round robin across equal routes).
    pub(super) used: HashMap<Nid, u64>,
    pub(super) seq: u64,
}
