//! [`Keyer`]: how a keyed layer finds the key a request is limited under. Any
//! `Fn(&R) -> Option<K>` closure is one; a keyer that reads a key by name (the middleware's
//! `by_key("ip")`) says which, so whoever supplies the named keys can refuse, when it is built,
//! a layer that reads a name it never supplies.

/// Derives a layer's key from a request. `None` means the layer does not apply to the request.
///
/// Closures implement it:
///
/// ```
/// use limiter_stack::{Keyer, Layer};
///
/// struct Request { customer: u64 }
///
/// let keyer = |r: &Request| Some(r.customer);
/// assert_eq!(keyer.key(&Request { customer: 7 }), Some(7));
/// assert_eq!(Keyer::<Request, u64>::key_name(&keyer), None);
/// let _layer: Layer<Request, u64> = Layer::keyed("per-customer", keyer);
/// ```
pub trait Keyer<R, K>: Send + Sync {
    /// The key `request` is limited under, or `None` to skip the layer for it.
    fn key(&self, request: &R) -> Option<K>;

    /// The name of the request key this keyer reads, when it reads one by name; `None` (the
    /// default, and what closures answer) when it derives the key some other way. Keyers that
    /// answer the same name are taken to derive the same key from every request: a stack keeps
    /// layers keyed by them in one entry (see [`Layer::same_key`](crate::Layer::same_key)).
    fn key_name(&self) -> Option<&'static str> {
        None
    }
}

impl<R, K, F> Keyer<R, K> for F
where
    F: Fn(&R) -> Option<K> + Send + Sync,
{
    #[inline]
    fn key(&self, request: &R) -> Option<K> {
        self(request)
    }
}
