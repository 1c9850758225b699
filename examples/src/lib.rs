//! kiln-examples
