//! Turns the parsed model back into tokens; file names mirror `parse/`.

pub mod body;
pub mod comptime_struct;
pub mod kernel;
pub mod signature;
