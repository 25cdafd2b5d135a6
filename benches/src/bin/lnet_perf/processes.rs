//! The other processes of a run: the server, an `lnet-router` daemon or a bare relay between
//! them, each started, watched and stopped (bounded) by this one.

use super::*;

/// User + system CPU seconds of process `pid` so far (from /proc; 0 if unreadable).
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command name (which may hold spaces) end its ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat: 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// The `lnet-router` daemon between the clients and B, on two loopback listeners the OS
/// assigns, found through its control socket.
pub(crate) struct Router {
    pub(crate) child: std::process::Child,
    /// Its NID on the clients' net.
    pub(crate) client_side: Nid,
    pub(crate) dir: PathBuf,
    pub(crate) socket: PathBuf,
}

impl Router {
    pub(crate) fn start(
        bin: &std::path::Path,
        opts: &Opts,
        shared: &Shared,
        server: &mut Server,
    ) -> Result<Router, String> {
        use std::io::Write;
        use std::process::{Command, Stdio};
        // Every client's address first: the router's peers table lists them.
        let deadline = StdInstant::now() + StdDuration::from_secs(10);
        let clients: Vec<Nid> = (0..opts.clients)
            .map(|i| client_nid(opts, i))
            .chain((0..opts.attackers).map(attacker_nid))
            .collect();
        while clients.iter().any(|&c| shared.peer(c).is_none()) {
            if StdInstant::now() >= deadline {
                return Err("the clients never bound their fabrics".into());
            }
            std::thread::sleep(StdDuration::from_millis(1));
        }
        let dir = std::env::temp_dir().join(format!("lnet_perf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let pc = opts.server_peer_credits.unwrap_or(opts.peer_credits);
        let (ra, rb) = (router_a(opts), router_b(opts));
        let mut yaml = format!(
            "net:\n{}{}",
            router_ni(opts, opts.client_net, ra, pc),
            router_ni(opts, opts.server_net, rb, pc)
        );
        yaml.push_str("routing:\n    enable: 1\n");
        if opts.any_tcp() {
            yaml.push_str(&format!(
                "acceptor:\n    accept: all\n    port: {}\n    source ports: 0\n",
                opts.accept_port
            ));
        }
        if opts.router_scrub.is_some() || opts.router_large.is_some() {
            yaml.push_str("buffers:\n");
        }
        if let Some(s) = &opts.router_scrub {
            yaml.push_str(&format!("    scrub: {s}\n"));
        }
        if let Some(n) = opts.router_large {
            yaml.push_str(&format!("    large: {n}\n"));
        }
        yaml.push_str("peers:\n");
        let peer_list: Vec<Nid> = clients.iter().copied().chain([server_nid(opts)]).collect();
        // A tcp peer is dialled at its NID's address: only o2ib ones need the table.
        for p in peer_list.into_iter().filter(|p| !is_tcp(*p)) {
            let a = shared.peer(p).ok_or("a peer without an address")?;
            yaml.push_str(&format!("    - nid: {p}\n      address: {a}\n"));
        }
        let cfg = dir.join("router.yaml");
        std::fs::write(&cfg, yaml).map_err(|e| format!("{}: {e}", cfg.display()))?;
        let socket = dir.join("router.sock");
        let child = Command::new(bin)
            .arg("--config")
            .arg(&cfg)
            .arg("--socket")
            .arg(&socket)
            .args(&opts.router_args)
            .env("LNET_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let mut r = Router {
            child,
            client_side: ra,
            dir,
            socket: socket.clone(),
        };
        let deadline = StdInstant::now() + StdDuration::from_secs(10);
        let nets = loop {
            let resp = router::control::ControlClient::connect(&socket)
                .and_then(|mut c| c.call(&router::control::Request::NetShow { verbose: true }));
            if let Ok(router::control::Response::Net(n)) = resp {
                break n;
            }
            if StdInstant::now() >= deadline {
                return Err("the router did not answer on its control socket".into());
            }
            std::thread::sleep(StdDuration::from_millis(20));
        };
        for net in &nets.net {
            for ni in &net.local_nis {
                let listen = ni.ulnet.as_ref().and_then(|u| u.listen.as_deref());
                if let (Ok(n), Some(Ok(a))) =
                    (ni.nid.parse::<Nid>(), listen.map(str::parse::<SocketAddr>))
                {
                    shared.add_peer(n, a);
                    if n == rb {
                        // B learns where the router's o2ib1 NI listens.
                        let line = format!("PEER {n} {a}\n");
                        let stdin = server.child.stdin.as_mut().ok_or("B has no stdin")?;
                        stdin
                            .write_all(line.as_bytes())
                            .and_then(|()| stdin.flush())
                            .map_err(|e| format!("telling B the router's address: {e}"))?;
                    }
                }
            }
        }
        for n in [ra, rb] {
            if is_tcp(n) {
                // Where socklnd listens: the NID's address, at the acceptor port.
                shared.add_peer(
                    n,
                    SocketAddr::new(std::net::Ipv4Addr::from(n.addr()).into(), opts.accept_port),
                );
            }
            if shared.peer(n).is_none() {
                let _ = r.stop();
                return Err(format!("the router does not show where {n} listens"));
            }
        }
        Ok(r)
    }

    /// The router's forwarding counters (`lnetctl routing show`'s).
    pub(crate) fn books(&self) -> Result<router::control::ForwardingCounts, String> {
        use router::control::{ControlClient, Request, Response};
        match ControlClient::connect(&self.socket).and_then(|mut c| c.call(&Request::RoutingShow)) {
            Ok(Response::Routing(r)) => Ok(r.forwarding),
            Ok(other) => Err(format!("routing show: {other:?}")),
            Err(e) => Err(format!("routing show: {e}")),
        }
    }

    /// The router's defences against peers that hold its large buffers (see
    /// router/src/node/bulk.rs, lending large buffers): `routing show`'s bulk_stalled,
    /// bulk_refused and waited_unproven, and `net show -v`'s grants_reclaimed on the clients'
    /// NI, as `name=value` pairs.
    pub(crate) fn defence_counters(&self) -> Result<String, String> {
        use router::control::{ControlClient, Request, Response};
        let f = self.books()?;
        let why = |k: &str| {
            f.dropped_by_reason
                .iter()
                .find(|(n, _)| n == k)
                .map_or(0, |(_, v)| *v)
        };
        let reclaimed = match ControlClient::connect(&self.socket)
            .and_then(|mut c| c.call(&Request::NetShow { verbose: true }))
        {
            Ok(Response::Net(n)) => n
                .net
                .into_iter()
                .flat_map(|n| n.local_nis)
                .find(|ni| ni.nid.parse::<Nid>().ok() == Some(self.client_side))
                .and_then(|ni| ni.lnd_statistics)
                .and_then(|l| l.counters.get("grants_reclaimed"))
                .ok_or("net show -v: no grants_reclaimed")?,
            Ok(other) => return Err(format!("net show: {other:?}")),
            Err(e) => return Err(format!("net show: {e}")),
        };
        Ok(format!(
            "bulk_stalled={} bulk_refused={} waited_unproven={} grants_reclaimed={reclaimed}",
            why("bulk_stalled"),
            why("bulk_refused"),
            f.waited_unproven
        ))
    }

    /// SIGTERM (a graceful stop), bounded; then the scratch directory goes.
    pub(crate) fn stop(&mut self) -> Result<(), String> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = StdInstant::now() + SHUTDOWN_BOUND + StdDuration::from_secs(5);
        let r = loop {
            match self.child.try_wait() {
                Ok(Some(st)) if st.success() => break Ok(()),
                Ok(Some(st)) => break Err(format!("exited with {st}")),
                _ if StdInstant::now() >= deadline => {
                    let _ = self.child.kill();
                    break Err("did not stop in time (killed)".into());
                }
                _ => std::thread::sleep(StdDuration::from_millis(5)),
            }
        };
        let _ = std::fs::remove_dir_all(&self.dir);
        r
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Node B as a child process (see the module doc).
pub(crate) struct Server {
    pub(crate) child: std::process::Child,
    pub(crate) lines: mpsc::Receiver<String>,
    pub(crate) addr: SocketAddr,
}

impl Server {
    pub(crate) fn start(opts: &Opts) -> Result<Server, String> {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut child = Command::new(exe)
            .args(opts.routed.then_some("--routed"))
            .args(
                matches!(opts.mode, Mode::Bulk { .. })
                    .then(|| {
                        [
                            "--bulk-serve".to_string(),
                            "--size".into(),
                            opts.size.to_string(),
                            "--window".into(),
                            opts.window.to_string(),
                        ]
                    })
                    .into_iter()
                    .flatten(),
            )
            .args([
                "--client-net".to_string(),
                opts.client_net.name().into(),
                "--server-net".into(),
                opts.server_net.name().into(),
                "--accept-port".into(),
                opts.accept_port.max(1).to_string(),
            ])
            .args(opts.zero_copy.then_some("--zero-copy"))
            .args([
                "--serve".to_string(),
                "--peer-credits".into(),
                opts.server_peer_credits
                    .unwrap_or(opts.peer_credits)
                    .to_string(),
                "--max-wait-us".into(),
                opts.max_wait.as_micros().to_string(),
                "--busy-poll-us".into(),
                opts.busy_poll.as_micros().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let first = lines
            .recv_timeout(StdDuration::from_secs(10))
            .map_err(|_| "node B did not report its address".to_string())?;
        let addr = listen_addr(&first)
            .ok_or_else(|| format!("node B said '{first}', not LISTEN <addr>"))?;
        Ok(Server { child, lines, addr })
    }

    /// Closes B's stdin (its signal to shut down) and returns what it received.
    pub(crate) fn stop(&mut self, bound: StdDuration) -> Result<u64, String> {
        drop(self.child.stdin.take());
        let deadline = StdInstant::now() + bound;
        let mut received = None;
        while received.is_none() {
            let left = deadline.saturating_duration_since(StdInstant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => received = l.strip_prefix("RECEIVED ").and_then(|n| n.parse().ok()),
                Err(_) => break,
            }
        }
        while StdInstant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return match (st.success(), received) {
                    (true, Some(n)) => Ok(n),
                    (true, None) => Err("exited without reporting RECEIVED".into()),
                    (false, _) => Err(format!("exited with {st}")),
                };
            }
            std::thread::sleep(StdDuration::from_millis(5));
        }
        let _ = self.child.kill();
        Err("did not stop in time (killed)".into())
    }
}

/// One NI of the router's configuration: `kind` on net `nid.net()`; an o2ib NI on the tcp
/// fabric at an ephemeral port (found through its control socket), a tcp one with socklnd at
/// its NID's address and the run's acceptor port (the `acceptor:` section).
pub(crate) fn router_ni(opts: &Opts, kind: NetKind, nid: Nid, pc: u32) -> String {
    let net = nid.net();
    let busy = opts.router_busy_poll.unwrap_or(opts.busy_poll).as_micros();
    let tunables = format!(
        "          tunables:\n              peer_credits: {pc}\n              credits: {}\n",
        (pc * 64).max(256)
    );
    match kind {
        NetKind::O2ib => format!(
            "    - net type: {net}\n      fabric: tcp\n      local NI(s):\n        - nid: {nid}\n          listen: 127.0.0.1:0\n          busy poll us: {busy}\n{tunables}          lnd tunables:\n              conns_per_peer: {}\n",
            opts.router_conns_per_peer
        ),
        NetKind::Tcp => format!(
            "    - net type: {net}\n      local NI(s):\n        - nid: {nid}\n          busy poll us: {busy}\n{tunables}"
        ),
    }
}

/// A NID on a tcp net (ksocklnd's).
pub(crate) fn is_tcp(n: Nid) -> bool {
    n.net().lnd() == lnd::wire::LndType::Tcp
}

/// The address in a child's first line, `LISTEN <addr>` (node B's and tcp_relay's).
pub(crate) fn listen_addr(line: &str) -> Option<SocketAddr> {
    line.strip_prefix("LISTEN ")?.parse().ok()
}

/// `tcp_relay` between A and B (`--via-relay`); killed when dropped.
pub(crate) struct Relay {
    pub(crate) child: std::process::Child,
    pub(crate) addr: SocketAddr,
}

impl Relay {
    pub(crate) fn start(
        bin: &std::path::Path,
        args: &[String],
        to: SocketAddr,
    ) -> Result<Relay, String> {
        use std::io::BufRead;
        let mut child = std::process::Command::new(bin)
            .args(args)
            .args(["127.0.0.1:0".to_string(), to.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let mut first = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut first);
        match listen_addr(first.trim()) {
            Some(addr) => Ok(Relay { child, addr }),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "the relay said '{}', not LISTEN <addr>",
                    first.trim()
                ))
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
