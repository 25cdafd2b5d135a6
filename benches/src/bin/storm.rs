//! The LU-7646 router reboot storm under each race policy, and at scale.
//!
//!     cargo run --release -p benches --bin storm                 # policy table, 1000 clients
//!     cargo run --release -p benches --bin storm -- --scale 10000 # ours only, 10,000 clients
//!
//! Virtual-time figures (recovery, attempts, rejects, zombies) are deterministic for a seed; wall
//! time and events per second depend on the machine.

use lnd::engine::RacePolicy;
use ulnet_tests::{router_reboot_storm, StormConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut clients = 1000;
    let mut scale = false;
    let mut seed = 7646;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--scale" => {
                scale = true;
                clients = args
                    .get(i + 1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(10_000);
                i += 1;
            }
            "--clients" => {
                clients = args
                    .get(i + 1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(clients);
                i += 1;
            }
            "--seed" => {
                seed = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(seed);
                i += 1;
            }
            other => {
                eprintln!("usage: storm [--clients N] [--seed S] [--scale N]; unknown '{other}'");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let policies: Vec<RacePolicy> = if scale {
        vec![RacePolicy::Ulnet]
    } else {
        RacePolicy::ALL.to_vec()
    };
    println!(
        "router reboot storm: {clients} clients, 10% stuck connects, router down 5 s, seed {seed}"
    );
    println!(
        "| policy | recovery after router back | connect attempts | CONN_RACE rejects | max races/peer | peak zombies/peer | wall | events/s | router bytes/conn |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for policy in policies {
        let r = router_reboot_storm(&StormConfig::new(clients, policy, seed));
        let recovery = match r.recovery {
            Some(t) => format!("{:.3} s", t.as_secs_f64()),
            None => format!(
                "never ({} of {} stuck after 60 s)",
                r.unrecovered, r.clients
            ),
        };
        println!(
            "| {policy:?} | {recovery} | {} | {} | {} | {} | {:.2} s | {:.0} | {} |",
            r.connect_attempts,
            r.race_rejects,
            r.max_races_per_peer,
            r.peak_zombies,
            r.wall.as_secs_f64(),
            r.events as f64 / r.wall.as_secs_f64(),
            r.router_bytes_per_conn,
        );
    }
}
