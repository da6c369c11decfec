//! What the runner records (next commit).
