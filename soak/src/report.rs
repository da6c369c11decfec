//! The lines a run ends with (next commit).
