//! The operating-system layer: the only place in `lnd` with `unsafe` code.
//!
//! - [`uring`]: a small, safe ownership wrapper over the `io-uring` crate for socket I/O (the
//!   ring owns every buffer and socket address while the kernel may touch it), plus the few raw
//!   socket calls std does not offer (`socket(2)` without connecting, `TCP_USER_TIMEOUT`).
//!
//! Everything outside this module is safe Rust; `uring.rs` carries `#![allow(unsafe_code)]` and a
//! `// SAFETY:` comment on every unsafe block.

pub mod uring;
