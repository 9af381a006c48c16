//! The HTTP face: [`request`] reads the native API's requests (always built: the fuzz targets
//! drive it; `fast` reads the usual body without serde) and `api` (feature `server`) routes them, with envoy's `POST /json`, health,
//! metrics, the debug views and the OpenAPI document, each native route's handler taking `guard`'s
//! extractor (the native API's keys) first; `unkey` (feature `server`) serves
//! unkey's v2 ratelimit API to its SDKs, behind the keys limiterd accepts
//! ([`crate::config::keys`]).

#[cfg(feature = "server")]
pub mod api;
#[cfg(feature = "server")]
mod body;
mod fast;
#[cfg(feature = "server")]
mod guard;
#[cfg(feature = "server")]
mod release;
pub mod request;
#[cfg(feature = "server")]
pub mod unkey;

#[cfg(feature = "server")]
pub use api::{OPENAPI, router};
