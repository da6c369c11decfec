//! Checks of a call's input before any machine is asked: the query of a logs call and of a
//! file write, an exec request, a file path, published ports in an excluded range. Pure; each
//! refusal is an [`ApiFailure`] that names what was wrong.

use smolvm_api::policy::PortRange;

use super::failure::ApiFailure;
use super::types::{ErrorCode, PortSpec};
use crate::vmm;

/// Pure: `HostPortExcluded` (403) for the first published port that lies in an `excluded`
/// range (the policy's `excludedHostPorts` and the agent's own ports), naming the port, its
/// protocol and the rule.
pub fn check_excluded_ports(ports: &[PortSpec], excluded: &[PortRange]) -> Result<(), ApiFailure> {
    for port in ports {
        let Some(rule) = excluded.iter().find(|r| r.contains(i64::from(port.host_port))) else {
            continue;
        };
        let protocol = port.protocol.as_str();
        return Err(ApiFailure::new(
            ErrorCode::HostPortExcluded,
            format!(
                "host port {}/{protocol} is excluded on this node ({rule}, policy excludedHostPorts): it is reserved for the node's own services or the runtime agent",
                port.host_port
            ),
        )
        .with_details(serde_json::json!({
            "hostPort": port.host_port,
            "protocol": protocol,
            "rule": rule.to_string(),
        })));
    }
    Ok(())
}

/// Reads the query of a logs call: `source` (`console`, the default, or `workload`), `tail`
/// (a line count) and `follow` (`true` or `false`). Anything else is a 400 naming it.
pub fn parse_log_query(query: &str) -> Result<vmm::LogQuery, ApiFailure> {
    let mut out = vmm::LogQuery::default();
    let bad = |message: String| ApiFailure::new(ErrorCode::InvalidRequest, message);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "source" => {
                out.source = vmm::LogSource::parse(value)
                    .ok_or_else(|| bad(format!("source {value:?} is not one of console, workload")))?;
            }
            "tail" => {
                out.tail = Some(
                    value
                        .parse()
                        .map_err(|_| bad(format!("tail {value:?} is not a line count")))?,
                );
            }
            "follow" => {
                out.follow = match value {
                    "true" | "" => true,
                    "false" => false,
                    _ => return Err(bad(format!("follow {value:?} is not true or false"))),
                };
            }
            other => {
                return Err(bad(format!(
                    "unknown query parameter {other:?}; known: source, tail, follow"
                )));
            }
        }
    }
    Ok(out)
}

/// Checks an exec request before any machine is asked: a command, a time limit in range.
pub fn check_exec(request: &super::types::ExecRequest) -> Result<(), ApiFailure> {
    let bad = |message: String| ApiFailure::new(ErrorCode::InvalidRequest, message);
    if request.command.first().is_none_or(String::is_empty) {
        return Err(bad("command is required: the program and its arguments".into()));
    }
    let max = smolvm_api::nodeapi::EXEC_MAX_TIMEOUT_SECONDS;
    if let Some(seconds) = request.timeout_seconds
        && !(1..=max).contains(&seconds)
    {
        return Err(bad(format!("timeoutSeconds {seconds} is outside 1-{max}")));
    }
    Ok(())
}

/// Checks a file path of a files call: absolute inside the machine once a leading `/` is added,
/// no `.` or `..` segment, no NUL, at most 4096 bytes. Returns it with one leading `/`.
pub fn check_file_path(path: &str) -> Result<String, ApiFailure> {
    let bad = |why: &str| ApiFailure::new(ErrorCode::InvalidRequest, format!("file path {path:?}: {why}"));
    let trimmed = path.trim_start_matches('/');
    if trimmed.is_empty() {
        return Err(bad("names no file"));
    }
    if path.len() > 4096 || path.contains('\0') {
        return Err(bad("is longer than 4096 bytes or holds a NUL"));
    }
    if trimmed.split('/').any(|s| s == "." || s == ".." || s.is_empty()) {
        return Err(bad("has an empty, `.` or `..` segment"));
    }
    Ok(format!("/{trimmed}"))
}

/// Reads a write's query: `mode` in octal (`0644`, `755`), nothing else.
pub fn parse_file_mode(query: &str) -> Result<Option<u32>, ApiFailure> {
    let bad = |message: String| ApiFailure::new(ErrorCode::InvalidRequest, message);
    let mut mode = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("mode", value)) => {
                let parsed = u32::from_str_radix(value, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| bad(format!("mode {value:?} is not an octal file mode such as 0644")))?;
                mode = Some(parsed);
            }
            _ => return Err(bad(format!("unknown query parameter {pair:?}; known: mode"))),
        }
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smolvm_api::Protocol;

    #[test]
    fn log_queries() {
        let ok = [
            ("", vmm::LogQuery::default()),
            (
                "source=workload&tail=10&follow=true",
                vmm::LogQuery {
                    source: vmm::LogSource::Workload,
                    tail: Some(10),
                    follow: true,
                },
            ),
            (
                "follow&source=console",
                vmm::LogQuery {
                    follow: true,
                    ..Default::default()
                },
            ),
        ];
        for (query, want) in ok {
            assert_eq!(parse_log_query(query).map_err(|e| e.body.message), Ok(want), "{query}");
        }
        for query in ["source=kernel", "tail=-1", "tail=many", "follow=yes", "since=1h"] {
            let error = parse_log_query(query).err().map(|e| e.body.code);
            assert_eq!(error, Some(ErrorCode::InvalidRequest), "{query}");
        }
    }

    #[test]
    fn file_paths_and_modes() {
        for (path, want) in [
            ("etc/hostname", "/etc/hostname"),
            ("/tmp/a b", "/tmp/a b"),
            ("//x", "/x"),
        ] {
            assert_eq!(
                check_file_path(path).map_err(|e| e.body.message),
                Ok(want.to_string()),
                "{path}"
            );
        }
        for path in ["", "/", "a/../b", "./a", "a//b", "a/\0", &"x".repeat(5000)] {
            assert!(check_file_path(path).is_err(), "{path:?}");
        }
        assert_eq!(parse_file_mode("").map_err(|e| e.body.message), Ok(None));
        assert_eq!(
            parse_file_mode("mode=0644").map_err(|e| e.body.message),
            Ok(Some(0o644))
        );
        assert_eq!(parse_file_mode("mode=755").map_err(|e| e.body.message), Ok(Some(0o755)));
        for query in ["mode=9", "mode=77777", "uid=0", "mode="] {
            assert!(parse_file_mode(query).is_err(), "{query}");
        }
    }

    #[test]
    fn exec_requests_are_checked_before_any_machine() {
        let request = |command: &[&str], timeout: Option<u32>| super::super::types::ExecRequest {
            command: command.iter().map(|s| s.to_string()).collect(),
            timeout_seconds: timeout,
            ..Default::default()
        };
        assert!(check_exec(&request(&["true"], None)).is_ok());
        assert!(check_exec(&request(&["true"], Some(3600))).is_ok());
        for bad in [
            request(&[], None),
            request(&[""], None),
            request(&["true"], Some(0)),
            request(&["true"], Some(3601)),
        ] {
            assert_eq!(
                check_exec(&bad).err().map(|e| e.body.code),
                Some(ErrorCode::InvalidRequest),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn excluded_host_ports_are_refused() {
        let port = |host_port: u16, protocol: Protocol| PortSpec {
            host_port,
            guest_port: 80,
            protocol,
        };
        let excluded = smolvm_api::Policy::default().excluded_host_ports;
        let cases = [
            (vec![], None),
            (vec![port(8080, Protocol::Tcp)], None),
            (vec![port(10250, Protocol::Tcp)], Some((10250, "TCP", "10250"))),
            (vec![port(10249, Protocol::Udp)], Some((10249, "UDP", "10249"))),
            (vec![port(10256, Protocol::Tcp)], Some((10256, "TCP", "10256"))),
            (
                vec![port(8080, Protocol::Tcp), port(30080, Protocol::Udp)],
                Some((30080, "UDP", "30000-32767")),
            ),
            (vec![port(32767, Protocol::Tcp)], Some((32767, "TCP", "30000-32767"))),
            (vec![port(32768, Protocol::Tcp), port(29999, Protocol::Tcp)], None),
            (vec![port(10443, Protocol::Tcp)], Some((10443, "TCP", "10443"))),
            (vec![port(9090, Protocol::Tcp)], Some((9090, "TCP", "9090"))),
            (vec![port(10081, Protocol::Tcp)], Some((10081, "TCP", "10081"))),
        ];
        for (ports, expected) in cases {
            let got = check_excluded_ports(&ports, &excluded).err();
            let got = got.map(|f| {
                assert_eq!((f.status, &f.body.code), (403, &ErrorCode::HostPortExcluded));
                let d = f.body.details.unwrap_or_default();
                (
                    d["hostPort"].as_u64().unwrap_or_default(),
                    d["protocol"].as_str().unwrap_or_default().to_string(),
                    d["rule"].as_str().unwrap_or_default().to_string(),
                )
            });
            let expected = expected.map(|(p, proto, rule)| (p, proto.to_string(), rule.to_string()));
            assert_eq!(got, expected, "{ports:?}");
        }
        // Nothing excluded: nothing refused.
        assert!(check_excluded_ports(&[port(10250, Protocol::Tcp)], &[]).is_ok());
    }
}
