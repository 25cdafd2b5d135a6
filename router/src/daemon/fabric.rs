//! An NI's fabric started (tcp on io_uring, or verbs): its listen address, retried for a while
//! when in use, and where peers listen ([`PeerAddrs`], shared by every NI's fabric).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use crate::yaml_config::FabricKind;
use lnd::driver::tcp::{TcpConfig, TcpFabric};
use lnd::driver::LndDriver;
use lnd::wire::Nid;
use tracing::{info, warn};

/// One NI's fabric, started.
pub(super) struct NiFabric {
    pub(super) kind: FabricKind,
    pub(super) driver: Box<dyn LndDriver + Send>,
    /// The address it listens on, as bound (`net show -v` shows it: a port 0 resolved).
    pub(super) listen: std::net::SocketAddr,
}

pub(super) fn fabric_supported(kind: FabricKind) -> bool {
    match kind {
        FabricKind::Tcp | FabricKind::Socket => true,
        FabricKind::Verbs => cfg!(feature = "verbs"),
        FabricKind::Sim => false,
    }
}

/// How long an NI's tcp fabric retries a listen address in use. Right after a crash the dead
/// process's listening socket may linger (its io_uring's files are released asynchronously),
/// and a router restarted by systemd must come back; but the holder may as well be a live
/// process, which nothing here can tell.
pub(super) const BIND_RETRY: StdDuration = StdDuration::from_secs(10);
/// The pause between two tries.
pub(super) const BIND_RETRY_STEP: StdDuration = StdDuration::from_millis(100);

/// Where peers listen (`peers:` of the configuration and of every import since), shared by
/// every NI's fabric: a fabric asks at each connect, so an address imported later is used by
/// the NIs already running (they kept a copy from their start, and went on connecting to the
/// NID's own address, port 987).
#[derive(Clone, Default)]
pub(super) struct PeerAddrs(Arc<std::sync::RwLock<HashMap<Nid, std::net::SocketAddr>>>);

impl PeerAddrs {
    pub(super) fn get(&self, nid: Nid) -> Option<std::net::SocketAddr> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&nid)
            .copied()
    }

    /// Adds or replaces `given`'s addresses; returns how many were new or different.
    pub(super) fn merge(&self, given: &HashMap<Nid, std::net::SocketAddr>) -> usize {
        let mut known = self.0.write().unwrap_or_else(|e| e.into_inner());
        given
            .iter()
            .filter(|&(nid, addr)| known.insert(*nid, *addr) != Some(*addr))
            .count()
    }

    /// How many of `given`'s addresses [`PeerAddrs::merge`] would add or change.
    pub(super) fn differ(&self, given: &HashMap<Nid, std::net::SocketAddr>) -> usize {
        let known = self.0.read().unwrap_or_else(|e| e.into_inner());
        given
            .iter()
            .filter(|&(nid, addr)| known.get(nid) != Some(addr))
            .count()
    }

    pub(super) fn all(&self) -> Vec<(Nid, std::net::SocketAddr)> {
        let known = self.0.read().unwrap_or_else(|e| e.into_inner());
        known.iter().map(|(n, a)| (*n, *a)).collect()
    }
}

/// Starts the fabric of one NI: listening, ready for the loop. A tcp listen address in use is
/// retried for up to [`BIND_RETRY`], unless `stopping` says the daemon is asked to stop (a
/// SIGTERM during the wait was ignored until its end).
pub(super) fn start_fabric(
    peers: &PeerAddrs,
    kind: FabricKind,
    ni: &crate::yaml_config::NiSettings,
    stopping: &dyn Fn() -> bool,
) -> Result<NiFabric, String> {
    let nid = ni.ni.nid;
    let lnd_type = nid.net().lnd();
    if !matches!(lnd_type, lnd::wire::LndType::O2ib | lnd::wire::LndType::Tcp) {
        // Kernel Lustre speaks another LND on such a net: its nodes would fail to connect
        // here with nothing on either side saying why.
        warn!(
            %nid,
            "net {} is neither an o2ib nor a tcp net: ulnet speaks o2iblnd on this NI, so \
             kernel Lustre nodes on this net cannot connect to it; only ulnet nodes can",
            nid.net(),
        );
    }
    let peers = peers.clone();
    let (driver, bound): (Box<dyn LndDriver + Send>, _) = match kind {
        FabricKind::Tcp => start_tcp(peers, ni, stopping)?,
        FabricKind::Socket => start_socket(ni)?,
        #[cfg(feature = "verbs")]
        FabricKind::Verbs => {
            use lnd::driver::verbs::{VerbsConfig, VerbsFabric};
            // o2iblnd's convention: a peer listens on its NID's IPv4 address, port 987 (the
            // `service` parameter), unless the peers table says otherwise.
            let listen = ni.listen.unwrap_or_else(|| o2ib_address(nid));
            let vc = VerbsConfig {
                listen,
                busy_poll: StdDuration::from_micros(ni.busy_poll_us.into()),
                ..VerbsConfig::default()
            };
            let me = nid;
            let own: Arc<std::sync::OnceLock<std::net::SocketAddr>> = Arc::default();
            let own_addr = Arc::clone(&own);
            let f = VerbsFabric::new(vc, move |n| {
                if n == me {
                    // Ourselves (a local NI's recovery ping): where we listen, as bound.
                    return Some(own_addr.get().copied().unwrap_or(listen));
                }
                peers.get(n).or_else(|| Some(o2ib_address(n)))
            })
            .map_err(|e| format!("NI {nid}: {e}"))?;
            info!(%nid, listen = %f.local_addr(), fabric = "verbs", "NI up");
            let bound = f.local_addr();
            let _ = own.set(bound);
            (Box::new(f), bound)
        }
        other => {
            return Err(format!(
                "NI {nid}: fabric '{}' is not available in this lnet-router",
                other.as_str()
            ))
        }
    };
    Ok(NiFabric {
        kind,
        driver,
        listen: bound,
    })
}

/// NI `ni`'s socket driver under its socklnd engine: the engine asks it to listen on the NID's
/// address and the acceptor's port (a bind that fails is the engine's `ListenFailed`: the NI
/// then takes no connection and says so), so the address returned is the one asked for.
fn start_socket(
    ni: &crate::yaml_config::NiSettings,
) -> Result<(Box<dyn LndDriver + Send>, std::net::SocketAddr), String> {
    use lnd::driver::socket::{SockFabric, SocketConfig, SocketDriver};
    let nid = ni.ni.nid;
    let port = match &ni.ni.lnd {
        crate::LndSettings::Sock(s) => s.accept_port,
        crate::LndSettings::O2ib => {
            return Err(format!(
                "NI {nid}: fabric 'socket' carries ksocklnd, for tcp nets"
            ))
        }
    };
    let cfg = SocketConfig {
        busy_poll: StdDuration::from_micros(ni.busy_poll_us.into()),
        ..SocketConfig::default()
    };
    let driver = SocketDriver::new(cfg).map_err(|e| format!("NI {nid}: {e}"))?;
    let listen = std::net::SocketAddr::new(std::net::Ipv4Addr::from(nid.addr()).into(), port);
    info!(%nid, %listen, fabric = "socket", "NI up (ksocklnd)");
    Ok((Box::new(SockFabric::new(driver)), listen))
}

/// NI `ni`'s tcp fabric, listening (see [`start_fabric`]): its driver and the address bound.
fn start_tcp(
    peers: PeerAddrs,
    ni: &crate::yaml_config::NiSettings,
    stopping: &dyn Fn() -> bool,
) -> Result<(Box<dyn LndDriver + Send>, std::net::SocketAddr), String> {
    let nid = ni.ni.nid;
    // As o2iblnd: the NID's address and port 987 unless the file says otherwise.
    let listen = ni.listen.unwrap_or_else(|| o2ib_address(nid));
    // The transport's retry horizon is the LND timeout, as an RC queue pair's retries are.
    let tcp = TcpConfig {
        user_timeout: ni.ni.tunables.timeout.into(),
        busy_poll: StdDuration::from_micros(ni.busy_poll_us.into()),
        handshake_limit: ni.handshake_limit as usize,
        // Retried here, where a stop can cut the wait short.
        bind_retry: StdDuration::ZERO,
        ..TcpConfig::default()
    };
    // Our own NID is where we listen, as bound (port 0 resolved): LNet health's
    // recovery pings of this NI go to it through the fabric (a self-connection).
    let own: Arc<std::sync::OnceLock<std::net::SocketAddr>> = Arc::default();
    let own_addr = Arc::clone(&own);
    let me = nid;
    let resolve = move |n: Nid| {
        if n == me {
            return Some(own_addr.get().copied().unwrap_or(listen));
        }
        peers.get(n).or_else(|| Some(o2ib_address(n)))
    };
    let started = std::time::Instant::now();
    let mut warned = false;
    let f = loop {
        match TcpFabric::bind_with(listen, resolve.clone(), tcp.clone()) {
            Ok(f) => break f,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                let waited = started.elapsed();
                if waited >= BIND_RETRY || stopping() {
                    let after = if waited >= BIND_RETRY {
                        format!(" (still, after retrying for {BIND_RETRY:?})")
                    } else {
                        String::new()
                    };
                    return Err(format!("NI {nid}: cannot listen on {listen}: {e}{after}"));
                }
                if !std::mem::replace(&mut warned, true) {
                    warn!(
                        %nid,
                        %listen,
                        "listen address in use; retrying for up to {BIND_RETRY:?} in \
                         case its holder is going away"
                    );
                }
                std::thread::sleep(BIND_RETRY_STEP);
            }
            Err(e) => return Err(format!("NI {nid}: cannot listen on {listen}: {e}")),
        }
    };
    info!(%nid, listen = %f.local_addr(), fabric = "tcp", "NI up");
    let bound = f.local_addr();
    let _ = own.set(bound);
    Ok((Box::new(f), bound))
}

/// Where an o2ib peer listens by default: its NID's address, o2iblnd's service port 987 (on
/// either fabric, unless `listen:` / `peers:` say otherwise).
pub(super) fn o2ib_address(nid: lnd::wire::Nid) -> std::net::SocketAddr {
    let ip = std::net::Ipv4Addr::from(nid.addr());
    std::net::SocketAddr::new(ip.into(), 987)
}
