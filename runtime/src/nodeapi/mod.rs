//! The node API: JSON over HTTPS with mutual TLS and a bearer token.
//!
//! [`types`] re-exports the wire contract from `smolvm_api::nodeapi`; [`mapping`] maps
//! machines between the node API and the VMM, [`request_checks`] checks a call's input before
//! any machine is asked, and [`failure`] holds a failure as data and the refusals (all pure);
//! [`server`] is the axum router; [`stream`] bridges interactive exec
//! (Kubernetes' channel protocol) to the runtime; [`suspend`] suspends and resumes machines;
//! `pools` keeps warm pools and serves machines from them; `branches` makes a machine a
//! branch of a running one;
//! [`tls`] serves it over mTLS with a reloadable serving certificate and client CA; [`uploads`]
//! holds the budget of file uploads; `volumes` points machines at their holder Pods' volumes
//! ([`crate::volumes`]), and [`release`] is the holders' release hook, on a listener of its own.
//! The operations, their paths and their names come from the contract's table
//! ([`smolvm_api::nodeapi::Operation`]).

mod answer;
pub mod auth;
mod branches;
pub mod failure;
pub mod mapping;
pub(crate) mod pools;
pub mod release;
pub mod request_checks;
pub mod server;
mod state;
pub mod stream;
pub mod suspend;
pub mod tls;
pub mod types;
pub mod uploads;
mod volumes;

pub use server::{Identity, NodeApiState, router};
