//! Client addresses: CIDR ranges ([`IpNet`]), IPv6 prefix masking, and the hop lists a proxy
//! appends to in `X-Forwarded-For` or `Forwarded` (RFC 7239), read right to left.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};

use crate::error::IpNetError;

/// A range of addresses in CIDR notation, such as `10.0.0.0/8` or `2001:db8::/32`; a bare
/// address is a range of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// The range of addresses that share `addr`'s first `prefix` bits. IPv4-mapped IPv6
    /// addresses (`::ffff:10.0.0.1`) are taken as the IPv4 address they carry.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, IpNetError> {
        let addr = addr.to_canonical();
        let max = max_prefix(addr);
        if prefix > max {
            return Err(IpNetError::PrefixTooLong {
                input: format!("{addr}/{prefix}"),
                max,
            });
        }
        Ok(Self {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// Whether `ip` is in the range (IPv4-mapped IPv6 addresses as their IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }

    /// The first address of the range.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// How many leading bits the range fixes.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }
}

impl FromStr for IpNet {
    type Err = IpNetError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let invalid = || IpNetError::Invalid {
            input: input.to_owned(),
        };
        let (addr, prefix) = match input.split_once('/') {
            Some((addr, prefix)) => {
                let addr: IpAddr = addr.trim().parse().map_err(|_| invalid())?;
                let digits = prefix.trim();
                if digits.is_empty()
                    || digits.len() > 3
                    || !digits.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(invalid());
                }
                let prefix: u8 = digits.parse().map_err(|_| IpNetError::PrefixTooLong {
                    input: input.to_owned(),
                    max: max_prefix(addr),
                })?;
                (addr, prefix)
            }
            None => {
                let addr: IpAddr = input.trim().parse().map_err(|_| invalid())?;
                (addr, max_prefix(addr.to_canonical()))
            }
        };
        Self::new(addr, prefix).map_err(|e| match e {
            IpNetError::PrefixTooLong { max, .. } => IpNetError::PrefixTooLong {
                input: input.to_owned(),
                max,
            },
            other => other,
        })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

/// `ip` with all but its first `prefix` bits cleared (`prefix` at most the family's width).
pub(crate) fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            IpAddr::V4((bits & kept).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            IpAddr::V6((bits & kept).into())
        }
    }
}

/// The address a rate limit keys a client by: IPv4 as is (IPv4-mapped IPv6 as IPv4), IPv6
/// cut to its first `v6_prefix` bits, so one host cannot rotate through its own /64.
pub(crate) fn client_key(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        v4 @ IpAddr::V4(_) => v4,
        v6 => mask(v6, v6_prefix),
    }
}

/// Which header a trusted proxy records the hops in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the de facto standard).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for="[2001:db8::1]:4711"` (RFC 7239).
    Forwarded,
}

impl ForwardedHeader {
    /// The header's name.
    pub fn name(self) -> HeaderName {
        match self {
            Self::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            Self::Forwarded => FORWARDED,
        }
    }
}

/// One hop of a forwarded list: an address, or an entry that is not one (`unknown`, an
/// obfuscated name, junk).
pub(crate) type Hop<'a> = Result<IpAddr, &'a str>;

/// The hops recorded in `header`, in the order they were appended (client first), across
/// every field line of that header.
pub(crate) fn hops(headers: &HeaderMap, header: ForwardedHeader) -> Vec<Hop<'_>> {
    let mut hops = Vec::new();
    for value in headers.get_all(header.name()) {
        let Ok(text) = value.to_str() else {
            hops.push(Err("a header value that is not visible ASCII"));
            continue;
        };
        match header {
            ForwardedHeader::XForwardedFor => {
                hops.extend(
                    text.split(',')
                        .map(|entry| node(entry.trim()).ok_or(entry.trim())),
                );
            }
            ForwardedHeader::Forwarded => forwarded_hops(text, &mut hops),
        }
    }
    hops
}

/// Parses an address as proxies write it: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1` or
/// `[2001:db8::1]:8080`.
fn node(entry: &str) -> Option<IpAddr> {
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = entry.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port_ok = after.is_empty()
            || after
                .strip_prefix(':')
                .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        return if port_ok {
            inside.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)
        } else {
            None
        };
    }
    let (host, port) = entry.split_once(':')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// The `for=` node of each element of one `Forwarded` field line, quotes respected (a comma or
/// semicolon inside a quoted string does not split).
fn forwarded_hops<'a>(text: &'a str, hops: &mut Vec<Hop<'a>>) {
    for element in split_unquoted(text, b',') {
        let mut found: Option<Hop<'a>> = None;
        for pair in split_unquoted(element, b';') {
            let Some((name, value)) = pair.split_once('=') else {
                continue;
            };
            if !name.trim().eq_ignore_ascii_case("for") {
                continue;
            }
            let value = value.trim();
            let unquoted = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            // A second `for=` in one element is malformed: take it as not an address.
            found = match found {
                None => Some(if unquoted.contains('\\') {
                    Err(value)
                } else {
                    node(unquoted).ok_or(value)
                }),
                Some(_) => Some(Err(element.trim())),
            };
        }
        hops.push(found.unwrap_or(Err(element.trim())));
    }
}

/// Splits on `separator` outside double-quoted strings (with `\` escapes inside them).
fn split_unquoted(text: &str, separator: u8) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    let mut cuts = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if !quoted && b == separator {
            cuts.push((start, i));
            start = i + 1;
        }
    }
    cuts.push((start, bytes.len()));
    // Every cut is at an ASCII byte, so each piece is on a char boundary.
    cuts.into_iter().filter_map(move |(a, b)| text.get(a..b))
}

/// The client behind a chain of proxies: walking the hops from the right (the most recent),
/// skip every trusted proxy; the first address that is not trusted is the client. Only the
/// peer and trusted proxies are believed: a client can prepend anything, but what it wrote
/// stands left of the first untrusted hop and is never reached.
///
/// Returns the peer itself when the peer is not trusted; the leftmost hop when every hop is
/// trusted; `Err(entry)` when an entry a trusted proxy vouched for is not an address.
pub(crate) fn resolve_client<'a>(
    peer: IpAddr,
    hops: &[Hop<'a>],
    trusted: &[IpNet],
) -> Result<IpAddr, &'a str> {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|net| net.contains(ip));
    let mut client = peer.to_canonical();
    if !is_trusted(client) {
        return Ok(client);
    }
    for hop in hops.iter().rev() {
        client = hop.as_ref().map_err(|entry| *entry)?.to_canonical();
        if !is_trusted(client) {
            return Ok(client);
        }
    }
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter()
            .map(|s| s.parse().expect("test range"))
            .collect()
    }

    #[test]
    fn parses_ranges_and_refuses_bad_ones() {
        let net: IpNet = "10.1.2.3/8".parse().expect("valid");
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert!(net.contains(ip("10.255.0.1")));
        assert!(net.contains(ip("::ffff:10.0.0.1")));
        assert!(!net.contains(ip("11.0.0.1")));
        assert!(!net.contains(ip("::a00:1")));
        let single: IpNet = "2001:db8::1".parse().expect("valid");
        assert_eq!(single.prefix(), 128);
        assert!(single.contains(ip("2001:db8::1")) && !single.contains(ip("2001:db8::2")));
        let all: IpNet = "0.0.0.0/0".parse().expect("valid");
        assert!(all.contains(ip("1.2.3.4")) && !all.contains(ip("::1")));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/999999",
            "10.0.0.0/",
            "10/8",
            "x",
            "10.0.0.0/-1",
        ] {
            let err = bad.parse::<IpNet>().expect_err(bad).to_string();
            assert!(err.contains(bad), "{err}");
        }
        assert!(
            "10.0.0.0/33"
                .parse::<IpNet>()
                .expect_err("too long")
                .to_string()
                .contains("at most /32")
        );
    }

    #[test]
    fn masks_ipv6_to_the_prefix_and_keeps_ipv4() {
        assert_eq!(
            client_key(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), 64),
            ip("2001:db8:1:2::")
        );
        assert_eq!(client_key(ip("2001:db8:1:2::9"), 48), ip("2001:db8:1::"));
        assert_eq!(client_key(ip("2001:db8::9"), 128), ip("2001:db8::9"));
        assert_eq!(client_key(ip("2001:db8::9"), 0), ip("::"));
        assert_eq!(client_key(ip("192.0.2.7"), 64), ip("192.0.2.7"));
        assert_eq!(client_key(ip("::ffff:192.0.2.7"), 64), ip("192.0.2.7"));
    }

    fn headers(name: &str, values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        map
    }

    #[test]
    fn reads_x_forwarded_for_across_lines_with_ports() {
        let map = headers(
            "x-forwarded-for",
            &["1.1.1.1, 2.2.2.2:80", "[2001:db8::1]:443 , junk"],
        );
        let got = hops(&map, ForwardedHeader::XForwardedFor);
        assert_eq!(
            got,
            vec![
                Ok(ip("1.1.1.1")),
                Ok(ip("2.2.2.2")),
                Ok(ip("2001:db8::1")),
                Err("junk")
            ]
        );
    }

    #[test]
    fn reads_forwarded_with_quotes_unknown_and_obfuscated_nodes() {
        let map = headers(
            "forwarded",
            &[
                r#"for=192.0.2.60;proto=http;by=203.0.113.43, FOR="[2001:db8:cafe::17]:4711""#,
                r#"for=unknown, for=_hidden, by=1.2.3.4, for="1.2.3.4, 5.6.7.8""#,
            ],
        );
        let got = hops(&map, ForwardedHeader::Forwarded);
        assert_eq!(got[0], Ok(ip("192.0.2.60")));
        assert_eq!(got[1], Ok(ip("2001:db8:cafe::17")));
        assert_eq!(got[2], Err("unknown"));
        assert_eq!(got[3], Err("_hidden"));
        assert_eq!(got[4], Err("by=1.2.3.4"));
        // A quoted comma does not split an element.
        assert_eq!(got[5], Err(r#""1.2.3.4, 5.6.7.8""#));
        assert_eq!(got.len(), 6);
    }

    #[test]
    fn resolves_the_client_right_to_left_through_trusted_proxies_only() {
        let trusted = nets(&["10.0.0.0/8", "2001:db8:ffff::/48"]);
        let check = |peer: &str, chain: &[&str], want: Result<&str, &str>| {
            let map = headers("x-forwarded-for", chain);
            let hops = hops(&map, ForwardedHeader::XForwardedFor);
            let got = resolve_client(ip(peer), &hops, &trusted);
            assert_eq!(got, want.map(ip), "peer {peer}, chain {chain:?}");
        };
        // An untrusted peer's header is ignored whatever it says.
        check("198.51.100.1", &["10.0.0.1, 1.2.3.4"], Ok("198.51.100.1"));
        // A trusted proxy's last hop is the client; what the client prepended is never read.
        check("10.0.0.2", &["6.6.6.6, 203.0.113.9"], Ok("203.0.113.9"));
        check("10.0.0.2", &["junk, 203.0.113.9"], Ok("203.0.113.9"));
        // Two trusted proxies in a row.
        check(
            "10.0.0.2",
            &["6.6.6.6, 203.0.113.9, 10.9.9.9"],
            Ok("203.0.113.9"),
        );
        check("::ffff:10.0.0.2", &["203.0.113.9"], Ok("203.0.113.9"));
        check("2001:db8:ffff::1", &["2001:db8::5"], Ok("2001:db8::5"));
        // A trusted peer with no header is itself the client; all trusted: the leftmost.
        check("10.0.0.2", &[], Ok("10.0.0.2"));
        check("10.0.0.2", &["10.0.0.7, 10.0.0.8"], Ok("10.0.0.7"));
        // Junk that a trusted proxy vouched for is refused, not guessed around.
        check("10.0.0.2", &["203.0.113.9, junk"], Err("junk"));
    }
}
