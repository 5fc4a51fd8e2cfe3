//! W3C trace context across hops (docs/DESIGN.md §4 "Traces"): the envelope's `traceparent`
//! and `tracestate` headers, owned by the platform. Pure rules only — parse, format, continue,
//! sample, rewrite — so the sidecar and the gateway make the same decisions; exporting spans
//! is the caller's business. Nothing here panics on outside input: a malformed `traceparent`
//! starts a new root trace.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// Envelope header (and HTTP header) carrying the W3C trace context.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// Vendor state that travels with `traceparent`, carried as it came.
pub const TRACESTATE_HEADER: &str = "tracestate";

/// The W3C limit on `tracestate` (512 characters): a longer one is dropped, not truncated,
/// since cutting a list member in half would corrupt it.
const MAX_TRACESTATE: usize = 512;

const FLAG_SAMPLED: u8 = 0x01;

/// One span's context as `traceparent` carries it (version `00`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: u128,
    pub span_id: u64,
    pub flags: u8,
}

impl TraceParent {
    pub fn sampled(&self) -> bool {
        self.flags & FLAG_SAMPLED != 0
    }

    /// `00-{32 hex}-{16 hex}-{2 hex}`.
    pub fn format(&self) -> String {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }

    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    pub fn span_id_hex(&self) -> String {
        format!("{:016x}", self.span_id)
    }

    /// A child span of this one: same trace and flags, the new span id.
    pub fn child(&self, span_id: u64) -> TraceParent {
        TraceParent {
            span_id: nonzero(span_id),
            ..*self
        }
    }
}

/// Why a `traceparent` value is refused (the caller then starts a new root).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTraceParent {
    #[error(
        "traceparent {value:?} is not version-trace_id-span_id-flags (4 fields separated by '-')"
    )]
    Shape { value: String },
    #[error(
        "traceparent {value:?} has version {version:?}: 'ff' is forbidden and version 00 has exactly 4 fields"
    )]
    Version { value: String, version: String },
    #[error("traceparent {value:?}: {field} must be {len} lowercase hex digits")]
    Hex {
        value: String,
        field: &'static str,
        len: usize,
    },
    #[error("traceparent {value:?}: {field} must not be all zeros")]
    Zero { value: String, field: &'static str },
}

fn hex_field(
    value: &str,
    s: &str,
    field: &'static str,
    len: usize,
) -> Result<u128, InvalidTraceParent> {
    let ok = s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !ok {
        return Err(InvalidTraceParent::Hex {
            value: value.to_string(),
            field,
            len,
        });
    }
    u128::from_str_radix(s, 16).map_err(|_| InvalidTraceParent::Hex {
        value: value.to_string(),
        field,
        len,
    })
}

/// Parses a `traceparent` by the W3C rules: version `00` has exactly four fields; a higher
/// version (not `ff`) is read for its first four and may carry more, as the specification
/// asks of a version-00 parser.
pub fn parse_traceparent(value: &str) -> Result<TraceParent, InvalidTraceParent> {
    let v = value.trim();
    let parts: Vec<&str> = v.split('-').collect();
    if parts.len() < 4 {
        return Err(InvalidTraceParent::Shape {
            value: value.to_string(),
        });
    }
    let version = hex_field(value, parts[0], "version", 2)?;
    if version == 0xff || (version == 0 && parts.len() != 4) {
        return Err(InvalidTraceParent::Version {
            value: value.to_string(),
            version: parts[0].to_string(),
        });
    }
    let trace_id = hex_field(value, parts[1], "trace-id", 32)?;
    let span_id = hex_field(value, parts[2], "parent-id", 16)? as u64;
    let flags = hex_field(value, parts[3], "trace-flags", 2)? as u8;
    if trace_id == 0 {
        return Err(InvalidTraceParent::Zero {
            value: value.to_string(),
            field: "trace-id",
        });
    }
    if span_id == 0 {
        return Err(InvalidTraceParent::Zero {
            value: value.to_string(),
            field: "parent-id",
        });
    }
    Ok(TraceParent {
        trace_id,
        span_id,
        // Only the sampled bit is defined; the others are not propagated (W3C: "MUST set
        // unknown flags to zero" when forwarding).
        flags: flags & FLAG_SAMPLED,
    })
}

/// The incoming context of one hop: the parent span (if any usable one came) and the
/// `tracestate` to carry on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Incoming {
    pub parent: Option<TraceParent>,
    pub tracestate: Option<String>,
    /// Why a present `traceparent` was not used (for one debug log line).
    pub refused: Option<InvalidTraceParent>,
}

/// Reads the trace context of an envelope's headers (or of HTTP headers put in a map).
/// Non-string values count as absent; a `tracestate` without a usable `traceparent` is
/// dropped, as the W3C specification asks.
pub fn incoming(headers: &Map<String, Value>) -> Incoming {
    let get = |k| headers.get(k).and_then(Value::as_str);
    incoming_from(get(TRACEPARENT_HEADER), get(TRACESTATE_HEADER))
}

/// The same rules for the two header values as they came (an HTTP request's, say).
pub fn incoming_from(traceparent: Option<&str>, tracestate: Option<&str>) -> Incoming {
    let (parent, refused) = match traceparent.map(parse_traceparent) {
        None => (None, None),
        Some(Ok(p)) => (Some(p), None),
        Some(Err(e)) => (None, Some(e)),
    };
    let tracestate = parent.and_then(|_| {
        tracestate
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE)
            .map(str::to_string)
    });
    Incoming {
        parent,
        tracestate,
        refused,
    }
}

/// The sampling decision for a new root trace by ratio (OTel's `traceidratio`): the trace is
/// kept when the lower 56 bits of its id fall below `ratio` of their range, so every part
/// deciding on the same id and ratio decides alike. Ratios outside 0..=1 are clamped; NaN
/// samples nothing.
pub fn sample_by_ratio(trace_id: u128, ratio: f64) -> bool {
    if ratio.is_nan() || ratio <= 0.0 {
        return false;
    }
    if ratio >= 1.0 {
        return true;
    }
    const RANGE: u64 = 1 << 56;
    let bound = (ratio * RANGE as f64) as u64;
    ((trace_id as u64) & (RANGE - 1)) < bound
}

/// `OTEL_TRACES_SAMPLER_ARG` as a ratio: absent or unparsable → 1.0 (the specification's
/// default for `traceidratio`), clamped to 0..=1.
pub fn ratio_from_env(arg: Option<&str>) -> f64 {
    match arg.map(str::trim).and_then(|s| s.parse::<f64>().ok()) {
        Some(r) if r.is_finite() => r.clamp(0.0, 1.0),
        _ => 1.0,
    }
}

/// The span a hop makes for `incoming`: a child of its parent (parent-based sampling: a
/// sampled parent is followed, an unsampled one too), or a new root sampled by `ratio`.
/// Whether this part records plays no part: a root started where tracing is off (a gateway
/// without `OTEL_*`, say) must still be recorded by the actors after it that trace.
pub fn hop_span(incoming: &Incoming, ids: &IdSource, ratio: f64) -> TraceParent {
    match incoming.parent {
        Some(p) => p.child(ids.span_id()),
        None => {
            let trace_id = ids.trace_id();
            let sampled = sample_by_ratio(trace_id, ratio);
            TraceParent {
                trace_id,
                span_id: ids.span_id(),
                flags: if sampled { FLAG_SAMPLED } else { 0 },
            }
        }
    }
}

/// Rewrites an outgoing envelope's trace headers to `span` (the producer span of this send)
/// and the hop's `tracestate`, whatever the handler left there: the chain is the platform's.
pub fn set_headers(headers: &mut Map<String, Value>, span: &TraceParent, tracestate: Option<&str>) {
    headers.insert(TRACEPARENT_HEADER.into(), Value::String(span.format()));
    match tracestate {
        Some(ts) => {
            headers.insert(TRACESTATE_HEADER.into(), Value::String(ts.to_string()));
        }
        None => {
            headers.remove(TRACESTATE_HEADER);
        }
    }
}

/// What a part does with traces, from the standard `OTEL_*` variables the webhook injects
/// (asya_api::telemetry::otel_env): `recording` when an OTLP endpoint is set, the SDK is not
/// disabled and the exporter is `otlp` (or unset); the ratio from `OTEL_TRACES_SAMPLER_ARG`.
/// Not recording, trace context is still carried and continued.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    pub recording: bool,
    pub ratio: f64,
    /// The collector's base URL; spans go to `{endpoint}/v1/traces`.
    pub endpoint: Option<String>,
}

impl TraceSettings {
    pub fn off() -> Self {
        TraceSettings {
            recording: false,
            ratio: 1.0,
            endpoint: None,
        }
    }

    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Self {
        use crate::telemetry::otel_env;
        let get = |k: &str| {
            get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let disabled = get(otel_env::SDK_DISABLED).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let exporter_otlp = get(otel_env::TRACES_EXPORTER).is_none_or(|v| v == "otlp");
        let endpoint = get(otel_env::EXPORTER_OTLP_ENDPOINT);
        TraceSettings {
            recording: !disabled && exporter_otlp && endpoint.is_some(),
            ratio: ratio_from_env(get(otel_env::TRACES_SAMPLER_ARG).as_deref()),
            endpoint,
        }
    }
}

/// Random trace and span ids without another dependency: SipHash with a per-process random
/// key (std's `RandomState`) over a counter and the clock. Not cryptographic; W3C asks ids to
/// be unique and unpredictable enough not to collide, which this is.
#[derive(Debug, Default)]
pub struct IdSource {
    keys: RandomState,
    counter: AtomicU64,
}

impl IdSource {
    pub fn new() -> Self {
        Self::default()
    }

    fn next(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        self.keys.hash_one((n, nanos))
    }

    pub fn span_id(&self) -> u64 {
        nonzero(self.next())
    }

    pub fn trace_id(&self) -> u128 {
        let id = ((self.next() as u128) << 64) | self.next() as u128;
        if id == 0 { 1 } else { id }
    }
}

/// All-zero ids are invalid on the wire.
fn nonzero(id: u64) -> u64 {
    if id == 0 { 1 } else { id }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_formats_the_w3c_example() {
        let p = parse_traceparent(TP).unwrap();
        assert_eq!(p.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(p.span_id, 0x00f067aa0ba902b7);
        assert!(p.sampled());
        assert_eq!(p.format(), TP);
    }

    #[test]
    fn refuses_each_malformation_by_name() {
        let cases = [
            ("", "not version"),
            ("00-abc", "not version"),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "'ff'",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                "exactly 4",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "trace-id must be 32",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                "trace-id must be 32",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
                "parent-id must be 16",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
                "trace-flags",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "trace-id must not be all zeros",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "parent-id must not be all zeros",
            ),
            (
                "+0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version must be",
            ),
        ];
        for (value, rule) in cases {
            let e = parse_traceparent(value).expect_err(value);
            assert!(e.to_string().contains(rule), "{value}: {e}");
        }
    }

    #[test]
    fn a_later_version_is_read_for_its_first_four_fields_and_unknown_flags_dropped() {
        let p = parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-extra")
            .unwrap();
        assert_eq!(p.flags, 0x01);
        assert_eq!(p.format(), TP);
    }

    #[test]
    fn a_child_keeps_trace_and_flags_and_never_a_zero_span() {
        let p = parse_traceparent(TP).unwrap();
        let c = p.child(7);
        assert_eq!((c.trace_id, c.span_id, c.flags), (p.trace_id, 7, p.flags));
        assert_eq!(p.child(0).span_id, 1);
    }

    fn headers(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn incoming_context_and_tracestate_rules() {
        let h = headers(serde_json::json!({"traceparent": TP, "tracestate": "k=v"}));
        let i = incoming(&h);
        assert_eq!(i.parent.unwrap().format(), TP);
        assert_eq!(i.tracestate.as_deref(), Some("k=v"));
        // tracestate without a usable parent is dropped; the refusal is kept for the log.
        let h = headers(serde_json::json!({"traceparent": "junk", "tracestate": "k=v"}));
        let i = incoming(&h);
        assert_eq!((i.parent, i.tracestate.as_deref()), (None, None));
        assert!(matches!(i.refused, Some(InvalidTraceParent::Shape { .. })));
        // Not a string, absent, or an oversized tracestate.
        assert_eq!(
            incoming(&headers(serde_json::json!({"traceparent": 5}))),
            Incoming::default()
        );
        let long = "k=".to_string() + &"v".repeat(600);
        let h = headers(serde_json::json!({"traceparent": TP, "tracestate": long}));
        assert_eq!(incoming(&h).tracestate, None);
    }

    #[test]
    fn a_hop_continues_its_parent_or_starts_a_root() {
        let ids = IdSource::new();
        let parent = parse_traceparent(TP).unwrap();
        let with = Incoming {
            parent: Some(parent),
            ..Default::default()
        };
        let s = hop_span(&with, &ids, 0.0);
        assert_eq!((s.trace_id, s.flags), (parent.trace_id, parent.flags));
        assert_ne!(s.span_id, parent.span_id);
        // An unsampled parent stays unsampled even at ratio 1.
        let unsampled = Incoming {
            parent: Some(TraceParent { flags: 0, ..parent }),
            ..Default::default()
        };
        assert!(!hop_span(&unsampled, &ids, 1.0).sampled());
        // Roots: sampled by ratio.
        let root = hop_span(&Incoming::default(), &ids, 1.0);
        assert!(root.sampled() && root.trace_id != parent.trace_id);
        assert!(!hop_span(&Incoming::default(), &ids, 0.0).sampled());
    }

    #[test]
    fn ratio_sampling_is_by_trace_id_and_env() {
        assert!(sample_by_ratio(0, 0.5));
        assert!(!sample_by_ratio((1u128 << 56) - 1, 0.5));
        assert!(!sample_by_ratio(0, f64::NAN));
        assert!(sample_by_ratio(u128::MAX, 1.0));
        // About half of many random ids at 0.5.
        let ids = IdSource::new();
        let kept = (0..10_000)
            .filter(|_| sample_by_ratio(ids.trace_id(), 0.5))
            .count();
        assert!((4_500..5_500).contains(&kept), "{kept}");
        assert_eq!(ratio_from_env(None), 1.0);
        assert_eq!(ratio_from_env(Some(" 0.25")), 0.25);
        assert_eq!(ratio_from_env(Some("2")), 1.0);
        assert_eq!(ratio_from_env(Some("-1")), 0.0);
        assert_eq!(ratio_from_env(Some("half")), 1.0);
        assert_eq!(ratio_from_env(Some("NaN")), 1.0);
    }

    #[test]
    fn the_platform_overwrites_what_a_handler_left() {
        let mut h = headers(serde_json::json!({
            "traceparent": "00-11111111111111111111111111111111-2222222222222222-00",
            "tracestate": "handler=forged", "k": 1
        }));
        let span = parse_traceparent(TP).unwrap();
        set_headers(&mut h, &span, Some("k=v"));
        assert_eq!(h["traceparent"], TP);
        assert_eq!(h["tracestate"], "k=v");
        assert_eq!(h["k"], 1);
        set_headers(&mut h, &span, None);
        assert!(!h.contains_key("tracestate"));
    }

    #[test]
    fn ids_are_distinct_and_nonzero() {
        let ids = IdSource::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let s = ids.span_id();
            assert_ne!(s, 0);
            assert!(seen.insert(s));
        }
    }

    #[test]
    fn settings_from_the_standard_variables() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let on = TraceSettings::from_lookup(&vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
        ]));
        assert!(on.recording);
        assert_eq!(on.ratio, 0.5);
        assert_eq!(on.endpoint.as_deref(), Some("http://127.0.0.1:4318"));
        assert_eq!(TraceSettings::from_lookup(&vars(&[])), TraceSettings::off());
        let disabled = TraceSettings::from_lookup(&vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ]));
        assert!(!disabled.recording);
        let other_exporter = TraceSettings::from_lookup(&vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ]));
        assert!(!other_exporter.recording);
    }

    proptest! {
        #[test]
        fn parsing_never_panics(s in "\\PC{0,80}") {
            let _ = parse_traceparent(&s);
        }

        #[test]
        fn format_then_parse_round_trips(t in 1u128.., s in 1u64.., sampled: bool) {
            let p = TraceParent { trace_id: t, span_id: s, flags: sampled as u8 };
            prop_assert_eq!(parse_traceparent(&p.format()), Ok(p));
        }
    }
}
