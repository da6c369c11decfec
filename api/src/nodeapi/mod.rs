//! The node API between the controller and the runtime agents: JSON over HTTPS with mutual TLS
//! and a bearer token, version [`API_PREFIX`].
//!
//! - [`contract`]: the table of operations ([`Operation`]): method, path template, request and
//!   answer, and the stable name used in metric and log labels. The controller's client, the
//!   agent's router and its metrics, and the access API derive their paths from it.
//! - [`wire`]: the JSON bodies and the error body with its stable [`ErrorCode`].
//! - [`channel`]: the interactive exec stream (Kubernetes' channel protocol over a WebSocket).
//!
//! Every failure is a [`NodeApiError`] body with a stable [`ErrorCode`].

pub mod channel;
pub mod contract;
pub mod wire;

pub use contract::{JsonCall, Method, Operation, Payload, Segment, calls};
pub use wire::*;
