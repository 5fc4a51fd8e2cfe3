//! The metrics each component exports, written out by its unit tests for the monitoring
//! checks (tests/monitoring): every metric an alert rule or a dashboard query uses must be
//! in some component's output, and the list comes from the code, not from a hand-kept file.

use std::path::PathBuf;

/// Where the dumps go: `ASYA_METRICS_DUMP_DIR` (`make unit` sets it); unset, nothing is
/// written.
pub const DUMP_DIR_ENV: &str = "ASYA_METRICS_DUMP_DIR";

/// Writes `text` (a Prometheus text exposition) as `<dir>/<component>.prom` when
/// [`DUMP_DIR_ENV`] is set. Returns the path written.
pub fn write(component: &str, text: &str) -> std::io::Result<Option<PathBuf>> {
    let Some(dir) = std::env::var_os(DUMP_DIR_ENV) else {
        return Ok(None);
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{component}.prom"));
    std::fs::write(&path, text)?;
    Ok(Some(path))
}
