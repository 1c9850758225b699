//! kiln-runtime
