//! limiter-store's suites: bounds, reclamation, borrowed keys and refunds.
//!
//! One test binary, a module per suite: each suite was a binary of its own, and every one
//! compiled and linked the same code again.

mod borrowed_keys;
mod bounded;
mod reclamation;
mod refunds;
mod rotating_keys;
