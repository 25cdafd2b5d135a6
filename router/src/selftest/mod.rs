//! lnet_selftest: the RPC protocol that the `lst` console and the kernel module `lnet_selftest`
//! speak over LNet (reference section 8), so that ulnet nodes and kernel Lustre nodes can take
//! part in the same selftest session.
//!
//! - [`wire`]: the 160-byte `srpc_msg` with every request and reply body, the destination list
//!   a test request's bulk carries, and the brw data check patterns.
//! - [`Selftest`]: what one NI of a node runs: the service a console makes sessions on and
//!   adds tests to, the client side of those tests, the test servers (ping, brw), and the
//!   console itself ([`LstCommand`]), all over the node's LNet API (small PUTs for the RPCs,
//!   memory descriptors over registered memory for the bulk).

mod console;
mod console_types;
mod pattern;
mod service;
mod srpc;
pub mod wire;

pub use console_types::{
    CheckSpec, ConsoleStart, LstBatchInfo, LstCommand, LstError, LstGroupInfo, LstLatency,
    LstNodeResult, LstNodeStat, LstReply, TestSpec, DEFAULT_RPC_TIMEOUT, PING_INTERVAL,
};
pub use service::{Selftest, DEFAULT_BUFFER_LIMIT, TEST_RPC_TIMEOUT};
#[cfg(test)]
pub(crate) use srpc::reply_status as wire_status;
