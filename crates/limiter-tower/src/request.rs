//! [`HttpRequest`]: what a limiter under the middleware decides on, the request's head and the
//! keys the middleware took from it; [`by_key`] and [`by_key_string`] turn a named key into a
//! layer's keyer.

use http::request::Parts;
use http::{HeaderMap, Method, Uri};

use limiter_stack::Keyer;

use crate::key::Key;

/// A request as the limiter sees it: its head (method, URI, headers, extensions) and the keys
/// the middleware extracted, by name. A key that is optional and was missing is `None`, and a
/// layer keyed by it is skipped for this request.
#[derive(Debug)]
pub struct HttpRequest {
    pub(crate) parts: Parts,
    pub(crate) keys: KeyList,
}

/// How many keys a request carries without allocating.
const INLINE_KEYS: usize = 2;

/// The keys of one request, by name: the first [`INLINE_KEYS`] inline, any more on the heap
/// (a middleware rarely extracts more than two, so a request allocates nothing for them).
#[derive(Debug, Default)]
pub(crate) struct KeyList {
    inline: [Option<(&'static str, Option<Key>)>; INLINE_KEYS],
    more: Vec<(&'static str, Option<Key>)>,
}

impl KeyList {
    pub(crate) fn push(&mut self, name: &'static str, key: Option<Key>) {
        match self.inline.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some((name, key)),
            None => self.more.push((name, key)),
        }
    }

    /// The key pushed under `name` (`Some(None)`: pushed as missing). The inline slots are
    /// read by a plain loop (a keyer's lookup 72 → 51 instructions against the iterator chain
    /// it replaced, callgrind).
    #[inline]
    fn find(&self, name: &str) -> Option<&Option<Key>> {
        // A layer's `by_key` names the very string the middleware's `key` did: the same
        // pointer is the same name, with no bytes compared.
        let same = |n: &str| std::ptr::eq(n, name) || n == name;
        for slot in &self.inline {
            match slot {
                Some((n, key)) if same(n) => return Some(key),
                Some(_) => {}
                None => return None,
            }
        }
        self.more.iter().find(|(n, _)| same(n)).map(|(_, key)| key)
    }
}

impl HttpRequest {
    /// A request with `keys` already extracted; for deciding outside the middleware (tests,
    /// other transports).
    pub fn new(parts: Parts, keys: impl IntoIterator<Item = (&'static str, Option<Key>)>) -> Self {
        let mut list = KeyList::default();
        for (name, key) in keys {
            list.push(name, key);
        }
        Self { parts, keys: list }
    }

    /// The key extracted under `name`, if the request had one.
    #[inline]
    pub fn key(&self, name: &str) -> Option<&Key> {
        self.keys.find(name)?.as_ref()
    }

    /// The method: choose a plan by it to limit reads and writes differently.
    pub fn method(&self) -> &Method {
        &self.parts.method
    }

    /// The URI; [`path`](Self::path) for per-route plans.
    pub fn uri(&self) -> &Uri {
        &self.parts.uri
    }

    /// The path of the URI.
    pub fn path(&self) -> &str {
        self.parts.uri.path()
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.parts.headers
    }

    /// The whole head, extensions included (axum's `MatchedPath`, when the middleware is
    /// added with `route_layer`).
    pub fn parts(&self) -> &Parts {
        &self.parts
    }

    /// Takes the head back.
    pub fn into_parts(self) -> Parts {
        self.parts
    }
}

/// A keyer for an in-process stack layer: the key the middleware extracted as `name`
/// (`Layer::keyed("per-ip", by_key("ip"))`). The middleware refuses to build when no key is
/// registered under `name`, so a typo cannot switch a limit off.
pub fn by_key(name: &'static str) -> ByKey {
    ByKey { name }
}

/// A keyer for a Redis stack layer, whose keys are strings: the key extracted as `name`,
/// written out (`RedisLayer::keyed("per-ip", by_key_string("ip"))`). Checked at build like
/// [`by_key`].
pub fn by_key_string(name: &'static str) -> ByKeyString {
    ByKeyString { name }
}

/// The keyer [`by_key`] returns: reads the key extracted under its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByKey {
    name: &'static str,
}

impl Keyer<HttpRequest, Key> for ByKey {
    #[inline]
    fn key(&self, request: &HttpRequest) -> Option<Key> {
        request.key(self.name).cloned()
    }

    fn key_name(&self) -> Option<&'static str> {
        Some(self.name)
    }
}

/// The keyer [`by_key_string`] returns: the key extracted under its name, as a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByKeyString {
    name: &'static str,
}

impl Keyer<HttpRequest, String> for ByKeyString {
    fn key(&self, request: &HttpRequest) -> Option<String> {
        request.key(self.name).map(Key::to_string)
    }

    fn key_name(&self) -> Option<&'static str> {
        Some(self.name)
    }
}
