//! The MCP server (rmcp, Streamable HTTP at `/mcp`): `tools/list` from the configured tools,
//! `tools/call` that checks the arguments against the tool's schema, starts the pipeline,
//! sends progress notifications as the sidecars report and returns the result. A call that
//! outlives the tool's timeout returns the envelope id to poll (`GET /envelopes/{id}`).

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ServerCapabilities, Tool as McpTool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

use crate::access::Principal;
use crate::app::{App, CallError};
use crate::store::{self, Status, StoreError};

#[derive(Clone)]
pub struct Mcp {
    app: Arc<App>,
}

/// The `/mcp` route. Stateless: a gateway restart does not strand clients' sessions.
pub fn router(app: Arc<App>, allowed_hosts: Vec<String>, max_body_bytes: usize) -> axum::Router {
    let mut config = StreamableHttpServerConfig::default();
    config.legacy_session_mode = false;
    config.allowed_hosts = allowed_hosts;
    config.max_request_body_bytes = max_body_bytes;
    let service = StreamableHttpService::new(
        move || Ok(Mcp { app: app.clone() }),
        LocalSessionManager::default().into(),
        config,
    );
    axum::Router::new().nest_service("/mcp", service)
}

/// Who is calling: the principal the guard put on the HTTP request, which rmcp hands on as
/// the request's parts. A request without one (not through the guard) is refused rather
/// than served without limits.
fn principal(extensions: &rmcp::model::Extensions) -> Result<Principal, ErrorData> {
    extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Principal>())
        .cloned()
        .ok_or_else(|| {
            ErrorData::internal_error(
                "no caller on the request: /mcp is served only behind the gateway's guard",
                None,
            )
        })
}

fn tool_to_mcp(t: &crate::tools::Tool) -> McpTool {
    McpTool::new(
        t.name.clone(),
        t.description.clone().unwrap_or_default(),
        Arc::new(t.input_schema()),
    )
}

fn call_error(e: &CallError) -> ErrorData {
    match e {
        CallError::UnknownTool { .. } => {
            ErrorData::invalid_params(e.to_string(), Some(json!({"error": "unknown_tool"})))
        }
        CallError::Arguments { errors, .. } => ErrorData::invalid_params(
            e.to_string(),
            Some(json!({"error": "invalid_arguments", "errors": errors
                .iter()
                .map(|a| json!({"field": a.field, "value": a.value, "rule": a.rule}))
                .collect::<Vec<_>>()})),
        ),
        CallError::Denied(d) => ErrorData::invalid_params(
            d.to_string(),
            Some(json!({"error": d.code(), "http_status": if d.is_hidden() { 404 } else { 403 }})),
        ),
        CallError::Storage(s) => storage_error(s),
        CallError::Send { .. } => ErrorData::internal_error(
            e.to_string(),
            Some(json!({"error": "send_failed", "http_status": 503})),
        ),
    }
}

fn storage_error(e: &StoreError) -> ErrorData {
    ErrorData::internal_error(
        format!("{e}; nothing was accepted, retry later"),
        Some(json!({"error": "storage_unavailable", "http_status": 503})),
    )
}

fn result_of(r: &store::Record) -> CallToolResult {
    match r.status {
        Status::Succeeded => {
            let value = json!({"envelope_id": r.id, "status": r.status, "result": r.result});
            CallToolResult::structured(value)
        }
        Status::Failed => {
            let text =
                json!({"envelope_id": r.id, "status": r.status, "error": r.error}).to_string();
            CallToolResult::error(vec![ContentBlock::text(text)])
        }
        Status::Pending | Status::Running => {
            let value = json!({
                "envelope_id": r.id, "status": r.status, "progress": r.progress,
                "message": format!("still running; poll GET /envelopes/{} or stream /envelopes/{}/stream", r.id, r.id),
            });
            CallToolResult::structured(value)
        }
    }
}

impl ServerHandler for Mcp {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("asya-gateway", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Each tool runs an Asya actor pipeline; progress notifications follow the envelope from actor to actor.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let who = principal(&context.extensions)?;
        Ok(ListToolsResult::with_all_items(
            self.app.tools_for(&who).iter().map(tool_to_mcp).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let who = principal(&context.extensions)?;
        let args = request.arguments.map(Value::Object);
        let trace = context
            .extensions
            .get::<axum::http::request::Parts>()
            .map(|p| crate::http::incoming_trace(&p.headers))
            .unwrap_or_default();
        let started = self
            .app
            .start_call(&who, &request.name, args.as_ref(), &trace)
            .await
            .map_err(|e| call_error(&e))?;
        let id = started.record.id.clone();
        let token = context.meta.get_progress_token();
        let peer = context.peer.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(f64, String)>();
        // Notifications go out in order from one task while the call waits.
        let notifier = tokio::spawn(async move {
            while let Some((progress, message)) = rx.recv().await {
                if let Some(t) = &token {
                    let p = ProgressNotificationParam::new(t.clone(), progress)
                        .with_total(100.0)
                        .with_message(message);
                    if peer.notify_progress(p).await.is_err() {
                        return;
                    }
                }
            }
        });
        let mut last = -1.0f64;
        let followed = store::follow(&self.app.store, &id, App::wait_for(&started.tool), |u| {
            let r = &u.record;
            if r.progress > last {
                last = r.progress;
                let message = match (&r.actor, r.status) {
                    (_, s) if s.is_final() => format!("{} ({})", s.as_str(), id),
                    (Some(a), _) => format!("at {a}"),
                    (None, _) => r.status.as_str().to_string(),
                };
                let _ = tx.send((r.progress, message));
            }
        })
        .await;
        drop(tx);
        let _ = notifier.await;
        match followed {
            Ok(Some(r)) => Ok(result_of(&r).into()),
            Ok(None) => Ok(result_of(&started.record).into()),
            Err(e) => Err(storage_error(&e)),
        }
    }
}
