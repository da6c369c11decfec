//! The invariant checker over a history (next commit).
