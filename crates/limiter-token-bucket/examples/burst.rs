//! The project's demo: a burst of requests from three API keys against a per-key token bucket
//! (5 per second, bursts of 3), with every decision printed. Time is a `ManualClock`, so the
//! run is instant and the output is the same every time.
//!
//! Run it with `cargo run --release --example burst`.

use std::time::Duration;

use limiter_token_bucket::{KeyedTokenBucket, Limit, ManualClock};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limit = Limit::per_second(5).with_burst(3);
    let clock = ManualClock::new();
    let per_key = KeyedTokenBucket::<&str, _>::with_clock(limit, clock.clone())?;
    println!("limit: {limit} per API key\n");

    // (milliseconds since start, API key, cost)
    let requests = [
        (0, "alice", 1),
        (0, "alice", 1),
        (0, "alice", 1),
        (0, "alice", 1),
        (0, "bob", 2),
        (10, "bob", 2),
        (150, "alice", 1),
        (200, "alice", 1),
        (200, "carol", 0),
        (250, "alice", 1),
        (400, "bob", 2),
        (1_000, "alice", 3),
    ];
    let mut allowed = 0;
    for (at_ms, key, cost) in requests {
        clock.set(Duration::from_millis(at_ms).as_nanos().try_into()?);
        let decision = per_key.check_key_n(&key, cost)?;
        allowed += u32::from(decision.is_allowed() && cost > 0);
        let what = if cost == 0 {
            "peek".to_string()
        } else {
            format!("cost {cost}")
        };
        println!("t={at_ms:>5}ms  {key:<6} {what:<7} -> {decision}");
    }
    println!("\n{allowed} requests admitted; {} keys held", per_key.len());
    Ok(())
}
