//! The metrics endpoint (issue 36; docs/metrics.md) on real daemons over the tcp fabric: a
//! router between a client and a far server, routed pings and a bulk brw through it, scraped.
//! The scrape passes `promtool check metrics`, mirrors `lnetctl stats show` and `routing show`
//! (between two lnetctl reads during traffic, equal once traffic stops), keeps its counters
//! across `stats reset`, is what a real Prometheus scrapes and computes a forwarding rate from,
//! and names every metric the packaged alerts and dashboard use. The endpoint answers only GET
//! /metrics, caps a request's size and its connections, and a client that never sends its
//! request delays neither a scrape nor forwarding. Every daemon listens on its own 127.a.b.c.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use router::control::{Request, Response, RoutingShow, StatsShow};

const PORT: u16 = 9967;
const CLIENT: &str = "10.0.0.1@o2ib";
const R_A: &str = "10.0.0.254@o2ib";
const R_B: &str = "10.1.0.254@o2ib1";
const FAR: &str = "10.1.0.2@o2ib1";
static ALL: [&str; 4] = [CLIENT, R_A, R_B, FAR];

/// Test `test`'s loopback site (addresses 127.(230 + test).b.c, port [`PORT`]).
fn site(test: u8) -> Site {
    Site::loopback(&ALL, PORT, 230 + test, |_| String::new())
}

fn yaml(test: u8, nis: &[&str], route: Option<(&str, &str)>, routing: bool, extra: &str) -> String {
    let routes: Vec<(&str, &str)> = route.into_iter().collect();
    let mut y = site(test).yaml(nis, &routes, routing);
    y.push_str(&format!(
        "buffers:\n    large: 16\nselftest:\n    enable: 1\n{extra}"
    ));
    y
}

/// The address `d`'s metrics endpoint listens on, from its log's start line.
fn metrics_addr(d: &Daemon) -> SocketAddr {
    let mut found = None;
    wait_for(WAIT, || {
        let log = strip_ansi(&std::fs::read_to_string(&d.log).unwrap_or_default());
        found = log
            .lines()
            .filter(|l| l.contains("metrics endpoint serving /metrics"))
            .find_map(|l| l.split("listen=").nth(1))
            .and_then(|a| a.split_whitespace().next())
            .and_then(|a| a.parse().ok());
        found.is_some()
    });
    found.unwrap_or_else(|| panic!("{}: no metrics endpoint in the log", d.name))
}

/// One HTTP exchange of `request` with `addr`: the status line's code, the head, the body.
fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(CALL_BOUND)).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_string(), body.to_string())
}

fn scrape(addr: SocketAddr) -> String {
    let (code, head, body) = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(code, 200, "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body
}

/// Every sample of `name` (exactly that name, any labels) in a 0.0.4 text, summed.
fn sum(text: &str, name: &str) -> f64 {
    samples(text, name).iter().map(|(_, v)| v).sum()
}

/// The samples of `name`: their label part (`{...}` or empty) and value.
fn samples(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (lb, v) = r.split_once("} ")?;
                    (lb.to_string(), v)
                }
                None => ("".to_string(), rest.strip_prefix(' ')?),
            };
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

fn value(text: &str, name: &str, labels: &str) -> f64 {
    samples(text, name)
        .into_iter()
        .find(|(l, _)| l == labels)
        .unwrap_or_else(|| panic!("no {name}{{{labels}}} in\n{text}"))
        .1
}

/// The largest snapshot age of the scrape: every NI published after `since` if it is below
/// the time elapsed since then, measured before the scrape was asked for.
fn max_age(text: &str) -> f64 {
    samples(text, "ulnet_ni_snapshot_age_seconds")
        .iter()
        .map(|(_, v)| *v)
        .fold(0.0, f64::max)
}

/// A scrape taken once every NI loop has published after `since`.
fn scrape_after(addr: SocketAddr, since: Instant) -> String {
    let t0 = Instant::now();
    loop {
        let asked = since.elapsed().as_secs_f64();
        let text = scrape(addr);
        if max_age(&text) < asked {
            return text;
        }
        assert!(
            t0.elapsed() < WAIT,
            "no fresh snapshot within {WAIT:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stats(d: &Daemon) -> StatsShow {
    match call(d, Request::StatsShow) {
        Response::Stats(s) => s,
        other => panic!("{other:?}"),
    }
}

fn routing(d: &Daemon) -> RoutingShow {
    match call(d, Request::RoutingShow) {
        Response::Routing(r) => r,
        other => panic!("{other:?}"),
    }
}

/// The fields compared: `stats show`'s under the Lustre exporter's names, and `routing show`'s
/// forwarding books and pools, as (name, lnetctl's value, the scrape's).
fn compared(s: &StatsShow, r: &RoutingShow, text: &str) -> Vec<(String, f64, f64)> {
    let st = &s.statistics;
    let mut v = vec![
        ("lustre_send_count_total", st.send_count),
        ("lustre_receive_count_total", st.recv_count),
        ("lustre_route_count_total", st.route_count),
        ("lustre_drop_count_total", st.drop_count),
        ("lustre_errors_total", st.errors),
        ("lustre_send_bytes_total", st.send_length),
        ("lustre_receive_bytes_total", st.recv_length),
        ("lustre_route_bytes_total", st.route_length),
        ("lustre_drop_bytes_total", st.drop_length),
        ("ulnet_fwd_received_total", r.forwarding.received),
        ("ulnet_fwd_forwarded_total", r.forwarding.forwarded),
        (
            "ulnet_fwd_forwarded_bytes_total",
            r.forwarding.forwarded_bytes,
        ),
        ("ulnet_fwd_dropped_total", r.forwarding.dropped),
    ]
    .into_iter()
    .map(|(n, x)| (n.to_string(), x as f64, sum(text, n)))
    .collect::<Vec<_>>();
    for (pool, pick) in [
        (
            "tiny",
            (|c: &router::control::CptPools| c.tiny.clone()) as fn(&_) -> _,
        ),
        ("small", |c| c.small.clone()),
        ("large", |c| c.large.clone()),
    ] {
        let want: i64 = r.cpts.iter().map(|c| i64::from(pick(c).nbuffers)).sum();
        let got: f64 = samples(text, "ulnet_rtr_buffers")
            .iter()
            .filter(|(l, _)| l.contains(&format!("pool=\"{pool}\"")))
            .map(|(_, v)| v)
            .sum();
        v.push((
            format!("ulnet_rtr_buffers{{pool={pool}}}"),
            want as f64,
            got,
        ));
    }
    v
}

/// `promtool check metrics` on `text`: its status and what it said.
fn promtool_check(text: &str) -> (bool, String) {
    let mut c = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), said)
}

/// The metric names a PromQL expression uses (ours and the Lustre exporter's).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        if b[i].is_ascii_alphabetic() || b[i] == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let w = &expr[start..i];
            if w.starts_with("ulnet_") || w.starts_with("lustre_") {
                names.push(w.to_string());
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every `expr` of the packaged dashboard and alert rules.
fn packaged_exprs() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/metrics");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("ulnet-dashboard.json")).unwrap())
            .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            exprs.push(t["expr"].as_str().expect("expr").to_string());
        }
    }
    let rules = std::fs::read_to_string(root.join("ulnet-alerts.yml")).unwrap();
    exprs.extend(
        rules
            .lines()
            .filter_map(|l| l.trim().strip_prefix("expr:"))
            .map(|e| e.trim().to_string()),
    );
    exprs
}

/// A client that connects and never sends its request.
fn silent_client(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).unwrap()
}

/// Percent-encodes a PromQL query for a URL.
fn urlencode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server of Debian's package, on loopback, scraping `target` every second; its
/// data directory in the scratch directory, killed on drop.
struct Prometheus {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(dir: &std::path::Path, target: SocketAddr) -> Prometheus {
        let (held, port) = held_port();
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: ulnet\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        drop(held);
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let p = Prometheus {
            child,
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
        };
        let ready = wait_for(WAIT, || {
            TcpStream::connect(p.addr).is_ok()
                && exchange(p.addr, b"GET /-/ready HTTP/1.0\r\n\r\n").0 == 200
        });
        assert!(ready.is_some(), "prometheus not ready");
        // Its first scrape of the daemon, before any traffic the test would have it see.
        let up = wait_for(WAIT, || p.query("up{job=\"ulnet\"}") == Some(1.0));
        assert!(up.is_some(), "prometheus never scraped {target}");
        p
    }

    /// The value of an instant query returning one sample, if it has one.
    fn query(&self, q: &str) -> Option<f64> {
        let req = format!("GET /api/v1/query?query={} HTTP/1.0\r\n\r\n", urlencode(q));
        let (code, _, body) = exchange(self.addr, req.as_bytes());
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["status"], "success", "{v}");
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }
}

/// The acceptance test of issue 36 on a router between a client and a far server.
#[test]
fn a_scrape_mirrors_lnetctl_through_routed_traffic_and_a_real_prometheus_reads_its_rate() {
    let t = 1;
    let s = Scratch::new("metrics_routed");
    let o = Opts::default;
    let router = start_yaml(
        &s.0,
        "router",
        &yaml(
            t,
            &[R_A, R_B],
            None,
            true,
            "metrics:\n    listen: 127.0.0.1:0\n    top_peers: 2\n",
        ),
        o(),
    );
    let far = start_yaml(
        &s.0,
        "far",
        &yaml(t, &[FAR], Some(("o2ib", R_B)), false, ""),
        o(),
    );
    let client = start_yaml(
        &s.0,
        "client",
        &yaml(t, &[CLIENT], Some(("o2ib1", R_A)), false, ""),
        o(),
    );
    let addr = metrics_addr(&router);
    let prom = tool_or_skip("prometheus", "prometheus").then(|| Prometheus::start(&s.0, addr));

    // A client that connects and never sends anything holds one of the endpoint's connections
    // through the traffic: forwarding and scrapes go on beside it.
    let silent = silent_client(addr);
    ping_until_ok(&client, FAR, WAIT);
    for _ in 0..20 {
        let p = ping(&client, FAR, 5);
        assert!(p.manage.is_empty(), "{p:?}");
    }
    // During traffic: between two lnetctl reads, one taken before every NI published the
    // copy the scrape reads, one after the scrape.
    let bg = ping_in_background(&client, FAR, 200, 5);
    let before_s = stats(&router);
    let before_r = routing(&router);
    let since = Instant::now();
    let during = scrape_after(addr, since);
    let after_s = stats(&router);
    let after_r = routing(&router);
    for ((n, lo, got), (_, hi, _)) in compared(&before_s, &before_r, &during)
        .into_iter()
        .zip(compared(&after_s, &after_r, &during))
    {
        if n.starts_with("ulnet_rtr_buffers") {
            continue;
        }
        assert!(lo <= got && got <= hi, "{n}: {lo} <= {got} <= {hi}");
    }
    assert!(matches!(bg.join().unwrap(), Ok(Response::Ping(_))));
    assert_eq!(
        sum(&during, "ulnet_metrics_timeouts_total"),
        0.0,
        "the silent client is still connected: the scrape did not wait for it"
    );

    // A bulk brw through the router.
    let out = brw_write_1m(&client, CLIENT, FAR, 2, 4);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value =
        serde_json::from_str(&stdout[stdout.find("{\n").expect("JSON")..]).unwrap();
    assert_eq!(j["brw_errors"], 0, "{j}");
    drop(silent);

    // The rate, from a real Prometheus that scraped through the traffic.
    if let Some(p) = &prom {
        let q = "sum(rate(ulnet_fwd_forwarded_total[30s]))";
        let mut rate = None;
        wait_for(WAIT, || {
            rate = p.query(q);
            rate.is_some_and(|r| r > 0.0)
        });
        assert!(rate.is_some_and(|r| r > 0.0), "{q}: {rate:?}");
        let up = p.query("up{job=\"ulnet\"}");
        assert_eq!(up, Some(1.0));
    }

    // Traffic over: the client and the far server stop pinging the router (their router
    // checks), then a scrape taken between two equal lnetctl reads equals them.
    for d in [&client, &far] {
        let r = call(
            d,
            Request::SetRouterChecks {
                alive_router_check_interval: Some(3600),
                router_ping_timeout: None,
                avoid_asym_router_failure: None,
            },
        );
        assert!(matches!(r, Response::Done), "{r:?}");
    }
    let mut equal = None;
    for _ in 0..20 {
        let (s1, r1) = (stats(&router), routing(&router));
        let text = scrape_after(addr, Instant::now());
        let (s2, r2) = (stats(&router), routing(&router));
        if s1.statistics == s2.statistics && r1.forwarding == r2.forwarding {
            equal = Some((compared(&s1, &r1, &text), text));
            break;
        }
    }
    let (fields, quiet) = equal.expect("the router's counters never stood still");
    for (n, want, got) in &fields {
        assert_eq!(want, got, "{n}");
    }
    assert!(value(&quiet, "lustre_route_count_total", "") > 0.0);
    assert!(sum(&quiet, "ulnet_fwd_forwarded_bytes_total") >= f64::from(8 << 20));

    // `promtool check metrics` on a scrape.
    if tool_or_skip("promtool", "prometheus") {
        let (ok, said) = promtool_check(&quiet);
        assert!(ok, "promtool check metrics:\n{said}");
        let rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../packaging/metrics/ulnet-alerts.yml");
        let o = Command::new("promtool")
            .args(["check", "rules"])
            .arg(&rules)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    }
    // Every metric the packaged dashboard and alerts use is in the scrape.
    let exprs = packaged_exprs();
    assert!(exprs.len() >= 10, "{exprs:?}");
    for e in &exprs {
        let names = metric_names(e);
        assert!(!names.is_empty(), "no metric in {e}");
        for n in names {
            assert!(
                quiet.lines().any(|l| l.starts_with(&format!("{n} "))
                    || l.starts_with(&format!("{n}{{"))
                    || l.starts_with(&format!("# TYPE {n} "))),
                "{n} (used by `{e}`) is not in a scrape"
            );
        }
    }

    // OpenMetrics when asked for it.
    let (code, head, body) = exchange(
        addr,
        b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n",
    );
    assert_eq!(code, 200);
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert!(
        body.contains("# TYPE lustre_send_count counter\n"),
        "{body}"
    );

    // `stats reset` clears lnetctl's counters, not the exported totals.
    let sent = value(&quiet, "lustre_send_count_total", "");
    let out = lnetctl(&router, &["stats", "reset"]);
    assert!(out.status.success(), "{out:?}");
    assert!(stats(&router).statistics.send_count < sent as u64);
    let after = scrape_after(addr, Instant::now());
    assert!(
        value(&after, "lustre_send_count_total", "") >= sent,
        "{after}"
    );
}

/// The endpoint's bounds on a daemon of one NI: only GET /metrics, a request's size, its
/// connections (the rest closed at accept and counted), a silent client closed at its timeout
/// and counted, and a scrape served beside one.
#[test]
fn the_endpoint_answers_only_get_metrics_within_its_bounds() {
    let s = Scratch::new("metrics_bounds");
    let yaml = one_ni_yaml(NID_A, 0, None, &Opts::default());
    let d = start_yaml(
        &s.0,
        "a",
        &format!("{yaml}metrics:\n    listen: 127.0.0.1:0\n    max_connections: 2\n"),
        Opts::default(),
    );
    let addr = metrics_addr(&d);
    for (req, want) in [
        (&b"GET / HTTP/1.1\r\n\r\n"[..], 404),
        (b"GET /metricsx HTTP/1.1\r\n\r\n", 404),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        (b"DELETE /metrics HTTP/1.1\r\n\r\n", 405),
        (b"\x16\x03\x01 hello\r\n\r\n", 400),
    ] {
        // Each answer ends (EOF) only once its connection's slot is free again: exchanges
        // one after another are never over the cap.
        let (code, head, _) = exchange(addr, req);
        assert_eq!(code, want, "{:?}: {head}", String::from_utf8_lossy(req));
    }
    // A head larger than the cap: refused, not read on.
    let big = format!(
        "GET /metrics HTTP/1.1\r\nX-Filler: {}\r\n\r\n",
        "a".repeat(16 * 1024)
    );
    let (code, head, _) = exchange(addr, big.as_bytes());
    assert_eq!(code, 431, "{head}");

    // One silent client: a scrape beside it is served (it has not timed out yet).
    let one = silent_client(addr);
    let text = scrape(addr);
    assert_eq!(sum(&text, "ulnet_metrics_timeouts_total"), 0.0, "{text}");
    // Two silent clients fill the endpoint: a third connection is closed at accept.
    let two = silent_client(addr);
    let mut third = TcpStream::connect(addr).unwrap();
    third.set_read_timeout(Some(CALL_BOUND)).unwrap();
    let mut buf = [0u8; 16];
    let n = third.read(&mut buf).unwrap_or(0);
    assert_eq!(
        n, 0,
        "the connection over the cap is closed without an answer"
    );
    // The silent ones time out; then a scrape counts all of it.
    let t0 = Instant::now();
    let mut text = String::new();
    while t0.elapsed() < WAIT {
        match TcpStream::connect(addr).and_then(|mut s| {
            s.set_read_timeout(Some(CALL_BOUND))?;
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        }) {
            Ok(out) if out.starts_with("HTTP/1.1 200") => {
                text = out;
                if sum(&text, "ulnet_metrics_timeouts_total") >= 2.0 {
                    break;
                }
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop((one, two));
    assert_eq!(sum(&text, "ulnet_metrics_timeouts_total"), 2.0, "{text}");
    // The third connection, and the scrapes tried while the two silent ones held the
    // endpoint.
    assert!(sum(&text, "ulnet_metrics_refused_total") >= 1.0, "{text}");
    for (reason, n) in [
        ("not_found", 2.0),
        ("method", 2.0),
        ("malformed", 1.0),
        ("oversized", 1.0),
    ] {
        assert_eq!(
            value(
                &text,
                "ulnet_metrics_rejected_total",
                &format!("reason=\"{reason}\"")
            ),
            n,
            "{reason}"
        );
    }
    // The daemon-wide parts.
    assert!(sum(&text, "ulnet_process_resident_memory_bytes") > 0.0);
    assert!(sum(&text, "ulnet_process_threads") >= 3.0);
    assert!(sum(&text, "ulnet_control_accepted_total") >= 1.0);
}

/// Off unless configured: no endpoint, and `--metrics-listen` turns it on.
#[test]
fn metrics_are_off_by_default_and_the_command_line_turns_them_on() {
    let s = Scratch::new("metrics_off");
    let yaml = one_ni_yaml(NID_B, 0, None, &Opts::default());
    let d = start_yaml(&s.0, "off", &yaml, Opts::default());
    ping_until_ok(&d, NID_B, WAIT);
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(!log.contains("metrics endpoint"), "{log}");
    drop(d);
    let (held, port) = held_port();
    drop(held);
    let d = start_yaml(
        &s.0,
        "on",
        &yaml,
        Opts {
            args: vec!["--metrics-listen".into(), format!("127.0.0.1:{port}")],
            ..Opts::default()
        },
    );
    assert_eq!(metrics_addr(&d).port(), port);
    let text = scrape(metrics_addr(&d));
    assert_eq!(sum(&text, "ulnet_nis"), 1.0, "{text}");
}
