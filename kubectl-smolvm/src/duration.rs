//! Durations on the command line are parsed by `smolvm_kit::cli::parse_duration` (`500ms`, `30s`,
//! `2m`, `1h30m`, or a bare number of seconds); this is what the requests make of them, and how
//! one is written back in messages.

use std::time::Duration;

/// Whole seconds, rounded up: what a `timeoutSeconds` field takes for `d`.
pub fn whole_seconds_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `d` in the grammar the flags take, to the millisecond: `2m`, `1m30s`, `300ms`, `1h5s`,
/// `1s500ms`; `0s` for nothing.
pub fn display(d: Duration) -> String {
    let secs = d.as_secs();
    let parts = [
        (secs / 3600, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
        (u64::from(d.subsec_millis()), "ms"),
    ];
    let text: String = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if text.is_empty() { "0s".to_string() } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_seconds_up() {
        let cases = [(0, 0), (1, 1), (999, 1), (1_000, 1), (1_001, 2), (30_000, 30)];
        for (millis, secs) in cases {
            assert_eq!(whole_seconds_up(Duration::from_millis(millis)), secs, "{millis}ms");
        }
    }

    #[test]
    fn displays_as_the_flags_take_it() {
        let cases = [
            (0, "0s"),
            (300, "300ms"),
            (1_500, "1s500ms"),
            (30_000, "30s"),
            (90_000, "1m30s"),
            (120_000, "2m"),
            (3_605_000, "1h5s"),
            (5_400_000, "1h30m"),
            (90_000_000, "25h"),
        ];
        for (millis, want) in cases {
            let d = Duration::from_millis(millis);
            assert_eq!(display(d), want, "{millis}ms");
            assert_eq!(smolvm_kit::cli::parse_duration(want), Ok(d), "{want} reads back");
        }
        assert_eq!(display(Duration::from_nanos(999_999)), "0s", "below a millisecond");
    }
}
