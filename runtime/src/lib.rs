//! The node-local runtime agent: supervises smolvm serve and serves the node API over mTLS.
