//! The LU-7646 router reboot storm under each race policy, with mixed race orders, among kernel
//! clients, and at scale.
//!
//!     cargo run --release -p benches --bin storm                 # all tables, 1000 clients
//!     cargo run --release -p benches --bin storm -- --scale 10000 # ours only, 10,000 clients
//!
//! Virtual-time figures (recovery, attempts, rejects, zombies, connections) are deterministic for
//! a seed; wall time, events per second and peak RSS depend on the machine.

use lnd::engine::{RaceOrder, RacePolicy};
use lnd::wire::Nid;
use ulnet_tests::{
    peak_rss_kib, router_nid, router_reboot_storm, ClientOrders, StormConfig, StormReport,
    ROUTER_NID_ORDERS_DISAGREE,
};

fn recovery(r: &StormReport, cfg: &StormConfig) -> String {
    match r.recovery {
        Some(t) => format!("{:.3} s", t.as_secs_f64()),
        None => format!(
            "never ({} of {} stuck after {} s)",
            r.unrecovered,
            r.clients,
            cfg.horizon.as_secs_f64()
        ),
    }
}

/// Prints a markdown table's header row and the rule under it.
fn header(columns: &[&str]) {
    println!("| {} |", columns.join(" | "));
    println!("|{}", "---|".repeat(columns.len()));
}

/// The router NIDs the order tables run at: the usual one, and one at which the two race orders
/// disagree about who is higher.
fn router_nids() -> [Nid; 2] {
    let disagree = ROUTER_NID_ORDERS_DISAGREE.parse().expect("valid NID");
    [router_nid(), disagree]
}

/// The policy table: every node on one policy, the default order.
fn policy_table(clients: usize, seed: u64, policies: &[RacePolicy]) {
    header(&[
        "policy",
        "recovery after router back",
        "connect attempts",
        "CONN_RACE rejects",
        "max races/peer",
        "peak zombies/peer",
        "wall",
        "events/s",
        "router bytes/conn",
    ]);
    for &policy in policies {
        let cfg = StormConfig::new(clients, policy, seed);
        let r = router_reboot_storm(&cfg);
        println!(
            "| {policy:?} | {} | {} | {} | {} | {} | {:.2} s | {:.0} | {} |",
            recovery(&r, &cfg),
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

/// The mixed-order table: every node on one policy, the router on nidhash, half the clients on
/// each order; at the usual router NID and at one where the orders disagree.
fn mixed_order_table(clients: usize, seed: u64) {
    header(&[
        "policy",
        "router NID",
        "recovery after router back",
        "max CONN_RACE rejects/pair",
        "max conns/pair",
        "order disagreements",
        "order adoptions",
    ]);
    for policy in RacePolicy::ALL {
        for rnid in router_nids() {
            let cfg = StormConfig {
                router_nid: rnid,
                router_order: RaceOrder::NidHash,
                client_orders: ClientOrders::Alternating,
                ..StormConfig::new(clients, policy, seed)
            };
            let r = router_reboot_storm(&cfg);
            println!(
                "| {policy:?} | {rnid} | {} | {} | {} | {} | {} |",
                recovery(&r, &cfg),
                r.max_race_rejects_per_pair,
                r.max_conns_per_pair,
                r.race_order_disagreements,
                r.race_order_adoptions,
            );
        }
    }
}

/// The deployment table: a ulnet router (nidhash) rebooting among clients that run Lustre's own
/// rules, on 2.15's order or 2.16's; beside it, ulnet everywhere.
fn deployment_table(clients: usize, seed: u64) {
    header(&[
        "clients",
        "client order",
        "router NID",
        "recovery after router back",
        "max CONN_RACE rejects/pair",
        "max conns/pair",
        "order adoptions (router)",
    ]);
    let mut rows: Vec<(RacePolicy, RaceOrder)> = Vec::new();
    for policy in [
        RacePolicy::Lustre28,
        RacePolicy::Lu7646,
        RacePolicy::Lu17480,
    ] {
        for order in [RaceOrder::Nid, RaceOrder::NidHash] {
            rows.push((policy, order));
        }
    }
    rows.push((RacePolicy::Ulnet, RaceOrder::NidHash));
    for (policy, order) in rows {
        for rnid in router_nids() {
            let cfg = StormConfig {
                router_nid: rnid,
                router_order: RaceOrder::NidHash,
                client_policy: Some(policy),
                client_orders: ClientOrders::All(order),
                ..StormConfig::new(clients, RacePolicy::Ulnet, seed)
            };
            let r = router_reboot_storm(&cfg);
            let release = match order {
                RaceOrder::Nid => "nid (2.15)",
                RaceOrder::NidHash => "nidhash (2.16)",
            };
            println!(
                "| {policy:?} | {release} | {rnid} | {} | {} | {} | {} |",
                recovery(&r, &cfg),
                r.max_race_rejects_per_pair,
                r.max_conns_per_pair,
                r.race_order_adoptions,
            );
        }
    }
}

/// The routed storm over five seeds from `seed`.
fn routed_table(clients: usize, seed: u64) {
    use router::sim_storm::{routed_reboot_storm, RoutedStormConfig};
    header(&[
        "seed",
        "recovery after router back",
        "connect deadline + 2 s",
        "stuck connects",
        "pings ok / started",
        "left",
        "max CONN_RACE/pair",
        "peak conns/pair",
        "router books",
        "wall",
    ]);
    for s in seed..seed + 5 {
        let cfg = RoutedStormConfig::new(clients, s);
        let r = routed_reboot_storm(&cfg);
        let bound = r.connect_timeout + lnd::time::Duration::from_secs(2);
        println!(
            "| {s} | {} | {} | {} | {} / {} | {} | {} | {} | {} | {:.2} s |",
            r.recovery
                .map_or(format!("never ({} stuck)", r.unrecovered), |t| {
                    format!("{:.2} s", t.as_secs_f64())
                }),
            bound,
            r.stuck_connects,
            r.pings_ok,
            r.pings_started,
            r.pings_left,
            r.max_race_rejects_per_pair,
            r.peak_conns_per_pair,
            if r.router_books_reconcile {
                "reconcile"
            } else {
                "DO NOT reconcile"
            },
            r.wall.as_secs_f64()
        );
    }
}

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
    let wall = std::time::Instant::now();
    println!(
        "router reboot storm: {clients} clients, 10% stuck connects, router down 5 s, seed {seed}"
    );
    println!();
    if scale {
        policy_table(clients, seed, &[RacePolicy::Ulnet]);
    } else {
        println!("All nodes on one policy, nidhash order:");
        println!();
        policy_table(clients, seed, &RacePolicy::ALL);
        println!();
        println!(
            "Mixed race orders: all nodes on one policy, router on nidhash, half the clients on each \
             order ({} is lower than every client under both orders; {} is lower by raw NID, higher \
             by nidhash):",
            router_nid(),
            ROUTER_NID_ORDERS_DISAGREE
        );
        println!();
        mixed_order_table(clients, seed);
        println!();
        println!(
            "Deployment: a ulnet router (RacePolicy::Ulnet, nidhash) among clients running Lustre's rules:"
        );
        println!();
        deployment_table(clients, seed);
        println!();
        println!(
            "With the real routing code (router::sim_storm): LNet nodes, the router as one node per \
             NI handing messages over, clients and server pinging each other every 250 ms, router \
             down 3 s, 10% stuck connects:"
        );
        println!();
        routed_table(clients, seed);
    }
    println!();
    println!(
        "total wall {:.1} s, peak RSS {}",
        wall.elapsed().as_secs_f64(),
        peak_rss_kib().map_or_else(
            || "unknown".to_string(),
            |k| format!("{:.1} MiB", k as f64 / 1024.0)
        )
    );
}
