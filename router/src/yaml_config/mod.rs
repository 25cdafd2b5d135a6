//! The `lnet-router` configuration file: YAML in the shape `lnetctl export` writes (`net:` with
//! `net type`, `local NI(s)`, `tunables`, `lnd tunables`; `route:`, `routing:`, `buffers:`;
//! `global:`, `numa:` and one-NI `peer:` entries accepted), plus ours: a `fabric` key per net
//! (`tcp` when absent, `sim` or `verbs`), a `listen` address per NI, and a `peers:` list that
//! tells the fabric where a peer NID listens (both default to the NID's address and o2iblnd's
//! port 987). `udsp:`, `ip2nets:` and Multi-Rail peers are refused by name.
//!
//! ```yaml
//! net:
//!     - net type: o2ib
//!       fabric: tcp
//!       local NI(s):
//!         - nid: 10.0.0.1@o2ib
//!           listen: 127.0.0.1:9870
//!           tunables:
//!               peer_credits: 8
//!           lnd tunables:
//!               timeout: 50
//! peers:
//!     - nid: 10.0.0.2@o2ib
//!       address: 127.0.0.1:9871
//! ```
//!
//! Unknown keys and bad values are errors naming the file and the line
//! (`lnet.yaml:7: unknown key 'peer_credit' (did you mean peer_credits?)`). Keys that
//! `lnetctl export` writes but that mean nothing here (`status`, `interfaces`, `dev cpt`, `CPT`,
//! `map_on_demand`, the FMR pool sizes, `ntx`, `tos`) are accepted and ignored.
//!
//! The module by concern: `model` (the configuration the daemon uses), `raw` (the document's
//! shape as serde reads it), `lowering` (checking the one into the other, section by
//! section), `errors` (what a refusal says).

mod errors;
mod lowering;
pub(crate) use lowering::apply_acceptor;
mod model;
mod raw;

pub use crate::config::DEFAULT_PEER_TIMEOUT;
pub use errors::ConfigError;
pub use model::*;

#[cfg(test)]
mod tests;
