//! kiln-macros
