//! What REST and MCP share: the tools, the store, the senders, and starting a call.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use asya_transport::envelope::{Envelope, Route, SendTrace};
use asya_transport::trace_context::{self, IdSource, Incoming, TraceSettings};
use serde_json::{Map, Value, json};
use tracing::Instrument;

use crate::access::{self, Denied, Principal};
use crate::metrics::Metrics;
use crate::send::{SendError, Senders};
use crate::store::{Record, Status, Store, StoreError, now_ms};
use crate::tools::{ArgError, Tool, Tools};

/// Header with the name of the tool that created the envelope.
pub const TOOL_HEADER: &str = "x-asya-tool";

/// Seconds a call waits for the final status unless the tool says otherwise.
pub const DEFAULT_TIMEOUT: u64 = 300;

pub struct App {
    /// The tools file's and the flows' (`crate::flows`), merged: what is offered.
    tools: RwLock<Arc<Tools>>,
    /// (the tools file's, the flows'): changed and merged under this one lock.
    sources: Mutex<(Arc<Tools>, Arc<Tools>)>,
    pub store: Store,
    pub senders: Senders,
    pub namespace: String,
    pub metrics: Metrics,
    /// Trace settings (`OTEL_*`); off by default, context is continued either way.
    pub trace: TraceSettings,
    ids: IdSource,
    /// Records each call's spans when the `OTEL_*` variables ask for it.
    recorder: asya_telemetry::Recorder,
}

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("unknown tool {name:?} (tools: {known})")]
    UnknownTool { name: String, known: String },
    #[error("invalid arguments for tool {tool:?}: {}", .errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Arguments { tool: String, errors: Vec<ArgError> },
    #[error(transparent)]
    Denied(Denied),
    #[error(transparent)]
    Storage(#[from] StoreError),
    #[error("envelope {id} could not be sent: {source}")]
    Send { id: String, source: SendError },
}

/// A started call: the tool and the stored envelope.
pub struct Started {
    pub tool: Tool,
    pub record: Record,
}

impl App {
    pub fn new(tools: Tools, store: Store, senders: Senders, namespace: String) -> App {
        let tools = Arc::new(tools);
        App {
            tools: RwLock::new(tools.clone()),
            sources: Mutex::new((tools, Arc::new(Tools::default()))),
            store,
            senders,
            namespace,
            metrics: Metrics::new(),
            trace: TraceSettings::off(),
            ids: IdSource::new(),
            recorder: asya_telemetry::Recorder::off(),
        }
    }

    /// Exports the calls' spans through `recorder`.
    pub fn with_recorder(mut self, recorder: asya_telemetry::Recorder) -> App {
        self.recorder = recorder;
        self
    }

    /// Exports what is buffered, waiting at most `timeout` (at shutdown).
    pub fn shutdown_traces(&self, timeout: Duration) {
        self.recorder.shutdown(timeout);
    }

    /// Records spans by `trace` (sampling ratio, export endpoint).
    pub fn with_trace(mut self, trace: TraceSettings) -> App {
        self.trace = trace;
        self
    }

    pub fn tools(&self) -> Arc<Tools> {
        self.tools
            .read()
            .map(|t| t.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// The tools file's tools (at start and on each reload).
    pub fn set_tools(&self, tools: Tools) {
        self.merge_tools(|s| s.0 = Arc::new(tools));
    }

    /// The flows' tools (`crate::flows::watch`).
    pub fn set_flow_tools(&self, tools: Tools) {
        self.merge_tools(|s| s.1 = Arc::new(tools));
    }

    /// Changes one source and offers both merged; a name in the tools file wins over a
    /// flow's (the operator's word is last).
    fn merge_tools(&self, change: impl FnOnce(&mut (Arc<Tools>, Arc<Tools>))) {
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut sources);
        let (file, flows) = &*sources;
        let mut all = (**flows).clone();
        for (name, t) in &file.tools {
            if all.tools.insert(name.clone(), t.clone()).is_some() {
                tracing::warn!(tool = %name, "the tools file and a flow offer a tool of the same name; the file's is offered");
            }
        }
        match self.tools.write() {
            Ok(mut t) => *t = Arc::new(all),
            Err(p) => *p.into_inner() = Arc::new(all),
        }
    }

    /// The namespace of `tool`'s actors.
    pub fn namespace_of<'a>(&'a self, tool: &'a Tool) -> &'a str {
        tool.namespace.as_deref().unwrap_or(&self.namespace)
    }

    /// The tools `who` may call (and so see), by name.
    pub fn tools_for(&self, who: &Principal) -> Vec<Tool> {
        self.tools()
            .tools
            .values()
            .filter(|t| access::lists_tool(who, &t.name, self.namespace_of(t)))
            .cloned()
            .collect()
    }

    /// Checks that `who` may call the tool, validates, stores (pending), then sends to the
    /// first actor's queue. The envelope is stored before it is sent, so no report can
    /// arrive for an unknown id; a send that fails marks it failed and the caller gets the
    /// error (nothing accepted and lost).
    pub async fn start_call(
        &self,
        who: &Principal,
        name: &str,
        args: Option<&Value>,
        trace: &Incoming,
    ) -> Result<Started, CallError> {
        let tools = self.tools();
        let Some(tool) = tools.get(name).cloned() else {
            self.metrics.call(name, "unknown_tool");
            // Only the tools this token may call are named.
            let known: Vec<String> = self.tools_for(who).into_iter().map(|t| t.name).collect();
            return Err(CallError::UnknownTool {
                name: name.to_string(),
                known: known.join(", "),
            });
        };
        if let Err(d) = access::may_call(who, name, self.namespace_of(&tool)) {
            self.metrics.call(name, "forbidden");
            return Err(CallError::Denied(d));
        }
        let payload = match tool.check_arguments(args) {
            Ok(p) => p,
            Err(errors) => {
                self.metrics.call(name, "invalid_arguments");
                return Err(CallError::Arguments {
                    tool: name.to_string(),
                    errors,
                });
            }
        };
        let id = uuid::Uuid::new_v4().to_string();
        if let Some(why) = &trace.refused {
            tracing::debug!(reason = %why, "unusable traceparent on the request; starting a new trace");
        }
        // The call is the trace's first hop (or continues the caller's): the envelope
        // carries a PRODUCER child of it to the first actor.
        let call_span = trace_context::hop_span(trace, &self.ids, self.trace.ratio);
        let send = call_span.child(self.ids.span_id());
        // The call's log lines carry its trace and (SERVER) span ids, as the sidecars' do.
        let span = tracing::info_span!("envelope", id = %id, tool = %name, trace_id = %call_span.trace_id_hex(), span_id = %call_span.span_id_hex());
        let traced = self.recorder.enabled().then(|| {
            let queue = asya_api::naming::actor_queue(self.namespace_of(&tool), &tool.route[0]);
            let transport = tool.transport.as_deref();
            let system = crate::spans::messaging_system(
                transport.or(Some(self.senders.default_transport())),
            );
            (queue, system, std::time::SystemTime::now())
        });
        let started = self
            .start(
                tool,
                id.clone(),
                payload,
                (&send, trace.tracestate.as_deref()),
            )
            .instrument(span)
            .await;
        if let Some((queue, system, start)) = traced {
            let (outcome, error) = match &started {
                Ok(_) => ("accepted", None),
                Err(e) => ("unavailable", Some(e.to_string())),
            };
            let call = crate::spans::CallTrace {
                tool: name.to_string(),
                envelope_id: id,
                queue,
                system,
                server: call_span,
                parent: trace.parent,
                send,
                start,
                end: std::time::SystemTime::now(),
                outcome,
                error,
            };
            for s in crate::spans::call_spans(&call) {
                self.recorder.record(&s);
            }
        }
        started
    }

    async fn start(
        &self,
        tool: Tool,
        id: String,
        payload: Map<String, Value>,
        trace: SendTrace<'_>,
    ) -> Result<Started, CallError> {
        let now = now_ms();
        let ns = self.namespace_of(&tool).to_string();
        let record = Record {
            id: id.clone(),
            parent_id: None,
            tool: Some(tool.name.clone()),
            status: Status::Pending,
            progress: 0.0,
            actor: tool.route.first().cloned(),
            route: tool.route.clone(),
            result: None,
            error: None,
            created_ms: now,
            updated_ms: now,
            namespace: Some(ns.clone()),
        };
        if let Err(e) = self.store.create(&record).await {
            self.metrics.call(&tool.name, "unavailable");
            tracing::warn!(error = %e, "cannot store the envelope; refusing the call");
            return Err(e.into());
        }
        let mut headers = Map::new();
        headers.insert("trace_id".into(), json!(uuid::Uuid::new_v4().to_string()));
        headers.insert(TOOL_HEADER.into(), json!(tool.name));
        trace_context::set_headers(&mut headers, trace.0, trace.1);
        let env = Envelope {
            id: id.clone(),
            parent_id: None,
            route: Route {
                actors: tool.route.clone(),
                current: 0,
                extra: Map::new(),
            },
            headers,
            payload: Value::Object(payload),
            extra: Map::new(),
        };
        let queue = asya_api::naming::actor_queue(&ns, &tool.route[0]);
        let body = serde_json::to_vec(&env).unwrap_or_default();
        // The route's actors are woken while the envelope is sent (docs/DESIGN.md §6.1).
        let (sent, unwoken) = futures::join!(
            self.senders.send(tool.transport.as_deref(), &queue, body),
            self.senders
                .wake(tool.transport.as_deref(), &ns, &tool.route)
        );
        if unwoken > 0 {
            tracing::debug!(unwoken, "wake messages not handed to the broker");
        }
        if let Err(source) = sent {
            self.metrics.call(&tool.name, "unavailable");
            tracing::warn!(error = %source, %queue, "send failed; the envelope is marked failed");
            let error =
                json!({"reason": "send failed", "message": source.to_string(), "queue": queue});
            if let Err(e) = self
                .store
                .finish(&id, Status::Failed, None, None, Some(error))
                .await
            {
                tracing::warn!(error = %e, "could not record the failed send");
            }
            return Err(CallError::Send { id, source });
        }
        self.metrics.call(&tool.name, "accepted");
        tracing::info!(%queue, "envelope sent");
        Ok(Started { tool, record })
    }

    /// How long a call of `tool` waits for the final status.
    pub fn wait_for(tool: &Tool) -> Duration {
        Duration::from_secs(tool.timeout.unwrap_or(DEFAULT_TIMEOUT))
    }

    /// Records a final status reported for `id` and observes the time to it.
    pub async fn finish(
        &self,
        id: &str,
        status: Status,
        actor: Option<&str>,
        result: Option<Value>,
        error: Option<Value>,
    ) -> Result<Option<Record>, StoreError> {
        let before = self.store.get(id).await?;
        let r = self.store.finish(id, status, actor, result, error).await?;
        if let (Some(b), Some(r)) = (&before, &r)
            && !b.status.is_final()
            && r.status.is_final()
        {
            let secs = (r.updated_ms - r.created_ms).max(0) as f64 / 1000.0;
            self.metrics
                .finished(r.tool.as_deref().unwrap_or(""), r.status.as_str(), secs);
        }
        Ok(r)
    }
}
