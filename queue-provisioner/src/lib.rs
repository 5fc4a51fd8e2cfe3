//! asya-queue-provisioner: for each AsyncActor, the queue, the workload, KEDA scaling and a
//! truthful status. Decisions are pure (`reconcile::plan`, `render`, `status`, `apply_skip`,
//! `watch`); I/O lives behind `reconcile::Cluster` (`kube_cluster` on a real cluster), in
//! `queue` (brokers) and `controller` (the watches).

pub mod actor_gauges;
pub mod apply_skip;
pub mod broker_identity;
pub mod controller;
pub mod end_queues;
pub mod exposure;
pub mod health;
pub mod keda_identity;
pub mod kube_cluster;
pub mod leader;
pub mod metrics;
pub mod model;
pub mod queue;
pub mod reconcile;
pub mod relist;
pub mod render;
pub mod spans;
pub mod state_identity;
pub mod status;
pub mod transports;
pub mod watch;
