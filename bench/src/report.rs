//! What every result file carries (commit, GPU, driver, date), a text table, and writing the
//! JSON file.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use kiln_runtime::Device;

use crate::error::BenchError;
use crate::json::Json;

/// The commit the benchmark binary was built from (`-dirty` if the tree had changes).
pub const COMMIT: &str = env!("KILN_COMMIT");

/// The run's metadata as a JSON object: commit, GPU, compute capability, driver, target, date.
pub fn meta(device: &Device, benchmark: &str) -> Json {
    let (major, minor) = device.compute_capability();
    Json::obj([
        ("benchmark", Json::str(benchmark)),
        ("commit", Json::str(COMMIT)),
        ("gpu", Json::str(device.name())),
        ("compute_capability", Json::str(format!("{major}.{minor}"))),
        (
            "driver_cuda_version",
            Json::from(device.driver_version() as f64),
        ),
        ("kiln_target", Json::str(device.target().name())),
        ("date_utc", Json::str(utc_now())),
    ])
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    utc_from_unix(secs)
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian calendar).
pub fn utc_from_unix(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Writes `json` to `path`, creating its directory, and says so on stderr.
pub fn write_json(path: &Path, json: &Json) -> Result<(), BenchError> {
    let write = || {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, format!("{json}\n"))
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
    fn dates_from_unix_seconds() {
        assert_eq!(utc_from_unix(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_from_unix(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_from_unix(1_798_286_399), "2026-12-26T11:59:59Z");
    }

    #[test]
    fn table_right_aligns_columns() {
        let mut t = Table::new(&["shape", "ms"]);
        t.row(vec!["1024".into(), "0.5".into()]);
        t.row(vec!["8".into(), "12.25".into()]);
        assert_eq!(t.render(), "shape     ms\n 1024    0.5\n    8  12.25");
    }
}
