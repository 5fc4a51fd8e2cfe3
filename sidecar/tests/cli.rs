//! The binary's start-up contract; needs no broker.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn sidecar() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_asya-sidecar"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    c
}

#[test]
fn bad_settings_stop_the_start_naming_the_variable() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[], "ASYA_ACTOR_NAME"),
        (&[("ASYA_ACTOR_NAME", "a")], "ASYA_TRANSPORT"),
        (
            &[("ASYA_ACTOR_NAME", "a"), ("ASYA_TRANSPORT", "rabbitmq")],
            "ASYA_RABBITMQ_URL",
        ),
        (
            &[
                ("ASYA_ACTOR_NAME", "a"),
                ("ASYA_TRANSPORT", "sqs"),
                ("ASYA_SQS_REGION", "x"),
                (
                    "ASYA_RESILIENCY",
                    "{\"policies\":{\"p\":{\"maxAttempts\":0}}}",
                ),
            ],
            "ASYA_RESILIENCY: policies.p.maxAttempts",
        ),
    ];
    for (env, expect) in cases {
        let out = sidecar().envs(env.iter().copied()).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{env:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{env:?}: {err}");
    }
}

#[test]
fn install_runtime_writes_the_embedded_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = sidecar()
        .arg("install-runtime")
        .arg(dir.path().join("opt"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let written = std::fs::read_to_string(dir.path().join("opt/asya_runtime.py")).unwrap();
    let source =
        std::fs::read_to_string(common::root().join("sidecar/runtime/asya_runtime.py")).unwrap();
    assert_eq!(written, source);
}

#[test]
fn probes_report_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = sidecar()
        .env("ASYA_ACTOR_NAME", "a")
        .env("ASYA_TRANSPORT", "rabbitmq")
        // Nothing listens on port 1: the broker is unreachable, and so is the runtime.
        .env("ASYA_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:1/%2f")
        .env("ASYA_SOCKET_DIR", dir.path())
        .env("ASYA_METRICS_ADDR", format!("127.0.0.1:{port}"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let ready = loop {
        if let Some(r) = common::http_get(port, "/readyz") {
            break r;
        }
        assert!(Instant::now() < deadline, "no metrics server");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(ready.0, 503);
    assert!(ready.1.contains("runtime not reachable"), "{}", ready.1);
    assert_eq!(common::http_get(port, "/healthz").unwrap().0, 200);
    let metrics = common::http_get(port, "/metrics").unwrap();
    assert_eq!(metrics.0, 200);
    // SIGTERM while still waiting for the runtime: a clean exit.
    Command::new("kill")
        .arg("-15")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            assert!(s.success(), "{s}");
            break;
        }
        assert!(Instant::now() < deadline, "did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}
