//! TLS to Redis (feature `tls`), on rustls with the ring provider: [`TlsOptions`] says which
//! certificate authorities to trust (the system's roots by default, or a CA file), which
//! client certificate to show (mutual TLS) and which name the server's certificate must
//! hold; [`handshake`] opens a session and names what went wrong in the operator's terms (an
//! untrusted CA, a name the certificate does not hold, a refused client certificate, a
//! plaintext port). Settings read from files are read again at every new connection, so a
//! certificate renewed in place applies at the next one. A `rediss://` connection is TLS or
//! nothing: there is no fallback.

use core::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::secret::Secret;
use super::url::NodeAddr;
use super::verify::NotingVerifier;
use crate::error::BackendError;

/// How to speak TLS to Redis: whom to trust, which certificate to show, which name to check.
///
/// ```
/// use limiter_redis::{Secret, TlsOptions};
///
/// // The system's roots, checking the certificate against the URL's host: `TlsOptions::new()`.
/// // A private CA, mutual TLS, and the name the server's certificate holds:
/// let tls = TlsOptions::new()
///     .ca_pem(b"-----BEGIN CERTIFICATE-----\n...".to_vec())
///     .client_identity(b"-----BEGIN CERTIFICATE-----\n...".to_vec(), Secret::new("-----BEGIN PRIVATE KEY-----\n..."))
///     .server_name("redis.internal");
/// # let _ = tls;
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    ca_pem: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Secret)>,
    server_name: Option<String>,
    /// Where the PEM came from when it came from files: read again at every new connection,
    /// so a rotated certificate (a renewed Kubernetes secret, say) applies at the next one.
    files: PemFiles,
}

/// The files a [`TlsOptions`] read its PEM from.
#[derive(Clone, Default, PartialEq, Eq)]
struct PemFiles {
    ca: Option<PathBuf>,
    identity: Option<(PathBuf, PathBuf)>,
}

/// TLS settings that cannot be used. Never prints a key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file cannot be read. Fix: point at a readable PEM file.
    #[error("cannot read the TLS {what} {}: {reason}", path.display())]
    File {
        /// "CA file", "certificate file" or "key file".
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// PEM text holding no usable certificate or key. Fix: give PEM (`-----BEGIN ...`).
    #[error("the TLS {what}{} holds no usable PEM {expected}: {reason}", shown(path.as_deref()))]
    Pem {
        /// Which setting.
        what: &'static str,
        /// The file it was read from (`None`: given as bytes).
        path: Option<PathBuf>,
        /// What it should hold.
        expected: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// No CA given and the system has no root certificates. Fix: give a CA file.
    #[error(
        "no CA file was given and the system has no root certificates to trust; give the CA that signed Redis's certificate (`ca_file`)"
    )]
    NoRoots,
    /// The name to check is not a DNS name or an IP address.
    #[error("`{name}` is not a DNS name or an IP address to check Redis's certificate against")]
    ServerName {
        /// The name given.
        name: String,
    },
    /// rustls refused the settings (a key that does not match its certificate, say).
    #[error("the TLS settings were refused: {0}")]
    Refused(String),
}

impl TlsOptions {
    /// TLS trusting the system's root certificates, checking the certificate against the
    /// host Redis is reached at.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the certificate authorities in `pem` (PEM, one or more certificates) instead of
    /// the system's roots.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self.files.ca = None;
        self
    }

    /// Trusts the certificate authorities in the PEM file at `path`, read now and again at
    /// every new connection (a rotated CA applies at the next one).
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self, TlsError> {
        let mut options = self.ca_pem(read(path.as_ref(), "CA file")?);
        options.files.ca = Some(path.as_ref().to_owned());
        Ok(options)
    }

    /// Shows this certificate chain and private key (both PEM) to servers that ask for one
    /// (mutual TLS, `tls-auth-clients yes`).
    pub fn client_identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: Secret) -> Self {
        self.client = Some((cert_pem.into(), key_pem));
        self.files.identity = None;
        self
    }

    /// [`client_identity`](Self::client_identity) from PEM files, read now and again at every
    /// new connection (a renewed certificate applies at the next one).
    pub fn client_identity_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, TlsError> {
        let (cert, key) = (cert.as_ref(), key.as_ref());
        let (cert_pem, key_pem) = read_identity(cert, key)?;
        let mut options = self.client_identity(cert_pem, key_pem);
        options.files.identity = Some((cert.to_owned(), key.to_owned()));
        Ok(options)
    }

    /// These settings with their files read again: `None` when none came from a file or
    /// every file holds what it held.
    fn reread(&self) -> Result<Option<Self>, TlsError> {
        let mut fresh = self.clone();
        if let Some(ca) = &self.files.ca {
            fresh.ca_pem = Some(read(ca, "CA file")?);
        }
        if let Some((cert, key)) = &self.files.identity {
            fresh.client = Some(read_identity(cert, key)?);
        }
        Ok((fresh != *self).then_some(fresh))
    }

    /// Checks the server's certificate against `name` (a DNS name or an IP address) instead
    /// of the host it is reached at; also sent as the TLS server name (SNI).
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// The name certificates are checked against, if set.
    pub fn checked_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }

    /// Checks that the settings can be used (the PEM parses, the key matches, the name is a
    /// name), without connecting.
    pub fn check(&self) -> Result<(), TlsError> {
        self.build().map(drop)
    }

    /// Builds the rustls configuration for every connection (rebuilt when its files change).
    pub(crate) fn build(&self) -> Result<TlsSetup, TlsError> {
        Ok(TlsSetup {
            built: Arc::new(Mutex::new(Built {
                configured: self.configured()?,
                refusal: None,
            })),
        })
    }

    /// The rustls configuration of these settings.
    fn configured(&self) -> Result<Configured, TlsError> {
        let roots = self.roots()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            Arc::new(NotingVerifier::new(roots, Arc::clone(&provider)).map_err(TlsError::Refused)?);
        // rustls's own certificate check, which notes why it refused (`verify.rs`); nothing
        // is checked less than `with_root_certificates` would.
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Refused(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::clone(&verifier) as _);
        let config = match &self.client {
            None => builder.with_no_client_auth(),
            Some((cert_pem, key_pem)) => {
                let chain = CertificateDer::pem_slice_iter(cert_pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| pem_error(self.file("certificate file"), "certificate", e))?;
                if chain.is_empty() {
                    return Err(pem_error(
                        self.file("certificate file"),
                        "certificate",
                        "none found",
                    ));
                }
                let key = PrivateKeyDer::from_pem_slice(key_pem.expose().as_bytes())
                    .map_err(|e| pem_error(self.file("key file"), "private key", e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| TlsError::Refused(e.to_string()))?
            }
        };
        let server_name = match &self.server_name {
            None => None,
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|_| TlsError::ServerName { name: name.clone() })?,
            ),
        };
        Ok(Configured {
            options: self.clone(),
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
            verifier,
        })
    }

    /// The setting `what` ("CA file", "certificate file" or "key file") and the file it was
    /// read from, if it was.
    fn file(&self, what: &'static str) -> (&'static str, Option<PathBuf>) {
        let identity = self.files.identity.as_ref();
        let path = match what {
            "CA file" => self.files.ca.clone(),
            "certificate file" => identity.map(|(cert, _)| cert.clone()),
            _ => identity.map(|(_, key)| key.clone()),
        };
        (what, path)
    }

    fn roots(&self) -> Result<rustls::RootCertStore, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca_pem {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert =
                        cert.map_err(|e| pem_error(self.file("CA file"), "certificate", e))?;
                    roots
                        .add(cert)
                        .map_err(|e| pem_error(self.file("CA file"), "certificate", e))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
            }
        }
        if roots.is_empty() {
            return Err(match self.ca_pem {
                Some(_) => pem_error(self.file("CA file"), "certificate", "none found"),
                None => TlsError::NoRoots,
            });
        }
        Ok(roots)
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        what,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// A client certificate chain and its key, from their files.
fn read_identity(cert: &Path, key: &Path) -> Result<(Vec<u8>, Secret), TlsError> {
    let cert_pem = read(cert, "certificate file")?;
    let key_text = String::from_utf8(read(key, "key file")?).map_err(|_| TlsError::Pem {
        what: "key file",
        path: Some(key.to_owned()),
        expected: "private key",
        reason: "it is not text".to_owned(),
    })?;
    Ok((cert_pem, Secret::new(key_text)))
}

/// ` /path/to/file` for a setting read from a file, nothing for one given as bytes.
fn shown(path: Option<&Path>) -> String {
    path.map_or_else(String::new, |p| format!(" {}", p.display()))
}

/// A setting's PEM refused: `what` it is and the file it came from (`None`: given as bytes).
fn pem_error(
    (what, path): (&'static str, Option<PathBuf>),
    expected: &'static str,
    reason: impl fmt::Display,
) -> TlsError {
    TlsError::Pem {
        what,
        path,
        expected,
        reason: reason.to_string(),
    }
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field(
                "roots",
                &if self.ca_pem.is_some() {
                    "CA given"
                } else {
                    "system"
                },
            )
            .field("client_identity", &self.client.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// TLS ready to connect: the configuration of the settings as last read, shared by every
/// connection (and every clone), rebuilt when a file it came from changes.
#[derive(Clone)]
pub(crate) struct TlsSetup {
    built: Arc<Mutex<Built>>,
}

/// The configuration in use, and why the files as they stand now were refused (if they were):
/// a refusal is warned once, not at every new connection while the files stay unusable (a
/// reconnecting client makes one a second).
struct Built {
    configured: Configured,
    refusal: Option<String>,
}

/// One reading of the settings, configured: the connector, the name to check if not the
/// host's, and the certificate check that notes its refusals.
#[derive(Clone)]
struct Configured {
    options: TlsOptions,
    connector: TlsConnector,
    server_name: Option<ServerName<'static>>,
    verifier: Arc<NotingVerifier>,
}

impl fmt::Debug for TlsSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSetup")
            .field("options", &self.now().options)
            .finish_non_exhaustive()
    }
}

impl TlsSetup {
    /// The configuration as built last.
    fn now(&self) -> Configured {
        // A poisoned configuration is still whole: it is replaced, never changed in place.
        self.built
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .configured
            .clone()
    }

    /// The configuration for a new connection: the settings' files read again, and the
    /// configuration rebuilt if they changed. A file that cannot be read or used now (a
    /// rotation half done) keeps the last configuration, with a warning naming it: one for
    /// each new reason, a debug event for the same reason again.
    fn for_new_connection(&self) -> Configured {
        let mut built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        match built
            .configured
            .options
            .reread()
            .and_then(|fresh| fresh.map(|f| f.configured()).transpose())
        {
            Ok(Some(fresh)) => {
                tracing::info!("the TLS files changed: new connections use them");
                *built = Built {
                    configured: fresh,
                    refusal: None,
                };
            }
            // The files are those in use again (a rotation put back): a refusal after this
            // is news.
            Ok(None) => built.refusal = None,
            Err(error) => {
                let reason = error.to_string();
                if built.refusal.as_deref() == Some(reason.as_str()) {
                    tracing::debug!(%error, "the TLS files still cannot be used");
                } else {
                    tracing::warn!(
                        %error,
                        "the TLS files changed but cannot be used; new connections keep the last ones \
                         (warned again only for another reason)"
                    );
                    built.refusal = Some(reason);
                }
            }
        }
        built.configured.clone()
    }
}

/// Opens a TLS session over `tcp` to `addr`, checking the certificate against the configured
/// name or else `addr`'s host.
pub(crate) async fn handshake(
    setup: &TlsSetup,
    addr: &NodeAddr,
    tcp: TcpStream,
) -> Result<TlsStream<TcpStream>, BackendError> {
    let setup = setup.for_new_connection();
    let name = match &setup.server_name {
        Some(name) => name.clone(),
        None => ServerName::try_from(addr.host().to_owned()).map_err(|_| {
            BackendError::Tls(format!(
                "{addr}: `{}` is not a name a certificate can be checked against; set the TLS server name",
                addr.host()
            ))
        })?,
    };
    let shown = name.to_str().into_owned();
    setup.connector.connect(name, tcp).await.map_err(|e| {
        let refusal = setup.verifier.take_refusal(&shown);
        BackendError::Tls(explain(addr, &shown, &e, refusal))
    })
}

/// What a failed handshake means, in the operator's terms: the certificate check's own reason
/// when it refused the server's certificate (`refusal`), else what the session's failure says
/// with the two usual causes named (a plaintext port; mutual TLS without a client certificate
/// the server trusts).
fn explain(
    addr: &NodeAddr,
    name: &str,
    error: &std::io::Error,
    refusal: Option<rustls::CertificateError>,
) -> String {
    use rustls::CertificateError as C;
    let Some(refusal) = refusal else {
        return format!(
            "{addr}: the TLS handshake failed ({error}); is this Redis's tls-port (rediss:// needs it)? With mutual TLS, give a client certificate and key signed by a CA the server trusts"
        );
    };
    let why = match refusal {
        C::UnknownIssuer | C::BadSignature => {
            "the server's certificate is not signed by a CA this client trusts; give the CA that signed it (`ca_file`)".to_owned()
        }
        C::NotValidForName | C::NotValidForNameContext { .. } => format!(
            "the server's certificate is not valid for the name `{name}`; connect by a name it holds or set the TLS server name to one"
        ),
        C::Expired | C::ExpiredContext { .. } => "the server's certificate has expired".to_owned(),
        other => format!("the server's certificate was refused ({other:?})"),
    };
    format!("{addr}: {why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_named_and_never_print_a_key() {
        let key =
            Secret::new("-----BEGIN PRIVATE KEY-----\nTOPSECRETKEY\n-----END PRIVATE KEY-----\n");
        let options = TlsOptions::new()
            .ca_pem(b"not pem".to_vec())
            .client_identity(b"not pem".to_vec(), key);
        assert!(!format!("{options:?}").contains("TOPSECRETKEY"));
        let error = options.build().unwrap_err().to_string();
        assert!(error.contains("CA file"), "{error}");
        let missing = TlsOptions::new()
            .ca_file("/surely/not/here.pem")
            .unwrap_err();
        assert!(
            missing.to_string().contains("/surely/not/here.pem"),
            "{missing}"
        );
        let name = TlsOptions::new().server_name("not a name!").build();
        assert!(
            matches!(
                name,
                Err(TlsError::ServerName { .. }) | Err(TlsError::NoRoots)
            ),
            "{name:?}"
        );
    }

    /// A rotation left half done (or a file gone) is warned once for each reason, not at each
    /// new connection while it lasts, and warned again once the files were usable in between.
    #[test]
    fn unusable_files_are_warned_once_for_each_reason() {
        let certs = limiter_testkit::redis_server::tls::TestCerts::fresh("tls-warned-once");
        let dir = std::env::temp_dir().join(format!("limiter-tls-warned-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::copy(&certs.ca, &ca).unwrap();
        let setup = TlsOptions::new().ca_file(&ca).unwrap().build().unwrap();
        let (_capture, logs) = limiter_testkit::logs::capture();
        let connections = |n| (0..n).for_each(|_| drop(setup.for_new_connection()));
        let warned = || logs.count("cannot be used");

        std::fs::write(&ca, "not pem").unwrap();
        connections(5);
        assert_eq!(warned(), 1, "{}", logs.text());
        std::fs::remove_file(&ca).unwrap(); // another reason: warned
        connections(5);
        assert_eq!(warned(), 2, "{}", logs.text());
        assert_eq!(
            logs.count("ca.pem"),
            2,
            "each names the file: {}",
            logs.text()
        );
        std::fs::copy(&certs.ca, &ca).unwrap(); // the files in use, back
        connections(1);
        std::fs::write(&ca, "not pem").unwrap(); // broken again: news
        connections(3);
        assert_eq!(warned(), 3, "{}", logs.text());
        assert_eq!(logs.count("new connections use them"), 0, "{}", logs.text());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
