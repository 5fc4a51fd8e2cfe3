//! Which x-sump envelopes a `sump list` or `sump redrive` is about. Pure.

use std::time::Duration;

use regex::Regex;

use crate::failed::Failed;

/// A selection: every given criterion must hold. `ids` empty means any id.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    pub ids: Vec<String>,
    pub actor: Option<String>,
    pub error: Option<Regex>,
    /// Failed within this long before now; an envelope whose time is unknown is not selected.
    pub since: Option<Duration>,
}

/// Why a selection was refused before anything was read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SelectError {
    #[error("--error {pattern:?}: not a regular expression: {why}")]
    BadRegex { pattern: String, why: String },
    #[error("--since {value:?}: {why}")]
    BadSince { value: String, why: String },
    #[error(
        "sump redrive: nothing selected: give envelope IDs, --actor, --error or --all (a redrive of everything must be asked for by name)"
    )]
    Unbounded,
}

impl Selector {
    /// Builds a selector from the command line's words; `require_bound` (redrive) refuses a
    /// selection of everything unless `all` says so.
    pub fn parse(
        ids: Vec<String>,
        actor: Option<String>,
        error: Option<&str>,
        since: Option<&str>,
        all: bool,
        require_bound: bool,
    ) -> Result<Selector, SelectError> {
        let error = error
            .map(|p| {
                Regex::new(p).map_err(|e| SelectError::BadRegex {
                    pattern: p.to_string(),
                    why: e.to_string(),
                })
            })
            .transpose()?;
        let since = since
            .map(|s| {
                asya_api::duration::parse_duration(s).map_err(|e| SelectError::BadSince {
                    value: s.to_string(),
                    why: e.to_string(),
                })
            })
            .transpose()?;
        let sel = Selector {
            ids,
            actor,
            error,
            since,
        };
        if require_bound && !all && sel.is_everything() {
            return Err(SelectError::Unbounded);
        }
        Ok(sel)
    }

    fn is_everything(&self) -> bool {
        self.ids.is_empty() && self.actor.is_none() && self.error.is_none() && self.since.is_none()
    }

    /// Whether `f` is selected at `now_ms`.
    pub fn matches(&self, f: &Failed, now_ms: u64) -> bool {
        if !self.ids.is_empty() && !self.ids.contains(&f.id) {
            return false;
        }
        if let Some(a) = &self.actor
            && f.actor.as_deref() != Some(a.as_str())
        {
            return false;
        }
        if let Some(re) = &self.error
            && !re.is_match(&f.error_text())
        {
            return false;
        }
        if let Some(since) = self.since {
            let window = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
            match f.failed_at_ms {
                Some(t) if now_ms.saturating_sub(t) <= window => {}
                _ => return false,
            }
        }
        true
    }

    /// The ids asked for by name that are not among `found`: `sump show`/`redrive` say so
    /// rather than succeed silently.
    pub fn missing_ids<'a>(&'a self, found: &[Failed]) -> Vec<&'a str> {
        self.ids
            .iter()
            .filter(|i| !found.iter().any(|f| f.id == **i))
            .map(String::as_str)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(id: &str, actor: &str, ty: &str, at: Option<u64>) -> Failed {
        Failed {
            id: id.into(),
            actor: Some(actor.into()),
            reason: Some("retries exhausted".into()),
            error: Some("processing_error".into()),
            error_type: Some(ty.into()),
            message: Some("boom".into()),
            traceback: None,
            attempts: 1,
            route_position: 0,
            route: vec![actor.into()],
            failed_at_ms: at,
            redriven: 0,
        }
    }

    fn sel(ids: &[&str], actor: Option<&str>, err: Option<&str>, since: Option<&str>) -> Selector {
        Selector::parse(
            ids.iter().map(|s| s.to_string()).collect(),
            actor.map(str::to_string),
            err,
            since,
            false,
            false,
        )
        .unwrap()
    }

    #[test]
    fn each_criterion_selects() {
        let f = failed("e1", "a", "ValueError", Some(10_000));
        let now = 20_000;
        assert!(sel(&[], None, None, None).matches(&f, now));
        assert!(sel(&["e1"], None, None, None).matches(&f, now));
        assert!(!sel(&["e2"], None, None, None).matches(&f, now));
        assert!(sel(&[], Some("a"), None, None).matches(&f, now));
        assert!(!sel(&[], Some("b"), None, None).matches(&f, now));
        assert!(sel(&[], None, Some("Value.*"), None).matches(&f, now));
        assert!(sel(&[], None, Some("retries"), None).matches(&f, now));
        assert!(!sel(&[], None, Some("^KeyError"), None).matches(&f, now));
        assert!(sel(&[], None, None, Some("10s")).matches(&f, now));
        assert!(!sel(&[], None, None, Some("9s")).matches(&f, now));
    }

    #[test]
    fn all_criteria_must_hold() {
        let f = failed("e1", "a", "ValueError", Some(0));
        assert!(!sel(&["e1"], Some("b"), None, None).matches(&f, 0));
        assert!(!sel(&[], Some("a"), Some("KeyError"), None).matches(&f, 0));
    }

    #[test]
    fn unknown_time_is_not_within_since() {
        let f = failed("e1", "a", "ValueError", None);
        assert!(!sel(&[], None, None, Some("1h")).matches(&f, 5));
    }

    #[test]
    fn refusals_name_the_flag_and_value() {
        let e = Selector::parse(vec![], None, Some("("), None, false, false).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--error \"(\": not a regular expression")
        );
        let e = Selector::parse(vec![], None, None, Some("soon"), false, false).unwrap_err();
        assert!(e.to_string().starts_with("--since \"soon\":"), "{e}");
        assert_eq!(
            Selector::parse(vec![], None, None, None, false, true).unwrap_err(),
            SelectError::Unbounded
        );
        assert!(Selector::parse(vec![], None, None, None, true, true).is_ok());
        assert!(Selector::parse(vec!["x".into()], None, None, None, false, true).is_ok());
    }

    #[test]
    fn missing_ids_are_named() {
        let s = sel(&["e1", "e2"], None, None, None);
        assert_eq!(s.missing_ids(&[failed("e1", "a", "T", None)]), vec!["e2"]);
    }
}
