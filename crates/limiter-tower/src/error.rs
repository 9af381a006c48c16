//! Errors: a range that is not one ([`IpNetError`]), a key a request does not carry
//! ([`KeyError`]), and a middleware built wrong ([`ConfigError`]).

use http::StatusCode;
use http::header::HeaderName;

/// A trusted-proxy range that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IpNetError {
    /// Not an address with an optional prefix length.
    #[error(
        "`{input}` is not an IP range: write an address with an optional prefix length, such as \
         10.0.0.0/8, 2001:db8::/32 or 192.0.2.1"
    )]
    Invalid {
        /// What was given.
        input: String,
    },
    /// The prefix length is longer than the address.
    #[error("`{input}` has a prefix longer than the address: use at most /{max}")]
    PrefixTooLong {
        /// What was given.
        input: String,
        /// The longest prefix for the address family (32 or 128).
        max: u8,
    },
}

/// Why a key could not be taken from a request. A required key that is missing gets the
/// middleware's rejection (by default [`status`](Self::status) with this message), never a
/// panic and never a silent pass.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The server did not record the peer's address: the server is set up wrong (500).
    #[error(
        "the request carries no peer address: serve the app with \
         `into_make_service_with_connect_info::<SocketAddr>()` (axum) or insert a \
         `limiter_tower::PeerAddr` extension per connection"
    )]
    NoPeerAddress,
    /// The request lacks a header the key is read from (400).
    #[error("the request has no `{header}` header: send one")]
    MissingHeader {
        /// The header.
        header: HeaderName,
    },
    /// The header is there but cannot be a key (400).
    #[error("the `{header}` header cannot be a key: it must be visible ASCII of 1 to {max} bytes")]
    BadHeader {
        /// The header.
        header: HeaderName,
        /// The longest value accepted.
        max: usize,
    },
    /// A trusted proxy's hop list has an entry that is not an address (400).
    #[error(
        "the `{header}` header has an entry that is not an IP address ({entry:?}) where a \
         trusted proxy should have written one"
    )]
    BadForwarded {
        /// `x-forwarded-for` or `forwarded`.
        header: HeaderName,
        /// The entry (cut to 64 characters).
        entry: String,
    },
    /// A custom extractor's reason, with the status to answer.
    #[error("{message}")]
    Custom {
        /// The status the rejection carries.
        status: StatusCode,
        /// What was wrong and how to fix it.
        message: String,
    },
}

impl KeyError {
    /// A custom extractor's error: `status` (400 for the client's fault, 500 for the server's)
    /// and a message saying what to fix.
    pub fn custom(status: StatusCode, message: impl Into<String>) -> Self {
        Self::Custom {
            status,
            message: message.into(),
        }
    }

    /// The status a rejection for this error carries: 500 when the server is set up wrong,
    /// 400 when the request lacks what the key is read from.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::NoPeerAddress => StatusCode::INTERNAL_SERVER_ERROR,
            Self::MissingHeader { .. } | Self::BadHeader { .. } | Self::BadForwarded { .. } => {
                StatusCode::BAD_REQUEST
            }
            Self::Custom { status, .. } => *status,
        }
    }
}

/// A middleware that could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Two keys share a name, so a layer's `by_key(name)` would be ambiguous.
    #[error("two keys are named `{name}`: give each key its own name")]
    DuplicateKey {
        /// The name.
        name: &'static str,
    },
    /// A layer reads a key (`by_key(name)`) the middleware never extracts: every request
    /// would skip the layer, so its limit would never apply.
    #[error(
        "layer `{layer}` reads the key `{name}`, which the middleware never extracts ({known}): register it with `.key(\"{name}\", extractor)` or `.optional_key(…)`, or fix the name"
    )]
    UnknownKey {
        /// The layer's name.
        layer: String,
        /// The key name it reads.
        name: &'static str,
        /// The names the middleware does extract, for the message.
        known: String,
    },
    /// A prefix length beyond 128 bits.
    #[error("an IPv6 prefix of /{prefix} is longer than an address: use 0 to 128 (64 is usual)")]
    Ipv6Prefix {
        /// What was given.
        prefix: u8,
    },
    /// A header key's length bound of zero.
    #[error("a header key's longest value must be at least 1 byte, not 0")]
    ZeroMaxLen,
    /// The stack a shortcut ([`RateLimitLayer::per_ip`](crate::RateLimitLayer::per_ip))
    /// builds refused its limit.
    #[error("{0}")]
    Stack(#[from] limiter_stack::BuildError),
    /// A concurrency layer's count was refused (it must be 1 or more).
    #[error("a concurrency layer: {0}")]
    Concurrency(limiter_core::LimitError),
}
