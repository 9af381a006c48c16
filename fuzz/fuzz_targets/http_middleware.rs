//! Fuzz target: random peers, forwarded-hop headers, API keys, layer names and header modes
//! through the HTTP middleware, checking that keys cannot be spoofed and that every header
//! parses as what it claims to be. Crashers go in `fuzz/regressions/http_middleware/`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use limiter_testkit::http::run_bytes;

fuzz_target!(|bytes: &[u8]| run_bytes(bytes));
