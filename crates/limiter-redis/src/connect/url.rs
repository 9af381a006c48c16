//! [`RedisUrl`]: where a Redis server is and how to log in, parsed from
//! `redis://[user[:password]@]host[:port][/db]` (`rediss://` for TLS), printed with its
//! password redacted; and [`NodeAddr`], one server's `host:port`.

use core::fmt;
use std::sync::Arc;

use super::secret::{REDACTED, Secret};

/// The port a URL without one names.
pub const DEFAULT_PORT: u16 = 6379;

/// One server's address: a host name or IP address, and a port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeAddr {
    host: Arc<str>,
    port: u16,
}

impl NodeAddr {
    /// `host` (a name, an IPv4 address, or an IPv6 address without brackets) and `port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: Arc::from(host.into()),
            port,
        }
    }

    /// The host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Reads `host:port` as Redis writes it in `MOVED` and `ASK` (an IPv6 host unbracketed).
    pub(crate) fn parse_redirect(text: &str) -> Option<Self> {
        let (host, port) = text.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        (!host.is_empty()).then_some(())?;
        Some(Self::new(host, port.parse().ok()?))
    }
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A Redis URL: `redis://` or `rediss://` (TLS), an optional user and password, a host, a
/// port (6379 if none) and a database (0 if none). `Display` and `Debug` redact the password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    tls: bool,
    addr: NodeAddr,
    db: i64,
    username: Option<String>,
    password: Option<Secret>,
}

/// A URL that is not a Redis URL. The message never repeats a password.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// Not `redis://` or `rediss://`.
    #[error(
        "a Redis URL starts with redis:// (or rediss:// for TLS), as in redis://host:6379; found {found}"
    )]
    Scheme {
        /// What it starts with instead (at most the scheme).
        found: String,
    },
    /// No host after the scheme and credentials.
    #[error("the Redis URL names no host; write it as redis://host:6379")]
    Host,
    /// The port is not a number from 1 to 65535.
    #[error("the Redis URL's port `{port}` is not a port number (1 to 65535)")]
    Port {
        /// The port as written.
        port: String,
    },
    /// The path is not a database number.
    #[error("the Redis URL's path `/{path}` is not a database number (write /0, /1, ...)")]
    Db {
        /// The path as written.
        path: String,
    },
    /// A query string or fragment, which this crate does not read.
    #[error(
        "the Redis URL has a query or fragment (`{part}`), which is not read; give TLS and login settings to the builder (or limiterd's [store])"
    )]
    Query {
        /// The query's parameter names (`?name&other`, no values: a value may be a secret),
        /// or `#` for a fragment.
        part: String,
    },
    /// A `%` escape that is not two hex digits, or not UTF-8 once decoded.
    #[error("the Redis URL's {what} has a bad %-escape; escape reserved characters as %XX")]
    Escape {
        /// "user name" or "password".
        what: &'static str,
    },
}

impl RedisUrl {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Self, UrlError> {
        let (tls, rest) = if let Some(rest) = text.strip_prefix("rediss://") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix("redis://") {
            (false, rest)
        } else {
            let scheme = text.split_once("://").map_or("no scheme", |(s, _)| s);
            let found = if scheme.len() > 16 || scheme.contains(['@', ':', '/']) {
                "no scheme".to_owned()
            } else {
                format!("`{scheme}://`")
            };
            return Err(UrlError::Scheme { found });
        };
        // Credentials end at the last '@' before the path: a password may hold '@' escaped
        // or not.
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, pass) = match info.split_once(':') {
                    Some((user, pass)) => (user, Some(pass)),
                    None => (info, None),
                };
                let user = decode(user, "user name")?;
                let pass = pass.map(|p| decode(p, "password")).transpose()?;
                (
                    (!user.is_empty()).then_some(user),
                    pass.filter(|p| !p.is_empty()).map(Secret::new),
                )
            }
        };
        let addr = parse_hostport(hostport)?;
        let db = parse_tail(tail)?;
        Ok(Self {
            tls,
            addr,
            db,
            username,
            password,
        })
    }

    /// A URL for `addr`, without credentials, with TLS or not.
    pub fn for_node(addr: NodeAddr, tls: bool) -> Self {
        Self {
            tls,
            addr,
            db: 0,
            username: None,
            password: None,
        }
    }

    /// Whether it says `rediss://`.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The server's address.
    pub fn addr(&self) -> &NodeAddr {
        &self.addr
    }

    /// The database number (0 unless the path names another).
    pub fn db(&self) -> i64 {
        self.db
    }

    /// The user name, if the URL gives one.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The password, if the URL gives one.
    pub fn password(&self) -> Option<&Secret> {
        self.password.as_ref()
    }
}

fn parse_hostport(hostport: &str) -> Result<NodeAddr, UrlError> {
    let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
        // [IPv6]:port
        let (host, after) = bracketed.split_once(']').ok_or(UrlError::Host)?;
        (host, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(UrlError::Host);
    }
    let port = match port {
        None | Some("") => DEFAULT_PORT,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => {
                return Err(UrlError::Port {
                    port: text.chars().take(12).collect(),
                });
            }
        },
    };
    Ok(NodeAddr::new(host, port))
}

fn parse_tail(tail: &str) -> Result<i64, UrlError> {
    if let Some(at) = tail.find(['?', '#']) {
        let rest = &tail[at..];
        let part = match rest.strip_prefix('?') {
            Some(query) => {
                let names: Vec<&str> = query
                    .split(['&', '#'])
                    .map(|pair| pair.split('=').next().unwrap_or(""))
                    .filter(|name| name.len() <= 24)
                    .collect();
                format!("?{}", names.join("&"))
            }
            None => "#".to_owned(),
        };
        return Err(UrlError::Query { part });
    }
    let path = tail.trim_start_matches('/');
    if path.is_empty() {
        return Ok(0);
    }
    match path.parse::<i64>() {
        Ok(db) if db >= 0 => Ok(db),
        _ => Err(UrlError::Db {
            path: path.chars().take(20).collect(),
        }),
    }
}

/// Decodes `%XX` escapes.
fn decode(text: &str, what: &'static str) -> Result<String, UrlError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or(UrlError::Escape { what })?;
            let hex = core::str::from_utf8(hex).map_err(|_| UrlError::Escape { what })?;
            let byte = u8::from_str_radix(hex, 16).map_err(|_| UrlError::Escape { what })?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UrlError::Escape { what })
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls { "rediss://" } else { "redis://" })?;
        match (&self.username, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:{REDACTED}@")?,
            (None, Some(_)) => write!(f, ":{REDACTED}@")?,
            (Some(user), None) => write!(f, "{user}@")?,
            (None, None) => {}
        }
        write!(f, "{}", self.addr)?;
        if self.db != 0 {
            write!(f, "/{}", self.db)?;
        }
        Ok(())
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({self})")
    }
}

/// What names a Redis server to a builder: a URL's text (checked when the backend connects)
/// or a [`RedisUrl`] already parsed.
pub trait ToRedisUrl {
    /// The URL, or why the text is not one.
    fn to_redis_url(self) -> Result<RedisUrl, UrlError>;
}

impl ToRedisUrl for RedisUrl {
    fn to_redis_url(self) -> Result<RedisUrl, UrlError> {
        Ok(self)
    }
}

impl ToRedisUrl for &RedisUrl {
    fn to_redis_url(self) -> Result<RedisUrl, UrlError> {
        Ok(self.clone())
    }
}

impl ToRedisUrl for &str {
    fn to_redis_url(self) -> Result<RedisUrl, UrlError> {
        RedisUrl::parse(self)
    }
}

impl ToRedisUrl for String {
    fn to_redis_url(self) -> Result<RedisUrl, UrlError> {
        RedisUrl::parse(&self)
    }
}

impl ToRedisUrl for &String {
    fn to_redis_url(self) -> Result<RedisUrl, UrlError> {
        RedisUrl::parse(self)
    }
}

impl core::str::FromStr for RedisUrl {
    type Err = UrlError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_their_parts() {
        let url = RedisUrl::parse("rediss://limiter:p%40ss@redis.internal:6380/2").unwrap();
        assert!(url.tls());
        assert_eq!(url.addr(), &NodeAddr::new("redis.internal", 6380));
        assert_eq!(url.db(), 2);
        assert_eq!(url.username(), Some("limiter"));
        assert_eq!(url.password().map(Secret::expose), Some("p@ss"));

        let plain = RedisUrl::parse("redis://127.0.0.1").unwrap();
        assert_eq!(
            (plain.tls(), plain.addr().port(), plain.db()),
            (false, 6379, 0)
        );
        assert_eq!(plain.username(), None);
        let v6 = RedisUrl::parse("redis://:pw@[::1]:7000").unwrap();
        assert_eq!(v6.addr().host(), "::1");
        assert_eq!(v6.to_string(), "redis://:<redacted>@[::1]:7000");
        // A password holding '@' unescaped: the last '@' ends the credentials.
        let at = RedisUrl::parse("redis://u:a@b@host:1").unwrap();
        assert_eq!(at.password().map(Secret::expose), Some("a@b"));
        assert_eq!(at.addr(), &NodeAddr::new("host", 1));
    }

    #[test]
    fn a_password_is_never_printed_not_even_in_errors() {
        let url = RedisUrl::parse("redis://ops:topsecret@h:1/3").unwrap();
        for shown in [url.to_string(), format!("{url:?}")] {
            assert!(!shown.contains("topsecret"), "{shown}");
            assert!(shown.contains("ops:<redacted>@h:1/3"), "{shown}");
        }
        for bad in [
            "http://u:topsecret@h:1",
            "u:topsecret@h:1",
            "redis://u:topsecret@h:notaport",
            "redis://u:topsecret@h:1/notadb",
            "redis://u:topsecret@h:1/?password=topsecret",
            "redis://u:topsecret@",
            "redis://u:top%zzsecret@h",
        ] {
            let error = RedisUrl::parse(bad).unwrap_err().to_string();
            assert!(!error.contains("topsecret"), "{bad}: {error}");
        }
    }

    #[test]
    fn bad_urls_name_what_is_wrong() {
        let check = |text: &str, says: &str| {
            let error = RedisUrl::parse(text).unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
        };
        check("http://h:1", "`http://`");
        check("h:1", "no scheme");
        check("redis://", "no host");
        check("redis://h:0", "port `0`");
        check("redis://h:99999", "port `99999`");
        check("redis://h/x", "database number");
        check("redis://h?tls=1", "query or fragment");
    }

    #[test]
    fn redirects_name_a_node() {
        assert_eq!(
            NodeAddr::parse_redirect("127.0.0.1:7001"),
            Some(NodeAddr::new("127.0.0.1", 7001))
        );
        assert_eq!(
            NodeAddr::parse_redirect("::1:7001"),
            Some(NodeAddr::new("::1", 7001))
        );
        assert_eq!(NodeAddr::parse_redirect(":7001"), None);
        assert_eq!(NodeAddr::parse_redirect("host"), None);
    }
}
