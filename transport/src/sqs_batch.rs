//! The pure decisions behind SQS's batch calls (`SendMessageBatch`, `DeleteMessageBatch`,
//! `ChangeMessageVisibilityBatch`): how entries are split into requests, which failed entries
//! are worth another try, and how often held messages are kept invisible. The I/O is in
//! `sqs_batcher` and `sqs`.
//!
//! The limits are SQS's documented ones, not the test server's: at most 10 entries a request,
//! and the bodies of one `SendMessageBatch` together no larger than the largest message the
//! queue accepts (262,144 bytes before 2025, 1,048,576 since).

use std::ops::Range;
use std::time::Duration;

/// Whether an error code says the queue does not exist: SQS's own
/// (`AWS.SimpleQueueService.NonExistentQueue`, which aws-sdk-sqs models) or the JSON
/// protocol's type name, which ElasticMQ sends without SQS's query-compatible header (so the
/// SDK does not recognise it as the modeled error).
pub fn is_no_such_queue(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("AWS.SimpleQueueService.NonExistentQueue" | "QueueDoesNotExist")
    )
}

/// Whether a CreateQueue error says the queue exists: another creator won a race for the
/// same name with other attributes (sidecars of two actors with different visibility
/// timeouts creating x-sink at once; SQS and ElasticMQ both refuse the second so). The
/// queue is there to use: its URL is read instead.
pub fn is_queue_name_exists(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("QueueNameExists" | "QueueAlreadyExists" | "AWS.SimpleQueueService.QueueNameExists")
    )
}

/// SQS's limit on the entries of one batch request.
pub const MAX_ENTRIES: usize = 10;

/// Splits entries of the given sizes, in order, into runs of at most `max_entries` entries
/// whose sizes add up to at most `max_bytes`. An entry larger than `max_bytes` on its own
/// gets a run of its own (the server refuses it, for that entry alone).
pub fn split(sizes: &[usize], max_entries: usize, max_bytes: usize) -> Vec<Range<usize>> {
    let max_entries = max_entries.max(1);
    let mut runs = Vec::new();
    let mut start = 0;
    let mut bytes = 0usize;
    for (i, &size) in sizes.iter().enumerate() {
        let full =
            i - start == max_entries || (i > start && bytes.saturating_add(size) > max_bytes);
        if full {
            runs.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes = bytes.saturating_add(size);
    }
    if start < sizes.len() {
        runs.push(start..sizes.len());
    }
    runs
}

/// What to do with one entry a batch request reported as failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryVerdict {
    /// The server's fault (`SenderFault: false`) or a throttle: the same entry may succeed.
    Retry,
    /// The request's fault (an invalid receipt handle, a body the queue refuses): it will
    /// fail the same way again.
    Permanent,
}

/// Classifies a failed entry by SQS's `SenderFault` and `Code`. Throttling is reported as
/// the sender's fault but passes with time, so it is retried.
pub fn entry_verdict(sender_fault: bool, code: &str) -> EntryVerdict {
    const THROTTLED: [&str; 3] = ["RequestThrottled", "ThrottlingException", "Throttling"];
    if !sender_fault || THROTTLED.contains(&code) {
        EntryVerdict::Retry
    } else {
        EntryVerdict::Permanent
    }
}

/// How many times a batch entry is tried in all before its caller is told it failed. For a
/// send the caller then gives the input back (a redelivery, never a loss); for a delete the
/// message is redelivered after its visibility timeout (a duplicate, never a loss).
pub const ENTRY_ATTEMPTS: u32 = 3;

/// The pause before the `attempt`-th retry of failed entries (attempt 1 is the first retry).
pub fn retry_pause(attempt: u32) -> Duration {
    Duration::from_millis(50u64 << attempt.min(6))
}

/// How often held messages get their visibility extended: a third of the queue's visibility
/// timeout, so that two extensions in a row may fail (or be slow) before a message shows
/// again; never more often than twice a second.
pub fn extension_period(visibility: Duration) -> Duration {
    (visibility / 3).max(Duration::from_millis(500))
}

/// The visibility timeout an extension sets, in whole seconds within SQS's 0..=43,200.
pub fn extension_seconds(visibility: Duration) -> i32 {
    visibility.as_secs().clamp(1, 43_200) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_create_race_reads_as_an_existing_queue() {
        assert!(is_queue_name_exists(Some("QueueNameExists")));
        assert!(is_queue_name_exists(Some("QueueAlreadyExists")));
        assert!(!is_queue_name_exists(Some("AccessDenied")));
        assert!(!is_queue_name_exists(None));
    }

    #[test]
    fn both_spellings_of_a_missing_queue_are_recognised() {
        assert!(is_no_such_queue(Some(
            "AWS.SimpleQueueService.NonExistentQueue"
        )));
        assert!(is_no_such_queue(Some("QueueDoesNotExist")));
        assert!(!is_no_such_queue(Some("AccessDenied")));
        assert!(!is_no_such_queue(None));
    }

    #[test]
    fn splits_by_count() {
        let sizes = vec![1; 25];
        assert_eq!(split(&sizes, 10, 1000), vec![0..10, 10..20, 20..25]);
        assert_eq!(split(&[], 10, 1000), Vec::<Range<usize>>::new());
    }

    #[test]
    fn splits_by_bytes_and_keeps_order() {
        // 400 + 400 fits 1000, the third would not.
        assert_eq!(split(&[400, 400, 400, 100], 10, 1000), vec![0..2, 2..4]);
        // Exactly the limit still fits.
        assert_eq!(split(&[500, 500, 1], 10, 1000), vec![0..2, 2..3]);
    }

    #[test]
    fn an_oversized_entry_goes_alone() {
        assert_eq!(split(&[10, 2000, 10], 10, 1000), vec![0..1, 1..2, 2..3]);
        assert_eq!(split(&[2000], 10, 1000), vec![0..1]);
    }

    #[test]
    fn every_run_meets_both_limits() {
        let sizes: Vec<usize> = (0..200).map(|i| (i * 7919) % 300_000).collect();
        let runs = split(&sizes, MAX_ENTRIES, 262_144);
        assert_eq!(runs.first().map(|r| r.start), Some(0));
        assert_eq!(runs.last().map(|r| r.end), Some(sizes.len()));
        for w in runs.windows(2) {
            assert_eq!(w[0].end, w[1].start, "runs are contiguous");
        }
        for r in &runs {
            assert!(r.len() <= MAX_ENTRIES, "{r:?}");
            let bytes: usize = sizes[r.clone()].iter().sum();
            assert!(r.len() == 1 || bytes <= 262_144, "{r:?}: {bytes} bytes");
        }
    }

    #[test]
    fn server_faults_and_throttles_are_retried_the_rest_is_not() {
        assert_eq!(entry_verdict(false, "InternalError"), EntryVerdict::Retry);
        assert_eq!(entry_verdict(true, "RequestThrottled"), EntryVerdict::Retry);
        assert_eq!(
            entry_verdict(true, "ReceiptHandleIsInvalid"),
            EntryVerdict::Permanent
        );
        assert_eq!(
            entry_verdict(true, "InvalidMessageContents"),
            EntryVerdict::Permanent
        );
    }

    #[test]
    fn retry_pauses_grow_and_stay_bounded() {
        assert_eq!(retry_pause(1), Duration::from_millis(100));
        assert!(retry_pause(2) > retry_pause(1));
        assert_eq!(retry_pause(40), retry_pause(6));
    }

    #[test]
    fn extension_comes_thrice_per_timeout_at_most_twice_a_second() {
        assert_eq!(
            extension_period(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
        assert_eq!(
            extension_period(Duration::from_secs(1)),
            Duration::from_millis(500)
        );
        assert_eq!(extension_seconds(Duration::from_millis(200)), 1);
        assert_eq!(extension_seconds(Duration::from_secs(90_000)), 43_200);
    }
}
