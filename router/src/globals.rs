//! LNet's global tunables, as `lnetctl set NAME VALUE` sets them and `global show` prints them:
//! one table ([`TUNABLES`]) says each one's name, the range Lustre accepts, ulnet's value at
//! start and what it does here. The config file's `global:` section, `lnetctl set` and `lnetctl
//! import` all go through [`GlobalTunables::set`], so one value is checked one way.
//!
//! Some drive mechanisms ulnet does not have (peer discovery, NUMA): they are accepted within
//! Lustre's range, kept and shown, so an export from a kernel node imports unchanged, and
//! their [`Tunable::effect`] says so (`lnetctl set --help` prints it). Values at start are ulnet's true ones (health off, no discovery), not the kernel's
//! defaults.

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

/// Every global `lnetctl set` takes besides `routing` and the router buffers, in `global
/// show`'s order (lnetctl.c, jt_show_global). Ranges and rules as the kernel's setters check
/// them (api-ni.c, the lnet_*_set module-parameter handlers; router.c for
/// router_sensitivity); [`GlobalTunables::set_all`] applies the rules that tie two together.
/// Each value at start is valid for `set` (sanity-lnet's restore_lnet_params sets every
/// value `global show` printed).
pub const TUNABLES: &[Tunable] = &[
    Tunable {
        name: "numa_range",
        min: 0,
        max: u32::MAX as i64,
        initial: 0,
        effect: "kept and shown; no effect: ulnet runs each NI on its own thread, not by NUMA",
    },
    Tunable {
        // Lustre replaces a value under 16 by its default, 4096, and says nothing.
        name: "max_interfaces",
        min: 0,
        max: u32::MAX as i64,
        initial: crate::ping::MAX_PING_NIS as i64,
        effect: "kept and shown; a ping reply lists the node's NIs (at most 200)",
    },
    Tunable {
        // Any non-zero value is on (the kernel keeps the inverse, discovery_disabled).
        name: "discovery",
        min: 0,
        max: u32::MAX as i64,
        initial: 0,
        effect: "kept and shown; no effect yet: ulnet has no peer discovery (no Multi-Rail)",
    },
    Tunable {
        name: "drop_asym_route",
        min: 0,
        max: u32::MAX as i64,
        initial: 0,
        effect: "kept and shown; no effect yet: routed messages are not checked for asymmetry",
    },
    Tunable {
        // Must stay below transaction_timeout, and 0 while health_sensitivity is 0.
        name: "retry_count",
        min: 0,
        max: u32::MAX as i64,
        initial: 0,
        effect: "resends a local failure (a message still queued on a connection that timed out) on a node with two NIs or more; never a remote one (Lustre resends those only to Multi-Rail peers)",
    },
    Tunable {
        // Must stay above retry_count.
        name: "transaction_timeout",
        min: 1,
        max: u32::MAX as i64,
        initial: 0,
        effect: "the recovery pings' timeout; LND timeouts stay as each NI's config sets them",
    },
    Tunable {
        // 0 turns health off and retry_count with it.
        name: "health_sensitivity",
        min: 0,
        max: 1000,
        initial: 0,
        effect: "LNet health: what a failure costs an NI or a gateway's (a router's: any) peer NI, and a success gives back; 0 turns it off",
    },
    Tunable {
        // Deprecated in Lustre: the kernel accepts a value and keeps 1.
        name: "recovery_interval",
        min: 0,
        max: u32::MAX as i64,
        initial: 1,
        effect: "accepted and ignored, as in Lustre (deprecated there)",
    },
    Tunable {
        name: "router_sensitivity",
        min: 0,
        max: 100,
        initial: 0,
        effect: "kept and shown; no effect (deprecated in Lustre too)",
    },
    Tunable {
        name: "response_tracking",
        min: 0,
        max: 3,
        initial: 0,
        effect: "kept and shown; no effect: ulnet tracks no ACK or REPLY deadlines beyond its pings",
    },
    Tunable {
        name: "recovery_limit",
        min: 0,
        max: u32::MAX as i64,
        initial: 0,
        effect: "seconds a peer NI in recovery gets recovery pings (0: for ever)",
    },
    Tunable {
        name: "max_recovery_ping_interval",
        min: 1,
        max: u32::MAX as i64,
        initial: 900,
        effect: "the longest gap between two recovery pings of a peer NI",
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
    /// Two values that Lustre does not allow together.
    Conflict(String),
}

impl GlobalError {
    /// The errno lnetctl reports for it (positive).
    pub fn errno(&self) -> i32 {
        // As the kernel's setters answer every bad value.
        lnd::wire::errno::EINVAL
    }
}

impl fmt::Display for GlobalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GlobalError::Unknown(n) => {
                let known: Vec<&str> = TUNABLES.iter().map(|t| t.name).collect();
                write!(f, "unknown global '{n}' (known: {})", known.join(", "))
            }
            // The configuration file's wording ("out of range LO..=HI"), with the real limits.
            GlobalError::OutOfRange {
                name,
                value,
                min,
                max,
            } => write!(f, "{name}: {value} is out of range {min}..={max}"),
            GlobalError::ReadOnly(n) => write!(f, "{n} cannot be set (it is shown, not set)"),
            GlobalError::Conflict(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for GlobalError {}

/// What the kernel's setter keeps for `value` (lnetctl's quirks included); `None`: it keeps
/// the value it has (recovery_interval, deprecated). Ranges are checked elsewhere.
pub fn stored(name: &str, value: i64) -> Option<i64> {
    match name {
        "max_interfaces" if value < 16 => Some(4096),
        "discovery" | "drop_asym_route" => Some(i64::from(value != 0)),
        "recovery_interval" => None,
        _ => Some(value),
    }
}

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

    /// Sets `name` to `value` if Lustre allows it; nothing changes otherwise.
    pub fn set(&mut self, name: &str, value: i64) -> Result<(), GlobalError> {
        self.set_all(&[(name, value)])
    }

    /// Sets several at once (a `global:` section): each value is checked against its range,
    /// then the rules that tie two together are checked on the result, so the order of the
    /// keys does not matter (a kernel export lists retry_count before health_sensitivity).
    /// All or nothing.
    pub fn set_all(&mut self, values: &[(&str, i64)]) -> Result<(), GlobalError> {
        let mut next = self.clone();
        for &(name, value) in values {
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
            next.values[i] = stored(t.name, value).unwrap_or(self.values[i]);
            if t.name == "health_sensitivity" && value == 0 {
                // Health off takes resends with it (lnet_health_sensitivity_set).
                next.values[Self::index("retry_count")] = 0;
            }
        }
        let retry = next.values[Self::index("retry_count")];
        let timeout = next.values[Self::index("transaction_timeout")];
        let health = next.values[Self::index("health_sensitivity")];
        if retry > 0 && health == 0 {
            return Err(GlobalError::Conflict(format!(
                "retry_count: {retry} needs health_sensitivity above 0 (resends are part of \
                 LNet health)"
            )));
        }
        // transaction_timeout 0 is "not set yet" (the node derives it from its LND timeout).
        if timeout != 0 && retry >= timeout {
            return Err(GlobalError::Conflict(format!(
                "retry_count ({retry}) must stay below transaction_timeout ({timeout})"
            )));
        }
        *self = next;
        Ok(())
    }

    /// Gives transaction_timeout a value when none was set (0): as Lustre relates them,
    /// lnd_timeout * (retry_count + 1) + 1 with no retries, and always above retry_count, so
    /// that `global show` never prints a value `set` would refuse.
    pub fn derive_transaction_timeout(&mut self, lnd_timeout_secs: u64) {
        let i = Self::index("transaction_timeout");
        if self.values[i] == 0 {
            let retry = self.values[Self::index("retry_count")];
            let lnd = i64::try_from(lnd_timeout_secs).unwrap_or(i64::MAX - 1);
            self.values[i] = (lnd + 1).max(retry + 1);
        }
    }

    fn index(name: &str) -> usize {
        Self::lookup(name).map_or(0, |(i, _)| i)
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
            ("drop_asym_route", -1),
            ("health_sensitivity", 1001),
            ("router_sensitivity", 101),
            ("response_tracking", 4),
            ("transaction_timeout", 0),
            ("max_recovery_ping_interval", 0),
            ("recovery_limit", -1),
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

    /// An out-of-range error quotes both real limits, in the configuration file's wording
    /// (the operator audit saw "4294967296 is out of range (at least 0)").
    #[test]
    fn range_errors_quote_both_limits() {
        let mut g = GlobalTunables::default();
        for (name, bad, want) in [
            (
                "numa_range",
                4_294_967_296,
                "numa_range: 4294967296 is out of range 0..=4294967295",
            ),
            (
                "transaction_timeout",
                4_294_967_296,
                "transaction_timeout: 4294967296 is out of range 1..=4294967295",
            ),
            (
                "health_sensitivity",
                1001,
                "health_sensitivity: 1001 is out of range 0..=1000",
            ),
        ] {
            assert_eq!(g.set(name, bad).unwrap_err().to_string(), want);
        }
    }

    /// Lustre's quirks, kept: what the kernel's setters do with odd values.
    #[test]
    fn lustres_setters_rules_hold() {
        let mut g = GlobalTunables::default();
        g.set("max_interfaces", 15).unwrap();
        assert_eq!(g.get("max_interfaces"), Some(4096), "under 16: the default");
        g.set("discovery", 7).unwrap();
        assert_eq!(g.get("discovery"), Some(1), "non-zero is on");
        g.set("recovery_interval", 30).unwrap();
        assert_eq!(g.get("recovery_interval"), Some(1), "deprecated: ignored");
        // Resends need health, and a transaction longer than its retries.
        let e = g.set("retry_count", 2).unwrap_err();
        assert!(matches!(e, GlobalError::Conflict(_)), "{e}");
        g.set_all(&[
            ("retry_count", 2),
            ("transaction_timeout", 150),
            ("health_sensitivity", 100),
        ])
        .unwrap();
        assert_eq!(g.get("retry_count"), Some(2));
        assert!(g.set("transaction_timeout", 2).is_err());
        assert!(g.set("retry_count", 150).is_err());
        g.set("health_sensitivity", 0).unwrap();
        assert_eq!(
            g.get("retry_count"),
            Some(0),
            "health off takes resends with it"
        );
        // All or nothing.
        let before = g.clone();
        assert!(g
            .set_all(&[("numa_range", 3), ("response_tracking", 9)])
            .is_err());
        assert_eq!(g, before);
    }

    /// sanity-lnet's restore_lnet_params sets every value `global show` printed: each one
    /// at start must be accepted back, whatever retry_count a config gave.
    #[test]
    fn every_value_at_start_can_be_set_back() {
        let mut g = GlobalTunables::default();
        g.set_all(&[("health_sensitivity", 100), ("retry_count", 60)])
            .unwrap();
        g.derive_transaction_timeout(50);
        assert_eq!(g.get("transaction_timeout"), Some(61));
        let shown: Vec<(&str, i64)> = g.iter().collect();
        for (name, value) in shown {
            let mut h = g.clone();
            h.set(name, value)
                .unwrap_or_else(|e| panic!("{name} {value}: {e}"));
            assert_eq!(h, g);
        }
    }
}
