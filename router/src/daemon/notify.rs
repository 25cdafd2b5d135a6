//! sd_notify: READY and STOPPING for a service manager running the daemon with Type=notify.

use tracing::{debug, warn};

/// Sends `state` to the service manager's notification socket ($NOTIFY_SOCKET, sd_notify's
/// protocol: one datagram of newline-separated assignments; a name starting with '@' is in
/// the abstract namespace). Without $NOTIFY_SOCKET (not run by systemd with Type=notify) it
/// does nothing; a failure is logged, never fatal.
pub(super) fn sd_notify(state: &str) {
    use std::os::unix::net::UnixDatagram;
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|sock| {
        let bytes = path.as_encoded_bytes();
        match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                sock.send_to_addr(state.as_bytes(), &addr)
            }
            None => sock.send_to(state.as_bytes(), &path),
        }
    });
    match sent {
        Ok(_) => debug!(state, "notified the service manager"),
        Err(e) => warn!("cannot notify the service manager at {path:?}: {e}"),
    }
}
