//! Durations on the command line are parsed by `smolvm_kit::cli::parse_duration` (`500ms`, `30s`,
//! `2m`, `1h30m`, or a bare number of seconds); this is what the requests make of them.

use std::time::Duration;

/// Whole seconds, rounded up: what a `timeoutSeconds` field takes for `d`.
pub fn whole_seconds_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
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
}
