//! The configuration as the daemon takes it: each net's fabric when the file names none, one
//! listen address per NI (a clash refused at once), an NI's settings for its control service.

use std::path::Path;

use crate::control::NiExtras;
use crate::yaml_config::{DaemonConfig, FabricKind};
use tracing::{info, warn};

use super::fabric::{fabric_supported, o2ib_address};

/// A net without `fabric`: verbs when built with it and every NI's address is on an RDMA
/// device, else tcp with one warning saying why.
pub(super) fn choose_fabric(net: &mut crate::yaml_config::NetSettings) {
    let devices: Vec<Option<String>> = net
        .nis
        .iter()
        .map(|ni| {
            let ip = std::net::Ipv4Addr::from(ni.ni.nid.addr());
            crate::rdma::interface_of(ip)
                .and_then(|ifname| crate::rdma::rdma_device_of(&ifname, Path::new("/sys")))
        })
        .collect();
    let all_rdma = !devices.is_empty() && devices.iter().all(Option::is_some);
    if all_rdma && fabric_supported(FabricKind::Verbs) {
        info!(net = %net.net, devices = ?devices, "no 'fabric' for this net: its NIs are on RDMA devices, using verbs");
        net.fabric = FabricKind::Verbs;
        return;
    }
    let why = if all_rdma {
        "its NIs are on RDMA devices but this daemon is built without verbs"
    } else if devices.iter().any(Option::is_some) {
        "not every NI of it is on an RDMA device"
    } else {
        "no NI of it is on an RDMA device"
    };
    warn!(
        net = %net.net,
        "no 'fabric' for this net: using tcp (o2iblnd over TCP sockets): {why}; set \
         'fabric: verbs' for RDMA"
    );
}

/// Where NI `ni` listens before it is bound: its `listen:`, else its NID's address, port 987.
pub(super) fn listen_of(ni: &crate::yaml_config::NiSettings) -> std::net::SocketAddr {
    ni.listen.unwrap_or_else(|| o2ib_address(ni.ni.nid))
}

/// Whether two NIs listening on `a` and `b` (on one fabric) would take the same address: one
/// port, not 0 (the OS picks a free one), and one IP or a wildcard on either side.
pub(super) fn listens_clash(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Two NIs of the configuration on one listen address: a configuration error, said at once
/// (binding the second only failed after the 10 s wait meant for a restarted daemon's
/// lingering socket, with a warning about a killed process that never was).
pub(super) fn listen_clash(cfg: &DaemonConfig) -> Option<String> {
    let nis: Vec<_> = cfg.nis().collect();
    nis.iter().enumerate().find_map(|(i, (net, ni))| {
        nis[..i]
            .iter()
            .find(|(n, o)| n.fabric == net.fabric && listens_clash(listen_of(o), listen_of(ni)))
            .map(|(_, o)| {
                format!(
                    "NIs {} and {} both listen on {} (give each NI its own `listen:` address \
                     or port)",
                    o.ni.nid,
                    ni.ni.nid,
                    listen_of(ni)
                )
            })
    })
}

pub(super) fn extras_of(
    ni: &crate::yaml_config::NiSettings,
    listen: std::net::SocketAddr,
) -> NiExtras {
    NiExtras {
        peer_timeout: ni.peer_timeout,
        peer_buffer_credits: ni.peer_buffer_credits,
        listen: Some(listen),
        busy_poll_us: Some(ni.busy_poll_us),
        handshake_limit: Some(ni.handshake_limit),
    }
}
