//! The HTTP face: [`request`] reads the native API's requests (always built: the fuzz targets
//! drive it) and `api` (feature `server`) routes them, with envoy's `POST /json`, health,
//! metrics, the debug views and the OpenAPI document.

#[cfg(feature = "server")]
pub mod api;
pub mod request;

#[cfg(feature = "server")]
pub use api::{OPENAPI, router};
