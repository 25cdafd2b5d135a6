//! The operating-system layer: the only place in `lnd` with `unsafe` code.
//!
//! - [`uring`]: a small, safe ownership wrapper over the `io-uring` crate for socket I/O (the
//!   ring owns every buffer and socket address while the kernel may touch it), plus the few raw
//!   socket calls std does not offer (`socket(2)` without connecting, `TCP_USER_TIMEOUT`).
//! - `verbs` (feature `verbs`): safe owners of rdma_cm ids, event and completion channels,
//!   protection domains, completion queues, queue pairs and memory regions over `rdma-sys`; each
//!   releases its resource on drop, in the order the verbs API requires.
//! - `sockaddr`: a socket address as the C `sockaddr_storage` both of them take.
//!
//! Everything outside this module is safe Rust; `uring.rs`, `sockaddr.rs` and `verbs/` carry
//! `#![allow(unsafe_code)]` and a `// SAFETY:` comment on every unsafe block.

#[cfg(any(feature = "tcp", feature = "verbs"))]
mod sockaddr;
#[cfg(feature = "tcp")]
pub mod uring;
#[cfg(feature = "verbs")]
pub mod verbs;
