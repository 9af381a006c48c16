//! The `[auth]` table: the keys limiterd accepts, each a name, the SHA-256 digest of the key
//! (never the key) and its permissions, and whether the native API (`/v1`, `/debug`,
//! `/metrics`, the status page) is behind them too. unkey's v2 API always is.
//!
//! ```toml
//! [auth]
//! keys = [
//!   { name = "billing", sha256 = "9f86d081…", permissions = ["decide", "read_overrides"] },
//! ]
//! protect_native = true   # default: on when `listen` is not a loopback address
//! ```

use toml::Spanned;

use super::keys::{Key, Permissions, parse_hex_digest};
use super::*;

/// What `[auth]` says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthSettings {
    /// The keys from the file (the root key from `LIMITERD_ROOT_KEY` is added when served).
    pub keys: Vec<Key>,
    /// Whether the native API needs a key; `None`: on exactly when `listen` is not loopback.
    pub protect_native: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuth {
    #[serde(default)]
    keys: Vec<Spanned<RawKey>>,
    protect_native: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    name: Spanned<String>,
    sha256: Spanned<String>,
    permissions: Spanned<Vec<Spanned<String>>>,
}

pub(super) fn parse_auth(source: &Source<'_>, raw: &RawAuth) -> Result<AuthSettings, ConfigError> {
    let mut keys: Vec<Key> = Vec::new();
    for key in &raw.keys {
        let key = key.get_ref();
        let name = key.name.get_ref();
        if name.is_empty() || keys.iter().any(|k| &k.name == name) {
            return Err(source.at(
                &key.name,
                format!("key name {name:?} is empty or given twice: name each key once"),
            ));
        }
        let digest = parse_hex_digest(key.sha256.get_ref()).ok_or_else(|| {
            source.at(
                &key.sha256,
                "`sha256` is not 64 hex digits: write the key's SHA-256 (`printf %s KEY | sha256sum`), never the key",
            )
        })?;
        let mut permissions = Permissions::default();
        for p in key.permissions.get_ref() {
            match p.get_ref().as_str() {
                "decide" => permissions.decide = true,
                "read_overrides" => permissions.read_overrides = true,
                "write_overrides" => permissions.write_overrides = true,
                other => {
                    return Err(source.at(
                        p,
                        format!("unknown permission {other:?}: use \"decide\", \"read_overrides\" or \"write_overrides\""),
                    ));
                }
            }
        }
        keys.push(Key::from_digest(name.clone(), digest, permissions));
    }
    Ok(AuthSettings {
        keys,
        protect_native: raw.protect_native,
    })
}
