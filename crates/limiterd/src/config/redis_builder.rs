//! From checked `[store]` Redis settings to the library's [`BackendBuilder`], and the
//! `--redis` flag's forms (one server, `cluster:`, `sentinel:`).

use crate::store::{BackendBuilder, BreakerConfig, RedisBackend, RedisUrl};

#[cfg(feature = "tls")]
use super::redis_store::TlsFiles;
use super::redis_store::{Login, PasswordFrom, RedisAt, RedisConnection, SentinelAt};

#[cfg(feature = "tls")]
impl TlsFiles {
    /// The library's TLS options, reading the files.
    pub fn options(&self) -> Result<crate::store::TlsOptions, crate::store::TlsError> {
        let mut options = crate::store::TlsOptions::new();
        if let Some(ca) = &self.ca_file {
            options = options.ca_file(ca)?;
        }
        if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
            options = options.client_identity_files(cert, key)?;
        }
        if let Some(name) = &self.server_name {
            options = options.server_name(name.clone());
        }
        Ok(options)
    }
}

impl Login {
    fn apply(&self, builder: BackendBuilder, sentinel: bool) -> BackendBuilder {
        let builder = match (&self.username, sentinel) {
            (Some(user), false) => builder.username(user.clone()),
            (Some(user), true) => builder.sentinel_username(user.clone()),
            (None, _) => builder,
        };
        match (&self.password, sentinel) {
            (None, _) => builder,
            (Some(PasswordFrom::Inline(p) | PasswordFrom::Env { value: p, .. }), false) => {
                builder.password(p.clone())
            }
            (Some(PasswordFrom::Inline(p) | PasswordFrom::Env { value: p, .. }), true) => {
                builder.sentinel_password(p.clone())
            }
            (Some(PasswordFrom::File(path)), false) => builder.password_file(path.clone()),
            (Some(PasswordFrom::File(path)), true) => builder.sentinel_password_file(path.clone()),
        }
    }
}

/// What `--redis` takes, for its error messages.
const FLAG_FORMS: &str = "redis://[user:password@]host:port (one server; rediss:// for TLS), \
     cluster:redis://host:port,redis://host:port,... (a Redis Cluster's seed nodes) or \
     sentinel:MASTER@redis://host:26379,redis://host:26379,... (Redis Sentinel); a CA or client \
     certificate, a password file or variable, and a sentinel's own login go in `[store]` of a \
     --config file";

impl RedisAt {
    /// Reads `--redis`: one server's URL, `cluster:` and the seeds' URLs, or
    /// `sentinel:MASTER@` and the sentinels' URLs (URLs separated by commas).
    pub fn from_flag(flag: &str) -> Result<Self, String> {
        let urls = |list: &str| {
            list.split(',')
                .map(|u| RedisUrl::parse(u.trim()).map_err(|e| format!("--redis: {e}")))
                .collect::<Result<Vec<_>, _>>()
        };
        if let Some(seeds) = flag.strip_prefix("cluster:") {
            return Ok(Self::Cluster(urls(seeds)?));
        }
        if let Some(rest) = flag.strip_prefix("sentinel:") {
            let (master, sentinels) = rest
                .split_once('@')
                .filter(|(m, s)| !m.is_empty() && !s.is_empty())
                .ok_or_else(|| format!("--redis sentinel: write it as {FLAG_FORMS}"))?;
            return Ok(Self::Sentinel(SentinelAt {
                master: master.to_owned(),
                sentinels: urls(sentinels)?,
                login: Login::default(),
                tls: None,
            }));
        }
        if flag.starts_with("redis://") || flag.starts_with("rediss://") {
            return RedisUrl::parse(flag)
                .map(Self::Server)
                .map_err(|e| format!("--redis: {e}"));
        }
        Err(format!("--redis takes {FLAG_FORMS}"))
    }
}

impl RedisConnection {
    /// The defaults, at `at`.
    pub fn new(at: RedisAt) -> Self {
        Self {
            at,
            timeout: crate::store::DEFAULT_TIMEOUT,
            login: Login::default(),
            tls: None,
            breaker: BreakerConfig::default(),
            wait: None,
        }
    }

    /// These settings at `at` instead (the `--redis` flag): refused when the file's TLS
    /// settings do not fit the new URLs.
    pub fn at(mut self, at: RedisAt) -> Result<Self, String> {
        let plain_urls = match &at {
            RedisAt::Server(url) => !url.tls(),
            RedisAt::Cluster(seeds) => seeds.iter().any(|u| !u.tls()),
            RedisAt::Sentinel(_) => false,
        };
        if self.tls.is_some() && plain_urls {
            return Err(
                "--redis names a redis:// URL but the file's `[store.tls]` asks for TLS: write rediss://".to_owned(),
            );
        }
        let any_tls = match &at {
            RedisAt::Server(url) => url.tls(),
            RedisAt::Cluster(seeds) => seeds.iter().any(RedisUrl::tls),
            RedisAt::Sentinel(s) => s.sentinels.iter().any(RedisUrl::tls),
        };
        if any_tls && !cfg!(feature = "tls") {
            return Err("this limiterd was built without TLS (the `tls` feature): rebuild with it to use rediss://".to_owned());
        }
        self.at = at;
        Ok(self)
    }

    /// The backend these settings describe, ready to connect (reading the TLS files again).
    pub fn builder(&self) -> Result<BackendBuilder, String> {
        let builder = match &self.at {
            RedisAt::Server(url) => RedisBackend::builder(url.clone()),
            RedisAt::Cluster(seeds) => RedisBackend::cluster_builder(seeds.iter().cloned()),
            RedisAt::Sentinel(at) => {
                let builder =
                    RedisBackend::sentinel_builder(at.master.clone(), at.sentinels.iter().cloned());
                #[cfg(feature = "tls")]
                let builder = match &at.tls {
                    Some(tls) => builder.sentinel_tls(tls.options().map_err(|e| e.to_string())?),
                    None => builder,
                };
                at.login.apply(builder, true)
            }
        };
        let mut builder = self
            .login
            .apply(builder, false)
            .timeout(self.timeout)
            .breaker(self.breaker);
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            builder = builder.tls(tls.options().map_err(|e| e.to_string())?);
        }
        if let Some(wait) = self.wait {
            builder = builder.wait_for_replicas(wait.replicas, wait.timeout);
        }
        Ok(builder)
    }
}
