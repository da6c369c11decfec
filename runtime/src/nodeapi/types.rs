//! The node API wire contract lives in [`smolvm_api::nodeapi`], shared with the controller.

pub use smolvm_api::nodeapi::*;
