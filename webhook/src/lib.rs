//! The mutating and validating admission webhook server (axum, axum-server, rustls).
