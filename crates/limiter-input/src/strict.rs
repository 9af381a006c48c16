//! [`Strict`]: a deserializer that reads a struct only from an object (a JSON object, a TOML
//! table). A struct's visitor is handed an array as an error (where serde's derived visitors
//! would read it by position), described by the format's word for an object; every value
//! inside (an element, a key, a field's value, an option's content) is read through [`Strict`]
//! again, so the rule holds at every depth. A struct whose name starts with `$` is a format's
//! own device (toml's `Spanned`, serde_json's `RawValue`) and is read as the format reads it.
//! An enum's content is read as serde reads it (the inputs read here hold no enums with
//! fields).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// A deserializer that reads structs from objects only (see the module docs): `object` is the
/// format's word for one ("a JSON object", "a table").
pub(crate) struct Strict<D> {
    pub(crate) inner: D,
    pub(crate) object: &'static str,
}

/// A visitor whose nested values are read through [`Strict`]; `object_only` where it reads a
/// struct, and an array is refused.
struct Strictly<V> {
    visitor: V,
    object: &'static str,
    object_only: bool,
}

/// A seed that reads its value through [`Strict`].
struct StrictSeed<S> {
    seed: S,
    object: &'static str,
}

/// An array's elements, each read through [`Strict`].
struct StrictSeq<A> {
    seq: A,
    object: &'static str,
}

/// An object's keys and values, each read through [`Strict`].
struct StrictMap<A> {
    map: A,
    object: &'static str,
}

impl<D> Strict<D> {
    /// `visitor` for a value that is not a struct.
    fn any<V>(&self, visitor: V) -> Strictly<V> {
        Strictly {
            visitor,
            object: self.object,
            object_only: false,
        }
    }
}

/// Forwards `deserialize_*` methods that take only a visitor.
macro_rules! forward_visitor {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            let visitor = self.any(visitor);
            self.inner.$method(visitor)
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<D> {
    type Error = D::Error;

    forward_visitor! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
        deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
        deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
        deserialize_option deserialize_unit deserialize_seq deserialize_map
        deserialize_identifier deserialize_ignored_any
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visitor = self.any(visitor);
        self.inner.deserialize_unit_struct(name, visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visitor = self.any(visitor);
        self.inner.deserialize_newtype_struct(name, visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visitor = self.any(visitor);
        self.inner.deserialize_tuple(len, visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visitor = self.any(visitor);
        self.inner.deserialize_tuple_struct(name, len, visitor)
    }

    /// A struct is read from an object only (a format's own device, named `$...`, as the
    /// format reads it).
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visitor = Strictly {
            visitor,
            object: self.object,
            object_only: !name.starts_with('$'),
        };
        self.inner.deserialize_struct(name, fields, visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visitor = self.any(visitor);
        self.inner.deserialize_enum(name, variants, visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// Forwards `visit_*` methods that take one value.
macro_rules! forward_value {
    ($($method:ident($ty:ty))*) => {$(
        fn $method<E: de::Error>(self, value: $ty) -> Result<V::Value, E> {
            self.visitor.$method(value)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Strictly<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.object_only {
            f.write_str(self.object)
        } else {
            self.visitor.expecting(f)
        }
    }

    forward_value! {
        visit_bool(bool) visit_i8(i8) visit_i16(i16) visit_i32(i32) visit_i64(i64)
        visit_i128(i128) visit_u8(u8) visit_u16(u16) visit_u32(u32) visit_u64(u64)
        visit_u128(u128) visit_f32(f32) visit_f64(f64) visit_char(char) visit_str(&str)
        visit_borrowed_str(&'de str) visit_string(String) visit_bytes(&[u8])
        visit_borrowed_bytes(&'de [u8]) visit_byte_buf(Vec<u8>)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(Strict {
            inner: deserializer,
            object: self.object,
        })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<V::Value, D::Error> {
        self.visitor.visit_newtype_struct(Strict {
            inner: deserializer,
            object: self.object,
        })
    }

    /// An array: refused where a struct is read (serde's derived visitors read it by position).
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        if self.object_only {
            return Err(de::Error::invalid_type(de::Unexpected::Seq, &self));
        }
        let object = self.object;
        self.visitor.visit_seq(StrictSeq { seq, object })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let object = self.object;
        self.visitor.visit_map(StrictMap { map, object })
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_enum(data)
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for StrictSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Strict {
            inner: deserializer,
            object: self.object,
        })
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for StrictSeq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        let object = self.object;
        self.seq.next_element_seed(StrictSeed { seed, object })
    }

    fn size_hint(&self) -> Option<usize> {
        self.seq.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for StrictMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let object = self.object;
        self.map.next_key_seed(StrictSeed { seed, object })
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        let object = self.object;
        self.map.next_value_seed(StrictSeed { seed, object })
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}
