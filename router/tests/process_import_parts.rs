//! `lnetctl import` of documents of any size (issue 32, item 3): an export over the daemon's
//! 1 MiB request cap imports back into a fresh daemon, sent in parts as it is read; the daemon
//! answers other clients while an import is under way; a route that cannot be added here fails
//! alone, named by its line, and the others apply (as Lustre's import does).

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use common::*;
use router::control::{Request, Response, MAX_REQUEST};

/// (net, gateway, hop, priority) of every route `d` has.
fn routes(d: &Daemon) -> BTreeSet<(String, String, Option<i64>, Option<u32>)> {
    match call(
        d,
        Request::RouteShow {
            net: None,
            gateway: None,
            verbose: true,
        },
    ) {
        Response::Route(r) => r
            .route
            .into_iter()
            .map(|e| (e.net, e.gateway, e.hop, e.priority))
            .collect(),
        other => panic!("{}: route show: {other:?}", d.name),
    }
}

/// Route items `from..to` of a document: ten gateways (10.0.0.2-11@o2ib, on the daemons' net)
/// to each remote net o2ib1, o2ib2, ...; hop and priority vary so that they must round-trip.
fn route_items(from: usize, to: usize) -> String {
    let mut s = String::new();
    for i in from..to {
        s += &format!(
            "    - net: o2ib{}\n      gateway: 10.0.0.{}@o2ib\n      hop: {}\n      priority: {}\n",
            i / 10 + 1,
            i % 10 + 2,
            i % 3 + 1,
            i % 5
        );
    }
    s
}

fn daemon(dir: &Scratch, name: &str) -> Daemon {
    start_on_any_port(&dir.0, name, NID_A, None, Opts::default()).0
}

/// What lnetctl's import says of the route at `at` (`SOURCE:LINE`) that failed: its error
/// line `lnetctl: import: SOURCE:LINE: route: MESSAGE`, without that prefix.
fn route_failure<'a>(line: &'a str, at: &str) -> &'a str {
    line.strip_prefix(&format!("lnetctl: import: {at}: route: "))
        .unwrap_or_else(|| panic!("not the failure of the route at {at}: {line}"))
}

/// 12,000 routes: their export is over the 1 MiB cap, and imports into a fresh daemon, which
/// then has the same routes; imported again it is a no-op, and `--show` says so.
#[test]
fn an_export_over_the_request_cap_imports_back_into_a_fresh_daemon() {
    const N: usize = 12_000;
    let s = Scratch::new("import_big_export");
    let a = daemon(&s, "a");
    let doc = s.0.join("routes.yaml");
    std::fs::write(&doc, format!("route:\n{}", route_items(0, N))).unwrap();
    assert_eq!(
        out(&lnetctl(&a, &["import", doc.to_str().unwrap()])),
        (Some(0), String::new(), String::new())
    );
    let want = routes(&a);
    assert_eq!(want.len(), N);

    let (code, export, err) = out(&lnetctl(&a, &["export"]));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        export.len() > MAX_REQUEST,
        "the export is {} bytes: not over the cap",
        export.len()
    );
    let file = s.0.join("export.yaml");
    std::fs::write(&file, &export).unwrap();
    let f = file.to_str().unwrap();
    let b = daemon(&s, "b");
    assert_eq!(
        out(&lnetctl(&b, &["import", f])),
        (Some(0), String::new(), String::new())
    );
    assert_eq!(routes(&b), want, "the routes of the fresh daemon");
    // Again: nothing to do.
    assert_eq!(
        out(&lnetctl(&b, &["import", f])),
        (Some(0), String::new(), String::new())
    );
    let (code, shown, err) = out(&lnetctl(&b, &["import", "--show", f]));
    assert_eq!(code, Some(0), "{err}");
    assert!(shown.contains("would apply: 0\n"), "{shown}");
    assert_eq!(routes(&b), want);
    // --del takes them all away, in parts too.
    assert_eq!(
        out(&lnetctl(&b, &["import", "--del", doc.to_str().unwrap()])),
        (Some(0), String::new(), String::new())
    );
    assert!(routes(&b).is_empty());
}

/// An import read from a pipe is applied part by part as it comes: while its writer holds the
/// rest back (the import cannot have ended: its input is still open), the first part's routes
/// are there and `net show` from another client is answered. Then the rest comes, with one
/// route to a net that is local here: that one fails, named by its line in the whole document,
/// and every other applies.
#[test]
fn a_net_show_is_answered_while_an_import_is_under_way() {
    let s = Scratch::new("import_under_way");
    let a = daemon(&s, "a");
    let mut import = Command::new(lnetctl_bin())
        .arg("--socket")
        .arg(&a.socket)
        .arg("import")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = import.stdin.take().unwrap();
    // More than one part's worth (2,000 routes a part): the first part goes when the item
    // after it is read.
    let first = 2_500;
    write!(stdin, "route:\n{}", route_items(0, first)).unwrap();
    stdin.flush().unwrap();
    let applied = wait_for(WAIT, || routes(&a).len() >= 2_000);
    assert!(
        applied.is_some(),
        "no route applied while the document is being written"
    );
    let (code, shown, err) = out(&lnetctl(&a, &["net", "show"]));
    assert_eq!(code, Some(0), "{err}");
    assert!(shown.contains(&format!("nid: {NID_A}")), "{shown}");
    assert!(
        import.try_wait().unwrap().is_none(),
        "the import ended before its input did"
    );
    // The rest, with a route to the daemon's own net at line 1 + 4 * 3000 + 1.
    let bad_line = 1 + 4 * 3_000 + 1;
    write!(
        stdin,
        "{}    - net: o2ib\n      gateway: 10.0.0.2@o2ib\n{}",
        route_items(first, 3_000),
        route_items(3_000, 4_000)
    )
    .unwrap();
    drop(stdin);
    let (code, stdout, err) = out(&import.wait_with_output().unwrap());
    assert_eq!(code, Some(1), "{err}");
    assert!(stdout.is_empty(), "{stdout}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    let msg = route_failure(lines[0], &format!("<stdin>:{bad_line}"));
    assert!(msg.contains("net o2ib is local"), "{err}");
    assert!(msg.ends_with("(errno -17)"), "{err}");
    assert_eq!(
        lines[1],
        "lnetctl: import: 4000 applied, 0 already so, 1 failed"
    );
    let have = routes(&a);
    assert_eq!(have.len(), 4_000);
    assert!(!have.iter().any(|r| r.0 == "o2ib"));
}

/// A small document (one part, as always): the routes that fit apply, the ones that do not
/// fail each with its line and Lustre's errno, exit status 1; `--show` says the same and
/// changes nothing.
#[test]
fn bad_routes_fail_alone_and_the_others_apply() {
    let s = Scratch::new("import_bad_routes");
    let a = daemon(&s, "a");
    let file = s.0.join("doc.yaml");
    let f = file.to_str().unwrap();
    std::fs::write(
        &file,
        "route:\n\
         -     net: o2ib5\n      gateway: 10.0.0.2@o2ib\n\
         -     net: o2ib\n      gateway: 10.0.0.2@o2ib\n\
         -     net: o2ib6\n      gateway: 10.0.0.2@tcp\n\
         -     net: o2ib7\n      gateway: 10.0.0.2@o2ib\n\
         global:\n    recovery_limit: 60\n",
    )
    .unwrap();
    let (code, shown, err) = out(&lnetctl(&a, &["import", "--show", f]));
    assert_eq!(code, Some(1), "{err}");
    assert!(shown.contains("would apply: 3\n"), "{shown}");
    assert_eq!(shown.matches("errno: -").count(), 2, "{shown}");
    assert!(routes(&a).is_empty(), "--show changed nothing");

    let (code, stdout, err) = out(&lnetctl(&a, &["import", f]));
    assert_eq!(code, Some(1), "{err}");
    assert!(stdout.is_empty());
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    let msg = route_failure(lines[0], &format!("{f}:4"));
    assert!(msg.starts_with("route to o2ib via"), "{err}");
    assert!(msg.ends_with("(errno -17)"), "{err}");
    let msg = route_failure(lines[1], &format!("{f}:6"));
    assert!(msg.starts_with("route to o2ib6 via"), "{err}");
    assert!(msg.contains("not on any local net"), "{err}");
    assert!(lines[1].ends_with("(errno -113)"), "{err}");
    assert_eq!(
        lines[2],
        "lnetctl: import: 3 applied, 0 already so, 2 failed"
    );
    let nets: BTreeSet<String> = routes(&a).into_iter().map(|r| r.0).collect();
    assert_eq!(
        nets,
        ["o2ib5", "o2ib7"].map(String::from).into_iter().collect()
    );
    let (_, global, _) = out(&lnetctl(&a, &["global", "show"]));
    assert!(global.contains("    recovery_limit: 60\n"), "{global}");
}
