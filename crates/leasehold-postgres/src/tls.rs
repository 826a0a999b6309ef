//! TLS over rustls (ring provider): `sslmode=prefer|require|verify-ca|verify-full`,
//! `sslrootcert`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use leasehold_core::{Error, ErrorKind};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::NAME;

/// What `sslmode` asks for, after leasehold's reading of it (see [`PostgresConfig`]).
///
/// [`PostgresConfig`]: crate::PostgresConfig
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsMode {
    /// No TLS (`disable`, `allow`).
    Off,
    /// TLS first, the certificate not checked; plaintext if the server refuses TLS or the
    /// handshake fails, as libpq does (`prefer`, the default).
    Prefer,
    /// Encrypted, the certificate not checked at all (`require` without `sslrootcert`).
    Require,
    /// Encrypted, the certificate chains to a trusted root; its name is not checked.
    VerifyCa,
    /// Encrypted, the certificate chains to a trusted root and names the host.
    VerifyFull,
}

impl TlsMode {
    pub(crate) fn parse(value: &str) -> Result<Self, Error> {
        match value {
            "disable" | "allow" => Ok(Self::Off),
            "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            _ => Err(invalid(
                "sslmode must be disable, allow, prefer, require, verify-ca or verify-full",
            )),
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Off => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

/// Where the trusted roots come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Roots {
    /// The operating system's store (rustls-native-certs): no `sslrootcert`, or
    /// `sslrootcert=system`.
    System,
    /// A PEM file of CA certificates.
    File(PathBuf),
}

/// A built TLS connector, shared by every session of a backend.
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) mode: TlsMode,
    pub(crate) connector: MakeRustlsConnect,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").field("mode", &self.mode).finish()
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidConfig, NAME, msg)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the connector for `mode` (`None` for [`TlsMode::Off`]). Reads the root file now, so
/// a missing or empty file is an `InvalidConfig` error at configuration time.
pub(crate) fn build(mode: TlsMode, roots: &Roots) -> Result<Option<Tls>, Error> {
    let provider = provider();
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        TlsMode::Off => return Ok(None),
        TlsMode::Prefer | TlsMode::Require => Arc::new(Lenient {
            chain: None,
            algorithms,
        }),
        TlsMode::VerifyCa | TlsMode::VerifyFull => {
            let store = load_roots(roots)?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(store), Arc::clone(&provider))
                    .build()
                    .map_err(|e| invalid(format!("building the TLS verifier: {e}")))?;
            if mode == TlsMode::VerifyCa {
                Arc::new(Lenient {
                    chain: Some(webpki),
                    algorithms,
                })
            } else {
                webpki
            }
        }
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS configuration: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(Tls {
        mode,
        connector: MakeRustlsConnect::new(config),
    }))
}

fn load_roots(roots: &Roots) -> Result<RootCertStore, Error> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            let certs = read_pem_certs(path)?;
            let (added, _ignored) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(invalid(format!(
                    "sslrootcert {}: no usable CA certificate in it",
                    path.display()
                )));
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _ignored) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(invalid(
                    "sslmode=verify-ca/verify-full without sslrootcert: the system has no \
                     usable root certificates; give sslrootcert=<CA file>",
                ));
            }
        }
    }
    Ok(store)
}

fn read_pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let iter = CertificateDer::pem_file_iter(path).map_err(|e| {
        invalid(format!(
            "sslrootcert {}: cannot read it: {e}",
            path.display()
        ))
    })?;
    iter.collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("sslrootcert {}: not PEM: {e}", path.display())))
}

/// The two modes that verify less than webpki does: `verify-ca` (`chain` given: the chain
/// must verify, a certificate for another name is accepted) and `require` (no `chain`: any
/// certificate is accepted, encryption against passive eavesdroppers only). Either way the
/// handshake signatures are checked against the presented certificate.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // webpki checks the chain (and validity dates, usage) before the name, so a name
        // error means the chain itself verified.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
