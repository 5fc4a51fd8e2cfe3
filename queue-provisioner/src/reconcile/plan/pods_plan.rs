//! The pods step's decisions as data: which of the actor's pods to delete (created while the
//! injection webhook was down, or stuck on a credential Secret the configuration no longer
//! names), the events that say so, and which pods the status counts. [`super::super::actor`]
//! probes the webhook, then carries the actions out in order.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::status;

use super::{EventSpec, PodStep, bare_pod, stale_credentials_event};

/// One action of the pods step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodAction {
    /// Delete the pod (its controller recreates it); `uid`: only if it is still that pod.
    Delete {
        name: String,
        uid: Option<String>,
    },
    Event(EventSpec),
}

/// What the pods step does, and the pods the status counts.
#[derive(Debug, PartialEq)]
pub struct PodsPlan<'a> {
    pub actions: Vec<PodAction>,
    /// Neither without the sidecar nor replaced.
    pub counted: Vec<&'a Pod>,
}

/// The credential Secrets injection gives today, by variable, and the variables the
/// actor's own `sidecar.env` sets ([`status::stale_credentials`]).
pub struct Credentials<'a> {
    pub current: &'a [(&'a str, &'a str)],
    pub overridden: &'a [&'a str],
}

/// The pods without the sidecar, the first of which the driver probes the webhook with.
pub fn bare_pods<'a>(pods: &[&'a Pod]) -> Vec<&'a Pod> {
    pods.iter()
        .copied()
        .filter(|p| status::needs_replacing(p))
        .collect()
}

/// The pods step: pods without the sidecar replaced once injection works (deleting while the
/// webhook is still down would only bring another such pod, in a loop), else kept and said;
/// pods stuck on a credential Secret of another identity mode replaced (`credentials`:
/// `None` when the transport is unknown).
pub fn pods<'a>(
    pods: &[&'a Pod],
    injection_down: bool,
    credentials: Option<&Credentials<'_>>,
) -> PodsPlan<'a> {
    let mut actions = Vec::new();
    for p in bare_pods(pods) {
        let name = p.name_any();
        match bare_pod(&name, injection_down) {
            PodStep::Keep(ev) => actions.push(PodAction::Event(ev)),
            PodStep::Replace(ev) => {
                actions.push(PodAction::Delete { name, uid: None });
                actions.push(PodAction::Event(ev));
            }
        }
    }
    let mut replaced = Vec::new();
    let stale = pods.iter().filter_map(|p| {
        let c = credentials?;
        Some((p, status::stale_credentials(p, c.current, c.overridden)?))
    });
    for (p, (var, secret)) in stale {
        let name = p.name_any();
        actions.push(PodAction::Delete {
            name: name.clone(),
            uid: p.uid(),
        });
        actions.push(PodAction::Event(stale_credentials_event(
            &name, &var, &secret,
        )));
        replaced.push(name);
    }
    let counted = pods
        .iter()
        .copied()
        .filter(|p| !status::needs_replacing(p) && !replaced.contains(&p.name_any()))
        .collect();
    PodsPlan { actions, counted }
}
