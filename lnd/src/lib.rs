//! `lnd`: everything of ulnet below the LNet layer, for one network.
//!
//! - [`wire`]: NIDs, the LNet header, the ping payload and the o2iblnd messages, byte-exact with
//!   Lustre and parsed through checked views that never panic.
//! - [`time`] and [`wheel`]: our own instants (the core never reads a clock) and the hierarchical
//!   timer wheel that holds every deadline.
//!
//! The protocol core in this crate never reads a clock, spawns a thread or does I/O: time is passed
//! in, actions come out (see `shared/DESIGN.md`).

pub mod driver;
pub mod engine;
pub mod fabric;
pub mod handle;
#[cfg(feature = "sim")]
pub mod sim;
pub mod sys;
pub mod time;
pub mod wheel;
pub mod wire;
