//! The consume loop: each message gets a task that calls the runtime, routes the answer,
//! sends the results and acknowledges. Up to `ASYA_RUNTIME_PIPELINE` runtime calls are open
//! at once (the runtime serves them one at a time, in order, without waiting for the sidecar
//! in between); a message is acknowledged only after all its sends are confirmed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::config::Config;
use crate::fanin_client::{FanInClient, FanInError};
use crate::flow_routing::{self, FanIn, FlowStep, Start};
use crate::gateway_client::{Report, Reporter};
use crate::metrics::Metrics;
use crate::routing::{self, Answer, Queues};
use crate::runtime_client::RuntimeClient;
use crate::spans::{CallFailure, Hop, RuntimeCall, Spans};
use asya_transport::envelope::{self, Envelope};
use asya_transport::resiliency::{self, Decision, FailReason, Failure};
use asya_transport::trace_context::{self, IdSource};
use asya_transport::{Outgoing, Received, Transport, TransportError};

/// What to do with one message once the handler (if any) has run.
#[derive(Debug)]
pub struct Disposition {
    pub outgoing: Vec<Outgoing>,
    /// For `asya_actor_messages_processed_total{status}`.
    pub status: &'static str,
    /// For `asya_actor_messages_failed_total{reason}` when it went to x-sump.
    pub failure_reason: Option<String>,
    pub id: String,
    /// Reports to the gateway once the sends are confirmed and the input acknowledged.
    pub reports: Vec<Report>,
    /// Not judged: the platform stopped the runtime mid-call, so the message goes back to
    /// the broker (a counted redelivery) for another pod, with nothing sent.
    pub returned: bool,
    /// This hop's span (docs/DESIGN.md §4 "Traces"); `None` only before the envelope was read.
    pub hop: Option<Hop>,
}

/// Room for one message: held while it is in flight, the call part until the runtime answers.
struct Permits {
    in_flight: Option<tokio::sync::OwnedSemaphorePermit>,
    call: Option<tokio::sync::OwnedSemaphorePermit>,
}

pub struct Processor<T: Transport> {
    cfg: Arc<Config>,
    transport: Arc<T>,
    runtime: RuntimeClient,
    metrics: Arc<Metrics>,
    queues: Queues,
    own_queue: String,
    /// Bounds messages being processed (runtime call, sends, acknowledgement).
    in_flight: Arc<Semaphore>,
    /// Bounds runtime calls open at once (`ASYA_RUNTIME_PIPELINE`).
    calls: Arc<Semaphore>,
    seq: AtomicU64,
    reporter: Reporter,
    ids: IdSource,
    spans: Arc<Spans>,
    /// The gateway's fan-in endpoint (with `ASYA_GATEWAY_URL`): a flow fans out only where
    /// it can gather the branches.
    fanin: Option<FanInClient>,
    waker: Arc<crate::wake::Waker>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl<T: Transport> Processor<T> {
    pub fn new(
        cfg: Arc<Config>,
        transport: Arc<T>,
        metrics: Arc<Metrics>,
        max_in_flight: usize,
    ) -> Self {
        let queues = Queues {
            namespace: cfg.namespace.clone(),
        };
        let own_queue = queues.actor(&cfg.actor);
        let calls = Arc::new(Semaphore::new(cfg.runtime_pipeline.max(1)));
        let fanin = cfg.gateway.clone().and_then(|g| match FanInClient::new(g) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "no fan-in client (TLS roots); flows here cannot fan out");
                None
            }
        });
        let waker = Arc::new(crate::wake::Waker::new(
            &cfg.namespace,
            &cfg.actor,
            crate::wake::WAKE_EVERY,
        ));
        Processor {
            fanin,
            waker,
            reporter: Reporter::disabled(metrics.clone()),
            runtime: RuntimeClient::new(cfg.socket_path.clone()),
            cfg,
            transport,
            metrics,
            queues,
            own_queue,
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            calls,
            seq: AtomicU64::new(0),
            ids: IdSource::new(),
            spans: Arc::new(Spans::off()),
        }
    }

    /// Records each sampled hop's spans with `spans`.
    pub fn with_spans(mut self, spans: Arc<Spans>) -> Self {
        self.spans = spans;
        self
    }

    /// Reports progress and final statuses to the gateway through `reporter`.
    pub fn with_reporter(mut self, reporter: Reporter) -> Self {
        self.reporter = reporter;
        self
    }

    pub fn own_queue(&self) -> &str {
        &self.own_queue
    }

    /// Consumes until `shutdown` turns true, then waits for pending acknowledgements. A
    /// message received but not started when it turns true (waiting for a free runtime call)
    /// goes back to the queue at once, not when the in-flight ones are done: another pod can
    /// take it while this one drains.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tasks = JoinSet::new();
        'outer: loop {
            while tasks.try_join_next().is_some() {}
            let batch = tokio::select! {
                biased;
                _ = shutdown.wait_for(|s| *s) => break,
                r = self.transport.receive() => r,
            };
            let batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "receive failed");
                    continue;
                }
            };
            let mut batch = batch.into_iter();
            while let Some(msg) = batch.next() {
                let taken = Instant::now();
                let admitted = tokio::select! {
                    biased;
                    _ = shutdown.wait_for(|s| *s) => None,
                    p = self.admit() => Some(p),
                };
                let Some(permits) = admitted else {
                    // Not started: give it and the rest of the batch back right away.
                    for m in std::iter::once(msg).chain(batch.by_ref()) {
                        self.give_back(&m).await;
                    }
                    break 'outer;
                };
                self.clone().start(msg, permits, taken, &mut tasks);
            }
        }
        // Deliveries the broker already pushed to us and that were never started go back too.
        self.transport.stop_consuming().await;
        while tasks.join_next().await.is_some() {}
    }

    /// Returns a message that was never started, as not delivered (no redelivery counted
    /// where the broker allows), else as `release` does.
    async fn give_back(&self, m: &Received<T::Handle>) {
        if let Err(e) = self.transport.give_back(m).await {
            tracing::debug!(error = %e, "could not give a message back as new; releasing it");
            if let Err(e) = self.transport.release(&m.handle).await {
                // It returns anyway, when the connection closes or its visibility timeout ends.
                tracing::debug!(error = %e, "could not give a message back at once");
            }
        }
    }

    /// Waits for room: a slot for one more message in flight and one more runtime call.
    async fn admit(&self) -> Permits {
        // Closed only if the semaphores were dropped, which the processor never does.
        let in_flight = self.in_flight.clone().acquire_owned().await.ok();
        let call = self.calls.clone().acquire_owned().await.ok();
        Permits { in_flight, call }
    }

    /// Starts one admitted message: up to `runtime_pipeline` runtime calls are open at once
    /// (queued on the runtime in arrival order), the rest of the message's life runs in the
    /// task. `taken` is when it was taken from the batch: its duration includes the wait.
    fn start(
        self: Arc<Self>,
        msg: Received<T::Handle>,
        permits: Permits,
        taken: Instant,
        tasks: &mut JoinSet<()>,
    ) {
        self.metrics.received();
        tasks.spawn(async move {
            let Permits {
                in_flight: _in_flight,
                call,
            } = permits;
            self.transport.hold(&msg.handle);
            let disposition = self.dispose(&msg.body, msg.redeliveries).await;
            drop(call);
            self.transport.unhold(&msg.handle);
            let hop_span = disposition.hop.as_ref().map(|h| &h.span);
            let span = crate::spans::log_span(&self.cfg.actor, &disposition.id, hop_span);
            self.finish(msg, disposition, taken).instrument(span).await;
        });
    }

    /// Sends, then acknowledges; on a send that can never succeed, sends to x-sump instead.
    async fn finish(&self, msg: Received<T::Handle>, d: Disposition, started: Instant) {
        if d.returned {
            self.return_to_broker(&msg.handle).await;
            return;
        }
        let mut result = self.transport.send(&d.outgoing).await;
        let mut status = d.status;
        if let Err(e) = &result
            && e.is_permanent()
            && !d.outgoing.iter().any(|o| o.queue == self.queues.sump())
        {
            tracing::warn!(error = %e, "cannot deliver the result; sending the input to x-sump");
            let sump = self.sump_for_send_error(&msg.body, e, d.hop.as_ref());
            if let Some(h) = &d.hop {
                // The first sends never happened: only the x-sump one is this hop's.
                h.forget_sends_except(&sump.queue);
            }
            let reason = match e {
                TransportError::TooLarge { .. } => "too_large",
                _ => "no_such_queue",
            };
            result = self.transport.send(std::slice::from_ref(&sump)).await;
            if result.is_ok() {
                status = "failed";
                self.metrics.failed(reason);
            }
        } else if let Some(reason) = &d.failure_reason
            && result.is_ok()
        {
            self.metrics.failed(reason);
        }
        if self.spans.enabled()
            && let Some(h) = &d.hop
        {
            let err = result.as_ref().err().map(|e| e.to_string());
            self.spans.record(&h.record(&d.id, err));
        }
        match result {
            Ok(()) => {
                for o in &d.outgoing {
                    self.metrics.sent(&o.queue);
                }
                match self.transport.ack(&msg.handle).await {
                    Ok(()) => {
                        let trace = self.exemplar(d.hop.as_ref().map(|h| &h.span));
                        self.metrics
                            .finished(status, started.elapsed().as_secs_f64(), trace);
                        tracing::debug!(status, "done");
                        for r in d.reports {
                            self.reporter.send(r);
                        }
                    }
                    Err(e) => {
                        // The broker will redeliver: a duplicate, never a loss.
                        self.metrics.abandoned();
                        tracing::warn!(error = %e, "ack failed; the message will be redelivered");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "send failed; returning the message for redelivery");
                self.return_to_broker(&msg.handle).await;
            }
        }
    }

    /// Gives a message back for redelivery (a counted one), unacknowledged.
    async fn return_to_broker(&self, handle: &T::Handle) {
        self.metrics.abandoned();
        if let Err(e) = self.transport.release(handle).await {
            tracing::debug!(error = %e, "release failed (redelivered after reconnect or visibility timeout)");
        }
    }

    fn fallback_id(&self) -> String {
        format!(
            "malformed-{}-{}",
            now_ms(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The hop of an envelope whose headers are `headers` (or of a message that was none).
    /// The exemplar of a hop whose spans reach the trace backend (sampled, recording).
    fn exemplar(
        &self,
        span: Option<&asya_transport::trace_context::TraceParent>,
    ) -> Option<crate::metrics::TraceLabel> {
        crate::spans::exemplar(self.spans.enabled(), span)
    }

    fn hop(&self, headers: Option<&serde_json::Map<String, serde_json::Value>>) -> Hop {
        let incoming = headers.map(trace_context::incoming).unwrap_or_default();
        if let Some(why) = &incoming.refused {
            tracing::debug!(reason = %why, "unusable traceparent; starting a new trace");
        }
        let t = &self.cfg.trace;
        let span = trace_context::hop_span(&incoming, &self.ids, t.ratio);
        Hop::new(span, incoming)
    }

    fn sump_for_send_error(&self, body: &[u8], e: &TransportError, hop: Option<&Hop>) -> Outgoing {
        let reason = format!("result could not be delivered: {e}");
        let mut env = match envelope::parse(body, None) {
            Ok(env) => routing::to_sump(&env, &self.cfg.actor, &reason, None),
            Err(m) => {
                routing::malformed_to_sump(body, &self.cfg.actor, &m, self.fallback_id(), 4096)
            }
        };
        if matches!(e, TransportError::TooLarge { .. }) {
            env.payload = serde_json::Value::Null;
        }
        let fresh;
        let hop = match hop {
            Some(h) => h,
            None => {
                fresh = self.hop(None);
                &fresh
            }
        };
        self.outgoing(self.queues.sump(), &env, None, hop)
    }

    /// One send of this hop: its body carries a new PRODUCER span, child of the hop's.
    fn outgoing(
        &self,
        queue: String,
        env: &Envelope,
        delay: Option<Duration>,
        hop: &Hop,
    ) -> Outgoing {
        let send = hop.span.child(self.ids.span_id());
        hop.note_send(send.span_id, &queue);
        let trace = Some((&send, hop.tracestate.as_deref()));
        Outgoing {
            queue,
            body: envelope::to_body_stamped(env, now_ms(), trace),
            delay,
        }
    }

    /// Decides where a message goes. Calls the runtime; no broker I/O.
    pub async fn dispose(&self, body: &[u8], redeliveries: u32) -> Disposition {
        let actor = self.cfg.actor.as_str();
        let is_sump_consumer = self.own_queue == self.queues.sump();
        let check_actor = if self.cfg.is_end_actor {
            None
        } else {
            Some(actor)
        };
        let env = match envelope::parse(body, check_actor) {
            Ok(env) => env,
            Err(why) => {
                let sump =
                    routing::malformed_to_sump(body, actor, &why, self.fallback_id(), 64 * 1024);
                let hop = self.hop(None);
                let (trace_id, span_id) = (hop.span.trace_id_hex(), hop.span.span_id_hex());
                tracing::warn!(actor, id = %sump.id, trace_id, span_id, reason = %why, "malformed message");
                if is_sump_consumer {
                    // Sending it to x-sump again would loop: drop it, loudly.
                    return self.done(Vec::new(), "malformed", None, sump.id);
                }
                let out = vec![self.outgoing(self.queues.sump(), &sump, None, &hop)];
                let mut d = self.done(out, "malformed", Some(why.code().to_string()), sump.id);
                d.hop = Some(hop);
                return d;
            }
        };
        let id = env.id.clone();
        let hop = self.hop(Some(&env.headers));
        if let Some(wait) = envelope::queue_wait(&env, now_ms()) {
            let trace = self.exemplar(Some(&hop.span));
            self.metrics.queue_wait(wait.as_secs_f64(), trace);
        }
        let span = crate::spans::log_span(actor, &id, Some(&hop.span));
        let mut d = self
            .dispose_envelope(env, body, redeliveries, &hop)
            .instrument(span)
            .await;
        d.hop = Some(hop);
        d
    }

    async fn dispose_envelope(
        &self,
        env: Envelope,
        body: &[u8],
        redeliveries: u32,
        hop: &Hop,
    ) -> Disposition {
        if redeliveries > self.cfg.max_redeliveries {
            let reason = format!(
                "poison message: delivered {} times without finishing (limit {})",
                redeliveries + 1,
                self.cfg.max_redeliveries + 1
            );
            tracing::warn!(%reason, "to x-sump");
            return self.to_sump(&env, &reason, None, "poison", "poison", hop);
        }
        let mut env = env;
        let mut started_body = None;
        let flow = if self.cfg.is_end_actor {
            None
        } else {
            match flow_routing::carried(&env) {
                Some(Ok(c)) => {
                    hop.note_trail_before(c.trail.len());
                    Some(c)
                }
                Some(Err(why)) => {
                    tracing::warn!(%why, "to x-sump");
                    return self.to_sump(&env, &why, None, "failed", "flow_error", hop);
                }
                None => match &self.cfg.flow_entry {
                    None => None,
                    Some(program) => {
                        match flow_routing::start(&env, program, &self.cfg.actor, &self.queues) {
                            Start::Handle(e) => {
                                env = *e;
                                // The handler sees the flow's first mutations.
                                started_body = serde_json::to_vec(&env).ok();
                                flow_routing::carried(&env).and_then(Result::ok)
                            }
                            Start::Step(step) => {
                                tracing::debug!(flow = %program.flow, "flow starts elsewhere");
                                return self.flow_disposition(&env, step, "success", hop);
                            }
                        }
                    }
                },
            }
        };
        let branch = match flow.as_ref().map(|_| flow_routing::branch_of(&env)) {
            Some(Some(Ok(b))) => Some(b),
            Some(Some(Err(why))) => {
                tracing::warn!(%why, "to x-sump");
                return self.to_sump(&env, &why, None, "failed", "flow_error", hop);
            }
            _ => None,
        };
        let body = started_body.as_deref().unwrap_or(body);
        if self.reporter.enabled() && !self.cfg.is_end_actor {
            for phase in ["received", "processing"] {
                self.reporter.send(self.progress(&env, phase));
            }
        }
        self.wake_later_hops(&env);
        let started = Instant::now();
        let call_start = SystemTime::now();
        let call = self
            .runtime
            .call(body, self.cfg.runtime_timeout, self.cfg.runtime_wait)
            .await;
        self.metrics.runtime_call(started.elapsed().as_secs_f64());
        let call_end = SystemTime::now();
        let answer = match call {
            Ok(v) => routing::interpret(v),
            Err(e) if e.no_runtime() && self.runtime.stopping() => {
                // A pod going away (its grace period over, or deleted by force) kills the
                // runtime the kubelet had told to stop: not this envelope's doing.
                tracing::info!(error = %e, "runtime stopped by its pod's shutdown mid-call; returning the message to the queue");
                let mut d = self.done(Vec::new(), "returned", None, env.id.clone());
                d.returned = true;
                return d;
            }
            Err(e) => {
                let (code, error_type) = e.kind();
                tracing::warn!(error = %e, "runtime call failed");
                Answer::Failure(Failure {
                    code: code.into(),
                    error_type: error_type.into(),
                    message: e.to_string(),
                    traceback: None,
                    mro: Vec::new(),
                })
            }
        };
        hop.note_runtime(RuntimeCall {
            span_id: self.ids.span_id(),
            start: call_start,
            end: call_end,
            failure: match &answer {
                Answer::Failure(f) => Some(CallFailure {
                    error_type: f.error_type.clone(),
                    message: f.message.clone(),
                }),
                Answer::Results(_) => None,
            },
        });
        match (answer, flow) {
            (Answer::Results(items), Some(c)) if let Some(b) = branch => {
                let ns = &self.cfg.namespace;
                let report =
                    flow_routing::branch_answer(&env, &b, items, self.cfg.handler_mode, ns);
                self.join(&env, c, &b, report, hop).await
            }
            (Answer::Results(items), Some(c)) => {
                let step = flow_routing::after_results(
                    &env,
                    c,
                    items,
                    self.cfg.handler_mode,
                    &self.queues,
                );
                self.flow_disposition(&env, step, "success", hop)
            }
            (Answer::Results(items), None) => self.on_results(env, items, hop),
            (Answer::Failure(f), flow) => {
                self.metrics.runtime_error(&f.error_type);
                self.on_failure(env, f, flow, branch, hop).await
            }
        }
    }

    /// Tells the route's later actors that work is coming (docs/DESIGN.md §6.1), off the
    /// envelope's path: published from a task of its own, unconfirmed, failures counted.
    fn wake_later_hops(&self, env: &Envelope) {
        if self.cfg.is_end_actor {
            return;
        }
        let queues = self
            .waker
            .due(&env.route.actors, env.route.current, Instant::now());
        if queues.is_empty() {
            return;
        }
        let (transport, metrics, body) = (
            self.transport.clone(),
            self.metrics.clone(),
            self.waker.body(),
        );
        tokio::spawn(async move {
            let failed = transport.wake(&queues, &body).await;
            if failed > 0 {
                tracing::debug!(failed, "wake messages not handed to the broker");
            }
            metrics.wakes(queues.len().saturating_sub(failed), failed);
        });
    }

    fn done(
        &self,
        outgoing: Vec<Outgoing>,
        status: &'static str,
        failure_reason: Option<String>,
        id: String,
    ) -> Disposition {
        Disposition {
            outgoing,
            status,
            failure_reason,
            id,
            reports: Vec::new(),
            returned: false,
            hop: None,
        }
    }

    fn to_sump(
        &self,
        env: &Envelope,
        reason: &str,
        failure: Option<&Failure>,
        status: &'static str,
        metric_reason: &str,
        hop: &Hop,
    ) -> Disposition {
        let id = env.id.clone();
        if self.own_queue == self.queues.sump() {
            tracing::error!(reason, "end actor on x-sump failed; dropping the envelope");
            return self.done(Vec::new(), status, None, id);
        }
        let mut sump = routing::to_sump(env, &self.cfg.actor, reason, failure);
        if let Some(limit) = self.transport.max_message_bytes()
            && envelope::to_body_stamped(&sump, now_ms(), None).len() > limit
        {
            // The reason must arrive even when the envelope itself is too big to carry.
            sump.payload = serde_json::Value::Null;
        }
        let out = vec![self.outgoing(self.queues.sump(), &sump, None, hop)];
        self.done(out, status, Some(metric_reason.to_string()), id)
    }

    fn on_results(&self, env: Envelope, items: Vec<serde_json::Value>, hop: &Hop) -> Disposition {
        if self.cfg.is_end_actor {
            let mut d = self.done(Vec::new(), "success", None, env.id.clone());
            if self.reporter.enabled() {
                d.reports.push(self.final_report(&env));
            }
            return d;
        }
        match routing::route_results(&env, items, self.cfg.handler_mode, &self.queues) {
            Ok(routed) => {
                let out: Vec<Outgoing> = routed
                    .iter()
                    .map(|(q, e)| self.outgoing(q.clone(), e, None, hop))
                    .collect();
                if let Some(limit) = self.transport.max_message_bytes()
                    && let Some(big) = out.iter().find(|o| o.body.len() > limit)
                {
                    let reason = format!(
                        "result too large: {} bytes for {} exceeds the transport limit of {limit} bytes",
                        big.body.len(),
                        big.queue
                    );
                    // None of those sends happens: only the x-sump one is this hop's.
                    hop.forget_sends();
                    return self.to_sump(&env, &reason, None, "failed", "too_large", hop);
                }
                tracing::debug!(count = out.len(), "routed");
                let mut d = self.done(out, "success", None, env.id.clone());
                if self.reporter.enabled() {
                    d.reports.push(self.progress(&env, "completed"));
                    for (_, e) in &routed {
                        if let Some(parent) = &e.parent_id
                            && e.id != env.id
                        {
                            d.reports.push(Report::child(
                                &e.id,
                                parent,
                                &e.route.actors,
                                e.route.current,
                            ));
                        }
                    }
                }
                d
            }
            Err(v) => {
                tracing::warn!(violation = %v, "handler broke the routing rules");
                self.to_sump(&env, &v.to_string(), None, "failed", "route_violation", hop)
            }
        }
    }

    fn progress(&self, env: &Envelope, phase: &str) -> Report {
        Report::progress(
            &env.id,
            env.parent_id.as_deref(),
            &self.cfg.actor,
            phase,
            env.route.current,
            env.route.actors.len(),
        )
    }

    /// The end actors' report: x-sink → succeeded with the payload, x-sump → failed with
    /// the reason the envelope carries.
    fn final_report(&self, env: &Envelope) -> Report {
        if self.own_queue == self.queues.sump() {
            let error = env
                .headers
                .get(routing::ERROR_HEADER)
                .cloned()
                .unwrap_or_else(|| serde_json::json!({"reason": "reached x-sump"}));
            Report::final_status(&env.id, &self.cfg.actor, false, None, Some(error))
        } else {
            Report::final_status(
                &env.id,
                &self.cfg.actor,
                true,
                Some(env.payload.clone()),
                None,
            )
        }
    }

    /// The sends a flow's evaluation decided, checked against the transport's size limit.
    fn flow_disposition(
        &self,
        env: &Envelope,
        step: FlowStep,
        status: &'static str,
        hop: &Hop,
    ) -> Disposition {
        let decided = crate::flow_trace::decided(hop.trail_before(), &step);
        if let Some(d) = &decided {
            tracing::debug!(decisions = %d.message(), "flow decided");
            hop.note_flow(d.clone());
        }
        let (routed, branches) = match step {
            FlowStep::Branches(_) if self.fanin.is_none() => {
                let reason = "a flow fans out here, and this actor has no gateway to gather the \
                              branches (ASYA_GATEWAY_URL is not set); nothing was sent";
                tracing::warn!(reason, "flow to x-sump");
                return self.to_sump(env, reason, None, "failed", "flow_error", hop);
            }
            FlowStep::Branches(b) => (b, true),
            FlowStep::Routed(r) => (r, false),
            FlowStep::Sump {
                reason,
                failure,
                metric,
                instead,
            } => {
                tracing::warn!(%reason, "flow to x-sump");
                let at = instead.as_deref().unwrap_or(env);
                return self.to_sump(at, &reason, failure.as_ref(), "failed", metric, hop);
            }
        };
        {
            {
                let out: Vec<Outgoing> = routed
                    .iter()
                    .map(|(q, e)| self.outgoing(q.clone(), e, None, hop))
                    .collect();
                if let Some(limit) = self.transport.max_message_bytes()
                    && let Some(big) = out.iter().find(|o| o.body.len() > limit)
                {
                    let reason = format!(
                        "result too large: {} bytes for {} exceeds the transport limit of {limit} bytes",
                        big.body.len(),
                        big.queue
                    );
                    hop.forget_sends();
                    return self.to_sump(env, &reason, None, "failed", "too_large", hop);
                }
                tracing::debug!(to = %out.iter().map(|o| o.queue.as_str()).collect::<Vec<_>>().join(","), "flow routed");
                let mut d = self.done(out, status, None, env.id.clone());
                if self.reporter.enabled() {
                    let mut report = self.progress(env, "completed");
                    // The gateway keeps each report's message in the envelope's history,
                    // where `asya trace` reads the hop's decisions.
                    if let (Some(dec), crate::gateway_client::Body::Progress(p)) =
                        (&decided, &mut report.body)
                    {
                        p.message = Some(dec.message());
                    }
                    d.reports.push(report);
                    for (_, e) in routed.iter().filter(|_| branches) {
                        let parent = e.parent_id.as_deref().unwrap_or(&env.id);
                        d.reports.push(Report::child(
                            &e.id,
                            parent,
                            &e.route.actors,
                            e.route.current,
                        ));
                    }
                }
                d
            }
        }
    }

    /// A fan-out branch's report to the gateway, and what its answer calls for: nothing (the
    /// join waits, or another branch fired it), or the flow's next step when this branch
    /// completed or failed the join. A gateway out of reach returns the branch to the broker.
    async fn join(
        &self,
        env: &Envelope,
        c: asya_flow::Carried,
        b: &FanIn,
        report: asya_transport::fanin::BranchReport,
        hop: &Hop,
    ) -> Disposition {
        let Some(client) = &self.fanin else {
            let reason = format!(
                "flow {}: fan-out branch {} has no gateway to join at (ASYA_GATEWAY_URL is not \
                 set on actor {})",
                c.program.flow, env.id, self.cfg.actor
            );
            return self.to_sump(env, &reason, None, "failed", "flow_error", hop);
        };
        match client.report(&b.join, b.index, &report).await {
            Ok(answer) => {
                tracing::debug!(join = %b.join, index = b.index, ?answer, "branch joined");
                let step = flow_routing::after_join(env, c, b, answer, &self.queues);
                self.flow_disposition(env, step, "success", hop)
            }
            Err(e @ FanInError::Refused { .. }) => {
                tracing::warn!(error = %e, "to x-sump");
                self.to_sump(env, &e.to_string(), None, "failed", "flow_error", hop)
            }
            Err(e) => {
                tracing::warn!(error = %e, "branch result not stored; returning the message for redelivery");
                let mut d = self.done(Vec::new(), "returned", None, env.id.clone());
                d.returned = true;
                d
            }
        }
    }

    async fn on_failure(
        &self,
        mut env: Envelope,
        f: Failure,
        flow: Option<asya_flow::Carried>,
        branch: Option<FanIn>,
        hop: &Hop,
    ) -> Disposition {
        let actor = self.cfg.actor.clone();
        let attempt = routing::failed_attempts(&env, &actor) + 1;
        let decision = resiliency::decide(&self.cfg.resiliency, &f, attempt);
        routing::record_attempt(&mut env, &actor, attempt, &f, now_ms());
        match decision {
            Decision::Retry { delay, policy, .. } => {
                tracing::info!(attempt, ?delay, policy, error = %f.message, "retrying later");
                let out = vec![self.outgoing(
                    self.own_queue.clone(),
                    &env,
                    (!delay.is_zero()).then_some(delay),
                    hop,
                )];
                self.done(out, "retried", None, env.id)
            }
            Decision::Fail { reason } => match (flow, branch) {
                (Some(c), Some(b)) => {
                    tracing::info!(attempt, error_type = %f.error_type, "fan-out branch failed; the join decides");
                    let report = flow_routing::branch_failure(&b, &f, &self.cfg.namespace);
                    self.join(&env, c, &b, report, hop).await
                }
                (Some(c), None) => {
                    tracing::info!(attempt, error_type = %f.error_type, "handler failed in a flow; its except paths decide");
                    let step = flow_routing::after_failure(&env, c, &f, &self.queues);
                    self.flow_disposition(&env, step, "caught", hop)
                }
                (None, _) => {
                    tracing::warn!(attempt, error_type = %f.error_type, error = %f.message, %reason, "to x-sump");
                    let metric = failed_metric_reason(&reason, &f);
                    self.to_sump(&env, &reason.to_string(), Some(&f), "failed", metric, hop)
                }
            },
        }
    }
}

/// The `reason` label of `asya_actor_messages_failed_total` when the retry rules give up:
/// the rule's verdict, or the error's own code when no policy applied.
fn failed_metric_reason<'a>(reason: &FailReason, f: &'a Failure) -> &'a str {
    match reason {
        FailReason::RetriesExhausted { .. } => "retries_exhausted",
        FailReason::ActionFail { .. } => "action_fail",
        FailReason::NoPolicy => &f.code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn give_ups_are_labelled_by_kind_not_by_text() {
        let f = Failure {
            code: "timeout".into(),
            error_type: "ActorTimeout".into(),
            message: "m".into(),
            traceback: None,
            mro: Vec::new(),
        };
        let exhausted = FailReason::RetriesExhausted {
            attempt: 3,
            max_attempts: 3,
            policy: "default".into(),
        };
        assert_eq!(failed_metric_reason(&exhausted, &f), "retries_exhausted");
        let rule = FailReason::ActionFail {
            pattern: "retries exhausted".into(),
        };
        assert_eq!(failed_metric_reason(&rule, &f), "action_fail");
        assert_eq!(failed_metric_reason(&FailReason::NoPolicy, &f), "timeout");
    }
}
