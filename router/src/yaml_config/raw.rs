//! The raw shape of a configuration document, as serde reads it (`lnetctl export`'s keys and
//! ours), each value with its line for the errors lowering names.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;

use lnd::wire::Nid;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_saphyr::Spanned;

use super::model::FabricKind;

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[allow(dead_code)] // the ignored sections are only checked, never read
pub(super) struct RawConfig {
    pub(super) net: Option<Spanned<Vec<RawNet>>>,
    pub(super) peers: Vec<RawPeer>,
    pub(super) route: Vec<RawRoute>,
    pub(super) routing: Option<RoutingSection>,
    pub(super) selftest: Option<RawSelftest>,
    pub(super) metrics: Option<Spanned<RawMetrics>>,
    pub(super) buffers: Option<RawBuffers>,
    // Written by `lnetctl export` and lnet.conf. `global:` and `numa: range:` set LNet's global
    // tunables, checked as `lnetctl set` checks them (`crate::globals`); `peer:` entries with
    // one NI are what discovery would find anyway; what we do not implement is refused by name.
    pub(super) global: Option<Spanned<std::collections::BTreeMap<String, Spanned<i64>>>>,
    pub(super) numa: Option<RawNuma>,
    pub(super) peer: Option<Spanned<Vec<RawMrPeer>>>,
    pub(super) udsp: Option<Spanned<UnsupportedValue>>,
    pub(super) ip2nets: Option<Spanned<UnsupportedValue>>,
    pub(super) acceptor: Option<Spanned<RawAcceptor>>,
}

/// `acceptor:` (ours): the LNet acceptor of `tcp` nets.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawAcceptor {
    /// `secure`, `all` or `none`.
    pub(super) accept: Option<Spanned<String>>,
    pub(super) port: Option<Spanned<u32>>,
    pub(super) backlog: Option<Spanned<u32>>,
    /// Seconds.
    pub(super) timeout: Option<Spanned<u32>>,
    /// `HI-LO` (e.g. `1023-512`), or `0`: any port the system picks.
    #[serde(rename = "source ports")]
    pub(super) source_ports: Option<Spanned<String>>,
}

/// `numa:` as lnetctl exports it: `range: N` is the global `numa_range`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct RawNuma {
    pub(super) range: Option<Spanned<i64>>,
}

/// A `peer:` entry as `lnetctl export` writes it (Multi-Rail peers): accepted with one NI.
#[derive(Deserialize)]
#[allow(dead_code)] // only checked
pub(super) struct RawMrPeer {
    #[serde(rename = "primary nid")]
    pub(super) primary_nid: Spanned<NidValue>,
    #[serde(rename = "peer ni", default)]
    pub(super) peer_ni: Vec<IgnoredAny>,
}

/// A section we do not implement: its value is only looked at for emptiness.
pub(super) struct UnsupportedValue {
    pub(super) empty: bool,
}

impl<'de> Deserialize<'de> for UnsupportedValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Anything; an empty list, map or a null counts as absent.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Any {
            Seq(Vec<IgnoredAny>),
            Map(HashMap<String, IgnoredAny>),
            Other(IgnoredAny),
        }
        Ok(match Option::<Any>::deserialize(d)? {
            None => UnsupportedValue { empty: true },
            Some(Any::Seq(v)) => UnsupportedValue {
                empty: v.is_empty(),
            },
            Some(Any::Map(m)) => UnsupportedValue {
                empty: m.is_empty(),
            },
            Some(Any::Other(_)) => UnsupportedValue { empty: false },
        })
    }
}

/// A `route:` entry, as `lnetctl export` (and `route show -v`) write it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
pub(super) struct RawRoute {
    pub(super) net: Spanned<String>,
    pub(super) gateway: Spanned<NidValue>,
    #[serde(default)]
    pub(super) hop: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) priority: Option<Spanned<u32>>,
    #[serde(default)]
    pub(super) health_sensitivity: Option<IgnoredAny>,
    #[serde(default)]
    pub(super) state: Option<IgnoredAny>,
    #[serde(rename = "type", default)]
    pub(super) kind: Option<IgnoredAny>,
    #[serde(default)]
    pub(super) detail: Option<IgnoredAny>,
    #[serde(default)]
    pub(super) seq_no: Option<IgnoredAny>,
}

/// `routing:`: Lustre's `enable`, and the router-checking module parameters under their
/// Lustre names.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
pub(super) struct RawRouting {
    pub(super) enable: Option<Switch>,
    pub(super) alive_router_check_interval: Option<Spanned<u32>>,
    pub(super) router_ping_timeout: Option<Spanned<u32>>,
    pub(super) avoid_asym_router_failure: Option<Switch>,
    pub(super) seq_no: Option<IgnoredAny>,
}

/// `routing:` either as a mapping (lnet.conf, `export --backup`) or as `routing show` and a
/// plain `lnetctl export` print it: one `- cpt[N]:` item per CPT (state, skipped) and a last
/// `- enable: N` item.
pub(super) struct RoutingSection(pub(super) RawRouting);

impl<'de> Deserialize<'de> for RoutingSection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RoutingVisitor { item: false })
            .map(RoutingSection)
    }
}

/// One item of `routing show`'s list: `cpt[N]:` (the pools' state, skipped) or `enable:`, which
/// ulnet's export follows with the module parameters (`alive_router_check_interval`, ...).
pub(super) struct RoutingItem(pub(super) RawRouting);

impl<'de> Deserialize<'de> for RoutingItem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(RoutingVisitor { item: true })
            .map(RoutingItem)
    }
}

impl RawRouting {
    /// The keys `self` sets, else those of `earlier` (a later list item wins).
    fn or(self, earlier: RawRouting) -> RawRouting {
        RawRouting {
            enable: self.enable.or(earlier.enable),
            alive_router_check_interval: self
                .alive_router_check_interval
                .or(earlier.alive_router_check_interval),
            router_ping_timeout: self.router_ping_timeout.or(earlier.router_ping_timeout),
            avoid_asym_router_failure: self
                .avoid_asym_router_failure
                .or(earlier.avoid_asym_router_failure),
            seq_no: None,
        }
    }
}

/// Reads `routing:` as a whole (`item: false`: a strict mapping, or `routing show`'s list) or
/// one item of that list (`item: true`: a mapping whose `cpt[N]:` keys are skipped).
struct RoutingVisitor {
    item: bool,
}

impl<'de> serde::de::Visitor<'de> for RoutingVisitor {
    type Value = RawRouting;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.item {
            "a mapping (cpt[N]: ..., or enable: N)"
        } else {
            "a mapping (enable: 1), or routing show's list of cpt[N] and enable"
        })
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<RawRouting, A::Error> {
        if !self.item {
            return RawRouting::deserialize(serde::de::value::MapAccessDeserializer::new(m));
        }
        let mut r = RawRouting::default();
        while let Some(key) = m.next_key::<String>()? {
            match key.as_str() {
                "enable" => r.enable = Some(m.next_value()?),
                "alive_router_check_interval" => {
                    r.alive_router_check_interval = Some(m.next_value()?)
                }
                "router_ping_timeout" => r.router_ping_timeout = Some(m.next_value()?),
                "avoid_asym_router_failure" => r.avoid_asym_router_failure = Some(m.next_value()?),
                // `cpt[N]:`: the pools' state.
                _ => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(r)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> Result<RawRouting, A::Error> {
        if self.item {
            return Err(serde::de::Error::invalid_type(
                serde::de::Unexpected::Seq,
                &self,
            ));
        }
        let mut r = RawRouting::default();
        while let Some(RoutingItem(i)) = s.next_element()? {
            r = i.or(r);
        }
        Ok(r)
    }
}

/// `selftest:` (ours): whether the daemon runs lnet_selftest.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawSelftest {
    pub(super) enable: Option<Switch>,
}

/// `metrics:` (ours): the daemon's Prometheus endpoint (docs/metrics.md).
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub(super) listen: Option<Spanned<String>>,
    pub(super) top_peers: Option<Spanned<u32>>,
    pub(super) max_connections: Option<Spanned<u32>>,
}

/// `buffers:`: router buffers of each size, for the whole node.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
pub(super) struct RawBuffers {
    pub(super) tiny: Option<Spanned<u32>>,
    pub(super) small: Option<Spanned<u32>>,
    pub(super) large: Option<Spanned<u32>>,
    /// ulnet's: `auto`, `on` or `off` (see `router::BulkScrub`).
    pub(super) scrub: Option<Spanned<String>>,
    pub(super) seq_no: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNet {
    #[serde(rename = "net type")]
    pub(super) net_type: Spanned<String>,
    #[serde(default)]
    pub(super) fabric: Option<Spanned<FabricKind>>,
    #[serde(rename = "local NI(s)", default)]
    pub(super) local_nis: Vec<RawNi>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
pub(super) struct RawNi {
    /// Absent in `lnetctl export --backup`, which names the NI by its interface.
    pub(super) nid: Option<Spanned<NidValue>>,
    pub(super) listen: Option<SocketAddr>,
    #[serde(rename = "busy poll us")]
    pub(super) busy_poll_us: Option<Spanned<u32>>,
    #[serde(rename = "handshake limit")]
    pub(super) handshake_limit: Option<Spanned<u32>>,
    pub(super) checksum: Option<Spanned<Switch>>,
    #[serde(rename = "checksum default")]
    pub(super) checksum_default: Option<Spanned<String>>,
    #[serde(rename = "race order")]
    pub(super) race_order: Option<Spanned<String>>,
    #[serde(rename = "connect hedge ms")]
    pub(super) connect_hedge_ms: Option<Spanned<u32>>,
    #[serde(rename = "grant timeout ms")]
    pub(super) grant_timeout_ms: Option<Spanned<u32>>,
    #[serde(rename = "peer limit")]
    pub(super) peer_limit: Option<Spanned<u32>>,
    pub(super) tunables: Option<RawTunables>,
    #[serde(rename = "lnd tunables")]
    pub(super) lnd_tunables: Option<RawLndTunables>,
    // Written by `lnetctl export`, meaningless here.
    pub(super) status: Option<IgnoredAny>,
    /// `0: ib0`: the network interface whose IPv4 address makes the NID when `nid` is absent
    /// (lnetctl's `net add --if`; the kernel takes the interface's first address).
    pub(super) interfaces: Option<Spanned<std::collections::BTreeMap<u32, String>>>,
    #[serde(rename = "dev cpt")]
    pub(super) dev_cpt: Option<IgnoredAny>,
    #[serde(rename = "CPT")]
    pub(super) cpt: Option<IgnoredAny>,
    /// Written for every NI by Lustre 2.10-2.14's `lnetctl export` (the socklnd bonding
    /// removed by LU-13641); meaningless here.
    #[serde(rename = "tcp bonding")]
    pub(super) tcp_bonding: Option<IgnoredAny>,
    // Read-only state `lnetctl export` (without --backup) writes per NI.
    pub(super) statistics: Option<IgnoredAny>,
    pub(super) sent_stats: Option<IgnoredAny>,
    pub(super) received_stats: Option<IgnoredAny>,
    pub(super) dropped_stats: Option<IgnoredAny>,
    #[serde(rename = "health stats")]
    pub(super) health_stats: Option<IgnoredAny>,
    #[serde(rename = "udsp info")]
    pub(super) udsp_info: Option<IgnoredAny>,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
pub(super) struct RawTunables {
    pub(super) peer_timeout: Option<u32>,
    pub(super) peer_credits: Option<Spanned<u32>>,
    pub(super) peer_buffer_credits: Option<u32>,
    pub(super) credits: Option<Spanned<u32>>,
    // Lustre 2.12-2.14's `lnetctl export` writes o2iblnd's tunables here, beside LNet's, and
    // leaves `lnd tunables:` empty (liblnetconfig.c, lustre_lnet_show_net, until 2.15): taken
    // as the LND's when `lnd tunables` does not give them.
    pub(super) peercredits_hiw: Option<Spanned<u32>>,
    pub(super) concurrent_sends: Option<Spanned<u32>>,
    pub(super) conns_per_peer: Option<Spanned<u32>>,
    pub(super) map_on_demand: Option<IgnoredAny>,
    pub(super) fmr_pool_size: Option<IgnoredAny>,
    pub(super) fmr_flush_trigger: Option<IgnoredAny>,
    pub(super) fmr_cache: Option<IgnoredAny>,
    pub(super) ntx: Option<IgnoredAny>,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
pub(super) struct RawLndTunables {
    pub(super) peercredits_hiw: Option<Spanned<u32>>,
    pub(super) concurrent_sends: Option<Spanned<u32>>,
    /// Seconds.
    pub(super) timeout: Option<Spanned<u32>>,
    /// Seconds.
    pub(super) keepalive: Option<Spanned<u32>>,
    // Written by `lnetctl export`, meaningless here.
    pub(super) map_on_demand: Option<IgnoredAny>,
    pub(super) fmr_pool_size: Option<IgnoredAny>,
    pub(super) fmr_flush_trigger: Option<IgnoredAny>,
    pub(super) fmr_cache: Option<IgnoredAny>,
    pub(super) ntx: Option<IgnoredAny>,
    /// o2iblnd's: connections opened to each peer (0: 1).
    pub(super) conns_per_peer: Option<Spanned<u32>>,
    pub(super) tos: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPeer {
    pub(super) nid: Spanned<NidValue>,
    pub(super) address: SocketAddr,
}

/// An on/off setting: YAML's `true`/`false` or the words `on`/`off`.
pub(super) struct Switch(pub(super) bool);

impl<'de> Deserialize<'de> for Switch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Switch, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Switch;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("on or off")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Switch, E> {
                Ok(Switch(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Switch, E> {
                match v.trim() {
                    "on" | "true" | "yes" | "1" => Ok(Switch(true)),
                    "off" | "false" | "no" | "0" => Ok(Switch(false)),
                    other => Err(E::custom(format!("'{other}' is not on or off"))),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Switch, E> {
                match v {
                    0 => Ok(Switch(false)),
                    1 => Ok(Switch(true)),
                    other => Err(E::custom(format!("{other} is not on or off"))),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Switch, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::custom(format!("{v} is not on or off"))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A NID, parsed while deserializing so that a bad one is reported at its line with lnd's
/// [`NidParseError`](lnd::wire::NidParseError) message.
pub(super) struct NidValue(pub(super) Nid);

impl<'de> Deserialize<'de> for NidValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<NidValue, D::Error> {
        let s = String::deserialize(d)?;
        s.trim()
            .parse()
            .map(NidValue)
            .map_err(serde::de::Error::custom)
    }
}
