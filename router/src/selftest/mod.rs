//! lnet_selftest: the RPC protocol that the `lst` console and the kernel module `lnet_selftest`
//! speak over LNet (reference section 8), so that ulnet nodes and kernel Lustre nodes can take
//! part in the same selftest session.
//!
//! For now this is only the wire layer ([`wire`]): the 160-byte `srpc_msg` with every request
//! and reply body, the destination list a test request's bulk carries, and the bulk data check
//! patterns of the brw test. The service built on it comes later.

pub mod wire;
