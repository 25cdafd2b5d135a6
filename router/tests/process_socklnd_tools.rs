//! The operator's tools on `tcp` nets (issue 35, build item 4): `lnetctl export` writes a tcp
//! net as lnet.conf does (`net type: tcp`, no `fabric:`) with ksocklnd's `lnd tunables` and the
//! `acceptor:` section when it is not lnet's default, and the export loads back to the same
//! configuration and imports back as a no-op; `net show -v` carries ksocklnd's counters and
//! `conn show` the typed connections.

mod common;

use std::time::Duration;

use common::*;
use router::yaml_config::DaemonConfig;
use router::LndSettings;

/// What a restart takes from a configuration's tcp side: the acceptor and each tcp NI's
/// ksocklnd tunables.
fn tcp_settings(c: &DaemonConfig) -> String {
    let nis: Vec<String> = c
        .nis()
        .filter_map(|(_, ni)| match &ni.ni.lnd {
            LndSettings::Sock(s) => Some(format!(
                "{} cpp={} timeout={:?} keepalive={:?}",
                ni.ni.nid, s.conns_per_peer, s.timeout, s.keepalive
            )),
            LndSettings::O2ib => None,
        })
        .collect();
    format!("{nis:?} acceptor={:?}", c.acceptor)
}

#[test]
fn export_writes_tcp_nets_and_the_acceptor_and_imports_back() {
    let dir = Scratch::new("sock_export");
    let port = held_port().1;
    let (a_nid, b_nid) = ("127.0.36.1@tcp", "127.0.36.2@tcp");
    let yaml = |nid: &str| {
        format!(
            "net:\n  - net type: tcp\n    local NI(s):\n      - nid: {nid}\n        lnd tunables:\n          \
             conns_per_peer: 2\n          timeout: 30\n          keepalive: 20\n\
             acceptor:\n  accept: all\n  port: {port}\n  backlog: 64\n  timeout: 7\n  source ports: 0\n"
        )
    };
    let a = start_yaml(&dir.0, "a", &yaml(a_nid), Opts::default());
    let _b = start_yaml(&dir.0, "b", &yaml(b_nid), Opts::default());
    ping_until_ok(&a, b_nid, Duration::from_secs(10));
    // b's acceptor may come up between a's first dials, refusing some of them: a dials the
    // types it misses again on a later send once their backoff is over (reference 4.4), so
    // ping until a holds the whole typed set (the check below counts it).
    wait_until(WAIT, "a's typed set to b", || {
        ping(&a, b_nid, 2);
        lnd_counters(&a, a_nid).counters.get("conns") == Some(5)
    });
    let want = tcp_settings(&DaemonConfig::parse(&yaml(a_nid), "a.yaml").unwrap());
    let file = dir.0.join("export.yaml");
    let f = file.to_str().unwrap();
    for args in [&["export"][..], &["export", "--backup"]] {
        let (code, text, err) = out(&lnetctl(&a, args));
        assert_eq!(code, Some(0), "{err}");
        assert!(text.contains("net type: tcp\n"), "{text}");
        assert!(!text.contains("fabric:"), "a tcp net has no fabric: {text}");
        assert!(
            text.contains(&format!(
                "acceptor:\n    accept: all\n    port: {port}\n    backlog: 64\n    timeout: 7\n    \
                 source ports: \"0\"\n"
            )) || text.contains(&format!(
                "acceptor:\n    accept: all\n    port: {port}\n    backlog: 64\n    timeout: 7\n    \
                 source ports: 0\n"
            )),
            "{text}"
        );
        let c = DaemonConfig::parse(&text, "export").unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(tcp_settings(&c), want, "{args:?}:\n{text}");
        std::fs::write(&file, &text).unwrap();
        assert_eq!(
            out(&lnetctl(&a, &["import", f])),
            (Some(0), String::new(), String::new()),
            "{args:?}: export | import is a no-op:\n{text}"
        );
    }
    // net show -v: ksocklnd's counters; conn show: the typed set a dialled to b, 1 CONTROL and
    // conns_per_peer (2) of each bulk type, as a kernel dials (reference 4.2).
    let (code, net, err) = out(&lnetctl(&a, &["net", "show", "-v", "5"]));
    assert_eq!(code, Some(0), "{err}");
    assert!(net.contains("lnd statistics:\n"), "{net}");
    assert!(!net.contains("rejects_sent"), "{net}");
    assert!(net.contains("keepalive: 20\n"), "{net}");
    let est = lnd_counters(&a, a_nid).counters.get("established").unwrap();
    assert_eq!(est, 5, "{net}");
    let (code, conn, err) = out(&lnetctl(&a, &["conn", "show"]));
    assert_eq!(code, Some(0), "{err}");
    for (t, n) in [("CONTROL", 1), ("BULK_IN", 2), ("BULK_OUT", 2)] {
        assert_eq!(
            conn.matches(&format!("type: {t}\n")).count(),
            n,
            "{t}: {conn}"
        );
    }
    assert_eq!(
        conn.matches(&format!("peer: {b_nid}\n")).count(),
        5,
        "{conn}"
    );
    assert_eq!(conn.matches("side: active\n").count(), 5, "{conn}");
}
