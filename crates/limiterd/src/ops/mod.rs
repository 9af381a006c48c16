//! Operating the service: where a configuration is read from ([`files`]: files and
//! command-line overrides, at start and on reload), the state serving now and its reloads
//! ([`live`]: swapped whole, readiness), and what an operator sees of it ([`debug`]: the
//! configuration and status views, the status page), and the run-time data a reload keeps
//! ([`overrides`]: unkey's per-identifier overrides, kept in a file).

pub mod debug;
pub mod files;
pub mod live;
pub mod overrides;
