//! Where things are on the API server: the SmolVM resource, the aggregated subresource API's
//! paths and queries, and the name checks that keep a user's argument from reshaping a path.

use std::fmt::Write as _;

use crate::error::Error;

/// The API group of the SmolVM custom resource.
pub const GROUP: &str = "vm.smolvm.dev";
/// The version of the SmolVM custom resource.
pub const VERSION: &str = "v1alpha1";
/// The kind of the SmolVM custom resource.
pub const KIND: &str = "SmolVM";
/// The plural (resource name) of the SmolVM custom resource.
pub const PLURAL: &str = "smolvms";
/// The API group of the aggregated subresources (log, exec, files).
pub const SUBRESOURCE_GROUP: &str = "subresources.vm.smolvm.dev";
/// The version of the aggregated subresources.
pub const SUBRESOURCE_VERSION: &str = "v1alpha1";

/// What `kubectl get` calls a SmolVM in its output: `smolvm.vm.smolvm.dev/NAME`.
pub fn display_name(name: &str) -> String {
    format!("smolvm.{GROUP}/{name}")
}

/// Which log `logs` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogSource {
    /// The machine's serial console (boot messages, the kernel, the init system).
    Console,
    /// The workload's own output.
    Workload,
}

impl LogSource {
    /// The query value the server takes.
    pub fn as_str(self) -> &'static str {
        match self {
            LogSource::Console => "console",
            LogSource::Workload => "workload",
        }
    }
}

/// The query of a `log` request; `None` and `false` are left out of the query.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogQuery {
    /// Keep the answer open and send new lines as they are written.
    pub follow: bool,
    /// Start this many lines before the end.
    pub tail_lines: Option<u64>,
    /// Which log.
    pub source: Option<LogSource>,
}

/// The path of a SmolVM's subresource: `/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/NS/smolvms/NAME/SUB`.
/// `namespace` and `name` must have passed [`check_namespace`] and [`check_name`].
pub fn subresource_path(namespace: &str, name: &str, subresource: &str) -> String {
    format!("/apis/{SUBRESOURCE_GROUP}/{SUBRESOURCE_VERSION}/namespaces/{namespace}/{PLURAL}/{name}/{subresource}")
}

/// The URL (path and query) of a `log` request.
pub fn log_url(namespace: &str, name: &str, query: &LogQuery) -> String {
    let mut params: Vec<(&str, String)> = Vec::new();
    if query.follow {
        params.push(("follow", "true".into()));
    }
    if let Some(n) = query.tail_lines {
        params.push(("tailLines", n.to_string()));
    }
    if let Some(source) = query.source {
        params.push(("source", source.as_str().into()));
    }
    with_query(subresource_path(namespace, name, "log"), &params)
}

/// The URL of an `exec` request.
pub fn exec_url(namespace: &str, name: &str) -> String {
    subresource_path(namespace, name, "exec")
}

/// The URL of a `files` request for `path` (absolute, in the machine), with the file mode to
/// write (`0644`) for an upload.
pub fn files_url(namespace: &str, name: &str, path: &str, mode: Option<&str>) -> String {
    let mut params = vec![("path", path.to_string())];
    if let Some(mode) = mode {
        params.push(("mode", mode.to_string()));
    }
    with_query(subresource_path(namespace, name, "files"), &params)
}

fn with_query(mut url: String, params: &[(&str, String)]) -> String {
    for (i, (key, value)) in params.iter().enumerate() {
        url.push(if i == 0 { '?' } else { '&' });
        url.push_str(key);
        url.push('=');
        url.push_str(&encode_query_value(value));
    }
    url
}

/// Percent-encodes a query value: every byte but the unreserved characters (`A-Z a-z 0-9 - . _ ~`)
/// and `/` becomes `%XX` (UTF-8 bytes, upper-case hex).
pub fn encode_query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// Whether `name` is a DNS-1123 subdomain, as Kubernetes checks object names (the operator's
/// own check, `smolvm_api::syntax::check_dns1123_subdomain`).
pub fn is_dns1123_subdomain(name: &str) -> bool {
    smolvm_api::syntax::check_dns1123_subdomain(name).is_ok()
}

/// Whether `name` is a DNS-1123 label, as Kubernetes checks namespace names: a subdomain of one
/// part, at most 63 characters.
pub fn is_dns1123_label(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && is_dns1123_subdomain(name)
}

/// Checks a SmolVM name given on the command line.
pub fn check_name(name: &str) -> Result<(), Error> {
    if is_dns1123_subdomain(name) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "invalid SmolVM name {name:?}: a name is lower-case letters, digits, '-' and '.' (a DNS-1123 subdomain)"
        )))
    }
}

/// Checks a namespace given with `-n` or taken from the kubeconfig.
pub fn check_namespace(namespace: &str) -> Result<(), Error> {
    if is_dns1123_label(namespace) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "invalid namespace {namespace:?}: a namespace is lower-case letters, digits and '-' (a DNS-1123 label)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_urls() {
        let base = "/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/default/smolvms/web/log";
        let cases = [
            (LogQuery::default(), base.to_string()),
            (
                LogQuery {
                    follow: true,
                    ..Default::default()
                },
                format!("{base}?follow=true"),
            ),
            (
                LogQuery {
                    tail_lines: Some(0),
                    ..Default::default()
                },
                format!("{base}?tailLines=0"),
            ),
            (
                LogQuery {
                    follow: true,
                    tail_lines: Some(20),
                    source: Some(LogSource::Workload),
                },
                format!("{base}?follow=true&tailLines=20&source=workload"),
            ),
            (
                LogQuery {
                    source: Some(LogSource::Console),
                    ..Default::default()
                },
                format!("{base}?source=console"),
            ),
        ];
        for (query, want) in cases {
            assert_eq!(log_url("default", "web", &query), want, "{query:?}");
        }
    }

    #[test]
    fn exec_and_files_urls() {
        assert_eq!(
            exec_url("team-a", "db.v2"),
            "/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/team-a/smolvms/db.v2/exec"
        );
        let cases = [
            ("/etc/hostname", None, "?path=/etc/hostname"),
            ("/tmp/a b&c=d", Some("0644"), "?path=/tmp/a%20b%26c%3Dd&mode=0644"),
            ("/data/é", None, "?path=/data/%C3%A9"),
            ("/x?y#z+%", Some("0755"), "?path=/x%3Fy%23z%2B%25&mode=0755"),
        ];
        for (path, mode, want) in cases {
            assert_eq!(
                files_url("default", "web", path, mode),
                format!("/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/default/smolvms/web/files{want}")
            );
        }
    }

    #[test]
    fn query_encoding_keeps_only_unreserved_and_slash() {
        let cases = [
            ("AZaz09-._~/", "AZaz09-._~/"),
            (" ", "%20"),
            ("a:b@c", "a%3Ab%40c"),
            ("\n\0", "%0A%00"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(encode_query_value(input), want, "{input:?}");
        }
    }

    #[test]
    fn dns1123_names() {
        let subdomains = [
            ("web", true),
            ("web-1", true),
            ("db.v2", true),
            ("a", true),
            ("0", true),
            ("", false),
            ("Web", false),
            ("-web", false),
            ("web-", false),
            ("a..b", false),
            (".a", false),
            ("a/b", false),
            ("a_b", false),
            ("a?b", false),
        ];
        for (name, want) in subdomains {
            assert_eq!(is_dns1123_subdomain(name), want, "{name:?}");
            assert_eq!(check_name(name).is_ok(), want, "{name:?}");
        }
        assert!(is_dns1123_subdomain(&["a".repeat(63), "b".repeat(63)].join(".")));
        // Kubernetes limits the whole name, not each part: a SmolVM may be named so.
        assert!(is_dns1123_subdomain(&"a".repeat(64)));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(!is_dns1123_subdomain(&vec!["a".repeat(63); 4].join(".")));
        assert!(check_namespace("kube-system").is_ok());
        assert!(check_namespace("a.b").is_err());
        assert!(check_namespace(&"a".repeat(64)).is_err());
    }

    #[test]
    fn display_names_read_like_kubectl() {
        assert_eq!(display_name("web"), "smolvm.vm.smolvm.dev/web");
    }
}
