//! TLS for `lethe serve` (`[serve] tls = { cert_file, key_file }`): rustls with the ring
//! provider (the one `ureq` already brings), TLS 1.2 and 1.3, HTTP/1.1 by ALPN, no client
//! certificates. The handshake runs in the connection's own task, bounded by the idle timeout
//! like a request's headers, so a client that never finishes it costs an unproven slot only.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A server's TLS settings, as [`crate::Server`] takes them.
pub type TlsConfig = Arc<rustls::ServerConfig>;

/// Reads a PEM certificate chain (the server's first, then its intermediates) and its PEM
/// private key (PKCS#8, PKCS#1 or SEC1) into a server configuration. The message names the
/// file at fault and never quotes it.
pub fn tls_config(cert_file: &Path, key_file: &Path) -> Result<TlsConfig, String> {
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("serve.tls cert_file {}: {e}", cert_file.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "serve.tls cert_file {}: no PEM certificate in it",
            cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| {
        format!(
            "serve.tls key_file {}: no PEM private key in it ({e})",
            key_file.display()
        )
    })?;
    // ring, as `ureq` (the clients) uses: aws-lc-rs, whose provider offers post-quantum key
    // exchange (hence ring's deprecation in rustls 0.23.48), builds a C library of its own.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("serve.tls: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "serve.tls: the certificate and the key do not go together, or one is not \
                 usable ({e})"
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
