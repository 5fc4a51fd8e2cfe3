//! What an actor's pod may do that a plain pod may not (docs/DESIGN.md §9): the pure half of
//! "an AsyncActor grants nothing its author does not have".
//!
//! [`RenderedPod::of`] rebuilds the pod the provisioner renders from a resolved actor (flavors
//! merged, defaults applied): the workload template as written, or the flat shape's hardened
//! runtime container with the spec's volumes. [`RenderedPod::privileges`] lists every setting
//! that needs more than the right to create AsyncActors (hostPath, host namespaces, privileged,
//! added capabilities, privilege escalation, host ports, another ServiceAccount, and anything
//! else Pod Security "baseline" forbids); [`RenderedPod::level_violations`] checks the pod
//! against a Pod Security level. Each finding names the AsyncActor field, its value, the rule,
//! and the flavor that set it when one did.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Container, PodSpec, SecurityContext};
use serde_json::{Value, json};

use crate::error::FieldError;
use crate::flavor::Origins;
use crate::labels;
use crate::naming;
use crate::resolved::ResolvedActor;
use crate::restricted;
use crate::types::AsyncActorSpec;

// The Pod Security level is a leaf rule (`basics`), named here too for the crates that
// read it as `privilege::Level`.
pub use crate::basics::{ENFORCE_LABEL, Level};

/// Why a setting is a privilege.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    HostProcess,
    HostNamespaces,
    Privileged,
    /// A capability outside baseline's default set.
    Capabilities,
    HostPath,
    HostPorts,
    AppArmor,
    SeLinux,
    ProcMount,
    Seccomp,
    Sysctls,
    /// A capability baseline allows but a plain pod does not have (not a baseline rule).
    AddedCapability,
    /// `allowPrivilegeEscalation: true` (not a baseline rule).
    PrivilegeEscalation,
    /// A ServiceAccount other than the actor's own (not a baseline rule).
    ServiceAccount,
}

impl Rule {
    /// Whether Pod Security "baseline" forbids it.
    pub fn baseline(self) -> bool {
        !matches!(
            self,
            Rule::AddedCapability | Rule::PrivilegeEscalation | Rule::ServiceAccount
        )
    }

    /// Whether [`restricted::restricted_violations`] reports it too (so the restricted level
    /// does not report it twice).
    fn checked_by_restricted(self) -> bool {
        matches!(
            self,
            Rule::HostNamespaces
                | Rule::Privileged
                | Rule::Capabilities
                | Rule::HostPath
                | Rule::HostPorts
                | Rule::Seccomp
        )
    }

    /// The rule in a few words, as a refusal quotes it.
    pub fn describe(self) -> &'static str {
        match self {
            Rule::HostProcess => {
                "Windows HostProcess containers run as the node (Pod Security baseline: HostProcess)"
            }
            Rule::HostNamespaces => {
                "shares a namespace of the node (Pod Security baseline: host namespaces)"
            }
            Rule::Privileged => {
                "a privileged container holds the node's devices and capabilities (Pod Security baseline: privileged containers)"
            }
            Rule::Capabilities => {
                "adds a capability outside the default set (Pod Security baseline: capabilities)"
            }
            Rule::HostPath => {
                "mounts a directory of the node (Pod Security baseline: hostPath volumes)"
            }
            Rule::HostPorts => "binds a port of the node (Pod Security baseline: host ports)",
            Rule::AppArmor => {
                "must be RuntimeDefault or Localhost (Pod Security baseline: AppArmor)"
            }
            Rule::SeLinux => {
                "type must be container_t, container_init_t, container_kvm_t or container_engine_t, user and role unset (Pod Security baseline: SELinux)"
            }
            Rule::ProcMount => "must be Default (Pod Security baseline: /proc mount type)",
            Rule::Seccomp => "must not be Unconfined (Pod Security baseline: seccomp)",
            Rule::Sysctls => "is not one of the safe sysctls (Pod Security baseline: sysctls)",
            Rule::AddedCapability => "adds a capability",
            Rule::PrivilegeEscalation => "lets a process gain more privileges than its parent",
            Rule::ServiceAccount => "runs the pods as a ServiceAccount other than the actor's own",
        }
    }
}

/// One setting of the rendered pod that needs more than the right to create AsyncActors.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// The AsyncActor field (`spec.workload.template.spec.volumes[0].hostPath.path`).
    pub path: String,
    pub value: Value,
    pub rule: Rule,
    /// The flavor that set it, when one did.
    pub flavor: Option<String>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.value)?;
        if let Some(flavor) = &self.flavor {
            write!(f, " (set by flavor {flavor:?})")?;
        }
        Ok(())
    }
}

/// The pod an actor's workload runs, as far as privileges go, with the way back from its
/// fields to the AsyncActor's.
#[derive(Clone, Debug)]
pub struct RenderedPod {
    pub spec: PodSpec,
    pub annotations: BTreeMap<String, String>,
    /// The actor's own ServiceAccount.
    pub own_service_account: String,
    /// Where the pod spec sits in the AsyncActor (`spec` or `spec.workload.template.spec`).
    prefix: &'static str,
    /// The same place as flavor origins spell it (no `spec.`).
    origin_prefix: &'static str,
}

const WORKLOAD_PREFIX: &str = "spec.workload.template.spec";
const WORKLOAD_ORIGIN: &str = "workload.template.spec";

impl RenderedPod {
    /// The pod the provisioner renders for `actor` (queue-provisioner/src/render/workload.rs):
    /// the workload template, its ServiceAccount defaulted to the actor's; or, for the flat
    /// shape, the runtime container and pod hardened as there, with the spec's volumes. The
    /// containers the webhook injects are ours and meet `restricted`: they grant nothing.
    pub fn of(actor: &ResolvedActor) -> RenderedPod {
        Self::of_spec(&actor.name, &actor.spec)
    }

    /// [`RenderedPod::of`] from the AsyncActor's name and its merged spec.
    pub fn of_spec(name: &str, spec: &AsyncActorSpec) -> RenderedPod {
        let own = naming::service_account_name(name);
        let template = spec.workload.as_ref().and_then(|w| w.template.as_ref());
        match template {
            Some(t) => {
                let mut spec = t.spec.clone().unwrap_or_default();
                if spec.service_account_name.is_none() {
                    spec.service_account_name = Some(own.clone());
                }
                let annotations = t
                    .metadata
                    .as_ref()
                    .and_then(|m| m.annotations.clone())
                    .unwrap_or_default();
                RenderedPod {
                    spec,
                    annotations,
                    own_service_account: own,
                    prefix: WORKLOAD_PREFIX,
                    origin_prefix: WORKLOAD_ORIGIN,
                }
            }
            None => {
                let mut runtime = Container {
                    name: labels::RUNTIME_CONTAINER.into(),
                    ..Default::default()
                };
                restricted::harden_container(&mut runtime.security_context);
                let mut security_context = None;
                restricted::harden_pod(&mut security_context);
                let s = spec;
                RenderedPod {
                    spec: PodSpec {
                        containers: vec![runtime],
                        volumes: (!s.volumes.is_empty()).then(|| s.volumes.clone()),
                        security_context,
                        service_account_name: Some(own.clone()),
                        ..Default::default()
                    },
                    annotations: BTreeMap::new(),
                    own_service_account: own,
                    prefix: "spec",
                    origin_prefix: "",
                }
            }
        }
    }

    /// Every privilege of the pod, each attributed to the flavor that set it.
    pub fn privileges(&self, origins: &Origins) -> Vec<Finding> {
        let mut c = Collector {
            pod: self,
            origins,
            out: Vec::new(),
        };
        c.pod_level();
        c.containers();
        c.out
    }

    /// How the pod fails `level`, one message per violation naming the field, the value, the
    /// rule and the level. Empty when the pod meets it.
    pub fn level_violations(&self, level: Level, origins: &Origins) -> Vec<String> {
        if level == Level::Privileged {
            return Vec::new();
        }
        let baseline = self
            .privileges(origins)
            .into_iter()
            .filter(|f| f.rule.baseline());
        let shown = |f: Finding| format!("{f}: {} (level {level})", f.rule.describe());
        match level {
            Level::Privileged => Vec::new(),
            Level::Baseline => baseline.map(shown).collect(),
            Level::Restricted => {
                // `restricted_violations` checks restricted's rules and the baseline rules it
                // shares; the others come from the baseline findings.
                let mut out: Vec<String> = baseline
                    .filter(|f| !f.rule.checked_by_restricted())
                    .map(shown)
                    .collect();
                out.extend(
                    restricted::restricted_violations(&self.spec)
                        .into_iter()
                        .map(|v| {
                            let rest = v.strip_prefix("spec").unwrap_or(&v);
                            format!("{}{rest} (level {level})", self.prefix)
                        }),
                );
                out
            }
        }
    }
}

/// Privileges set by namespaced (ConfigMap) flavors, as errors: refused whoever writes the
/// actor. Anyone who may edit ConfigMaps in the namespace may edit such a flavor after the
/// actor is admitted, where no SubjectAccessReview sees it; the provisioner reviews the actor
/// again on every flavor change and refuses it then.
pub fn namespaced_flavor_errors(
    name: &str,
    spec: &AsyncActorSpec,
    origins: &Origins,
    namespaced: &[&str],
) -> Vec<FieldError> {
    if namespaced.is_empty() {
        return Vec::new();
    }
    RenderedPod::of_spec(name, spec)
        .privileges(origins)
        .into_iter()
        .filter(|f| f.flavor.as_deref().is_some_and(|n| namespaced.contains(&n)))
        .map(|f| {
            let rule = format!(
                "{}: a namespaced flavor (ConfigMap) cannot grant privileges; ask the platform team for a cluster Flavor",
                f.rule.describe()
            );
            FieldError::invalid(f.path, f.value, rule).from_flavor(f.flavor.as_deref())
        })
        .collect()
}

/// Capabilities Pod Security "baseline" lets a container add (the container runtime's default set).
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];
/// SELinux types baseline allows (besides unset).
const SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];
/// Sysctls baseline allows.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];
const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";

struct Collector<'a> {
    pod: &'a RenderedPod,
    origins: &'a Origins,
    out: Vec<Finding>,
}

impl Collector<'_> {
    /// Records a finding at `rel` (relative to the pod spec); `origin_rel` is the same place
    /// as flavor origins key it (list items by name), when it differs.
    fn push(&mut self, rel: &str, origin_rel: Option<&str>, value: Value, rule: Rule) {
        let origin_rel = origin_rel.unwrap_or(rel);
        let origin = if self.pod.origin_prefix.is_empty() {
            origin_rel.to_string()
        } else {
            format!("{}.{origin_rel}", self.pod.origin_prefix)
        };
        self.out.push(Finding {
            path: format!("{}.{rel}", self.pod.prefix),
            value,
            rule,
            flavor: self.origins.flavor_of(&origin).map(str::to_string),
        });
    }

    fn pod_level(&mut self) {
        let spec = &self.pod.spec;
        for (flag, field) in [
            (spec.host_network, "hostNetwork"),
            (spec.host_pid, "hostPID"),
            (spec.host_ipc, "hostIPC"),
        ] {
            if flag == Some(true) {
                self.push(field, None, json!(true), Rule::HostNamespaces);
            }
        }
        for (i, v) in spec.volumes.iter().flatten().enumerate() {
            if let Some(h) = &v.host_path {
                let origin = format!("volumes[{}]", v.name);
                self.push(
                    &format!("volumes[{i}].hostPath.path"),
                    Some(&origin),
                    json!(h.path),
                    Rule::HostPath,
                );
            }
        }
        for (field, sa) in [
            ("serviceAccountName", &spec.service_account_name),
            ("serviceAccount", &spec.service_account),
        ] {
            if let Some(sa) = sa
                && *sa != self.pod.own_service_account
            {
                self.push(field, None, json!(sa), Rule::ServiceAccount);
            }
        }
        if let Some(sc) = &spec.security_context {
            let at = "securityContext";
            if sc.windows_options.as_ref().and_then(|w| w.host_process) == Some(true) {
                self.push(
                    &format!("{at}.windowsOptions.hostProcess"),
                    None,
                    json!(true),
                    Rule::HostProcess,
                );
            }
            if let Some(p) = &sc.app_armor_profile
                && !apparmor_ok(&p.type_)
            {
                self.push(
                    &format!("{at}.appArmorProfile.type"),
                    None,
                    json!(p.type_),
                    Rule::AppArmor,
                );
            }
            if let Some(se) = &sc.se_linux_options {
                self.selinux(at, se);
            }
            if let Some(p) = &sc.seccomp_profile
                && p.type_ == "Unconfined"
            {
                self.push(
                    &format!("{at}.seccompProfile.type"),
                    None,
                    json!(p.type_),
                    Rule::Seccomp,
                );
            }
            for (i, s) in sc.sysctls.iter().flatten().enumerate() {
                if !SAFE_SYSCTLS.contains(&s.name.as_str()) {
                    self.push(
                        &format!("{at}.sysctls[{i}].name"),
                        None,
                        json!(s.name),
                        Rule::Sysctls,
                    );
                }
            }
        }
        for (k, v) in &self.pod.annotations {
            if k.starts_with(APPARMOR_ANNOTATION)
                && v != "runtime/default"
                && !v.starts_with("localhost/")
            {
                // The annotations sit beside the template's spec, in its metadata; flavor
                // origins key map entries with a dot.
                let meta = self.pod.prefix.trim_end_matches(".spec");
                let origin = format!(
                    "{}.metadata.annotations.{k}",
                    meta.trim_start_matches("spec.")
                );
                self.out.push(Finding {
                    flavor: self.origins.flavor_of(&origin).map(str::to_string),
                    path: format!("{meta}.metadata.annotations[{k}]"),
                    value: json!(v),
                    rule: Rule::AppArmor,
                });
            }
        }
    }

    fn selinux(&mut self, at: &str, se: &k8s_openapi::api::core::v1::SELinuxOptions) {
        let opts = format!("{at}.seLinuxOptions");
        if let Some(t) = se.type_.as_deref()
            && !t.is_empty()
            && !SELINUX_TYPES.contains(&t)
        {
            self.push(&format!("{opts}.type"), None, json!(t), Rule::SeLinux);
        }
        for (field, v) in [("user", &se.user), ("role", &se.role)] {
            if let Some(v) = v.as_deref()
                && !v.is_empty()
            {
                self.push(&format!("{opts}.{field}"), None, json!(v), Rule::SeLinux);
            }
        }
    }

    fn containers(&mut self) {
        let spec = &self.pod.spec;
        let lists = [
            (
                "initContainers",
                spec.init_containers.as_deref().unwrap_or_default(),
            ),
            ("containers", spec.containers.as_slice()),
        ];
        for (list, containers) in lists {
            for (i, c) in containers.iter().enumerate() {
                let at = format!("{list}[{i}]");
                for (j, p) in c.ports.iter().flatten().enumerate() {
                    if let Some(h) = p.host_port.filter(|h| *h != 0) {
                        self.push(
                            &format!("{at}.ports[{j}].hostPort"),
                            None,
                            json!(h),
                            Rule::HostPorts,
                        );
                    }
                }
                if let Some(sc) = &c.security_context {
                    self.container_context(&format!("{at}.securityContext"), sc);
                }
            }
        }
    }

    fn container_context(&mut self, at: &str, sc: &SecurityContext) {
        if sc.privileged == Some(true) {
            self.push(
                &format!("{at}.privileged"),
                None,
                json!(true),
                Rule::Privileged,
            );
        }
        if sc.allow_privilege_escalation == Some(true) {
            self.push(
                &format!("{at}.allowPrivilegeEscalation"),
                None,
                json!(true),
                Rule::PrivilegeEscalation,
            );
        }
        if sc.windows_options.as_ref().and_then(|w| w.host_process) == Some(true) {
            self.push(
                &format!("{at}.windowsOptions.hostProcess"),
                None,
                json!(true),
                Rule::HostProcess,
            );
        }
        let adds = sc.capabilities.as_ref().and_then(|c| c.add.as_deref());
        for (i, cap) in adds.unwrap_or_default().iter().enumerate() {
            // The API server accepts `CAP_`-prefixed names too.
            let bare = cap.strip_prefix("CAP_").unwrap_or(cap);
            let rule = if BASELINE_CAPABILITIES.contains(&bare) {
                Rule::AddedCapability
            } else {
                Rule::Capabilities
            };
            self.push(
                &format!("{at}.capabilities.add[{i}]"),
                None,
                json!(cap),
                rule,
            );
        }
        if let Some(p) = &sc.app_armor_profile
            && !apparmor_ok(&p.type_)
        {
            self.push(
                &format!("{at}.appArmorProfile.type"),
                None,
                json!(p.type_),
                Rule::AppArmor,
            );
        }
        if let Some(se) = &sc.se_linux_options {
            self.selinux(at, se);
        }
        if let Some(m) = sc.proc_mount.as_deref()
            && m != "Default"
        {
            self.push(&format!("{at}.procMount"), None, json!(m), Rule::ProcMount);
        }
        if let Some(p) = &sc.seccomp_profile
            && p.type_ == "Unconfined"
        {
            self.push(
                &format!("{at}.seccompProfile.type"),
                None,
                json!(p.type_),
                Rule::Seccomp,
            );
        }
    }
}

fn apparmor_ok(t: &str) -> bool {
    t == "RuntimeDefault" || t == "Localhost"
}

#[cfg(test)]
mod tests;
