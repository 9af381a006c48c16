//! Who may call: the keys limiterd accepts, held only as SHA-256 digests, each with its
//! permissions, checked against a request's `Authorization: Bearer <key>` in constant time
//! (every held digest is compared, whatever matched, and each comparison reads every byte).
//!
//! For a quick start and for tests, `LIMITERD_ROOT_KEY` gives one key with every permission;
//! its plain text is hashed as it is read and never kept.

use sha2::{Digest, Sha256};

/// The environment variable whose value is a key with every permission.
pub const ROOT_KEY_VAR: &str = "LIMITERD_ROOT_KEY";

/// What a key may do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Permissions {
    /// Ask for decisions.
    pub decide: bool,
    /// Read overrides.
    pub read_overrides: bool,
    /// Set and delete overrides.
    pub write_overrides: bool,
}

impl Permissions {
    /// Every permission.
    pub const ALL: Self = Self {
        decide: true,
        read_overrides: true,
        write_overrides: true,
    };
}

/// One accepted key: a name for logs, its digest, its permissions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    /// The key's name (never the key).
    pub name: String,
    digest: [u8; 32],
    /// What it may do.
    pub permissions: Permissions,
}

impl Key {
    /// A key given by its SHA-256 digest.
    pub fn from_digest(
        name: impl Into<String>,
        digest: [u8; 32],
        permissions: Permissions,
    ) -> Self {
        Self {
            name: name.into(),
            digest,
            permissions,
        }
    }
}

/// Why a request's key was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// No `Authorization: Bearer` header (or not a bearer one).
    Missing,
    /// A key no one was given.
    Unknown,
}

/// The keys limiterd accepts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keys {
    keys: Vec<Key>,
}

impl Keys {
    /// `keys`, and the root key from [`ROOT_KEY_VAR`] read through `var` if it is set.
    pub fn new(mut keys: Vec<Key>, var: impl Fn(&str) -> Option<String>) -> Self {
        if let Some(plain) = var(ROOT_KEY_VAR).filter(|k| !k.is_empty()) {
            keys.push(Key::from_digest("root", digest(&plain), Permissions::ALL));
        }
        Self { keys }
    }

    /// Whether any key is accepted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key an `Authorization` header value carries, if limiterd accepts it.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<&Key, Refused> {
        let presented = authorization
            .and_then(|value| std::str::from_utf8(value).ok())
            .and_then(bearer)
            .ok_or(Refused::Missing)?;
        let presented = digest(presented);
        let mut found = None;
        for key in &self.keys {
            if same(&key.digest, &presented) && found.is_none() {
                found = Some(key);
            }
        }
        found.ok_or(Refused::Unknown)
    }
}

/// The key in `Bearer <key>` (the scheme in any case, as HTTP's auth schemes are).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, key) = value.trim().split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}

/// The SHA-256 digest of a key's text.
pub fn digest(plain: &str) -> [u8; 32] {
    Sha256::digest(plain.as_bytes()).into()
}

/// `a == b`, reading every byte whatever differs.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A digest written as 64 hex digits, or `None`.
pub fn parse_hex_digest(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        let reader = Key::from_digest(
            "reader",
            digest("r3ad"),
            Permissions {
                read_overrides: true,
                ..Permissions::default()
            },
        );
        Keys::new(vec![reader], |name| {
            (name == ROOT_KEY_VAR).then(|| "s3cret".to_owned())
        })
    }

    #[test]
    fn a_bearer_key_is_found_by_its_digest_with_its_permissions() {
        let keys = keys();
        let root = keys.check(Some(b"Bearer s3cret")).expect("the root key");
        assert_eq!(
            (root.name.as_str(), root.permissions),
            ("root", Permissions::ALL)
        );
        let reader = keys
            .check(Some(b"bearer  r3ad "))
            .expect("any case, spaces trimmed");
        assert!(reader.permissions.read_overrides && !reader.permissions.decide);
    }

    #[test]
    fn missing_malformed_and_unknown_keys_are_refused() {
        let keys = keys();
        for header in [
            None,
            Some(&b""[..]),
            Some(b"s3cret"),
            Some(b"Basic s3cret"),
            Some(b"Bearer "),
        ] {
            assert_eq!(keys.check(header), Err(Refused::Missing), "{header:?}");
        }
        for header in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret2",
            b"Bearer S3CRET",
            b"Bearer \xff",
        ] {
            let refused = keys.check(Some(header));
            assert!(refused.is_err(), "{header:?}");
        }
        assert!(
            Keys::new(Vec::new(), |_| None)
                .check(Some(b"Bearer s3cret"))
                .is_err()
        );
        assert!(Keys::new(Vec::new(), |_| Some(String::new())).is_empty());
    }

    #[test]
    fn digests_are_written_as_hex() {
        let hex: String = digest("s3cret")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(parse_hex_digest(&hex), Some(digest("s3cret")));
        assert_eq!(parse_hex_digest(&hex[1..]), None);
        assert_eq!(
            parse_hex_digest(&hex.replace('a', "g")),
            if hex.contains('a') {
                None
            } else {
                Some(digest("s3cret"))
            }
        );
    }
}
