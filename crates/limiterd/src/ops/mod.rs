//! Operating the service: where a configuration is read from ([`files`]: files and
//! command-line overrides, at start and on reload), the state serving now and its reloads
//! ([`live`]: swapped whole, readiness), and what an operator sees of it ([`debug`]: the
//! configuration and status views, the status page).

pub mod debug;
pub mod files;
pub mod live;
