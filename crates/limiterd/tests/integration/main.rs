//! limiterd's suites: the service over loopback HTTP and gRPC, on memory, Redis and clusters.
//!
//! One test binary, a module per suite: each suite was a binary of its own, and every one
//! compiled and linked the same code again.

mod calendar;
mod calendar_together;
mod cluster;
mod concurrency;
mod docs_redis;
mod envoy;
mod failover;
mod openapi;
mod operations;
mod operators;
mod overrides;
mod process;
mod process_edges;
mod store_failures;
mod support;
mod unkey;
mod unkey_fleet;
mod usage;
