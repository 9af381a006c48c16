//! `cargo xtask loom`: every loom model, under our namespaced `--cfg limiter_loom`.

use crate::run::cargo;

/// Crates with loom models in `tests/loom.rs`.
const MODELLED: &[&str] = &[
    "limiter-core",
    "limiter-token-bucket",
    "limiter-sliding-window",
    "limiter-store",
    "limiter-stack",
    "limiter-concurrency",
    "limiter-calendar",
];

pub(crate) fn run() -> Result<(), String> {
    // A separate target directory keeps the cfg'd build from invalidating the normal one.
    let target = crate::run::target_dir().join("loom");
    let target = target.to_string_lossy();
    for package in MODELLED {
        cargo(
            &[
                "test",
                "--release",
                "--package",
                package,
                "--test",
                "loom",
                "--target-dir",
                &target,
            ],
            &[
                ("RUSTFLAGS", "--cfg limiter_loom"),
                ("LOOM_MAX_PREEMPTIONS", "2"),
            ],
        )?;
    }
    Ok(())
}
