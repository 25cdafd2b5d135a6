//! `export` and `import`: the running daemon's configuration as one document, and a document
//! applied to the daemon item by item (in parts, as it is read).

use router::control::{self, ControlClient, ImportOp, ImportReport, Request, Response};

use crate::{check_nid, client_failed, emit, exit, export, import, render};

/// `lnetctl export`: the shows an export is made of, on one connection, as one document.
pub(crate) fn run_export(
    path: &std::path::Path,
    json: bool,
    backup: bool,
    file: Option<&std::path::Path>,
) -> u8 {
    let answers = ControlClient::connect(path).and_then(|mut c| {
        export::requests()
            .iter()
            .map(|r| c.call(r))
            .collect::<Result<Vec<_>, _>>()
    });
    let running = match answers.map(export::Running::from_answers) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            eprintln!("lnetctl: export: {e}");
            return exit::FAILED;
        }
        Err(e) => return client_failed(&e),
    };
    let doc = export::export(&running, backup);
    let text = if json {
        export::to_json_text(&doc)
    } else {
        export::to_text(&doc)
    };
    match file.filter(|f| f.as_os_str() != "-") {
        None => {
            emit(&text);
            exit::OK
        }
        Some(f) => match std::fs::write(f, text) {
            Ok(()) => exit::OK,
            Err(e) => {
                eprintln!("lnetctl: export: cannot write {}: {e}", f.display());
                exit::FAILED
            }
        },
    }
}

/// `lnetctl import`: the document goes to the daemon, which checks it as a configuration and
/// applies it item by item; what failed is said on stderr, one line each. A big document goes
/// in parts as it is read ([`import::split_document`]); `--exec` documents are small and read
/// whole.
pub(crate) fn run_import(
    path: &std::path::Path,
    json: bool,
    op: ImportOp,
    exec: bool,
    file: Option<&std::path::Path>,
) -> u8 {
    if !exec {
        return import_in_parts(path, json, op, file);
    }
    let text = match file.filter(|f| f.as_os_str() != "-") {
        Some(f) => router::text::read_config_file(f)
            .map_err(|e| format!("cannot read {}: {e}", f.display())),
        None => router::text::read_config(std::io::stdin().lock())
            .map_err(|e| format!("cannot read standard input: {e}")),
    };
    let origin = file
        .filter(|f| f.as_os_str() != "-")
        .map_or_else(|| "<stdin>".to_string(), |f| f.display().to_string());
    let mut stripped = match text.and_then(|t| import::strip_peers(&t, &origin)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lnetctl: import: {e}");
            return exit::FAILED;
        }
    };
    if exec {
        // The `ping:` and `discover:` sections run (silent when every NID answers, as
        // lnetctl); the rest of the document is applied as by --add.
        let doc = match import::take_exec_sections(&stripped.text) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("lnetctl: import --exec: {origin}: {e}");
                return exit::FAILED;
            }
        };
        let (rest, nids) = (doc.rest, doc.nids);
        for n in &nids {
            if let Err(c) = check_nid(n) {
                return c;
            }
        }
        if !rest.trim().is_empty() {
            stripped.text = rest;
            let code = send_import(path, json, ImportOp::Add, &mut stripped, &origin);
            if code != exit::OK {
                return code;
            }
        }
        if nids.is_empty() {
            return exit::OK;
        }
        let req = Request::Ping {
            nids,
            timeout_secs: doc.timeout,
            source: None,
        };
        return match ControlClient::connect(path).and_then(|mut c| c.call(&req)) {
            Ok(Response::Ping(p)) if p.manage.is_empty() => exit::OK,
            Ok(Response::Ping(p)) => {
                for f in &p.manage {
                    eprintln!(
                        "lnetctl: import --exec: ping {}: {} (errno {})",
                        f.ping, f.descr, f.errno
                    );
                }
                exit::FAILED
            }
            Ok(Response::Error(e)) => {
                eprintln!("lnetctl: import --exec: {e}");
                exit::FAILED
            }
            Ok(other) => {
                eprintln!("lnetctl: import --exec: unexpected answer: {other:?}");
                exit::FAILED
            }
            Err(e) => client_failed(&e),
        };
    }
    send_import(path, json, op, &mut stripped, &origin)
}

/// `lnetctl import` (not `--exec`): the document read a line at a time and sent in parts.
fn import_in_parts(
    path: &std::path::Path,
    json: bool,
    op: ImportOp,
    file: Option<&std::path::Path>,
) -> u8 {
    let file = file.filter(|f| f.as_os_str() != "-");
    let origin = file.map_or_else(|| "<stdin>".to_string(), |f| f.display().to_string());
    let input: Box<dyn std::io::BufRead> = match file {
        Some(f) => match std::fs::File::open(f) {
            Ok(h) => Box::new(std::io::BufReader::new(h)),
            Err(e) => {
                eprintln!("lnetctl: import: cannot read {}: {e}", f.display());
                return exit::FAILED;
            }
        },
        None => Box::new(std::io::stdin().lock()),
    };
    let mut tally = Tally::new(path, op, &origin);
    let del = op == ImportOp::Del;
    match import::split_document(input, &origin, del, |p| tally.send(p)) {
        Ok(peers) => tally.finish(json, peers),
        Err(import::SplitError::Input(e)) => {
            eprintln!("lnetctl: import: {e}");
            tally.stopped();
            exit::FAILED
        }
        Err(import::SplitError::Stopped) => tally.code,
    }
}

/// Sends the document (its `peer:` section taken out) as one import and reports what failed.
fn send_import(
    path: &std::path::Path,
    json: bool,
    op: ImportOp,
    stripped: &mut import::Stripped,
    origin: &str,
) -> u8 {
    let mut tally = Tally::new(path, op, origin);
    let part = import::Part {
        body: import::Stripped {
            text: std::mem::take(&mut stripped.text),
            peers: 0,
            lines: std::mem::take(&mut stripped.lines),
        },
        nets: None,
    };
    match tally.send(part) {
        Ok(()) => tally.finish(json, stripped.peers),
        Err(()) => tally.code,
    }
}

/// An import's parts as the daemon answers them: their reports summed, each failure said on
/// stderr as its answer comes (`--show` prints the sum at the end).
struct Tally<'a> {
    path: &'a std::path::Path,
    origin: &'a str,
    report: ImportReport,
    /// Parts the daemon applied.
    parts: usize,
    /// The exit status when a part stops the import.
    code: u8,
}

impl<'a> Tally<'a> {
    fn new(path: &'a std::path::Path, op: ImportOp, origin: &'a str) -> Tally<'a> {
        Tally {
            path,
            origin,
            report: ImportReport {
                op,
                ..ImportReport::default()
            },
            parts: 0,
            code: exit::FAILED,
        }
    }

    /// Sends one part (the document itself when it is small); `Err` once it has said why the
    /// import stops there.
    fn send(&mut self, part: import::Part) -> Result<(), ()> {
        let op = self.report.op;
        let (origin, mut body) = (self.origin, part.body);
        let first = body.lines.first().copied().unwrap_or(1);
        let req = Request::Import {
            yaml: std::mem::take(&mut body.text),
            op,
            nets: part.nets.filter(|n| op == ImportOp::Show && !n.is_empty()),
        };
        if let Ok(line) = control::encode_request(&req) {
            if line.len() > control::MAX_REQUEST {
                eprintln!(
                    "lnetctl: import: {origin}:{first}: {} KiB to send at once without its \
                     peers (only route: items are sent in parts); the daemon takes at most {} \
                     KiB: split it",
                    line.len() >> 10,
                    control::MAX_REQUEST >> 10
                );
                self.stopped();
                return Err(());
            }
        }
        let r = match ControlClient::connect(self.path).and_then(|mut c| c.call(&req)) {
            Ok(Response::Import(r)) => r,
            Ok(Response::Error(e)) => {
                eprintln!("lnetctl: import: {}", body.locate(&e.message, origin));
                self.stopped();
                return Err(());
            }
            Ok(other) => {
                eprintln!("lnetctl: import: unexpected answer from the daemon: {other:?}");
                self.stopped();
                return Err(());
            }
            Err(e) => {
                self.code = client_failed(&e);
                self.stopped();
                return Err(());
            }
        };
        self.parts += 1;
        self.report.applied += r.applied;
        self.report.unchanged += r.unchanged;
        for mut f in r.failed {
            // The part's line, as the user's document numbers it.
            f.line = f
                .line
                .map(|n| body.lines.get(n as usize - 1).map_or(n, |&l| l as u64));
            if op != ImportOp::Show {
                match f.line {
                    Some(l) => eprintln!(
                        "lnetctl: import: {origin}:{l}: {}: {} (errno {})",
                        f.section, f.descr, f.errno
                    ),
                    None => eprintln!(
                        "lnetctl: import: {}: {} (errno {})",
                        f.section, f.descr, f.errno
                    ),
                }
            }
            self.report.failed.push(f);
        }
        Ok(())
    }

    /// Says what the parts before a stop did, when there were any: a document sent in parts
    /// is applied up to where it stopped.
    fn stopped(&self) {
        if self.parts > 0 {
            eprintln!(
                "lnetctl: import: stopped after {} part(s) of {}: {} applied, {} already so, {} \
                 failed before it",
                self.parts,
                self.origin,
                self.report.applied,
                self.report.unchanged,
                self.report.failed.len()
            );
        }
    }

    /// The import's end: `--show`'s report, or the count of what failed; the exit status.
    fn finish(mut self, json: bool, peers: u32) -> u8 {
        self.report.unchanged += peers;
        let report = self.report;
        let failed = !report.failed.is_empty();
        if report.op == ImportOp::Show {
            let resp = Response::Import(report);
            let out = if json {
                render::json(&resp)
            } else {
                render::yaml(&resp)
            };
            emit(&out.unwrap_or_default());
        } else if failed {
            eprintln!(
                "lnetctl: import: {} applied, {} already so, {} failed",
                report.applied,
                report.unchanged,
                report.failed.len()
            );
        }
        if failed {
            exit::FAILED
        } else {
            exit::OK
        }
    }
}
