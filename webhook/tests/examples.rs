//! The user's documents as tests: every YAML example of the five seeds (deploy/examples/) is
//! accepted, and every bad example (tests/fixtures/invalid/) is refused with the exact error
//! lines its `# expect:` comments give — through the library and through the built binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use asya_api::ClusterConfig;
use asya_webhook::cmd::validate::{ObjectReport, read_documents, render, validate_documents};
use serde::Deserialize;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the webhook crate lives in the workspace")
        .to_path_buf()
}

fn examples() -> PathBuf {
    root().join("deploy/examples")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn load_config(relative: &str) -> ClusterConfig {
    let path = root().join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{relative}: {e}"));
    ClusterConfig::from_yaml(&text).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

fn validate_dir(dir: &Path, config: &ClusterConfig) -> Vec<ObjectReport> {
    let docs = read_documents(&[dir.to_path_buf()]).unwrap();
    validate_documents(&docs, config)
}

/// Number of reports per kind (the first word of `object`).
fn kinds(reports: &[ObjectReport]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in reports {
        let kind = r.object.split(' ').next().unwrap_or_default().to_string();
        *m.entry(kind).or_insert(0) += 1;
    }
    m
}

fn report<'a>(reports: &'a [ObjectReport], object: &str) -> &'a ObjectReport {
    reports
        .iter()
        .find(|r| r.object == object)
        .unwrap_or_else(|| panic!("{object} is not among the examples:\n{}", render(reports)))
}

#[test]
fn every_seed_example_is_accepted() {
    let reports = validate_dir(&examples(), &ClusterConfig::default());
    let text = render(&reports);
    assert!(reports.iter().all(ObjectReport::accepted), "{text}");

    let counts = kinds(&reports);
    assert_eq!(counts.get("AsyncActor"), Some(&41), "{text}");
    assert_eq!(counts.get("EnvironmentConfig"), Some(&20), "{text}");
    assert_eq!(counts.get("Flavor"), Some(&2), "{text}");
    assert_eq!(counts.get("ConfigMap"), Some(&1), "{text}");
    assert_eq!(reports.len(), 64, "{text}");

    // Every flavor an example lists exists among the examples.
    for r in &reports {
        assert!(
            !r.warnings.iter().any(|w| w.contains("not found")),
            "{}: {:?}",
            r.object,
            r.warnings
        );
    }

    // One example per seed, by name.
    for object in [
        "AsyncActor production/image-enhancer",
        "AsyncActor production/image-enhancer-full",
        "AsyncActor default/my-actor",
        "AsyncActor default/happy-end",
        "AsyncActor default/gpu-aggressive-actor",
        "AsyncActor asya/text-processor",
        "AsyncActor production/text-processor",
        "AsyncActor default/hello-actor",
        "Flavor gpu-inference",
        "Flavor llm-resilient",
        "EnvironmentConfig cpu-standard",
        "EnvironmentConfig gpu-t4",
        "ConfigMap production/team-openai-flavor",
    ] {
        report(&reports, object);
    }
    // The conflicting pair of seed 002 is an invalid fixture, not an example.
    assert!(
        !reports.iter().any(|r| r.object.contains("flavor-a")),
        "{text}"
    );

    // The deprecated flavor says so; aliases are rewritten with a warning.
    let t4 = report(&reports, "AsyncActor default/gpu-t4-actor");
    assert_eq!(
        t4.warnings,
        vec![r#"flavor "gpu-t4" is deprecated: Use gpu-a100 instead"#.to_string()]
    );
    let complete = report(&reports, "AsyncActor production/text-processor");
    for w in [
        "spec.scaling.minReplicas is deprecated: rewritten to spec.scaling.minReplicaCount",
        "spec.workload.type is deprecated: rewritten to spec.workload.kind",
        "spec.timeout.processing is deprecated: rewritten to spec.resiliency.actorTimeout",
    ] {
        assert!(
            complete.warnings.iter().any(|x| x == w),
            "{:?}",
            complete.warnings
        );
    }
    // The seeds' plain examples need no rewriting at all.
    assert!(
        report(&reports, "AsyncActor asya/text-processor")
            .warnings
            .is_empty()
    );
}

#[test]
fn every_example_file_holds_objects_and_config_files_are_skipped() {
    for sub in ["actors", "flavors"] {
        for file in yaml_files(&examples().join(sub)) {
            let docs = read_documents(std::slice::from_ref(&file)).unwrap();
            let reports = validate_documents(&docs, &ClusterConfig::default());
            assert!(!reports.is_empty(), "{}: no object", file.display());
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(
                text.starts_with("# "),
                "{}: says where it comes from",
                file.display()
            );
        }
    }
    // `kubectl apply -R -f deploy/examples/` fails on any YAML document that is not a
    // Kubernetes object, so every document under it has apiVersion and kind.
    let mut dirs = vec![examples()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                let text = std::fs::read_to_string(&path).unwrap();
                for doc in serde_yaml::Deserializer::from_str(&text) {
                    let v = serde_json::Value::deserialize(doc).unwrap();
                    assert!(
                        v["apiVersion"].is_string() && v["kind"].is_string(),
                        "{}: a document without apiVersion/kind breaks kubectl apply -R",
                        path.display()
                    );
                }
            }
        }
    }
    // The cluster configurations live beside the examples, not in them.
    let configs = yaml_files(&root().join("deploy/config"));
    assert_eq!(configs.len(), 3);
    for file in configs {
        assert!(file.to_string_lossy().ends_with(".config.yaml"));
        let docs = read_documents(std::slice::from_ref(&file)).unwrap();
        assert!(
            validate_documents(&docs, &ClusterConfig::default()).is_empty(),
            "{}: a cluster configuration is not a Kubernetes object",
            file.display()
        );
    }
}

#[test]
fn examples_under_each_cluster_configuration() {
    // Under a configuration with one transport, the only rejections are actors that name the
    // other transport explicitly.
    let cases = [
        ("deploy/config/001-sqs.config.yaml", "rabbitmq", 11),
        ("deploy/config/001-rabbitmq.config.yaml", "sqs", 4),
        ("deploy/config/004-operator-values.config.yaml", "sqs", 4),
    ];
    for (config, other, expected_rejections) in cases {
        let reports = validate_dir(&examples(), &load_config(config));
        let rejected: Vec<&ObjectReport> = reports.iter().filter(|r| !r.accepted()).collect();
        assert_eq!(
            rejected.len(),
            expected_rejections,
            "{config}:\n{}",
            render(&reports)
        );
        for r in rejected {
            assert!(
                r.errors
                    .iter()
                    .all(|e| e.starts_with("spec.transport: ") && e.contains(other)),
                "{config}: {}: {:?}",
                r.object,
                r.errors
            );
        }
    }
    let sqs = load_config("deploy/config/001-sqs.config.yaml");
    assert_eq!(sqs.default_transport, "sqs");
    assert_eq!(
        sqs.service_account.actor_role_arn.as_deref(),
        Some("arn:aws:iam::ACCOUNT:role/asya-actor-role-{namespace}")
    );
    let rabbit = load_config("deploy/config/001-rabbitmq.config.yaml");
    let t = rabbit.transport("rabbitmq").unwrap();
    assert_eq!(t.config.port, Some(5672));
    assert!(!t.rabbitmq_tls());
}

/// The `# expect:` lines and the optional `# config:` path of a fixture.
fn header(text: &str) -> (Vec<String>, Option<String>) {
    let mut expect = Vec::new();
    let mut config = None;
    for line in text.lines() {
        if let Some(e) = line.strip_prefix("# expect: ") {
            expect.push(e.to_string());
        } else if let Some(c) = line.strip_prefix("# config: ") {
            config = Some(c.trim().to_string());
        }
    }
    (expect, config)
}

fn invalid_fixtures() -> Vec<PathBuf> {
    yaml_files(&root().join("tests/fixtures/invalid"))
}

#[test]
fn every_invalid_fixture_is_rejected_with_its_message() {
    let fixtures = invalid_fixtures();
    assert!(fixtures.len() >= 25, "{fixtures:?}");
    for file in fixtures {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.starts_with("# expect: "),
            "{name}: starts with # expect:"
        );
        let (expect, config) = header(&text);
        let config = config.map_or_else(ClusterConfig::default, |c| load_config(&c));
        let docs = read_documents(std::slice::from_ref(&file)).unwrap();
        let reports = validate_documents(&docs, &config);
        let shown = render(&reports);
        let rejected: Vec<&ObjectReport> = reports.iter().filter(|r| !r.accepted()).collect();
        assert!(!rejected.is_empty(), "{name}: nothing rejected:\n{shown}");
        for e in &expect {
            assert!(
                rejected.iter().any(|r| r.errors.contains(e)),
                "{name}: expected error not reported: {e}\n{shown}"
            );
        }
        for r in rejected {
            assert!(
                r.errors.iter().any(|e| expect.contains(e)),
                "{name}: {} rejected for an unexpected reason:\n{shown}",
                r.object
            );
        }
    }
}

#[test]
fn seed_002_conflict_is_the_first_fixture_in_its_words() {
    let text = std::fs::read_to_string(root().join("tests/fixtures/invalid/flavor-conflict.yaml"))
        .unwrap();
    assert!(text.starts_with(
        "# expect: flavor merge conflict: flavors \"flavor-a\" and \"flavor-b\" conflict on scaling.minReplicaCount\n"
    ));
}

fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_asya-webhook"))
        .arg("validate")
        .args(args)
        .current_dir(root())
        .output()
        .expect("run asya-webhook")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn cli_accepts_the_examples_directory() {
    let o = cli(&["-f", "deploy/examples/"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.ends_with("64 objects: 64 accepted, 0 rejected\n"),
        "{out}"
    );
    assert!(out.contains(
        "AsyncActor default/gpu-t4-actor (deploy/examples/actors/002-migrate-1-gpu-t4.yaml#1): accepted\n  warning: flavor \"gpu-t4\" is deprecated: Use gpu-a100 instead\n"
    ), "{out}");
}

#[test]
fn cli_rejects_an_invalid_fixture_with_its_message() {
    let o = cli(&["-f", "tests/fixtures/invalid/flavor-conflict.yaml"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains(
        "AsyncActor default/my-actor (tests/fixtures/invalid/flavor-conflict.yaml#3): rejected\n  error: flavor merge conflict: flavors \"flavor-a\" and \"flavor-b\" conflict on scaling.minReplicaCount\n"
    ), "{out}");
    assert!(
        out.ends_with("3 objects: 2 accepted, 1 rejected\n"),
        "{out}"
    );

    // With the cluster configuration the fixture names.
    let o = cli(&[
        "--config",
        "deploy/config/004-operator-values.config.yaml",
        "-f",
        "tests/fixtures/invalid/transport-not-enabled.yaml",
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("  error: spec.transport: Invalid value: \"sqs\": transport is not enabled in this cluster (enabled: rabbitmq)\n"), "{out}");

    // The whole directory at once: every file rejected, nothing unreadable.
    let o = cli(&["-f", "tests/fixtures/invalid/"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
}

#[test]
fn cli_exits_2_on_unreadable_input() {
    let o = cli(&["-f", "deploy/examples/no-such-file.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("asya-webhook validate: deploy/examples/no-such-file.yaml: "),
        "{err}"
    );
}

#[test]
fn the_quota_example_counts_async_actors_by_their_resource_name() {
    // `count/<plural>.<group>` of the CRD as generated: a typo here would count nothing,
    // silently (the API server accepts any resource name in a quota).
    let crd = std::fs::read_to_string(root().join("deploy/crds/asya.sh_asyncactors.yaml")).unwrap();
    let crd: serde_json::Value = serde_yaml::from_str(&crd).unwrap();
    let counted = format!(
        "count/{}.{}",
        crd["spec"]["names"]["plural"].as_str().unwrap(),
        crd["spec"]["group"].as_str().unwrap()
    );
    assert_eq!(counted, "count/asyncactors.asya.sh");
    let docs = read_documents(&[examples().join("quotas")]).unwrap();
    assert_eq!(docs.len(), 1);
    let quota: k8s_openapi::api::core::v1::ResourceQuota =
        serde_json::from_value(docs[0].value.clone()).expect("a ResourceQuota");
    let hard = quota.spec.and_then(|s| s.hard).unwrap_or_default();
    assert!(hard.contains_key(&counted), "{hard:?}");
    assert_eq!(quota.metadata.namespace.as_deref(), Some("production"));
    // `kubectl apply -R` applies it after the actors it would otherwise race (path order).
    assert!(examples().join("quotas") > examples().join("actors"));
}

#[test]
fn validate_refuses_generate_name_as_admission_does() {
    let docs = asya_webhook::cmd::validate::parse_documents(
        "gen.yaml",
        "apiVersion: asya.sh/v1alpha1\nkind: AsyncActor\nmetadata: {generateName: worker, namespace: team}\nspec: {image: i, handler: m.f}\n",
    )
    .unwrap();
    let reports = validate_documents(&docs, &ClusterConfig::default());
    assert_eq!(reports.len(), 1);
    assert!(
        reports[0]
            .errors
            .iter()
            .any(|e| e.starts_with("metadata.generateName: Invalid value: \"worker\": ")),
        "{}",
        render(&reports)
    );
}
