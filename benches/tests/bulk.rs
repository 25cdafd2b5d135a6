//! Bulk data between real processes over the tcp fabric, by the LND's RDMA rendezvous:
//! `lnet_perf --bulk-put/--bulk-get` directly and through a real `lnet-router` daemon whose
//! large buffers are registered on both its NIs. lnet_perf fails unless every transfer
//! ended `Ok`, the server counted as many as the client, and the last buffer transferred holds
//! the exact bytes (checked by whichever side received it); through the router, its books must
//! balance with nothing dropped. The throughput figures are `benches/bulk.sh`'s to report.

mod common;

use std::process::Command;

use common::{lnet_perf_via_router, stdout_of_success};

fn figure(stdout: &str, name: &str) -> f64 {
    stdout
        .lines()
        .find(|l| l.starts_with(&format!("FIGURE {name} ")))
        .and_then(|l| l.split("value=").nth(1))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} figure in:\n{stdout}"))
}

#[test]
fn bulk_puts_and_gets_between_processes_arrive_intact() {
    // An odd size: not a multiple of 8, not page aligned.
    for op in ["--bulk-put", "--bulk-get"] {
        let stdout = stdout_of_success(
            Command::new(env!("CARGO_BIN_EXE_lnet_perf"))
                .args([op, "1", "--size", "300001", "--warmup", "20"]),
        );
        let name = if op == "--bulk-put" {
            "ulnet_bulk_put_300001"
        } else {
            "ulnet_bulk_get_300001"
        };
        assert!(figure(&stdout, name) > 0.0, "{stdout}");
    }
}

/// PUTs, and GETs (an IMMEDIATE GET out, the REPLY back by rendezvous), through the daemon.
#[test]
fn bulk_puts_and_gets_cross_a_router_daemon_intact() {
    for (op, name) in [
        ("--bulk-put", "ulnet_bulk_put_1048576"),
        ("--bulk-get", "ulnet_bulk_get_1048576"),
    ] {
        let stdout = lnet_perf_via_router(&format!("{op} 1 --warmup 20"));
        assert!(figure(&stdout, name) > 0.0, "{stdout}");
        let books = stdout
            .lines()
            .find(|l| l.starts_with("FIGURE router_books"))
            .unwrap_or_else(|| panic!("no router books:\n{stdout}"));
        assert!(books.contains(" dropped=0 "), "{books}");
        assert!(books.contains(" in_flight=0"), "{books}");
    }
}
