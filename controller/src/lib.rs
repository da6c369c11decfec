//! The SmolVM controller: placement, binding, lifecycle, node-aware finalizers and runtime certificate signing.
