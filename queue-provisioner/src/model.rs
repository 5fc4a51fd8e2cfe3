//! The provisioner's typed vocabulary: workload kinds, scaling modes, phases and the kinds of
//! object it writes. The actor's status carries them as strings (its CRD schema is shared
//! with the webhook and the CLI in `asya-api`); these types are what the code decides with,
//! and `as_str` is the one place each string is spelled.

use std::fmt;

/// The kind of workload an actor runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
        }
    }

    /// The kind a resolved spec names: `StatefulSet`, else a Deployment (the default, and
    /// what the controller always did for anything that is not `StatefulSet`).
    pub fn of(name: &str) -> Self {
        if name == "StatefulSet" {
            WorkloadKind::StatefulSet
        } else {
            WorkloadKind::Deployment
        }
    }

    /// The kind a status recorded, if it recorded a known one.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "Deployment" => Some(WorkloadKind::Deployment),
            "StatefulSet" => Some(WorkloadKind::StatefulSet),
            _ => None,
        }
    }

    pub fn other(self) -> Self {
        match self {
            WorkloadKind::Deployment => WorkloadKind::StatefulSet,
            WorkloadKind::StatefulSet => WorkloadKind::Deployment,
        }
    }

    pub fn object(self) -> ObjectKind {
        match self {
            WorkloadKind::Deployment => ObjectKind::Deployment,
            WorkloadKind::StatefulSet => ObjectKind::StatefulSet,
        }
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who sets the workload's replica count: KEDA's HPA, or the spec's fixed count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalingMode {
    Keda,
    Manual,
}

impl ScalingMode {
    pub fn of(scaling_enabled: bool) -> Self {
        if scaling_enabled {
            ScalingMode::Keda
        } else {
            ScalingMode::Manual
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ScalingMode::Keda => "KEDA",
            ScalingMode::Manual => "Manual",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "KEDA" => Some(ScalingMode::Keda),
            "Manual" => Some(ScalingMode::Manual),
            _ => None,
        }
    }
}

/// The actor's phase (`status.phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Creating,
    Running,
    Napping,
    Degraded,
    Waiting,
    RuntimeError,
    SidecarError,
    ImagePullError,
    TransportError,
    Terminating,
}

impl Phase {
    pub const ALL: [Phase; 10] = [
        Phase::Creating,
        Phase::Running,
        Phase::Napping,
        Phase::Degraded,
        Phase::Waiting,
        Phase::RuntimeError,
        Phase::SidecarError,
        Phase::ImagePullError,
        Phase::TransportError,
        Phase::Terminating,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Phase::ALL.into_iter().find(|p| p.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Creating => "Creating",
            Phase::Running => "Running",
            Phase::Napping => "Napping",
            Phase::Degraded => "Degraded",
            Phase::Waiting => "Waiting",
            Phase::RuntimeError => "RuntimeError",
            Phase::SidecarError => "SidecarError",
            Phase::ImagePullError => "ImagePullError",
            Phase::TransportError => "TransportError",
            Phase::Terminating => "Terminating",
        }
    }

    /// Whether entering this phase is announced as a Warning event (else Normal).
    pub fn is_warning(self) -> bool {
        matches!(
            self,
            Phase::TransportError
                | Phase::RuntimeError
                | Phase::SidecarError
                | Phase::ImagePullError
                | Phase::Degraded
                | Phase::Waiting
        )
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kinds of object the provisioner writes in an actor's namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    Secret,
    ServiceAccount,
    Deployment,
    StatefulSet,
    ScaledObject,
    TriggerAuthentication,
    Pod,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Secret => "Secret",
            ObjectKind::ServiceAccount => "ServiceAccount",
            ObjectKind::Deployment => "Deployment",
            ObjectKind::StatefulSet => "StatefulSet",
            ObjectKind::ScaledObject => "ScaledObject",
            ObjectKind::TriggerAuthentication => "TriggerAuthentication",
            ObjectKind::Pod => "Pod",
        }
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_modes_and_phases_spell_as_the_status_and_the_e2e_suite_read_them() {
        for k in [WorkloadKind::Deployment, WorkloadKind::StatefulSet] {
            assert_eq!(WorkloadKind::parse(k.as_str()), Some(k));
            assert_eq!(WorkloadKind::of(k.as_str()), k);
            assert_eq!(k.other().other(), k);
            assert_eq!(k.object().as_str(), k.as_str());
        }
        assert_eq!(WorkloadKind::of("Job"), WorkloadKind::Deployment);
        assert_eq!(WorkloadKind::parse("Job"), None);
        for m in [ScalingMode::Keda, ScalingMode::Manual] {
            assert_eq!(ScalingMode::parse(m.as_str()), Some(m));
        }
        assert_eq!(ScalingMode::of(true).as_str(), "KEDA");
        assert_eq!(ScalingMode::of(false).as_str(), "Manual");
        for p in Phase::ALL {
            assert_eq!(Phase::parse(p.as_str()), Some(p));
        }
        let warnings: Vec<_> = Phase::ALL
            .into_iter()
            .filter(|p| p.is_warning())
            .map(Phase::as_str)
            .collect();
        assert_eq!(
            warnings,
            [
                "Degraded",
                "Waiting",
                "RuntimeError",
                "SidecarError",
                "ImagePullError",
                "TransportError"
            ]
        );
    }
}
