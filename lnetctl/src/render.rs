//! YAML in real lnetctl's layout (reference section 7): four-space indentation, `- ` list items,
//! the same key names. Written by hand so the layout is exactly lnetctl's.

use std::fmt::Write;

use router::control::{
    ConnShow, Counts, GlobalShow, NamedCounters, NetShow, PeerShow, PingShow, PoolShow, Response,
    RouteShow, RoutingShow, StatsShow,
};

use crate::capture::Report;

/// Renders any successful response; `None` for an error response.
pub fn yaml(resp: &Response) -> Option<String> {
    Some(match resp {
        Response::Ping(p) => ping(p),
        Response::Net(n) => net(n),
        Response::Peer(p) => peer(p),
        Response::Conn(c) => conn(c),
        Response::Stats(s) => stats(s),
        Response::Global(g) => global(g),
        Response::Route(r) => route(r),
        Response::Routing(r) => routing(r),
        Response::Selftest(r) => crate::selftest::render_reply(r),
        Response::Done => String::new(),
        // The capture's stream is written by `capture`, not rendered.
        Response::CaptureStarted(_)
        | Response::CaptureData(_)
        | Response::CaptureDone(_)
        | Response::Error(_) => return None,
    })
}

/// The data of a response as pretty JSON (the same keys as the YAML); `None` for an error.
pub fn json(resp: &Response) -> Option<String> {
    let r = match resp {
        Response::Ping(p) => serde_json::to_string_pretty(p),
        Response::Net(n) => serde_json::to_string_pretty(n),
        Response::Peer(p) => serde_json::to_string_pretty(p),
        Response::Conn(c) => serde_json::to_string_pretty(c),
        Response::Stats(s) => serde_json::to_string_pretty(s),
        Response::Global(g) => serde_json::to_string_pretty(g),
        Response::Route(r) => serde_json::to_string_pretty(r),
        Response::Routing(r) => serde_json::to_string_pretty(r),
        Response::Selftest(r) => serde_json::to_string_pretty(r),
        Response::Done => return Some(String::new()),
        Response::CaptureStarted(_)
        | Response::CaptureData(_)
        | Response::CaptureDone(_)
        | Response::Error(_) => return None,
    };
    r.ok().map(|mut s| {
        s.push('\n');
        s
    })
}

fn counts(out: &mut String, indent: &str, c: &Counts) {
    let _ = writeln!(out, "{indent}statistics:");
    let _ = writeln!(out, "{indent}    send_count: {}", c.send_count);
    let _ = writeln!(out, "{indent}    recv_count: {}", c.recv_count);
    let _ = writeln!(out, "{indent}    drop_count: {}", c.drop_count);
}

/// `ping:` for the peers that answered, `manage:` for the failures.
pub fn ping(p: &PingShow) -> String {
    let mut out = String::new();
    if !p.ping.is_empty() {
        out.push_str("ping:\n");
        for peer in &p.ping {
            let _ = writeln!(out, "    - primary nid: {}", peer.primary_nid);
            let _ = writeln!(out, "      Multi-Rail: {}", peer.multi_rail);
            if peer.peer_ni.is_empty() {
                out.push_str("      peer_ni: []\n");
            } else {
                out.push_str("      peer_ni:\n");
                for nid in &peer.peer_ni {
                    let _ = writeln!(out, "        - nid: {nid}");
                }
            }
        }
    }
    if !p.manage.is_empty() {
        out.push_str("manage:\n");
        for f in &p.manage {
            out.push_str("    - ping:\n");
            let _ = writeln!(out, "          errno: {}", f.errno);
            let _ = writeln!(out, "          descr: {}", f.descr);
        }
    }
    out
}

/// `net:` with `net type` and `local NI(s)`; statistics and tunables with `-v`.
pub fn net(n: &NetShow) -> String {
    let mut out = String::from("net:\n");
    for net in &n.net {
        let _ = writeln!(out, "    - net type: {}", net.net_type);
        out.push_str("      local NI(s):\n");
        for ni in &net.local_nis {
            let _ = writeln!(out, "        - nid: {}", ni.nid);
            let _ = writeln!(out, "          status: {}", ni.status);
            if let Some(c) = &ni.statistics {
                counts(&mut out, "          ", c);
            }
            if let Some(t) = &ni.tunables {
                out.push_str("          tunables:\n");
                let _ = writeln!(out, "              peer_timeout: {}", t.peer_timeout);
                let _ = writeln!(out, "              peer_credits: {}", t.peer_credits);
                let _ = writeln!(
                    out,
                    "              peer_buffer_credits: {}",
                    t.peer_buffer_credits
                );
                let _ = writeln!(out, "              credits: {}", t.credits);
            }
            if let Some(l) = &ni.lnd_tunables {
                out.push_str("          lnd tunables:\n");
                let _ = writeln!(out, "              peercredits_hiw: {}", l.peercredits_hiw);
                let _ = writeln!(
                    out,
                    "              concurrent_sends: {}",
                    l.concurrent_sends
                );
                let _ = writeln!(out, "              timeout: {}", l.timeout);
                let _ = writeln!(out, "              keepalive: {}", l.keepalive);
            }
            if let Some(l) = &ni.lnd_statistics {
                out.push_str("          lnd statistics:\n");
                named(&mut out, "              ", &l.counters);
                out.push_str("              rejects_sent:\n");
                named(&mut out, "                  ", &l.rejects_sent);
                out.push_str("              rejects_received:\n");
                named(&mut out, "                  ", &l.rejects_received);
            }
            if let Some(f) = &ni.fabric {
                out.push_str("          fabric:\n");
                let _ = writeln!(out, "              type: {}", f.kind);
                named(&mut out, "              ", &f.counters);
            }
            if let Some(u) = &ni.ulnet {
                out.push_str("          ulnet:\n");
                if let Some(l) = &u.listen {
                    let _ = writeln!(out, "              listen: {l}");
                }
                let _ = writeln!(out, "              checksum: {}", u.checksum);
                let _ = writeln!(
                    out,
                    "              checksum default: {}",
                    u.checksum_default
                );
                let _ = writeln!(out, "              race order: {}", u.race_order);
                let _ = writeln!(out, "              peer limit: {}", u.peer_limit);
                let _ = writeln!(out, "              peers: {}", u.peers);
            }
        }
    }
    out
}

fn named(out: &mut String, indent: &str, c: &NamedCounters) {
    for (k, v) in &c.0 {
        let _ = writeln!(out, "{indent}{k}: {v}");
    }
}

/// `capture:`, what `lnetctl capture` prints when it ends.
pub fn capture_yaml(r: &Report) -> String {
    let mut out = String::from("capture:\n");
    let _ = writeln!(out, "    file: {}", r.file);
    let _ = writeln!(out, "    captured: {}", r.captured);
    match r.dropped {
        Some(d) => {
            let _ = writeln!(out, "    dropped: {d}");
        }
        None => out.push_str("    dropped: unknown\n"),
    }
    let _ = writeln!(out, "    seconds: {:.1}", r.seconds);
    let _ = writeln!(out, "    reason: {}", r.reason);
    out
}

/// The same as JSON: `{"capture": {...}}`.
pub fn capture_json(r: &Report) -> String {
    let v = serde_json::json!({ "capture": r });
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
    s.push('\n');
    s
}

/// `peer:` with `primary nid`, `Multi-Rail` and `peer ni`; credits and statistics with `-v`.
pub fn peer(p: &PeerShow) -> String {
    if p.peer.is_empty() {
        return "peer: []\n".into();
    }
    let mut out = String::from("peer:\n");
    for peer in &p.peer {
        let _ = writeln!(out, "    - primary nid: {}", peer.primary_nid);
        let _ = writeln!(out, "      Multi-Rail: {}", peer.multi_rail);
        out.push_str("      peer ni:\n");
        for ni in &peer.peer_ni {
            let _ = writeln!(out, "        - nid: {}", ni.nid);
            let _ = writeln!(out, "          state: {}", ni.state);
            if let Some(d) = &ni.detail {
                let i = "          ";
                let _ = writeln!(out, "{i}max_ni_tx_credits: {}", d.max_ni_tx_credits);
                let _ = writeln!(out, "{i}available_tx_credits: {}", d.available_tx_credits);
                let _ = writeln!(out, "{i}min_tx_credits: {}", d.min_tx_credits);
                let _ = writeln!(out, "{i}tx_q_num_of_buf: {}", d.tx_q_num_of_buf);
                let _ = writeln!(out, "{i}available_rtr_credits: {}", d.available_rtr_credits);
                let _ = writeln!(out, "{i}min_rtr_credits: {}", d.min_rtr_credits);
                counts(&mut out, i, &d.statistics);
            }
        }
    }
    out
}

/// `conn:` (ours): one entry per LND connection.
pub fn conn(c: &ConnShow) -> String {
    if c.conn.is_empty() {
        return "conn: []\n".into();
    }
    let mut out = String::from("conn:\n");
    for e in &c.conn {
        let _ = writeln!(out, "    - ni: {}", e.ni);
        let i = "      ";
        let _ = writeln!(out, "{i}peer: {}", e.peer);
        let _ = writeln!(out, "{i}state: {}", e.state);
        let _ = writeln!(out, "{i}side: {}", e.side);
        let _ = writeln!(out, "{i}credits: {}", e.credits);
        let _ = writeln!(out, "{i}outstanding_credits: {}", e.outstanding_credits);
        let _ = writeln!(out, "{i}reserved_credits: {}", e.reserved_credits);
        let _ = writeln!(out, "{i}queue_depth: {}", e.queue_depth);
        let _ = writeln!(out, "{i}sends_posted: {}", e.sends_posted);
        let _ = writeln!(out, "{i}queued: {}", e.queued);
        let _ = writeln!(out, "{i}races: {}", e.races);
        let _ = writeln!(out, "{i}incarnation: {}", e.incarnation);
        let _ = writeln!(out, "{i}age_ms: {}", e.age_ms);
    }
    out
}

/// `statistics:`, in lnetctl's order.
pub fn stats(st: &StatsShow) -> String {
    let s = &st.statistics;
    // lnetctl's keys in its order (liblnetconfig.c), then ours.
    let fields: [(&str, u64); 28] = [
        ("msgs_alloc", s.msgs_alloc),
        ("msgs_max", s.msgs_max),
        ("rst_alloc", s.rst_alloc),
        ("errors", s.errors),
        ("send_count", s.send_count),
        ("resend_count", s.resend_count),
        ("response_timeout_count", s.response_timeout_count),
        ("local_interrupt_count", s.local_interrupt_count),
        ("local_dropped_count", s.local_dropped_count),
        ("local_aborted_count", s.local_aborted_count),
        ("local_no_route_count", s.local_no_route_count),
        ("local_timeout_count", s.local_timeout_count),
        ("local_error_count", s.local_error_count),
        ("remote_dropped_count", s.remote_dropped_count),
        ("remote_error_count", s.remote_error_count),
        ("remote_timeout_count", s.remote_timeout_count),
        ("network_timeout_count", s.network_timeout_count),
        ("failed_resends", s.failed_resends),
        ("successful_resends", s.successful_resends),
        ("recv_count", s.recv_count),
        ("route_count", s.route_count),
        ("drop_count", s.drop_count),
        ("send_length", s.send_length),
        ("recv_length", s.recv_length),
        ("route_length", s.route_length),
        ("drop_length", s.drop_length),
        ("loopback_count", s.loopback_count),
        ("loopback_length", s.loopback_length),
    ];
    let mut out = String::from("statistics:\n");
    for (k, v) in fields {
        let _ = writeln!(out, "    {k}: {v}");
    }
    // Ours: LNet's peer table (peer NIs now, aged out, refused at the limit).
    if let Some(c) = &st.peer_table {
        out.push_str("peer_table:\n");
        for (k, v) in &c.0 {
            let _ = writeln!(out, "    {k}: {v}");
        }
    }
    // Ours: the daemon's control socket (clients served, refused, timed out, oversized).
    if let Some(c) = &st.control {
        out.push_str("control:\n");
        for (k, v) in &c.0 {
            let _ = writeln!(out, "    {k}: {v}");
        }
    }
    out
}

/// `global:`.
pub fn global(g: &GlobalShow) -> String {
    let g = &g.global;
    let mut out = String::from("global:\n");
    let _ = writeln!(out, "    numa_range: {}", g.numa_range);
    let _ = writeln!(out, "    max_interfaces: {}", g.max_interfaces);
    let _ = writeln!(out, "    discovery: {}", g.discovery);
    let _ = writeln!(out, "    drop_asym_route: {}", g.drop_asym_route);
    let _ = writeln!(out, "    retry_count: {}", g.retry_count);
    let _ = writeln!(out, "    transaction_timeout: {}", g.transaction_timeout);
    let _ = writeln!(out, "    health_sensitivity: {}", g.health_sensitivity);
    let _ = writeln!(out, "    recovery_interval: {}", g.recovery_interval);
    let _ = writeln!(out, "    router_sensitivity: {}", g.router_sensitivity);
    let _ = writeln!(out, "    lnd_timeout: {}", g.lnd_timeout);
    let _ = writeln!(out, "    response_tracking: {}", g.response_tracking);
    let _ = writeln!(out, "    recovery_limit: {}", g.recovery_limit);
    let _ = writeln!(
        out,
        "    max_recovery_ping_interval: {}",
        g.max_recovery_ping_interval
    );
    let _ = writeln!(out, "    routing: {}", g.routing);
    let _ = writeln!(out, "    pid: {}", g.pid);
    out
}

/// `route:` as lnetctl prints it (`route: []` when there is none).
pub fn route(r: &RouteShow) -> String {
    if r.route.is_empty() {
        return "route: []\n".to_string();
    }
    let mut out = String::from("route:\n");
    for e in &r.route {
        let _ = writeln!(out, "    - net: {}", e.net);
        let _ = writeln!(out, "      gateway: {}", e.gateway);
        if let Some(h) = e.hop {
            let _ = writeln!(out, "      hop: {h}");
        }
        if let Some(p) = e.priority {
            let _ = writeln!(out, "      priority: {p}");
        }
        if let Some(h) = e.health_sensitivity {
            let _ = writeln!(out, "      health_sensitivity: {h}");
        }
        if let Some(s) = &e.state {
            let _ = writeln!(out, "      state: {s}");
        }
        if let Some(t) = &e.kind {
            let _ = writeln!(out, "      type: {t}");
        }
    }
    out
}

/// `routing:` as lnetctl prints it: each CPT's pools, then `enable`; then ours, the
/// forwarding books.
pub fn routing(r: &RoutingShow) -> String {
    fn pool(out: &mut String, name: &str, p: &PoolShow) {
        let _ = writeln!(out, "          {name}:");
        let _ = writeln!(out, "              npages: {}", p.npages);
        let _ = writeln!(out, "              nbuffers: {}", p.nbuffers);
        let _ = writeln!(out, "              credits: {}", p.credits);
        let _ = writeln!(out, "              mincredits: {}", p.mincredits);
    }
    let mut out = String::from("routing:\n");
    for (i, c) in r.cpts.iter().enumerate() {
        let _ = writeln!(out, "    - cpt[{i}]:");
        pool(&mut out, "tiny", &c.tiny);
        pool(&mut out, "small", &c.small);
        pool(&mut out, "large", &c.large);
    }
    let _ = writeln!(out, "    - enable: {}", r.enable);
    let f = &r.forwarding;
    out.push_str("forwarding:\n");
    let _ = writeln!(out, "    received: {}", f.received);
    let _ = writeln!(out, "    forwarded: {}", f.forwarded);
    let _ = writeln!(out, "    forwarded_bytes: {}", f.forwarded_bytes);
    let _ = writeln!(out, "    in_flight: {}", f.in_flight);
    let _ = writeln!(out, "    dropped: {}", f.dropped);
    for (why, n) in &f.dropped_by_reason {
        let _ = writeln!(out, "        {why}: {n}");
    }
    let _ = writeln!(out, "    waited_rtr_credit: {}", f.waited_rtr_credit);
    let _ = writeln!(out, "    waited_buffer: {}", f.waited_buffer);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lnd::time::Instant;
    use lnd::wire::Nid;
    use router::control::*;
    use router::{LnetNode, NiConfig, NodeConfig};

    fn node() -> LnetNode {
        let nid: Nid = "10.0.0.1@o2ib".parse().unwrap();
        LnetNode::new(
            NodeConfig::new(vec![NiConfig::new(nid, 1)]),
            Instant::from_secs(1),
        )
    }

    #[test]
    fn ping_snapshot() {
        let p = PingShow {
            ping: vec![PingPeer {
                primary_nid: "10.0.0.5@o2ib".into(),
                multi_rail: true,
                peer_ni: vec!["10.0.0.5@o2ib".into(), "10.0.1.5@o2ib1".into()],
            }],
            manage: vec![PingFailure {
                ping: "10.0.0.9@o2ib".into(),
                errno: -110,
                descr: "failed to ping 10.0.0.9@o2ib: timed out".into(),
            }],
        };
        assert_eq!(
            ping(&p),
            "\
ping:
    - primary nid: 10.0.0.5@o2ib
      Multi-Rail: true
      peer_ni:
        - nid: 10.0.0.5@o2ib
        - nid: 10.0.1.5@o2ib1
manage:
    - ping:
          errno: -110
          descr: failed to ping 10.0.0.9@o2ib: timed out
"
        );
    }

    #[test]
    fn net_snapshots() {
        let n = node();
        assert_eq!(
            net(&net_show(&n, &[], false)),
            "\
net:
    - net type: lo
      local NI(s):
        - nid: 0@lo
          status: up
    - net type: o2ib
      local NI(s):
        - nid: 10.0.0.1@o2ib
          status: up
"
        );
        let v = net(&net_show(&n, &[], true));
        let (head, lnd) = v.split_once("          lnd statistics:\n").expect(&v);
        assert_eq!(
            head,
            "\
net:
    - net type: lo
      local NI(s):
        - nid: 0@lo
          status: up
          statistics:
              send_count: 0
              recv_count: 0
              drop_count: 0
    - net type: o2ib
      local NI(s):
        - nid: 10.0.0.1@o2ib
          status: up
          statistics:
              send_count: 0
              recv_count: 0
              drop_count: 0
          tunables:
              peer_timeout: 180
              peer_credits: 8
              peer_buffer_credits: 0
              credits: 256
          lnd tunables:
              peercredits_hiw: 0
              concurrent_sends: 0
              timeout: 50
              keepalive: 100
"
        );
        let (lnd, ulnet) = lnd.split_once("          ulnet:\n").expect(lnd);
        // The LND's counters: 47 of them, then the rejects by reason, each 0 here.
        let lines: Vec<&str> = lnd.lines().collect();
        assert_eq!(lines[0], "              connects: 0");
        assert_eq!(lines[8], "              race_order_disagreements: 0");
        assert!(lines.contains(&"              rx_refused: 0"), "{lnd}");
        assert_eq!(lines[33], "              rdma_refused: 0");
        assert_eq!(lines[34], "              rdma_puts_sent: 0");
        assert_eq!(lines[41], "              rdma_bad_descs: 0");
        assert_eq!(lines[42], "              capture_drops: 0");
        assert_eq!(lines[46], "              peer_table_full: 0");
        assert_eq!(lines[47], "              rejects_sent:");
        assert_eq!(lines[48], "                  other: 0");
        assert_eq!(lines[53], "                  conn_stale: 0");
        assert_eq!(lines[58], "              rejects_received:");
        assert_eq!(lines.len(), 69, "{lnd}");
        assert!(lines.iter().all(|l| l.ends_with(':') || l.ends_with(" 0")));
        // ulnet's own settings, after its counters: the defaults.
        assert_eq!(
            ulnet,
            "              checksum: off
              checksum default: none
              race order: nidhash
              peer limit: 131072
              peers: 0
"
        );
        // With the address the NI listens on (a daemon's NI): first in ulnet's settings.
        let x = NiExtras {
            listen: Some("127.0.0.1:40123".parse().unwrap()),
            ..Default::default()
        };
        let v = net(&net_show(&n, &[x], true));
        let ulnet = v.split_once("          ulnet:\n").expect(&v).1;
        assert!(
            ulnet.starts_with(
                "              listen: 127.0.0.1:40123\n              checksum: off\n"
            ),
            "{ulnet}"
        );
    }

    #[test]
    fn net_fabric_counters() {
        let n = NetShow {
            net: vec![NetEntry {
                net_type: "o2ib".into(),
                local_nis: vec![NiEntry {
                    nid: "10.0.0.1@o2ib".into(),
                    status: "up".into(),
                    statistics: None,
                    tunables: None,
                    lnd_tunables: None,
                    lnd_statistics: None,
                    ulnet: None,
                    fabric: Some(FabricCounters {
                        kind: "tcp".into(),
                        counters: NamedCounters(vec![
                            ("accepted".into(), 3),
                            ("truncated".into(), 1),
                        ]),
                    }),
                }],
            }],
        };
        assert_eq!(
            net(&n),
            "\
net:
    - net type: o2ib
      local NI(s):
        - nid: 10.0.0.1@o2ib
          status: up
          fabric:
              type: tcp
              accepted: 3
              truncated: 1
"
        );
        let j = json(&Response::Net(n.clone())).unwrap();
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        let f = &v["net"][0]["local NI(s)"][0]["fabric"];
        assert_eq!(f["type"], "tcp", "{j}");
        assert_eq!(f["truncated"], 1, "{j}");
        // And it comes back the same through the control protocol.
        let line = router::control::encode_response(&Response::Net(n.clone()));
        let back = router::control::decode_response(line.as_bytes()).unwrap();
        assert_eq!(back, Response::Net(n));
    }

    #[test]
    fn capture_report() {
        let r = Report {
            file: "/tmp/x.pcap".into(),
            captured: 12,
            dropped: Some(0),
            seconds: 2.04,
            reason: "stopped".into(),
        };
        assert_eq!(
            capture_yaml(&r),
            "capture:\n    file: /tmp/x.pcap\n    captured: 12\n    dropped: 0\n    seconds: 2.0\n    reason: stopped\n"
        );
        let v: serde_json::Value = serde_json::from_str(&capture_json(&r)).unwrap();
        assert_eq!(v["capture"]["captured"], 12);
        assert!(capture_yaml(&Report { dropped: None, ..r }).contains("dropped: unknown\n"));
    }

    #[test]
    fn peer_snapshots() {
        let mut n = node();
        let peer_nid: Nid = "10.0.0.2@o2ib".parse().unwrap();
        n.ping(
            Instant::from_secs(2),
            peer_nid,
            lnd::time::Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(peer(&PeerShow::default()), "peer: []\n");
        assert_eq!(
            peer(&peer_show(&n, None, false).unwrap()),
            "\
peer:
    - primary nid: 10.0.0.2@o2ib
      Multi-Rail: false
      peer ni:
        - nid: 10.0.0.2@o2ib
          state: NA
"
        );
        assert_eq!(
            peer(&peer_show(&n, Some("10.0.0.2@o2ib"), true).unwrap()),
            "\
peer:
    - primary nid: 10.0.0.2@o2ib
      Multi-Rail: false
      peer ni:
        - nid: 10.0.0.2@o2ib
          state: NA
          max_ni_tx_credits: 8
          available_tx_credits: 7
          min_tx_credits: 7
          tx_q_num_of_buf: 0
          available_rtr_credits: 8
          min_rtr_credits: 8
          statistics:
              send_count: 1
              recv_count: 0
              drop_count: 0
"
        );
    }

    #[test]
    fn conn_stats_global_snapshots() {
        let n = node();
        assert_eq!(conn(&conn_show(&n, Instant::from_secs(1))), "conn: []\n");
        let c = ConnShow {
            conn: vec![ConnEntry {
                ni: "10.0.0.1@o2ib".into(),
                peer: "10.0.0.2@o2ib".into(),
                state: "Established".into(),
                side: "active".into(),
                credits: 7,
                outstanding_credits: 1,
                reserved_credits: 0,
                queue_depth: 8,
                sends_posted: 1,
                queued: 0,
                races: 2,
                incarnation: "0x62a3b00000002".into(),
                age_ms: 1500,
            }],
        };
        assert_eq!(
            conn(&c),
            "\
conn:
    - ni: 10.0.0.1@o2ib
      peer: 10.0.0.2@o2ib
      state: Established
      side: active
      credits: 7
      outstanding_credits: 1
      reserved_credits: 0
      queue_depth: 8
      sends_posted: 1
      queued: 0
      races: 2
      incarnation: 0x62a3b00000002
      age_ms: 1500
"
        );
        let s = stats(&stats_show(&n));
        // lnetctl's keys in lnetctl's order (reference 7.4: liblnetconfig.c's stats builder
        // and the counter structs of lnet-idl.h), then ours: loopback, the peer table.
        let lnetctl_keys = [
            "msgs_alloc",
            "msgs_max",
            "rst_alloc",
            "errors",
            "send_count",
            "resend_count",
            "response_timeout_count",
            "local_interrupt_count",
            "local_dropped_count",
            "local_aborted_count",
            "local_no_route_count",
            "local_timeout_count",
            "local_error_count",
            "remote_dropped_count",
            "remote_error_count",
            "remote_timeout_count",
            "network_timeout_count",
            "failed_resends",
            "successful_resends",
            "recv_count",
            "route_count",
            "drop_count",
            "send_length",
            "recv_length",
            "route_length",
            "drop_length",
        ];
        let keys: Vec<&str> = s
            .lines()
            .skip(1)
            .take(lnetctl_keys.len())
            .map(|l| l.trim().split(':').next().unwrap())
            .collect();
        assert_eq!(keys, lnetctl_keys, "{s}");
        assert!(s.starts_with("statistics:\n    msgs_alloc: 0\n"));
        assert!(s.contains(
            "    drop_length: 0\n    loopback_count: 0\n    loopback_length: 0\npeer_table:\n"
        ));
        assert!(
            s.ends_with("peer_table:\n    peers: 0\n    peers_aged: 0\n    peer_table_full: 0\n")
        );
        assert_eq!(s.lines().count(), 1 + 26 + 2 + 4);
        // The daemon adds its control socket's counters after LNet's.
        let mut with_control = stats_show(&n);
        with_control.control = Some(router::control::NamedCounters(vec![
            ("clients".into(), 3),
            ("refused".into(), 1),
        ]));
        let s = stats(&with_control);
        assert!(
            s.ends_with("    peer_table_full: 0\ncontrol:\n    clients: 3\n    refused: 1\n"),
            "{s}"
        );
        assert_eq!(
            global(&global_show(&n)),
            "\
global:
    numa_range: 0
    max_interfaces: 200
    discovery: 0
    drop_asym_route: 0
    retry_count: 0
    transaction_timeout: 51
    health_sensitivity: 0
    recovery_interval: 0
    router_sensitivity: 0
    lnd_timeout: 50
    response_tracking: 0
    recovery_limit: 0
    max_recovery_ping_interval: 0
    routing: 0
    pid: 12345
"
        );
    }

    #[test]
    fn json_has_lnetctl_keys() {
        let p = PingShow {
            ping: vec![PingPeer {
                primary_nid: "0@lo".into(),
                multi_rail: false,
                peer_ni: vec![],
            }],
            manage: vec![],
        };
        let j = json(&Response::Ping(p)).unwrap();
        assert!(j.contains("\"primary nid\": \"0@lo\""), "{j}");
        assert!(j.contains("\"Multi-Rail\": false"), "{j}");
        assert!(json(&Response::Error(ControlError::new(1, "x"))).is_none());
    }
}
