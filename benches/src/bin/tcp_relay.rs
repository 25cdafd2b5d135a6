//! The smallest useful TCP relay: the ceiling a user-space router can reach on this machine,
//! measured in the same run as ours (`benches/bulk.sh`, `benches/routed.sh`).
//!
//!     tcp_relay [--splice] LISTEN TARGET     e.g. tcp_relay 127.0.0.1:5202 127.0.0.1:5201
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
//! Runs until killed. A failed connect to TARGET closes the accepted connection.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
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

fn serve(client: TcpStream, target: &str, spliced: bool) -> std::io::Result<()> {
    let server = TcpStream::connect(target)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (c2, s2) = (client.try_clone()?, server.try_clone()?);
    let f = if spliced { pump_splice } else { pump };
    thread::spawn(move || f(client, server));
    thread::spawn(move || f(s2, c2));
    Ok(())
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let spliced = args.first().is_some_and(|a| a == "--splice");
    if spliced {
        args.remove(0);
    }
    let [listen, target] = args.as_slice() else {
        eprintln!("usage: tcp_relay [--splice] LISTEN_ADDR TARGET_ADDR");
        return ExitCode::from(2);
    };
    let listener = match TcpListener::bind(listen.as_str()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("tcp_relay: bind {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    for conn in listener.incoming() {
        match conn {
            Ok(c) => {
                if let Err(e) = serve(c, target, spliced) {
                    eprintln!("tcp_relay: connect {target}: {e}");
                }
            }
            Err(e) => eprintln!("tcp_relay: accept: {e}"),
        }
    }
    ExitCode::SUCCESS
}
