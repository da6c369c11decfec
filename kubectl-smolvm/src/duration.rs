//! Durations on the command line, written as the operator's binaries and Kubernetes write
//! them: `500ms`, `30s`, `2m`, `1h30m`, or a bare number of seconds.

use std::time::Duration;

/// Parses a duration: one or more `<number><unit>` parts with the units `ms`, `s`, `m` and `h`,
/// or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration (write it as 30s, 2m or 1h30m)".into());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| format!("duration {text:?} is too large"));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "invalid duration {text:?}: expected a number at {rest:?} (write it as 30s, 2m or 1h30m)"
            ));
        }
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, tail) = tail.split_at(unit_len);
        let n: u64 = number.parse().map_err(|_| format!("duration {text:?} is too large"))?;
        let part = match unit {
            "ms" => Some(Duration::from_millis(n)),
            "s" => Some(Duration::from_secs(n)),
            "m" => n.checked_mul(60).map(Duration::from_secs),
            "h" => n.checked_mul(3_600).map(Duration::from_secs),
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: {number} has no unit (use ms, s, m or h)"
                ));
            }
            other => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {other:?} (use ms, s, m or h)"
                ));
            }
        };
        total = part
            .and_then(|p| total.checked_add(p))
            .ok_or_else(|| format!("duration {text:?} is too large"))?;
        rest = tail;
    }
    Ok(total)
}

/// Whole seconds, rounded up: what a `timeoutSeconds` field takes for `d`.
pub fn whole_seconds_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        let ok = [
            ("30", 30_000),
            ("0", 0),
            ("30s", 30_000),
            ("2m", 120_000),
            ("1h30m", 5_400_000),
            ("500ms", 500),
            ("1m30s", 90_000),
            (" 10s ", 10_000),
        ];
        for (text, millis) in ok {
            assert_eq!(parse_duration(text), Ok(Duration::from_millis(millis)), "{text:?}");
        }
        for bad in [
            "",
            "s",
            "10x",
            "1.5s",
            "-1s",
            "10s5",
            "99999999999999999999",
            "99999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rounds_seconds_up() {
        let cases = [(0, 0), (1, 1), (999, 1), (1_000, 1), (1_001, 2), (30_000, 30)];
        for (millis, secs) in cases {
            assert_eq!(whole_seconds_up(Duration::from_millis(millis)), secs, "{millis}ms");
        }
    }
}
