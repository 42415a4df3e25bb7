//! Where the pipe connects and how: TCP, TLS over it (rustls, the system's roots or none),
//! or a Unix socket; the target follows a Sentinel's failover.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use super::PipeError;

/// Where and as whom to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub(super) addr: Addr,
    pub(super) db: i64,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
}

impl Target {
    /// The address of a `redis://`, `rediss://` or `redis+unix://` URL's connection info;
    /// `None` for TLS with client certificates or roots of its own (only redis-rs' API sets
    /// them, never a URL).
    pub fn of(info: &redis::ConnectionInfo) -> Option<Self> {
        let addr = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => Addr::Tcp(host.clone(), *port),
            redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                tls_params: None,
            } => Addr::Tls(host.clone(), *port, *insecure),
            redis::ConnectionAddr::Unix(path) => Addr::Unix(path.clone()),
            _ => return None,
        };
        let settings = info.redis_settings();
        Some(Self {
            addr,
            db: settings.db(),
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
        })
    }
}

/// Where a pipe connects, replaceable: a Sentinel failover promotes another node.
///
/// A pipe connected to an earlier target drops that connection (failing its calls in
/// flight) and connects to the current one.
#[derive(Debug)]
pub struct TargetCell {
    current: arc_swap::ArcSwap<Target>,
    generation: std::sync::atomic::AtomicU64,
}

impl TargetCell {
    /// A cell holding `target`.
    pub fn new(target: Target) -> Arc<Self> {
        Arc::new(Self {
            current: arc_swap::ArcSwap::from_pointee(target),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The target to connect to now.
    pub fn get(&self) -> Arc<Target> {
        self.current.load_full()
    }

    /// Replaces the target; pipes reconnect.
    pub fn set(&self, target: Target) {
        self.current.store(Arc::new(target));
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Addr {
    Tcp(String, u16),
    /// Host, port, and whether to skip checking the server's certificate (`#insecure`).
    Tls(String, u16, bool),
    Unix(std::path::PathBuf),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(host, port) | Addr::Tls(host, port, _) => write!(f, "{host}:{port}"),
            Addr::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

/// The connection's socket: TCP (with `TCP_NODELAY`), TLS over it, or a Unix socket.
pub(super) trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

pub(super) async fn connect(addr: &Addr) -> Result<Box<dyn Socket>, PipeError> {
    Ok(match addr {
        Addr::Tcp(host, port) => {
            let stream = TcpStream::connect((host.as_str(), *port)).await?;
            stream.set_nodelay(true)?;
            Box::new(stream)
        }
        Addr::Tls(host, port, insecure) => {
            let stream = TcpStream::connect((host.as_str(), *port)).await?;
            stream.set_nodelay(true)?;
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|error| PipeError::new(format!("{host}: {error}")))?;
            let connector = tokio_rustls::TlsConnector::from(tls_config(*insecure)?);
            Box::new(connector.connect(name, stream).await?)
        }
        Addr::Unix(path) => Box::new(UnixStream::connect(path).await?),
    })
}

/// TLS as redis-rs speaks it for the same URL: the system's roots, or no check of the
/// server's certificate with `#insecure`.
fn tls_config(insecure: bool) -> Result<Arc<rustls::ClientConfig>, PipeError> {
    let builder = rustls::ClientConfig::builder();
    let mut config = if insecure {
        let provider = rustls::crypto::CryptoProvider::get_default()
            .ok_or_else(|| PipeError::new("no crypto provider for rustls"))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(
                provider.signature_verification_algorithms,
            )))
            .with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore::empty();
        let mut found = rustls_native_certs::load_native_certs();
        if let Some(error) = found.errors.pop() {
            return Err(PipeError::new(format!("the system's roots: {error}")));
        }
        for certificate in found.certs {
            roots
                .add(certificate)
                .map_err(|error| PipeError::new(format!("the system's roots: {error}")))?;
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.enable_sni = !insecure;
    Ok(Arc::new(config))
}

/// `#insecure`: any certificate, any signature (what redis-rs accepts for the same URL).
#[derive(Debug)]
struct AnyCertificate(rustls::crypto::WebPkiSupportedAlgorithms);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &rustls::pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &rustls::pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}
