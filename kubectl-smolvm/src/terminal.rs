//! The local terminal of `exec -t`: raw mode while a session runs (keys go to the remote
//! terminal as typed, Ctrl-C included), restored however the session ends, and its size.

use std::io::IsTerminal as _;

use rustix::termios::{self, OptionalActions, Termios};

/// Whether stdin is a terminal (a raw session needs one).
pub fn stdin_is_terminal() -> bool {
    std::io::stdin().is_terminal()
}

/// The terminal's size as (columns, rows), from stdout or else stdin; `None` when neither is a
/// terminal or it reports no size.
pub fn size() -> Option<(u16, u16)> {
    let from = |size: rustix::io::Result<termios::Winsize>| size.ok().map(|w| (w.ws_col, w.ws_row));
    from(termios::tcgetwinsize(std::io::stdout()))
        .filter(|&(c, r)| c > 0 && r > 0)
        .or_else(|| from(termios::tcgetwinsize(std::io::stdin())).filter(|&(c, r)| c > 0 && r > 0))
}

/// Raw mode on stdin for as long as this lives; the previous mode comes back on drop.
pub struct RawMode {
    original: Termios,
}

impl RawMode {
    /// Puts stdin's terminal in raw mode.
    pub fn enable() -> std::io::Result<Self> {
        let stdin = std::io::stdin();
        let original = termios::tcgetattr(&stdin)?;
        let mut raw = original.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, OptionalActions::Now, &raw)?;
        Ok(RawMode { original })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &self.original);
    }
}
