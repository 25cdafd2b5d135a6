//! LNet's per-peer-NI state: tx credits and the queue of messages waiting for one
//! (`struct lnet_peer_ni`'s lpni_txcredits, lpni_mintxcredits, lpni_txq, lpni_txqnob;
//! reference section 3.4).

use std::collections::VecDeque;

use lnd::time::Instant;
use lnd::wire::Nid;

use crate::stats::{PeerInfo, PeerState};
use crate::NiIndex;

/// One peer NI, reached through one of our NIs.
#[derive(Debug)]
pub(crate) struct PeerNi {
    pub nid: Nid,
    pub ni: NiIndex,
    /// The credit limit (the NI's peer_credits).
    pub max_tx_credits: i64,
    /// Credits left; negative = that many messages wait on `txq`.
    pub tx_credits: i64,
    /// Low-water mark of `tx_credits`.
    pub min_tx_credits: i64,
    /// Messages waiting for a peer credit, oldest first (cookies of `OutMsg`s).
    pub txq: VecDeque<u64>,
    /// Bytes waiting on `txq` (payload + LNet header, as Lustre counts them).
    pub txqnob: u64,
    /// Of `txq`, our own REPLY/ACKs (what RESPONSE_BACKLOG bounds).
    pub txq_responses: usize,
    pub state: PeerState,
    pub send_count: u64,
    pub recv_count: u64,
    pub drop_count: u64,
    /// The last traffic to or from it, for aging.
    pub last_active: Instant,
    /// Router credits (lpni_rtrcredits, from peer_buffer_credits): router buffers its
    /// messages for other nodes may hold at once here; negative = that many wait on `rtrq`.
    pub max_rtr_credits: i64,
    pub rtr_credits: i64,
    pub min_rtr_credits: i64,
    /// Its messages for other nodes waiting for a router credit (keys of held messages).
    pub rtrq: VecDeque<crate::forward::FwdKey>,
    /// While it is down: when a forwarded message last went to it anyway, to let the LND try
    /// it again (see `LnetNode::drops_for_down_peer`).
    pub down_probe: Option<Instant>,
    /// LNet health (`crate::health`): its value and recovery, and what failed.
    pub health: crate::health::Health,
    pub hstats: crate::health::PeerHealthStats,
    /// When a message from it last came in (lpni_last_alive), for `recovery_limit`.
    pub last_heard: Option<Instant>,
    /// Bulk PUTs to forward from it (see `node/bulk.rs`, "Lending large buffers"): whether
    /// one has come in whole (until then it is held to the unproven share of the large
    /// buffers), the large buffers its messages hold now, its transfers in a row that stalled
    /// or came in short, and until when its bulk PUTs are refused for that.
    pub bulk_proven: bool,
    pub bulk_held: u32,
    pub bulk_strikes: u32,
    pub bulk_refused_until: Option<Instant>,
}

impl PeerNi {
    /// True when it holds nothing: every credit back and nothing waiting.
    pub fn is_idle(&self) -> bool {
        self.tx_credits == self.max_tx_credits
            && self.txq.is_empty()
            && self.rtr_credits == self.max_rtr_credits
            && self.rtrq.is_empty()
    }

    pub fn new(nid: Nid, ni: NiIndex, peer_credits: u32, rtr_credits: u32, now: Instant) -> PeerNi {
        let c = i64::from(peer_credits);
        let r = i64::from(rtr_credits);
        PeerNi {
            nid,
            ni,
            max_tx_credits: c,
            tx_credits: c,
            min_tx_credits: c,
            txq: VecDeque::new(),
            txqnob: 0,
            txq_responses: 0,
            state: PeerState::NotApplicable,
            send_count: 0,
            recv_count: 0,
            drop_count: 0,
            last_active: now,
            max_rtr_credits: r,
            rtr_credits: r,
            min_rtr_credits: r,
            rtrq: VecDeque::new(),
            down_probe: None,
            health: crate::health::Health::default(),
            hstats: crate::health::PeerHealthStats::default(),
            last_heard: None,
            bulk_proven: false,
            bulk_held: 0,
            bulk_strikes: 0,
            bulk_refused_until: None,
        }
    }

    pub fn info(&self) -> PeerInfo {
        PeerInfo {
            primary_nid: self.nid,
            multi_rail: false,
            nid: self.nid,
            ni: self.ni,
            state: self.state,
            max_ni_tx_credits: self.max_tx_credits,
            available_tx_credits: self.tx_credits,
            min_tx_credits: self.min_tx_credits,
            tx_q_num_of_buf: self.txqnob,
            available_rtr_credits: self.rtr_credits,
            min_rtr_credits: self.min_rtr_credits,
            send_count: self.send_count,
            recv_count: self.recv_count,
            drop_count: self.drop_count,
            health: self.health,
            hstats: self.hstats,
        }
    }
}
