//! `kubectl smolvm cp`: one file into or out of a running SmolVM through the `files`
//! subresource. [`spec`] decides what the arguments mean; this module moves the bytes.

mod spec;

use std::path::{Path, PathBuf};

use http_body_util::BodyExt;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use spec::{DEFAULT_MODE, MAX_COPY_IN_BYTES, Spec, Transfer, format_mode, local_target, mode_of, plan, remote_target};

use crate::cli::{CpArgs, GlobalArgs};
use crate::client::{Cluster, build_request};
use crate::error::{Error, clean};
use crate::paths::{check_name, files_url};

/// The answer to a copy in.
#[derive(Debug, Deserialize)]
struct Written {
    /// How many bytes the server wrote.
    bytes: u64,
}

/// Copies one file as `cp SRC DST` asks.
pub async fn run(global: &GlobalArgs, args: &CpArgs) -> Result<(), Error> {
    match plan(&args.src, &args.dst)? {
        Transfer::Out { name, path, to } => {
            check_name(&name)?;
            copy_out(global, &name, &path, &to).await
        }
        Transfer::In { from, name, path } => {
            check_name(&name)?;
            let path = remote_target(&path, &from)?;
            let (bytes, local_mode) = read_source(&from).await?;
            let mode = args.mode.or(local_mode).unwrap_or(DEFAULT_MODE);
            copy_in(global, &name, &path, bytes, mode).await
        }
    }
}

async fn copy_out(global: &GlobalArgs, name: &str, path: &str, to: &Spec) -> Result<(), Error> {
    let target = match to {
        Spec::Local(dst) => Some(local_target(
            dst,
            tokio::fs::metadata(dst).await.is_ok_and(|m| m.is_dir()),
            path,
        )?),
        _ => None,
    };
    let cluster = Cluster::connect(global).await?;
    let url = files_url(cluster.namespace(), name, path, None);
    let response = cluster
        .send(build_request(http::Method::GET, &url, None, Vec::new())?)
        .await?;
    if is_json(response.headers()) {
        return Err(Error::IsDirectory {
            path: format!("{name}:{path}"),
        });
    }
    let body = response.into_body();
    match target {
        None => {
            let mut stdout = tokio::io::stdout();
            match write_body(body, &mut stdout).await {
                Err(BodyError::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                Err(BodyError::Write(e)) => Err(Error::Stdio("write stdout", e)),
                Err(BodyError::Read(e)) => Err(e),
                Ok(()) => Ok(()),
            }
        }
        Some(target) => {
            let mut file = tokio::fs::File::create(&target)
                .await
                .map_err(|e| local_io("create", &target, e))?;
            let written = write_body(body, &mut file).await;
            drop(file);
            if written.is_err() {
                // Leave no half-copied file behind.
                let _ = tokio::fs::remove_file(&target).await;
            }
            match written {
                Err(BodyError::Write(e)) => Err(local_io("write", &target, e)),
                Err(BodyError::Read(e)) => Err(e),
                Ok(()) => Ok(()),
            }
        }
    }
}

async fn copy_in(global: &GlobalArgs, name: &str, path: &str, bytes: Vec<u8>, mode: u32) -> Result<(), Error> {
    let sent = bytes.len() as u64;
    let cluster = Cluster::connect(global).await?;
    let url = files_url(cluster.namespace(), name, path, Some(&format_mode(mode)));
    let request = build_request(http::Method::POST, &url, Some("application/octet-stream"), bytes)?;
    let written: Written = cluster.request_json(request).await?;
    if written.bytes != sent {
        return Err(Error::UnexpectedResponse(format!(
            "the server wrote {} bytes of {sent} to {name}:{path}",
            written.bytes
        )));
    }
    Ok(())
}

/// Reads what a copy in sends, refusing more than [`MAX_COPY_IN_BYTES`] before anything is
/// sent; with the local file's mode, `None` for stdin.
async fn read_source(from: &Spec) -> Result<(Vec<u8>, Option<u32>), Error> {
    match from {
        Spec::Local(path) => {
            let metadata = tokio::fs::metadata(path).await.map_err(|e| local_io("read", path, e))?;
            if metadata.is_dir() {
                return Err(Error::InvalidArgument(format!(
                    "cp: {} is a directory; cp copies single files",
                    path.display()
                )));
            }
            let what = format!("file {}", path.display());
            if metadata.len() > MAX_COPY_IN_BYTES {
                return Err(Error::TooLarge {
                    what,
                    limit: MAX_COPY_IN_BYTES,
                });
            }
            let file = tokio::fs::File::open(path)
                .await
                .map_err(|e| local_io("open", path, e))?;
            let bytes = read_capped(file, &what).await.map_err(|e| e.at(path))?;
            Ok((bytes, Some(mode_of(&metadata))))
        }
        _ => {
            let bytes = read_capped(tokio::io::stdin(), "stdin")
                .await
                .map_err(|e| e.at(Path::new("-")))?;
            Ok((bytes, None))
        }
    }
}

/// A failure of [`read_capped`]: too much, or a read error still to be placed.
enum ReadError {
    TooLarge(Error),
    Io(std::io::Error),
}

impl ReadError {
    fn at(self, path: &Path) -> Error {
        match self {
            ReadError::TooLarge(e) => e,
            ReadError::Io(e) if path == Path::new("-") => Error::Stdio("read stdin", e),
            ReadError::Io(e) => local_io("read", path, e),
        }
    }
}

async fn read_capped(source: impl AsyncRead + Unpin, what: &str) -> Result<Vec<u8>, ReadError> {
    let mut bytes = Vec::new();
    source
        .take(MAX_COPY_IN_BYTES + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > MAX_COPY_IN_BYTES {
        return Err(ReadError::TooLarge(Error::TooLarge {
            what: what.to_string(),
            limit: MAX_COPY_IN_BYTES,
        }));
    }
    Ok(bytes)
}

/// A failure while copying an answer's body: reading it, or writing it out.
enum BodyError {
    Read(Error),
    Write(std::io::Error),
}

async fn write_body<W: AsyncWrite + Unpin>(mut body: kube::client::Body, out: &mut W) -> Result<(), BodyError> {
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| BodyError::Read(Error::Request(format!("the copy broke off: {}", clean(&e.to_string())))))?;
        if let Ok(data) = frame.into_data() {
            out.write_all(&data).await.map_err(BodyError::Write)?;
        }
    }
    out.flush().await.map_err(BodyError::Write)
}

/// Whether an answer is JSON: how the server answers a path that is a directory.
fn is_json(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

fn local_io(action: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::LocalIo {
        action,
        path: PathBuf::from(path),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_answer_json() {
        let cases = [
            (Some("application/json"), true),
            (Some("application/json; charset=utf-8"), true),
            (Some("Application/JSON"), true),
            (Some("application/octet-stream"), false),
            (Some("text/plain"), false),
            (None, false),
        ];
        for (content_type, want) in cases {
            let mut headers = http::HeaderMap::new();
            if let Some(value) = content_type {
                headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(value));
            }
            assert_eq!(is_json(&headers), want, "{content_type:?}");
        }
    }

    #[tokio::test]
    async fn reads_are_capped() {
        let small = read_capped(&b"hello"[..], "stdin").await.ok();
        assert_eq!(small.as_deref(), Some(&b"hello"[..]));
        let big = vec![0u8; usize::try_from(MAX_COPY_IN_BYTES).unwrap_or(usize::MAX) + 1];
        let err = read_capped(&big[..], "stdin")
            .await
            .err()
            .map(|e| e.at(Path::new("-")).reason());
        assert_eq!(err, Some("TooLarge"));
    }

    #[tokio::test]
    async fn a_local_directory_is_not_sent() {
        let dir = std::env::temp_dir();
        let err = read_source(&Spec::Local(dir)).await.err().map(|e| e.reason());
        assert_eq!(err, Some("InvalidArgument"));
        let missing = read_source(&Spec::Local("/nonexistent/kubectl-smolvm-test".into())).await;
        assert_eq!(missing.err().map(|e| e.reason()), Some("LocalIo"));
    }
}
