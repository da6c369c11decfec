//! `kubectl smolvm logs`: the log subresource's answer, copied to stdout as it arrives.

use futures::{AsyncBufRead, AsyncBufReadExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::cli::{GlobalArgs, LogsArgs};
use crate::client::{Cluster, build_request};
use crate::error::{Error, clean};
use crate::paths::{LogQuery, check_name, log_url};

/// Prints the log, following it with `-f`; Ctrl-C ends the command without an error.
pub async fn run(global: &GlobalArgs, args: &LogsArgs) -> Result<(), Error> {
    check_name(&args.name)?;
    let query = LogQuery {
        follow: args.follow,
        tail_lines: args.tail,
        source: args.source,
    };
    let work = async {
        let cluster = Cluster::connect(global).await?;
        let url = log_url(cluster.namespace(), &args.name, &query);
        let body = cluster
            .request_stream(build_request(http::Method::GET, &url, None, Vec::new())?)
            .await?;
        copy_chunks(body, &mut tokio::io::stdout()).await
    };
    tokio::select! {
        result = work => result,
        () = interrupted() => Ok(()),
    }
}

/// Resolves on Ctrl-C; never, if the signal cannot be watched.
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Copies every chunk of `body` to `out` as it arrives, flushing each. A reader that went away
/// (`logs -f | head`) ends the copy without an error.
async fn copy_chunks<R, W>(body: R, out: &mut W) -> Result<(), Error>
where
    R: AsyncBufRead,
    W: AsyncWrite + Unpin,
{
    let mut body = std::pin::pin!(body);
    loop {
        let chunk = body
            .fill_buf()
            .await
            .map_err(|e| Error::Request(format!("the log stream broke off: {}", clean(&e.to_string()))))?;
        if chunk.is_empty() {
            return Ok(());
        }
        let len = chunk.len();
        let written = async {
            out.write_all(chunk).await?;
            out.flush().await
        }
        .await;
        match written {
            Ok(()) => body.consume_unpin(len),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(Error::Stdio("write stdout", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn copies_every_byte() {
        let input: &[u8] = b"boot ok\n\xffraw bytes\nlast line without newline";
        let mut out = Vec::new();
        copy_chunks(futures::io::Cursor::new(input), &mut out)
            .await
            .expect("copies");
        assert_eq!(out, input);
    }

    #[tokio::test]
    async fn a_closed_reader_ends_quietly() {
        let (reader_side, mut writer_side) = tokio::io::duplex(8);
        drop(reader_side);
        let result = copy_chunks(futures::io::Cursor::new(b"some log".as_slice()), &mut writer_side).await;
        assert!(result.is_ok(), "{result:?}");
    }
}
