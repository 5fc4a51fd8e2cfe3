//! The crew's end actors (seed 001, `deploy/crew`): where a namespace's x-sink or x-sump is
//! consumed and each envelope stored in S3 under `{prefix}{date}/{actor}/{id}.json`
//! (happy-end: `ASYA_S3_RESULTS_PREFIX`, error-end: `ASYA_S3_ERRORS_PREFIX`). Pure: finds a
//! store from the actor's own spec (the same env the chart renders for the handler), names
//! an envelope's object and the key a redriven envelope moves to.

use asya_api::types::AsyncActor;

/// The handler of the crew's x-sump actor (`deploy/crew/handlers/end_handlers.py`).
pub const ERROR_END_HANDLER: &str = "handlers.end_handlers.error_end_handler";
/// The handler of the crew's x-sink actor.
pub const HAPPY_END_HANDLER: &str = "handlers.end_handlers.happy_end_handler";

/// One of a namespace's two end queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Sink,
    Sump,
}

impl End {
    pub fn actor(self) -> &'static str {
        match self {
            End::Sink => asya_api::naming::SINK_ACTOR,
            End::Sump => asya_api::naming::SUMP_ACTOR,
        }
    }

    fn handler(self) -> &'static str {
        match self {
            End::Sink => HAPPY_END_HANDLER,
            End::Sump => ERROR_END_HANDLER,
        }
    }

    /// The crew handler's prefix variable and its default.
    fn prefix(self) -> (&'static str, &'static str) {
        match self {
            End::Sink => ("ASYA_S3_RESULTS_PREFIX", "results/"),
            End::Sump => ("ASYA_S3_ERRORS_PREFIX", "errors/"),
        }
    }
}

/// The last segment of an envelope's object key (the crew handler's `safe(id) + ".json"`).
pub fn object_name(id: &str) -> String {
    let safe: String = id
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.json")
}
/// Where a redriven envelope's object goes: out of the errors prefix, kept for the record.
pub const REDRIVEN_PREFIX: &str = "redriven/";

/// The S3 store of a namespace's failed envelopes.
#[derive(Debug, Clone, PartialEq)]
pub struct Store {
    /// The crew actor's object name, for messages.
    pub actor: String,
    pub bucket: String,
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// The Secret (in the namespace) and keys of static credentials, if the actor uses them.
    pub keys: Option<(String, String, String)>,
}

fn env_value(a: &AsyncActor, name: &str) -> Option<String> {
    a.spec
        .env
        .iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

fn env_secret(a: &AsyncActor, name: &str) -> Option<(String, String)> {
    let r = a
        .spec
        .env
        .iter()
        .find(|e| e.name == name)?
        .value_from
        .as_ref()?
        .secret_key_ref
        .as_ref()?;
    Some((r.name.clone(), r.key.clone()))
}

/// The store of the namespace's crew actor of `end` among `actors`, if there is one.
pub fn store_of(actors: &[AsyncActor], end: End) -> Option<Store> {
    let a = actors.iter().find(|a| {
        a.spec.actor.as_deref() == Some(end.actor())
            && a.spec.handler.as_deref() == Some(end.handler())
    })?;
    let (prefix_var, default_prefix) = end.prefix();
    let keys = match (
        env_secret(a, "ASYA_S3_ACCESS_KEY"),
        env_secret(a, "ASYA_S3_SECRET_KEY"),
    ) {
        (Some((secret, id_key)), Some((_, key_key))) => Some((secret, id_key, key_key)),
        _ => None,
    };
    Some(Store {
        actor: a.metadata.name.clone().unwrap_or_default(),
        bucket: env_value(a, "ASYA_S3_BUCKET")?,
        prefix: env_value(a, prefix_var).unwrap_or_else(|| default_prefix.into()),
        endpoint: env_value(a, "ASYA_S3_ENDPOINT"),
        region: env_value(a, "ASYA_S3_REGION"),
        keys,
    })
}

/// The key a redriven envelope's object moves to: `redriven/{key}`.
pub fn redriven_key(key: &str) -> String {
    format!("{REDRIVEN_PREFIX}{key}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_happy_end_actor_stores_results_under_its_prefix() {
        let crew = actor(
            "happy-end",
            json!({"actor": "x-sink", "image": "i", "handler": HAPPY_END_HANDLER,
                   "env": [{"name": "ASYA_S3_BUCKET", "value": "asya-results"}]}),
        );
        assert_eq!(store_of(std::slice::from_ref(&crew), End::Sump), None);
        let s = store_of(&[crew], End::Sink).unwrap();
        assert_eq!(
            (s.bucket.as_str(), s.prefix.as_str()),
            ("asya-results", "results/")
        );
    }

    #[test]
    fn an_object_is_named_after_the_id_as_the_crew_handler_names_it() {
        assert_eq!(object_name("5f0c-1"), "5f0c-1.json");
        assert_eq!(object_name("a/b c"), "a_b_c.json");
    }

    fn actor(name: &str, spec: serde_json::Value) -> AsyncActor {
        serde_json::from_value(json!({"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
                                      "metadata": {"name": name, "namespace": "crew"}, "spec": spec}))
        .unwrap()
    }

    #[test]
    fn finds_the_error_end_actor_and_its_store() {
        let crew = actor(
            "error-end",
            json!({
            "actor": "x-sump", "image": "i", "handler": ERROR_END_HANDLER,
            "env": [
                {"name": "ASYA_S3_BUCKET", "value": "asya-results"},
                {"name": "ASYA_S3_ERRORS_PREFIX", "value": "failed/"},
                {"name": "ASYA_S3_ENDPOINT", "value": "http://s3:9000"},
                {"name": "ASYA_S3_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}},
                {"name": "ASYA_S3_SECRET_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}}
            ]}),
        );
        let other = actor("a", json!({"actor": "a", "image": "i", "handler": "h.f"}));
        assert_eq!(store_of(&[other.clone(), crew.clone()], End::Sink), None);
        let s = store_of(&[other, crew], End::Sump).unwrap();
        assert_eq!(s.actor, "error-end");
        assert_eq!(
            (s.bucket.as_str(), s.prefix.as_str()),
            ("asya-results", "failed/")
        );
        assert_eq!(s.endpoint.as_deref(), Some("http://s3:9000"));
        assert_eq!(s.keys, Some(("s3".into(), "id".into(), "secret".into())));
    }

    #[test]
    fn a_plain_x_sump_or_no_bucket_is_no_store() {
        let plain = actor(
            "x-sump",
            json!({"actor": "x-sump", "image": "i", "handler": "mine.f"}),
        );
        assert_eq!(store_of(&[plain], End::Sump), None);
        let no_bucket = actor(
            "error-end",
            json!({"actor": "x-sump", "image": "i", "handler": ERROR_END_HANDLER}),
        );
        assert_eq!(store_of(&[no_bucket], End::Sump), None);
        assert_eq!(
            redriven_key("errors/2026-11-26/b/e1.json"),
            "redriven/errors/2026-11-26/b/e1.json"
        );
    }
}
