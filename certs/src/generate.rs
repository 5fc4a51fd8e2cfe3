//! CA and serving-certificate generation (rcgen) and certificate inspection (x509-parser).

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::CertError;

/// A PEM certificate with its PEM (PKCS#8) private key.
#[derive(Clone, PartialEq, Eq)]
pub struct PemPair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for PemPair {
    // Never print key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PemPair")
            .field("cert_pem_len", &self.cert_pem.len())
            .finish_non_exhaustive()
    }
}

/// What a serving certificate must cover.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServingSpec {
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl ServingSpec {
    pub fn new(
        dns: impl IntoIterator<Item = String>,
        ips: impl IntoIterator<Item = IpAddr>,
    ) -> Self {
        Self {
            dns: dns.into_iter().collect(),
            ips: ips.into_iter().collect(),
        }
    }
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t)
}

/// A self-signed CA valid from `now` (minus a little clock skew) for `validity`.
pub fn generate_ca(
    common_name: &str,
    now: SystemTime,
    validity: Duration,
) -> Result<PemPair, CertError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // Tolerate a few minutes of skew between us and the API server.
    params.not_before = offset(now - Duration::from_secs(300));
    params.not_after = offset(now + validity);
    let cert = params.self_signed(&key)?;
    Ok(PemPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A serving (server-auth) certificate for `spec`, signed by `ca`.
pub fn issue_serving(
    ca: &PemPair,
    spec: &ServingSpec,
    now: SystemTime,
    validity: Duration,
) -> Result<PemPair, CertError> {
    if spec.dns.is_empty() && spec.ips.is_empty() {
        return Err(CertError::NoNames);
    }
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    let cn = spec
        .dns
        .first()
        .cloned()
        .unwrap_or_else(|| spec.ips[0].to_string());
    params.distinguished_name.push(DnType::CommonName, cn);
    let mut sans = Vec::new();
    for d in &spec.dns {
        sans.push(SanType::DnsName(d.clone().try_into()?));
    }
    for ip in &spec.ips {
        sans.push(SanType::IpAddress(*ip));
    }
    params.subject_alt_names = sans;
    // ECDSA keys sign; KeyEncipherment is an RSA key-transport usage.
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = offset(now - Duration::from_secs(300));
    params.not_after = offset(now + validity);
    let cert = params.signed_by(&key, &issuer)?;
    Ok(PemPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Facts read back from a PEM certificate: what the rotation decisions need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub subject: String,
    pub issuer: String,
}

impl CertInfo {
    /// Whether the certificate covers every name and address of `spec`.
    pub fn covers(&self, spec: &ServingSpec) -> bool {
        spec.dns
            .iter()
            .all(|d| self.dns.iter().any(|x| x.eq_ignore_ascii_case(d)))
            && spec.ips.iter().all(|ip| self.ips.contains(ip))
    }
}

/// Parse the first certificate of a PEM bundle.
pub fn cert_info(pem: &str) -> Result<CertInfo, CertError> {
    let der = first_cert_der(pem)?;
    let (_, x509) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| CertError::Parse(format!("x509: {e}")))?;
    let to_sys = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp();
        if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
        } else {
            SystemTime::UNIX_EPOCH
        }
    };
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    if let Ok(Some(san)) = x509.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(d) => dns.push(d.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(b) => match b.len() {
                    4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())),
                    16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Ok(CertInfo {
        not_before: to_sys(x509.validity().not_before),
        not_after: to_sys(x509.validity().not_after),
        dns,
        ips,
        subject: x509.subject().to_string(),
        issuer: x509.issuer().to_string(),
    })
}

/// Whether `leaf_pem` was signed by the CA in `ca_pem` (signature check, not just names).
pub fn signed_by(leaf_pem: &str, ca_pem: &str) -> bool {
    let (Ok(leaf), Ok(ca)) = (first_cert_der(leaf_pem), first_cert_der(ca_pem)) else {
        return false;
    };
    let (Ok((_, leaf)), Ok((_, ca))) = (
        x509_parser::parse_x509_certificate(&leaf),
        x509_parser::parse_x509_certificate(&ca),
    ) else {
        return false;
    };
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

pub(crate) fn first_cert_der(pem: &str) -> Result<Vec<u8>, CertError> {
    let mut rd = pem.as_bytes();
    match rustls_pemfile::certs(&mut rd).next() {
        Some(Ok(c)) => Ok(c.as_ref().to_vec()),
        Some(Err(e)) => Err(CertError::Parse(format!("PEM: {e}"))),
        None => Err(CertError::Parse("no CERTIFICATE block in PEM".into())),
    }
}

/// Write `ca.crt`, `tls.crt`, `tls.key` into `dir` (created if missing). Each file is written
/// to a temporary name and renamed, so a watcher never sees a half-written file.
pub fn write_dir(dir: &Path, ca: &PemPair, serving: &PemPair) -> Result<(), CertError> {
    std::fs::create_dir_all(dir).map_err(|e| CertError::Io(dir.display().to_string(), e))?;
    write_atomic(&dir.join("ca.crt"), ca.cert_pem.as_bytes(), false)?;
    // Key first, then cert: the cert file's change is what marks a complete pair.
    write_atomic(&dir.join("tls.key"), serving.key_pem.as_bytes(), true)?;
    write_atomic(&dir.join("tls.crt"), serving.cert_pem.as_bytes(), false)?;
    Ok(())
}

fn write_atomic(path: &Path, data: &[u8], private: bool) -> Result<(), CertError> {
    let io = |e| CertError::Io(path.display().to_string(), e);
    // A temporary name per file and process (two writers never share one), created fresh so
    // a stale file's looser permissions are never inherited by a private key.
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file}.{}.tmp", std::process::id()));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    {
        use std::io::Write;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        if private {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        #[cfg(not(unix))]
        let _ = private;
        let mut f = opts.open(&tmp).map_err(io)?;
        f.write_all(data).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn ca_and_serving_roundtrip() {
        let now = SystemTime::now();
        let ca = generate_ca("asya test CA", now, 365 * DAY).unwrap();
        let spec = ServingSpec::new(
            ["asya-webhook.asya-system.svc".to_string()],
            ["127.0.0.1".parse().unwrap()],
        );
        let srv = issue_serving(&ca, &spec, now, 30 * DAY).unwrap();
        let info = cert_info(&srv.cert_pem).unwrap();
        assert!(info.covers(&spec));
        assert!(!info.covers(&ServingSpec::new(["other.svc".to_string()], [])));
        let days = info.not_after.duration_since(now).unwrap().as_secs() / 86_400;
        assert!((29..=30).contains(&days), "validity {days} days");
        assert!(signed_by(&srv.cert_pem, &ca.cert_pem));
        let other_ca = generate_ca("other", now, DAY).unwrap();
        assert!(!signed_by(&srv.cert_pem, &other_ca.cert_pem));
        assert!(info.issuer.contains("asya test CA"), "{}", info.issuer);
    }

    #[test]
    fn serving_needs_a_name() {
        let now = SystemTime::now();
        let ca = generate_ca("ca", now, DAY).unwrap();
        assert!(matches!(
            issue_serving(&ca, &ServingSpec::default(), now, DAY),
            Err(CertError::NoNames)
        ));
    }

    #[test]
    fn garbage_pem_is_an_error_not_a_panic() {
        assert!(cert_info("not a pem").is_err());
        assert!(
            cert_info("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").is_err()
        );
        assert!(!signed_by("x", "y"));
    }

    #[test]
    fn write_dir_writes_three_files() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let ca = generate_ca("ca", now, DAY).unwrap();
        let srv = issue_serving(&ca, &ServingSpec::new(["a.b".to_string()], []), now, DAY).unwrap();
        write_dir(dir.path(), &ca, &srv).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("ca.crt")).unwrap(),
            ca.cert_pem
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("tls.crt")).unwrap(),
            srv.cert_pem
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("tls.key")).unwrap(),
            srv.key_pem
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("tls.key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "key must not be group/world readable");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_stale_temporary_file_never_lends_its_permissions_to_the_key() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let ca = generate_ca("ca", now, DAY).unwrap();
        let srv = issue_serving(&ca, &ServingSpec::new(["a.b".to_string()], []), now, DAY).unwrap();
        // What a crash between create and rename would leave, world-readable.
        let stale = dir
            .path()
            .join(format!(".tls.key.{}.tmp", std::process::id()));
        std::fs::write(&stale, "old").unwrap();
        std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_dir(dir.path(), &ca, &srv).unwrap();
        let key = dir.path().join("tls.key");
        assert_eq!(std::fs::read_to_string(&key).unwrap(), srv.key_pem);
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "key must not be group/world readable");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
    }
}
