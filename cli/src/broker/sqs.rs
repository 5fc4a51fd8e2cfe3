//! SQS with the namespace's identity (copied keys, or the caller's own AWS identity). A
//! browse receives every message with a visibility timeout and makes each visible again at
//! once when done; if this process dies first, they reappear when the timeout passes, so a
//! browse never loses a message. A redrive sends the resend (`SendMessage` succeeded = the
//! broker has it) and deletes the x-sump copy only then.

use std::time::Duration;

use asya_transport::Transport;
use asya_transport::sqs::{SqsSettings, SqsTransport};
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};

use crate::error::{CliError, Result};

use super::{Counts, Handle, Held};

/// How long a browsed message stays invisible if this process dies before giving it back.
const HOLD: Duration = Duration::from_secs(30);

pub struct Sqs {
    t: SqsTransport,
    pub place: String,
}

fn err(action: &'static str, target: &str, e: impl std::fmt::Debug) -> CliError {
    let why = format!("{e:?}");
    if why.contains("AccessDenied") || why.contains("403") || why.contains("NotAuthorized") {
        CliError::BrokerRefused {
            action,
            target: target.to_string(),
            user: "this AWS identity".into(),
            why,
        }
    } else if why.contains("NonExistentQueue") || why.contains("QueueDoesNotExist") {
        CliError::NotFound {
            what: format!("SQS queue {target:?}"),
            why,
        }
    } else {
        CliError::Unavailable {
            what: "SQS".into(),
            why: format!("{action} on {target:?}: {why}"),
        }
    }
}

impl Sqs {
    pub async fn connect(
        region: String,
        endpoint: Option<String>,
        keys: Option<(String, String)>,
    ) -> Sqs {
        let place = endpoint.clone().unwrap_or_else(|| format!("SQS {region}"));
        let s = SqsSettings {
            region,
            endpoint,
            // Never consumed through the transport: the CLI receives by hand below.
            queue: String::new(),
            wait_seconds: 0,
            visibility_timeout: HOLD,
            auto_create: false,
            max_message_bytes: 256 * 1024,
            // No pollers run: the CLI receives by hand.
            pollers: 1,
        };
        Sqs {
            t: SqsTransport::with_credentials(s, keys).await,
            place,
        }
    }

    /// The SDK client, for what the commands do not wrap (tests create their queues with it).
    pub fn client(&self) -> &aws_sdk_sqs::Client {
        self.t.client()
    }

    async fn url(&self, queue: &str) -> Result<String> {
        self.t.queue_url(queue).await.map_err(|e| match e {
            asya_transport::TransportError::NoSuchQueue(q) => CliError::NotFound {
                what: format!("SQS queue {q:?}"),
                why: "it does not exist (no actor with this name in the namespace?)".into(),
            },
            other => err("get the URL of", queue, other),
        })
    }

    pub async fn counts(&self, queue: &str) -> Result<Counts> {
        let url = self.url(queue).await?;
        let out = self
            .t
            .client()
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| err("read the attributes of", queue, e))?;
        let attr = |n: QueueAttributeName| {
            out.attributes()
                .and_then(|a| a.get(&n))
                .and_then(|v| v.parse::<u64>().ok())
        };
        Ok(Counts {
            ready: attr(QueueAttributeName::ApproximateNumberOfMessages),
            in_flight: attr(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
            consumers: None,
        })
    }

    /// Receives up to `max` messages of `queue`, each held invisible until given back.
    pub async fn browse(&self, queue: &str, max: usize) -> Result<(Vec<Held>, bool)> {
        let url = self.url(queue).await?;
        let mut out = Vec::new();
        // A browse longer than HOLD sees its first messages again: each is held once (the
        // second receipt lapses and the message reappears on its own).
        let mut seen = std::collections::HashSet::new();
        while out.len() < max {
            let want = (max - out.len()).min(10) as i32;
            let got = self
                .t
                .client()
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(want)
                .visibility_timeout(HOLD.as_secs() as i32)
                .wait_time_seconds(1)
                .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
                .send()
                .await
                .map_err(|e| err("receive from", queue, e))?;
            let messages = got.messages.unwrap_or_default();
            if messages.is_empty() {
                return Ok((out, false));
            }
            let before = out.len();
            for m in messages {
                if let Some(id) = &m.message_id
                    && !seen.insert(id.clone())
                {
                    continue;
                }
                let (Some(body), Some(receipt)) = (m.body, m.receipt_handle) else {
                    continue;
                };
                let broker_time_ms = m
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
                    .and_then(|v| v.parse::<u64>().ok());
                out.push(Held {
                    body: body.into_bytes(),
                    broker_time_ms,
                    handle: Handle::Sqs {
                        url: url.clone(),
                        receipt,
                    },
                });
            }
            if out.len() == before {
                // Only messages already held came back: everything has been seen.
                return Ok((out, false));
            }
        }
        Ok((out, true))
    }

    /// Puts `body` into each existing wake queue (docs/DESIGN.md §6.1); how many failed.
    pub async fn wake(&self, queues: &[String], body: &[u8]) -> usize {
        use asya_transport::Transport;
        self.t.wake(queues, body).await
    }

    /// Sends `body` to `queue`; returns once SQS accepted it.
    pub async fn publish(&self, queue: &str, body: &[u8]) -> Result<()> {
        let m = asya_transport::Outgoing {
            queue: queue.to_string(),
            body: body.to_vec(),
            delay: None,
        };
        self.t.send(&[m]).await.map_err(|e| match e {
            asya_transport::TransportError::NoSuchQueue(q) => CliError::NotFound {
                what: format!("SQS queue {q:?}"),
                why: "it does not exist (no actor with this name in the namespace?)".into(),
            },
            other => err("send to", queue, other),
        })
    }

    pub async fn delete(&self, url: &str, receipt: &str) -> Result<()> {
        self.t
            .client()
            .delete_message()
            .queue_url(url)
            .receipt_handle(receipt)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| err("delete from", url, e))
    }

    pub async fn make_visible(&self, url: &str, receipt: &str) -> Result<()> {
        self.t
            .client()
            .change_message_visibility()
            .queue_url(url)
            .receipt_handle(receipt)
            .visibility_timeout(0)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| err("give back to", url, e))
    }
}
