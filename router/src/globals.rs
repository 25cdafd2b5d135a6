//! LNet's global tunables, as `lnetctl set NAME VALUE` sets them and `global show` prints them:
//! one table ([`TUNABLES`]) says each one's name, the range Lustre accepts, ulnet's value at
//! start and what it does here. The config file's `global:` section, `lnetctl set` and `lnetctl
//! import` all go through [`GlobalTunables::set`], so one value is checked one way.
//!
//! Several of them drive mechanisms ulnet does not have yet (LNet health and its resends and
//! recovery pings, peer discovery, NUMA): they are accepted within Lustre's range, kept and
//! shown, so an export from a kernel node imports unchanged, and their [`Tunable::effect`] says
//! so (`lnetctl set --help` prints it). Their values at start are ulnet's true ones (0 where
//! the mechanism is absent), not the kernel's defaults.

use std::fmt;

/// One tunable: its `lnetctl set` / `global show` name, the range Lustre accepts (inclusive),
/// ulnet's value at start, and what setting it does in ulnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tunable {
    pub name: &'static str,
    pub min: i64,
    pub max: i64,
    pub initial: i64,
    pub effect: &'static str,
}

const NO_HEALTH: &str = "kept and shown; no effect yet: ulnet has no LNet health";

/// Every global `lnetctl set` takes besides `routing` and the router buffers, in `global
/// show`'s order (lnetctl.c, jt_show_global). Ranges as the kernel's setters check them
/// (api-ni.c, the *_set module-parameter handlers; router.c for router_sensitivity).
pub const TUNABLES: &[Tunable] = &[
    Tunable {
        name: "numa_range",
        min: 0,
        max: u32::MAX as i64,
        initial: 0,
        effect: "kept and shown; no effect: ulnet runs each NI on its own thread, not by NUMA",
    },
    Tunable {
        name: "max_interfaces",
        min: 16,
        max: u32::MAX as i64,
        initial: crate::ping::MAX_PING_NIS as i64,
        effect: "kept and shown; ulnet's ping replies list at most its NIs (fewer than 16)",
    },
    Tunable {
        name: "discovery",
        min: 0,
        max: 1,
        initial: 0,
        effect: "kept and shown; no effect yet: ulnet has no peer discovery (no Multi-Rail)",
    },
    Tunable {
        name: "drop_asym_route",
        min: 0,
        max: 1,
        initial: 0,
        effect: "kept and shown; no effect yet: routed messages are not checked for asymmetry",
    },
    Tunable {
        name: "retry_count",
        min: 0,
        max: u32::MAX as i64,
        initial: 0,
        effect: NO_HEALTH,
    },
    Tunable {
        name: "transaction_timeout",
        min: 1,
        max: u32::MAX as i64,
        initial: 0,
        effect: "kept and shown; LND timeouts stay as each NI's config sets them",
    },
    Tunable {
        name: "health_sensitivity",
        min: 0,
        max: 1000,
        initial: 0,
        effect: NO_HEALTH,
    },
    Tunable {
        name: "recovery_interval",
        min: 1,
        max: u32::MAX as i64,
        initial: 0,
        effect: NO_HEALTH,
    },
    Tunable {
        name: "router_sensitivity",
        min: 0,
        max: 100,
        initial: 0,
        effect: "kept and shown; routes are judged by the router pinger, not health values",
    },
    Tunable {
        name: "response_tracking",
        min: 0,
        max: 3,
        initial: 0,
        effect: NO_HEALTH,
    },
    Tunable {
        name: "recovery_limit",
        min: 0,
        max: u32::MAX as i64,
        initial: 0,
        effect: NO_HEALTH,
    },
    Tunable {
        name: "max_recovery_ping_interval",
        min: 1,
        max: u32::MAX as i64,
        initial: 0,
        effect: NO_HEALTH,
    },
];

/// Keys `global show` (and so an export's `global:`) prints that are not settable: accepted on
/// import and in a config file, and skipped.
pub const READ_ONLY: &[&str] = &["lnd_timeout", "routing", "pid"];

/// Why a value was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GlobalError {
    Unknown(String),
    OutOfRange {
        name: &'static str,
        value: i64,
        min: i64,
        max: i64,
    },
    ReadOnly(String),
}

impl GlobalError {
    /// The errno lnetctl reports for it (positive).
    pub fn errno(&self) -> i32 {
        22 // EINVAL, as the kernel's setters answer every bad value
    }
}

impl fmt::Display for GlobalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GlobalError::Unknown(n) => {
                let known: Vec<&str> = TUNABLES.iter().map(|t| t.name).collect();
                write!(f, "unknown global '{n}' (known: {})", known.join(", "))
            }
            GlobalError::OutOfRange {
                name,
                value,
                min,
                max,
            } if *max == u32::MAX as i64 => {
                write!(f, "{name}: {value} is out of range (at least {min})")
            }
            GlobalError::OutOfRange {
                name,
                value,
                min,
                max,
            } => {
                write!(f, "{name}: {value} is out of range ({min}..{max})")
            }
            GlobalError::ReadOnly(n) => write!(f, "{n} cannot be set (it is shown, not set)"),
        }
    }
}

impl std::error::Error for GlobalError {}

/// The node's values of [`TUNABLES`], in that order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalTunables {
    values: Vec<i64>,
}

impl Default for GlobalTunables {
    fn default() -> Self {
        GlobalTunables {
            values: TUNABLES.iter().map(|t| t.initial).collect(),
        }
    }
}

impl GlobalTunables {
    /// The tunable called `name`.
    pub fn lookup(name: &str) -> Option<(usize, &'static Tunable)> {
        TUNABLES.iter().enumerate().find(|(_, t)| t.name == name)
    }

    /// The value of `name` (`None`: no such tunable).
    pub fn get(&self, name: &str) -> Option<i64> {
        Self::lookup(name).map(|(i, _)| self.values[i])
    }

    /// Sets `name` to `value` if Lustre's range allows it; nothing changes otherwise.
    pub fn set(&mut self, name: &str, value: i64) -> Result<(), GlobalError> {
        let Some((i, t)) = Self::lookup(name) else {
            if READ_ONLY.contains(&name) {
                return Err(GlobalError::ReadOnly(name.to_string()));
            }
            return Err(GlobalError::Unknown(name.to_string()));
        };
        if !(t.min..=t.max).contains(&value) {
            return Err(GlobalError::OutOfRange {
                name: t.name,
                value,
                min: t.min,
                max: t.max,
            });
        }
        self.values[i] = value;
        Ok(())
    }

    /// Every `(name, value)` in `global show`'s order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, i64)> + '_ {
        TUNABLES.iter().zip(&self.values).map(|(t, v)| (t.name, *v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tunable_starts_in_order_and_at_its_initial_value() {
        let g = GlobalTunables::default();
        let names: Vec<&str> = g.iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "numa_range",
                "max_interfaces",
                "discovery",
                "drop_asym_route",
                "retry_count",
                "transaction_timeout",
                "health_sensitivity",
                "recovery_interval",
                "router_sensitivity",
                "response_tracking",
                "recovery_limit",
                "max_recovery_ping_interval",
            ]
        );
        assert_eq!(g.get("discovery"), Some(0));
        assert_eq!(g.get("nope"), None);
    }

    #[test]
    fn values_outside_lustres_range_are_refused_and_change_nothing() {
        let mut g = GlobalTunables::default();
        let before = g.clone();
        for (name, bad) in [
            ("discovery", 2),
            ("drop_asym_route", -1),
            ("health_sensitivity", 1001),
            ("router_sensitivity", 101),
            ("response_tracking", 4),
            ("max_interfaces", 15),
            ("transaction_timeout", 0),
            ("recovery_interval", 0),
            ("numa_range", -1),
        ] {
            let e = g.set(name, bad).unwrap_err();
            assert!(matches!(e, GlobalError::OutOfRange { .. }), "{name}: {e}");
            assert!(e.to_string().starts_with(name), "{e}");
        }
        assert_eq!(g, before);
        assert!(matches!(g.set("routing", 1), Err(GlobalError::ReadOnly(_))));
        assert!(matches!(
            g.set("retry_cont", 1),
            Err(GlobalError::Unknown(_))
        ));
        g.set("health_sensitivity", 1000).unwrap();
        g.set("max_interfaces", 16).unwrap();
        assert_eq!(g.get("health_sensitivity"), Some(1000));
        assert_eq!(g.get("max_interfaces"), Some(16));
    }
}
