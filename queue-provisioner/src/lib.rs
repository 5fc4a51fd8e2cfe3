//! asya-queue-provisioner: for each AsyncActor, the queue, the workload, KEDA scaling and a
//! truthful status (DESIGN.md §6). Decisions are pure (`render`, `status`); I/O lives in
//! `queue` (brokers) and `controller` (Kubernetes).

pub mod controller;
pub mod end_queues;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod queue;
pub mod render;
pub mod status;
pub mod transports;
pub mod work;
