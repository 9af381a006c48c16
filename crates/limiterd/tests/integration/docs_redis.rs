//! docs/operations.md's "Connecting to your Redis" configurations are real: each one, beside the files
//! it names (certificates the test generates, a password file) and with the variables it reads
//! set, passes `limiterd check-config`.

use limiter_testkit::redis_server::tls::TestCerts;

const POLICY: &str =
    "\n[policies.api]\nlimits = [{ algorithm = \"token_bucket\", count = 10, period = \"1s\" }]\n";

/// The `toml` blocks of the guide's section named `heading` (up to the next section).
fn toml_blocks(readme: &str, heading: &str) -> Vec<String> {
    let start = readme.find(heading).expect("the section is in the guide");
    let section = &readme[start + heading.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    section
        .split("```toml\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn every_configuration_in_connecting_to_your_redis_passes_check_config() {
    let guide = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operations.md");
    let guide = std::fs::read_to_string(guide).expect("docs/operations.md");
    let blocks = toml_blocks(&guide, "## Connecting to your Redis");
    assert!(
        blocks.len() >= 5,
        "one configuration per topology: {}",
        blocks.len()
    );
    let dir = std::env::temp_dir().join(format!("limiterd-readme-{}", std::process::id()));
    // The guide's file names: ca.pem, client.pem and client.key (the generated ones).
    let certs = TestCerts::generate(&dir);
    assert!(certs.client_cert.ends_with("client.pem") && certs.ca.ends_with("ca.pem"));
    std::fs::write(dir.join("redis-password"), "from-a-secret\n").unwrap();
    for (i, block) in blocks.iter().enumerate() {
        let file = dir.join(format!("connecting-{i}.toml"));
        // Tables after `[store]`'s fields: the policy goes last.
        std::fs::write(&file, format!("{block}{POLICY}")).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_limiterd"))
            .args(["check-config", file.to_str().unwrap()])
            .env("REDIS_PASSWORD", "from-a-variable")
            .env("SENTINEL_PASSWORD", "the-sentinels-own")
            .output()
            .expect("runs");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "docs/operations.md block {i}:\n{block}\n{said}"
        );
        assert!(!said.contains("from-a-"), "{said}");
    }
}
