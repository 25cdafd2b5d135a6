//! `lnd`: everything of ulnet below the LNet layer, for one network.
//!
//! - [`wire`]: NIDs, the LNet header, the ping payload, the o2iblnd messages and socklnd's
//!   acceptor request, HELLO and KSOCK header, byte-exact with Lustre and parsed through checked
//!   views that never panic; pcap writers for both LNDs' traffic.
//! - [`time`] and [`wheel`]: our own instants (the core never reads a clock) and the hierarchical
//!   timer wheel that holds every deadline; [`handle`]: the one generational handle type every
//!   table's keys use; [`slots`]: the slab under them; [`trim`]: how tables give memory back
//!   after a burst.
//! - [`fabric`]: the boundary below the engine (actions out, events into a `FabricSink`).
//! - [`engine`]: the sans-IO o2ib LND, one `Endpoint` per NI.
//! - [`stream`]: the boundary below a streaming LND (socklnd): actions on byte streams out,
//!   events into a `StreamSink`.
//! - [`sock`]: the sans-IO socklnd engine (ksocklnd-compatible), one `SockEngine` per `tcp`
//!   NI, above `stream`.
//! - [`driver`]: what moves bytes, above the engine: `tcp` (io_uring, feature `tcp`, default) and
//!   `verbs` (rdma_cm + ibverbs, feature `verbs`), and the loop they share.
//! - `sim` (feature `sim`): the deterministic simulator, for tests and benches.
//! - [`sys`]: the only unsafe code (io_uring, verbs).
//!
//! The protocol core (wire, time, wheel, fabric, engine) never reads a clock, spawns a thread or
//! does I/O: time is passed in, actions come out (see `shared/DESIGN.md`); `module_graph` in the
//! tests checks that nothing below calls upward.

pub mod driver;
pub mod engine;
pub mod fabric;
pub mod handle;
pub mod iface;
pub mod mem;
#[cfg(feature = "sim")]
pub mod sim;
pub mod slots;
pub mod sock;
pub mod stream;
pub mod sys;
pub mod time;
pub mod trim;
pub mod wheel;
pub mod wire;
