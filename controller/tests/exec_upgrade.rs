//! The controller's half of interactive exec: `NodeClient::upgrade` opens the node API's
//! WebSocket over real mTLS (HTTP/1.1 only, the token added, the client's handshake passed
//! through) and hands back the upgraded connection, which then carries Kubernetes' channel
//! protocol end to end. Behind the agent's real node API router runs `ScriptedRuntime`
//! (`smolvm_testkit::runtime_double`), a TEST DOUBLE of the runtime: no guest boots on these
//! machines, so no real command can answer.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use hyper::HeaderMap;
use smolvm_api::channel;
use smolvm_api::nodeapi::ErrorCode;
use smolvm_certs::ReloadableResolver;
use smolvm_controller::nodeclient::{
    BearerToken, CallError, ClientSettings, ClientTls, Endpoints, NodeClient, client_tls,
};
use smolvm_testkit::node::{NODE, Pki, TOKEN};
use smolvm_testkit::runtime_double::ScriptedRuntime;
use support::agent_and_client;
use tokio_tungstenite::tungstenite::{Message, handshake::derive_accept_key, protocol::Role};

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn handshake() -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("connection", "Upgrade"),
        ("upgrade", "websocket"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", KEY),
        ("sec-websocket-protocol", "v5.channel.k8s.io, v4.channel.k8s.io"),
    ] {
        headers.insert(name, value.parse().expect("header"));
    }
    headers
}

const SESSION: &str = "/v1/machines/running/exec?command=sh&stdin=true&stdout=true&tty=true";

#[tokio::test]
async fn the_upgrade_reaches_the_agent_and_carries_the_channel_protocol() {
    smolvm_testkit::node::init();
    let pki = Pki::new();
    let (_server, client) = agent_and_client(&pki, Arc::new(ScriptedRuntime::default()), TOKEN);
    let (headers, upgraded) = client
        .upgrade(NODE, SESSION, &handshake(), Duration::from_secs(10))
        .await
        .expect("the agent switches protocols");
    assert_eq!(headers["sec-websocket-protocol"], "v5.channel.k8s.io");
    assert_eq!(
        headers["sec-websocket-accept"].to_str().ok(),
        Some(derive_accept_key(KEY.as_bytes()).as_str()),
        "the agent answered the client's own handshake, so a relay of it is valid for the client"
    );
    let mut socket =
        tokio_tungstenite::WebSocketStream::from_raw_socket(hyper_util::rt::TokioIo::new(upgraded), Role::Client, None)
            .await;
    socket
        .send(Message::binary(channel::frame(channel::STDIN, b"hi \x00\xff")))
        .await
        .expect("send");
    let echoed = recv(&mut socket).await.expect("output");
    assert_eq!(
        echoed.as_ref(),
        b"\x01hi \x00\xff",
        "stdin out on stdout, byte for byte"
    );
    socket
        .send(Message::binary(channel::frame(channel::STDIN, b"exit 4")))
        .await
        .expect("send");
    let status = recv(&mut socket).await.expect("status");
    assert_eq!(status.first(), Some(&channel::STATUS));
    let status: serde_json::Value = serde_json::from_slice(&status[1..]).expect("JSON");
    assert_eq!(channel::exit_code_of(&status), Some(4), "{status}");
}

async fn recv<S>(socket: &mut tokio_tungstenite::WebSocketStream<S>) -> Option<Bytes>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match tokio::time::timeout(Duration::from_secs(10), socket.next()).await {
            Ok(Some(Ok(Message::Binary(bytes)))) => return Some(bytes),
            Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => return None,
            Ok(Some(Ok(_))) => {}
            Err(_) => panic!("no answer within 10 s"),
        }
    }
}

#[tokio::test]
async fn refusals_before_the_upgrade_are_the_agents_errors() {
    smolvm_testkit::node::init();
    let pki = Pki::new();
    let (_server, client) = agent_and_client(&pki, Arc::new(ScriptedRuntime::default()), TOKEN);
    let stopped = "/v1/machines/stopped/exec?command=sh&stdin=true&stdout=true&tty=true";
    match client
        .upgrade(NODE, stopped, &handshake(), Duration::from_secs(10))
        .await
    {
        Err(CallError::Api { status, code, .. }) => assert_eq!((status, code), (409, ErrorCode::MachineNotRunning)),
        other => panic!("a stopped machine: {:?}", other.map(|(h, _)| h)),
    }
    let (_server, stranger) = agent_and_client(&pki, Arc::new(ScriptedRuntime::default()), "another-token");
    match stranger
        .upgrade(NODE, SESSION, &handshake(), Duration::from_secs(10))
        .await
    {
        Err(CallError::Api { status, code, .. }) => assert_eq!((status, code), (401, ErrorCode::Unauthenticated)),
        other => panic!("a wrong token: {:?}", other.map(|(h, _)| h)),
    }
    let away = NodeClient::new(
        ClientSettings::standard(
            ClientTls::new(
                client_tls(
                    pki.ca.cert_pem(),
                    Arc::new(ReloadableResolver::from_pem(&pki.client_cert, &pki.client_key).expect("cert")),
                )
                .expect("TLS"),
            ),
            BearerToken::new(TOKEN.to_string()),
        ),
        Endpoints::default(),
    );
    match away.upgrade(NODE, SESSION, &handshake(), Duration::from_secs(10)).await {
        Err(error @ CallError::Unreachable { .. }) => assert!(error.is_unreachable()),
        other => panic!("a node with no endpoint: {:?}", other.map(|(h, _)| h)),
    }
}
