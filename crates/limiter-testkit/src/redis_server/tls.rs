//! Certificates for TLS tests (feature `tls-certs`), made per test with rcgen: a CA, a server
//! certificate for `localhost`, `redis.test` and `127.0.0.1`, a client certificate (mutual
//! TLS), and a second, unrelated CA that trusts none of them; written as PEM files. And
//! redis-server processes with a TLS port on them.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::{RedisServer, free_port};

/// The names the server certificate holds.
pub const SERVER_NAMES: [&str; 2] = ["localhost", "redis.test"];

/// PEM files of a test PKI, in a directory of their own.
#[derive(Debug, Clone)]
pub struct TestCerts {
    /// The CA that signed the server's and the client's certificates.
    pub ca: PathBuf,
    /// The server's certificate and key.
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// The client's certificate (mutual TLS).
    pub client_cert: PathBuf,
    /// The client's key.
    pub client_key: PathBuf,
    /// A CA that signed nothing here.
    pub other_ca: PathBuf,
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().expect("a CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).expect("a self-signed CA");
    (params, key, cert.pem())
}

impl TestCerts {
    /// Generates the PKI into `dir`.
    pub fn generate(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("a directory for certificates");
        let (ca_params, ca_key, ca_pem) = ca("limiter test CA");
        let (_, _, other_pem) = ca("an unrelated CA");
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate().expect("a server key");
        let mut server = CertificateParams::new(
            SERVER_NAMES
                .iter()
                .map(|n| (*n).to_owned())
                .collect::<Vec<_>>(),
        )
        .expect("server params");
        server
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().expect("an address")));
        server
            .distinguished_name
            .push(DnType::CommonName, "redis.test");
        server.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let server_pem = server
            .signed_by(&server_key, &issuer)
            .expect("signed")
            .pem();

        let client_key = KeyPair::generate().expect("a client key");
        let mut client = CertificateParams::new(Vec::<String>::new()).expect("client params");
        client
            .distinguished_name
            .push(DnType::CommonName, "limiter");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_pem = client
            .signed_by(&client_key, &issuer)
            .expect("signed")
            .pem();

        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write a PEM file");
            path
        };
        Self {
            ca: write("ca.pem", &ca_pem),
            server_cert: write("server.pem", &server_pem),
            server_key: write("server.key", &server_key.serialize_pem()),
            client_cert: write("client.pem", &client_pem),
            client_key: write("client.key", &client_key.serialize_pem()),
            other_ca: write("other-ca.pem", &other_pem),
        }
    }

    /// A fresh PKI in a temporary directory named by `name`.
    pub fn fresh(name: &str) -> Self {
        Self::generate(
            &std::env::temp_dir().join(format!("limiter-certs-{}-{name}", std::process::id())),
        )
    }

    /// redis-server's TLS arguments for these files; clients must show a certificate when
    /// `clients_need_certificates`.
    pub fn server_args(&self, clients_need_certificates: bool) -> Vec<String> {
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        vec![
            "--tls-cert-file".into(),
            path(&self.server_cert),
            "--tls-key-file".into(),
            path(&self.server_key),
            "--tls-ca-cert-file".into(),
            path(&self.ca),
            "--tls-auth-clients".into(),
            if clients_need_certificates {
                "yes"
            } else {
                "no"
            }
            .into(),
        ]
    }
}

impl RedisServer {
    /// A fresh server with a TLS port on `certs` (and its plaintext port, which only the
    /// test uses to set up and inspect it), with `extra` arguments after.
    pub fn start_tls(
        certs: &TestCerts,
        clients_need_certificates: bool,
        extra: Vec<String>,
    ) -> Self {
        let mut args = certs.server_args(clients_need_certificates);
        args.extend(extra);
        Self::start_on(free_port(), Some(free_port()), args)
    }
}
