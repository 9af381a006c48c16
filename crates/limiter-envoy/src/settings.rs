//! Envoy's settings: where its gRPC protocol listens, its descriptor files, and the
//! service-wide options (shadow mode, near-limit ratio, header names), with the reference
//! server's environment variables for what a configuration file leaves unset.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Service-wide switches, as the reference's environment sets them (`SHADOW_MODE`,
/// `NEAR_LIMIT_RATIO`, `LIMIT_RESPONSE_HEADERS_ENABLED` and the header names,
/// `RESPONSE_DYNAMIC_METADATA`).
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Global shadow mode: no configured limit denies (statuses still say which descriptors
    /// were over, and what fits is counted); a limit envoy sends with a descriptor still does.
    pub shadow_mode: bool,
    /// A hit that leaves a limit more than this fraction used counts as `near_limit`.
    pub near_limit_ratio: f64,
    /// Rate-limit headers added to every answer (`response_headers_to_add`), if enabled.
    pub headers: Option<HeaderNames>,
    /// Describe the request's descriptors in the answer's `dynamic_metadata`.
    pub dynamic_metadata: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            shadow_mode: false,
            near_limit_ratio: 0.8,
            headers: None,
            dynamic_metadata: false,
        }
    }
}

/// The names of the rate-limit headers (the reference's defaults: `RateLimit-Limit`,
/// `RateLimit-Remaining`, `RateLimit-Reset`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderNames {
    /// The limit of the descriptor closest to its limit.
    pub limit: String,
    /// What it has left.
    pub remaining: String,
    /// Seconds until it resets.
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// Where envoy's gRPC protocol listens, unless the file says.
pub const DEFAULT_GRPC_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    8081,
));

/// Envoy's rate-limit protocol: where its gRPC service listens and the descriptor files it
/// decides (see [`crate::rules`]).
#[derive(Clone, Debug, PartialEq)]
pub struct EnvoySettings {
    /// The gRPC address.
    pub listen: SocketAddr,
    /// The descriptor files, as written (relative to the configuration file); a directory
    /// stands for every `.yaml` and `.yml` file in it, as the reference's runtime directory.
    pub files: Vec<PathBuf>,
    /// `merge_domains`: a domain named in several files gathers their descriptors (the
    /// reference's `MERGE_DOMAIN_CONFIG`); off, a domain lives in one file.
    pub merge_domains: bool,
    /// The service-wide switches (global shadow mode, near-limit ratio, rate-limit headers,
    /// dynamic metadata).
    pub options: Options,
    /// Which switches the `[envoy]` table set itself (the reference's environment variables
    /// only fill in the others).
    pub set_in_file: EnvoySwitches,
}

impl EnvoySettings {
    /// Settings for `files`, listening on `listen`, with every switch at its default.
    pub fn new(listen: SocketAddr, files: Vec<PathBuf>) -> Self {
        Self {
            listen,
            files,
            merge_domains: false,
            options: Options::default(),
            set_in_file: EnvoySwitches::default(),
        }
    }

    /// Applies the reference service's environment variables (`SHADOW_MODE`,
    /// `NEAR_LIMIT_RATIO`, `MERGE_DOMAIN_CONFIG`, `LIMIT_RESPONSE_HEADERS_ENABLED`,
    /// `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`,
    /// `RESPONSE_DYNAMIC_METADATA`) read through `var`, for what the `[envoy]` table left
    /// unset ([`EnvoySettings::set_in_file`]), so a deployment configured for the reference
    /// keeps its switches.
    pub fn apply_reference_env(
        &mut self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<(), String> {
        let set_in_file = self.set_in_file;
        let flag = |name: &str| -> Result<Option<bool>, String> {
            match var(name) {
                None => Ok(None),
                Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                    "1" | "t" | "true" | "yes" | "on" => Ok(Some(true)),
                    "0" | "f" | "false" | "no" | "off" | "" => Ok(Some(false)),
                    _ => Err(format!(
                        "{name}={v:?} is not a boolean: set it to true or false"
                    )),
                },
            }
        };
        if !set_in_file.shadow_mode
            && let Some(on) = flag("SHADOW_MODE")?
        {
            self.options.shadow_mode = on;
        }
        if !set_in_file.merge_domains
            && let Some(on) = flag("MERGE_DOMAIN_CONFIG")?
        {
            self.merge_domains = on;
        }
        if !set_in_file.dynamic_metadata
            && let Some(on) = flag("RESPONSE_DYNAMIC_METADATA")?
        {
            self.options.dynamic_metadata = on;
        }
        if !set_in_file.near_limit_ratio
            && let Some(v) = var("NEAR_LIMIT_RATIO")
        {
            self.options.near_limit_ratio =
                parse_ratio(&v).map_err(|e| format!("NEAR_LIMIT_RATIO={v:?} {e}"))?;
        }
        if !set_in_file.response_headers
            && let Some(on) = flag("LIMIT_RESPONSE_HEADERS_ENABLED")?
        {
            self.options.headers = on.then(HeaderNames::default);
        }
        if let Some(names) = &mut self.options.headers {
            for (variable, name) in [
                ("LIMIT_LIMIT_HEADER", &mut names.limit),
                ("LIMIT_REMAINING_HEADER", &mut names.remaining),
                ("LIMIT_RESET_HEADER", &mut names.reset),
            ] {
                if let Some(v) = var(variable).filter(|v| !v.is_empty())
                    && !set_in_file.header_names
                {
                    check_header_name(&v).map_err(|e| format!("{variable}={v:?} {e}"))?;
                    *name = v;
                }
            }
        }
        Ok(())
    }
}

/// Which of the `[envoy]` switches the file set, so the reference's environment variables
/// only fill in the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnvoySwitches {
    /// `shadow_mode`.
    pub shadow_mode: bool,
    /// `merge_domains`.
    pub merge_domains: bool,
    /// `dynamic_metadata`.
    pub dynamic_metadata: bool,
    /// `near_limit_ratio`.
    pub near_limit_ratio: bool,
    /// `response_headers`.
    pub response_headers: bool,
    /// Any of the header names.
    pub header_names: bool,
}

/// A ratio between 0 and 1 (`near_limit_ratio`), or why not.
pub fn parse_ratio(text: &str) -> Result<f64, &'static str> {
    match text.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err("is not a ratio between 0 and 1: write one like 0.8"),
    }
}

/// Whether `name` can name a rate-limit header, or why not.
pub fn check_header_name(name: &str) -> Result<(), &'static str> {
    if !name.is_empty() && http::HeaderName::from_bytes(name.as_bytes()).is_ok() {
        Ok(())
    } else {
        Err("is not a header name: use letters, digits and `-`, like RateLimit-Limit")
    }
}
