//! How fast this machine scrubs router buffers: 1 MiB buffers zeroed as a router zeroes a large
//! buffer before lending it again (`LnetNode::scrub_bulk`: `SharedMem::with` and a fill), one
//! core, for `SECS` seconds (default 2). Prints `FIGURE scrub_rate_gbps value=..` and what one
//! core spends scrubbing at a given line rate (`--line-gbps`, default 12.5 GB/s: 100 Gb/s
//! InfiniBand), since every byte forwarded through a scrubbing router is written once more.
//!
//!     cargo run --release -p benches --bin scrub_rate -- [SECS] [--line-gbps GBPS]

use std::time::{Duration, Instant};

use lnd::fabric::SharedMem;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut secs = 2.0f64;
    let mut line = 12.5f64;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--line-gbps" => {
                line = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(line);
                i += 1;
            }
            s => secs = s.parse().unwrap_or(secs),
        }
        i += 1;
    }
    const MIB: usize = 1 << 20;
    // More buffers than the caches hold, touched once first, as a router's pool is.
    let bufs: Vec<SharedMem> = (0..256).map(|_| SharedMem::new(MIB)).collect();
    for b in &bufs {
        b.with(|m| m.fill(1));
    }
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut k = 0;
    while start.elapsed() < Duration::from_secs_f64(secs) {
        for _ in 0..16 {
            bufs[k % bufs.len()].with(|m| m.fill(0));
            bytes += MIB as u64;
            k += 1;
        }
    }
    let gbps = bytes as f64 / start.elapsed().as_secs_f64() / 1e9;
    println!("FIGURE scrub_rate_gbps value={gbps:.2}");
    println!(
        "FIGURE scrub_core_share_at_line_rate value={:.2} line_gbps={line}",
        line / gbps
    );
}
