//! The daemon's side of the control socket: binding it privately, reading requests with a size
//! cap and timeouts, the limits on clients, and the socket's counters.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use tracing::debug;

use super::client::check_socket_path;
use super::protocol::*;

// ---------------------------------------------------------------------------------- limits
//
// The control socket serves only its owner (mode 0600), but a buggy or stuck client must not
// cost the daemon memory, threads or its socket: requests are read with a size cap, idle and
// half-sent requests time out, and the clients served at once are bounded (the daemon refuses
// the excess with one error line). A capture's connection streams to its client and is never
// idle.

/// Control clients the daemon serves at once; for the next, the client idle longest is closed
/// (counted as `evicted`), or if none is idle the newcomer gets one error line ("too many
/// control clients") and is closed (counted as `refused`).
pub const MAX_CLIENTS: usize = 64;
/// A client that sends nothing for this long between requests is closed (`idle_timeouts`).
pub const DEFAULT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// A request line must be complete this long after its first byte (`request_timeouts`).
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The daemon's control socket counters (`stats show`, `control:`).
#[derive(Debug, Default)]
pub struct ControlCounters {
    /// Clients accepted and served.
    pub accepted: std::sync::atomic::AtomicU64,
    /// Clients served now (a gauge).
    pub active: std::sync::atomic::AtomicU64,
    /// Clients refused because [`MAX_CLIENTS`] were being served, none of them idle.
    pub refused: std::sync::atomic::AtomicU64,
    /// Idle clients closed to make room for a new one when [`MAX_CLIENTS`] were being served
    /// (the one idle longest; never one being answered or receiving a stream).
    pub evicted: std::sync::atomic::AtomicU64,
    /// Clients closed after sending nothing for the idle timeout.
    pub idle_timeouts: std::sync::atomic::AtomicU64,
    /// Clients closed because a request was not complete within the request timeout.
    pub request_timeouts: std::sync::atomic::AtomicU64,
    /// Clients closed because a request line was longer than [`MAX_REQUEST`].
    pub oversized: std::sync::atomic::AtomicU64,
    /// Request lines that were not a request (answered with EPROTO).
    pub bad_requests: std::sync::atomic::AtomicU64,
    /// Failed accepts on the control socket (at the descriptor limit, say).
    pub accept_errors: std::sync::atomic::AtomicU64,
}

impl ControlCounters {
    /// Adds one to `c`.
    pub fn bump(c: &std::sync::atomic::AtomicU64) {
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The counters by name, in the order `stats show` prints them.
    pub fn snapshot(&self) -> NamedCounters {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        NamedCounters(
            [
                ("clients", get(&self.accepted)),
                ("active", get(&self.active)),
                ("refused", get(&self.refused)),
                ("evicted", get(&self.evicted)),
                ("idle_timeouts", get(&self.idle_timeouts)),
                ("request_timeouts", get(&self.request_timeouts)),
                ("oversized", get(&self.oversized)),
                ("bad_requests", get(&self.bad_requests)),
                ("accept_errors", get(&self.accept_errors)),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        )
    }
}

/// What [`read_request`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadRequest {
    /// A whole line is in the buffer (without its newline; also the last, unterminated line
    /// before the client closed).
    Line,
    /// The client closed.
    Eof,
    /// Nothing arrived for the idle timeout.
    Idle,
    /// A request was begun but not finished within the request timeout.
    Stalled,
    /// The line reached [`MAX_REQUEST`] without a newline; reading stopped there.
    TooLong,
}

/// Reads one request line into `line` (cleared first), at most [`MAX_REQUEST`] bytes: waits at
/// most `idle` for its first byte (`None`: forever) and `request` from there for its newline.
/// What the reader holds past the line stays buffered for the next call; at most one buffer
/// beyond the cap is ever read.
pub fn read_request(
    r: &mut BufReader<UnixStream>,
    line: &mut Vec<u8>,
    idle: Option<std::time::Duration>,
    request: Option<std::time::Duration>,
) -> io::Result<ReadRequest> {
    use std::time::Instant as StdInstant;
    line.clear();
    let waiting = StdInstant::now();
    let mut first_byte: Option<StdInstant> = None;
    loop {
        let (deadline, what) = match first_byte {
            None => (idle.map(|d| waiting + d), ReadRequest::Idle),
            Some(t) => (request.map(|d| t + d), ReadRequest::Stalled),
        };
        if r.buffer().is_empty() {
            let timeout = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(StdInstant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(what),
                },
            };
            r.get_ref().set_read_timeout(timeout)?;
        }
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(what)
            }
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(if line.is_empty() {
                ReadRequest::Eof
            } else {
                ReadRequest::Line
            });
        }
        first_byte.get_or_insert_with(StdInstant::now);
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if line.len() + take >= MAX_REQUEST {
            return Ok(ReadRequest::TooLong);
        }
        line.extend_from_slice(&avail[..take]);
        r.consume(take + usize::from(done));
        if done {
            return Ok(ReadRequest::Line);
        }
    }
}

/// The directory a control socket is in (`.` for a bare name).
fn socket_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether the daemon may bind its control socket at `path`, and why not: the path must fit
/// in `sun_path` ([`MAX_SOCKET_PATH`](crate::control::MAX_SOCKET_PATH) bytes), or lnetctl could never connect to it (the daemon
/// binds through a shorter private name, so the bind alone would not say so); and the socket's
/// directory must exist or be one level away from an existing one ([`bind_socket`] creates that
/// last component, 0700, as the default path's `ulnet/`; a whole chain made for a mistyped path
/// was created and left behind).
pub fn check_socket_path_for_daemon(path: &Path) -> Result<(), String> {
    check_socket_path(path)?;
    let dir = socket_dir(path);
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!(
            "control socket {}: {} is not a directory",
            path.display(),
            dir.display()
        )),
        Err(_)
            if dir
                .parent()
                .is_none_or(|p| p.as_os_str().is_empty() || p.is_dir()) =>
        {
            Ok(())
        }
        Err(_) => Err(format!(
            "control socket {}: neither {} nor its parent exists (create them first, or choose \
             another --socket path)",
            path.display(),
            dir.display()
        )),
    }
}

/// Binds the control socket: creates its directory (0700; the last component only), replaces a stale socket file (one
/// nobody answers on), and puts the socket in place with mode 0600. Fails if a daemon already
/// answers.
///
/// The socket is never reachable by anyone else, not even for an instant, whatever the umask:
/// `bind` creates the file with the umask's mode, so it is bound inside a private directory made
/// for it (created 0700 or less, since a umask only removes bits, then set to exactly 0700, so
/// nobody else can even look up a name inside it), set to 0600 there, and only then given its
/// public name with a hard link (which, unlike a rename, fails instead of replacing a socket
/// another daemon put there meanwhile); the private name and directory are removed. No umask
/// change (process-wide, racy with threads) and no unsafe code.
pub fn bind_socket(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::DirBuilderExt;
    check_socket_path(path).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let dir = socket_dir(path);
    if !dir.exists() {
        // Its last component only (the default's `ulnet/`): a whole chain of directories
        // made for a mistyped path was left behind (operator audit).
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        // Only a stale socket is ever removed: a typo such as `--socket lnet-router.yaml`
        // must not cost the site its file (the operator audit lost a config that way).
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; not replacing it (choose another --socket path)",
                    path.display()
                ),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("a daemon already answers on {}", path.display()),
            ));
        }
        debug!(path = %path.display(), "removing a stale control socket");
        std::fs::remove_file(path)?;
    }
    // Short, so that the private name fits in sun_path whenever the public one does.
    let private = dir.join(format!(".u{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&private); // left by a crashed daemon with our pid
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    struct RemoveDir<'a>(&'a Path);
    impl Drop for RemoveDir<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0);
        }
    }
    let _cleanup = RemoveDir(&private);
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
    let inner = private.join("s");
    let l = UnixListener::bind(&inner)?;
    std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))?;
    std::fs::hard_link(&inner, path).map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another daemon created {} meanwhile", path.display()),
            )
        } else {
            e
        }
    })?;
    Ok(l)
}

/// Serves one client connection: reads request lines (each at most [`MAX_REQUEST`] bytes),
/// hands each to `forward` (which returns the response, e.g. after a round trip through the
/// daemon loop), writes the response. Returns when the client closes; an oversized request is
/// answered with EMSGSIZE and the connection closed.
pub fn serve_connection(
    stream: UnixStream,
    mut forward: impl FnMut(Request) -> Response,
) -> io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        match read_request(&mut reader, &mut line, None, None)? {
            ReadRequest::Line => {}
            ReadRequest::TooLong => {
                let resp = Response::Error(too_long());
                return writer.write_all(encode_response(&resp).as_bytes());
            }
            _ => return Ok(()),
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        let resp = match decode_request_bytes(&line) {
            Ok(req) => forward(req),
            Err(e) => Response::Error(e),
        };
        writer.write_all(encode_response(&resp).as_bytes())?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{ClientError, ControlClient};

    /// A directory of this test process's, `ulnet-ctl-{tag}-{pid}` under the temp dir.
    fn scratch(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("ulnet-ctl-{tag}-{}", std::process::id()))
    }

    /// A client finds no daemon at `path`.
    fn assert_no_daemon(path: &std::path::Path) {
        assert!(matches!(
            ControlClient::connect(path),
            Err(ClientError::NoDaemon { .. })
        ));
    }

    #[test]
    fn read_request_caps_lines_and_times_out() {
        use std::time::Duration as D;
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut r = BufReader::with_capacity(1024, a);
        let mut line = Vec::new();
        let t = Some(D::from_millis(50));
        // Several lines in one read, then a pause.
        b.write_all(b"\"conn_show\"\n\n{\"net_show\":{}}\n")
            .unwrap();
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Line
        );
        assert_eq!(line, b"\"conn_show\"");
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Line
        );
        assert!(line.is_empty());
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Line
        );
        assert_eq!(
            decode_request_bytes(&line).unwrap(),
            Request::NetShow { verbose: false }
        );
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Idle
        );
        // Half a line, then nothing: stalled.
        b.write_all(b"{\"net_").unwrap();
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Stalled
        );
        // A line at the cap without a newline: too long, and what was read is bounded.
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut r = BufReader::with_capacity(1024, a);
        let w = std::thread::spawn(move || {
            let chunk = vec![b'x'; 4096];
            let mut sent = 0;
            while let Ok(n) = b.write(&chunk) {
                sent += n;
            }
            sent
        });
        let long = Some(D::from_secs(10));
        assert_eq!(
            read_request(&mut r, &mut line, long, long).unwrap(),
            ReadRequest::TooLong
        );
        assert!(line.len() < MAX_REQUEST);
        drop(r);
        let sent = w.join().unwrap();
        assert!(sent < 4 * MAX_REQUEST, "{sent} bytes went in");
        // A last line without a newline, then EOF.
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut r = BufReader::new(a);
        b.write_all(b"\"stats_show\"").unwrap();
        drop(b);
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Line
        );
        assert_eq!(decode_request_bytes(&line).unwrap(), Request::StatsShow);
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Eof
        );
    }

    #[test]
    fn socket_is_private_and_serves() {
        let dir = scratch("serve");
        let path = dir.join("s.sock");
        let l = bind_socket(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            serve_connection(s, |req| match req {
                Request::GlobalShow => Response::Global(GlobalShow::default()),
                _ => Response::Error(ControlError::new(errno::EINVAL, "no")),
            })
            .unwrap();
        });
        let mut cl = ControlClient::connect(&path).unwrap();
        assert_eq!(
            cl.call(&Request::GlobalShow).unwrap(),
            Response::Global(GlobalShow::default())
        );
        assert!(matches!(
            cl.call(&Request::ConnShow).unwrap(),
            Response::Error(_)
        ));
        drop(cl);
        t.join().unwrap();
        // A second bind replaces the now stale socket file, and leaves nothing else behind.
        let _l2 = bind_socket(&path).unwrap();
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("s.sock")]);
        // While one answers, a bind fails.
        assert_eq!(
            bind_socket(&path).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert_no_daemon(&path);
    }

    /// The operator audit: `--socket a/b/c/x.sock` created the whole chain (and left it); and a
    /// path longer than `sun_path` was bound (through the short private name) though no client
    /// could reach it. Only the socket's own directory is created, and a long path is refused.
    #[test]
    fn a_missing_chain_or_an_unreachable_path_is_refused() {
        let top = scratch("chain");
        let _ = std::fs::remove_dir_all(&top);
        let e = bind_socket(&top.join("a/b/x.sock")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(!top.exists(), "nothing created");
        let e = check_socket_path_for_daemon(&top.join("a/x.sock")).unwrap_err();
        assert!(e.contains("neither"), "{e}");
        // The socket's own directory is created when its parent exists (the default's `ulnet/`).
        check_socket_path_for_daemon(&top.join("x.sock")).unwrap();
        let l = bind_socket(&top.join("x.sock")).unwrap();
        drop(l);
        std::fs::remove_dir_all(&top).unwrap();
        let long = std::env::temp_dir().join(format!("{}.sock", "x".repeat(120)));
        let e = bind_socket(&long).unwrap_err();
        assert!(e.to_string().contains("107"), "{e}");
        assert!(!long.exists());
        assert!(check_socket_path_for_daemon(&long).is_err());
        assert_no_daemon(&long);
    }

    /// The operator audit: `--socket` naming an existing regular file (a config, by a slip)
    /// replaced it with the socket, and the daemon deleted it at exit. Only a stale socket
    /// is ever removed; any other file is refused and left as it was.
    #[test]
    fn a_socket_path_naming_a_regular_file_is_refused_and_the_file_kept() {
        let dir = scratch("file");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lnet-router.yaml");
        std::fs::write(&path, b"net: []\n").unwrap();
        let e = bind_socket(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"net: []\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
