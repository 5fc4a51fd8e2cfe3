//! Who may do what at the gateway (issue 26): the decisions as pure functions, the HTTP
//! layer (`crate::http`) applies them.
//!
//! Two kinds of bearer token, never interchangeable:
//! - **client tokens** (`tokens.rs`, the tokens file): call tools, read and stream
//!   envelopes, MCP. A line may limit its token to some tools and some namespaces.
//! - **report tokens** (`report_key.rs`): one per actor namespace, derived from the report
//!   key and bound to the namespace's uid (`namespaces.rs`: a token of a namespace deleted
//!   since is refused); the sidecars of that namespace report progress, children and final
//!   statuses of that namespace's envelopes with it, and do nothing else.
//!
//! An envelope's namespace is the one the store recorded (`Record::namespace`): its tool's
//! for a call, its parent's for a fan-out child.

use std::collections::BTreeSet;

pub mod namespaces;
pub mod report_key;
pub mod tokens;

pub use namespaces::{NamespaceUids, UidRefused};
pub use report_key::ReportKey;
pub use tokens::ClientTokens;

/// The tokens a gateway accepts: the client tokens file and, when configured, the report key
/// with what tells a report token's namespace uid current.
#[derive(Default)]
pub struct Credentials {
    pub clients: ClientTokens,
    pub report_key: Option<ReportKey>,
    pub namespaces: NamespaceUids,
}

/// Why a bearer token names no one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unauthenticated {
    #[error(
        "a report token was sent, but this gateway has no report key (--report-key-file), so \
         it accepts none"
    )]
    NoReportKey,
    #[error("bearer token not accepted")]
    NotAccepted,
    #[error("{0}")]
    FirstFormat(report_key::Refused),
    /// Signed by the key, for a namespace uid that is not the namespace's current one (or
    /// not known yet).
    #[error(transparent)]
    Uid(UidRefused),
}

impl Credentials {
    /// Who `token` is.
    pub fn principal(&self, token: &str) -> Result<Principal, Unauthenticated> {
        if token.starts_with(report_key::PREFIX) {
            let key = self
                .report_key
                .as_ref()
                .ok_or(Unauthenticated::NoReportKey)?;
            let claim = key.verify(token).map_err(|r| match r {
                report_key::Refused::FirstFormat => Unauthenticated::FirstFormat(r),
                report_key::Refused::NotAccepted => Unauthenticated::NotAccepted,
            })?;
            self.namespaces
                .check(&claim.namespace, &claim.uid)
                .map_err(Unauthenticated::Uid)?;
            return Ok(Principal::Reporter {
                namespace: claim.namespace,
            });
        }
        self.clients
            .get(token)
            .map(|g| Principal::Client(g.clone()))
            .ok_or(Unauthenticated::NotAccepted)
    }
}

/// A set of names a token is limited to, or all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Scope {
    #[default]
    All,
    Only(BTreeSet<String>),
}

impl Scope {
    pub fn allows(&self, name: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Only(set) => set.contains(name),
        }
    }

    /// For messages: `a, b`, or `(all)`.
    pub fn describe(&self) -> String {
        match self {
            Scope::All => "(all)".into(),
            Scope::Only(set) => set.iter().cloned().collect::<Vec<_>>().join(", "),
        }
    }
}

/// What a client token may use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientGrant {
    pub tools: Scope,
    pub namespaces: Scope,
}

/// Who is calling, as the bearer token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// Authentication is off (`--no-auth`): everything is allowed.
    Open,
    Client(ClientGrant),
    /// The sidecars of one namespace.
    Reporter {
        namespace: String,
    },
}

/// A refusal: which rule, in words that name the token's kind and limits, never the token.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Denied {
    #[error(
        "{route}: a report token (namespace {namespace:?}) may only report progress, fan-out \
         children and final statuses of its namespace's envelopes; calling tools and reading \
         envelopes need a client token"
    )]
    ReportTokenOnClientRoute { route: String, namespace: String },
    #[error(
        "{route}: only report tokens may report (asya-report.<namespace>.<signature>, made by \
         `asya-gateway report-token`); a client token calls tools and reads envelopes"
    )]
    ClientTokenOnReportRoute { route: String },
    #[error("tool {tool:?}: this token may call only the tools {allowed}")]
    Tool { tool: String, allowed: String },
    #[error(
        "tool {tool:?} runs in namespace {namespace:?}: this token may use only the namespaces {allowed}"
    )]
    ToolNamespace {
        tool: String,
        namespace: String,
        allowed: String,
    },
    #[error(
        "envelope {id:?} belongs to namespace {envelope:?}: the report token of namespace \
         {token:?} reports only envelopes of its own namespace"
    )]
    Report {
        id: String,
        envelope: String,
        token: String,
    },
    /// Told as the same 404 as an unknown id, so a limited token learns nothing about other
    /// namespaces' envelopes.
    #[error("no envelope with id {id:?} in the namespaces this token may read ({allowed})")]
    Hidden { id: String, allowed: String },
}

impl Denied {
    /// The `error` code of the JSON refusal.
    pub fn code(&self) -> &'static str {
        match self {
            Denied::ReportTokenOnClientRoute { .. } => "report_token_not_allowed",
            Denied::ClientTokenOnReportRoute { .. } => "client_token_not_allowed",
            Denied::Tool { .. } => "tool_not_allowed",
            Denied::ToolNamespace { .. } => "namespace_not_allowed",
            Denied::Report { .. } => "envelope_of_another_namespace",
            Denied::Hidden { .. } => "unknown_envelope",
        }
    }

    /// 404 for what must not be told apart from an unknown envelope, else 403.
    pub fn is_hidden(&self) -> bool {
        matches!(self, Denied::Hidden { .. })
    }
}

/// The client routes (tools, envelope reads, streams, MCP) refuse report tokens.
pub fn client_route(p: &Principal, route: &str) -> Result<(), Denied> {
    match p {
        Principal::Reporter { namespace } => Err(Denied::ReportTokenOnClientRoute {
            route: route.to_string(),
            namespace: namespace.clone(),
        }),
        Principal::Open | Principal::Client(_) => Ok(()),
    }
}

/// The report routes refuse client tokens.
pub fn report_route(p: &Principal, route: &str) -> Result<(), Denied> {
    match p {
        Principal::Client(_) => Err(Denied::ClientTokenOnReportRoute {
            route: route.to_string(),
        }),
        Principal::Open | Principal::Reporter { .. } => Ok(()),
    }
}

/// Whether `p` sees `tool` in listings.
pub fn lists_tool(p: &Principal, tool: &str, namespace: &str) -> bool {
    may_call(p, tool, namespace).is_ok()
}

/// Whether `p` may call `tool`, whose actors run in `namespace`.
pub fn may_call(p: &Principal, tool: &str, namespace: &str) -> Result<(), Denied> {
    match p {
        Principal::Open => Ok(()),
        Principal::Reporter { namespace: ns } => Err(Denied::ReportTokenOnClientRoute {
            route: "tools/call".into(),
            namespace: ns.clone(),
        }),
        Principal::Client(g) if !g.tools.allows(tool) => Err(Denied::Tool {
            tool: tool.to_string(),
            allowed: g.tools.describe(),
        }),
        Principal::Client(g) if !g.namespaces.allows(namespace) => Err(Denied::ToolNamespace {
            tool: tool.to_string(),
            namespace: namespace.to_string(),
            allowed: g.namespaces.describe(),
        }),
        Principal::Client(_) => Ok(()),
    }
}

/// Whether `p` may read (or stream) envelope `id` of `namespace`. A namespace-limited token
/// reads only envelopes of its namespaces, never one stored without a namespace.
pub fn may_read(p: &Principal, id: &str, namespace: Option<&str>) -> Result<(), Denied> {
    match p {
        Principal::Open => Ok(()),
        Principal::Reporter { namespace: ns } => Err(Denied::ReportTokenOnClientRoute {
            route: format!("GET /envelopes/{id}"),
            namespace: ns.clone(),
        }),
        Principal::Client(g) => match (&g.namespaces, namespace) {
            (Scope::All, _) => Ok(()),
            (Scope::Only(set), Some(ns)) if set.contains(ns) => Ok(()),
            (scope, _) => Err(Denied::Hidden {
                id: id.to_string(),
                allowed: scope.describe(),
            }),
        },
    }
}

/// Whether `p` may report on envelope `id` of `namespace`: a report token only on its own
/// namespace's envelopes. One stored without a namespace (before the gateway recorded it)
/// takes reports from any report token, so envelopes in flight across the upgrade still end.
pub fn may_report(p: &Principal, id: &str, namespace: Option<&str>) -> Result<(), Denied> {
    match (p, namespace) {
        (Principal::Open, _) => Ok(()),
        (Principal::Client(_), _) => Err(Denied::ClientTokenOnReportRoute {
            route: format!("POST /envelopes/{id}"),
        }),
        (Principal::Reporter { .. }, None) => Ok(()),
        (Principal::Reporter { namespace: mine }, Some(theirs)) if mine == theirs => Ok(()),
        (Principal::Reporter { namespace: mine }, Some(theirs)) => Err(Denied::Report {
            id: id.to_string(),
            envelope: theirs.to_string(),
            token: mine.clone(),
        }),
    }
}

/// Why a fan-out child is not stored: its parent is unknown, or (told in the same words, so
/// a reporter learns nothing of other namespaces' envelopes) of another namespace.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "parent_id {parent:?}: no such envelope in this report token's namespace; a fan-out child \
     is recorded only under an envelope the gateway knows"
)]
pub struct UnknownParent {
    pub parent: String,
}

/// Whether `p` may record a child under `parent_id`, whose stored record is `parent`
/// (`Some(namespace)` as recorded), and the namespace the child is stored with: its
/// parent's. A parent stored before namespaces were recorded takes children from any report
/// token (as it takes reports), and they are the reporter's.
pub fn child_namespace(
    p: &Principal,
    parent_id: &str,
    parent: Option<Option<&str>>,
) -> Result<Option<String>, UnknownParent> {
    let unknown = || UnknownParent {
        parent: parent_id.to_string(),
    };
    match (parent, p) {
        (None, _) => Err(unknown()),
        (Some(Some(ns)), Principal::Reporter { namespace }) if ns != namespace => Err(unknown()),
        (Some(Some(ns)), _) => Ok(Some(ns.to_string())),
        (Some(None), Principal::Reporter { namespace }) => Ok(Some(namespace.clone())),
        (Some(None), _) => Ok(None),
    }
}

#[cfg(test)]
mod tests;
