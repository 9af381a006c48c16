//! limiter-token-bucket's suites: conformance, every limit, bad input, a reference model, threads.
//!
//! One test binary, a module per suite: each suite was a binary of its own, and every one
//! compiled and linked the same code again.

mod bad_input;
mod conformance;
mod every_limit;
mod proptest;
mod stress;
