//! Schema overrides for fields whose full Kubernetes schema would make the CRD too large to
//! store (volumes, pod templates): they are kept as free-form objects, as seed 003's XRD does,
//! and validated when the API server validates the rendered workload.

use schemars::{Schema, SchemaGenerator, json_schema};

/// A list of free-form objects.
pub fn preserve_unknown_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

/// A free-form object.
pub fn preserve_unknown_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}
