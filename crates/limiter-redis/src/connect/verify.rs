//! The server-certificate check of a TLS connection to Redis: rustls's own (webpki, against the
//! configured roots), which also notes why it refused a name's certificate. A failed handshake
//! reaches the caller as an `io::Error` (tokio-rustls wraps rustls's error in one); the note is
//! how [`handshake`](super::tls::handshake) names the reason in the operator's terms (an
//! untrusted CA, a name the certificate does not hold, an expired certificate) from the typed
//! error, never by reading it back out of the `io::Error`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{
    CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme,
};

/// rustls's webpki check of the server's certificate, noting the last refusal per name.
#[derive(Debug)]
pub(crate) struct NotingVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    /// Per server name, why its certificate was last refused (removed once one passes). At
    /// most one entry per name the backend connects to.
    refused: Mutex<HashMap<String, CertificateError>>,
}

impl NotingVerifier {
    /// The check against `roots`, with `provider`'s signature algorithms.
    pub(crate) fn new(roots: RootCertStore, provider: Arc<CryptoProvider>) -> Result<Self, String> {
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            webpki,
            refused: Mutex::new(HashMap::new()),
        })
    }

    /// Why the certificate of `name` was last refused, if it was (and not accepted since);
    /// taken, so a later failure of another kind is not explained by it.
    pub(crate) fn take_refusal(&self, name: &str) -> Option<CertificateError> {
        self.notes().remove(name)
    }

    fn notes(&self) -> std::sync::MutexGuard<'_, HashMap<String, CertificateError>> {
        // A poisoned note is still a note: each entry is written whole.
        self.refused.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ServerCertVerifier for NotingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let checked = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        let name = server_name.to_str().into_owned();
        match &checked {
            Err(Error::InvalidCertificate(why)) => {
                self.notes().insert(name, why.clone());
            }
            _ => {
                self.notes().remove(&name);
            }
        }
        checked
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
