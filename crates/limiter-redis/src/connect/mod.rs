//! How a backend reaches one Redis server: its address and URL ([`url`]), secrets that are
//! never printed ([`secret`]), TLS (`tls` and the certificate check `verify`, feature `tls`) and the connection itself ([`link`]).

pub(crate) mod link;
pub(crate) mod secret;
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub(crate) mod url;
#[cfg(feature = "tls")]
pub(crate) mod verify;
