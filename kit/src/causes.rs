//! What an error's causes say, for logs and conditions a person reads.
//!
//! - [`chain`]: the error and each of its sources, `a: b: c` (kube's and hyper's errors print
//!   only their outermost link: `client error (Connect)`);
//! - [`clock_trouble`]: a TLS failure that comes from a clock, found anywhere in the chain. A
//!   host whose clock is behind sees every freshly issued certificate as not valid yet, and says
//!   only "connect failed" unless someone looks for it; these name the clock and the times.

use std::error::Error as StdError;
use std::fmt;

use k8s_openapi::jiff::Timestamp;
use rustls::{AlertDescription, CertificateError};

/// The error and each of its sources, joined by `": "`.
pub fn chain(error: &dyn StdError) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(link) = source {
        let text = link.to_string();
        // Some wrappers print their source in their own text; say it once.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = link.source();
    }
    out
}

/// [`chain`], followed by what [`clock_trouble`] finds in it (its reason and diagnosis), if
/// anything: the text to log or report for a failed connection.
pub fn explained(error: &(dyn StdError + 'static)) -> String {
    let text = chain(error);
    match clock_trouble(error) {
        Some(trouble) => format!("{text} ({}: {trouble})", trouble.reason()),
        None => text,
    }
}

/// A TLS failure that a clock explains. Times are seconds since the Unix epoch, where rustls
/// knew them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockTrouble {
    /// This host judged the peer's certificate not valid yet: this host's clock is behind the
    /// issuer's (certificates are issued from "now", backdated a few minutes at most).
    Behind {
        /// This host's clock when it checked.
        now: Option<u64>,
        /// The certificate's start of validity.
        not_before: Option<u64>,
    },
    /// This host judged the peer's certificate expired: it did, or this host's clock is ahead.
    Expired {
        /// This host's clock when it checked.
        now: Option<u64>,
        /// The certificate's end of validity.
        not_after: Option<u64>,
    },
    /// The peer refused this host's certificate as expired or not yet valid by its own clock:
    /// the peer's clock (or this host's certificate) is off.
    PeerRefused,
}

impl ClockTrouble {
    /// A stable name, for logs, events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ClockTrouble::Behind { .. } => "ClockBehind",
            ClockTrouble::Expired { .. } => "CertificateExpired",
            ClockTrouble::PeerRefused => "PeerRefusedCertificateTime",
        }
    }
}

impl fmt::Display for ClockTrouble {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ClockTrouble::Behind {
                now: Some(now),
                not_before: Some(from),
            } => write!(
                f,
                "the peer's certificate is valid from {}, and this host's clock reads {}, {}s earlier: this host's clock is behind; run an NTP client here",
                time(from),
                time(now),
                from.saturating_sub(now)
            ),
            ClockTrouble::Behind { .. } => f.write_str(
                "the peer's certificate is not valid yet by this host's clock: this host's clock is behind; run an NTP client here",
            ),
            ClockTrouble::Expired {
                now: Some(now),
                not_after: Some(until),
            } => write!(
                f,
                "the peer's certificate expired at {}, and this host's clock reads {}: renew it, or if it is current, this host's clock is ahead",
                time(until),
                time(now)
            ),
            ClockTrouble::Expired { .. } => f.write_str(
                "the peer's certificate has expired by this host's clock: renew it, or if it is current, this host's clock is ahead",
            ),
            ClockTrouble::PeerRefused => f.write_str(
                "the peer refused this host's certificate as expired or not yet valid: the peer's clock is likely off (or this certificate expired)",
            ),
        }
    }
}

/// RFC 3339, or the raw seconds where they are out of range.
fn time(secs: u64) -> String {
    i64::try_from(secs)
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
        .map_or_else(|| format!("{secs}s after the epoch"), |t| t.to_string())
}

/// The clock trouble behind `error`, if a link of its chain is one. An `io::Error` that wraps
/// a rustls error (as tokio-rustls returns it) is looked into: its `source()` skips the error
/// it wraps.
pub fn clock_trouble(error: &(dyn StdError + 'static)) -> Option<ClockTrouble> {
    let mut link = Some(error);
    while let Some(current) = link {
        if let Some(found) = from_rustls(current) {
            return Some(found);
        }
        if let Some(inner) = current.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref())
            && let Some(found) = clock_trouble(inner)
        {
            return Some(found);
        }
        link = current.source();
    }
    None
}

fn from_rustls(error: &(dyn StdError + 'static)) -> Option<ClockTrouble> {
    match error.downcast_ref::<rustls::Error>()? {
        rustls::Error::InvalidCertificate(certificate) => match certificate {
            CertificateError::NotValidYet => Some(ClockTrouble::Behind {
                now: None,
                not_before: None,
            }),
            CertificateError::NotValidYetContext { time, not_before } => Some(ClockTrouble::Behind {
                now: Some(time.as_secs()),
                not_before: Some(not_before.as_secs()),
            }),
            CertificateError::Expired => Some(ClockTrouble::Expired {
                now: None,
                not_after: None,
            }),
            CertificateError::ExpiredContext { time, not_after } => Some(ClockTrouble::Expired {
                now: Some(time.as_secs()),
                not_after: Some(not_after.as_secs()),
            }),
            _ => None,
        },
        rustls::Error::AlertReceived(AlertDescription::CertificateExpired) => Some(ClockTrouble::PeerRefused),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{ServerName, UnixTime};

    #[derive(Debug, thiserror::Error)]
    #[error("{what}")]
    struct Wrapper {
        what: &'static str,
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    }

    fn wrapped(inner: impl StdError + Send + Sync + 'static) -> Wrapper {
        Wrapper {
            what: "client error (Connect)",
            source: Box::new(Wrapper {
                what: "connecting",
                source: Box::new(inner),
            }),
        }
    }

    fn not_yet_valid() -> rustls::Error {
        rustls::Error::InvalidCertificate(CertificateError::NotValidYetContext {
            time: UnixTime::since_unix_epoch(Duration::from_secs(1_000)),
            not_before: UnixTime::since_unix_epoch(Duration::from_secs(1_300)),
        })
    }

    #[test]
    fn clock_trouble_is_found_anywhere_in_the_chain() {
        let io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let cases: Vec<(&str, Box<dyn StdError + Send + Sync>, Option<&str>)> = vec![
            ("rustls itself", Box::new(not_yet_valid()), Some("ClockBehind")),
            (
                "inside an io::Error",
                Box::new(io(not_yet_valid())),
                Some("ClockBehind"),
            ),
            (
                "io::Error under wrappers",
                Box::new(wrapped(io(not_yet_valid()))),
                Some("ClockBehind"),
            ),
            (
                "expired, without times",
                Box::new(wrapped(io(rustls::Error::InvalidCertificate(
                    CertificateError::Expired,
                )))),
                Some("CertificateExpired"),
            ),
            (
                "the peer's alert",
                Box::new(wrapped(io(rustls::Error::AlertReceived(
                    AlertDescription::CertificateExpired,
                )))),
                Some("PeerRefusedCertificateTime"),
            ),
            (
                "another certificate error",
                Box::new(wrapped(io(rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer,
                )))),
                None,
            ),
            (
                "another alert",
                Box::new(rustls::Error::AlertReceived(AlertDescription::HandshakeFailure)),
                None,
            ),
            (
                "a plain refusal",
                Box::new(wrapped(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))),
                None,
            ),
        ];
        for (name, error, want) in cases {
            let got = clock_trouble(error.as_ref()).map(|t| t.reason());
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn the_diagnosis_names_both_times_and_the_gap() {
        let Some(trouble) = clock_trouble(&not_yet_valid()) else {
            panic!("no clock trouble found");
        };
        assert_eq!(
            trouble,
            ClockTrouble::Behind {
                now: Some(1_000),
                not_before: Some(1_300)
            }
        );
        let text = trouble.to_string();
        for part in ["1970-01-01T00:21:40Z", "1970-01-01T00:16:40Z", "300s earlier", "behind"] {
            assert!(text.contains(part), "{part} in {text}");
        }
    }

    #[test]
    fn the_chain_names_every_link_once() {
        let error = wrapped(std::io::Error::other("connection refused"));
        assert_eq!(chain(&error), "client error (Connect): connecting: connection refused");
        assert_eq!(explained(&error), chain(&error), "nothing to add");
    }

    #[test]
    fn the_explanation_adds_the_reason_and_diagnosis() {
        let error = wrapped(std::io::Error::new(std::io::ErrorKind::InvalidData, not_yet_valid()));
        let text = explained(&error);
        assert!(text.starts_with("client error (Connect): connecting: "), "{text}");
        assert!(
            text.contains("(ClockBehind: the peer's certificate is valid from"),
            "{text}"
        );
    }

    /// A real verification: rustls' own verifier, a certificate that starts in five minutes
    /// (an issuer whose clock runs ahead of this host's, as a host set behind sees every fresh
    /// certificate), and the error it returns, found through an io::Error as a TLS connector
    /// hands it on.
    #[test]
    fn a_certificate_from_the_future_is_diagnosed_as_this_clock_behind() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let now = SystemTime::now();
        let validity =
            smolvm_certs::Validity::between(now + Duration::from_secs(300), now + Duration::from_secs(3_600));
        let ca = smolvm_certs::CertificateAuthority::generate("clock test CA", validity).expect("CA");
        let leaf = ca
            .issue_server(&["peer.test".to_string()], &[], validity)
            .expect("leaf");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).expect("root");
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .expect("verifier");
        let chain_der = smolvm_certs::parse_pem_chain(&leaf.cert_pem).expect("leaf DER");
        let Some((end_entity, _)) = chain_der.split_first() else {
            panic!("an empty chain");
        };
        let name = ServerName::try_from("peer.test").expect("name");
        let error = verifier
            .verify_server_cert(end_entity, &[], &name, &[], UnixTime::now())
            .expect_err("not valid yet");
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, error);
        match clock_trouble(&wrapped(io)) {
            Some(ClockTrouble::Behind {
                now: Some(at),
                not_before: Some(from),
            }) => assert!(from > at, "valid from {from}, checked at {at}"),
            other => panic!("not a clock behind: {other:?}"),
        }
    }
}
