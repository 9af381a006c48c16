//! limiter-stack's suites: stacks against a reference model, under threads, at their key bound.
//!
//! One test binary, a module per suite: each suite was a binary of its own, and every one
//! compiled and linked the same code again.

mod max_keys;
mod model;
mod open_plans;
mod stack;
mod stress;
