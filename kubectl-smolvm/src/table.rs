//! Tables as kubectl prints them: upper-case headers, columns padded as kubectl's tab writer
//! pads them (each column as wide as its widest cell plus three spaces, at least six), the last
//! column unpadded; and ages as kubectl's AGE column writes them (`45s`, `5m`, `3h`, `2d4h`).

use std::io::Write;

use crate::error::Error;

/// The narrowest a column is, padding included (kubectl's tab writer's minimum width).
const MIN_WIDTH: usize = 6;
/// The spaces after a column's widest cell.
const PADDING: usize = 3;

/// What a cell says when the server gave no value, as kubectl's custom columns say it.
pub const NONE: &str = "<none>";

/// The table of `header` and `rows`, one line each (every line ends with a newline, and no line
/// with spaces). Every row has as many cells as the header; a missing cell is empty.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let lines = std::iter::once(header.iter().map(|h| h.to_string()).collect::<Vec<_>>()).chain(rows.iter().cloned());
    for line in lines {
        let mut text = String::new();
        for (i, width) in widths.iter().enumerate() {
            let cell = line.get(i).map(String::as_str).unwrap_or("");
            text.push_str(cell);
            if i + 1 < columns {
                let pad = (width + PADDING).max(MIN_WIDTH) - cell.chars().count();
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// Writes a rendered table on stdout; a reader that went away (`| head`) is not an error.
pub fn print(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::Stdio("write stdout", e)),
        _ => Ok(()),
    }
}

/// The AGE of an object created at `created`, at `now`, as kubectl writes it (its
/// `HumanDuration`): `<unknown>` without a creation time, `<invalid>` for one more than a second
/// in the future (clocks a little apart read `0s`).
pub fn age(created: Option<jiff::Timestamp>, now: jiff::Timestamp) -> String {
    match created {
        Some(created) => human_duration(now.duration_since(created).as_secs()),
        None => "<unknown>".to_string(),
    }
}

/// kubectl's `HumanDuration` of a whole number of seconds.
fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return with_rest(minutes, "m", seconds % 60, "s");
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return with_rest(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return with_rest(hours / 24, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return with_rest(hours / 24 / 365, "y", hours / 24 % 365, "d");
    }
    format!("{}y", hours / 24 / 365)
}

/// `5m`, or `5m30s` when the rest is not zero.
fn with_rest(whole: i64, unit: &str, rest: i64, rest_unit: &str) -> String {
    if rest == 0 {
        format!("{whole}{unit}")
    } else {
        format!("{whole}{unit}{rest}{rest_unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cells: &[&str]) -> Vec<String> {
        cells.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn columns_pad_like_kubectl() {
        let text = render(
            &["NAME", "PHASE", "TOOK"],
            &[
                row(&["web-x7k2p", "Running", "412 ms"]),
                row(&["web-9fq3d", "Failed", "-"]),
            ],
        );
        assert_eq!(
            text,
            "NAME        PHASE     TOOK\n\
             web-x7k2p   Running   412 ms\n\
             web-9fq3d   Failed    -\n"
        );
        // A narrow column is still six wide; empty trailing cells leave no trailing spaces.
        let text = render(&["A", "B", "C"], &[row(&["x", "", ""]), row(&["y", "z"])]);
        assert_eq!(text, "A     B     C\nx\ny     z\n");
        // Width counts characters, not bytes.
        let text = render(&["N", "M"], &[row(&["é", "1"])]);
        assert_eq!(text, "N     M\né     1\n");
        assert_eq!(render(&["ONLY"], &[]), "ONLY\n");
    }

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (59, "59s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (599, "9m59s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 25 * 60, "3h25m"),
            (8 * 3600, "8h"),
            (47 * 3600 + 3599, "47h"),
            (48 * 3600, "2d"),
            (50 * 3600, "2d2h"),
            (8 * 86_400, "8d"),
            (729 * 86_400, "729d"),
            (730 * 86_400, "2y"),
            (731 * 86_400, "2y1d"),
            (8 * 365 * 86_400, "8y"),
        ];
        let now = jiff::Timestamp::from_second(1_000_000_000).expect("a time");
        for (seconds, want) in cases {
            let created = now - jiff::SignedDuration::from_secs(seconds);
            assert_eq!(age(Some(created), now), want, "{seconds}s");
        }
        assert_eq!(age(None, now), "<unknown>");
    }
}
