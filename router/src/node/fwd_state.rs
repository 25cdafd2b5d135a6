//! The state of a message a router holds for another node, as the forwarding pipeline
//! (`node/forwarding.rs`) moves it through its stages: types only, so that the node's struct
//! can hold them while the pipeline sits a layer above the core (`tests/module_graph.rs`).

use std::collections::VecDeque;

use lnd::handle::HandleSlab;
use lnd::iface::{BulkOp, RxToken};
use lnd::wire::{LnetHdr, Nid};

use crate::forward::{ForwardStats, FwdKey, FwdTag, Handover, PoolClass, Pools};

/// The forwarder, one of the sub-states an [`LnetNode`](crate::LnetNode) is built from: whether
/// the node routes, its router buffer pools (lnet_rtrbufpool), the messages it holds for other
/// nodes by key, those ready for their egress, the books, and the work for sibling runtimes.
/// The pipeline that moves a message through it is `node/forwarding.rs`.
pub(super) struct Forwarder {
    /// Forwarding on (`routing: enable`).
    pub(super) on: bool,
    pub(super) pools: Pools,
    /// Messages held for other nodes, by key.
    pub(super) held: HandleSlab<Fwd, FwdTag>,
    /// Held messages that have their router credit and buffer: committed in `process`.
    pub(super) ready: VecDeque<FwdKey>,
    pub(super) stats: ForwardStats,
    /// Work for sibling runtimes (forwards to send, forwards to release).
    pub(super) handovers: VecDeque<Handover>,
}

/// A message this node holds for another, from its arrival until its egress is done.
#[derive(Debug)]
pub(super) struct Fwd {
    /// The peer NI it came from, and our NI it came in on.
    pub(super) from: Nid,
    pub(super) ni: usize,
    pub(super) hdr: LnetHdr,
    pub(super) class: PoolClass,
    pub(super) kind: FwdKind,
    /// It took a router credit of its sender: every message does, except one whose sender the
    /// peer table had no room for (the pools alone limit those).
    pub(super) rtr_credit: bool,
    pub(super) stage: FwdStage,
}

/// How a held message's payload travels.
#[derive(Debug)]
pub(super) enum FwdKind {
    /// It came with the message; moved to the egress at the commit.
    Inline(Vec<u8>),
    /// A bulk PUT (its sender's PUT_REQ): written into a large router buffer after the commit.
    /// `unproven`: admitted under the unproven share of the large buffers (its sender had not
    /// yet brought a bulk PUT in whole), where it counts until it is done.
    Bulk { unproven: bool },
}

/// Where a held message stands in the pipeline (see the module notes). Every stage before the
/// commit holds the LND receive slot the message came in.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum FwdStage {
    /// On its sender's router-credit queue (`PeerNi::rtrq`), its credit counted.
    WaitingCredit(RxToken),
    /// A bulk PUT of an unproven sender, waiting for room in the unproven share
    /// (`Lending::unproven_wait`).
    WaitingUnproven(RxToken),
    /// On its pool's queue (`Pool::waiting`), its buffer counted.
    WaitingBuffer(RxToken),
    /// Has its router credit and buffer: on `fwd_ready`, committed in `process`.
    Ready(RxToken),
    /// A bulk PUT its sender is writing into this large router buffer (the LND has its slot).
    Receiving(usize),
    /// With its egress, here or in a sibling runtime; a bulk PUT from this large router buffer.
    Sending(Option<usize>),
}

impl FwdStage {
    /// The LND receive slot it still holds.
    pub(super) fn rx(self) -> Option<RxToken> {
        match self {
            FwdStage::WaitingCredit(rx)
            | FwdStage::WaitingUnproven(rx)
            | FwdStage::WaitingBuffer(rx)
            | FwdStage::Ready(rx) => Some(rx),
            FwdStage::Receiving(_) | FwdStage::Sending(_) => None,
        }
    }

    /// The next stage before the commit (the slot goes along).
    pub(super) fn then(self, next: fn(RxToken) -> FwdStage) -> FwdStage {
        self.rx().map_or(self, next)
    }

    /// Holds a buffer of its pool (taken, not waited for).
    pub(super) fn holds_buffer(self) -> bool {
        matches!(
            self,
            FwdStage::Ready(_) | FwdStage::Receiving(_) | FwdStage::Sending(_)
        )
    }

    /// The large router buffer its payload is in.
    pub(super) fn large_buffer(self) -> Option<usize> {
        match self {
            FwdStage::Receiving(k) | FwdStage::Sending(Some(k)) => Some(k),
            _ => None,
        }
    }
}

/// What came in for another node.
pub(super) enum Arrival {
    /// A message with its payload (the LND's `Received`).
    Inline(Vec<u8>),
    /// A rendezvous request (`BulkRequest`): a PUT_REQ's data comes once a buffer is lent; a
    /// GET_REQ is never routed.
    Bulk(BulkOp),
}
