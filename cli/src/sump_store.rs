//! `asya sump` where the crew's error-end actor consumes x-sump: the same listing and the same
//! redrive decision ([`crate::sump::decide`]) over the envelopes it stored in S3. A redrive
//! publishes to the failed actor's queue with the broker's confirmation first, and only then
//! marks the stored envelope redriven (moves it to `redriven/`).

use asya_transport::envelope;
use tracing::Instrument;

use crate::broker::Broker;
use crate::broker::s3::CrewStore;
use crate::error::Result;
use crate::failed::Failed;
use crate::select::Selector;
use crate::sump::{Decision, Flow, Listing, Outcome, RedriveReport, Shown, decide};

pub async fn browse(store: &CrewStore, sel: &Selector, max: usize, now_ms: u64) -> Result<Listing> {
    let (stored, truncated) = store.list(max).await?;
    let mut envelopes = Vec::new();
    let mut unreadable = 0;
    for s in &stored {
        match envelope::parse(&s.body, None) {
            Ok(env) => {
                let failed = Failed::of(&env, s.modified_ms);
                if sel.matches(&failed, now_ms) {
                    envelopes.push(Shown {
                        failed,
                        envelope: env,
                    });
                }
            }
            Err(_) => unreadable += 1,
        }
    }
    Ok(Listing {
        source: format!("{} (read only)", store.describe()),
        envelopes,
        unreadable,
        truncated,
        note: None,
    })
}

#[allow(clippy::too_many_arguments)]
pub async fn redrive(
    store: &CrewStore,
    broker: &Broker,
    namespace: &str,
    sel: &Selector,
    max: usize,
    dry_run: bool,
    now: &str,
    now_ms: u64,
    sent: &mut dyn FnMut(&Outcome) -> Flow,
) -> Result<RedriveReport> {
    let (stored, truncated) = store.list(max).await?;
    let mut outcomes = Vec::new();
    for s in stored {
        let r = match decide(&s.body, s.modified_ms, sel, namespace, now, now_ms) {
            Decision::Keep => continue,
            Decision::Refuse { id, why } => {
                outcomes.push(Outcome {
                    id,
                    result: "refused",
                    actor: None,
                    detail: Some(why),
                });
                continue;
            }
            Decision::Resend(r) => r,
        };
        let mut o = Outcome {
            id: r.envelope.id.clone(),
            result: if dry_run { "would redrive" } else { "redriven" },
            actor: Some(r.actor.clone()),
            detail: Some(format!("to queue {}", r.queue)),
        };
        if dry_run {
            outcomes.push(o);
            continue;
        }
        let span = tracing::info_span!("redrive", envelope_id = %r.envelope.id, actor = %r.actor, key = %s.key);
        let published = match serde_json::to_vec(&r.envelope) {
            Ok(body) => {
                broker
                    .publish(&r.queue, &body)
                    .instrument(span.clone())
                    .await
            }
            Err(e) => Err(crate::error::CliError::Failed(format!(
                "cannot serialise: {e}"
            ))),
        };
        if let Err(e) = published {
            o.result = "failed";
            o.detail = Some(format!("{e}; left in the store"));
            outcomes.push(o);
            continue;
        }
        if sent(&o) == Flow::Abandon {
            outcomes.push(o);
            return Ok(RedriveReport {
                source: store.describe(),
                outcomes,
                truncated,
            });
        }
        if let Err(e) = store.mark_redriven(&s.key).instrument(span).await {
            o.result = "sent, copy left";
            o.detail = Some(format!(
                "{e}; the stored copy stays and a rerun sends it again"
            ));
        }
        outcomes.push(o);
    }
    Ok(RedriveReport {
        source: store.describe(),
        outcomes,
        truncated,
    })
}
