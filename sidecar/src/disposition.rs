//! The disposition of one envelope (docs/DESIGN.md §4, §12): from the envelope, the
//! runtime's answer and the configuration to everything its hop does — the sends (next
//! actors, x-sink, x-sump, a flow's branches or continuation, a retry) as stamped bodies with
//! their PRODUCER span ids, the size checks, the reports to the gateway, the metric labels
//! and the hop's flow decisions — as a value. Pure: no I/O, no clock, no randomness (the time
//! and the span ids come in a `Stamp`); the processor performs what it returns.
//!
//! An envelope passes through up to three decisions, each one after an I/O step:
//! `before_call` (poison, flow entry, branch; the `received`/`processing` reports), then after
//! the runtime call `after_call`, and for a fan-out branch after the gateway's join answer
//! `after_join`. `after_send_refused` decides again when the broker refuses a send for good.

use std::time::Duration;

use serde_json::Value;

use crate::config::Config;
use crate::fanin_client::FanInError;
use crate::flow_routing::{self, FanIn, FlowStep, Start};
use crate::flow_trace::Decided;
use crate::gateway_client::{Body, Report};
use crate::routing::{self, Answer, Queues};
use asya_flow::Carried;
use asya_transport::envelope::{self, Envelope, Malformed};
use asya_transport::fanin::{BranchReport, JoinAnswer};
use asya_transport::resiliency::{self, Decision, FailReason, Failure};
use asya_transport::trace_context::TraceParent;
use asya_transport::{Outgoing, TransportError};

/// What the decisions know of this sidecar besides its configuration.
pub struct Ctx<'a> {
    pub cfg: &'a Config,
    pub queues: &'a Queues,
    /// Reports go to a gateway (`ASYA_GATEWAY_URL`).
    pub reporting: bool,
    /// A gateway gathers fan-out branches here (a fan-in client exists).
    pub can_join: bool,
    /// The transport's limit on a message body.
    pub max_bytes: Option<usize>,
}

impl Ctx<'_> {
    fn actor(&self) -> &str {
        &self.cfg.actor
    }

    fn own_queue(&self) -> String {
        self.queues.actor(&self.cfg.actor)
    }

    /// This sidecar consumes x-sump: sending there again would loop.
    pub fn is_sump_consumer(&self) -> bool {
        self.own_queue() == self.queues.sump()
    }
}

/// The hop's context for the bodies it sends: the time stamp and the trace context, each
/// send a PRODUCER child of `span` with an id from `span_ids`.
pub struct Stamp<'a> {
    pub now_ms: u64,
    pub span: TraceParent,
    pub tracestate: Option<&'a str>,
    pub span_ids: &'a mut dyn FnMut() -> u64,
}

impl Stamp<'_> {
    fn send(&mut self, queue: String, env: &Envelope, delay: Option<Duration>) -> Send {
        let span_id = (self.span_ids)();
        let producer = self.span.child(span_id);
        let trace = Some((&producer, self.tracestate));
        Send {
            span_id,
            out: Outgoing {
                queue,
                body: envelope::to_body_stamped(env, self.now_ms, trace),
                delay,
            },
        }
    }
}

/// One send of the hop and its PRODUCER span.
#[derive(Debug, Clone)]
pub struct Send {
    pub span_id: u64,
    pub out: Outgoing,
}

/// How a log line of the decision is written (the processor writes it in the hop's span).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// What to do with one message, decided.
#[derive(Debug)]
pub struct Disposition {
    /// The envelope's id (or the one given to a message that was none).
    pub id: String,
    /// Sent, with confirms, before the message is acknowledged.
    pub sends: Vec<Send>,
    /// For `asya_actor_messages_processed_total{status}`.
    pub status: &'static str,
    /// For `asya_actor_messages_failed_total{reason}` once the sends are confirmed.
    pub failure_reason: Option<String>,
    /// To the gateway once the sends are confirmed and the message acknowledged.
    pub reports: Vec<Report>,
    /// Not judged: the message goes back to the broker (a counted redelivery), nothing sent.
    pub returned: bool,
    /// The flow's decisions in this hop (the `process` span's attributes).
    pub flow: Option<Decided>,
    /// Why, for the log.
    pub log: Vec<(Level, String)>,
}

impl Disposition {
    fn new(id: String, sends: Vec<Send>, status: &'static str) -> Disposition {
        Disposition {
            id,
            sends,
            status,
            failure_reason: None,
            reports: Vec::new(),
            returned: false,
            flow: None,
            log: Vec::new(),
        }
    }

    /// Back to the broker, unjudged.
    fn returned(id: String) -> Disposition {
        Disposition {
            returned: true,
            ..Disposition::new(id, Vec::new(), "returned")
        }
    }

    fn logged(mut self, level: Level, line: String) -> Disposition {
        self.log.push((level, line));
        self
    }

    pub fn outgoing(&self) -> Vec<Outgoing> {
        self.sends.iter().map(|s| s.out.clone()).collect()
    }

    /// The hop's sends as its PRODUCER spans: span id and queue.
    pub fn send_spans(&self) -> Vec<(u64, String)> {
        self.sends
            .iter()
            .map(|s| (s.span_id, s.out.queue.clone()))
            .collect()
    }
}

/// A message that is no envelope: to x-sump with the reason, or dropped on x-sump itself.
pub fn malformed(
    ctx: &Ctx,
    body: &[u8],
    why: &Malformed,
    fallback_id: String,
    st: &mut Stamp,
) -> Disposition {
    let sump = routing::malformed_to_sump(body, ctx.actor(), why, fallback_id, 64 * 1024);
    if ctx.is_sump_consumer() {
        return Disposition::new(sump.id, Vec::new(), "malformed").logged(
            Level::Error,
            "malformed message on x-sump; dropping it (sending it again would loop)".into(),
        );
    }
    let sends = vec![st.send(ctx.queues.sump(), &sump, None)];
    Disposition {
        failure_reason: Some(why.code().to_string()),
        ..Disposition::new(sump.id, sends, "malformed")
    }
}

/// An envelope the runtime is to handle, and what its hop knows before the call.
#[derive(Debug)]
pub struct Call {
    pub env: Envelope,
    /// The body the handler gets when it differs from the one that arrived: the flow's first
    /// mutations applied.
    pub body: Option<Vec<u8>>,
    pub flow: Option<Carried>,
    pub branch: Option<FanIn>,
    /// Decisions the envelope's flow trail held when it arrived (0: none, or no flow).
    pub trail_before: usize,
    /// Sent to the gateway before the call (`received`, `processing`).
    pub reports: Vec<Report>,
}

/// Before the runtime call: a call to make, or a disposition without one.
#[derive(Debug)]
pub enum Before {
    Call(Box<Call>),
    Done(Disposition),
}

/// Before the call: a poison message, a broken flow or fan-in field go to x-sump; a flow
/// that starts elsewhere is passed on; anything else is called.
pub fn before_call(ctx: &Ctx, env: Envelope, redeliveries: u32, st: &mut Stamp) -> Before {
    let cfg = ctx.cfg;
    if redeliveries > cfg.max_redeliveries {
        let reason = format!(
            "poison message: delivered {} times without finishing (limit {})",
            redeliveries + 1,
            cfg.max_redeliveries + 1
        );
        return Before::Done(to_sump(ctx, &env, &reason, None, "poison", "poison", st));
    }
    let mut env = env;
    let mut body = None;
    let mut trail_before = 0;
    let flow = if cfg.is_end_actor {
        None
    } else {
        match flow_routing::carried(&env) {
            Some(Ok(c)) => {
                trail_before = c.trail.len();
                Some(c)
            }
            Some(Err(why)) => {
                return Before::Done(to_sump(ctx, &env, &why, None, "failed", "flow_error", st));
            }
            None => match &cfg.flow_entry {
                None => None,
                Some(program) => {
                    match flow_routing::start(&env, program, ctx.actor(), ctx.queues) {
                        Start::Handle(e) => {
                            env = *e;
                            // The handler sees the flow's first mutations.
                            body = serde_json::to_vec(&env).ok();
                            flow_routing::carried(&env).and_then(Result::ok)
                        }
                        Start::Step(step) => {
                            let d = flow_step(ctx, &env, step, "success", 0, st);
                            let line = format!("flow {} starts elsewhere", program.flow);
                            return Before::Done(d.logged(Level::Debug, line));
                        }
                    }
                }
            },
        }
    };
    let branch = match flow.as_ref().map(|_| flow_routing::branch_of(&env)) {
        Some(Some(Ok(b))) => Some(b),
        Some(Some(Err(why))) => {
            return Before::Done(to_sump(ctx, &env, &why, None, "failed", "flow_error", st));
        }
        _ => None,
    };
    let reports = if ctx.reporting && !cfg.is_end_actor {
        ["received", "processing"]
            .into_iter()
            .map(|phase| progress(ctx, &env, phase))
            .collect()
    } else {
        Vec::new()
    };
    Before::Call(Box::new(Call {
        env,
        body,
        flow,
        branch,
        trail_before,
        reports,
    }))
}

/// How the runtime call ended.
#[derive(Debug)]
pub enum Called {
    Answer(Answer),
    /// The pod's shutdown stopped the runtime mid-call: not this envelope's doing.
    Stopped,
}

/// After the runtime call: a disposition, or a fan-out branch's report for the join.
#[derive(Debug)]
pub enum After {
    Done(Disposition),
    Join(Box<Join>),
}

/// A fan-out branch's report to the gateway's join; its answer decides (`after_join`).
#[derive(Debug)]
pub struct Join {
    pub env: Envelope,
    pub carried: Carried,
    pub fanin: FanIn,
    pub report: BranchReport,
    pub trail_before: usize,
}

/// After the runtime call: routes the results (outside a flow by the route, in one by its
/// program), retries a failure or gives up on it (to x-sump, or to the flow's except paths),
/// or asks the join of a fan-out branch.
pub fn after_call(ctx: &Ctx, call: Call, called: Called, st: &mut Stamp) -> After {
    let Call {
        env,
        flow,
        branch,
        trail_before,
        ..
    } = call;
    let answer = match called {
        Called::Stopped => return After::Done(Disposition::returned(env.id)),
        Called::Answer(a) => a,
    };
    match (answer, flow, branch) {
        (Answer::Results(items), Some(c), Some(b)) => {
            let (mode, ns) = (ctx.cfg.handler_mode, &ctx.cfg.namespace);
            let report = flow_routing::branch_answer(&env, &b, items, mode, ns);
            join(ctx, env, c, b, report, trail_before, st)
        }
        (Answer::Results(items), Some(c), None) => {
            let step =
                flow_routing::after_results(&env, c, items, ctx.cfg.handler_mode, ctx.queues);
            After::Done(flow_step(ctx, &env, step, "success", trail_before, st))
        }
        (Answer::Results(items), None, _) => After::Done(on_results(ctx, env, items, st)),
        (Answer::Failure(f), flow, branch) => {
            on_failure(ctx, env, f, flow, branch, trail_before, st)
        }
    }
}

/// What the join's answer (or the gateway's failure to give one) calls for: nothing while
/// it waits, the flow's next step when this branch completed or failed it, x-sump when the
/// gateway refused the report, the broker again when the gateway was out of reach.
pub fn after_join(
    ctx: &Ctx,
    join: Join,
    answer: Result<JoinAnswer, FanInError>,
    st: &mut Stamp,
) -> Disposition {
    let Join {
        env,
        carried,
        fanin,
        trail_before,
        ..
    } = join;
    match answer {
        Ok(answer) => {
            let line = format!(
                "branch joined: join {} index {} answer {answer:?}",
                fanin.join, fanin.index
            );
            let step = flow_routing::after_join(&env, carried, &fanin, answer, ctx.queues);
            flow_step(ctx, &env, step, "success", trail_before, st).logged(Level::Debug, line)
        }
        Err(e @ FanInError::Refused { .. }) => {
            to_sump(ctx, &env, &e.to_string(), None, "failed", "flow_error", st)
        }
        Err(e) => Disposition::returned(env.id).logged(
            Level::Warn,
            format!("branch result not stored; returning the message for redelivery: {e}"),
        ),
    }
}

/// The broker refused `refused`'s sends for good (no such queue, too large): the message as
/// it arrived (`body`) goes to x-sump instead, its payload dropped when it was too large.
/// `None` when the refused sends already went to x-sump: nothing better is left.
pub fn after_send_refused(
    ctx: &Ctx,
    refused: &Disposition,
    body: &[u8],
    e: &TransportError,
    fallback_id: String,
    st: &mut Stamp,
) -> Option<Disposition> {
    let sump_queue = ctx.queues.sump();
    if refused.sends.iter().any(|s| s.out.queue == sump_queue) {
        return None;
    }
    let reason = format!("result could not be delivered: {e}");
    let mut env = match envelope::parse(body, None) {
        Ok(env) => routing::to_sump(&env, ctx.actor(), &reason, None),
        Err(m) => routing::malformed_to_sump(body, ctx.actor(), &m, fallback_id, 4096),
    };
    let metric = match e {
        TransportError::TooLarge { .. } => {
            env.payload = Value::Null;
            "too_large"
        }
        _ => "no_such_queue",
    };
    // The first sends never happened: only the x-sump one is this hop's. The reports and
    // flow decisions stay as they were decided.
    let d = Disposition {
        sends: vec![st.send(sump_queue, &env, None)],
        failure_reason: Some(metric.to_string()),
        reports: refused.reports.clone(),
        flow: refused.flow.clone(),
        ..Disposition::new(refused.id.clone(), Vec::new(), "failed")
    };
    Some(d.logged(
        Level::Warn,
        format!("cannot deliver the result; sending the input to x-sump: {e}"),
    ))
}

fn join(
    ctx: &Ctx,
    env: Envelope,
    carried: Carried,
    fanin: FanIn,
    report: BranchReport,
    trail_before: usize,
    st: &mut Stamp,
) -> After {
    if !ctx.can_join {
        let reason = format!(
            "flow {}: fan-out branch {} has no gateway to join at (ASYA_GATEWAY_URL is not \
             set on actor {})",
            carried.program.flow,
            env.id,
            ctx.actor()
        );
        return After::Done(to_sump(
            ctx,
            &env,
            &reason,
            None,
            "failed",
            "flow_error",
            st,
        ));
    }
    After::Join(Box::new(Join {
        env,
        carried,
        fanin,
        report,
        trail_before,
    }))
}

fn on_failure(
    ctx: &Ctx,
    mut env: Envelope,
    f: Failure,
    flow: Option<Carried>,
    branch: Option<FanIn>,
    trail_before: usize,
    st: &mut Stamp,
) -> After {
    let actor = ctx.actor();
    let attempt = routing::failed_attempts(&env, actor) + 1;
    let decision = resiliency::decide(&ctx.cfg.resiliency, &f, attempt);
    routing::record_attempt(&mut env, actor, attempt, &f, st.now_ms);
    let reason = match decision {
        Decision::Retry { delay, policy, .. } => {
            let line = format!(
                "retrying later: attempt {attempt}, delay {delay:?}, policy {policy}: {}",
                f.message
            );
            let sends = vec![st.send(ctx.own_queue(), &env, (!delay.is_zero()).then_some(delay))];
            let d = Disposition::new(env.id, sends, "retried");
            return After::Done(d.logged(Level::Info, line));
        }
        Decision::Fail { reason } => reason,
    };
    match (flow, branch) {
        (Some(c), Some(b)) => {
            let report = flow_routing::branch_failure(&b, &f, &ctx.cfg.namespace);
            join(ctx, env, c, b, report, trail_before, st)
        }
        (Some(c), None) => {
            let line = format!(
                "handler failed in a flow (attempt {attempt}, {}); its except paths decide",
                f.error_type
            );
            let step = flow_routing::after_failure(&env, c, &f, ctx.queues);
            After::Done(
                flow_step(ctx, &env, step, "caught", trail_before, st).logged(Level::Info, line),
            )
        }
        (None, _) => {
            let metric = failed_metric_reason(&reason, &f);
            let d = to_sump(
                ctx,
                &env,
                &reason.to_string(),
                Some(&f),
                "failed",
                metric,
                st,
            );
            After::Done(d)
        }
    }
}

fn on_results(ctx: &Ctx, env: Envelope, items: Vec<Value>, st: &mut Stamp) -> Disposition {
    if ctx.cfg.is_end_actor {
        let mut d = Disposition::new(env.id.clone(), Vec::new(), "success");
        if ctx.reporting {
            d.reports.push(final_report(ctx, &env));
        }
        return d;
    }
    match routing::route_results(&env, items, ctx.cfg.handler_mode, ctx.queues) {
        Ok(routed) => {
            let sends = stamp_all(&routed, st);
            if let Some(reason) = too_large(ctx, &sends) {
                // None of those sends happens: only the x-sump one is this hop's.
                return to_sump(ctx, &env, &reason, None, "failed", "too_large", st);
            }
            let line = format!("routed to {} queue(s)", sends.len());
            let mut d = Disposition::new(env.id.clone(), sends, "success");
            if ctx.reporting {
                d.reports.push(progress(ctx, &env, "completed"));
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
            d.logged(Level::Debug, line)
        }
        Err(v) => {
            let d = to_sump(
                ctx,
                &env,
                &v.to_string(),
                None,
                "failed",
                "route_violation",
                st,
            );
            d.logged(Level::Warn, format!("handler broke the routing rules: {v}"))
        }
    }
}

/// The sends a flow's evaluation decided, checked against the transport's size limit.
fn flow_step(
    ctx: &Ctx,
    env: &Envelope,
    step: FlowStep,
    status: &'static str,
    trail_before: usize,
    st: &mut Stamp,
) -> Disposition {
    let decided = crate::flow_trace::decided(trail_before, &step);
    let (routed, branches) = match step {
        FlowStep::Branches(_) if !ctx.can_join => {
            let reason = "a flow fans out here, and this actor has no gateway to gather the \
                          branches (ASYA_GATEWAY_URL is not set); nothing was sent";
            return with_flow(
                to_sump(ctx, env, reason, None, "failed", "flow_error", st),
                decided,
            );
        }
        FlowStep::Branches(b) => (b, true),
        FlowStep::Routed(r) => (r, false),
        FlowStep::Sump {
            reason,
            failure,
            metric,
            instead,
        } => {
            let at = instead.as_deref().unwrap_or(env);
            return to_sump(ctx, at, &reason, failure.as_ref(), "failed", metric, st);
        }
    };
    let sends = stamp_all(&routed, st);
    if let Some(reason) = too_large(ctx, &sends) {
        return with_flow(
            to_sump(ctx, env, &reason, None, "failed", "too_large", st),
            decided,
        );
    }
    let line = format!(
        "flow routed to {}",
        sends
            .iter()
            .map(|s| s.out.queue.as_str())
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut d = Disposition::new(env.id.clone(), sends, status);
    if ctx.reporting {
        let mut report = progress(ctx, env, "completed");
        // The gateway keeps each report's message in the envelope's history, where
        // `asya trace` reads the hop's decisions.
        if let (Some(dec), Body::Progress(p)) = (&decided, &mut report.body) {
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
    with_flow(d.logged(Level::Debug, line), decided)
}

fn with_flow(mut d: Disposition, decided: Option<Decided>) -> Disposition {
    if let Some(dec) = &decided {
        d.log.insert(
            0,
            (Level::Debug, format!("flow decided: {}", dec.message())),
        );
    }
    d.flow = decided;
    d
}

fn stamp_all(routed: &[(String, Envelope)], st: &mut Stamp) -> Vec<Send> {
    routed
        .iter()
        .map(|(q, e)| st.send(q.clone(), e, None))
        .collect()
}

/// Why the first send over the transport's limit cannot go, if one is.
fn too_large(ctx: &Ctx, sends: &[Send]) -> Option<String> {
    let limit = ctx.max_bytes?;
    let big = sends.iter().find(|s| s.out.body.len() > limit)?;
    Some(format!(
        "result too large: {} bytes for {} exceeds the transport limit of {limit} bytes",
        big.out.body.len(),
        big.out.queue
    ))
}

/// `env` to x-sump with `reason` (and the handler's error), its payload dropped when the
/// envelope would be over the transport's limit; dropped (loudly) when this is x-sump.
fn to_sump(
    ctx: &Ctx,
    env: &Envelope,
    reason: &str,
    failure: Option<&Failure>,
    status: &'static str,
    metric_reason: &str,
    st: &mut Stamp,
) -> Disposition {
    let id = env.id.clone();
    if ctx.is_sump_consumer() {
        return Disposition::new(id, Vec::new(), status).logged(
            Level::Error,
            format!("end actor on x-sump failed; dropping the envelope: {reason}"),
        );
    }
    let mut sump = routing::to_sump(env, ctx.actor(), reason, failure);
    if let Some(limit) = ctx.max_bytes
        && envelope::to_body_stamped(&sump, st.now_ms, None).len() > limit
    {
        // The reason must arrive even when the envelope itself is too big to carry.
        sump.payload = Value::Null;
    }
    let sends = vec![st.send(ctx.queues.sump(), &sump, None)];
    Disposition {
        failure_reason: Some(metric_reason.to_string()),
        ..Disposition::new(id, sends, status)
    }
    .logged(Level::Warn, format!("to x-sump: {reason}"))
}

fn progress(ctx: &Ctx, env: &Envelope, phase: &str) -> Report {
    Report::progress(
        &env.id,
        env.parent_id.as_deref(),
        ctx.actor(),
        phase,
        env.route.current,
        env.route.actors.len(),
    )
}

/// The end actors' report: x-sink → succeeded with the payload, x-sump → failed with the
/// reason the envelope carries.
fn final_report(ctx: &Ctx, env: &Envelope) -> Report {
    if ctx.is_sump_consumer() {
        let error = env
            .headers
            .get(routing::ERROR_HEADER)
            .cloned()
            .unwrap_or_else(|| serde_json::json!({"reason": "reached x-sump"}));
        Report::final_status(&env.id, ctx.actor(), false, None, Some(error))
    } else {
        Report::final_status(&env.id, ctx.actor(), true, Some(env.payload.clone()), None)
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
    use asya_transport::trace_context::parse_traceparent;
    use serde_json::json;
    use std::collections::HashMap;
    use std::sync::Arc;

    const SINK: &str = "asya-ns-x-sink";
    const SUMP: &str = "asya-ns-x-sump";

    /// The sidecar of `actor` in namespace `ns`, with `vars` on top of the defaults.
    fn cfg(actor: &str, vars: &[(&str, &str)]) -> Config {
        let mut m: HashMap<&str, &str> = HashMap::from([
            ("ASYA_ACTOR_NAME", actor),
            ("ASYA_NAMESPACE", "ns"),
            ("ASYA_TRANSPORT", "rabbitmq"),
            ("ASYA_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"),
        ]);
        m.extend(vars.iter().copied());
        Config::from_map(&m).unwrap()
    }

    fn queues() -> Queues {
        Queues {
            namespace: "ns".into(),
        }
    }

    /// Runs `decide` with a fixed time, trace context and counting span ids (from 100).
    fn stamped<R>(decide: impl FnOnce(&mut Stamp) -> R) -> R {
        let span =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let mut next = 99;
        let mut ids = || {
            next += 1;
            next
        };
        let mut st = Stamp {
            now_ms: 1_000,
            span,
            tracestate: None,
            span_ids: &mut ids,
        };
        decide(&mut st)
    }

    /// What the processor's decisions give for `body` and the runtime's `called`.
    fn decide(ctx: &Ctx, body: &[u8], redeliveries: u32, called: Called) -> After {
        let check = (!ctx.cfg.is_end_actor).then_some(ctx.cfg.actor.as_str());
        stamped(|st| match envelope::parse(body, check) {
            Err(why) => After::Done(malformed(ctx, body, &why, "gen-1".into(), st)),
            Ok(env) => match before_call(ctx, env, redeliveries, st) {
                Before::Done(d) => After::Done(d),
                Before::Call(c) => after_call(ctx, *c, called, st),
            },
        })
    }

    fn done(a: After) -> Disposition {
        match a {
            After::Done(d) => d,
            After::Join(j) => panic!("a join, not a disposition: {j:?}"),
        }
    }

    fn body(actors: &[&str], current: usize, payload: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "id": "e1", "route": {"actors": actors, "current": current}, "payload": payload
        }))
        .unwrap()
    }

    fn sent(d: &Disposition, i: usize) -> Envelope {
        envelope::parse(&d.sends[i].out.body, None).unwrap()
    }

    fn answer(v: Value) -> Called {
        Called::Answer(routing::interpret(v))
    }

    fn failed(code: &str) -> Called {
        Called::Answer(Answer::Failure(Failure {
            code: code.into(),
            error_type: "ValueError".into(),
            message: "bad input".into(),
            traceback: None,
            mro: vec!["ValueError".into(), "Exception".into()],
        }))
    }

    const RETRY: &str = r#"{"policies":{"default":{"maxAttempts":3,"backoff":"constant","initialInterval":"2s","maxInterval":"2s"}}}"#;

    struct Case {
        name: &'static str,
        actor: &'static str,
        vars: &'static [(&'static str, &'static str)],
        reporting: bool,
        max_bytes: Option<usize>,
        body: Vec<u8>,
        redeliveries: u32,
        called: fn() -> Called,
        // Expected: queues sent to, status, failure label, report kinds, returned.
        queues: &'static [&'static str],
        status: &'static str,
        failure: Option<&'static str>,
        reports: &'static [&'static str],
        returned: bool,
    }

    fn cases() -> Vec<Case> {
        let ab = |p: Value| body(&["a", "b"], 0, p);
        let base = |name, body, called: fn() -> Called| Case {
            name,
            actor: "a",
            vars: &[],
            reporting: false,
            max_bytes: None,
            body,
            redeliveries: 0,
            called,
            queues: &[],
            status: "success",
            failure: None,
            reports: &[],
            returned: false,
        };
        vec![
            Case {
                queues: &["asya-ns-b"],
                reports: &["progress"],
                reporting: true,
                ..base("one result to the next actor", ab(json!(1)), || {
                    answer(json!(2))
                })
            },
            Case {
                queues: &["asya-ns-b", "asya-ns-b", "asya-ns-b"],
                reports: &["progress", "child", "child"],
                reporting: true,
                ..base(
                    "a fan-out of results, children reported",
                    ab(json!(1)),
                    || answer(json!([1, 2, 3])),
                )
            },
            Case {
                queues: &[SINK],
                ..base("no result ends in x-sink", ab(json!(1)), || {
                    answer(Value::Null)
                })
            },
            Case {
                queues: &[SINK],
                ..base(
                    "the last actor's result to x-sink",
                    body(&["a"], 0, json!(1)),
                    || answer(json!(2)),
                )
            },
            Case {
                actor: "x-sink",
                reporting: true,
                reports: &["final"],
                ..base(
                    "x-sink reports success, sends nothing",
                    body(&["a"], 1, json!(1)),
                    || answer(Value::Null),
                )
            },
            Case {
                actor: "x-sump",
                reporting: true,
                reports: &["final"],
                ..base(
                    "x-sump reports failure, sends nothing",
                    body(&["a"], 0, json!(1)),
                    || answer(Value::Null),
                )
            },
            Case {
                queues: &[SUMP],
                status: "malformed",
                failure: Some("not_json"),
                ..base("a message that is no envelope", b"garbage".to_vec(), || {
                    answer(Value::Null)
                })
            },
            Case {
                actor: "x-sump",
                status: "malformed",
                ..base(
                    "no envelope on x-sump: dropped",
                    b"garbage".to_vec(),
                    || answer(Value::Null),
                )
            },
            Case {
                queues: &[SUMP],
                status: "poison",
                failure: Some("poison"),
                redeliveries: 6,
                ..base("a poison message", ab(json!(1)), || answer(json!(2)))
            },
            Case {
                queues: &[SUMP],
                status: "failed",
                failure: Some("route_violation"),
                vars: &[("ASYA_HANDLER_MODE", "envelope")],
                ..base("the handler moved the cursor", ab(json!(1)), || {
                    answer(json!({"route": {"actors": ["a", "b"], "current": 1}}))
                })
            },
            Case {
                queues: &[SUMP],
                status: "failed",
                failure: Some("too_large"),
                max_bytes: Some(400),
                ..base("a result over the transport's limit", ab(json!(1)), || {
                    answer(json!("x".repeat(500)))
                })
            },
            Case {
                queues: &["asya-ns-a"],
                status: "retried",
                vars: &[("ASYA_RESILIENCY", RETRY)],
                ..base("a failure retried", ab(json!(1)), || {
                    failed("handler_error")
                })
            },
            Case {
                queues: &[SUMP],
                status: "failed",
                failure: Some("handler_error"),
                ..base("a failure with no policy", ab(json!(1)), || {
                    failed("handler_error")
                })
            },
            Case {
                actor: "x-sump",
                status: "failed",
                ..base(
                    "x-sump's own failure: dropped",
                    body(&["a"], 0, json!(1)),
                    || failed("handler_error"),
                )
            },
            Case {
                status: "returned",
                returned: true,
                ..base(
                    "the runtime stopped by the pod's shutdown",
                    ab(json!(1)),
                    || Called::Stopped,
                )
            },
            Case {
                queues: &[SUMP],
                status: "failed",
                failure: Some("flow_error"),
                ..base(
                    "a broken flow field",
                    serde_json::to_vec(
                        &json!({"id": "e1", "route": {"actors": ["a"], "current": 0},
                        "payload": 1, "flow": {"program": 3}}),
                    )
                    .unwrap(),
                    || answer(json!(2)),
                )
            },
        ]
    }

    #[test]
    fn each_outcome_kind_is_decided_as_a_value() {
        for c in cases() {
            let cfg = cfg(c.actor, c.vars);
            let q = queues();
            let ctx = Ctx {
                cfg: &cfg,
                queues: &q,
                reporting: c.reporting,
                can_join: false,
                max_bytes: c.max_bytes,
            };
            let d = done(decide(&ctx, &c.body, c.redeliveries, (c.called)()));
            let to: Vec<_> = d.sends.iter().map(|s| s.out.queue.as_str()).collect();
            assert_eq!(to, c.queues, "{}: queues", c.name);
            assert_eq!(d.status, c.status, "{}: status", c.name);
            assert_eq!(
                d.failure_reason.as_deref(),
                c.failure,
                "{}: failure",
                c.name
            );
            let kinds: Vec<_> = d.reports.iter().map(|r| r.kind).collect();
            assert_eq!(kinds, c.reports, "{}: reports", c.name);
            assert_eq!(d.returned, c.returned, "{}: returned", c.name);
            // Each send is a PRODUCER span of its own, whose context its body carries.
            for (i, (id, _)) in d.send_spans().into_iter().enumerate() {
                let tp = sent(&d, i).headers["traceparent"].clone();
                assert!(
                    tp.as_str().unwrap().contains(&format!("-{id:016x}-")),
                    "{}",
                    c.name
                );
            }
        }
    }

    #[test]
    fn sends_are_stamped_with_the_hop_and_carry_what_was_decided() {
        let cfg = cfg("a", &[("ASYA_RESILIENCY", RETRY)]);
        let q = queues();
        let ctx = Ctx {
            cfg: &cfg,
            queues: &q,
            reporting: false,
            can_join: false,
            max_bytes: None,
        };
        let d = done(decide(
            &ctx,
            &body(&["a", "b"], 0, json!(1)),
            0,
            failed("e"),
        ));
        let retry = sent(&d, 0);
        // The retry waits its policy's delay and carries its attempt.
        assert_eq!(d.sends[0].out.delay, Some(Duration::from_secs(2)));
        assert_eq!(retry.headers[routing::ATTEMPTS_HEADER][0]["at_ms"], 1_000);
        assert_eq!(
            retry.headers["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000064-01"
        );
        // Too large: the x-sump copy keeps the reason and the input, ready to replay...
        let ctx = Ctx {
            max_bytes: Some(400),
            ..ctx
        };
        let big = json!("x".repeat(500));
        let d = done(decide(
            &ctx,
            &body(&["a", "b"], 0, json!(1)),
            0,
            answer(big.clone()),
        ));
        assert_eq!(sent(&d, 0).payload, json!(1));
        // ...unless the input is too large itself: then the reason alone.
        let d = done(decide(
            &ctx,
            &body(&["a", "b"], 0, big.clone()),
            0,
            answer(big),
        ));
        let sump = sent(&d, 0);
        assert_eq!(sump.payload, Value::Null);
        assert!(
            sump.headers[routing::ERROR_HEADER]["reason"]
                .as_str()
                .unwrap()
                .contains("exceeds the transport limit of 400 bytes")
        );
    }

    #[test]
    fn a_send_refused_for_good_sends_the_input_to_x_sump_once() {
        let cfg = cfg("a", &[]);
        let q = queues();
        let ctx = Ctx {
            cfg: &cfg,
            queues: &q,
            reporting: true,
            can_join: false,
            max_bytes: None,
        };
        let input = body(&["a", "b"], 0, json!({"big": 1}));
        let d = done(decide(&ctx, &input, 0, answer(json!(2))));
        let e = TransportError::TooLarge {
            queue: "asya-ns-b".into(),
            size: 10,
            limit: 5,
        };
        let instead = stamped(|st| after_send_refused(&ctx, &d, &input, &e, "gen".into(), st))
            .expect("the x-sump send instead");
        assert_eq!(instead.send_spans(), [(100, SUMP.to_string())]);
        assert_eq!(
            (instead.status, instead.failure_reason.as_deref()),
            ("failed", Some("too_large"))
        );
        assert_eq!(sent(&instead, 0).payload, Value::Null);
        // The x-sump send itself refused: nothing is left to try.
        assert!(
            stamped(|st| after_send_refused(&ctx, &instead, &input, &e, "gen".into(), st))
                .is_none()
        );
    }

    #[test]
    fn a_flow_fans_out_only_where_a_gateway_joins_and_the_join_answer_decides() {
        let mut entry = cfg("a", &[]);
        entry.flow_entry = Some(Arc::new(crate::flow_routing::tests::fan_program()));
        let q = queues();
        let ctx = Ctx {
            cfg: &entry,
            queues: &q,
            reporting: true,
            can_join: true,
            max_bytes: None,
        };
        let input = body(&["a"], 0, json!({}));
        let d = done(decide(&ctx, &input, 0, answer(json!({"items": [1, 2]}))));
        let sent_to: Vec<_> = d.sends.iter().map(|s| s.out.queue.as_str()).collect();
        assert_eq!(sent_to, ["asya-ns-double", "asya-ns-double"]);
        let kinds: Vec<_> = d.reports.iter().map(|r| r.kind).collect();
        assert_eq!(kinds, ["progress", "child", "child"]);
        assert_eq!(d.flow.as_ref().map(|f| f.flow.as_str()), Some("fan"));
        // Without a gateway to gather them, nothing fans out.
        let alone = Ctx {
            can_join: false,
            ..ctx
        };
        let d_alone = done(decide(&alone, &input, 0, answer(json!({"items": [1, 2]}))));
        assert_eq!(
            (
                d_alone.send_spans()[0].1.as_str(),
                d_alone.failure_reason.as_deref()
            ),
            (SUMP, Some("flow_error"))
        );

        // A branch answers: its report goes to the join, whose answer decides.
        let branch = d.sends[1].out.body.clone();
        let double = cfg("double", &[]);
        let ctx = Ctx {
            cfg: &double,
            ..ctx
        };
        let join = |ctx: &Ctx| match decide(ctx, &branch, 0, answer(json!(4))) {
            After::Join(j) => *j,
            After::Done(d) => panic!("no join: {d:?}"),
        };
        let j = join(&ctx);
        assert_eq!(
            (j.fanin.index, j.report.result.clone()),
            (1, Some(json!(4)))
        );
        let waiting = JoinAnswer::Waiting {
            stored: 1,
            total: 2,
        };
        let d = stamped(|st| after_join(&ctx, join(&ctx), Ok(waiting), st));
        assert!(d.sends.is_empty() && d.status == "success" && !d.returned);
        let complete = JoinAnswer::Complete {
            results: vec![json!(2), json!(4)],
        };
        // The join complete, the flow goes on as e1, here to its second fan-out.
        let d = stamped(|st| after_join(&ctx, join(&ctx), Ok(complete), st));
        let next = sent(&d, 0);
        assert_eq!(
            (d.sends[0].out.queue.as_str(), next.id.as_str()),
            ("asya-ns-double", "e1~1-0")
        );
        assert_eq!(
            next.extra["fanin"]["parent"]["state"],
            json!({"items": [1, 2], "r": [2, 4]})
        );
        let refused = FanInError::Refused {
            status: 400,
            body: "no".into(),
        };
        let d = stamped(|st| after_join(&ctx, join(&ctx), Err(refused), st));
        assert_eq!(
            (d.send_spans()[0].1.as_str(), d.failure_reason.as_deref()),
            (SUMP, Some("flow_error"))
        );
        let away = FanInError::Unavailable("down".into());
        let d = stamped(|st| after_join(&ctx, join(&ctx), Err(away), st));
        assert!(d.returned && d.sends.is_empty());
        // A branch where no gateway joins goes to x-sump at once.
        let alone = Ctx {
            can_join: false,
            ..ctx
        };
        let d = done(decide(&alone, &branch, 0, answer(json!(4))));
        assert_eq!(d.failure_reason.as_deref(), Some("flow_error"));
    }

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
