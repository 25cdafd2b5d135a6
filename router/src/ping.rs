//! The ping service and the ping client's reply parsing (reference section 1.5).
//!
//! A ping is a GET on the reserved portal 0 with match bits LNET_PING_MATCHBITS; the target's
//! LNet answers it from its ping buffer with a REPLY carrying `struct lnet_ping_info`
//! (api-ni.c: lnet_ping sends, the ping target MD answers). Our ping buffer lists `0@lo` first,
//! whose status word carries the buffer's sequence number, then every NI with status UP (a
//! router says DOWN for an NI whose net has gone silent, see [`crate::alive`]).

use lnd::wire::kib::MSG_SIZE;
use lnd::wire::ping::{feat, status, PING_HDR_LEN};
use lnd::wire::{ByteOrder, NiStatus, Nid, PingInfo, WireError};

/// Features we advertise when we do not route: the base set, NI status, and RTE_DISABLED (a
/// node that routes clears it, so that nodes using it as a gateway know it forwards). No
/// Multi-Rail, no discovery.
pub const OUR_FEATURES: u32 = feat::BASE | feat::NI_STATUS | feat::RTE_DISABLED;

/// Our features: [`OUR_FEATURES`], without RTE_DISABLED when we route.
pub fn our_features(routing: bool) -> u32 {
    if routing {
        OUR_FEATURES & !feat::RTE_DISABLED
    } else {
        OUR_FEATURES
    }
}

/// NIs a ping reply may list before we stop reading it (ours: sizes the GET's sink so the GET and
/// its REPLY both travel inline in one 4 KiB o2iblnd message).
pub const MAX_PING_NIS: usize = 200;

/// The `sink_length` of our ping GETs: room for `0@lo` plus [`MAX_PING_NIS`] entries.
pub const PING_SINK_LEN: u32 = (PING_HDR_LEN + (MAX_PING_NIS + 1) * 16) as u32;

/// The sequence number of our ping buffer. Lustre bumps it each time the NI list changes
/// (lnet_ping_target_update); ours is fixed for the node's life.
pub const PING_SEQUENCE: u32 = 1;

/// What a ping learned about the peer, in `lnetctl ping`'s shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PingReply {
    /// The peer's primary NID: the first NI its ping buffer lists after `0@lo` (the order Lustre
    /// builds the buffer in puts the first configured NI there); the pinged NID if it lists none.
    pub primary_nid: Nid,
    /// The peer's NIDs, `0@lo` omitted, in the order it listed them.
    pub nids: Vec<Nid>,
    /// The peer's PID.
    pub pid: u32,
    /// The feature bits of its reply (LNET_PING_FEAT_*).
    pub features: u32,
    /// Whether it advertises Multi-Rail.
    pub multi_rail: bool,
    /// The NIDs it lists with status DOWN (a router's NIs that lost their net).
    pub down_nids: Vec<Nid>,
}

impl PingReply {
    /// The peer says it does not forward (LNET_PING_FEAT_RTE_DISABLED).
    pub fn routing_disabled(&self) -> bool {
        self.features & feat::RTE_DISABLED != 0
    }
}

/// Encodes our ping buffer for NIs `nids` with PID `pid`, each NI UP unless `down(i)` says
/// NI `i` is not (a router's net gone silent, see [`crate::alive`]).
pub(crate) fn ping_buffer(
    pid: u32,
    nids: &[Nid],
    features: u32,
    down: impl Fn(usize) -> bool,
) -> Vec<u8> {
    let mut entries = Vec::with_capacity(nids.len() + 1);
    entries.push(NiStatus {
        nid: Nid::LO_0,
        status: PING_SEQUENCE,
        msg_size: 0,
    });
    entries.extend(nids.iter().enumerate().map(|(i, &nid)| NiStatus {
        nid,
        status: if down(i) { status::DOWN } else { status::UP },
        msg_size: MSG_SIZE as u32,
    }));
    let info = PingInfo::new(features, pid, &entries);
    let mut out = vec![0u8; info.wire_len()];
    // The buffer is sized by wire_len, so emitting cannot fail.
    let n = info.emit(&mut out, ByteOrder::Little).unwrap_or(0);
    out.truncate(n);
    out
}

/// Reads a ping REPLY's payload (either byte order), dropping `0@lo` as lnet_ping does.
pub(crate) fn parse_reply(target: Nid, payload: &[u8]) -> Result<PingReply, WireError> {
    let (info, _) = PingInfo::parse(payload)?;
    let nids: Vec<Nid> = info
        .nis
        .iter()
        .map(|ni| ni.nid)
        .filter(|&nid| nid != Nid::LO_0)
        .take(MAX_PING_NIS)
        .collect();
    let down_nids = info
        .nis
        .iter()
        // Anything but UP, as lnet_router_discovery_ping_reply takes a gateway's NI.
        .filter(|ni| ni.nid != Nid::LO_0 && ni.status != status::UP)
        .map(|ni| ni.nid)
        .take(MAX_PING_NIS)
        .collect();
    Ok(PingReply {
        primary_nid: nids.first().copied().unwrap_or(target),
        nids,
        down_nids,
        pid: info.pid,
        features: info.features,
        multi_rail: info.features & feat::MULTI_RAIL != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_round_trips_and_omits_lo() {
        let a: Nid = "10.0.0.1@o2ib".parse().unwrap();
        let b: Nid = "10.0.1.1@o2ib1".parse().unwrap();
        let buf = ping_buffer(12345, &[a, b], OUR_FEATURES, |_| false);
        assert_eq!(buf.len(), PING_HDR_LEN + 3 * 16);
        let (info, _) = PingInfo::parse(&buf).unwrap();
        let first = info.nis.get(0).unwrap();
        assert_eq!(first.nid, Nid::LO_0);
        assert_eq!(first.status, PING_SEQUENCE);
        assert!(info.nis.iter().skip(1).all(|n| n.status == status::UP));
        let r = parse_reply(a, &buf).unwrap();
        assert_eq!(r.nids, vec![a, b]);
        assert_eq!(r.primary_nid, a);
        assert_eq!(r.pid, 12345);
        assert_eq!(r.features, OUR_FEATURES);
        assert!(!r.multi_rail);
    }

    #[test]
    fn sink_fits_one_inline_message() {
        assert!(PING_SINK_LEN as usize <= lnd::wire::kib::MAX_INLINE);
    }
}
