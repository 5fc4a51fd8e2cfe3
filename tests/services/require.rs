//! Skip-or-fail for Rust tests that need the real servers of tests/services or tests/cluster.
//! Included by path (`#[path = ".../tests/services/require.rs"] mod require;`) from each
//! crate's integration tests, so the rule lives in one file.
//!
//! A plain `cargo test` without the servers runs the pure tests and skips the rest, saying
//! once per test binary how to run them. `make unit` exports `ASYA_REQUIRE_SERVICES=1`: there a
//! missing variable fails the test, so CI never passes by skipping.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Mutex;

/// Set by `make unit`: a test whose servers are not configured fails instead of skipping.
pub const REQUIRE: &str = "ASYA_REQUIRE_SERVICES";

/// The notices already printed: one per missing set of servers, not one per test.
static SAID: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// True when every variable in `vars` is set. Otherwise, under `ASYA_REQUIRE_SERVICES` it
/// panics; without it it prints a skip notice (once per binary and message) and returns
/// false, and the caller returns early. `what` names the servers (e.g. "RabbitMQ"), `how` the
/// command that sets the variables (e.g. "source tests/services/env").
pub fn services(what: &str, how: &str, vars: &[&str]) -> bool {
    let missing: Vec<&str> = vars
        .iter()
        .copied()
        .filter(|v| std::env::var_os(v).is_none())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let missing = missing.join(", ");
    if std::env::var_os(REQUIRE).is_some() {
        panic!("{missing} not set but {REQUIRE} is: these tests need {what}; run `{how}` first");
    }
    // Straight to the process's stderr: libtest captures only the print macros, and a skip
    // nobody sees would read as a pass.
    let notice = format!("skipped: needs {what} ({missing} not set); run `make unit` or `{how}`");
    let first = SAID
        .lock()
        .map(|mut said| said.insert(notice.clone()))
        .unwrap_or(true);
    if first {
        let _ = writeln!(std::io::stderr(), "{notice}");
    }
    false
}

/// Servers of tests/services (RabbitMQ, the SQS server, ...), named by `what`.
pub fn servers(what: &str, vars: &[&str]) -> bool {
    services(what, "source tests/services/env", vars)
}

/// The API server of tests/cluster.
pub fn cluster() -> bool {
    services(
        "the test cluster",
        "source tests/cluster/env",
        &["ASYA_TEST_KUBECONFIG"],
    )
}
