//! `fabric: verbs` on a host without an RDMA device (CI's machines): the daemon must refuse to
//! start that NI with one clear message and a non-zero exit, and leave nothing behind (no control
//! socket). Built without the `verbs` feature it says how to get one; with it, that no device
//! exists. On a host that has an RDMA device the with-feature case is skipped (the Soft-RoCE guest
//! run covers the daemon on real verbs).

mod common;

use common::{run_to_exit, Scratch};

/// Runs the daemon with `args` on a config with one o2ib NI on `fabric: verbs`, in a scratch
/// directory of its own, and checks that it refused to start: exit status `code`, one line on
/// stderr that contains `says`, no control socket left behind.
fn assert_refused(test: &str, args: &[&str], code: i32, says: &str) {
    let dir = Scratch::new(&format!("verbs-host-{test}"));
    let cfg = dir.join("verbs.yaml");
    std::fs::write(
        &cfg,
        "net:\n    - net type: o2ib\n      fabric: verbs\n      local NI(s):\n        - nid: 10.0.0.1@o2ib\n",
    )
    .unwrap();
    let o = run_to_exit(&cfg, &dir.join("s.sock"), args, Some("off"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{err}");
    assert!(err.contains(says), "{err}");
    assert_eq!(err.lines().count(), 1, "one message, not several: {err}");
    assert!(!dir.join("s.sock").exists());
}

#[cfg(feature = "verbs")]
fn rdma_device_present() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[cfg(not(feature = "verbs"))]
#[test]
fn verbs_fabric_without_the_feature_is_a_config_error() {
    assert_refused(
        "nofeature",
        &[],
        2,
        "fabric 'verbs' needs an lnet-router built with the verbs feature",
    );
}

#[cfg(feature = "verbs")]
#[test]
fn verbs_fabric_without_a_device_fails_with_one_clear_message() {
    if rdma_device_present() {
        eprintln!("an RDMA device exists here: skipping the no-device assertion");
        return;
    }
    // The message names the NI and the cause.
    assert_refused("nodevice", &[], 1, "NI 10.0.0.1@o2ib: no RDMA device");
}

/// Only tcp NIs can share a thread: asking for it with a verbs NI is a configuration error,
/// said in one line before anything starts.
#[cfg(feature = "verbs")]
#[test]
fn a_shared_ni_thread_with_a_verbs_ni_is_a_config_error() {
    assert_refused(
        "shared",
        &["--ni-threads", "shared"],
        2,
        "--ni-threads shared: net o2ib is on fabric 'verbs'",
    );
}
