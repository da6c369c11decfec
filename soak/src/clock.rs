//! What a clock fault must leave behind. A node whose clock is set far behind sees freshly
//! issued certificates as not yet valid, so its agent cannot reach the API server: that is a
//! fault the product must report, not hide. Where the agent failed under the fault (it exited,
//! or a heartbeat failed), each failure must name the clock (reason `ClockBehind`), and the
//! controller must have published `HeartbeatLost` on its SmolVMNode, since the agent can write
//! nothing itself.

use std::fmt;

/// The agent's failures under a clock fault, from its log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ClockFailures {
    /// Exits and failed heartbeats logged (for any cause: the API server may be down too).
    pub failed: usize,
    /// Those that failed on a certificate (the TLS handshake refused the peer's).
    pub on_certificates: usize,
    /// Those that named the clock.
    pub named: usize,
}

impl ClockFailures {
    /// The failures in `log` (the agent's log lines written during the fault).
    pub fn of(log: &str) -> ClockFailures {
        let failing =
            |line: &&str| line.contains("smolvm-runtime failed") || line.contains("reporting SmolVMNode failed");
        let lines: Vec<&str> = log.lines().filter(failing).collect();
        ClockFailures {
            failed: lines.len(),
            on_certificates: lines.iter().filter(|l| l.contains("certificate")).count(),
            named: lines.iter().filter(|l| l.contains("ClockBehind")).count(),
        }
    }

    /// Why the fault went unreported, if it did: a certificate failure that did not name the
    /// clock, or an agent that failed on a certificate (and so could not heartbeat) with no
    /// `HeartbeatLost` event (`heartbeat_lost` of them) on its node. A failure for another cause
    /// (the API server restarting meanwhile, say) must not name the clock, and is not counted
    /// against it; nor is a clock that broke nothing (a skew within the certificates' 5 minutes).
    pub fn unreported(&self, heartbeat_lost: usize) -> Option<String> {
        if self.named < self.on_certificates {
            Some(format!(
                "the agent failed {} time(s) on a certificate without naming its clock (reason ClockBehind)",
                self.on_certificates - self.named
            ))
        } else if self.on_certificates > 0 && heartbeat_lost == 0 {
            Some(
                "the agent failed on a certificate and no HeartbeatLost event was published on its SmolVMNode"
                    .to_string(),
            )
        } else {
            None
        }
    }
}

impl fmt::Display for ClockFailures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the agent failed {} time(s), {} on a certificate, {} naming its clock",
            self.failed, self.on_certificates, self.named
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_failures_must_name_the_clock_and_be_seen() {
        let named = "ERROR smolvm-runtime failed error=client error (Connect): invalid peer certificate: certificate not valid yet (ClockBehind: ...) reason=\"ClockBehind\"";
        let bare = "ERROR smolvm-runtime failed error=client error (Connect): invalid peer certificate: certificate not valid yet reason=\"KubernetesApiError\"";
        let refused = "WARN reporting SmolVMNode failed error=client error (Connect): tcp connect error: Connection refused reason=\"KubernetesApiError\"";
        let beat =
            "WARN reporting SmolVMNode failed error=invalid peer certificate (ClockBehind: ...) reason=\"ClockBehind\"";
        // (name, log, HeartbeatLost events, failed, unreported?)
        let cases = [
            ("nothing failed", "INFO started\n".to_string(), 0, 0, false),
            ("failed, named, seen", format!("{named}\n{beat}\n"), 1, 2, false),
            (
                "a certificate failure without the clock",
                format!("{named}\n{bare}\n"),
                1,
                2,
                true,
            ),
            (
                "the API server down meanwhile",
                format!("{named}\n{refused}\n"),
                1,
                2,
                false,
            ),
            (
                "failed, named, never seen by the controller",
                format!("{named}\n"),
                0,
                1,
                true,
            ),
        ];
        for (name, log, lost, failed, want) in cases {
            let failures = ClockFailures::of(&log);
            assert_eq!(failures.failed, failed, "{name}");
            assert_eq!(failures.unreported(lost).is_some(), want, "{name}");
        }
    }
}
