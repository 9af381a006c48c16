//! limiter-sliding-window's suites: conformance, accuracy, every limit, a reference model, threads.
//!
//! One test binary, a module per suite: each suite was a binary of its own, and every one
//! compiled and linked the same code again.

mod accuracy;
mod conformance;
mod every_limit;
mod proptest;
mod stress;
