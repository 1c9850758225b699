//! What every result file carries (commit, GPU, driver, date), a text table, and writing the
//! JSON file.

use std::path::Path;
use std::time::SystemTime;

use kiln_ir::dsl::Comptime;
use kiln_runtime::Device;
use serde_json::{Value, json};

use crate::error::BenchError;

/// The commit the benchmark binary was built from (`-dirty` if the tree had changes).
pub const COMMIT: &str = env!("KILN_COMMIT");

/// The run's metadata as a JSON object: commit, GPU, compute capability, driver, target, date.
pub fn meta(device: &Device, benchmark: &str) -> Value {
    let (major, minor) = device.compute_capability();
    json!({
        "benchmark": benchmark,
        "commit": COMMIT,
        "gpu": device.name(),
        "compute_capability": format!("{major}.{minor}"),
        "driver_cuda_version": device.driver_version(),
        "kiln_target": device.target().name(),
        "date_utc": humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
    })
}

/// A specialisation's comptime values as a row records them, `name=value,...` by name (the
/// order the result files have always had).
pub fn comptime_text<C: Comptime>(comptime: &C) -> String {
    let mut pairs: Vec<String> = C::PARAMS
        .iter()
        .zip(comptime.values())
        .map(|(p, v)| format!("{}={v}", p.name))
        .collect();
    pairs.sort();
    pairs.join(",")
}

/// Writes `json` (pretty-printed) to `path`, creating its directory, and says so on stderr.
pub fn write_json(path: &Path, json: &Value) -> Result<(), BenchError> {
    let write = || {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(json).map_err(std::io::Error::other)?;
        std::fs::write(path, text + "\n")
    };
    write().map_err(|source| BenchError::Io {
        path: path.display().to_string(),
        source,
    })?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// A text table with right-aligned columns.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (one cell per column).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, columns separated by two spaces.
    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                std::iter::once(&self.header)
                    .chain(&self.rows)
                    .map(|r| r.get(c).map_or(0, String::len))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        std::iter::once(&self.header)
            .chain(&self.rows)
            .map(|r| {
                let cells: Vec<String> = widths
                    .iter()
                    .enumerate()
                    .map(|(c, w)| format!("{:>w$}", r.get(c).map_or("", String::as_str)))
                    .collect();
                cells.join("  ")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_right_aligns_columns() {
        let mut t = Table::new(&["shape", "ms"]);
        t.row(vec!["1024".into(), "0.5".into()]);
        t.row(vec!["8".into(), "12.25".into()]);
        assert_eq!(t.render(), "shape     ms\n 1024    0.5\n    8  12.25");
    }
}
