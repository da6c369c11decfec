//! smolvm streams logs as server-sent events; the node API serves plain text lines. This turns
//! the one into the other: each `data:` field becomes a line, other fields (`event:`, `id:`,
//! `retry:`) and comments are dropped, as the SSE specification reads them; a last line the
//! stream ends without finishing is not dispatched, as the specification says.

use bytes::{Bytes, BytesMut};

/// Longest line kept whole; a longer one is cut there (a log line is never this long, a broken
/// stream without newlines must not grow the buffer without end).
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Decodes an SSE byte stream into text lines, chunk by chunk.
#[derive(Debug, Default)]
pub struct SseLines {
    pending: BytesMut,
}

impl SseLines {
    /// Feeds a chunk; returns the text of the whole lines it completed (possibly empty).
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        self.pending.extend_from_slice(chunk);
        let mut out = BytesMut::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line = self.pending.split_to(end + 1);
            take_line(&line[..end], &mut out);
        }
        while self.pending.len() > MAX_LINE_BYTES {
            // The rest of a cut line has no field name and is dropped with it.
            let line = self.pending.split_to(MAX_LINE_BYTES);
            take_line(&line, &mut out);
        }
        out.freeze()
    }
}

fn take_line(line: &[u8], out: &mut BytesMut) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if let Some(data) = line.strip_prefix(b"data:") {
        let data = data.strip_prefix(b" ").unwrap_or(data);
        out.extend_from_slice(data);
        out.extend_from_slice(b"\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_fields_become_lines_and_the_rest_is_dropped() {
        let cases: &[(&[&str], &str)] = &[
            (&["data: hello\n\n"], "hello\n"),
            (&["data:no space\r\n\r\n"], "no space\n"),
            (&[": keep-alive\n", "event: log\nid: 7\ndata: a\n\n"], "a\n"),
            (&["data: spl", "it across\n", "data: two\n"], "split across\ntwo\n"),
            (&["data: \n"], "\n"),
            (&["data: one\n", "data: cut off"], "one\n"),
        ];
        for (chunks, want) in cases {
            let mut lines = SseLines::default();
            let mut got = Vec::new();
            for chunk in *chunks {
                got.extend_from_slice(&lines.push(chunk.as_bytes()));
            }
            assert_eq!(String::from_utf8_lossy(&got), *want, "{chunks:?}");
        }
    }

    #[test]
    fn a_line_without_end_is_cut_not_buffered_forever() {
        let mut lines = SseLines::default();
        let mut long = b"data: ".to_vec();
        long.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES * 2));
        let out = lines.push(&long);
        assert!(!out.is_empty());
        assert!(lines.pending.len() <= MAX_LINE_BYTES);
    }
}
