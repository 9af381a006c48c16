//! A [`RedisStack`]'s layers and builder: names checked, limits checked for Redis, and where
//! its keys are placed (by the stack, by each layer's key, or by a request field).

use core::fmt;
use std::sync::Arc;

use limiter_core::Limit;
use limiter_stack::{MAX_LAYERS, MAX_LIMITS_PER_LAYER};

use super::*;
use crate::backend::RedisBackend;
use crate::error::BuildError;
use crate::spec::{Kind, RedisLimit};

/// One layer of a [`RedisStack`]: keyed (per user, IP, API key) or global, with up to
/// [`MAX_LIMITS_PER_LAYER`] limits decided together.
pub struct RedisLayer<R> {
    pub(super) name: String,
    pub(super) keyer: Option<Keyer<R>>,
    pub(super) limits: Vec<RedisLimit>,
    /// The first limit refused, reported by the stack's `build()`.
    refused: Option<BuildError>,
}

impl<R> RedisLayer<R> {
    /// A layer with one state per key; a request for which `keyer` returns `None` skips it.
    /// `keyer` is a closure `|r: &Request| Some(r.user.to_string())` or a
    /// [`Keyer`](limiter_stack::Keyer) that reads a named key (the middleware's
    /// `by_key_string("ip")`).
    pub fn keyed(
        name: impl Into<String>,
        keyer: impl limiter_stack::Keyer<R, String> + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            keyer: Some(Arc::new(keyer)),
            limits: Vec::new(),
            refused: None,
        }
    }

    /// A layer with one state shared by every request.
    pub fn global(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            keyer: None,
            limits: Vec::new(),
            refused: None,
        }
    }

    /// Adds `limit`, decided by `kind`. A limit that cannot be counted is reported once, by
    /// the stack's [`build`](RedisStackBuilder::build), naming the layer.
    pub fn limit(mut self, kind: Kind, limit: Limit) -> Self {
        match RedisLimit::new(kind, limit) {
            Ok(limit) => self.limits.push(limit),
            Err(source) => {
                self.refused.get_or_insert(BuildError::Limit {
                    layer: self.name.clone(),
                    source,
                });
            }
        }
        self
    }
}

impl<R> fmt::Debug for RedisLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLayer")
            .field("name", &self.name)
            .field("global", &self.keyer.is_none())
            .field("limits", &self.limits)
            .finish()
    }
}

pub(super) enum Tag<R> {
    /// The stack's name: every key in one slot.
    Stack,
    /// A string from the request.
    Request(Tagger<R>),
    /// Each keyed layer's own key (a global layer's keys: the stack's name), so a stack's
    /// per-identifier traffic spreads over a cluster; a call whose layers land in different
    /// slots is decided slot by slot (`slots.rs`).
    Key,
}

impl<R: 'static> RedisStack<R> {
    /// A stack named `name` on `backend`; the name is part of every key.
    pub fn builder(backend: &RedisBackend, name: impl Into<String>) -> RedisStackBuilder<R> {
        RedisStackBuilder {
            backend: backend.clone(),
            name: name.into(),
            prefix: "limiter".to_owned(),
            layers: Vec::new(),
            tag: None,
            on_failure: OnFailure::default(),
            fleet: 1,
        }
    }
}

/// Builds a [`RedisStack`]; see [`RedisStack::builder`].
pub struct RedisStackBuilder<R> {
    backend: RedisBackend,
    name: String,
    prefix: String,
    layers: Vec<RedisLayer<R>>,
    /// `None`: by each layer's key on a cluster, by the stack on one server.
    tag: Option<Tag<R>>,
    on_failure: OnFailure,
    fleet: u64,
}

impl<R: 'static> RedisStackBuilder<R> {
    /// Adds a layer; a call is admitted only if every layer admits it.
    pub fn layer(mut self, layer: RedisLayer<R>) -> Self {
        self.layers.push(layer);
        self
    }

    /// The first part of every key (default `limiter`), to share one Redis between services.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// What a call does when Redis fails (default [`OnFailure::Fallback`]).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// How many nodes share this stack's limits (default 1). While Redis is out, the local
    /// fallback ([`OnFailure::Fallback`]) of each node enforces `1/fleet` of every limit (count
    /// and burst, rounded down), so the fleet's nodes together admit at most the limit. A fleet
    /// that would leave a node no unit of some limit is refused by [`build`](Self::build).
    pub fn fleet_size(mut self, fleet: u64) -> Self {
        self.fleet = fleet;
        self
    }

    /// Tags each call's keys with `tag(request)` (a tenant, say), spreading a stack's keys over
    /// a Redis Cluster while each call's keys share a slot: one script decides it.
    pub fn hash_tag_from(mut self, tag: impl Fn(&R) -> String + Send + Sync + 'static) -> Self {
        self.tag = Some(Tag::Request(Arc::new(tag)));
        self
    }

    /// Tags each keyed layer's keys with that layer's key for the call, and a global layer's
    /// with the stack's name: a stack's per-identifier traffic spreads over every master of a
    /// Redis Cluster. The default on a cluster backend. A call whose layers land in different
    /// slots (a user layer and a global one, say) is decided slot by slot, all or nothing:
    /// see [`RedisStack`]'s "Across slots".
    pub fn tag_by_key(mut self) -> Self {
        self.tag = Some(Tag::Key);
        self
    }

    /// Tags every key with the stack's name: all of the stack's keys in one slot, so every
    /// call is one script (the default on one server, where slots do not matter). On a
    /// cluster, the stack then lives on one master.
    pub fn tag_by_stack(mut self) -> Self {
        self.tag = Some(Tag::Stack);
        self
    }

    /// Checks the stack and builds it, with its local fallback when the policy needs one.
    pub fn build(self) -> Result<RedisStack<R>, BuildError> {
        check_name("stack", &self.name, false)?;
        check_name("prefix", &self.prefix, true)?;
        if self.layers.is_empty() {
            return Err(BuildError::NoLayers { stack: self.name });
        }
        if self.layers.len() > MAX_LAYERS {
            return Err(BuildError::TooManyLayers {
                stack: self.name,
                count: self.layers.len(),
                max: MAX_LAYERS,
            });
        }
        let mut seen = std::collections::HashSet::new();
        for layer in &self.layers {
            check_name("layer", &layer.name, false)?;
            if !seen.insert(layer.name.as_str()) {
                return Err(BuildError::DuplicateLayer {
                    layer: layer.name.clone(),
                });
            }
            if let Some(refused) = &layer.refused {
                return Err(refused.clone());
            }
            if layer.limits.is_empty() {
                return Err(BuildError::NoLimits {
                    layer: layer.name.clone(),
                });
            }
            if layer.limits.len() > MAX_LIMITS_PER_LAYER {
                return Err(BuildError::TooManyLimits {
                    layer: layer.name.clone(),
                    count: layer.limits.len(),
                    max: MAX_LIMITS_PER_LAYER,
                });
            }
        }
        let tag = self.tag.unwrap_or(if self.backend.is_cluster() {
            Tag::Key
        } else {
            Tag::Stack
        });
        if self.fleet == 0 {
            share(&self.name, Limit::per_second(1), 0)?;
        }
        let fallback = match self.on_failure {
            OnFailure::Fallback => Some(local_stack(
                &self.name,
                &self.layers,
                &self.backend,
                self.fleet,
            )?),
            OnFailure::Open | OnFailure::Closed => None,
        };
        let layers = self
            .layers
            .into_iter()
            .map(|layer| LayerSpec {
                name: layer.name,
                keyer: layer.keyer,
                limits: layer.limits,
            })
            .collect();
        Ok(RedisStack {
            backend: self.backend,
            name: self.name,
            prefix: self.prefix,
            layers,
            tag,
            on_failure: self.on_failure,
            fallback,
            token: Arc::new(()),
        })
    }
}

impl<R> fmt::Debug for RedisStackBuilder<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStackBuilder")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field("layers", &self.layers)
            .field("on_failure", &self.on_failure)
            .field("fleet", &self.fleet)
            .finish_non_exhaustive()
    }
}

fn check_name(what: &'static str, name: &str, colons: bool) -> Result<(), BuildError> {
    let reason = if name.is_empty() {
        Some("is empty; give it a name")
    } else if name.contains(['{', '}']) {
        Some("contains `{` or `}`, which would change the Redis Cluster hash tag; remove them")
    } else if !colons && name.contains(':') {
        Some("contains `:`, which separates the parts of a Redis key; use another character")
    } else {
        None
    };
    reason.map_or(Ok(()), |reason| {
        Err(BuildError::BadName {
            what,
            name: name.to_owned(),
            reason,
        })
    })
}
