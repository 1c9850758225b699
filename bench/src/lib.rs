//! Shared parts of kiln's benchmark binaries.
