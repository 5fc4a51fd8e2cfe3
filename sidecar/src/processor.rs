//! The consume loop: each message gets a task that calls the runtime between the pure
//! decisions of `disposition`, then performs the disposition they give in one order: sends
//! (confirmed), acknowledgement, reports. Up to `ASYA_RUNTIME_PIPELINE` runtime calls are open
//! at once (the runtime serves them one at a time, in order, without waiting for the sidecar
//! in between); a message is acknowledged only after all its sends are confirmed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::config::Config;
use crate::disposition::{self, After, Before, Called, Ctx, Disposition, Level, Stamp};
use crate::fanin_client::{FanInClient, FanInError};
use crate::gateway_client::Reporter;
use crate::metrics::Metrics;
use crate::routing::{self, Answer, Queues};
use crate::runtime_client::RuntimeClient;
use crate::spans::{CallFailure, Hop, RuntimeCall, Spans};
use asya_transport::envelope::{self, Envelope};
use asya_transport::resiliency::Failure;
use asya_transport::trace_context::{self, IdSource};
use asya_transport::{Received, Transport};

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
            let (disposition, hop) = self.dispose(&msg.body, msg.redeliveries).await;
            drop(call);
            self.transport.unhold(&msg.handle);
            let hop_span = hop.as_ref().map(|h| &h.span);
            let span = crate::spans::log_span(&self.cfg.actor, &disposition.id, hop_span);
            self.finish(msg, disposition, hop, taken)
                .instrument(span)
                .await;
        });
    }

    /// Performs a disposition, in the order that keeps the platform's promise: the sends,
    /// confirmed by the broker; then the acknowledgement; then the reports. A send the broker
    /// can never take turns the input into an x-sump send instead; any other send failure
    /// returns the message for redelivery, acknowledged never.
    async fn finish(
        &self,
        msg: Received<T::Handle>,
        mut d: Disposition,
        hop: Option<Hop>,
        started: Instant,
    ) {
        if d.returned {
            self.return_to_broker(&msg.handle).await;
            return;
        }
        let mut result = self.transport.send(&d.outgoing()).await;
        if let Err(e) = &result
            && e.is_permanent()
        {
            let fresh;
            let stamp_hop = match &hop {
                Some(h) => h,
                None => {
                    fresh = self.hop(None);
                    &fresh
                }
            };
            let ctx = self.ctx();
            let fallback = self.fallback_id();
            let instead = self.stamped(stamp_hop, |st| {
                disposition::after_send_refused(&ctx, &d, &msg.body, e, fallback, st)
            });
            if let Some(instead) = instead {
                d = instead;
                write_log(&mut d);
                result = self.transport.send(&d.outgoing()).await;
            }
        }
        if result.is_ok()
            && let Some(reason) = &d.failure_reason
        {
            self.metrics.failed(reason);
        }
        if self.spans.enabled()
            && let Some(h) = &hop
        {
            let err = result.as_ref().err().map(|e| e.to_string());
            self.spans
                .record(&h.record(&d.id, d.send_spans(), d.flow.clone(), err));
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "send failed; returning the message for redelivery");
            self.return_to_broker(&msg.handle).await;
            return;
        }
        for s in &d.sends {
            self.metrics.sent(&s.out.queue);
        }
        if let Err(e) = self.transport.ack(&msg.handle).await {
            // The broker will redeliver: a duplicate, never a loss.
            self.metrics.abandoned();
            tracing::warn!(error = %e, "ack failed; the message will be redelivered");
            return;
        }
        let trace = self.exemplar(hop.as_ref().map(|h| &h.span));
        self.metrics
            .finished(d.status, started.elapsed().as_secs_f64(), trace);
        tracing::debug!(status = d.status, "done");
        for r in d.reports {
            self.reporter.send(r);
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

    /// The exemplar of a hop whose spans reach the trace backend (sampled, recording).
    fn exemplar(
        &self,
        span: Option<&asya_transport::trace_context::TraceParent>,
    ) -> Option<crate::metrics::TraceLabel> {
        crate::spans::exemplar(self.spans.enabled(), span)
    }

    /// The hop of an envelope whose headers are `headers` (or of a message that was none).
    fn hop(&self, headers: Option<&serde_json::Map<String, serde_json::Value>>) -> Hop {
        let incoming = headers.map(trace_context::incoming).unwrap_or_default();
        if let Some(why) = &incoming.refused {
            tracing::debug!(reason = %why, "unusable traceparent; starting a new trace");
        }
        let t = &self.cfg.trace;
        let span = trace_context::hop_span(&incoming, &self.ids, t.ratio);
        Hop::new(span, incoming)
    }

    /// What the decisions know of this sidecar besides its configuration.
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            cfg: &self.cfg,
            queues: &self.queues,
            reporting: self.reporter.enabled(),
            can_join: self.fanin.is_some(),
            max_bytes: self.transport.max_message_bytes(),
        }
    }

    /// Runs a decision with the hop's stamp: now, its trace context, fresh span ids.
    fn stamped<R>(&self, hop: &Hop, decide: impl FnOnce(&mut Stamp) -> R) -> R {
        let mut ids = || self.ids.span_id();
        let mut st = Stamp {
            now_ms: now_ms(),
            span: hop.span,
            tracestate: hop.tracestate.as_deref(),
            span_ids: &mut ids,
        };
        decide(&mut st)
    }

    /// Decides what becomes of a message: reads it, calls the runtime (and the gateway's
    /// join for a fan-out branch) between the pure decisions of `disposition`. No broker
    /// I/O; the hop is `None` only for a malformed message dropped on x-sump.
    pub async fn dispose(&self, body: &[u8], redeliveries: u32) -> (Disposition, Option<Hop>) {
        let actor = self.cfg.actor.as_str();
        let ctx = self.ctx();
        let check_actor = if self.cfg.is_end_actor {
            None
        } else {
            Some(actor)
        };
        let env = match envelope::parse(body, check_actor) {
            Ok(env) => env,
            Err(why) => {
                let hop = self.hop(None);
                let fallback = self.fallback_id();
                let mut d = self.stamped(&hop, |st| {
                    disposition::malformed(&ctx, body, &why, fallback, st)
                });
                let (trace_id, span_id) = (hop.span.trace_id_hex(), hop.span.span_id_hex());
                tracing::warn!(actor, id = %d.id, trace_id, span_id, reason = %why, "malformed message");
                write_log(&mut d);
                // Dropped on x-sump, it sent nothing: no hop to record.
                let hop = (!d.sends.is_empty()).then_some(hop);
                return (d, hop);
            }
        };
        let hop = self.hop(Some(&env.headers));
        if let Some(wait) = envelope::queue_wait(&env, now_ms()) {
            let trace = self.exemplar(Some(&hop.span));
            self.metrics.queue_wait(wait.as_secs_f64(), trace);
        }
        let span = crate::spans::log_span(actor, &env.id, Some(&hop.span));
        let d = self
            .dispose_envelope(&ctx, env, body, redeliveries, &hop)
            .instrument(span)
            .await;
        (d, Some(hop))
    }

    /// The envelope's way to its disposition: decide, call the runtime, decide, (ask the
    /// join, decide). Each decision is `disposition`'s; the I/O between them is here.
    async fn dispose_envelope(
        &self,
        ctx: &Ctx<'_>,
        env: Envelope,
        body: &[u8],
        redeliveries: u32,
        hop: &Hop,
    ) -> Disposition {
        let before = self.stamped(hop, |st| {
            disposition::before_call(ctx, env, redeliveries, st)
        });
        let mut call = match before {
            Before::Done(mut d) => {
                write_log(&mut d);
                return d;
            }
            Before::Call(c) => c,
        };
        for r in std::mem::take(&mut call.reports) {
            self.reporter.send(r);
        }
        self.wake_later_hops(&call.env);
        let called = self
            .call_runtime(call.body.as_deref().unwrap_or(body), hop)
            .await;
        let after = self.stamped(hop, |st| disposition::after_call(ctx, *call, called, st));
        let mut d = match after {
            After::Done(d) => d,
            After::Join(j) => {
                let answer = match &self.fanin {
                    Some(client) => client.report(&j.fanin.join, j.fanin.index, &j.report).await,
                    // Not reached: a join is asked only where a client exists (`can_join`).
                    None => Err(FanInError::Unavailable("no fan-in client".into())),
                };
                self.stamped(hop, |st| disposition::after_join(ctx, *j, answer, st))
            }
        };
        write_log(&mut d);
        d
    }

    /// Calls the runtime with `body` and notes the call on the hop and in the metrics.
    async fn call_runtime(&self, body: &[u8], hop: &Hop) -> Called {
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
                return Called::Stopped;
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
        let failure = match &answer {
            Answer::Failure(f) => {
                self.metrics.runtime_error(&f.error_type);
                Some(CallFailure {
                    error_type: f.error_type.clone(),
                    message: f.message.clone(),
                })
            }
            Answer::Results(_) => None,
        };
        hop.note_runtime(RuntimeCall {
            span_id: self.ids.span_id(),
            start: call_start,
            end: call_end,
            failure,
        });
        Called::Answer(answer)
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
}

/// Writes the decision's log lines (in the hop's log span) and clears them.
fn write_log(d: &mut Disposition) {
    for (level, line) in std::mem::take(&mut d.log) {
        match level {
            Level::Debug => tracing::debug!("{line}"),
            Level::Info => tracing::info!("{line}"),
            Level::Warn => tracing::warn!("{line}"),
            Level::Error => tracing::error!("{line}"),
        }
    }
}
