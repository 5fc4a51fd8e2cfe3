//! The one place the commands read the clock, so the decisions stay pure and testable.

/// Now, in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0)
}

/// Now as RFC 3339 (UTC, seconds), as `x-asya-redriven.at` records it.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A time in ms since the epoch as RFC 3339, `-` when unknown.
pub fn rfc3339(ms: Option<u64>) -> String {
    ms.and_then(|ms| i64::try_from(ms).ok())
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_epoch_ms() {
        assert_eq!(super::rfc3339(Some(0)), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(None), "");
    }
}
