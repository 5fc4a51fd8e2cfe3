//! Durations as the seeds write them: `300s`, `5m`, `1h30m`, `250ms`, or a bare integer of
//! seconds (`timeout.processing: 300`).

use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a duration did not parse; the message is shown to users as the rule broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("must be a duration such as 300s, 5m or 1h30m (units: ms, s, m, h)")]
    Syntax,
    #[error("duration is too large")]
    Overflow,
}

/// Parses `1h30m`, `300s`, `250ms`, `1.5s` or a bare integer number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or(DurationError::Syntax)?;
        if num_len == 0 {
            return Err(DurationError::Syntax);
        }
        let number: f64 = rest[..num_len].parse().map_err(|_| DurationError::Syntax)?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit_secs = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(DurationError::Syntax),
        };
        rest = &rest[unit_len..];
        let part = number * unit_secs;
        if !part.is_finite() || part > 1e12 {
            return Err(DurationError::Overflow);
        }
        total = total
            .checked_add(Duration::from_secs_f64(part))
            .ok_or(DurationError::Overflow)?;
    }
    Ok(total)
}

/// Formats a duration the way users write it (`1h30m`, `45s`, `250ms`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let mut secs = ms / 1000;
    let mut out = String::new();
    for (unit, size) in [("h", 3600), ("m", 60), ("s", 1)] {
        if secs >= size {
            out.push_str(&format!("{}{unit}", secs / size));
            secs %= size;
        }
    }
    out
}

/// A duration field as written in a spec: either a string (`5m`) or integer seconds. The
/// original text is kept so a round-trip does not rewrite the user's object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DurationSpec(pub String);

impl DurationSpec {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn from_duration(d: Duration) -> Self {
        Self(format_duration(d))
    }
    pub fn parse(&self) -> Result<Duration, DurationError> {
        parse_duration(&self.0)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DurationSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for DurationSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::Int(n)) => Ok(Self(format!("{n}s"))),
            Ok(Raw::Str(s)) => Ok(Self(s)),
            Err(_) => Err(serde::de::Error::custom(
                "expected a duration string (e.g. 300s, 5m) or integer seconds",
            )),
        }
    }
}

impl JsonSchema for DurationSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // The bare int-or-string marker is a valid structural schema on its own.
        schemars::json_schema!({"x-kubernetes-int-or-string": true})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_seed_forms() {
        assert_eq!(parse_duration("300s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("600"), Ok(Duration::from_secs(600)));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        for bad in ["5x", "m", "5 m", "-1s", "1h30", "s5", "1..2s"] {
            assert_eq!(parse_duration(bad), Err(DurationError::Syntax), "{bad}");
        }
        assert_eq!(
            parse_duration("99999999999999h"),
            Err(DurationError::Overflow)
        );
    }

    #[test]
    fn formats_round_trip() {
        for s in ["1h30m", "45s", "250ms", "2h", "1m5s"] {
            assert_eq!(format_duration(parse_duration(s).unwrap()), s);
        }
    }

    #[test]
    fn integer_seconds_deserialize_as_duration() {
        let d: DurationSpec = serde_json::from_str("300").unwrap();
        assert_eq!(d.parse(), Ok(Duration::from_secs(300)));
        assert!(serde_json::from_str::<DurationSpec>("true").is_err());
    }
}
