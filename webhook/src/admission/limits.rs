//! The optional cap on AsyncActors per namespace (`policy.maxActorsPerNamespace`,
//! docs/DESIGN.md §9): a CREATE is refused when the namespace already holds that many,
//! counted in the webhook's AsyncActor cache (no API call). The cache follows the API server
//! by a watch event, so CREATEs within that window may pass the count by a few; a
//! ResourceQuota (`count/asyncactors.asya.sh`) is the exact limit, enforced by the API server.

use asya_api::config::Policy;
use asya_api::error::FieldError;
use asya_api::review::ActorReview;

use super::ActorLookup;

/// The refusal of one more actor in `namespace`, which holds `count` of at most `limit`.
pub fn refusal(namespace: &str, count: usize, limit: Option<usize>) -> Option<FieldError> {
    let limit = limit?;
    (count >= limit).then(|| {
        FieldError::forbidden(
            "metadata.namespace",
            format!(
                "namespace {namespace:?} already holds {count} AsyncActors, at the limit of {limit} \
                 (policy.maxActorsPerNamespace in the cluster configuration): delete one first, \
                 or ask the platform team to raise the limit"
            ),
        )
    })
}

/// Adds the refusal to an admitted CREATE's review when its namespace is full. Like the
/// queue collision check, only an actor otherwise admitted is counted against (its
/// namespace is then known as the review resolved it).
pub fn check_create(review: &mut ActorReview, actors: &dyn ActorLookup, policy: &Policy) {
    if policy.max_actors_per_namespace.is_none() || !review.errors.is_empty() {
        return;
    }
    let Some(ns) = review.resolved.as_ref().map(|r| r.namespace.clone()) else {
        return;
    };
    if let Some(e) = refusal(&ns, actors.count_in(&ns), policy.max_actors_per_namespace) {
        review.errors.push(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_at_the_limit_naming_namespace_count_limit_and_setting() {
        assert_eq!(refusal("team", 1000, None), None);
        assert_eq!(refusal("team", 2, Some(3)), None);
        let e = refusal("team", 3, Some(3)).unwrap();
        assert_eq!(
            e.to_string(),
            "metadata.namespace: Forbidden: namespace \"team\" already holds 3 AsyncActors, at \
             the limit of 3 (policy.maxActorsPerNamespace in the cluster configuration): delete \
             one first, or ask the platform team to raise the limit"
        );
        // A limit lowered below what a namespace holds: still refused, with the real count.
        assert!(
            refusal("team", 7, Some(3))
                .unwrap()
                .to_string()
                .contains("holds 7")
        );
    }
}
