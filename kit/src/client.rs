//! A binary's Kubernetes client: the configuration `Client::try_default` reads (in-cluster, or
//! the kubeconfig), sending a `User-Agent` that names the binary and its version. The API server
//! names each write's field manager after it, so a SmolVM's managedFields say
//! `smolvm-controller` where they said `unknown`, and audit logs and `apiserver_request_total`
//! tell the binaries apart.

use hyper::header::{HeaderValue, USER_AGENT};

/// The client of `binary` at `version` (`smolvm-controller`, `env!("CARGO_PKG_VERSION")`).
pub async fn client(binary: &str, version: &str) -> kube::Result<kube::Client> {
    let mut config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
    config.headers.push((USER_AGENT, user_agent(binary, version)?));
    kube::Client::try_from(config)
}

/// `binary/version`, the form the API server reads a field manager from (what precedes the `/`).
fn user_agent(binary: &str, version: &str) -> kube::Result<HeaderValue> {
    HeaderValue::from_str(&format!("{binary}/{version}")).map_err(|e| kube::Error::HttpError(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_agent_names_the_binary_before_its_version() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("smolvm-controller", "0.1.0", Some("smolvm-controller/0.1.0")),
            ("smolvm-runtime", "1.2.3-rc.1", Some("smolvm-runtime/1.2.3-rc.1")),
            ("bad\nname", "0.1.0", None),
        ];
        for (binary, version, want) in cases {
            let got = user_agent(binary, version).ok();
            assert_eq!(
                got.as_ref().and_then(|v| v.to_str().ok()),
                *want,
                "{binary:?} {version:?}"
            );
        }
    }
}
