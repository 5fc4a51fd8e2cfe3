//! `asya sump list|show|redrive`: the namespace's x-sump, browsed without consuming, and
//! chosen envelopes sent back where they failed. The per-message decision ([`decide`]) is
//! pure; [`browse`] and [`redrive`] hold the messages and make sure each one either stays in
//! x-sump or is removed only after its resend was confirmed.

use asya_transport::envelope::{self, Envelope};
use serde::Serialize;
use tracing::Instrument;

use crate::broker::Broker;
use crate::error::{CliError, Result};
use crate::failed::Failed;
use crate::redrive::{self, Resend};
use crate::select::Selector;
use crate::sump_source::FailedSource;

/// What a browse found.
#[derive(Debug, Serialize)]
pub struct Listing {
    pub source: String,
    pub envelopes: Vec<Shown>,
    /// Messages in x-sump that are not envelopes at all (not JSON, no id or route).
    pub unreadable: usize,
    /// More messages were in x-sump than `--max` allowed reading.
    pub truncated: bool,
    /// A note on what the source cannot show (a consumer on x-sump takes messages away).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A failed envelope with, for `show`, the envelope itself.
#[derive(Debug, Serialize)]
pub struct Shown {
    #[serde(flatten)]
    pub failed: Failed,
    pub envelope: Envelope,
}

/// What to do with one x-sump message.
#[derive(Debug, PartialEq)]
pub enum Decision {
    /// Not selected (or not an envelope): stays in x-sump.
    Keep,
    /// Selected but cannot go back: stays, and the reason is reported.
    Refuse { id: String, why: String },
    /// Selected: resend, then remove.
    Resend(Box<Resend>),
}

/// The decision for one message body. `now` is RFC 3339, `now_ms` the same instant.
pub fn decide(
    body: &[u8],
    broker_time_ms: Option<u64>,
    sel: &Selector,
    namespace: &str,
    now: &str,
    now_ms: u64,
) -> Decision {
    let Ok(env) = envelope::parse(body, None) else {
        return Decision::Keep;
    };
    if !sel.matches(&Failed::of(&env, broker_time_ms), now_ms) {
        return Decision::Keep;
    }
    match redrive::plan(&env, namespace, now, now_ms) {
        Ok(r) => Decision::Resend(Box::new(r)),
        Err(e) => Decision::Refuse {
            id: env.id.clone(),
            why: e.to_string(),
        },
    }
}

/// Lists the selected envelopes of `source`, then leaves every one where it was.
pub async fn browse<S: FailedSource>(
    source: &S,
    sel: &Selector,
    max: usize,
    now_ms: u64,
) -> Result<Listing> {
    let note = source.note().await?;
    let (held, truncated) = source.read(max).await?;
    let mut envelopes = Vec::new();
    let mut unreadable = 0;
    for m in &held {
        match envelope::parse(S::body(m), None) {
            Ok(env) => {
                let failed = Failed::of(&env, S::time_ms(m));
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
    source.release(held).await?;
    Ok(Listing {
        source: format!("{}{}", source.describe(), source.listing_note()),
        envelopes,
        unreadable,
        truncated,
        note,
    })
}

/// One line of a redrive's outcome.
#[derive(Debug, Serialize, PartialEq)]
pub struct Outcome {
    pub id: String,
    /// `redriven`, `would redrive` (dry run), `refused`, `failed`, `sent, copy left`.
    pub result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct RedriveReport {
    pub source: String,
    pub outcomes: Vec<Outcome>,
    pub truncated: bool,
}

impl RedriveReport {
    /// Whether everything selected went back (or would, in a dry run).
    pub fn all_done(&self) -> bool {
        self.outcomes
            .iter()
            .all(|o| o.result == "redriven" || o.result == "would redrive")
    }
}

/// Whether the redrive goes on after an envelope was sent (a test stops it between the
/// resend and the removal, as a kill would).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Abandon,
}

/// Redrives the selected envelopes of `queue`: for each, publish to the failed actor's queue,
/// wait for the broker's confirmation, then remove the x-sump copy. Everything else is given
/// back unchanged. `sent` is called after each confirmed resend, before the removal.
/// What a redrive selects and when it runs.
pub struct Request<'a> {
    pub namespace: &'a str,
    pub sel: &'a Selector,
    pub max: usize,
    pub dry_run: bool,
    /// RFC 3339 and ms since the epoch of the same instant (the `x-asya-redriven` time).
    pub now: &'a str,
    pub now_ms: u64,
}

/// Sends each selected envelope of `source` back to the actor where it failed, through
/// `broker`, and removes it from the source only once the broker confirmed the resend.
/// Interrupted anywhere, an envelope is in the source, in its actor's queue, or (between the
/// confirmation and the removal) in both: at least once, never lost. `sent` hears of each
/// confirmed resend before its removal; [`Flow::Abandon`] stops there as a kill would.
pub async fn redrive<S: FailedSource>(
    source: &S,
    broker: &Broker,
    req: &Request<'_>,
    sent: &mut dyn FnMut(&Outcome) -> Flow,
) -> Result<RedriveReport> {
    let (held, truncated) = source.read(req.max).await?;
    let mut keep: Vec<S::Item> = Vec::new();
    let mut outcomes = Vec::new();
    let place = source.place();
    let mut held = held.into_iter();
    while let Some(m) = held.next() {
        let r = match decide(
            S::body(&m),
            S::time_ms(&m),
            req.sel,
            req.namespace,
            req.now,
            req.now_ms,
        ) {
            Decision::Keep => {
                keep.push(m);
                continue;
            }
            Decision::Refuse { id, why } => {
                outcomes.push(Outcome {
                    id,
                    result: "refused",
                    actor: None,
                    detail: Some(why),
                });
                keep.push(m);
                continue;
            }
            Decision::Resend(r) => r,
        };
        let mut o = Outcome {
            id: r.envelope.id.clone(),
            result: if req.dry_run {
                "would redrive"
            } else {
                "redriven"
            },
            actor: Some(r.actor.clone()),
            detail: Some(format!("to queue {}", r.queue)),
        };
        if req.dry_run {
            outcomes.push(o);
            keep.push(m);
            continue;
        }
        let span = tracing::info_span!("redrive", envelope_id = %r.envelope.id, actor = %r.actor);
        let published = match serde_json::to_vec(&r.envelope) {
            Ok(body) => {
                broker
                    .publish(&r.queue, &body)
                    .instrument(span.clone())
                    .await
            }
            Err(e) => Err(CliError::Failed(format!("cannot serialise: {e}"))),
        };
        if let Err(e) = published {
            o.result = "failed";
            o.detail = Some(format!("{e}; left in {place}"));
            outcomes.push(o);
            keep.push(m);
            continue;
        }
        if sent(&o) == Flow::Abandon {
            keep.push(m);
            keep.extend(held);
            source.abandon(keep);
            outcomes.push(o);
            return Ok(RedriveReport {
                source: source.describe(),
                outcomes,
                truncated,
            });
        }
        if let Err(e) = source.remove(&m).instrument(span).await {
            o.result = "sent, copy left";
            o.detail = Some(format!(
                "{e}; the copy in {place} stays and a rerun sends it again"
            ));
        }
        outcomes.push(o);
    }
    source.release(keep).await?;
    Ok(RedriveReport {
        source: source.describe(),
        outcomes,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    fn at_b(id: &str, ty: &str) -> Vec<u8> {
        body(
            json!({"id": id, "route": {"actors": ["a", "b"], "current": 1},
                    "headers": {"x-asya-error": {"actor": "b", "reason": "retries exhausted", "type": ty, "message": "m"}},
                    "payload": 1}),
        )
    }

    fn sel(err: Option<&str>) -> Selector {
        Selector::parse(vec![], None, err, None, true, true).unwrap()
    }

    #[test]
    fn selected_envelopes_are_resent_to_the_failed_actor() {
        match decide(
            &at_b("e1", "ValueError"),
            None,
            &sel(Some("ValueError")),
            "n",
            "t",
            0,
        ) {
            Decision::Resend(r) => {
                assert_eq!(r.queue, "asya-n-b");
                assert_eq!(r.envelope.route.current, 1);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unselected_and_unreadable_messages_stay() {
        assert_eq!(
            decide(
                &at_b("e1", "KeyError"),
                None,
                &sel(Some("ValueError")),
                "n",
                "t",
                0
            ),
            Decision::Keep
        );
        assert_eq!(
            decide(b"not json", None, &sel(None), "n", "t", 0),
            Decision::Keep
        );
    }

    #[test]
    fn selected_but_unroutable_is_refused_with_the_reason() {
        let malformed = body(json!({"id": "m", "route": {"actors": [], "current": 0}}));
        match decide(&malformed, None, &sel(None), "n", "t", 0) {
            Decision::Refuse { id, why } => {
                assert_eq!(id, "m");
                assert!(why.contains("past its route of 0 actors"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_redriven_outcomes_are_done() {
        let r = |result| RedriveReport {
            source: String::new(),
            outcomes: vec![Outcome {
                id: "x".into(),
                result,
                actor: None,
                detail: None,
            }],
            truncated: false,
        };
        assert!(r("redriven").all_done());
        assert!(r("would redrive").all_done());
        assert!(!r("refused").all_done());
        assert!(!r("sent, copy left").all_done());
    }
}
