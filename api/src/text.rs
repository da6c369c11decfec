//! Text from other programs, made fit for users.
//!
//! smolvm (and any other child process) writes messages for a terminal: ANSI colour codes,
//! `2026-11-22T12:42:15Z WARN target:` log prefixes, several lines, and no length limit.
//! [`clean_external`] turns such a message into the text a condition, an event, a log field or a
//! node API answer carries: no escape sequences or control characters, no log-line prefixes,
//! whitespace collapsed, bounded in length, the cause kept. The same failure cleans to the same
//! text on every retry (timestamps go), so a retry loop writes no new condition message.

/// The longest cleaned message, in bytes. A condition message may hold 32 KiB; events and
/// `kubectl describe` read best far below that.
pub const MAX_EXTERNAL_TEXT: usize = 1024;

/// Clean a message from another program for conditions, events and API answers.
///
/// - ANSI escape sequences (CSI `ESC [ … final`, OSC `ESC ] … BEL|ESC \`, two-byte `ESC x`) and
///   every other control character are removed;
/// - log-line prefixes go: a timestamp (RFC 3339, or a date and a time) with the level word
///   (`TRACE`, `DEBUG`, `INFO`, `WARN`, `WARNING`, `ERROR`, `FATAL`) and `target:` after it,
///   wherever such a prefix starts (smolvm embeds its log lines in its error text); at the start
///   of a line, a timestamp or an upper-case level alone goes too;
/// - runs of whitespace (newlines included) become one space, and empty lines vanish;
/// - the result is at most [`MAX_EXTERNAL_TEXT`] bytes, cut at a character boundary with `…`.
pub fn clean_external(raw: &str) -> String {
    clean_external_bounded(raw, MAX_EXTERNAL_TEXT)
}

/// [`clean_external`] with a chosen bound (in bytes, at least 4).
pub fn clean_external_bounded(raw: &str, max: usize) -> String {
    let plain = strip_escapes(raw);
    let mut out = String::with_capacity(plain.len().min(max + 4));
    for line in plain.split(['\n', '\r']) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut i = 0;
        while i < words.len() {
            if let Some(next) = log_prefix_end(&words, i, i == 0) {
                i = next;
                continue;
            }
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(words[i]);
            i += 1;
        }
        if out.len() > max {
            break;
        }
    }
    truncate(out, max.max(4))
}

/// Removes ANSI escape sequences and control characters other than line breaks and tabs (kept
/// as separators for the line and whitespace passes).
fn strip_escapes(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.next() {
                // CSI: parameters and intermediates up to a final byte in @..~.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC (and the other string sequences): up to BEL or ESC \.
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' {
                            break;
                        }
                        if c == '\u{1b}' {
                            if chars.peek() == Some(&'\\') {
                                chars.next();
                            }
                            break;
                        }
                    }
                }
                // Two-byte sequences (ESC followed by one character), or a lone ESC at the end.
                _ => {}
            },
            // The C1 CSI introducer behaves like ESC [.
            '\u{9b}' => {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            '\n' | '\r' | '\t' => out.push(c),
            c if c.is_control() => {}
            // Zero-width and bidi formatting characters hide or reorder text in a terminal.
            '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}' => {}
            c => out.push(c),
        }
    }
    out
}

const LEVELS: [&str; 8] = ["TRACE", "DEBUG", "INFO", "WARN", "WARNING", "ERROR", "FATAL", "PANIC"];

/// If a log prefix starts at `words[i]`, the index of the first word after it. A prefix is a
/// timestamp then a level (then, optionally, a `target:`); at the start of a line a timestamp
/// alone, or an upper-case level alone, counts too.
fn log_prefix_end(words: &[&str], i: usize, line_start: bool) -> Option<usize> {
    let mut j = i;
    let mut timestamp = false;
    // env_logger's `[2026-11-25T15:11:13.188463Z ERROR krun_vmm::linux::vstate] message`.
    let bracketed = words.get(j).is_some_and(|w| w.starts_with('['));
    if let Some(w) = words.get(j).map(|w| w.strip_prefix('[').unwrap_or(w))
        && looks_like_timestamp(w)
    {
        j += 1;
        timestamp = true;
        // `2026-11-22 12:42:15`: a date, then the time as its own word.
        if w.len() == 10
            && let Some(t) = words.get(j)
            && looks_like_time(t)
        {
            j += 1;
        } else if w.len() == 10 {
            // A bare date is text, not a log prefix.
            return None;
        }
    }
    let level = words
        .get(j)
        .map(|w| w.trim_matches(|c| c == '[' || c == ']' || c == ':'));
    let is_level = level.is_some_and(|l| {
        LEVELS.contains(&l.to_ascii_uppercase().as_str()) && (timestamp || l == l.to_ascii_uppercase())
    });
    if !is_level {
        return (timestamp && line_start).then_some(j);
    }
    if !timestamp && !line_start {
        return None;
    }
    let level_closed = words.get(j).is_some_and(|w| w.ends_with(']'));
    j += 1;
    // The bracketed form's `target]` closes the prefix.
    if bracketed
        && timestamp
        && !level_closed
        && let Some(target) = words.get(j)
        && let Some(path) = target.strip_suffix(']')
        && !path.is_empty()
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-')
    {
        return Some(j + 1);
    }
    // tracing's `target: message`: a module path ending in ':' right after the level.
    if let Some(target) = words.get(j)
        && let Some(path) = target.strip_suffix(':')
        && !path.is_empty()
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-')
    {
        j += 1;
    }
    Some(j)
}

fn looks_like_time(word: &str) -> bool {
    let b = word.as_bytes();
    b.len() >= 8
        && b[..2].iter().all(u8::is_ascii_digit)
        && b[2] == b':'
        && b[3..5].iter().all(u8::is_ascii_digit)
        && b[5] == b':'
}

/// `2026-11-22T12:42:15Z`, `2026-11-22T12:42:15.123456+00:00`, `2026-11-22 12:42:15`: starts
/// with a date and carries a time.
fn looks_like_timestamp(word: &str) -> bool {
    let b = word.as_bytes();
    b.len() >= 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit)
        && (b.len() == 10 || b[10] == b'T' || b[10] == b't')
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let ellipsis = '…';
    let mut cut = max - ellipsis.len_utf8();
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s.push(ellipsis);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_what_programs_print() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "smolvm's start failure on a kvm_pvm host: env_logger's bracketed prefix",
                "failed to start machine: agent operation failed: monitor agent: [2026-11-25T15:11:13.188463Z ERROR krun_vmm::linux::vstate] Received KVM_EXIT_INTERNAL_ERROR signal (boot process exited (code 1) before the agent was ready)",
                "failed to start machine: agent operation failed: monitor agent: Received KVM_EXIT_INTERNAL_ERROR signal (boot process exited (code 1) before the agent was ready)",
            ),
            (
                "a bracketed timestamp and level without a target",
                "[2026-11-25T15:11:13Z INFO] ready",
                "ready",
            ),
            (
                "brackets that are not a log prefix stay",
                "value [not a prefix] kept",
                "value [not a prefix] kept",
            ),
            (
                "smolvm's start failure on these machines",
                "failed to start machine: \u{1b}[2m2026-11-22T12:42:15Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m \u{1b}[2msmolvm::agent\u{1b}[0m\u{1b}[2m:\u{1b}[0m boot process exited (code 1) before the agent was ready",
                "failed to start machine: boot process exited (code 1) before the agent was ready",
            ),
            (
                "a log prefix in the middle of a message",
                "failed to start machine: 2026-11-22T12:42:15Z  WARN smolvm::agent: boot process exited (code 1) before the agent was ready",
                "failed to start machine: boot process exited (code 1) before the agent was ready",
            ),
            (
                "a level word in a sentence stays",
                "the DEBUG build is slow",
                "the DEBUG build is slow",
            ),
            (
                "a log line on its own line",
                "failed to start machine\n\u{1b}[2m2026-11-22T12:42:15.123Z\u{1b}[0m ERROR smolvm::vm: no boot progress for 30 seconds\n",
                "failed to start machine no boot progress for 30 seconds",
            ),
            ("plain text stays", "machine not found", "machine not found"),
            ("whitespace collapses", "  a \t b\r\n\r\n c  ", "a b c"),
            ("control characters go", "a\u{0}b\u{7}c\u{7f}d", "abcd"),
            ("OSC title sequence goes", "\u{1b}]0;title\u{7}done", "done"),
            ("OSC with ST goes", "\u{1b}]8;;http://x\u{1b}\\link", "link"),
            ("C1 CSI goes", "\u{9b}31mred", "red"),
            ("bidi overrides go", "ab\u{202e}cd", "abcd"),
            (
                "a lowercase word is not a level",
                "error: disk full",
                "error: disk full",
            ),
            (
                "an upper-case level without timestamp goes",
                "WARN disk almost full",
                "disk almost full",
            ),
            ("a bracketed level goes", "2026-11-22 12:00:00 [ERROR] boom", "boom"),
            (
                "a date in the text stays",
                "image built 2026-11-22 is broken",
                "image built 2026-11-22 is broken",
            ),
            ("empty stays empty", "", ""),
            ("only escapes", "\u{1b}[0m\u{1b}[2m", ""),
            ("a lone trailing ESC", "abc\u{1b}", "abc"),
        ];
        for (name, raw, want) in cases {
            assert_eq!(clean_external(raw), *want, "{name}");
        }
    }

    #[test]
    fn the_same_failure_at_another_time_cleans_to_the_same_text() {
        let at = |t: &str| {
            format!("failed: \u{1b}[2m{t}\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m smolvm: boot process exited (code 1)")
        };
        assert_eq!(
            clean_external(&at("2026-11-22T12:42:15Z")),
            clean_external(&at("2026-11-23T01:02:03.456789Z"))
        );
    }

    #[test]
    fn length_is_bounded_at_a_character_boundary() {
        let long = "é".repeat(5000);
        let out = clean_external(&long);
        assert!(out.len() <= MAX_EXTERNAL_TEXT, "{}", out.len());
        assert!(out.ends_with('…'));
        let short = clean_external_bounded("abcdefgh", 6);
        assert_eq!(short, "abc…");
        assert!(short.len() <= 6);
    }

    #[test]
    fn cleaning_is_idempotent_and_never_panics() {
        let inputs = [
            "\u{1b}[",
            "\u{1b}]",
            "\u{1b}]\u{1b}",
            "2026-11-22T",
            "WARN",
            "2026-11-22T12:42:15Z WARN",
            "2026-11-22T12:42:15Z WARN a::b:",
            "\u{9b}",
        ];
        for raw in inputs {
            let once = clean_external(raw);
            assert_eq!(clean_external(&once), once, "{raw:?}");
            assert!(!once.chars().any(char::is_control), "{raw:?}");
        }
    }
}
