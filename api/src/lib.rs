//! The `AsyncActor` API of Asya: one implementation of the types, defaulting, validation,
//! flavor merge, naming and cluster configuration, shared by the admission webhook, the queue
//! provisioner, the sidecar and the offline CLI.
//!
//! Everything here is pure: no I/O, no clocks. Callers bring the objects (from a reflector
//! cache, a file, an AdmissionReview) and get back decisions they can act on.

pub mod amqp;
pub mod basics;
pub mod config;
pub mod crd;
pub mod duration;
pub mod error;
pub mod flavor;
pub mod labels;
pub mod metrics_dump;
pub mod naming;
pub mod normalize;
pub mod percent;
pub mod queue_claim;
pub mod report_token;
pub mod restricted;
pub mod schema;
pub mod sidecar_settings;
pub mod state_proxy;
pub mod telemetry;
pub mod trace_context;
pub mod types;
pub mod wake;

pub use config::ClusterConfig;
pub use error::{FieldError, FieldErrors};
pub use flavor::{FlavorCatalog, FlavorDef, FlavorSource};
pub use types::{AsyncActor, AsyncActorSpec, AsyncActorStatus, Flavor, FlavorSpec};
pub mod policy;
pub mod privilege;
pub mod resolved;
pub mod review;
pub mod validate;

pub use resolved::ResolvedActor;
pub use review::{
    ActorReview, ParsedActor, ParsedOld, ParsedReview, ReviewRequest, review_actor,
    review_actor_decision, review_parsed,
};
