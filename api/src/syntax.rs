//! Syntax checks shared by the rules: image references, DNS names, label keys and values,
//! CIDRs. Each returns `Err(reason)` with a short, user-facing reason.

use std::net::IpAddr;

/// Prefix of an image in the node's local image directory.
pub const LOCAL_IMAGE_PREFIX: &str = "local:";
/// Longest name of a local image.
pub const MAX_LOCAL_IMAGE_NAME: usize = 128;
/// Longest repository name of an OCI reference (the distribution spec's limit).
pub const MAX_REPOSITORY_LEN: usize = 255;

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef<'a> {
    /// `local:<name>`.
    Local(&'a str),
    /// An OCI reference.
    Oci {
        /// Registry host (with port), if any.
        domain: Option<&'a str>,
        /// Repository path.
        path: &'a str,
        /// Tag, if any.
        tag: Option<&'a str>,
        /// Digest, if any.
        digest: Option<&'a str>,
    },
}

/// Parses `local:<name>` or an OCI reference (`[domain[:port]/]path[:tag][@digest]`), following the
/// grammar of the distribution reference.
pub fn parse_image(image: &str) -> Result<ImageRef<'_>, String> {
    if image.is_empty() {
        return Err("is empty".into());
    }
    if let Some(name) = image.strip_prefix(LOCAL_IMAGE_PREFIX) {
        if name.is_empty() {
            return Err("names no local image after 'local:'".into());
        }
        if name.len() > MAX_LOCAL_IMAGE_NAME {
            return Err(format!(
                "has a local image name longer than {MAX_LOCAL_IMAGE_NAME} characters"
            ));
        }
        let mut chars = name.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
        if !first_ok
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(
                "is not local:<name> with a name of letters, digits, '.', '_' and '-' starting with a letter or digit"
                    .into(),
            );
        }
        return Ok(ImageRef::Local(name));
    }
    if let Some(c) = image.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("contains the character {c:?}"));
    }
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => {
            check_digest(digest)?;
            (rest, Some(digest))
        }
        None => (image, None),
    };
    // The tag is after the last ':' that comes after the last '/'.
    let last_slash = rest.rfind('/');
    let (name, tag) = match rest.rfind(':') {
        Some(colon) if last_slash.is_none_or(|s| colon > s) => (&rest[..colon], Some(&rest[colon + 1..])),
        _ => (rest, None),
    };
    if let Some(tag) = tag {
        check_tag(tag)?;
    }
    if name.len() > MAX_REPOSITORY_LEN {
        return Err(format!(
            "has a repository name longer than {MAX_REPOSITORY_LEN} characters"
        ));
    }
    let (domain, path) = split_domain(name);
    if let Some(domain) = domain {
        check_domain(domain)?;
    }
    if path.is_empty() {
        return Err("has no repository name".into());
    }
    for component in path.split('/') {
        check_path_component(component)?;
    }
    Ok(ImageRef::Oci {
        domain,
        path,
        tag,
        digest,
    })
}

fn split_domain(name: &str) -> (Option<&str>, &str) {
    match name.split_once('/') {
        Some((first, rest)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            (Some(first), rest)
        }
        _ => (None, name),
    }
}

fn check_domain(domain: &str) -> Result<(), String> {
    let (host, port) = match domain.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || domain.starts_with('[') => (host, Some(port)),
        _ => (domain, None),
    };
    if let Some(port) = port
        && (port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()) || port.len() > 5)
    {
        return Err(format!("has an invalid registry port {port:?}"));
    }
    if let Some(ip6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return ip6
            .parse::<std::net::Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| format!("has an invalid registry address {host:?}"));
    }
    let ok = !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!("has an invalid registry host {host:?}"))
    }
}

fn check_path_component(component: &str) -> Result<(), String> {
    // [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*
    let bytes = component.as_bytes();
    let bad = || {
        Err(format!(
            "has an invalid repository path component {component:?} (lower-case letters and digits, separated by '.', '_', '__' or '-')"
        ))
    };
    if bytes.is_empty() || !is_lower_alnum(bytes[0]) || !is_lower_alnum(bytes[bytes.len() - 1]) {
        return bad();
    }
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if is_lower_alnum(b) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !is_lower_alnum(bytes[i]) {
            i += 1;
        }
        let sep = &component[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-')) {
            return bad();
        }
    }
    Ok(())
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

fn check_tag(tag: &str) -> Result<(), String> {
    // [\w][\w.-]{0,127}
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "has an invalid tag {tag:?} (at most 128 letters, digits, '_', '.' or '-', not starting with '.' or '-')"
        ))
    }
}

fn check_digest(digest: &str) -> Result<(), String> {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err(format!(
            "has an invalid digest {digest:?} (algorithm:hex, such as sha256:<64 hex digits>)"
        ));
    };
    let algorithm_ok = !algorithm.is_empty()
        && algorithm.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && algorithm
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '.' | '_' | '-'));
    let hex_ok = hex.len() >= 32 && hex.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
    let length_ok = match algorithm {
        "sha256" => hex.len() == 64,
        "sha512" => hex.len() == 128,
        _ => true,
    };
    if algorithm_ok && hex_ok && length_ok {
        Ok(())
    } else {
        Err(format!(
            "has an invalid digest {digest:?} (algorithm:hex, such as sha256:<64 hex digits>)"
        ))
    }
}

/// Checks a DNS-1123 subdomain (as used for Kubernetes object and node names).
pub fn check_dns1123_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name.len() > 253 {
        return Err("is longer than 253 characters".into());
    }
    for label in name.split('.') {
        let bytes = label.as_bytes();
        let ok = !bytes.is_empty()
            && bytes.iter().all(|&b| is_lower_alnum(b) || b == b'-')
            && is_lower_alnum(bytes[0])
            && is_lower_alnum(bytes[bytes.len() - 1]);
        if !ok {
            return Err("is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', each part starting and ending with a letter or digit)".into());
        }
    }
    Ok(())
}

/// Checks a DNS-1123 label (as used for a Pod's volume names): at most 63 characters, lower-case
/// letters, digits and '-', starting and ending with a letter or digit.
pub fn check_dns1123_label(name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= 63
        && is_lower_alnum(bytes[0])
        && is_lower_alnum(bytes[bytes.len() - 1])
        && bytes.iter().all(|&b| is_lower_alnum(b) || b == b'-');
    if ok {
        Ok(())
    } else {
        Err("is not a DNS-1123 label (at most 63 characters: lower-case letters, digits and '-', starting and ending with a letter or digit)".into())
    }
}

/// Checks a DNS-1035 label (as used for Service names): at most 63 characters, lower-case
/// letters, digits and '-', starting with a letter and ending with a letter or digit.
pub fn check_dns1035_label(name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && is_lower_alnum(bytes[bytes.len() - 1])
        && bytes.iter().all(|&b| is_lower_alnum(b) || b == b'-');
    if ok {
        Ok(())
    } else {
        Err("is not a DNS-1035 label (at most 63 characters: lower-case letters, digits and '-', starting with a letter and ending with a letter or digit)".into())
    }
}

/// Checks a `network.allowedHosts` entry: a DNS-1123 subdomain, optionally after a leading `*.`.
pub fn check_allowed_host(host: &str) -> Result<(), String> {
    let name = host.strip_prefix("*.").unwrap_or(host);
    check_dns1123_subdomain(name)
        .map_err(|reason| format!("{reason}; a host name such as api.example.com, or *.example.com for its subdomains"))
}

/// The registry an image is pulled from and its path there, as the kubelet's credential
/// matching names them (`docker.io` and `library/<name>` for Docker Hub images without a domain);
/// `None` for `local:` images and references that do not parse.
pub fn registry_of(image: &str) -> Option<(String, String)> {
    match parse_image(image).ok()? {
        ImageRef::Local(_) => None,
        ImageRef::Oci { domain, path, .. } => {
            let host = normalize_registry_host(domain.unwrap_or("docker.io"));
            let path = if domain.is_none() && !path.contains('/') {
                format!("library/{path}")
            } else {
                path.to_string()
            };
            Some((host, path))
        }
    }
}

/// A registry host in the one spelling credentials are matched by: lower case, and Docker Hub's
/// aliases as `docker.io`.
pub fn normalize_registry_host(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io".into(),
        _ => host,
    }
}

/// Checks a Secret or ConfigMap key: 1 to 253 letters, digits, '-', '_' or '.', and not `.`,
/// `..` or starting with `..` (Kubernetes' own rule).
pub fn check_config_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("is empty".into());
    }
    if key.len() > 253 {
        return Err("is longer than 253 characters".into());
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err("is not a valid key (letters, digits, '-', '_' and '.')".into());
    }
    if key == "." || key.starts_with("..") {
        return Err("may not be '.' or start with '..'".into());
    }
    Ok(())
}

/// Checks a label key: an optional DNS-1123 subdomain prefix and '/', then a name of at most 63
/// characters.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        check_dns1123_subdomain(prefix).map_err(|e| format!("has a prefix that {e}"))?;
    }
    if name.is_empty() {
        return Err("has an empty name part".into());
    }
    check_label_name(name).map_err(|e| format!("has a name part that {e}"))
}

/// Checks a label value: empty, or at most 63 letters, digits, '-', '_' or '.', starting and
/// ending with a letter or digit.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_label_name(value)
}

fn check_label_name(name: &str) -> Result<(), String> {
    if name.len() > 63 {
        return Err("is longer than 63 characters".into());
    }
    let bytes = name.as_bytes();
    let ok = bytes
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.last().is_some_and(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err("must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit".into())
    }
}

/// Checks a CIDR such as `10.0.0.0/8` or `2001:db8::/32`. Host bits may be set, as in Kubernetes'
/// `isCIDR`.
pub fn check_cidr(cidr: &str) -> Result<(), String> {
    cidr.parse::<ipnet::IpNet>()
        .map(|_| ())
        .map_err(|_| "is not a CIDR such as 10.0.0.0/8 or 2001:db8::/32".into())
}

/// Checks an endpoint address: an IP address or a DNS-1123 subdomain.
pub fn check_address(address: &str) -> Result<(), String> {
    if address.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    check_dns1123_subdomain(address).map_err(|_| "is neither an IP address nor a DNS-1123 subdomain".into())
}

/// A duration as Kubernetes writes one (`metav1.Duration`, which Go's `time.ParseDuration`
/// reads): a sequence of decimal numbers, each with an optional fraction and a unit (`ns`, `us`
/// or `µs`, `ms`, `s`, `m`, `h`), as in `30s`, `1.5h`, `1h30m`; `0` alone. A sign is read and a
/// negative duration refused, as nothing here takes one.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    const UNITS: [(&str, u128); 8] = [
        ("ns", 1),
        ("us", 1_000),
        ("\u{b5}s", 1_000),
        ("\u{3bc}s", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
        ("m", 60_000_000_000),
        ("h", 3_600_000_000_000),
    ];
    let invalid = || format!("{text:?} is not a duration such as 30s, 5m or 1h30m");
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(invalid());
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, scale)| *scale)
            .ok_or_else(|| match unit {
                "" => format!("{text:?} lacks a unit after {number} (ns, us, ms, s, m or h)"),
                _ => format!("{text:?} has an unknown unit {unit:?} (ns, us, ms, s, m or h)"),
            })?;
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| invalid())?
        };
        let mut part = whole.checked_mul(scale).ok_or_else(invalid)?;
        // The fraction to the nanosecond, as Go keeps it.
        let mut unit_scale = scale;
        for digit in fraction.bytes().take(30) {
            unit_scale /= 10;
            part += u128::from(digit - b'0') * unit_scale;
        }
        nanos = nanos.checked_add(part).ok_or_else(invalid)?;
        rest = next;
    }
    // Go's durations end at about 292 years.
    if nanos > i64::MAX as u128 {
        return Err(format!("{text:?} is longer than a duration can be"));
    }
    if negative && nanos > 0 {
        return Err(format!("{text:?} is negative"));
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| invalid())?;
    Ok(std::time::Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {

    #[test]
    fn durations_read_as_kubernetes_writes_them() {
        use std::time::Duration;
        let ok = [
            ("0", Duration::ZERO),
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("1h30m", Duration::from_secs(5400)),
            ("1.5h", Duration::from_secs(5400)),
            ("+2m", Duration::from_secs(120)),
            ("300ms", Duration::from_millis(300)),
            ("1h0m0s", Duration::from_secs(3600)),
            (".5s", Duration::from_millis(500)),
            ("1\u{b5}s", Duration::from_micros(1)),
            ("10us", Duration::from_micros(10)),
            ("-0s", Duration::ZERO),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "30",
            "s",
            "1d",
            "1h30",
            "-5m",
            "1..5s",
            ".s",
            "abc",
            "9999999999h",
            "+",
            "1 h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} is refused");
        }
    }
    use super::*;

    #[test]
    fn v1_image_references() {
        let good = [
            "alpine",
            "alpine:latest",
            "library/alpine:3.20",
            "registry.example.org/library/alpine:3.20",
            "registry.example.com/org/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "localhost:5000/team/app:v1.2.3",
            "registry.example.com:443/a/b/c",
            "my_repo/my__app/a-b---c:tag_1",
            "[::1]:5000/app:1",
            "local:alpine",
            "local:my-image_v1.2",
        ];
        for image in good {
            assert!(
                parse_image(image).is_ok(),
                "{image} should be valid: {:?}",
                parse_image(image)
            );
        }
        let bad = [
            "",
            "Alpine",
            "alpine:",
            "alpine:-tag",
            "alpine latest",
            "alpine@sha256:abc",
            "alpine@md5",
            "/alpine",
            "alpine/",
            "a//b",
            "a..b",
            "reg.io:port/app",
            "-reg.io/app",
            "local:",
            "local:../etc",
            "local:a/b",
            "alpine:\u{7f}",
        ];
        for image in bad {
            assert!(parse_image(image).is_err(), "{image:?} should be invalid");
        }
        let long_tag = format!("alpine:{}", "a".repeat(129));
        assert!(parse_image(&long_tag).is_err());
        let long_repo = "a".repeat(256);
        assert!(parse_image(&long_repo).is_err());
    }

    #[test]
    fn v4_names_and_labels() {
        for ok in ["node-1", "a", "n1.example.com", &"a".repeat(63)] {
            assert!(check_dns1123_subdomain(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Node", "-a", "a-", "a..b", "a_b", &"a".repeat(254)] {
            assert!(check_dns1123_subdomain(bad).is_err(), "{bad}");
        }
        for ok in ["web", "a", "web-1", &"a".repeat(63)] {
            assert!(check_dns1035_label(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1web", "web.example", "web-", "Web", &"a".repeat(64)] {
            assert!(check_dns1035_label(bad).is_err(), "{bad}");
        }
        for ok in ["kubernetes.io/arch", "app", "a.b/c_d-e.f", "A1"] {
            assert!(check_label_key(ok).is_ok(), "{ok}");
        }
        for bad in ["", "/a", "a/", "Kubernetes.IO/arch", "a/b/c", "-a", &"a".repeat(64)] {
            assert!(check_label_key(bad).is_err(), "{bad}");
        }
        for ok in ["", "amd64", "a.b_c-d", &"a".repeat(63)] {
            assert!(check_label_value(ok).is_ok(), "{ok}");
        }
        for bad in ["-a", "a b", "a/", &"a".repeat(64)] {
            assert!(check_label_value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn v3_cidrs_and_v10_addresses() {
        for ok in ["10.0.0.0/8", "192.168.1.1/32", "2001:db8::/32", "::/0"] {
            assert!(check_cidr(ok).is_ok(), "{ok}");
        }
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "", "2001:db8::/129"] {
            assert!(check_cidr(bad).is_err(), "{bad}");
        }
        for ok in ["10.0.0.1", "::1", "node-1.example.com"] {
            assert!(check_address(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Node_1", "10.0.0.1:80", "http://x"] {
            assert!(check_address(bad).is_err(), "{bad}");
        }
    }
}
