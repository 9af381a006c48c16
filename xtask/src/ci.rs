//! `cargo xtask ci`: the checks a change must pass, in the order that fails fastest; and
//! `cargo xtask lint`, the same without the tests (for `.ci/run`, which runs README.md's test
//! command itself).

use crate::run::{cargo, root};

/// fmt, the architecture invariants, clippy, the tests, rustdoc.
pub(crate) fn run() -> Result<(), String> {
    fmt_and_clippy()?;
    cargo(&["test", "--workspace"], &[])?;
    rustdoc()?;
    eprintln!("xtask: ci passed");
    Ok(())
}

/// fmt, the invariants, clippy, rustdoc: everything `run` checks but the tests.
pub(crate) fn lint() -> Result<(), String> {
    fmt_and_clippy()?;
    rustdoc()?;
    eprintln!("xtask: lint passed");
    Ok(())
}

fn fmt_and_clippy() -> Result<(), String> {
    cargo(&["fmt", "--all", "--check"], &[])?;
    crate::invariants::check(&root())?;
    crate::guides::check(&root())?;
    crate::functions::check(&root())?;
    cargo(
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )
}

fn rustdoc() -> Result<(), String> {
    cargo(
        &[
            "doc",
            "--workspace",
            "--no-deps",
            "--document-private-items",
        ],
        &[(
            "RUSTDOCFLAGS",
            "-D warnings -D rustdoc::broken_intra_doc_links",
        )],
    )
}
