//! The `[envoy]` table of limiterd's file, read into envoy's settings
//! ([`limiter_envoy::settings`]).

use std::path::PathBuf;

use limiter_envoy::settings::{
    DEFAULT_GRPC_LISTEN, EnvoySettings, EnvoySwitches, HeaderNames, check_header_name, parse_ratio,
};
use toml::Spanned;

use super::*;

pub(super) fn parse_envoy(
    source: &Source<'_>,
    envoy: &Spanned<RawEnvoy>,
) -> Result<EnvoySettings, ConfigError> {
    let raw = envoy.get_ref();
    let listen = match &raw.listen {
        None => DEFAULT_GRPC_LISTEN,
        Some(listen) => parse_listen(source, "listen", listen)?,
    };
    if raw.files.get_ref().is_empty() {
        return Err(source.at(
            &raw.files,
            "`files` is empty: list the descriptor files (YAML) envoy's domains are in",
        ));
    }
    let mut files = Vec::new();
    for file in raw.files.get_ref() {
        if file.get_ref().is_empty() {
            return Err(source.at(file, "an empty file name: write the path to a YAML file"));
        }
        files.push(PathBuf::from(file.get_ref()));
    }
    let mut settings = EnvoySettings::new(listen, files);
    settings.set_in_file = EnvoySwitches {
        shadow_mode: raw.shadow_mode.is_some(),
        merge_domains: raw.merge_domains.is_some(),
        dynamic_metadata: raw.dynamic_metadata.is_some(),
        near_limit_ratio: raw.near_limit_ratio.is_some(),
        response_headers: raw.response_headers.is_some(),
        header_names: raw.limit_header.is_some()
            || raw.remaining_header.is_some()
            || raw.reset_header.is_some(),
    };
    settings.merge_domains = raw.merge_domains.unwrap_or(false);
    let options = &mut settings.options;
    options.shadow_mode = raw.shadow_mode.unwrap_or(false);
    options.dynamic_metadata = raw.dynamic_metadata.unwrap_or(false);
    if let Some(ratio) = &raw.near_limit_ratio {
        options.near_limit_ratio = parse_ratio(&ratio.get_ref().to_string())
            .map_err(|e| source.at(ratio, format!("`near_limit_ratio` {e}")))?;
    }
    if raw.response_headers == Some(true) {
        let mut names = HeaderNames::default();
        for (field, value, name) in [
            ("limit_header", &raw.limit_header, &mut names.limit),
            (
                "remaining_header",
                &raw.remaining_header,
                &mut names.remaining,
            ),
            ("reset_header", &raw.reset_header, &mut names.reset),
        ] {
            if let Some(value) = value {
                check_header_name(value.get_ref())
                    .map_err(|e| source.at(value, format!("`{field}` {e}")))?;
                *name = value.get_ref().clone();
            }
        }
        options.headers = Some(names);
    }
    Ok(settings)
}
