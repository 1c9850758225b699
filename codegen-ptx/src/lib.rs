//! kiln-ptx
