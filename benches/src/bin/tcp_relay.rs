//! The smallest useful TCP relay: the ceiling a user-space router can reach on this machine,
//! measured in the same run as ours (`benches/bulk.sh`, `benches/routed.sh`).
//!
//!     tcp_relay [--splice | --spin] LISTEN TARGET    e.g. tcp_relay 127.0.0.1:5202 127.0.0.1:5201
//!
//! Prints `LISTEN <addr>` once bound (LISTEN may have port 0).
//!
//! Each connection accepted on LISTEN gets one to TARGET; two threads copy the bytes, one per
//! direction, with blocking reads into a 1 MiB buffer and blocking writes of what was read
//! (TCP_NODELAY on both sockets, as our fabric sets). It forwards a byte stream: no framing, no
//! credits, no buffer pool, no message boundaries, so every message an iperf3 or sockperf run
//! sends through it costs the relay one receive copy and one send copy and nothing else, which is
//! the least any process that forwards through its own memory can do. A ulnet router does that
//! much plus the LNet work; `routed / relayed` says what that work costs, `relayed / direct`
//! what a third process on the same two cores costs by itself.
//!
//! `--splice`: each direction moves the bytes socket -> pipe -> socket with splice(2) (a 1 MiB
//! pipe), so they never enter the relay's memory: the zero-copy forward a router could make on a
//! kernel TCP path. On loopback it is slower than copying (`benches/bulk.sh` runs both): the
//! socket's pages go into the pipe and out again one by one, and the receiver copies from
//! many small pieces.
//!
//! `--spin`: one thread moves every connection's bytes both ways with non-blocking reads and
//! writes, round after round, yielding the CPU between rounds without progress and never
//! sleeping while a connection is open: the busy-polling a ulnet NI does (without its 50 us
//! bound), so a small-message relay's latency is not a sleeping thread's wake-up
//! (`lnet_perf --via-relay` puts it between ulnet's own client and server).
//!
//! Runs until killed. A failed connect to TARGET closes the accepted connection.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::mpsc;
use std::thread;

const BUF: usize = 1 << 20;

/// Copies `from` into `to` until end of stream or an error, then half-closes `to` so the far
/// side sees the end too (iperf3 and sockperf end their tests that way).
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; BUF];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

/// As [`pump`], through a pipe: splice(2) from `from` into the pipe, then from the pipe to `to`.
fn pump_splice(from: TcpStream, to: TcpStream) {
    use rustix::pipe::{fcntl_setpipe_size, pipe, splice, SpliceFlags};
    let flags = SpliceFlags::MOVE | SpliceFlags::MORE;
    if let Ok((r, w)) = pipe() {
        // Unprivileged, at most /proc/sys/fs/pipe-max-size (1 MiB by default); else the default.
        let _ = fcntl_setpipe_size(&w, BUF);
        'stream: while let Ok(n) = splice(&from, None, &w, None, BUF, flags) {
            if n == 0 {
                break;
            }
            let mut left = n;
            while left > 0 {
                match splice(&r, None, &to, None, left, flags) {
                    Ok(0) | Err(_) => break 'stream,
                    Ok(k) => left -= k,
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

/// One direction of a connection in `--spin` mode: what was read and not yet written.
struct Flow {
    from: TcpStream,
    to: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    done: bool,
}

impl Flow {
    fn new(from: TcpStream, to: TcpStream) -> Flow {
        Flow {
            from,
            to,
            buf: vec![0; BUF],
            start: 0,
            end: 0,
            done: false,
        }
    }

    /// Moves what can be moved without blocking; true if anything moved (or the flow ended).
    fn step(&mut self) -> bool {
        let mut moved = false;
        loop {
            while self.start < self.end {
                match self.to.write(&self.buf[self.start..self.end]) {
                    Ok(n) => {
                        self.start += n;
                        moved = true;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return moved,
                    Err(_) => return self.end_flow(),
                }
            }
            match self.from.read(&mut self.buf) {
                Ok(0) => return self.end_flow(),
                Ok(n) => {
                    (self.start, self.end) = (0, n);
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return moved,
                Err(_) => return self.end_flow(),
            }
        }
    }

    fn end_flow(&mut self) -> bool {
        let _ = self.to.shutdown(Shutdown::Write);
        let _ = self.from.shutdown(Shutdown::Read);
        self.done = true;
        true
    }
}

/// The `--spin` thread: every flow, round after round.
fn spin(rx: mpsc::Receiver<(TcpStream, TcpStream)>) {
    let mut flows: Vec<Flow> = Vec::new();
    loop {
        let next = if flows.is_empty() {
            rx.recv().ok()
        } else {
            rx.try_recv().ok()
        };
        if let Some((a, b)) = next {
            let pair = (|| {
                a.set_nonblocking(true)?;
                b.set_nonblocking(true)?;
                Ok::<_, std::io::Error>((a.try_clone()?, b.try_clone()?))
            })();
            if let Ok((a2, b2)) = pair {
                flows.push(Flow::new(a, b));
                flows.push(Flow::new(b2, a2));
            }
        } else if flows.is_empty() {
            return;
        }
        let mut moved = false;
        for f in &mut flows {
            moved |= f.step();
        }
        flows.retain(|f| !f.done);
        if !moved {
            thread::yield_now();
        }
    }
}

fn serve(client: TcpStream, server: TcpStream, spliced: bool) -> std::io::Result<()> {
    let (c2, s2) = (client.try_clone()?, server.try_clone()?);
    let f = if spliced { pump_splice } else { pump };
    thread::spawn(move || f(client, server));
    thread::spawn(move || f(s2, c2));
    Ok(())
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mode = match args.first().map(String::as_str) {
        Some(m @ ("--splice" | "--spin")) => {
            let m = m.to_string();
            args.remove(0);
            m
        }
        _ => String::new(),
    };
    let [listen, target] = args.as_slice() else {
        eprintln!("usage: tcp_relay [--splice | --spin] LISTEN_ADDR TARGET_ADDR");
        return ExitCode::from(2);
    };
    let listener = match TcpListener::bind(listen.as_str()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("tcp_relay: bind {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(a) => println!("LISTEN {a}"),
        Err(e) => {
            eprintln!("tcp_relay: {e}");
            return ExitCode::FAILURE;
        }
    }
    let _ = std::io::stdout().flush();
    let spinner = (mode == "--spin").then(|| {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || spin(rx));
        tx
    });
    for conn in listener.incoming() {
        let accepted = conn.and_then(|c| {
            let server = TcpStream::connect(target.as_str())?;
            c.set_nodelay(true)?;
            server.set_nodelay(true)?;
            Ok((c, server))
        });
        match (accepted, &spinner) {
            (Ok(pair), Some(tx)) => {
                let _ = tx.send(pair);
            }
            (Ok((c, server)), None) => {
                if let Err(e) = serve(c, server, mode == "--splice") {
                    eprintln!("tcp_relay: {e}");
                }
            }
            (Err(e), _) => eprintln!("tcp_relay: accept or connect {target}: {e}"),
        }
    }
    ExitCode::SUCCESS
}
