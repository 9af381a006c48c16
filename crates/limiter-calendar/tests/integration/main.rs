//! limiter-calendar's suites: boundaries, clocks and the reference model.
//!
//! One test binary, a module per suite: each suite was a binary of its own, and every one
//! compiled and linked the same code again.

mod boundaries;
mod clocks;
mod model;
