//! [`ControlClient`]: lnetctl's blocking client of the daemon's control socket.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use super::protocol::{encode_request, Request, Response};

/// The most bytes of a Unix socket path: `sun_path` holds 108 with the terminating NUL.
pub const MAX_SOCKET_PATH: usize = 107;

/// Whether a Unix socket can be reached at `path`: at most [`MAX_SOCKET_PATH`] bytes.
pub fn check_socket_path(path: &Path) -> Result<(), String> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(format!(
            "the control socket path is {len} bytes; a Unix socket path has at most \
             {MAX_SOCKET_PATH} (sun_path), or no client can connect to it: choose a shorter one"
        ));
    }
    Ok(())
}

/// A path as an error message names it: cut to an excerpt.
fn router_excerpt(path: &Path) -> String {
    crate::text::excerpt(&path.to_string_lossy(), crate::text::EXCERPT_CHARS).into_owned()
}

/// Why a client call failed.
#[derive(Debug)]
pub enum ClientError {
    /// Nothing listens at the path (absent, or connection refused).
    NoDaemon { path: PathBuf, source: io::Error },
    /// Any other I/O error.
    Io(io::Error),
    /// The daemon answered something that is not a response.
    Protocol(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::NoDaemon { path, source } => write!(
                f,
                "no lnet-router daemon at {} ({source}); start lnet-router or pass --socket",
                path.display()
            ),
            ClientError::Io(e) => write!(f, "control socket: {e}"),
            ClientError::Protocol(m) => write!(f, "control protocol: {m}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// A blocking client: one request at a time (or one capture stream).
pub struct ControlClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// A response line read in part when a [`ControlClient::recv_timeout`] timed out.
    partial: Vec<u8>,
    /// Our request could not be written because the daemon had closed the connection; what
    /// it wrote before closing (a refusal) is still read, and this is the error if nothing was.
    write_error: Option<io::Error>,
}

impl ControlClient {
    /// Connects; a missing socket or a refused connection is [`ClientError::NoDaemon`].
    pub fn connect(path: &Path) -> Result<ControlClient, ClientError> {
        // No daemon binds a path this long (`check_socket_path`): say so, not "SUN_LEN".
        if let Err(why) = check_socket_path(path) {
            return Err(ClientError::NoDaemon {
                path: PathBuf::from(router_excerpt(path)),
                source: io::Error::new(io::ErrorKind::InvalidInput, why),
            });
        }
        match UnixStream::connect(path) {
            Ok(s) => {
                let writer = s.try_clone().map_err(ClientError::Io)?;
                Ok(ControlClient {
                    reader: BufReader::new(s),
                    writer,
                    partial: Vec::new(),
                    write_error: None,
                })
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                Err(ClientError::NoDaemon {
                    path: path.to_path_buf(),
                    source: e,
                })
            }
            Err(e) => Err(ClientError::Io(e)),
        }
    }

    /// Sends `req`, waits for its response.
    pub fn call(&mut self, req: &Request) -> Result<Response, ClientError> {
        self.send(req)?;
        loop {
            if let Some(r) = self.recv_timeout(None)? {
                return Ok(r);
            }
        }
    }

    /// Sends `req` without waiting for anything.
    pub fn send(&mut self, req: &Request) -> Result<(), ClientError> {
        let line = encode_request(req).map_err(ClientError::Protocol)?;
        match self.writer.write_all(line.as_bytes()) {
            Ok(()) => Ok(()),
            // The daemon answered and closed before reading us: the refusal it sends when it
            // serves as many clients as it takes ("too many control clients"). Its line is
            // still there to read; lnetctl printed "Broken pipe" instead.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                self.write_error = Some(e);
                Ok(())
            }
            Err(e) => Err(ClientError::Io(e)),
        }
    }

    /// The next response, waiting at most `timeout` (`None`: as long as it takes). `Ok(None)`
    /// when the time passed first (or a signal interrupted the wait); a line read in part is
    /// kept for the next call. The daemon closing the connection is a protocol error.
    pub fn recv_timeout(
        &mut self,
        timeout: Option<std::time::Duration>,
    ) -> Result<Option<Response>, ClientError> {
        let timeout = timeout.map(|t| t.max(std::time::Duration::from_millis(1)));
        self.reader
            .get_ref()
            .set_read_timeout(timeout)
            .map_err(ClientError::Io)?;
        match self.reader.read_until(b'\n', &mut self.partial) {
            Ok(_) if self.partial.last() == Some(&b'\n') => {
                let r = super::decode_response(&self.partial).map_err(ClientError::Protocol);
                self.partial.clear();
                r.map(Some)
            }
            Ok(_) => Err(match self.write_error.take() {
                Some(e) => ClientError::Io(e),
                None => ClientError::Protocol("daemon closed the connection".into()),
            }),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(ClientError::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{encode_response, ControlError, Request, Response};

    /// A daemon that answers and closes before it reads the request (its refusal when it has
    /// as many clients as it takes): the client reads the answer, not "Broken pipe".
    #[test]
    fn an_answer_written_before_the_daemon_closed_is_read() {
        let dir = std::env::temp_dir().join(format!("ulnet-client-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("ctl.sock");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let refusal = Response::Error(ControlError::new(
            crate::control::errno::EBUSY,
            "too many control clients (64 at once); try again",
        ));
        let line = encode_response(&refusal);
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(line.as_bytes()).unwrap();
            // Closed without reading: the client's write finds no reader.
        });
        let mut c = ControlClient::connect(&path).unwrap();
        server.join().unwrap();
        // A request longer than the socket buffer cannot slip in before the close is seen.
        let big = Request::NetDel {
            net: Some("o2ib".into()),
            nid: Some("x".repeat(300_000)),
        };
        let got = c.call(&big);
        let _ = std::fs::remove_dir_all(&dir);
        match got {
            Ok(Response::Error(e)) => {
                assert!(e.message.contains("too many control clients"), "{e:?}")
            }
            other => panic!("{other:?}"),
        }
    }
}
