//! The daemon's metrics endpoint (issue 36; docs/metrics.md): `GET /metrics` in the Prometheus
//! text format (0.0.4) or OpenMetrics, off unless `metrics: listen:` or `--metrics-listen`
//! names an address.
//!
//! Off the data path: each NI loop copies its counters at most once a second into a slot of
//! its own ([`snapshot`]); a scrape reads those copies and the daemon-wide parts (the control
//! socket's counters, the process's memory and threads), never asking a loop anything, so a
//! scrape never waits on an NI and a stuck NI shows as a growing snapshot age. The HTTP side
//! ([`http`]) runs on threads of its own with its own bounds.

pub(super) mod snapshot;

#[cfg(feature = "metrics")]
mod encode;
#[cfg(feature = "metrics")]
mod http;
#[cfg(feature = "metrics")]
mod scrape;

#[cfg(feature = "metrics")]
pub(super) use self::scrape::start;
