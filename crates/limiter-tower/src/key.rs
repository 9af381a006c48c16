//! Keys and where they come from: the [`KeyExtractor`] trait and the extractors a service
//! needs: the peer's IP ([`PeerIp`]), the client's IP behind trusted proxies ([`ClientIp`]),
//! a request header such as an API key ([`HeaderKey`]), and any closure.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::HeaderName;
use http::request::Parts;

use crate::error::{ConfigError, KeyError};
use crate::ip::{self, ForwardedHeader, IpNet};

/// What a keyed layer limits by: an address (masked to its prefix for IPv6) or a string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// A client address.
    Ip(IpAddr),
    /// A header value, an account, anything textual.
    Text(Arc<str>),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(ip) => ip.fmt(f),
            Self::Text(text) => f.write_str(text),
        }
    }
}

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Self::Ip(ip)
    }
}

impl From<&str> for Key {
    fn from(text: &str) -> Self {
        Self::Text(text.into())
    }
}

impl From<String> for Key {
    fn from(text: String) -> Self {
        Self::Text(text.into())
    }
}

/// Takes a [`Key`] from a request's head. Implemented by the extractors here and by any
/// `Fn(&Parts) -> Result<Key, KeyError>`.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The request's key, or why it has none.
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError>;

    /// Whether the extractor is configured sensibly; the middleware's `build()` asks every key
    /// once, so a bad setting is one error there, not a `?` at each builder step.
    fn check(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Result<Key, KeyError> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        self(parts)
    }
}

/// The peer's socket address, as a request extension. Insert it per connection when serving
/// with hyper directly; axum's `ConnectInfo<SocketAddr>` is read as well (feature `axum`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The peer's address from the request's extensions.
pub(crate) fn peer_addr(parts: &Parts) -> Option<IpAddr> {
    // axum's first, with its feature (axum serves most requests that reach here).
    #[cfg(feature = "axum")]
    if let Some(info) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(info.0.ip());
    }
    parts
        .extensions
        .get::<PeerAddr>()
        .map(|PeerAddr(addr)| addr.ip())
}

/// The default IPv6 prefix a client is keyed by: a /64 is what one host (one LAN) gets, so
/// keying finer would let it rotate through 2^64 addresses.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

fn check_prefix(prefix: u8) -> Result<(), ConfigError> {
    if prefix > 128 {
        return Err(ConfigError::Ipv6Prefix { prefix });
    }
    Ok(())
}

/// Keys by the address of the peer that opened the connection (IPv6 cut to a /64 by default).
/// Right when clients connect directly; behind a proxy, every client would share the proxy's
/// key: use [`ClientIp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIp {
    v6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl PeerIp {
    /// Keys by the peer's address, IPv6 cut to [`DEFAULT_IPV6_PREFIX`] bits.
    pub const fn new() -> Self {
        Self {
            v6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Keys IPv6 peers by their first `prefix` bits (0 to 128; 128 keys each address). A
    /// prefix above 128 is refused by the middleware's `build()`
    /// ([`ConfigError::Ipv6Prefix`]).
    pub const fn ipv6_prefix(self, prefix: u8) -> Self {
        Self { v6_prefix: prefix }
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        let peer = peer_addr(parts).ok_or_else(|| KeyError::NoPeerAddress)?;
        Ok(Key::Ip(ip::client_key(peer, self.v6_prefix.min(128))))
    }

    fn check(&self) -> Result<(), ConfigError> {
        check_prefix(self.v6_prefix)
    }
}

/// Keys by the client's address behind proxies you run: when the peer is one of the trusted
/// ranges, the client is the rightmost address in `X-Forwarded-For` (or RFC 7239
/// `Forwarded`) that is not trusted. A peer that is not trusted is the client, whatever
/// headers it sends, and what a client writes into the header itself is never reached; so
/// the key cannot be spoofed as long as the list names only proxies that append the address
/// they saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIp {
    trusted: Vec<IpNet>,
    header: ForwardedHeader,
    v6_prefix: u8,
}

impl ClientIp {
    /// Trusts `proxies` (your load balancers' ranges) to append the address they saw to
    /// `X-Forwarded-For`.
    pub fn behind(proxies: impl IntoIterator<Item = IpNet>) -> Self {
        Self {
            trusted: proxies.into_iter().collect(),
            header: ForwardedHeader::XForwardedFor,
            v6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Reads the hops from `header` instead (only one header is ever read, so a client cannot
    /// play one against the other).
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Keys IPv6 clients by their first `prefix` bits (0 to 128; above is refused by the
    /// middleware's `build()`).
    pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
        self.v6_prefix = prefix;
        self
    }

    /// The client's address for a request from `peer` with `headers` (not yet masked).
    pub fn resolve(&self, peer: IpAddr, headers: &http::HeaderMap) -> Result<IpAddr, KeyError> {
        let hops = ip::hops(headers, self.header);
        ip::resolve_client(peer, &hops, &self.trusted).map_err(|entry| KeyError::BadForwarded {
            header: self.header.name(),
            entry: entry.chars().take(64).collect(),
        })
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        let peer = peer_addr(parts).ok_or_else(|| KeyError::NoPeerAddress)?;
        let client = self.resolve(peer, &parts.headers)?;
        Ok(Key::Ip(ip::client_key(client, self.v6_prefix.min(128))))
    }

    fn check(&self) -> Result<(), ConfigError> {
        check_prefix(self.v6_prefix)
    }
}

/// Keys by a request header's value, such as an API key: visible ASCII, at most
/// [`max_len`](Self::max_len) bytes (256 by default), so one key cannot cost unbounded memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderKey {
    header: HeaderName,
    max_len: usize,
}

impl HeaderKey {
    /// Keys by `header`'s value.
    pub fn new(header: HeaderName) -> Self {
        Self {
            header,
            max_len: 256,
        }
    }

    /// Refuses values longer than `max_len` bytes (at least 1; 0 is refused by the
    /// middleware's `build()`, [`ConfigError::ZeroMaxLen`]).
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        let value = parts
            .headers
            .get(&self.header)
            .ok_or_else(|| KeyError::MissingHeader {
                header: self.header.clone(),
            })?;
        let bad = || KeyError::BadHeader {
            header: self.header.clone(),
            max: self.max_len,
        };
        let text = value.to_str().map_err(|_| bad())?;
        if text.is_empty() || text.len() > self.max_len {
            return Err(bad());
        }
        Ok(Key::Text(text.into()))
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.max_len == 0 {
            return Err(ConfigError::ZeroMaxLen);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(peer: Option<&str>, headers: &[(&str, &str)]) -> Parts {
        let mut builder = Request::builder();
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut request = builder.body(()).expect("test request");
        if let Some(peer) = peer {
            request
                .extensions_mut()
                .insert(PeerAddr(peer.parse().expect("test address")));
        }
        request.into_parts().0
    }

    #[test]
    fn peer_ip_masks_and_reports_a_missing_address() {
        let v6 = parts(Some("[2001:db8:0:1:2:3:4:5]:443"), &[]);
        assert_eq!(
            PeerIp::new().extract(&v6),
            Ok(Key::Ip("2001:db8:0:1::".parse().expect("ip")))
        );
        let full = PeerIp::new().ipv6_prefix(128);
        assert_eq!(
            full.extract(&v6),
            Ok(Key::Ip("2001:db8:0:1:2:3:4:5".parse().expect("ip")))
        );
        let bad = PeerIp::new().ipv6_prefix(129);
        assert_eq!(bad.check(), Err(ConfigError::Ipv6Prefix { prefix: 129 }));
        // Used anyway (outside the middleware), it keys as /128 rather than panicking.
        assert_eq!(bad.extract(&v6), full.extract(&v6));
        assert_eq!(
            ClientIp::behind([]).ipv6_prefix(200).check(),
            Err(ConfigError::Ipv6Prefix { prefix: 200 })
        );
        let none = parts(None, &[]);
        let err = PeerIp::new().extract(&none).expect_err("no peer");
        assert_eq!(err.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            err.to_string()
                .contains("into_make_service_with_connect_info")
        );
    }

    #[test]
    fn header_key_refuses_missing_empty_long_and_binary_values() {
        let api = HeaderKey::new(HeaderName::from_static("x-api-key")).max_len(8);
        assert_eq!(api.check(), Ok(()));
        assert_eq!(
            api.extract(&parts(None, &[("x-api-key", "abc")])),
            Ok(Key::from("abc"))
        );
        for (headers, want) in [
            (vec![], "has no `x-api-key` header"),
            (vec![("x-api-key", "")], "1 to 8 bytes"),
            (vec![("x-api-key", "123456789")], "1 to 8 bytes"),
        ] {
            let err = api.extract(&parts(None, &headers)).expect_err("refused");
            assert!(err.to_string().contains(want), "{err}");
            assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
        }
        let mut binary = parts(None, &[]);
        binary.headers.insert(
            "x-api-key",
            http::HeaderValue::from_bytes(b"\xffabc").expect("opaque bytes are a valid value"),
        );
        assert!(api.extract(&binary).is_err());
        let zero = HeaderKey::new(HeaderName::from_static("x")).max_len(0);
        assert_eq!(zero.check(), Err(ConfigError::ZeroMaxLen));
        assert!(
            zero.extract(&parts(None, &[("x", "a")])).is_err(),
            "refuses every value"
        );
    }

    #[test]
    fn client_ip_believes_only_trusted_peers() {
        let proxies = ClientIp::behind(["10.0.0.0/8".parse().expect("range")]);
        let via_proxy = parts(
            Some("10.1.1.1:5000"),
            &[("x-forwarded-for", "6.6.6.6, 203.0.113.9")],
        );
        assert_eq!(
            proxies.extract(&via_proxy),
            Ok(Key::Ip("203.0.113.9".parse().expect("ip")))
        );
        let direct = parts(
            Some("198.51.100.4:5000"),
            &[("x-forwarded-for", "203.0.113.9")],
        );
        assert_eq!(
            proxies.extract(&direct),
            Ok(Key::Ip("198.51.100.4".parse().expect("ip")))
        );
        let forwarded = proxies.clone().header(ForwardedHeader::Forwarded);
        let rfc = parts(
            Some("10.1.1.1:5000"),
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("forwarded", r#"for="[2001:db8::1:2]:80""#),
            ],
        );
        assert_eq!(
            forwarded.extract(&rfc),
            Ok(Key::Ip("2001:db8::".parse().expect("ip")))
        );
        let junk = parts(Some("10.1.1.1:5000"), &[("x-forwarded-for", "not-an-ip")]);
        let err = proxies.extract(&junk).expect_err("junk from a trusted hop");
        assert!(err.to_string().contains("not-an-ip"), "{err}");
    }
}
