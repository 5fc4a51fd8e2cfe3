//! OTLP's JSON encoding of a batch of spans (the body of `POST /v1/traces` with
//! `Content-Type: application/json`), by the protobuf JSON mapping OTLP specifies: trace and
//! span ids as lowercase hex (not base64), enums as integers, 64-bit integers (times,
//! `intValue`) as decimal strings, field names in lowerCamelCase, zero values left out.
//! Pure: the exporter posts what this returns.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SpanData;
use serde_json::{Map, Value as Json, json};

/// `SpanFlags`: bit 8 says whether bit 9 (the parent or linked span is remote) is known.
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
const FLAG_IS_REMOTE: u32 = 0x200;

/// The `ExportTraceServiceRequest` of `spans`, all from one process described by `resource`.
/// Spans are grouped by instrumentation scope, in the order each scope first appears.
pub fn encode(resource: &Resource, spans: &[SpanData]) -> Json {
    let mut scopes: Vec<(&InstrumentationScope, Vec<Json>)> = Vec::new();
    for s in spans {
        let encoded = span(s);
        match scopes
            .iter_mut()
            .find(|(sc, _)| *sc == &s.instrumentation_scope)
        {
            Some((_, list)) => list.push(encoded),
            None => scopes.push((&s.instrumentation_scope, vec![encoded])),
        }
    }
    // A resource's attributes are a hash map: sorted, so equal batches encode equally.
    let mut attrs: Vec<(&str, &Value)> = resource.iter().map(|(k, v)| (k.as_str(), v)).collect();
    attrs.sort_by(|a, b| a.0.cmp(b.0));
    let mut resource_spans = Map::new();
    resource_spans.insert(
        "resource".into(),
        json!({ "attributes": attrs.into_iter().map(|(k, v)| key_value(k, v)).collect::<Vec<_>>() }),
    );
    resource_spans.insert(
        "scopeSpans".into(),
        Json::Array(
            scopes
                .into_iter()
                .map(|(sc, spans)| {
                    let mut o = Map::new();
                    o.insert("scope".into(), scope(sc));
                    o.insert("spans".into(), Json::Array(spans));
                    if let Some(url) = sc.schema_url() {
                        o.insert("schemaUrl".into(), url.into());
                    }
                    Json::Object(o)
                })
                .collect(),
        ),
    );
    if let Some(url) = resource.schema_url() {
        resource_spans.insert("schemaUrl".into(), url.into());
    }
    json!({ "resourceSpans": [Json::Object(resource_spans)] })
}

fn scope(sc: &InstrumentationScope) -> Json {
    let mut o = Map::new();
    o.insert("name".into(), sc.name().into());
    if let Some(v) = sc.version() {
        o.insert("version".into(), v.into());
    }
    let attrs = attributes(sc.attributes());
    if !attrs.is_empty() {
        o.insert("attributes".into(), Json::Array(attrs));
    }
    Json::Object(o)
}

fn span(s: &SpanData) -> Json {
    let cx = &s.span_context;
    let mut o = Map::new();
    o.insert("traceId".into(), trace_id_hex(cx).into());
    o.insert("spanId".into(), span_id_hex(cx.span_id()).into());
    put_trace_state(&mut o, cx);
    let has_parent = s.parent_span_id != SpanId::INVALID;
    if has_parent {
        o.insert("parentSpanId".into(), span_id_hex(s.parent_span_id).into());
    }
    let mut flags = u32::from(cx.trace_flags().to_u8());
    if has_parent {
        flags |= FLAG_HAS_IS_REMOTE;
        if s.parent_span_is_remote {
            flags |= FLAG_IS_REMOTE;
        }
    }
    o.insert("flags".into(), flags.into());
    o.insert("name".into(), s.name.as_ref().into());
    o.insert("kind".into(), kind(&s.span_kind).into());
    o.insert("startTimeUnixNano".into(), unix_nanos(s.start_time).into());
    o.insert("endTimeUnixNano".into(), unix_nanos(s.end_time).into());
    put_list(&mut o, "attributes", attributes(&s.attributes));
    put_count(&mut o, "droppedAttributesCount", s.dropped_attributes_count);
    let events = s
        .events
        .iter()
        .map(|e| {
            let mut ev = Map::new();
            ev.insert("timeUnixNano".into(), unix_nanos(e.timestamp).into());
            ev.insert("name".into(), e.name.as_ref().into());
            put_list(&mut ev, "attributes", attributes(&e.attributes));
            put_count(
                &mut ev,
                "droppedAttributesCount",
                e.dropped_attributes_count,
            );
            Json::Object(ev)
        })
        .collect();
    put_list(&mut o, "events", events);
    put_count(&mut o, "droppedEventsCount", s.events.dropped_count);
    let links = s
        .links
        .iter()
        .map(|l| {
            let lc = &l.span_context;
            let mut lo = Map::new();
            lo.insert("traceId".into(), trace_id_hex(lc).into());
            lo.insert("spanId".into(), span_id_hex(lc.span_id()).into());
            put_trace_state(&mut lo, lc);
            put_list(&mut lo, "attributes", attributes(&l.attributes));
            put_count(
                &mut lo,
                "droppedAttributesCount",
                l.dropped_attributes_count,
            );
            let mut flags = u32::from(lc.trace_flags().to_u8()) | FLAG_HAS_IS_REMOTE;
            if lc.is_remote() {
                flags |= FLAG_IS_REMOTE;
            }
            lo.insert("flags".into(), flags.into());
            Json::Object(lo)
        })
        .collect();
    put_list(&mut o, "links", links);
    put_count(&mut o, "droppedLinksCount", s.links.dropped_count);
    o.insert("status".into(), status(&s.status));
    Json::Object(o)
}

/// `SpanKind` numbers of OTLP's trace.proto.
fn kind(k: &SpanKind) -> u8 {
    match k {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

/// `Status.code`: UNSET 0, OK 1, ERROR 2; the message only for errors.
fn status(s: &Status) -> Json {
    match s {
        Status::Unset => json!({}),
        Status::Ok => json!({ "code": 1 }),
        Status::Error { description } if description.is_empty() => json!({ "code": 2 }),
        Status::Error { description } => {
            json!({ "code": 2, "message": description.as_ref() })
        }
    }
}

fn attributes<'a>(kvs: impl IntoIterator<Item = &'a KeyValue>) -> Vec<Json> {
    kvs.into_iter()
        .map(|kv| key_value(kv.key.as_str(), &kv.value))
        .collect()
}

fn key_value(key: &str, value: &Value) -> Json {
    json!({ "key": key, "value": any_value(value) })
}

/// `AnyValue`: one of `stringValue`, `boolValue`, `intValue` (a string), `doubleValue`,
/// `arrayValue`.
fn any_value(v: &Value) -> Json {
    match v {
        Value::Bool(b) => json!({ "boolValue": b }),
        Value::I64(i) => json!({ "intValue": i.to_string() }),
        Value::F64(f) => json!({ "doubleValue": double(*f) }),
        Value::String(s) => json!({ "stringValue": s.as_str() }),
        Value::Array(a) => {
            let values: Vec<Json> = match a {
                Array::Bool(v) => v.iter().map(|b| json!({ "boolValue": b })).collect(),
                Array::I64(v) => v
                    .iter()
                    .map(|i| json!({ "intValue": i.to_string() }))
                    .collect(),
                Array::F64(v) => v
                    .iter()
                    .map(|f| json!({ "doubleValue": double(*f) }))
                    .collect(),
                Array::String(v) => v
                    .iter()
                    .map(|s| json!({ "stringValue": s.as_str() }))
                    .collect(),
                // A kind of array added to the API later: its text rather than nothing.
                other => vec![json!({ "stringValue": other.to_string() })],
            };
            json!({ "arrayValue": { "values": values } })
        }
        other => json!({ "stringValue": other.to_string() }),
    }
}

/// JSON has no NaN or infinities; the protobuf JSON mapping writes them as strings.
fn double(f: f64) -> Json {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        f.into()
    }
}

fn trace_id_hex(cx: &SpanContext) -> String {
    format!("{:032x}", u128::from_be_bytes(cx.trace_id().to_bytes()))
}

fn span_id_hex(id: SpanId) -> String {
    format!("{:016x}", u64::from_be_bytes(id.to_bytes()))
}

fn put_trace_state(o: &mut Map<String, Json>, cx: &SpanContext) {
    let state = cx.trace_state().header();
    if !state.is_empty() {
        o.insert("traceState".into(), state.into());
    }
}

fn put_list(o: &mut Map<String, Json>, key: &str, list: Vec<Json>) {
    if !list.is_empty() {
        o.insert(key.into(), Json::Array(list));
    }
}

fn put_count(o: &mut Map<String, Json>, key: &str, n: u32) {
    if n > 0 {
        o.insert(key.into(), n.into());
    }
}

/// Nanoseconds since the Unix epoch as a decimal string (a time before it, impossible from a
/// sane clock, as 0).
fn unix_nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Event, Link, TraceFlags, TraceId, TraceState};
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use std::borrow::Cow;
    use std::time::Duration;

    fn at(nanos: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(nanos)
    }

    fn fixture() -> SpanData {
        let trace = TraceId::from(0x4bf92f3577b34da6a3ce929d0e0e4736_u128);
        let state = TraceState::from_key_value([("k", "v")]).unwrap();
        let mut events = SpanEvents::default();
        events.events.push(Event::new(
            "retry",
            at(1_700_000_000_200_000_000),
            vec![KeyValue::new("attempt", 2_i64)],
            0,
        ));
        let mut links = SpanLinks::default();
        links.links.push(Link::with_context(SpanContext::new(
            trace,
            SpanId::from(1_u64),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        )));
        links.dropped_count = 2;
        SpanData {
            span_context: SpanContext::new(
                trace,
                SpanId::from(0x00f067aa0ba902b7_u64),
                TraceFlags::SAMPLED,
                false,
                state,
            ),
            parent_span_id: SpanId::from(0x0000000000000001_u64),
            parent_span_is_remote: true,
            span_kind: SpanKind::Consumer,
            name: Cow::Borrowed("process asya-ns-a"),
            start_time: at(1_700_000_000_123_456_789),
            end_time: at(1_700_000_000_223_456_789),
            attributes: vec![
                KeyValue::new("messaging.system", "rabbitmq"),
                KeyValue::new("retries", 3_i64),
                KeyValue::new("ok", true),
                KeyValue::new("ratio", 0.5),
                KeyValue::new("bad", f64::NAN),
                KeyValue::new("tags", Value::Array(Array::I64(vec![1, -2]))),
            ],
            dropped_attributes_count: 0,
            events,
            links,
            status: Status::error("RuntimeError"),
            instrumentation_scope: InstrumentationScope::builder("asya-sidecar")
                .with_version("0.1.0")
                .build(),
        }
    }

    #[test]
    fn a_span_encodes_to_otlp_json() {
        let resource = Resource::builder_empty()
            .with_attributes([
                KeyValue::new("service.name", "resize"),
                KeyValue::new("k8s.namespace.name", "ns"),
            ])
            .build();
        let expected = json!({
          "resourceSpans": [{
            "resource": { "attributes": [
              { "key": "k8s.namespace.name", "value": { "stringValue": "ns" } },
              { "key": "service.name", "value": { "stringValue": "resize" } }
            ] },
            "scopeSpans": [{
              "scope": { "name": "asya-sidecar", "version": "0.1.0" },
              "spans": [{
                "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
                "spanId": "00f067aa0ba902b7",
                "traceState": "k=v",
                "parentSpanId": "0000000000000001",
                "flags": 0x301,
                "name": "process asya-ns-a",
                "kind": 5,
                "startTimeUnixNano": "1700000000123456789",
                "endTimeUnixNano": "1700000000223456789",
                "attributes": [
                  { "key": "messaging.system", "value": { "stringValue": "rabbitmq" } },
                  { "key": "retries", "value": { "intValue": "3" } },
                  { "key": "ok", "value": { "boolValue": true } },
                  { "key": "ratio", "value": { "doubleValue": 0.5 } },
                  { "key": "bad", "value": { "doubleValue": "NaN" } },
                  { "key": "tags", "value": { "arrayValue": { "values": [
                    { "intValue": "1" }, { "intValue": "-2" }
                  ] } } }
                ],
                "events": [{
                  "timeUnixNano": "1700000000200000000",
                  "name": "retry",
                  "attributes": [{ "key": "attempt", "value": { "intValue": "2" } }]
                }],
                "links": [{
                  "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
                  "spanId": "0000000000000001",
                  "flags": 0x301
                }],
                "droppedLinksCount": 2,
                "status": { "code": 2, "message": "RuntimeError" }
              }]
            }]
          }]
        });
        assert_eq!(encode(&resource, &[fixture()]), expected);
    }

    #[test]
    fn a_root_span_has_no_parent_and_no_remote_flag_and_scopes_group() {
        let mut root = fixture();
        root.parent_span_id = SpanId::INVALID;
        root.span_context = SpanContext::new(
            root.span_context.trace_id(),
            root.span_context.span_id(),
            TraceFlags::default(),
            false,
            TraceState::default(),
        );
        root.span_kind = SpanKind::Server;
        root.status = Status::Unset;
        let mut other = root.clone();
        other.instrumentation_scope = InstrumentationScope::builder("asya-gateway").build();
        let body = encode(
            &Resource::builder_empty().build(),
            &[root.clone(), other, root],
        );
        let scopes = body["resourceSpans"][0]["scopeSpans"].as_array().unwrap();
        assert_eq!(scopes.len(), 2);
        assert_eq!(scopes[0]["spans"].as_array().unwrap().len(), 2);
        assert_eq!(scopes[1]["scope"], json!({ "name": "asya-gateway" }));
        let s = &scopes[0]["spans"][0];
        assert!(s.get("parentSpanId").is_none() && s.get("traceState").is_none());
        assert_eq!(s["flags"], 0);
        assert_eq!(s["kind"], 2);
        assert_eq!(s["status"], json!({}));
    }
}
