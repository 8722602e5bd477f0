//! HTTPS for the server when [`crate::Config::tls`] is set: a self-signed certificate for
//! 127.0.0.1 and `localhost`, made at start, that kubeconfigs carry as their CA. kubectl
//! (client-go) sends bearer tokens only over TLS (kubernetes/kubectl#744), so identities and
//! RBAC are testable with kubectl only this way.

use std::sync::Arc;

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::Error;

/// The server's certificate (PEM, also the kubeconfigs' CA) and its acceptor.
pub(crate) struct Tls {
    pub cert_pem: String,
    pub acceptor: TlsAcceptor,
}

impl Tls {
    pub fn self_signed() -> Result<Tls, Error> {
        let tls_err = |e: &dyn std::fmt::Display| Error::Tls(e.to_string());
        let names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        let cert = rcgen::generate_simple_self_signed(names).map_err(|e| tls_err(&e))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err(&e))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .map_err(|e| tls_err(&e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            cert_pem: cert.cert.pem(),
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }
}
