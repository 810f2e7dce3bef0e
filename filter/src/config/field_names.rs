//! The JSON keys a section accepts, read from serde itself: a section's derived `Deserialize`
//! passes them to `deserialize_struct`, so a deserializer that keeps that argument and then
//! fails learns them without any value. The flat configuration checks its top-level keys against
//! the union of its sections' (serde's `flatten` refuses an unknown key without listing them).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// The keys `T` accepts, in declaration order; empty for a type that is not a plain struct (one
/// with a flattened field is read as a map, whose keys serde does not list).
pub fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut names: &'static [&'static str] = &[];
    // always an error: the names are all it is run for
    let _ = T::deserialize(FieldNames { names: &mut names });
    names
}

/// A deserializer that keeps the field names of the struct asked of it and gives no value.
struct FieldNames<'a> {
    names: &'a mut &'static [&'static str],
}

/// What [`FieldNames`] always returns.
#[derive(Debug)]
struct NoValue;

impl fmt::Display for NoValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field names only")
    }
}

impl std::error::Error for NoValue {}

impl de::Error for NoValue {
    fn custom<T: fmt::Display>(_: T) -> Self {
        NoValue
    }
}

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = NoValue;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, NoValue> {
        Err(NoValue)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, NoValue> {
        *self.names = fields;
        Err(NoValue)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::field_names;

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Two {
        first: u32,
        #[serde(rename = "second_key")]
        second: String,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Flattening {
        #[serde(flatten)]
        two: Two,
    }

    #[test]
    fn a_struct_gives_its_json_keys_and_a_map_none() {
        assert_eq!(field_names::<Two>(), ["first", "second_key"]);
        assert!(field_names::<Flattening>().is_empty());
        assert!(field_names::<u32>().is_empty());
    }
}
