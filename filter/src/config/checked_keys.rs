//! The configuration's top-level keys checked as they are read, as serde's derive checks a plain
//! struct's: an unknown key is refused listing every accepted one, a repeated key by name. A
//! struct with flattened sections is read as a map, and serde then refuses an unknown key
//! without the list and takes a repeated one silently.
//!
//! [`CheckedKeys`] wraps the deserializer the configuration is read from; the values pass through
//! untouched (a table's own keys stay its derive's to check).

use serde::de::{
    self, DeserializeSeed, Deserializer, Error as _, IntoDeserializer, MapAccess, Visitor,
};

/// A deserializer of a map whose keys must be among `keys`, each at most once.
pub struct CheckedKeys<D> {
    pub inner: D,
    pub keys: &'static [&'static str],
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for CheckedKeys<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let keys = self.keys;
        self.inner.deserialize_map(CheckedVisitor { visitor, keys })
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

/// The configuration's own visitor, given the map with its keys checked.
struct CheckedVisitor<V> {
    visitor: V,
    keys: &'static [&'static str],
}

impl<'de, V: Visitor<'de>> Visitor<'de> for CheckedVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(CheckedMap {
            map,
            keys: self.keys,
            seen: Vec::new(),
        })
    }
}

/// The map, each key read as a string, checked, and handed on.
struct CheckedMap<A> {
    map: A,
    keys: &'static [&'static str],
    seen: Vec<&'static str>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for CheckedMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let Some(key) = self.map.next_key::<String>()? else {
            return Ok(None);
        };
        let Some(&known) = self.keys.iter().find(|k| **k == key) else {
            return Err(A::Error::unknown_field(&key, self.keys));
        };
        if self.seen.contains(&known) {
            return Err(A::Error::duplicate_field(known));
        }
        self.seen.push(known);
        let key: de::value::StrDeserializer<'static, A::Error> = known.into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        self.map.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}
