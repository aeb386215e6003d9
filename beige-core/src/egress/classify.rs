//! The one classifier of special-purpose addresses (spec `egress.md` §5.1).
//!
//! Owns the decision whether an address the gateway is about to dial is public: every
//! resolved answer and every IP literal passes through [`classify`], and [`permitted`]
//! applies a rule's `allowPrivate` on top of it. The tables are the IANA special-purpose
//! registries as the spec lists them, written once here as `ipnet` constants; nothing
//! else in beige keeps a list of private ranges. Embedded IPv4 (`::ffff:a.b.c.d`,
//! `64:ff9b::/96`, 6to4, Teredo) is never unwrapped: such an address is denied as what it
//! is, whatever IPv4 address it carries. [`allow_private_refusal`] says which
//! `allowPrivate` ranges may never be configured (loopback, link-local, unspecified,
//! multicast, and IPv4-mapped space, which could smuggle them back in).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// What [`classify`] found an address to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressClass {
    /// A globally routable unicast address: it may be dialled.
    Public,
    /// A special-purpose address, and the range it fell into: it is refused unless a
    /// rule's `allowPrivate` covers it (see [`permitted`]).
    Denied(Special),
}

/// The special-purpose range a denied address fell into; [`Special::as_str`] is the name
/// used in audit records and refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Special {
    /// `0.0.0.0/8` ("this network"; connecting to it reaches this host) and `::/128`.
    Unspecified,
    /// RFC 1918 private space: `10/8`, `172.16/12`, `192.168/16`.
    Private,
    /// `100.64/10`, carrier-grade NAT space shared between ISP and customer.
    Shared,
    /// `127/8` and `::1`.
    Loopback,
    /// `169.254/16` (cloud metadata lives here) and `fe80::/10`.
    LinkLocal,
    /// `192.0.0/24` and `2001::/23`: IETF protocol assignments.
    IetfProtocol,
    /// `192.0.2/24`, `198.51.100/24`, `203.0.113/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `192.88.99/24`, the deprecated 6to4 relay anycast.
    Relay6to4,
    /// `198.18/15`, for benchmarking.
    Benchmarking,
    /// `224/4` and `ff00::/8`.
    Multicast,
    /// `240/4`, reserved for future use, including `255.255.255.255`.
    Reserved,
    /// `::ffff:0:0/96`: an IPv4 address dressed as IPv6 (never unwrapped).
    Ipv4Mapped,
    /// `64:ff9b::/96` and `64:ff9b:1::/48`: NAT64 translation prefixes.
    Nat64,
    /// `100::/64`, the discard-only prefix.
    Discard,
    /// `2002::/16`: 6to4, which embeds an IPv4 address.
    SixToFour,
    /// `5f00::/16`: segment routing (SRv6) SIDs.
    SegmentRouting,
    /// `fc00::/7`: unique local addresses (the IPv6 private space).
    UniqueLocal,
    /// `fec0::/10`: the deprecated site-local space.
    SiteLocal,
    /// Any other IPv6 address outside `2000::/3`, the only global unicast space.
    NotGlobalUnicast,
}

impl Special {
    /// The snake_case name, as audit records and refusals carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            Special::Unspecified => "unspecified",
            Special::Private => "private",
            Special::Shared => "shared",
            Special::Loopback => "loopback",
            Special::LinkLocal => "link_local",
            Special::IetfProtocol => "ietf_protocol",
            Special::Documentation => "documentation",
            Special::Relay6to4 => "relay_6to4",
            Special::Benchmarking => "benchmarking",
            Special::Multicast => "multicast",
            Special::Reserved => "reserved",
            Special::Ipv4Mapped => "ipv4_mapped",
            Special::Nat64 => "nat64",
            Special::Discard => "discard",
            Special::SixToFour => "6to4",
            Special::SegmentRouting => "segment_routing",
            Special::UniqueLocal => "unique_local",
            Special::SiteLocal => "site_local",
            Special::NotGlobalUnicast => "not_global_unicast",
        }
    }

    /// Whether no `allowPrivate` can ever admit this range: loopback, link-local,
    /// unspecified and multicast (spec §1.3), and IPv4-mapped space, through which a
    /// dual-stack socket would reach IPv4 loopback or link-local addresses.
    pub fn never_allowed(self) -> bool {
        matches!(
            self,
            Special::Loopback
                | Special::LinkLocal
                | Special::Unspecified
                | Special::Multicast
                | Special::Ipv4Mapped
        )
    }
}

impl fmt::Display for Special {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

const fn v6(segments: [u16; 8], len: u8) -> Ipv6Net {
    let [a, b, c, d, e, f, g, h] = segments;
    Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), len)
}

/// The denied IPv4 ranges (spec §5.1), which do not overlap.
const DENIED_V4: [(Ipv4Net, Special); 15] = [
    (v4(0, 0, 0, 0, 8), Special::Unspecified),
    (v4(10, 0, 0, 0, 8), Special::Private),
    (v4(100, 64, 0, 0, 10), Special::Shared),
    (v4(127, 0, 0, 0, 8), Special::Loopback),
    (v4(169, 254, 0, 0, 16), Special::LinkLocal),
    (v4(172, 16, 0, 0, 12), Special::Private),
    (v4(192, 0, 0, 0, 24), Special::IetfProtocol),
    (v4(192, 0, 2, 0, 24), Special::Documentation),
    (v4(192, 88, 99, 0, 24), Special::Relay6to4),
    (v4(192, 168, 0, 0, 16), Special::Private),
    (v4(198, 18, 0, 0, 15), Special::Benchmarking),
    (v4(198, 51, 100, 0, 24), Special::Documentation),
    (v4(203, 0, 113, 0, 24), Special::Documentation),
    (v4(224, 0, 0, 0, 4), Special::Multicast),
    (v4(240, 0, 0, 0, 4), Special::Reserved),
];

/// The one IPv6 space that may be public (spec §5.1).
const GLOBAL_UNICAST_V6: Ipv6Net = v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// The named IPv6 special ranges. The first five lie inside [`GLOBAL_UNICAST_V6`] and
/// are its exclusions; the rest lie outside it and only give a denial its precise name
/// (anything else outside it is [`Special::NotGlobalUnicast`]). They do not overlap.
const DENIED_V6: [(Ipv6Net, Special); 15] = [
    (v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), Special::IetfProtocol),
    (
        v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        Special::Documentation,
    ),
    (v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16), Special::SixToFour),
    (
        v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
        Special::Documentation,
    ),
    (
        v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16),
        Special::SegmentRouting,
    ),
    (v6([0, 0, 0, 0, 0, 0, 0, 0], 128), Special::Unspecified),
    (v6([0, 0, 0, 0, 0, 0, 0, 1], 128), Special::Loopback),
    (v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96), Special::Ipv4Mapped),
    (v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96), Special::Nat64),
    (v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), Special::Nat64),
    (v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), Special::Discard),
    (v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), Special::UniqueLocal),
    (v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), Special::LinkLocal),
    (v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), Special::SiteLocal),
    (v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), Special::Multicast),
];

/// The ranges no `allowPrivate` may overlap (see [`Special::never_allowed`]).
const NEVER_ALLOWED: [(IpNet, Special); 9] = [
    (IpNet::V4(v4(0, 0, 0, 0, 8)), Special::Unspecified),
    (IpNet::V4(v4(127, 0, 0, 0, 8)), Special::Loopback),
    (IpNet::V4(v4(169, 254, 0, 0, 16)), Special::LinkLocal),
    (IpNet::V4(v4(224, 0, 0, 0, 4)), Special::Multicast),
    (
        IpNet::V6(v6([0, 0, 0, 0, 0, 0, 0, 0], 128)),
        Special::Unspecified,
    ),
    (
        IpNet::V6(v6([0, 0, 0, 0, 0, 0, 0, 1], 128)),
        Special::Loopback,
    ),
    (
        IpNet::V6(v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96)),
        Special::Ipv4Mapped,
    ),
    (
        IpNet::V6(v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10)),
        Special::LinkLocal,
    ),
    (
        IpNet::V6(v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8)),
        Special::Multicast,
    ),
];

/// Whether `ip` is public, or which special-purpose range it is in (spec §5.1).
///
/// IPv4 is public unless it is in the denied list; IPv6 is public only inside `2000::/3`
/// minus its special exclusions. Embedded IPv4 is never unwrapped, so `::ffff:8.8.8.8`
/// is [`Special::Ipv4Mapped`], not public.
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(ip) => DENIED_V4
            .iter()
            .find(|(net, _)| net.contains(&ip))
            .map_or(AddressClass::Public, |&(_, s)| AddressClass::Denied(s)),
        IpAddr::V6(ip) => match DENIED_V6.iter().find(|(net, _)| net.contains(&ip)) {
            Some(&(_, s)) => AddressClass::Denied(s),
            None if GLOBAL_UNICAST_V6.contains(&ip) => AddressClass::Public,
            None => AddressClass::Denied(Special::NotGlobalUnicast),
        },
    }
}

/// Why an `allowPrivate` range may not be configured: `Some` with a reason when `net`
/// overlaps loopback, link-local, unspecified or multicast space (or IPv4-mapped IPv6
/// space, which would reach them through a dual-stack socket); `None` when it may be.
pub fn allow_private_refusal(net: &IpNet) -> Option<&'static str> {
    NEVER_ALLOWED
        .iter()
        .find(|(bad, _)| bad.contains(net) || net.contains(bad))
        .map(|(_, special)| match special {
            Special::Loopback => "it overlaps loopback space, which is never allowed",
            Special::LinkLocal => {
                "it overlaps link-local space (cloud metadata lives there), which is never allowed"
            }
            Special::Unspecified => "it overlaps the unspecified address, which is never allowed",
            Special::Multicast => "it overlaps multicast space, which is never allowed",
            _ => "it overlaps IPv4-mapped IPv6 space (::ffff:0:0/96), which is never allowed; write the IPv4 range instead",
        })
}

/// Whether the gateway may dial `ip` for a rule whose `allowPrivate` is `allow_private`.
///
/// A public address is always permitted. A denied one is permitted only when one of the
/// `allow_private` ranges contains it and its range is not one that is never allowed
/// (checked here again, whatever validation let through). Otherwise the error names the
/// range, for the `private_address` refusal.
pub fn permitted(ip: IpAddr, allow_private: &[IpNet]) -> Result<(), Special> {
    match classify(ip) {
        AddressClass::Public => Ok(()),
        AddressClass::Denied(special) if special.never_allowed() => Err(special),
        AddressClass::Denied(special) => {
            if allow_private.iter().any(|net| net.contains(&ip)) {
                Ok(())
            } else {
                Err(special)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> AddressClass {
        classify(s.parse().unwrap())
    }

    /// Every §5.1 range edge and its outside neighbour, plus public controls.
    const TABLE: &[(&str, Option<&str>)] = &[
        // 0/8
        ("0.0.0.0", Some("unspecified")),
        ("0.255.255.255", Some("unspecified")),
        ("1.0.0.0", None),
        // 10/8
        ("9.255.255.255", None),
        ("10.0.0.0", Some("private")),
        ("10.255.255.255", Some("private")),
        ("11.0.0.0", None),
        // 100.64/10
        ("100.63.255.255", None),
        ("100.64.0.0", Some("shared")),
        ("100.127.255.255", Some("shared")),
        ("100.128.0.0", None),
        // 127/8
        ("126.255.255.255", None),
        ("127.0.0.1", Some("loopback")),
        ("127.255.255.255", Some("loopback")),
        ("128.0.0.0", None),
        // 169.254/16
        ("169.253.255.255", None),
        ("169.254.0.0", Some("link_local")),
        ("169.254.169.254", Some("link_local")),
        ("169.255.0.0", None),
        // 172.16/12
        ("172.15.255.255", None),
        ("172.16.0.0", Some("private")),
        ("172.31.255.255", Some("private")),
        ("172.32.0.0", None),
        // 192.0.0/24, 192.0.2/24
        ("191.255.255.255", None),
        ("192.0.0.0", Some("ietf_protocol")),
        ("192.0.0.255", Some("ietf_protocol")),
        ("192.0.1.0", None),
        ("192.0.2.0", Some("documentation")),
        ("192.0.2.255", Some("documentation")),
        ("192.0.3.0", None),
        // 192.88.99/24
        ("192.88.98.255", None),
        ("192.88.99.1", Some("relay_6to4")),
        ("192.88.100.0", None),
        // 192.168/16
        ("192.167.255.255", None),
        ("192.168.0.0", Some("private")),
        ("192.168.255.255", Some("private")),
        ("192.169.0.0", None),
        // 198.18/15
        ("198.17.255.255", None),
        ("198.18.0.0", Some("benchmarking")),
        ("198.19.255.255", Some("benchmarking")),
        ("198.20.0.0", None),
        // 198.51.100/24
        ("198.51.99.255", None),
        ("198.51.100.0", Some("documentation")),
        ("198.51.101.0", None),
        // 203.0.113/24
        ("203.0.112.255", None),
        ("203.0.113.255", Some("documentation")),
        ("203.0.114.0", None),
        // 224/4, 240/4
        ("223.255.255.255", None),
        ("224.0.0.0", Some("multicast")),
        ("239.255.255.255", Some("multicast")),
        ("240.0.0.0", Some("reserved")),
        ("255.255.255.255", Some("reserved")),
        // IPv4 controls
        ("8.8.8.8", None),
        ("1.1.1.1", None),
        // IPv6 outside 2000::/3
        ("::", Some("unspecified")),
        ("::1", Some("loopback")),
        ("::2", Some("not_global_unicast")),
        ("::ffff:8.8.8.8", Some("ipv4_mapped")),
        ("::ffff:127.0.0.1", Some("ipv4_mapped")),
        ("::8.8.8.8", Some("not_global_unicast")),
        ("64:ff9b::a00:1", Some("nat64")),
        ("64:ff9b::808:808", Some("nat64")),
        ("64:ff9b:1::1", Some("nat64")),
        ("100::1", Some("discard")),
        ("fc00::1", Some("unique_local")),
        (
            "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            Some("unique_local"),
        ),
        ("fe80::1", Some("link_local")),
        ("febf::1", Some("link_local")),
        ("fec0::1", Some("site_local")),
        ("ff02::1", Some("multicast")),
        (
            "1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            Some("not_global_unicast"),
        ),
        ("4000::1", Some("not_global_unicast")),
        ("5f00::1", Some("segment_routing")),
        // exclusions inside 2000::/3, with their neighbours
        ("2000::1", None),
        ("2000:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
        ("2001::1", Some("ietf_protocol")),
        (
            "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff",
            Some("ietf_protocol"),
        ),
        ("2001:200::1", None),
        ("2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", None),
        ("2001:db8::1", Some("documentation")),
        ("2001:db9::", None),
        ("2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
        ("2002::", Some("6to4")),
        ("2002:a00:1::", Some("6to4")),
        ("2003::", None),
        ("3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
        ("3fff::1", Some("documentation")),
        ("3fff:fff::", Some("documentation")),
        ("3fff:1000::", None),
        ("3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
        // IPv6 controls
        ("2606:4700::1111", None),
        ("2a00:1450:4001:80b::200e", None),
    ];

    #[test]
    fn the_table_of_edges() {
        assert!(TABLE.len() >= 60, "{}", TABLE.len());
        let mut wrong = Vec::new();
        for &(addr, want) in TABLE {
            let got = match class(addr) {
                AddressClass::Public => None,
                AddressClass::Denied(s) => Some(s.as_str()),
            };
            if got != want {
                wrong.push(format!("{addr}: got {got:?}, want {want:?}"));
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn tables_do_not_overlap() {
        for (i, (a, _)) in DENIED_V4.iter().enumerate() {
            for (b, _) in &DENIED_V4[i + 1..] {
                assert!(!a.contains(b) && !b.contains(a), "{a} {b}");
            }
            assert_eq!(a.trunc(), *a);
        }
        for (i, (a, _)) in DENIED_V6.iter().enumerate() {
            for (b, _) in &DENIED_V6[i + 1..] {
                assert!(!a.contains(b) && !b.contains(a), "{a} {b}");
            }
            assert_eq!(a.trunc(), *a);
        }
    }

    #[test]
    fn allow_private_refuses_the_never_allowed() {
        for bad in [
            "127.0.0.0/8",
            "127.0.0.1/32",
            "0.0.0.0/0",
            "0.0.0.0/32",
            "169.254.169.254/32",
            "169.0.0.0/8",
            "224.0.0.1/32",
            "::1/128",
            "::/0",
            "fe80::/64",
            "ff00::/8",
            "::ffff:10.0.0.0/104",
            "::ffff:0:0/96",
        ] {
            let net: IpNet = bad.parse().unwrap();
            assert!(allow_private_refusal(&net).is_some(), "{bad}");
        }
        for ok in [
            "10.1.2.3/32",
            "10.0.0.0/8",
            "192.168.0.0/16",
            "fd00::/8",
            "100.64.0.0/10",
        ] {
            let net: IpNet = ok.parse().unwrap();
            assert_eq!(allow_private_refusal(&net), None, "{ok}");
        }
    }

    #[test]
    fn permitted_applies_allow_private() {
        let allow: Vec<IpNet> = vec!["10.1.2.3/32".parse().unwrap(), "fd00::/8".parse().unwrap()];
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert_eq!(permitted(ip("8.8.8.8"), &[]), Ok(()));
        assert_eq!(permitted(ip("10.1.2.3"), &allow), Ok(()));
        assert_eq!(permitted(ip("fd00::5"), &allow), Ok(()));
        assert_eq!(permitted(ip("10.1.2.4"), &allow), Err(Special::Private));
        assert_eq!(permitted(ip("10.1.2.3"), &[]), Err(Special::Private));
        // Embedded IPv4 is not unwrapped, so an IPv4 allowance does not cover it.
        assert_eq!(
            permitted(ip("::ffff:10.1.2.3"), &allow),
            Err(Special::Ipv4Mapped)
        );
        // Never-allowed ranges stay refused even if an allowance slipped through.
        let bad: Vec<IpNet> = vec![
            "127.0.0.0/8".parse().unwrap(),
            "169.254.0.0/16".parse().unwrap(),
            "::ffff:0:0/96".parse().unwrap(),
        ];
        assert_eq!(permitted(ip("127.0.0.1"), &bad), Err(Special::Loopback));
        assert_eq!(
            permitted(ip("169.254.169.254"), &bad),
            Err(Special::LinkLocal)
        );
        assert_eq!(
            permitted(ip("::ffff:10.0.0.1"), &bad),
            Err(Special::Ipv4Mapped)
        );
    }
}
