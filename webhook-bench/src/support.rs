//! Shared by the benchmark binaries and the in-process handler bench: the realistic
//! AdmissionReview they send. Not used by the server.

use serde_json::{Value, json};

/// A realistic SmolVM CREATE review (~1.8 KB), as `kubectl apply` makes the API server send it.
pub fn review_json() -> Value {
    let mut object = smolvm_api::fixtures::alpine();
    let applied = serde_json::to_string(&object).unwrap_or_default();
    object["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/last-applied-configuration": applied});
    object["metadata"]["creationTimestamp"] = json!("2026-11-22T00:00:00Z");
    object["metadata"]["generation"] = json!(1);
    object["metadata"]["managedFields"] = json!([{
        "apiVersion": "vm.smolvm.dev/v1alpha1", "fieldsType": "FieldsV1", "manager": "kubectl-client-side-apply",
        "operation": "Update", "time": "2026-11-22T00:00:00Z",
        "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}}},
                     "f:spec": {".": {}, "f:image": {}, "f:network": {".": {}, "f:enabled": {}, "f:ports": {}}, "f:nodeSelector": {}, "f:resources": {}, "f:running": {}, "f:storage": {}}}
    }]);
    let gvk = json!({"group": "vm.smolvm.dev", "version": "v1alpha1", "kind": "SmolVM"});
    let gvr = json!({"group": "vm.smolvm.dev", "version": "v1alpha1", "resource": "smolvms"});
    json!({
        "kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4",
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": "alpine", "namespace": "default", "operation": "CREATE",
            "userInfo": {"username": "alice@example.com", "uid": "f3a1c2d4-0000-4000-8000-000000000001", "groups": ["system:authenticated"]},
            "object": object, "oldObject": null, "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// The parse-and-echo floor's handler (SPEC section 9): parses the JSON, echoes the uid.
pub async fn floor_echo(body: axum::body::Bytes) -> axum::response::Response {
    use axum::{http::header, response::IntoResponse};
    let uid = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.pointer("/request/uid").cloned())
        .unwrap_or(Value::Null);
    let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": uid, "allowed": true}});
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(&out).unwrap_or_default(),
    )
        .into_response()
}

/// The parse-and-echo floor's router: `POST /echo`.
pub fn floor_router() -> axum::Router {
    axum::Router::new().route("/echo", axum::routing::post(floor_echo))
}

/// Wraps a TLS acceptor: sets TCP_NODELAY on connections that negotiated HTTP/2, as
/// smolvm-webhook does ([`smolvm_webhook::listener::nodelay_if_http2`]).
#[derive(Clone, Copy, Debug)]
pub struct H2NoDelay<A>(pub A);

impl<A, S> axum_server::accept::Accept<tokio::net::TcpStream, S> for H2NoDelay<A>
where
    A: axum_server::accept::Accept<
            tokio::net::TcpStream,
            S,
            Stream = tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        >,
    A::Future: Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = A::Stream;
    type Service = A::Service;
    type Future = futures::future::BoxFuture<'static, std::io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: tokio::net::TcpStream, service: S) -> Self::Future {
        let accepted = self.0.accept(stream, service);
        Box::pin(async move {
            let (tls, service) = accepted.await?;
            smolvm_webhook::listener::nodelay_if_http2(&tls);
            Ok((tls, service))
        })
    }
}
