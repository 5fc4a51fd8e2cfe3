//! The CRDs as YAML, generated from the types; `deploy/crds/` holds the committed copy.

use kube::CustomResourceExt;

use crate::queue_claim::QueueClaim;
use crate::types::{AsyncActor, Flavor};

/// `(file name, YAML)` for every CRD the project installs.
pub fn crds() -> Result<Vec<(&'static str, String)>, serde_yaml::Error> {
    Ok(vec![
        (
            "asya.sh_asyncactors.yaml",
            serde_yaml::to_string(&AsyncActor::crd())?,
        ),
        (
            "asya.sh_flavors.yaml",
            serde_yaml::to_string(&Flavor::crd())?,
        ),
        (
            "asya.sh_queueclaims.yaml",
            serde_yaml::to_string(&QueueClaim::crd())?,
        ),
    ])
}
