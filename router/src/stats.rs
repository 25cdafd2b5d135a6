//! What an operator reads: counters named as `lnetctl stats show`, `peer show` and `net show`
//! print them (reference section 7), so that `lnetctl` can render them unchanged.

use lnd::iface::LndInfo;
use lnd::wire::Nid;

use crate::NiIndex;

/// Node-wide counters, `lnetctl stats show`. Lengths are payload bytes. Counters only grow,
/// except the gauge `msgs_alloc`.
///
/// `rst_alloc` is not kept: ulnet tracks no response deadlines beyond its pings and routed
/// GETs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LnetStats {
    /// Messages LNet holds right now: outgoing ones from creation until the LND (or local
    /// delivery) finishes them, incoming ones while they are processed (gauge).
    pub msgs_alloc: u64,
    /// The most messages ever held at once.
    pub msgs_max: u64,
    /// Messages that ended in an error: refused sends (no route, too large), failed LND sends,
    /// pings without a reply.
    pub errors: u64,
    /// Messages handed to an LND or delivered locally, and their payload bytes.
    pub send_count: u64,
    pub send_length: u64,
    /// Messages received for this node (from an LND or locally) and their payload bytes.
    pub recv_count: u64,
    pub recv_length: u64,
    /// Messages forwarded: always 0 in this slice (no routing yet).
    pub route_count: u64,
    pub route_length: u64,
    /// Messages received and not delivered: not addressed to us, nothing matched (an
    /// unexpected GET, REPLY or ACK, a PUT on the reserved portal other than a discovery
    /// push), or malformed. A discovery push is received (and ACKed), not dropped.
    pub drop_count: u64,
    pub drop_length: u64,
    /// Pings whose REPLY did not come within their timeout (Lustre counts responses that did not
    /// come in time here).
    pub response_timeout_count: u64,
    /// Sends refused because no NI reaches the destination.
    pub local_no_route_count: u64,
    /// LNET_MSG_STATUS_LOCAL_INTERRUPT / LOCAL_DROPPED / REMOTE_TIMEOUT: statuses ulnet's LND
    /// does not report today, counted if it ever does.
    pub local_interrupt_count: u64,
    pub local_dropped_count: u64,
    /// LNET_MSG_STATUS_REMOTE_DROPPED: a send posted that failed (the peer may not have it),
    /// a refused connect, a next hop held down.
    pub remote_dropped_count: u64,
    pub remote_timeout_count: u64,
    /// LNET_MSG_STATUS_LOCAL_TIMEOUT: sends still queued on a connection that closed on a
    /// timeout (never sent; a node with two NIs may resend them).
    pub local_timeout_count: u64,
    /// Sends aborted because the LND shut down.
    pub local_aborted_count: u64,
    /// Sends the LND refused on the spot, still queued on a connection that closed, or LNet
    /// could not make (a loop, bulk on no path).
    pub local_error_count: u64,
    /// Sends the peer failed with an error of its own (a bulk rendezvous it refused or could not
    /// complete: LNET_MSG_STATUS_REMOTE_ERROR).
    pub remote_error_count: u64,
    /// Sends the transport gave up on (retry exceeded), or whose peer could not be
    /// connected (o2iblnd's kiblnd_peer_connect_failed: EHOSTUNREACH or ETIMEDOUT): a network
    /// timeout.
    pub network_timeout_count: u64,
    /// Messages sent again after a local failure (lch_resend_count), resends that then went
    /// through (lch_successful_resends), and messages that failed again with no resend left
    /// (lch_failed_resends; counted only while `retry_count` allows resends at all).
    pub resend_count: u64,
    pub successful_resends: u64,
    pub failed_resends: u64,
    /// Ours: messages short-circuited in memory (to 0@lo or to one of our own NIDs, never
    /// through an LND), and their payload bytes. Included in send/recv counts too.
    pub loopback_count: u64,
    pub loopback_length: u64,
    /// Ours: peer NIs forgotten after peer_timeout without traffic, and peer NIs not created
    /// (their messages refused) because the table was at its limit.
    pub peers_aged: u64,
    pub peer_table_full: u64,
}

/// A peer NI's state as `peer show` prints it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerState {
    /// The LND reported a working connection most recently.
    Up,
    /// The LND reported the peer down most recently.
    Down,
    /// No news from the LND yet. (Lustre prints NA unless aliveness tracking is on; we track
    /// what the LND tells us, so NA means "not known yet".)
    NotApplicable,
}

impl PeerState {
    /// `up`, `down` or `NA`, as lnetctl prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Up => "up",
            PeerState::Down => "down",
            PeerState::NotApplicable => "NA",
        }
    }
}

/// One peer NI, `lnetctl peer show` (every peer is its own primary NID: no Multi-Rail yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's primary NID (= `nid`: no discovery or Multi-Rail yet).
    pub primary_nid: Nid,
    /// Always false in this slice.
    pub multi_rail: bool,
    /// The peer NI's NID.
    pub nid: Nid,
    /// Our NI that talks to it.
    pub ni: NiIndex,
    pub state: PeerState,
    /// The NI's peer_credits.
    pub max_ni_tx_credits: i64,
    /// Peer tx credits now; negative = that many messages wait in LNet for this peer.
    pub available_tx_credits: i64,
    /// The low-water mark of `available_tx_credits`.
    pub min_tx_credits: i64,
    /// Bytes (payload + 72-byte LNet header) of the messages waiting for a peer credit.
    pub tx_q_num_of_buf: u64,
    /// Router credits: untouched (= peer_credits) until forwarding exists.
    pub available_rtr_credits: i64,
    pub min_rtr_credits: i64,
    /// Messages sent to, received from, and dropped from this peer NI.
    pub send_count: u64,
    pub recv_count: u64,
    pub drop_count: u64,
    /// LNet health: the value, its recovery, and the remote failures counted.
    pub health: crate::health::Health,
    pub hstats: crate::health::PeerHealthStats,
}

/// One local NI, `lnetctl net show -v`.
#[derive(Clone, Debug, PartialEq)]
pub struct NiInfo {
    pub index: NiIndex,
    pub nid: Nid,
    /// "up", or on a router "down" while its net has been silent too long (what its ping
    /// reply says, see [`crate::alive`]).
    pub status: &'static str,
    /// `tunables: credits` and `peer_credits`, as used (after clamping).
    pub credits: u32,
    pub peer_credits: u32,
    /// NI tx credits now (negative = messages waiting for the NI) and their low-water mark.
    pub available_tx_credits: i64,
    pub min_tx_credits: i64,
    /// `statistics:` of the NI.
    pub send_count: u64,
    pub recv_count: u64,
    pub drop_count: u64,
    /// The LND's tunables, settings and counters (`lnd tunables:`, `lnd statistics:`), as
    /// its kind has them.
    pub lnd: LndInfo,
    /// The LND's peer count.
    pub lnd_peers: usize,
    /// LNet health: the value, and the local failures counted.
    pub health: crate::health::Health,
    pub hstats: crate::health::NiHealthStats,
}

/// Two sets of counters added field by field through their JSON form: numbers are summed,
/// objects merged key by key, anything else kept from `a`, so that a counter added to the
/// struct is summed without a change here. `a` unchanged if either does not round-trip.
/// (The daemon sums its NI loops' `stats show` answers and the metrics scrape its snapshots
/// with it.)
#[cfg(feature = "daemon")]
pub fn sum_counters<T>(a: T, b: T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    fn add(a: &mut serde_json::Value, b: &serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                for (k, v) in y {
                    match x.get_mut(k) {
                        Some(slot) => add(slot, v),
                        None => {
                            x.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            (slot @ serde_json::Value::Number(_), serde_json::Value::Number(n)) => {
                let sum = slot.as_u64().unwrap_or(0) + n.as_u64().unwrap_or(0);
                *slot = serde_json::Value::from(sum);
            }
            _ => {}
        }
    }
    let (Ok(mut x), Ok(y)) = (serde_json::to_value(&a), serde_json::to_value(&b)) else {
        return a;
    };
    add(&mut x, &y);
    serde_json::from_value(x).unwrap_or(a)
}
