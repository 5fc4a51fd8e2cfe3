//! Whether an object that holds a name the actor needs is the actor's (docs/DESIGN.md §9,
//! issue 26 finding 6). The provisioner names an actor's objects after it, so a name alone
//! proves nothing: before it writes or deletes one, it asks [`claim`] of the live object's
//! metadata, from the watch caches when they hold it (they hold the objects with our label),
//! else from a read ([`super::Cluster::metadata`]); an object the caches do not hold is
//! created with a condition the API server enforces ([`Write::Create`]). Pure.
//!
//! - A Secret (the namespace's transport credentials, shared by its actors, no owner) is
//!   ours when it carries our managed-by label.
//! - Every other kind is ours when it has an owner reference to this actor (its uid), or our
//!   managed-by label and an owner reference to an AsyncActor of the same name: an earlier
//!   actor of that name whose objects the garbage collector has not removed yet.
//!
//! What is not ours is neither applied over (no forced server-side apply takes it) nor
//! deleted; the actor's status says which object holds the name and who owns it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::model::ObjectKind;
use crate::render::workload::MANAGED_BY;

/// Who holds a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Nobody: create it (without force, so an object created meanwhile is not taken).
    Absent,
    /// This actor (or, for a Secret, this provisioner): apply with force, delete.
    Ours,
    /// Someone else, described for the condition and the event.
    Foreign { holder: String },
}

/// The actor whose objects these are.
#[derive(Clone, Copy, Debug)]
pub struct Us<'a> {
    pub uid: &'a str,
    pub name: &'a str,
}

/// Whether the object carries our managed-by label (the one rule for "we made it", shared by
/// every object and Secret check of the provisioner).
pub fn managed_by_us(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY.0))
        .is_some_and(|v| v == MANAGED_BY.1)
}

/// Who holds the name, for `meta` the live object's metadata (`None`: no such object).
pub fn claim(kind: ObjectKind, meta: Option<&ObjectMeta>, us: Us<'_>) -> Claim {
    let Some(meta) = meta else {
        return Claim::Absent;
    };
    let refs = meta.owner_references.as_deref().unwrap_or_default();
    let ours = match kind {
        ObjectKind::Secret => managed_by_us(meta),
        _ => {
            refs.iter().any(|r| r.uid == us.uid)
                || (managed_by_us(meta)
                    && refs.iter().any(|r| {
                        r.kind == "AsyncActor"
                            && r.api_version.starts_with("asya.sh/")
                            && r.name == us.name
                    }))
        }
    };
    if ours {
        Claim::Ours
    } else {
        Claim::Foreign {
            holder: holder(meta),
        }
    }
}

/// Who the object belongs to, as far as its metadata says: its controller (or first)
/// owner, its managed-by label, or the field managers that wrote it.
pub fn holder(meta: &ObjectMeta) -> String {
    let refs = meta.owner_references.as_deref().unwrap_or_default();
    if let Some(r) = refs
        .iter()
        .find(|r| r.controller == Some(true))
        .or(refs.first())
    {
        return format!("owned by {} {} (uid {})", r.kind, r.name, r.uid);
    }
    if let Some(m) = meta.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)) {
        return format!("managed by {m:?}");
    }
    let managers: Vec<&str> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.manager.as_deref())
        .collect();
    if managers.is_empty() {
        "no owner reference and no managed-by label".into()
    } else {
        format!("written by {}", managers.join(", "))
    }
}

/// The message of the condition and the event: the kind, the name and who holds it.
pub fn not_ours_message(kind: ObjectKind, ns: &str, name: &str, holder: &str) -> String {
    format!(
        "{kind} {ns}/{name} exists and is not this actor's ({holder}); left untouched: delete or \
         rename it, or rename the actor"
    )
}

/// How an apply is conditioned so that it never writes over an object that is not ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Nothing holds the name as far as the caches know: create it, not forced. The API
    /// server refuses it (409 Conflict) if an object exists after all (one without our label,
    /// which the caches do not hold, or one made since): then its holder is read and asked.
    Create,
    /// Ours: apply with force, over that very object only (its uid, when known: one
    /// replaced since it was seen is refused).
    Update { uid: Option<String> },
}

/// What an apply does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteStep {
    Write(Write),
    /// Not ours: leave it, and say so with this message.
    Keep {
        message: String,
    },
}

/// What an apply over `kind` `ns/name` does, for `meta` the holder's metadata (`None`: no
/// holder as far as the caller knows).
pub fn write_step(
    kind: ObjectKind,
    ns: &str,
    name: &str,
    meta: Option<&ObjectMeta>,
    us: Us<'_>,
) -> WriteStep {
    match claim(kind, meta, us) {
        Claim::Absent => WriteStep::Write(Write::Create),
        Claim::Ours => WriteStep::Write(Write::Update {
            uid: meta.and_then(|m| m.uid.clone()),
        }),
        Claim::Foreign { holder } => WriteStep::Keep {
            message: not_ours_message(kind, ns, name, &holder),
        },
    }
}

/// What a delete of an object the actor may own does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteStep {
    /// Nothing there.
    Nothing,
    /// Ours: delete it, on the condition that it is still the object read (its uid).
    Delete { uid: Option<String> },
    /// Not ours: keep it, and say so with this message.
    Keep { message: String },
}

pub fn delete_step(
    kind: ObjectKind,
    ns: &str,
    name: &str,
    meta: Option<&ObjectMeta>,
    us: Us<'_>,
) -> DeleteStep {
    match claim(kind, meta, us) {
        Claim::Absent => DeleteStep::Nothing,
        Claim::Ours => DeleteStep::Delete {
            uid: meta.and_then(|m| m.uid.clone()),
        },
        Claim::Foreign { holder } => DeleteStep::Keep {
            message: not_ours_message(kind, ns, name, &holder),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const US: Us<'static> = Us {
        uid: "uid-1",
        name: "a",
    };

    fn meta(v: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(v).expect("meta")
    }

    fn owner(kind: &str, name: &str, uid: &str) -> serde_json::Value {
        json!({"apiVersion": "asya.sh/v1alpha1", "kind": kind, "name": name, "uid": uid, "controller": true})
    }

    #[test]
    fn absent_ours_and_foreign() {
        assert_eq!(claim(ObjectKind::Deployment, None, US), Claim::Absent);
        let ours =
            meta(json!({"name": "a", "ownerReferences": [owner("AsyncActor", "a", "uid-1")]}));
        assert_eq!(claim(ObjectKind::Deployment, Some(&ours), US), Claim::Ours);
        let foreign = meta(json!({"name": "a", "labels": {"team": "other"},
            "managedFields": [{"manager": "kubectl-create", "operation": "Update"}]}));
        assert_eq!(
            claim(ObjectKind::Deployment, Some(&foreign), US),
            Claim::Foreign {
                holder: "written by kubectl-create".into()
            }
        );
    }

    #[test]
    fn our_label_alone_is_not_ownership_of_a_named_object() {
        // A copy of our labels (or an object of another controller that sets them) without
        // the owner reference is not ours.
        let labelled = meta(json!({"name": "a",
            "labels": {"app.kubernetes.io/managed-by": "asya-queue-provisioner"}}));
        assert!(matches!(
            claim(ObjectKind::ServiceAccount, Some(&labelled), US),
            Claim::Foreign { .. }
        ));
        // Owned by another object: named in the holder.
        let other =
            meta(json!({"name": "a", "ownerReferences": [owner("AsyncActor", "b", "uid-9")]}));
        assert_eq!(
            claim(ObjectKind::ScaledObject, Some(&other), US),
            Claim::Foreign {
                holder: "owned by AsyncActor b (uid uid-9)".into()
            }
        );
    }

    #[test]
    fn an_earlier_actor_of_the_same_name_left_it_for_the_garbage_collector() {
        let earlier = meta(json!({"name": "a",
            "labels": {"app.kubernetes.io/managed-by": "asya-queue-provisioner"},
            "ownerReferences": [owner("AsyncActor", "a", "uid-0")]}));
        assert_eq!(
            claim(ObjectKind::Deployment, Some(&earlier), US),
            Claim::Ours
        );
        // Without our label it could be anyone's object pointing at an actor of that name.
        let unlabelled =
            meta(json!({"name": "a", "ownerReferences": [owner("AsyncActor", "a", "uid-0")]}));
        assert!(matches!(
            claim(ObjectKind::Deployment, Some(&unlabelled), US),
            Claim::Foreign { .. }
        ));
    }

    #[test]
    fn a_secret_is_ours_by_label() {
        let ours = meta(json!({"name": "asya-transport-rabbitmq",
            "labels": {"app.kubernetes.io/managed-by": "asya-queue-provisioner"}}));
        assert_eq!(claim(ObjectKind::Secret, Some(&ours), US), Claim::Ours);
        let theirs = meta(json!({"name": "asya-transport-rabbitmq",
            "labels": {"app.kubernetes.io/managed-by": "Helm"}}));
        assert_eq!(
            claim(ObjectKind::Secret, Some(&theirs), US),
            Claim::Foreign {
                holder: "managed by \"Helm\"".into()
            }
        );
    }

    #[test]
    fn write_steps_create_absent_names_and_update_only_the_object_seen() {
        assert_eq!(
            write_step(ObjectKind::ServiceAccount, "n", "asya-a", None, US),
            WriteStep::Write(Write::Create)
        );
        let ours = meta(json!({"name": "a", "uid": "d-1",
            "ownerReferences": [owner("AsyncActor", "a", "uid-1")]}));
        assert_eq!(
            write_step(ObjectKind::Deployment, "n", "a", Some(&ours), US),
            WriteStep::Write(Write::Update {
                uid: Some("d-1".into())
            })
        );
        let labelled = meta(json!({"name": "a", "uid": "d-2",
            "labels": {"app.kubernetes.io/managed-by": "asya-queue-provisioner"}}));
        assert!(matches!(
            write_step(ObjectKind::ScaledObject, "n", "a", Some(&labelled), US),
            WriteStep::Keep { message } if message.starts_with("ScaledObject n/a exists and is not this actor's")
        ));
    }

    #[test]
    fn delete_steps_name_what_is_kept() {
        let ours = meta(json!({"name": "a", "uid": "d-1",
            "ownerReferences": [owner("AsyncActor", "a", "uid-1")]}));
        assert_eq!(
            delete_step(ObjectKind::Deployment, "n", "a", Some(&ours), US),
            DeleteStep::Delete {
                uid: Some("d-1".into())
            }
        );
        assert_eq!(
            delete_step(ObjectKind::StatefulSet, "n", "a", None, US),
            DeleteStep::Nothing
        );
        let foreign = meta(json!({"name": "a"}));
        assert_eq!(
            delete_step(ObjectKind::Deployment, "n", "a", Some(&foreign), US),
            DeleteStep::Keep {
                message: "Deployment n/a exists and is not this actor's (no owner reference and no managed-by label); left untouched: delete or rename it, or rename the actor".into()
            }
        );
    }
}
