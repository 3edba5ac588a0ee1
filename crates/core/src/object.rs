//! Structs read from user input only as objects with named fields.
//!
//! serde's derived `Deserialize` for a struct also accepts a sequence of its fields in
//! declaration order: `["acme","bob",null,null]` reads as `{tenant: "acme", subject: "bob"}`.
//! A list exported by another tool in another field order would then name another person, or
//! swap a registry's tenant and subject columns. Every struct Lethe reads from a scope file, a
//! request body, a query string or a config table goes through [`Object`], which asks the format
//! for a map and never for a sequence.

use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

/// A `T` that was read from an object (a JSON object, a TOML table), never from a sequence.
///
/// Use it at the top (`serde_json::from_slice::<Object<Scope>>`) and for every field that is a
/// struct (`registry: Option<Object<RawRegistry>>`, `reads: Vec<Object<Read>>`): a derived
/// struct nested in another is read by the format's own deserializer, not through `Object`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Object<T>(pub T);

impl<T> Object<T> {
    /// The value read.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Fields<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object with named fields")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Fields(PhantomData)).map(Object)
    }
}

#[cfg(test)]
mod tests {
    use super::Object;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Pair {
        tenant: String,
        subject: Option<String>,
    }

    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        inner: Option<Object<Pair>>,
        #[serde(default)]
        list: Vec<Object<Pair>>,
    }

    #[test]
    fn a_struct_is_read_from_an_object_and_never_from_a_sequence() {
        let ok: Object<Pair> = serde_json::from_str(r#"{"tenant":"a","subject":"b"}"#).unwrap();
        assert_eq!(
            ok.0,
            Pair {
                tenant: "a".into(),
                subject: Some("b".into())
            }
        );
        // The derived struct alone takes the array: the hole this type closes.
        assert!(serde_json::from_str::<Pair>(r#"["a","b"]"#).is_ok());
        for bad in [r#"["a","b"]"#, r#""a""#, "7", "null", "true"] {
            let e = serde_json::from_str::<Object<Pair>>(bad).unwrap_err();
            assert!(
                e.to_string().contains("an object with named fields"),
                "{bad}: {e}"
            );
        }
        // Missing, unknown and repeated keys are still the struct's to refuse.
        for bad in [
            r#"{"subject":"b"}"#,
            r#"{"tenant":"a","x":1}"#,
            r#"{"tenant":"a","tenant":"b"}"#,
            r#"{"tenant":{"a":1}}"#,
        ] {
            assert!(serde_json::from_str::<Object<Pair>>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nested_structs_and_parsed_values_are_held_to_it_too() {
        let e = serde_json::from_str::<Object<Outer>>(r#"{"inner":["a","b"]}"#).unwrap_err();
        assert!(e.to_string().contains("an object"), "{e}");
        let e = serde_json::from_str::<Object<Outer>>(r#"{"list":[["a","b"]]}"#).unwrap_err();
        assert!(e.to_string().contains("an object"), "{e}");
        let ok: Object<Outer> =
            serde_json::from_str(r#"{"inner":{"tenant":"a"},"list":[{"tenant":"c"}]}"#).unwrap();
        assert_eq!(ok.0.list.len(), 1);
        // A value already parsed (the config's tables reach their structs this way).
        let v = serde_json::json!({"inner": ["a", "b"]});
        assert!(serde_json::from_value::<Object<Outer>>(v).is_err());
    }
}
