//! [`Secret`]: a password (or a private key) that is never printed. Its `Debug` and `Display`
//! write `<redacted>`, so a secret inside any struct, error or panic message stays out of
//! logs, debug views and check output; only [`Secret::expose`] reads it, where it is sent.

use core::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a redacted secret prints as.
pub const REDACTED: &str = "<redacted>";

/// A secret string: `Debug` and `Display` print [`REDACTED`]. Cheap to clone.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(Arc::from(value.into()))
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The secret held in the file at `path` (a mounted Kubernetes secret, say): its text,
    /// without a final line break. The error names the file, never its contents.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, SecretError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| SecretError::File {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let value = text.strip_suffix('\n').unwrap_or(&text);
        let value = value.strip_suffix('\r').unwrap_or(value);
        if value.is_empty() {
            return Err(SecretError::File {
                path: path.to_owned(),
                reason: "it is empty".to_owned(),
            });
        }
        Ok(Self::new(value))
    }

    /// The secret held in the environment variable `name`. The error names the variable,
    /// never its value.
    pub fn from_env(name: &str) -> Result<Self, SecretError> {
        match std::env::var(name) {
            Ok(value) if !value.is_empty() => Ok(Self::new(value)),
            Ok(_) => Err(SecretError::Env {
                name: name.to_owned(),
                reason: "it is empty",
            }),
            Err(std::env::VarError::NotPresent) => Err(SecretError::Env {
                name: name.to_owned(),
                reason: "it is not set",
            }),
            Err(std::env::VarError::NotUnicode(_)) => Err(SecretError::Env {
                name: name.to_owned(),
                reason: "it is not UTF-8",
            }),
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self::new(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

/// A secret that could not be read. Names where it was looked for, never a value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The file cannot be read, or is empty. Fix: point at the file holding the secret.
    #[error("cannot read the secret in {}: {reason}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The environment variable is not set, empty or not UTF-8. Fix: set it for the process.
    #[error("cannot read the secret in the environment variable `{name}`: {reason}")]
    Env {
        /// The variable.
        name: String,
        /// Why.
        reason: &'static str,
    },
}

/// Where a password comes from: given, or read from a file at each connection, so a
/// rotated secret (a Kubernetes secret's file is replaced in place) applies at the next one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Password {
    Given(Secret),
    File(PathBuf),
}

impl Password {
    /// The password now.
    pub(crate) fn read(&self) -> Result<Secret, SecretError> {
        match self {
            Self::Given(secret) => Ok(secret.clone()),
            Self::File(path) => Secret::from_file(path),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret}"), REDACTED);
        assert_eq!(format!("{secret:?}"), REDACTED);
        assert_eq!(format!("{:?}", Some(&secret)), format!("Some({REDACTED})"));
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn a_file_is_read_without_its_line_break_and_errors_name_the_file() {
        let dir = std::env::temp_dir().join(format!("limiter-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "s3cret\r\n").unwrap();
        assert_eq!(Secret::from_file(&file).unwrap().expose(), "s3cret");
        std::fs::write(&file, "\n").unwrap();
        let empty = Secret::from_file(&file).unwrap_err().to_string();
        assert!(
            empty.contains("password") && empty.contains("empty"),
            "{empty}"
        );
        let missing = Secret::from_file(dir.join("absent"))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("absent"), "{missing}");
        let env = Secret::from_env("LIMITER_TEST_SURELY_UNSET_VARIABLE")
            .unwrap_err()
            .to_string();
        assert!(env.contains("LIMITER_TEST_SURELY_UNSET_VARIABLE") && env.contains("not set"));
    }
}
