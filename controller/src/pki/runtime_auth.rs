//! The node API bearer token: the `smolvm-runtime-auth` Secret, created once with a random token
//! when absent (never a fixed default), and re-read so an administrator can replace it.
//!
//! The runtimes mount the same Secret as a file and re-read it on change; the controller reads it
//! through the API, so it needs no volume and sees a replacement within [`REFRESH`].

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::api::{Api, ObjectMeta, PostParams};

use crate::{nodeclient::BearerToken, pki::SignerError};

/// The key of the token in the Secret.
pub const TOKEN_KEY: &str = "token";
/// How often the Secret is re-read for a replaced token.
pub const REFRESH: Duration = Duration::from_secs(30);
/// Random bytes in a generated token (hex-encoded, so 64 characters).
const TOKEN_BYTES: usize = 32;

/// A fresh random token: 32 bytes from the OS, hex-encoded.
pub fn generate_token() -> Result<String, SignerError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| SignerError::Random(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The token in a Secret: its `token` key, trimmed; an error names the Secret and what is wrong.
pub fn token_of(secret: &Secret, name: &str) -> Result<String, SignerError> {
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(TOKEN_KEY))
        .ok_or_else(|| SignerError::BadToken(format!("Secret {name} has no key `{TOKEN_KEY}`")))?;
    let text = std::str::from_utf8(&raw.0)
        .map_err(|_| SignerError::BadToken(format!("Secret {name} key `{TOKEN_KEY}` is not UTF-8")))?
        .trim();
    if text.is_empty() {
        return Err(SignerError::BadToken(format!(
            "Secret {name} key `{TOKEN_KEY}` is empty"
        )));
    }
    Ok(text.to_string())
}

/// Loads the token from the Secret, creating the Secret with a random token if it is absent.
/// When two replicas race, the loser of the create (409) loads the winner's token.
pub async fn ensure_token(secrets: &Api<Secret>, name: &str) -> Result<String, SignerError> {
    if let Some(existing) = secrets.get_opt(name).await? {
        return token_of(&existing, name);
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/part-of".to_string(),
                "smolvm-operator".to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            TOKEN_KEY.to_string(),
            ByteString(generate_token()?.into_bytes()),
        )])),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(created) => {
            tracing::info!(secret = name, "generated a random node API token");
            token_of(&created, name)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => token_of(&secrets.get(name).await?, name),
        Err(e) => Err(e.into()),
    }
}

/// Re-reads the Secret every [`REFRESH`] and swaps a replaced token into `slot` (which keeps the
/// old one for runtimes that have not yet seen the new). A missing or broken Secret keeps the
/// current token and logs why.
pub async fn refresh(secrets: Api<Secret>, name: String, slot: Arc<BearerToken>) {
    let mut tick = tokio::time::interval(REFRESH);
    tick.tick().await;
    loop {
        tick.tick().await;
        let fresh = match secrets.get_opt(&name).await {
            Ok(Some(secret)) => token_of(&secret, &name),
            Ok(None) => Err(SignerError::BadToken(format!("Secret {name} was deleted"))),
            Err(e) => Err(e.into()),
        };
        match fresh {
            Ok(token) => {
                if slot.replace(token) {
                    tracing::info!(secret = %name, "node API token replaced; the old one is retried for 10 minutes");
                }
            }
            Err(e) => tracing::warn!(secret = %name, error = %e, "keeping the previous node API token"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(data: Option<&[u8]>) -> Secret {
        Secret {
            data: data.map(|d| BTreeMap::from([(TOKEN_KEY.to_string(), ByteString(d.to_vec()))])),
            ..Default::default()
        }
    }

    #[test]
    fn generated_tokens_are_64_hex_characters_and_differ() {
        let a = generate_token().expect("random");
        let b = generate_token().expect("random");
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    type Case = (Option<&'static [u8]>, Result<&'static str, &'static str>);

    #[test]
    fn token_of_trims_and_names_what_is_wrong() {
        let cases: [Case; 5] = [
            (Some(b"abc\n"), Ok("abc")),
            (Some(b"  x y "), Ok("x y")),
            (Some(b" \n"), Err("Secret s key `token` is empty")),
            (Some(&[0xff, 0xfe]), Err("Secret s key `token` is not UTF-8")),
            (None, Err("Secret s has no key `token`")),
        ];
        for (data, want) in cases {
            let got = token_of(&secret(data), "s").map_err(|e| e.to_string());
            match want {
                Ok(t) => assert_eq!(got.as_deref(), Ok(t)),
                Err(m) => assert!(got.as_ref().is_err_and(|e| e.contains(m)), "{got:?} lacks {m}"),
            }
        }
    }
}
