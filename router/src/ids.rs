//! The names LNet hands out and takes back: which NI, which message, which ping, which memory
//! descriptor. A leaf: every part of the LNet layer names them, so they depend on nothing of it
//! (they were defined in `node.rs`, which made every file that named an NI a cycle with it).

/// Which of the node's NIs: the position in [`NodeConfig::nis`](crate::NodeConfig::nis).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NiIndex(pub usize);

/// Names a PUT from [`LnetNode::send_put`](crate::LnetNode::send_put) until its [`LnetEvent::PutDone`](crate::LnetEvent::PutDone).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsgId(pub u64);

/// Names a ping from [`LnetNode::ping`](crate::LnetNode::ping) until its [`LnetEvent::PingDone`](crate::LnetEvent::PingDone).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PingId(pub u64);

/// Names a posted MD from [`LnetNode::post_sink`](crate::LnetNode::post_sink) or [`LnetNode::post_source`](crate::LnetNode::post_source) until its event.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MdId(pub u64);
