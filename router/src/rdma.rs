//! Which fabric an o2ib net gets when its configuration does not say: verbs when the daemon is
//! built with it and each NI's address is on an RDMA device, else tcp (with one warning). An
//! address is on an RDMA device when the network interface that holds it is one: an IPoIB or
//! RoCE interface of an HCA (`/sys/class/net/IF/device/infiniband/DEV`, as rdma-core's
//! ibdev2netdev finds it), or the netdev a RoCE device (Soft-RoCE included) names in its GID
//! table (`/sys/class/infiniband/DEV/ports/N/gid_attrs/ndevs/*`) or as its `parent`.

use std::net::Ipv4Addr;
use std::path::Path;

/// The network interface holding `ip`, from this host's interface list.
pub fn interface_of(ip: Ipv4Addr) -> Option<String> {
    let addrs = if_addrs::get_if_addrs().ok()?;
    addrs
        .into_iter()
        .find(|a| a.ip() == std::net::IpAddr::V4(ip))
        .map(|a| a.name)
}

/// The RDMA device behind network interface `ifname`, looking under `sysfs` (`/sys`).
pub fn rdma_device_of(ifname: &str, sysfs: &Path) -> Option<String> {
    // An HCA's own netdev (IPoIB, or RoCE on a NIC with RDMA): its PCI device has the
    // infiniband device under it.
    let under = sysfs
        .join("class/net")
        .join(ifname)
        .join("device/infiniband");
    if let Some(dev) = first_entry(&under) {
        return Some(dev);
    }
    // A RoCE device that names the netdev: in its GID table, or as its parent (rxe).
    let ib = sysfs.join("class/infiniband");
    for dev in std::fs::read_dir(&ib).ok()?.flatten() {
        let name = dev.file_name().to_string_lossy().into_owned();
        let path = dev.path();
        if read_trim(&path.join("parent")).as_deref() == Some(ifname) {
            return Some(name);
        }
        for port in std::fs::read_dir(path.join("ports"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let ndevs = port.path().join("gid_attrs/ndevs");
            for gid in std::fs::read_dir(ndevs).into_iter().flatten().flatten() {
                if read_trim(&gid.path()).as_deref() == Some(ifname) {
                    return Some(name);
                }
            }
        }
    }
    None
}

fn first_entry(dir: &Path) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.into_iter().next()
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tree(std::path::PathBuf);
    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tree(name: &str, files: &[(&str, &str)]) -> Tree {
        let root = std::env::temp_dir().join(format!("ulnet-sysfs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, content) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            if path.ends_with('/') {
                std::fs::create_dir_all(&p).unwrap();
            } else {
                std::fs::write(&p, content).unwrap();
            }
        }
        Tree(root)
    }

    #[test]
    fn finds_an_hca_netdev_a_roce_gid_netdev_and_an_rxe_parent() {
        let t = tree(
            "all",
            &[
                ("class/net/ib0/device/infiniband/mlx5_0/", ""),
                ("class/net/eth0/address", "00:00:00:00:00:01"),
                ("class/net/eth1/address", "00:00:00:00:00:02"),
                ("class/net/eth2/address", "00:00:00:00:00:03"),
                (
                    "class/infiniband/mlx5_1/ports/1/gid_attrs/ndevs/0",
                    "eth1\n",
                ),
                (
                    "class/infiniband/mlx5_1/ports/1/gid_attrs/ndevs/1",
                    "eth1\n",
                ),
                ("class/infiniband/rxe0/parent", "eth2\n"),
            ],
        );
        assert_eq!(rdma_device_of("ib0", &t.0).as_deref(), Some("mlx5_0"));
        assert_eq!(rdma_device_of("eth1", &t.0).as_deref(), Some("mlx5_1"));
        assert_eq!(rdma_device_of("eth2", &t.0).as_deref(), Some("rxe0"));
        assert_eq!(rdma_device_of("eth0", &t.0), None);
        assert_eq!(rdma_device_of("nosuch", &t.0), None);
    }

    #[test]
    fn no_rdma_at_all_is_none() {
        let t = tree("none", &[("class/net/eth0/address", "x")]);
        assert_eq!(rdma_device_of("eth0", &t.0), None);
        assert_eq!(
            interface_of(Ipv4Addr::new(127, 0, 0, 1)).as_deref(),
            Some("lo")
        );
        assert_eq!(
            rdma_device_of("lo", Path::new("/sys")),
            None,
            "lo is no RDMA device"
        );
    }
}
