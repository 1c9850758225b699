//! kiln-cli
