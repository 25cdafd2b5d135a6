//! A scrape's text: every metric family built from the NI loops' snapshots and the daemon's own
//! counters ([`Scrape`]), written by `prometheus-client`'s encoders (the Prometheus text format
//! 0.0.4 by default, OpenMetrics 1.0 when asked), not by string formatting of ours.
//!
//! Names: LNet's global counters (the `stats` file Lustre keeps in debugfs) under the names of
//! HewlettPackard/lustre_exporter, which dashboards for kernel routers already query
//! (`lustre_send_count_total`, ...); everything else `ulnet_*`. docs/metrics.md lists them.

use std::sync::Arc;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::snapshot::NiSnapshot;

/// A sample's labels, in order.
pub(crate) type Labels = Vec<(&'static str, String)>;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Value {
    Counter(u64),
    Gauge(i64),
    Float(f64),
}

/// One metric family: its name (a counter's without `_total`: the encoder adds it), help and
/// samples.
#[derive(Debug)]
pub(crate) struct Family {
    pub(crate) name: String,
    pub(crate) help: String,
    pub(crate) counter: bool,
    pub(crate) samples: Vec<(Labels, Value)>,
}

/// Every family of one scrape, in the order they are written.
#[derive(Debug, Default)]
pub(crate) struct Families(pub(crate) Vec<Family>);

impl Families {
    fn family(&mut self, name: &str, help: &str, counter: bool) -> &mut Family {
        if let Some(i) = self.0.iter().position(|f| f.name == name) {
            return &mut self.0[i];
        }
        self.0.push(Family {
            name: name.to_string(),
            help: help.to_string(),
            counter,
            samples: Vec::new(),
        });
        let last = self.0.len() - 1;
        &mut self.0[last]
    }

    pub(crate) fn counter(&mut self, name: &str, help: &str, l: Labels, v: u64) {
        self.family(name, help, true)
            .samples
            .push((l, Value::Counter(v)));
    }

    pub(crate) fn gauge(&mut self, name: &str, help: &str, l: Labels, v: i64) {
        self.family(name, help, false)
            .samples
            .push((l, Value::Gauge(v)));
    }

    pub(crate) fn float(&mut self, name: &str, help: &str, l: Labels, v: f64) {
        self.family(name, help, false)
            .samples
            .push((l, Value::Float(v)));
    }

    /// A family written (its HELP and TYPE) even when it has no sample: a router without
    /// routes still declares `ulnet_route_up`, so that a query or an alert on it finds the
    /// name, and "none" is told from "not exported".
    pub(crate) fn declare(&mut self, name: &str, help: &str, counter: bool) {
        self.family(name, help, counter);
    }

    /// The text of these families: OpenMetrics 1.0 (`openmetrics`) or Prometheus 0.0.4.
    pub(crate) fn encode(self, openmetrics: bool) -> Result<String, std::fmt::Error> {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(self));
        let mut out = String::new();
        if openmetrics {
            prometheus_client::encoding::text::encode(&mut out, &reg)?;
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &reg)?;
        }
        Ok(out)
    }
}

impl Collector for Families {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let kind = match f.counter {
                true => MetricType::Counter,
                false => MetricType::Gauge,
            };
            let mut me = enc.encode_descriptor(&f.name, &f.help, None, kind)?;
            for (labels, v) in &f.samples {
                let m = me.encode_family(labels)?;
                match *v {
                    Value::Counter(x) => ConstCounter::new(x).encode(m)?,
                    Value::Gauge(x) => ConstGauge::new(x).encode(m)?,
                    Value::Float(x) => ConstGauge::new(x).encode(m)?,
                }
            }
        }
        Ok(())
    }
}

/// The daemon-wide parts of a scrape, read at scrape time without waiting on any NI loop.
#[derive(Debug, Default)]
pub(crate) struct DaemonParts {
    /// The control socket's counters, by `stats show`'s names (`control:`), and which of them
    /// are gauges.
    pub(crate) control: Vec<(&'static str, u64, bool)>,
    /// The endpoint's own counters: name, help, value.
    pub(crate) endpoint: Vec<(&'static str, &'static str, Labels, u64)>,
    /// Bytes resident (/proc/self/statm) and threads (/proc/self/status), if readable.
    pub(crate) rss_bytes: Option<u64>,
    pub(crate) threads: Option<u64>,
}

/// What one scrape exports: each NI loop's last snapshot (with its NID), the daemon's parts.
pub(crate) struct Scrape {
    pub(crate) nis: Vec<(String, Option<Arc<NiSnapshot>>)>,
    pub(crate) daemon: DaemonParts,
    pub(crate) now: Instant,
}

fn l(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

fn gauge_i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `stats show`'s fields exported under the Lustre exporter's names: (lnetctl field, name).
pub(crate) const LUSTRE_NAMES: [(&str, &str, &str); 9] = [
    (
        "errors",
        "lustre_errors",
        "LNet messages that ended in an error",
    ),
    ("send_count", "lustre_send_count", "LNet messages sent"),
    (
        "recv_count",
        "lustre_receive_count",
        "LNet messages received",
    ),
    ("route_count", "lustre_route_count", "LNet messages routed"),
    ("drop_count", "lustre_drop_count", "LNet messages dropped"),
    (
        "send_length",
        "lustre_send_bytes",
        "LNet payload bytes sent",
    ),
    (
        "recv_length",
        "lustre_receive_bytes",
        "LNet payload bytes received",
    ),
    (
        "route_length",
        "lustre_route_bytes",
        "LNet payload bytes routed",
    ),
    (
        "drop_length",
        "lustre_drop_bytes",
        "LNet payload bytes dropped",
    ),
];

/// The families that have no sample on some daemons (no route, no gateway, no peer yet), with
/// the help their samples would bring; declared first so their names are always there.
const SOMETIMES_EMPTY: [(&str, &str, bool); 6] = [
    (
        "ulnet_route_up",
        "1 while the route is up, 0 while down (route show -v: state)",
        false,
    ),
    (
        "ulnet_gateway_alive",
        "1 while the router pinger finds the gateway alive",
        false,
    ),
    (
        "ulnet_peer_up",
        "1 while the peer NI is up (peer show: state), top peers only",
        false,
    ),
    (
        "ulnet_peer_send_count",
        "Messages sent to the peer NI (peer show -v: send_count)",
        true,
    ),
    (
        "ulnet_lnd_conns",
        "The LND's connections by state now (conn show)",
        false,
    ),
    (
        "ulnet_fwd_dropped",
        "Messages accepted for forwarding and dropped, by reason (forwarding: dropped_by_reason)",
        true,
    ),
];

impl Scrape {
    pub(crate) fn families(&self) -> Families {
        let mut f = Families::default();
        for (name, help, counter) in SOMETIMES_EMPTY {
            f.declare(name, help, counter);
        }
        let snaps: Vec<(&str, &NiSnapshot)> = self
            .nis
            .iter()
            .filter_map(|(nid, s)| s.as_deref().map(|s| (nid.as_str(), s)))
            .collect();
        self.lnet_globals(&mut f, &snaps);
        for (nid, s) in &snaps {
            self.ni(&mut f, nid, s);
        }
        routes(&mut f, &snaps);
        self.daemon_parts(&mut f);
        f
    }

    /// `stats show`, summed over the NI loops as `lnetctl stats show` sums them.
    fn lnet_globals(&self, f: &mut Families, snaps: &[(&str, &NiSnapshot)]) {
        let mut sum: Option<crate::control::StatsShow> = None;
        for (_, s) in snaps {
            sum = Some(match sum {
                Some(a) => super::snapshot::sum_stats(a, s.stats.clone()),
                None => s.stats.clone(),
            });
        }
        let sum = sum.unwrap_or_default();
        let st = &sum.statistics;
        f.gauge(
            "lustre_allocated",
            "LNet messages held now (stats show: msgs_alloc)",
            Vec::new(),
            gauge_i(st.msgs_alloc),
        );
        f.gauge(
            "lustre_maximum",
            "The most LNet messages held at once since the last stats reset (msgs_max)",
            Vec::new(),
            gauge_i(st.msgs_max),
        );
        let fields = serde_json::to_value(st).unwrap_or_default();
        let fields = fields.as_object().cloned().unwrap_or_default();
        for (field, name, help) in LUSTRE_NAMES {
            let v = fields.get(field).and_then(|v| v.as_u64()).unwrap_or(0);
            f.counter(
                name,
                &format!("{help} (stats show: {field})"),
                Vec::new(),
                v,
            );
        }
        // The rest of `stats show` under its own field names.
        for (field, v) in &fields {
            if LUSTRE_NAMES.iter().any(|(x, _, _)| x == field)
                || ["msgs_alloc", "msgs_max", "rst_alloc"].contains(&field.as_str())
            {
                continue;
            }
            let name = format!("ulnet_lnet_{}", field.trim_end_matches("_count"));
            f.counter(
                &name,
                &format!("stats show: {field}"),
                Vec::new(),
                v.as_u64().unwrap_or(0),
            );
        }
        for (k, v) in sum.peer_table.map(|t| t.0).unwrap_or_default() {
            if k == "peers" {
                f.gauge(
                    "ulnet_lnet_peers",
                    "Peer NIs LNet knows now (stats show: peer_table: peers)",
                    Vec::new(),
                    gauge_i(v),
                );
            } else {
                f.counter(
                    &format!("ulnet_lnet_{k}"),
                    &format!("stats show: peer_table: {k}"),
                    Vec::new(),
                    v,
                );
            }
        }
        let (p, n) = snaps.iter().fold((0, 0), |(p, n), (_, s)| {
            (p + s.peers_in_recovery, n + s.nis_in_recovery)
        });
        f.gauge(
            "ulnet_peer_ni_recovery",
            "Peer NIs in LNet health recovery now (debug recovery --peer)",
            Vec::new(),
            gauge_i(p),
        );
        f.gauge(
            "ulnet_ni_recovery",
            "Local NIs in LNet health recovery now (debug recovery --local)",
            Vec::new(),
            gauge_i(n),
        );
        let enabled = snaps
            .iter()
            .map(|(_, s)| s.routing.enable)
            .max()
            .unwrap_or(0);
        f.gauge(
            "ulnet_routing_enabled",
            "1 while the daemon forwards for others (routing show: enable)",
            Vec::new(),
            i64::from(enabled),
        );
    }

    /// One NI loop's series, each labelled with its NI and net.
    fn ni(&self, f: &mut Families, nid: &str, s: &NiSnapshot) {
        let net = nid.split('@').nth(1).unwrap_or("");
        let base = l(&[("ni", nid), ("net", net)]);
        f.float(
            "ulnet_ni_snapshot_age_seconds",
            "Seconds since this NI's loop last published its counters (at most about 1 s while \
             it runs; growing: the loop is stuck)",
            base.clone(),
            self.now.saturating_duration_since(s.taken).as_secs_f64(),
        );
        let fw = &s.routing.forwarding;
        for (name, help, v) in [
            ("ulnet_fwd_received", "Messages accepted for forwarding (routing show: forwarding: received)", fw.received),
            ("ulnet_fwd_forwarded", "Messages forwarded (forwarding: forwarded)", fw.forwarded),
            ("ulnet_fwd_forwarded_bytes", "Payload bytes forwarded (forwarding: forwarded_bytes)", fw.forwarded_bytes),
            ("ulnet_fwd_waited_rtr_credit", "Forwards that waited for a peer's router credit (forwarding: waited_rtr_credit)", fw.waited_rtr_credit),
            ("ulnet_fwd_waited_buffer", "Forwards that waited for a router buffer (forwarding: waited_buffer)", fw.waited_buffer),
            ("ulnet_fwd_waited_unproven", "Bulk PUTs that waited in the unproven senders' share (forwarding: waited_unproven)", fw.waited_unproven),
            ("ulnet_fwd_scrubbed", "Large buffers scrubbed before reuse (forwarding: scrubbed)", fw.scrubbed),
            ("ulnet_fwd_scrubbed_bytes", "Bytes scrubbed (forwarding: scrubbed_bytes)", fw.scrubbed_bytes),
        ] {
            f.counter(name, help, base.clone(), v);
        }
        f.gauge(
            "ulnet_fwd_in_flight",
            "Messages being forwarded now (forwarding: in_flight)",
            base.clone(),
            gauge_i(fw.in_flight),
        );
        for (reason, v) in &fw.dropped_by_reason {
            let mut lb = base.clone();
            lb.push(("reason", reason.clone()));
            f.counter(
                "ulnet_fwd_dropped",
                "Messages accepted for forwarding and dropped, by reason (forwarding: dropped_by_reason)",
                lb,
                *v,
            );
        }
        for cpt in &s.routing.cpts {
            for (pool, p) in [
                ("tiny", &cpt.tiny),
                ("small", &cpt.small),
                ("large", &cpt.large),
            ] {
                let mut lb = base.clone();
                lb.push(("pool", pool.to_string()));
                for (name, help, v) in [
                    ("ulnet_rtr_buffers", "Router buffers in the pool (routing show: nbuffers)", i64::from(p.nbuffers)),
                    ("ulnet_rtr_buffer_pages", "Pages per router buffer (routing show: npages)", i64::from(p.npages)),
                    ("ulnet_rtr_credits", "Router buffer credits now; negative: forwards waiting (routing show: credits)", p.credits),
                    ("ulnet_rtr_min_credits", "Low-water mark of the credits; below 0: the pool ran out (routing show: mincredits)", p.mincredits),
                ] {
                    f.gauge(name, help, lb.clone(), v);
                }
            }
        }
        for ni in &s.nis {
            let nid = ni.nid.to_string();
            let net = ni.nid.net().to_string();
            let nl = l(&[("ni", &nid), ("net", &net)]);
            f.gauge(
                "ulnet_ni_up",
                "1 while the NI is up (net show: status)",
                nl.clone(),
                i64::from(ni.status == "up"),
            );
            for (name, help, v) in [
                (
                    "ulnet_ni_credits",
                    "The NI's credits tunable (net show: tunables: credits)",
                    i64::from(ni.credits),
                ),
                (
                    "ulnet_ni_peer_credits",
                    "The NI's peer_credits tunable",
                    i64::from(ni.peer_credits),
                ),
                (
                    "ulnet_ni_tx_credits",
                    "NI tx credits now; negative: sends waiting (net show -v: tx credits)",
                    ni.available_tx_credits,
                ),
                (
                    "ulnet_ni_min_tx_credits",
                    "Low-water mark of the NI's tx credits (net show -v)",
                    ni.min_tx_credits,
                ),
                (
                    "ulnet_ni_health_value",
                    "LNet health of the NI (net show -v: health value)",
                    i64::from(ni.health.value),
                ),
                (
                    "ulnet_ni_lnd_peers",
                    "Peers the NI's LND has",
                    gauge_i(ni.lnd_peers as u64),
                ),
            ] {
                f.gauge(name, help, nl.clone(), v);
            }
            for (name, help, v) in [
                (
                    "ulnet_ni_send_count",
                    "Messages sent through the NI (net show: statistics: send_count)",
                    ni.send_count,
                ),
                (
                    "ulnet_ni_receive_count",
                    "Messages received on the NI (statistics: recv_count)",
                    ni.recv_count,
                ),
                (
                    "ulnet_ni_drop_count",
                    "Messages dropped on the NI (statistics: drop_count)",
                    ni.drop_count,
                ),
                (
                    "ulnet_ni_health_interrupts",
                    "Local interrupts (net show -v: health stats: interrupts)",
                    ni.hstats.interrupts,
                ),
                (
                    "ulnet_ni_health_dropped",
                    "Local drops (health stats: dropped)",
                    ni.hstats.dropped,
                ),
                (
                    "ulnet_ni_health_aborted",
                    "Local aborts (health stats: aborted)",
                    ni.hstats.aborted,
                ),
                (
                    "ulnet_ni_health_no_route",
                    "No route (health stats: no route)",
                    ni.hstats.no_route,
                ),
                (
                    "ulnet_ni_health_timeouts",
                    "Local timeouts (health stats: timeouts)",
                    ni.hstats.timeouts,
                ),
                (
                    "ulnet_ni_health_error",
                    "Local errors (health stats: error)",
                    ni.hstats.error,
                ),
            ] {
                f.counter(name, help, nl.clone(), v);
            }
            let lnd_counters = match &ni.lnd {
                lnd::iface::LndInfo::O2ib { stats, .. } => {
                    Some((crate::control::LndCounters::from_stats(stats), "o2ib"))
                }
                lnd::iface::LndInfo::Sock { stats, .. } => Some((
                    crate::control::LndCounters::from_sock_stats(stats),
                    "socklnd",
                )),
                lnd::iface::LndInfo::Plain { .. } => None,
            };
            if let Some((c, lnd_name)) = lnd_counters {
                let ll = l(&[("ni", &nid), ("net", &net), ("lnd", lnd_name)]);
                // socklnd's last two are gauges (connections, unauthenticated sockets now):
                // the connections go out by state below, the rest as a gauge of its own.
                for (k, v) in c.counters.0.iter().filter(|(k, _)| k != "conns") {
                    if k == "unauthenticated" {
                        f.gauge(
                            "ulnet_lnd_unauthenticated",
                            "Accepted connections whose HELLO is not in yet (socklnd)",
                            ll.clone(),
                            gauge_i(*v),
                        );
                        continue;
                    }
                    f.counter(
                        &format!("ulnet_lnd_{k}"),
                        &format!("The LND's {k} (net show -v: lnd statistics: {k})"),
                        ll.clone(),
                        *v,
                    );
                }
                for (name, t) in [
                    ("ulnet_lnd_rejects_sent", &c.rejects_sent),
                    ("ulnet_lnd_rejects_received", &c.rejects_received),
                ] {
                    for (reason, v) in &t.0 {
                        let mut lb = ll.clone();
                        lb.push(("reason", reason.clone()));
                        f.counter(
                            name,
                            "Connection rejects by reason (lnd statistics: rejects_sent / rejects_received)",
                            lb,
                            *v,
                        );
                    }
                }
                for (state, n) in &s.conns {
                    let mut lb = ll.clone();
                    lb.push(("state", state.clone()));
                    f.gauge(
                        "ulnet_lnd_conns",
                        "The LND's connections by state now (conn show)",
                        lb,
                        gauge_i(*n),
                    );
                }
            }
        }
        let fl = {
            let mut lb = base.clone();
            lb.push(("fabric", s.fabric.to_string()));
            lb
        };
        for (k, v) in &s.fabric_counters {
            f.counter(
                &format!("ulnet_fabric_{k}"),
                &format!("The fabric's {k} (net show -v: fabric: {k})"),
                fl.clone(),
                *v,
            );
        }
        for g in &s.gateways {
            let gl = l(&[("ni", nid), ("gateway", &g.nid.to_string())]);
            f.gauge(
                "ulnet_gateway_alive",
                "1 while the router pinger finds the gateway alive",
                gl.clone(),
                i64::from(g.alive),
            );
            for (name, help, v) in [
                (
                    "ulnet_gateway_pings",
                    "Router pings sent to the gateway",
                    g.pings,
                ),
                (
                    "ulnet_gateway_ping_failures",
                    "Router pings to the gateway that failed",
                    g.ping_failures,
                ),
                (
                    "ulnet_gateway_downs",
                    "Times the gateway was marked down",
                    g.downs,
                ),
                (
                    "ulnet_gateway_ups",
                    "Times the gateway was marked up",
                    g.ups,
                ),
            ] {
                f.counter(name, help, gl.clone(), v);
            }
        }
        for p in &s.top_peers {
            let pl = l(&[("ni", nid), ("peer", &p.nid.to_string())]);
            f.gauge(
                "ulnet_peer_up",
                "1 while the peer NI is up (peer show: state), top peers only",
                pl.clone(),
                i64::from(p.state == crate::PeerState::Up),
            );
            for (name, help, v) in [
                (
                    "ulnet_peer_tx_credits",
                    "Peer tx credits now (peer show -v: available_tx_credits)",
                    p.available_tx_credits,
                ),
                (
                    "ulnet_peer_min_tx_credits",
                    "Low-water mark of the peer tx credits (min_tx_credits)",
                    p.min_tx_credits,
                ),
                (
                    "ulnet_peer_rtr_credits",
                    "Peer router credits now (available_rtr_credits)",
                    p.available_rtr_credits,
                ),
                (
                    "ulnet_peer_min_rtr_credits",
                    "Low-water mark of the peer router credits (min_rtr_credits)",
                    p.min_rtr_credits,
                ),
                (
                    "ulnet_peer_health_value",
                    "LNet health of the peer NI (health stats: health value)",
                    i64::from(p.health.value),
                ),
            ] {
                f.gauge(name, help, pl.clone(), v);
            }
            for (name, help, v) in [
                (
                    "ulnet_peer_send_count",
                    "Messages sent to the peer NI (peer show -v: send_count)",
                    p.send_count,
                ),
                (
                    "ulnet_peer_receive_count",
                    "Messages received from the peer NI (recv_count)",
                    p.recv_count,
                ),
                (
                    "ulnet_peer_drop_count",
                    "Messages from the peer NI dropped (drop_count)",
                    p.drop_count,
                ),
            ] {
                f.counter(name, help, pl.clone(), v);
            }
        }
    }

    fn daemon_parts(&self, f: &mut Families) {
        let d = &self.daemon;
        f.gauge(
            "ulnet_nis",
            "NIs the daemon runs now",
            Vec::new(),
            gauge_i(self.nis.len() as u64),
        );
        for (k, v, gauge) in &d.control {
            let help = format!("The control socket's {k} (stats show: control: {k})");
            let name = format!("ulnet_control_{k}");
            if *gauge {
                f.gauge(&name, &help, Vec::new(), gauge_i(*v));
            } else {
                f.counter(&name, &help, Vec::new(), *v);
            }
        }
        for (name, help, labels, v) in &d.endpoint {
            f.counter(name, help, labels.clone(), *v);
        }
        if let Some(v) = d.rss_bytes {
            f.gauge(
                "ulnet_process_resident_memory_bytes",
                "The daemon's resident memory (/proc/self/statm)",
                Vec::new(),
                gauge_i(v),
            );
        }
        if let Some(v) = d.threads {
            f.gauge(
                "ulnet_process_threads",
                "The daemon's threads (/proc/self/status)",
                Vec::new(),
                gauge_i(v),
            );
        }
    }
}

/// Every route once, its state from the loop that watches its gateway (as `route show`).
fn routes(f: &mut Families, snaps: &[(&str, &NiSnapshot)]) {
    let mut all: Vec<crate::control::RouteEntry> = Vec::new();
    for (_, s) in snaps {
        for r in &s.routes {
            match all
                .iter_mut()
                .find(|x| x.net == r.net && x.gateway == r.gateway)
            {
                Some(x) if x.state.is_none() => x.state = r.state.clone(),
                Some(_) => {}
                None => all.push(r.clone()),
            }
        }
    }
    for r in all {
        let rl = l(&[("net", &r.net), ("gateway", &r.gateway)]);
        f.gauge(
            "ulnet_route_up",
            "1 while the route is up, 0 while down (route show -v: state)",
            rl.clone(),
            i64::from(r.state.as_deref() == Some("up")),
        );
        f.gauge(
            "ulnet_route_hops",
            "The route's hop count; -1: undefined (route show -v: hop)",
            rl.clone(),
            r.hop.unwrap_or(-1),
        );
        f.gauge(
            "ulnet_route_priority",
            "The route's priority (route show -v: priority)",
            rl,
            i64::from(r.priority.unwrap_or(0)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Families {
        let mut f = Families::default();
        f.counter("lustre_send_count", "sent", Vec::new(), 7);
        f.counter(
            "ulnet_fwd_dropped",
            "dropped",
            vec![
                ("ni", "10.0.0.1@o2ib".into()),
                ("reason", "no_route".into()),
            ],
            2,
        );
        f.gauge(
            "ulnet_rtr_min_credits",
            "min",
            vec![("pool", "tiny".into())],
            -3,
        );
        f.float("ulnet_ni_snapshot_age_seconds", "age", Vec::new(), 0.5);
        f
    }

    /// The 0.0.4 text: a counter's family is named with its `_total`, no `# EOF`; OpenMetrics:
    /// the family without it, the sample with it, and `# EOF` last.
    #[test]
    fn both_text_formats_come_from_the_client_library() {
        let p = sample().encode(false).unwrap();
        assert!(
            p.contains("# TYPE lustre_send_count_total counter\nlustre_send_count_total 7\n"),
            "{p}"
        );
        assert!(
            p.contains("ulnet_fwd_dropped_total{ni=\"10.0.0.1@o2ib\",reason=\"no_route\"} 2\n"),
            "{p}"
        );
        assert!(
            p.contains(
                "# TYPE ulnet_rtr_min_credits gauge\nulnet_rtr_min_credits{pool=\"tiny\"} -3\n"
            ),
            "{p}"
        );
        assert!(p.contains("ulnet_ni_snapshot_age_seconds 0.5\n"), "{p}");
        assert!(!p.contains("# EOF"), "{p}");
        let o = sample().encode(true).unwrap();
        assert!(
            o.contains("# TYPE lustre_send_count counter\nlustre_send_count_total 7\n"),
            "{o}"
        );
        assert!(o.ends_with("# EOF\n"), "{o}");
    }

    /// A loop that stopped publishing (wedged) shows as the age of its last copy, read
    /// without it; a loop that never published has no series, and the scrape still answers.
    #[test]
    fn a_stuck_loop_shows_as_its_snapshot_age() {
        let now = Instant::now();
        let taken = now.checked_sub(std::time::Duration::from_secs(42)).unwrap();
        let snap = NiSnapshot {
            taken,
            fabric: "tcp",
            stats: Default::default(),
            routing: Default::default(),
            nis: Vec::new(),
            fabric_counters: vec![("accepted", 3)],
            routes: Vec::new(),
            gateways: Vec::new(),
            conns: Vec::new(),
            top_peers: Vec::new(),
            peers_in_recovery: 1,
            nis_in_recovery: 0,
        };
        let s = Scrape {
            nis: vec![
                ("10.0.0.1@o2ib".into(), Some(Arc::new(snap))),
                ("10.0.0.2@o2ib".into(), None),
            ],
            daemon: DaemonParts::default(),
            now,
        };
        let text = s.families().encode(false).unwrap();
        assert!(
            text.contains(
                "ulnet_ni_snapshot_age_seconds{ni=\"10.0.0.1@o2ib\",net=\"o2ib\"} 42.0\n"
            ),
            "{text}"
        );
        assert!(!text.contains("ni=\"10.0.0.2@o2ib\""), "{text}");
        assert!(
            text.contains(
                "ulnet_fabric_accepted_total{ni=\"10.0.0.1@o2ib\",net=\"o2ib\",fabric=\"tcp\"} 3\n"
            ),
            "{text}"
        );
        assert!(text.contains("ulnet_peer_ni_recovery 1\n"), "{text}");
        assert!(text.contains("ulnet_nis 2\n"), "{text}");
        // Declared with no sample: the name is there for a query.
        assert!(text.contains("# TYPE ulnet_route_up gauge\n"), "{text}");
    }

    /// A label value with a quote, a backslash or a newline (a NID never has one, a reason
    /// string might) is escaped, not written raw.
    #[test]
    fn label_values_are_escaped() {
        let mut f = Families::default();
        f.gauge("x", "h", vec![("a", "q\"b\\n\nl".into())], 1);
        let p = f.encode(false).unwrap();
        assert!(p.contains(r#"x{a="q\"b\\n\nl"} 1"#), "{p}");
    }
}
