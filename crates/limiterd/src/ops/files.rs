//! Where the configuration comes from: the TOML file (or [`BUILT_IN`]), the envoy descriptor
//! files it and the command line name, and the command line's overrides. [`Sources::load`]
//! reads them all into a checked [`Config`] and envoy's [`Domains`], with the messages
//! `limiterd check-config` prints, at start and on every reload alike.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{BUILT_IN, Config, DEFAULT_GRPC_LISTEN, EnvoySettings, Store};
use crate::envoy::Domains;

/// The files and the command line's overrides a configuration is read from.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    /// The TOML file; [`BUILT_IN`] without one.
    pub config: Option<PathBuf>,
    /// `--redis`: keep state on this Redis, overriding the file's store.
    pub redis: Option<String>,
    /// `--redis-timeout-ms`: each Redis call's timeout, overriding the file's `timeout_ms`.
    pub redis_timeout_ms: Option<u64>,
    /// `--listen`: the HTTP address, overriding the file's.
    pub listen: Option<SocketAddr>,
    /// `--envoy`: descriptor files, added to the file's.
    pub envoy: Vec<PathBuf>,
    /// `--grpc-listen`: the gRPC address, overriding the file's.
    pub grpc_listen: Option<SocketAddr>,
    /// Read the reference service's environment variables for the `[envoy]` switches the
    /// file leaves unset ([`EnvoySettings::apply_reference_env`]); the binary sets it.
    pub reference_env: bool,
    /// `--overrides`: where unkey's overrides are kept (see [`Sources::overrides_file`]).
    pub overrides: Option<PathBuf>,
}

/// The overrides file's name beside the configuration file.
pub const OVERRIDES_FILE: &str = "limiterd-overrides.json";

/// The text of `path`, or a message naming it.
pub fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read it: {e}", path.display()))
}

/// The configuration in `path`, its file names (envoy's, TLS and password files) made
/// relative to its directory.
pub fn load_config(path: &Path) -> Result<Config, String> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let mut config =
        Config::parse_in(&read(path)?, dir).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(envoy) = &mut config.envoy {
        let dir = path.parent().unwrap_or(Path::new(""));
        for file in &mut envoy.files {
            if file.is_relative() {
                *file = dir.join(&*file);
            }
        }
    }
    Ok(config)
}

/// The envoy domains `config` names, read and checked; what they say that is ignored is
/// logged as a warning.
pub fn load_domains(config: &Config) -> Result<Domains, String> {
    let Some(envoy) = &config.envoy else {
        return Ok(Domains::default());
    };
    let texts = descriptor_files(&envoy.files)?
        .iter()
        .map(|f| Ok((f.display().to_string(), read(f)?)))
        .collect::<Result<Vec<_>, String>>()?;
    let domains = Domains::load_merging(
        texts.iter().map(|(n, t)| (n.as_str(), t.as_str())),
        envoy.merge_domains,
    )
    .map_err(|e| e.to_string())?;
    for warning in domains.warnings() {
        tracing::warn!(target: "limiterd::envoy", "{warning}");
    }
    Ok(domains)
}

/// `files` with each directory replaced by the `.yaml` and `.yml` files in it, by name (as
/// the reference loads its runtime directory; files whose name starts with `.` are skipped).
pub fn descriptor_files(files: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for path in files {
        if !path.is_dir() {
            out.push(path.clone());
            continue;
        }
        let entries = std::fs::read_dir(path)
            .map_err(|e| format!("{}: cannot list it: {e}", path.display()))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or(".");
                !name.starts_with('.')
                    && p.is_file()
                    && p.extension().is_some_and(|e| e == "yaml" || e == "yml")
            })
            .collect();
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

impl Sources {
    /// Where unkey's overrides are kept: `--overrides`, else [`OVERRIDES_FILE`] beside the
    /// configuration file; `None` (in memory only) with neither.
    pub fn overrides_file(&self) -> Option<PathBuf> {
        self.overrides.clone().or_else(|| {
            let config = self.config.as_ref()?;
            Some(config.with_file_name(OVERRIDES_FILE))
        })
    }

    /// Reads and checks every file, then applies the overrides.
    pub fn load(&self) -> Result<(Config, Domains), String> {
        let mut config = match &self.config {
            Some(path) => load_config(path)?,
            None => {
                Config::parse(BUILT_IN).map_err(|e| format!("the built-in configuration: {e}"))?
            }
        };
        if let Some(url) = &self.redis {
            config = config.with_redis(url).map_err(|e| e.to_string())?;
        }
        if let Some(ms) = self.redis_timeout_ms {
            redis_timeout(&mut config, ms)?;
        }
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        if !self.envoy.is_empty() || self.grpc_listen.is_some() {
            let envoy = config
                .envoy
                .get_or_insert_with(|| EnvoySettings::new(DEFAULT_GRPC_LISTEN, Vec::new()));
            envoy.files.extend(self.envoy.iter().cloned());
            if let Some(listen) = self.grpc_listen {
                envoy.listen = listen;
            }
            if envoy.files.is_empty() {
                return Err("--grpc-listen needs descriptor files: add --envoy FILE".into());
            }
        }
        if self.reference_env
            && let Some(envoy) = &mut config.envoy
        {
            envoy.apply_reference_env(|name| std::env::var(name).ok())?;
        }
        let domains = load_domains(&config)?;
        Ok((config, domains))
    }

    /// The files a reload reads for `config` (loaded from these sources): the TOML file and
    /// every descriptor file.
    /// (A directory is watched itself, for files added or removed, and through its files.)
    pub fn files(&self, config: &Config) -> Vec<PathBuf> {
        let envoy = config.envoy.iter().flat_map(|e| {
            let listed = descriptor_files(&e.files).unwrap_or_default();
            e.files
                .iter()
                .filter(|f| f.is_dir())
                .cloned()
                .chain(listed)
                .collect::<Vec<_>>()
        });
        self.config.iter().cloned().chain(envoy).collect()
    }
}

/// `--redis-timeout-ms`: each Redis call's timeout, checked as the file's `timeout_ms` is (and
/// against its `wait_timeout_ms`, which must stay below it).
fn redis_timeout(config: &mut Config, ms: u64) -> Result<(), String> {
    let Store::Redis { connection, .. } = &mut config.store else {
        return Err(format!(
            "--redis-timeout-ms {ms}: the store is in memory; add --redis WHERE, or a Redis `[store]` to the file"
        ));
    };
    if !(1..=60_000).contains(&ms) {
        return Err(format!(
            "--redis-timeout-ms {ms}: use 1 to 60000 milliseconds"
        ));
    }
    let timeout = Duration::from_millis(ms);
    if let Some(wait) = connection.wait
        && wait.timeout >= timeout
    {
        return Err(format!(
            "--redis-timeout-ms {ms}: the file's `wait_timeout_ms = {}` must stay below it; raise the timeout or lower the wait",
            wait.timeout.as_millis()
        ));
    }
    connection.timeout = timeout;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_the_built_in_configuration_with_overrides_and_names_what_it_reads() {
        let sources = Sources {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9))),
            ..Sources::default()
        };
        let (config, domains) = sources.load().expect("valid");
        assert_eq!(config.listen.port(), 9);
        assert!(domains.is_empty());
        assert!(
            sources.files(&config).is_empty(),
            "the built-in file is not a file"
        );

        let missing = Sources {
            envoy: vec![PathBuf::from("/nonexistent/limits.yaml")],
            ..Sources::default()
        };
        let err = missing.load().expect_err("no such file");
        assert!(
            err.starts_with("/nonexistent/limits.yaml: cannot read it"),
            "{err}"
        );
        let grpc_only = Sources {
            grpc_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9))),
            ..Sources::default()
        };
        assert!(
            grpc_only
                .load()
                .expect_err("no files")
                .contains("--envoy FILE")
        );
    }

    #[test]
    fn the_redis_timeout_flag_overrides_the_file_and_is_checked_like_it() {
        let timeout = |redis: Option<&str>, ms: u64| {
            let sources = Sources {
                redis: redis.map(str::to_owned),
                redis_timeout_ms: Some(ms),
                ..Sources::default()
            };
            sources.load().map(|(config, _)| match config.store {
                Store::Redis { connection, .. } => connection.timeout,
                Store::Memory { .. } => unreachable!("a memory store is refused"),
            })
        };
        let redis = Some("redis://127.0.0.1:6379");
        assert_eq!(timeout(redis, 400), Ok(Duration::from_millis(400)));
        let memory = timeout(None, 400).unwrap_err();
        assert!(
            memory.contains("the store is in memory; add --redis"),
            "{memory}"
        );
        for ms in [0, 60_001] {
            let err = timeout(redis, ms).unwrap_err();
            assert!(err.contains("use 1 to 60000 milliseconds"), "{err}");
        }
        // A wait for replicas must stay below the call's timeout.
        let mut config = Config::parse(
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n\
             timeout_ms = 100\nwait_replicas = 1\nwait_timeout_ms = 50\n\
             [policies.api]\nlimits = [{ algorithm = \"token_bucket\", count = 10, period = \"1s\" }]\n",
        )
        .expect("valid");
        let err = redis_timeout(&mut config, 50).unwrap_err();
        assert!(
            err.contains("`wait_timeout_ms = 50` must stay below it"),
            "{err}"
        );
        assert_eq!(redis_timeout(&mut config, 51), Ok(()));
    }
}
