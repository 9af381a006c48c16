//! limiter-redis's integration suites, each against `redis-server` processes the suite starts
//! itself.
//!
//! One test binary, a module per suite: each suite was a binary of its own, and every one
//! compiled and linked the same code again.

mod auth;
mod batch;
mod cluster;
mod cluster_faults;
mod cluster_nodes;
mod cluster_spread;
mod coalesce;
mod definition;
mod differential;
mod failure;
mod fleet;
mod lease;
mod leased_fleet;
mod permits;
mod quota;
mod record;
mod records;
mod refund;
mod semantics;
mod sentinel;
mod tls;
