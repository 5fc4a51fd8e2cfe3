//! The admitted object of the general parse, kept as JSON.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// An admitted object as the request carries it, kept as JSON: review and injection read
/// JSON, so parsing it into a `DynamicObject` and serializing it back is saved. Like a
/// `DynamicObject`, it must be a JSON object whose `metadata`, when present, parses as
/// `ObjectMeta`.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(transparent)]
pub struct RawObject {
    pub value: Value,
    #[serde(skip)]
    metadata: ObjectMeta,
}

impl<'de> serde::Deserialize<'de> for RawObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = Value::deserialize(d)?;
        let Value::Object(map) = &value else {
            return Err(D::Error::invalid_type(
                serde::de::Unexpected::Other("a non-object"),
                &"an object",
            ));
        };
        let metadata = match map.get("metadata") {
            Some(m) => ObjectMeta::deserialize(m).map_err(D::Error::custom)?,
            None => ObjectMeta::default(),
        };
        Ok(RawObject { value, metadata })
    }
}

impl kube::Resource for RawObject {
    type DynamicType = ();
    type Scope = kube::core::DynamicResourceScope;
    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
