//! Certificate validity windows.

use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};

/// How far `not_before` is backdated for certificates issued "from now", to tolerate clock skew
/// between the issuer and the peers that verify the certificate.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(5 * 60);

/// The `[not_before, not_after]` window of a certificate.
///
/// Every issuing function takes `impl Into<Validity>`, so a plain [`Duration`] ("valid for this
/// long from now", backdated by [`CLOCK_SKEW_ALLOWANCE`]) works, and tests can pass explicit
/// windows, including ones already in the past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
}

impl Validity {
    /// Valid from `now - CLOCK_SKEW_ALLOWANCE` until `now + lifetime`.
    pub fn from_now(lifetime: Duration) -> Self {
        let now = SystemTime::now();
        let not_before = now.checked_sub(CLOCK_SKEW_ALLOWANCE).unwrap_or(now);
        Validity {
            not_before,
            // On overflow, an empty window: rejected as InvalidValidity when used.
            not_after: now.checked_add(lifetime).unwrap_or(not_before),
        }
    }

    /// An explicit window.
    pub fn between(not_before: SystemTime, not_after: SystemTime) -> Self {
        Validity { not_before, not_after }
    }

    /// Checks the window and converts it to rcgen's time type.
    pub(crate) fn to_offset(self) -> Result<(time::OffsetDateTime, time::OffsetDateTime)> {
        if self.not_after <= self.not_before {
            return Err(Error::InvalidValidity(
                "not_after must be later than not_before".to_string(),
            ));
        }
        Ok((to_offset(self.not_before)?, to_offset(self.not_after)?))
    }
}

impl From<Duration> for Validity {
    fn from(lifetime: Duration) -> Self {
        Validity::from_now(lifetime)
    }
}

fn to_offset(t: SystemTime) -> Result<time::OffsetDateTime> {
    let secs: i64 = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).map_err(|_| out_of_range())?,
        Err(e) => {
            let back = e.duration();
            // Round towards the past so a window never grows by truncation.
            let s = i64::try_from(back.as_secs()).map_err(|_| out_of_range())?;
            -(s + i64::from(back.subsec_nanos() > 0))
        }
    };
    let dt = time::OffsetDateTime::from_unix_timestamp(secs).map_err(|_| out_of_range())?;
    // X.509 GeneralizedTime is limited to four-digit years.
    if !(1950..=9999).contains(&dt.year()) {
        return Err(out_of_range());
    }
    Ok(dt)
}

fn out_of_range() -> Error {
    Error::InvalidValidity("time is outside the range X.509 can encode".to_string())
}

/// Converts a Unix timestamp (seconds) to a [`SystemTime`].
pub(crate) fn system_time_from_unix(secs: i64) -> Option<SystemTime> {
    if secs >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs.unsigned_abs()))
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverted_or_empty_windows_are_rejected() {
        let now = SystemTime::now();
        for (nb, na) in [
            (now, now),
            (now, now - Duration::from_secs(1)),
            (now + Duration::from_secs(10), now),
        ] {
            let err = Validity::between(nb, na).to_offset().unwrap_err();
            assert_eq!(err.reason(), "InvalidValidity");
        }
    }

    #[test]
    fn from_duration_backdates_by_skew_allowance() {
        let v = Validity::from(Duration::from_secs(3600));
        let span = v.not_after.duration_since(v.not_before).unwrap();
        assert_eq!(span, Duration::from_secs(3600) + CLOCK_SKEW_ALLOWANCE);
    }

    #[test]
    fn unix_round_trip() {
        for secs in [-86_400i64, 0, 1_700_000_000] {
            let t = system_time_from_unix(secs).unwrap();
            let (dt, _) = Validity::between(t, t + Duration::from_secs(1)).to_offset().unwrap();
            assert_eq!(dt.unix_timestamp(), secs);
        }
    }

    #[test]
    fn overflowing_lifetime_is_rejected() {
        let v = Validity::from(Duration::MAX);
        assert_eq!(v.to_offset().unwrap_err().reason(), "InvalidValidity");
    }

    #[test]
    fn far_future_is_rejected() {
        let now = SystemTime::now();
        let far = now + Duration::from_secs(400 * 365 * 24 * 3600 * 25);
        assert_eq!(
            Validity::between(now, far).to_offset().unwrap_err().reason(),
            "InvalidValidity"
        );
    }
}
