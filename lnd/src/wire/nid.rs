//! NIDs and networks in Lustre's 64-bit form (lnet-types.h, nidstrings.c).
//!
//! A NID is `net << 32 | address`; a net is `lnd_type << 16 | number`. The string form is
//! `ADDR@NET`, where NET is the LND name followed by its number, omitted when zero (`o2ib` ==
//! `o2ib0`). IP-based LNDs take a dotted quad, the others a decimal number.

use core::fmt;
use core::str::FromStr;

/// An LND (network driver) type, with Lustre's numbers (nidstr.h). Retired numbers are never
/// produced by name, only kept as `Other` when seen on the wire.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LndType {
    /// socklnd, named `tcp` (2).
    Tcp,
    /// o2iblnd, named `o2ib` (5).
    O2ib,
    /// The loopback LND, named `lo` (9).
    Lo,
    /// gnilnd, `gni` (13).
    Gni,
    /// `gip` (14), IP-addressed.
    Gip,
    /// `ptlf` (15).
    Ptlf,
    /// kfilnd, `kfi` (16).
    Kfi,
    /// `efa` (18), IP-addressed.
    Efa,
    /// `bxi3f` (19).
    Bxi3f,
    /// Any other number: printed as `<type:num>` and not parseable by name.
    Other(u16),
}

const NAMES: &[(LndType, &str)] = &[
    (LndType::Tcp, "tcp"),
    (LndType::O2ib, "o2ib"),
    (LndType::Lo, "lo"),
    (LndType::Gni, "gni"),
    (LndType::Gip, "gip"),
    (LndType::Ptlf, "ptlf"),
    (LndType::Kfi, "kfi"),
    (LndType::Efa, "efa"),
    (LndType::Bxi3f, "bxi3f"),
];

impl LndType {
    /// The type number carried in the top 16 bits of a net.
    pub const fn number(self) -> u16 {
        match self {
            LndType::Tcp => 2,
            LndType::O2ib => 5,
            LndType::Lo => 9,
            LndType::Gni => 13,
            LndType::Gip => 14,
            LndType::Ptlf => 15,
            LndType::Kfi => 16,
            LndType::Efa => 18,
            LndType::Bxi3f => 19,
            LndType::Other(n) => n,
        }
    }

    /// The type with this number.
    pub const fn from_number(n: u16) -> LndType {
        match n {
            2 => LndType::Tcp,
            5 => LndType::O2ib,
            9 => LndType::Lo,
            13 => LndType::Gni,
            14 => LndType::Gip,
            15 => LndType::Ptlf,
            16 => LndType::Kfi,
            18 => LndType::Efa,
            19 => LndType::Bxi3f,
            n => LndType::Other(n),
        }
    }

    /// The name used in NID strings, if the type has one.
    pub fn name(self) -> Option<&'static str> {
        NAMES.iter().find(|(t, _)| *t == self).map(|(_, n)| *n)
    }

    /// Whether addresses of this type are written as dotted-quad IPv4 addresses.
    pub const fn ip_addressed(self) -> bool {
        matches!(
            self,
            LndType::Tcp | LndType::O2ib | LndType::Gip | LndType::Efa
        )
    }
}

/// A network: LND type and network number.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Net(u32);

impl Net {
    /// `lo`, the loopback network.
    pub const LO: Net = Net::new(LndType::Lo, 0);

    /// The net of type `lnd` with number `num`.
    pub const fn new(lnd: LndType, num: u16) -> Net {
        Net(((lnd.number() as u32) << 16) | num as u32)
    }

    /// The net with this raw 32-bit value.
    pub const fn from_raw(raw: u32) -> Net {
        Net(raw)
    }

    /// The raw 32-bit value.
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// The LND type.
    pub const fn lnd(self) -> LndType {
        LndType::from_number((self.0 >> 16) as u16)
    }

    /// The network number.
    pub const fn number(self) -> u16 {
        self.0 as u16
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.lnd().name() {
            Some(name) if self.number() == 0 => f.write_str(name),
            Some(name) => write!(f, "{name}{}", self.number()),
            None => write!(f, "<{}:{}>", self.lnd().number(), self.number()),
        }
    }
}

impl FromStr for Net {
    type Err = NidParseError;

    fn from_str(s: &str) -> Result<Net, NidParseError> {
        parse_net(s, s)
    }
}

/// A 64-bit NID.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Nid(u64);

impl Nid {
    /// LNET_NID_ANY: all ones; matches any NID and is never a sender.
    pub const ANY: Nid = Nid(u64::MAX);
    /// `0@lo`: "myself".
    pub const LO_0: Nid = Nid::new(Net::LO, 0);

    /// The NID with address `addr` on `net`.
    pub const fn new(net: Net, addr: u32) -> Nid {
        Nid(((net.0 as u64) << 32) | addr as u64)
    }

    /// The NID with this raw 64-bit value.
    pub const fn from_raw(raw: u64) -> Nid {
        Nid(raw)
    }

    /// The raw 64-bit value, as carried on the wire.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The network part.
    pub const fn net(self) -> Net {
        Net((self.0 >> 32) as u32)
    }

    /// The address part.
    pub const fn addr(self) -> u32 {
        self.0 as u32
    }

    /// True for LNET_NID_ANY.
    pub const fn is_any(self) -> bool {
        self.0 == u64::MAX
    }

    /// Lustre 2.16's `nidhash` (lnet-types.h): the net (`lnd type << 16 | number`) XOR the four
    /// address words of `struct lnet_nid`, which hold the address in network byte order and are
    /// read as native u32s. For a 4-byte address only the first word is set, and on the
    /// little-endian hosts Lustre runs on it reads as the address byte-swapped. Kernel LNet since
    /// 2.16 (LU-17743) orders NIDs by this value to settle connection races, so a peer must
    /// compute it as a little-endian host does, whatever host it runs on.
    pub const fn nidhash(self) -> u32 {
        self.net().raw() ^ self.addr().swap_bytes()
    }
}

impl fmt::Display for Nid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_any() {
            // libcfs_nid2str prints LNET_NID_ANY as "<?>".
            return f.write_str("<?>");
        }
        let net = self.net();
        if net.lnd().ip_addressed() {
            let [a, b, c, d] = self.addr().to_be_bytes();
            write!(f, "{a}.{b}.{c}.{d}@{net}")
        } else {
            write!(f, "{}@{net}", self.addr())
        }
    }
}

impl FromStr for Nid {
    type Err = NidParseError;

    /// Parses `ADDR@NET`. As in Lustre (libcfs_str2nid), an address without `@NET` is on `tcp`.
    fn from_str(s: &str) -> Result<Nid, NidParseError> {
        let (addr, net) = match s.rsplit_once('@') {
            Some((a, n)) => (a, parse_net(n, s)?),
            None => (s, Net::new(LndType::Tcp, 0)),
        };
        let addr = if net.lnd().ip_addressed() {
            parse_ipv4(addr).ok_or_else(|| NidParseError::BadAddress {
                input: s.to_owned(),
                addr: addr.to_owned(),
                expected: "a dotted-quad IPv4 address",
            })?
        } else {
            parse_decimal(addr).ok_or_else(|| NidParseError::BadAddress {
                input: s.to_owned(),
                addr: addr.to_owned(),
                expected: "a decimal number",
            })?
        };
        Ok(Nid::new(net, addr))
    }
}

fn parse_net(s: &str, input: &str) -> Result<Net, NidParseError> {
    // Names may contain digits themselves ("o2ib"), so match a known name as a prefix and take
    // the rest as the number, as libcfs_str2net_internal does.
    let Some((lnd, num)) = NAMES
        .iter()
        .filter_map(|(t, n)| s.strip_prefix(n).map(|rest| (*t, rest)))
        .max_by_key(|(_, rest)| core::cmp::Reverse(rest.len()))
    else {
        let name = s.trim_end_matches(|c: char| c.is_ascii_digit());
        return Err(if name.is_empty() {
            NidParseError::MissingNetType {
                input: input.to_owned(),
            }
        } else {
            NidParseError::UnknownNetType {
                input: input.to_owned(),
                name: name.to_owned(),
            }
        });
    };
    let num = if num.is_empty() {
        0
    } else {
        let n = parse_decimal(num)
            .filter(|&n| n <= u32::from(u16::MAX))
            .ok_or_else(|| NidParseError::BadNetNumber {
                input: input.to_owned(),
                number: num.to_owned(),
            })?;
        n as u16
    };
    if lnd == LndType::Lo && num != 0 {
        return Err(NidParseError::BadNetNumber {
            input: input.to_owned(),
            number: num.to_string(),
        });
    }
    Ok(Net::new(lnd, num))
}

fn parse_decimal(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_ipv4(s: &str) -> Option<u32> {
    let mut parts = s.split('.');
    let mut addr = 0u32;
    for _ in 0..4 {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let v: u32 = p.parse().ok()?;
        if v > 255 {
            return None;
        }
        addr = addr << 8 | v;
    }
    parts.next().is_none().then_some(addr)
}

/// Why a NID or net string was refused. The message quotes the input and names the bad part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NidParseError {
    /// Nothing before the number, e.g. `1.2.3.4@1`.
    MissingNetType { input: String },
    /// A net name Lustre does not define, e.g. `ib0` instead of `o2ib0`.
    UnknownNetType { input: String, name: String },
    /// A net number that is not a decimal in 0..=65535 (or non-zero for `lo`).
    BadNetNumber { input: String, number: String },
    /// An address of the wrong shape for its net type.
    BadAddress {
        input: String,
        addr: String,
        expected: &'static str,
    },
}

impl fmt::Display for NidParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NidParseError::MissingNetType { input } => {
                write!(f, "bad NID '{input}': the network type is missing")
            }
            NidParseError::UnknownNetType { input, name } => write!(
                f,
                "bad NID '{input}': unknown network type '{name}' (known: tcp, o2ib, lo, gni, gip, ptlf, kfi, efa, bxi3f)"
            ),
            NidParseError::BadNetNumber { input, number } => write!(
                f,
                "bad NID '{input}': network number '{number}' is not in 0..=65535 (lo takes none)"
            ),
            NidParseError::BadAddress {
                input,
                addr,
                expected,
            } => write!(f, "bad NID '{input}': address '{addr}' is not {expected}"),
        }
    }
}

impl std::error::Error for NidParseError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_example() {
        // 192.168.1.2@o2ib1 = net 0x00050001, NID 0x00050001C0A80102 (reference 1.1).
        let nid: Nid = "192.168.1.2@o2ib1".parse().unwrap();
        assert_eq!(nid.raw(), 0x0005_0001_C0A8_0102);
        assert_eq!(nid.net().raw(), 0x0005_0001);
        assert_eq!(nid.to_string(), "192.168.1.2@o2ib1");
    }

    #[test]
    fn zero_net_number_is_omitted() {
        let a: Nid = "10.0.0.1@o2ib".parse().unwrap();
        let b: Nid = "10.0.0.1@o2ib0".parse().unwrap();
        assert_eq!(a, b);
        assert_eq!(b.to_string(), "10.0.0.1@o2ib");
        assert_eq!(a.net().lnd().number(), 5);
    }

    #[test]
    fn lo_tcp_and_defaults() {
        let lo: Nid = "0@lo".parse().unwrap();
        assert_eq!(lo, Nid::LO_0);
        assert_eq!(lo.raw(), 0x0009_0000_0000_0000);
        assert_eq!(lo.to_string(), "0@lo");
        let tcp: Nid = "10.1.2.3@tcp".parse().unwrap();
        assert_eq!(tcp.net().lnd(), LndType::Tcp);
        assert_eq!(tcp.net().lnd().number(), 2);
        // No @net means tcp, as libcfs_str2nid does.
        assert_eq!("10.1.2.3".parse::<Nid>().unwrap(), tcp);
        assert_eq!("7@gni3".parse::<Nid>().unwrap().to_string(), "7@gni3");
        assert_eq!(Nid::ANY.to_string(), "<?>");
        assert_eq!(Nid::ANY.raw(), u64::MAX);
    }

    #[test]
    fn unknown_types_print_numerically() {
        let nid = Nid::new(Net::new(LndType::Other(3), 7), 42);
        assert_eq!(nid.to_string(), "42@<3:7>");
    }

    #[test]
    fn errors_name_the_problem() {
        let e = "10.0.0.256@o2ib".parse::<Nid>().unwrap_err();
        assert!(matches!(e, NidParseError::BadAddress { ref addr, .. } if addr == "10.0.0.256"));
        assert!(e.to_string().contains("dotted-quad"));
        let e = "10.0.0.1@ib0".parse::<Nid>().unwrap_err();
        assert!(matches!(e, NidParseError::UnknownNetType { ref name, .. } if name == "ib"));
        let e = "10.0.0.1@o2ib70000".parse::<Nid>().unwrap_err();
        assert!(matches!(e, NidParseError::BadNetNumber { .. }));
        let e = "10.0.0.1@7".parse::<Nid>().unwrap_err();
        assert!(matches!(e, NidParseError::MissingNetType { .. }));
        let e = "1@lo3".parse::<Nid>().unwrap_err();
        assert!(matches!(e, NidParseError::BadNetNumber { .. }));
        let e = "x@gni".parse::<Nid>().unwrap_err();
        assert!(e.to_string().contains("decimal"));
        for bad in [
            "",
            "@o2ib",
            "1.2.3@tcp",
            "1.2.3.4.5@tcp",
            "1..2.3@tcp",
            "+1.2.3.4@tcp",
        ] {
            assert!(bad.parse::<Nid>().is_err(), "{bad:?} parsed");
        }
    }

    proptest::proptest! {
        #[test]
        fn display_parse_round_trip(lnd in proptest::sample::select(&[2u16, 5, 13, 14, 15, 16, 18, 19][..]),
                                    num: u16, addr: u32) {
            let nid = Nid::new(Net::new(LndType::from_number(lnd), num), addr);
            let s = nid.to_string();
            proptest::prop_assert_eq!(s.parse::<Nid>().unwrap(), nid, "{}", s);
        }

        #[test]
        fn parsing_never_panics(s in ".{0,40}") {
            let _ = s.parse::<Nid>();
        }
    }
}
