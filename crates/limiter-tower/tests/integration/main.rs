//! limiter-tower's suites: the layers on real HTTP and gRPC servers over loopback, on memory and
//! on Redis.
//!
//! One test binary, a module per suite: each suite was a binary of its own, and every one
//! compiled and linked the same code again.

mod concurrency;
mod grpc;
mod http;
mod redis;
mod redis_concurrency;
mod support;
