//! kiln-tests
