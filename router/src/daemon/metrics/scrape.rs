//! Starting the endpoint, and what one scrape reads: the NI loops' published copies and the
//! daemon-wide counters, at scrape time, without waiting on any loop.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::info;

use super::encode::{DaemonParts, Scrape};
use super::http::{serve, wants_openmetrics, EndpointCounters};
use crate::control::ControlCounters;
use crate::yaml_config::MetricsConfig;

use super::super::state::Daemon;

/// Binds the endpoint and starts its thread; the address bound (a port 0 made real).
pub(crate) fn start(
    cfg: MetricsConfig,
    daemon: Arc<Daemon>,
    control: Arc<ControlCounters>,
) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind(cfg.listen)
        .map_err(|e| format!("metrics endpoint: cannot listen on {}: {e}", cfg.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("metrics endpoint: {e}"))?;
    let counters = Arc::new(EndpointCounters::default());
    let c = Arc::clone(&counters);
    let render = move |accept: Option<&str>| {
        let openmetrics = wants_openmetrics(accept);
        let body = scrape(&daemon, &control, &c)
            .families()
            .encode(openmetrics)
            .unwrap_or_default();
        let ctype = if openmetrics {
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        } else {
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE
        };
        (body, ctype)
    };
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || serve(listener, cfg.max_connections, counters, Arc::new(render)))
        .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    info!(listen = %addr, "metrics endpoint serving /metrics");
    Ok(addr)
}

/// Everything a scrape exports, as it is now: the NI loops' last copies, the daemon's
/// counters. Takes the NI set's lock for an `Arc` clone, each loop's slot for another.
fn scrape(daemon: &Daemon, control: &ControlCounters, ep: &EndpointCounters) -> Scrape {
    let m = daemon.set.snapshot();
    let nis = m
        .list
        .iter()
        .map(|x| (x.nid.to_string(), x.metrics.get()))
        .collect();
    let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let control = vec![
        ("accepted", ld(&control.accepted), false),
        ("active", ld(&control.active), true),
        ("refused", ld(&control.refused), false),
        ("evicted", ld(&control.evicted), false),
        ("idle_timeouts", ld(&control.idle_timeouts), false),
        ("request_timeouts", ld(&control.request_timeouts), false),
        ("oversized", ld(&control.oversized), false),
        ("bad_requests", ld(&control.bad_requests), false),
        ("accept_errors", ld(&control.accept_errors), false),
    ];
    // (family, help, labels, value); `ulnet_metrics_rejected` has a series per reason.
    let plain = |name, help, n| (name, help, Vec::new(), ld(n));
    let rejected = |reason: &str, n| {
        (
            "ulnet_metrics_rejected",
            "Requests refused, by reason",
            vec![("reason", reason.to_string())],
            ld(n),
        )
    };
    let endpoint = vec![
        plain(
            "ulnet_metrics_scrapes",
            "Scrapes answered (this one not yet counted)",
            &ep.served,
        ),
        plain(
            "ulnet_metrics_refused",
            "Connections to the endpoint closed at accept (metrics: max_connections were served)",
            &ep.refused,
        ),
        rejected("not_found", &ep.not_found),
        rejected("method", &ep.bad_method),
        rejected("malformed", &ep.malformed),
        rejected("oversized", &ep.oversized),
        plain(
            "ulnet_metrics_timeouts",
            "Clients closed for not sending their request, or not taking the answer, in time",
            &ep.timeouts,
        ),
        plain(
            "ulnet_metrics_accept_errors",
            "Failed accepts on the endpoint",
            &ep.accept_errors,
        ),
    ];
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok());
    let rss_bytes = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map(|pages| pages * rustix::param::page_size() as u64);
    Scrape {
        nis,
        daemon: DaemonParts {
            control,
            endpoint,
            rss_bytes,
            threads,
        },
        now: std::time::Instant::now(),
    }
}
