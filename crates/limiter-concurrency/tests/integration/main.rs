//! limiter-concurrency's suites: permits against a reference model, under threads, in stacks.
//!
//! One test binary, a module per suite: each suite was a binary of its own, and every one
//! compiled and linked the same code again.

mod grace;
mod guards;
mod model;
mod stacked;
mod stress;
