//! What the three smolvm-operator binaries (`smolvm-webhook`, `smolvm-controller`,
//! `smolvm-runtime`) share, so that they look alike from outside and carry one copy of the
//! plumbing, as kubert does for linkerd's controllers:
//!
//! - [`accept`]: the connection, handshake and handshake-time bounds of a TLS listener, in all
//!   and per source address ([`shares`]);
//! - [`backoff`]: the one retry backoff (failures in a row per key, a doubling schedule);
//! - [`causes`]: an error's whole chain, and the clock trouble a TLS failure hides in it (a
//!   host set behind sees fresh certificates as not valid yet);
//! - [`http2`]: HTTP/2 windows from a memory budget, and the idle timeout of a connection;
//! - [`limits`]: the listener flags every binary takes (same names), checked into bounds;
//! - [`serve`]: the accept loop of the TLS listeners, and HTTP over it for the node API and the
//!   access API;
//! - [`client`]: the Kubernetes client, whose `User-Agent` names the binary (and so its writes'
//!   field manager);
//! - [`cli`]: the flag vocabulary (`--ops-address`, `--log-format json|text`, durations such as
//!   `10s` parsed by one function) and the retired spellings, still accepted with a warning;
//! - [`log`]: the tracing set-up;
//! - [`shutdown`]: the signal that stops a binary (SIGTERM or Ctrl-C);
//! - [`ops`]: the plain-HTTP ops server (`/healthz`, `/readyz`, `/metrics`);
//! - [`watch`]: re-reading mounted files when their contents change;
//! - [`quota`]: charging a namespace's ResourceQuotas for what SmolVMs take (an optimistic write,
//!   retried on conflict), for the webhook and the controller alike;
//! - [`selfsigned`]: a CA and serving certificate in a shared Secret, injected as `caBundle`
//!   where the API server needs it, renewed and hot-swapped (the webhook, the access API).

pub mod accept;
pub mod backoff;
pub mod causes;
pub mod cli;
pub mod client;
pub mod error;
pub mod http2;
pub mod limits;
pub mod log;
pub mod ops;
pub mod quota;
pub mod selfsigned;
pub mod serve;
pub mod shares;
pub mod shutdown;
pub mod watch;

pub use error::{Error, Result};
