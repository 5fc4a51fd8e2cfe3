//! The committed CRDs are what the types generate: edit the types, then `make crds`.

#[test]
fn committed_crds_match_the_types() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    for (name, yaml) in asya_api::crd::crds().expect("render") {
        let path = dir.join(name);
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run `make crds`", path.display()));
        assert!(
            committed == yaml,
            "{} differs from what the types generate; run `make crds` and commit the result",
            path.display()
        );
    }
}

#[test]
fn crd_has_descriptions_columns_and_names() {
    let (_, yaml) = asya_api::crd::crds().unwrap().remove(0);
    let crd: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(
        crd["spec"]["names"]["shortNames"],
        serde_json::json!(["asya", "asyas"])
    );
    assert_eq!(
        crd["spec"]["names"]["categories"],
        serde_json::json!(["asya"])
    );
    let v = &crd["spec"]["versions"][0];
    assert_eq!(v["subresources"]["status"], serde_json::json!({}));
    let cols: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        cols,
        [
            "STATUS",
            "RUNNING",
            "PENDING",
            "FAILING",
            "MIN",
            "MAX",
            "LAST-SCALE",
            "AGE",
            "DESIRED",
            "WORKLOAD",
            "TRANSPORT",
            "SCALING",
            "QUEUED",
            "PROCESSING"
        ]
    );
    // Every property of the spec, at every depth of our own types, carries a description.
    fn check(path: &str, schema: &serde_json::Value, missing: &mut Vec<String>) {
        if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
            for (k, s) in props {
                let p = format!("{path}.{k}");
                if s.get("description").is_none() {
                    missing.push(p.clone());
                }
                check(&p, s, missing);
                if let Some(items) = s.get("items") {
                    check(&p, items, missing);
                }
                if let Some(ap) = s.get("additionalProperties") {
                    check(&p, ap, missing);
                }
            }
        }
    }
    let mut missing = Vec::new();
    check(
        "spec",
        &v["schema"]["openAPIV3Schema"]["properties"]["spec"],
        &mut missing,
    );
    check(
        "status",
        &v["schema"]["openAPIV3Schema"]["properties"]["status"],
        &mut missing,
    );
    assert!(
        missing.is_empty(),
        "fields without description: {missing:#?}"
    );
}
