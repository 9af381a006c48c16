//! A [`RedisStack`]'s layers and builder: names checked, limits checked for Redis, and where
//! its keys are placed (by the stack, by each layer's key, or by a request field).

use core::fmt;
use std::sync::Arc;

use limiter_core::Limit;
use limiter_stack::{LayerParts, MAX_LAYERS, MAX_LIMITS_PER_LAYER};

use super::*;
use crate::backend::RedisBackend;
use crate::error::BuildError;
use crate::spec::RedisLimit;

/// One layer of a [`RedisStack`]: the same [`Layer`](limiter_stack::Layer) an in-process
/// [`Stack`](limiter_stack::Stack) is built from, keyed by strings: keyed (per user, IP, API
/// key) or global, with up to [`MAX_LIMITS_PER_LAYER`] limits decided together, or plans
/// chosen per request. One definition builds in process, on Redis, or leased:
///
/// ```no_run
/// use limiter_core::Limit;
/// use limiter_redis::{RedisBackend, RedisStack};
/// use limiter_stack::{Kind, Layer, Stack};
///
/// struct Request { user: String }
/// fn checkout() -> Vec<Layer<Request, String>> {
///     vec![
///         Layer::keyed("user", |r: &Request| Some(r.user.clone()))
///             .limit(Kind::TokenBucket, Limit::per_second(5)),
///         Layer::global("all").limit(Kind::FixedWindow, Limit::per_second(1_000)),
///     ]
/// }
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let in_process = Stack::builder().layers(checkout()).build()?;
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
/// let on_redis = RedisStack::builder(&backend, "checkout").layers(checkout()).build()?;
/// # let _ = (in_process, on_redis);
/// # Ok(()) }
/// ```
///
/// On Redis every limit must be named by [`Kind`](crate::Kind) (an algorithm named by type runs in
/// process only), and a layer's plans are given when it is built (not `open_plans`); a
/// key keeps its consumption when its plan changes, as in process. [`build`](RedisStackBuilder::build)
/// refuses anything else, naming the layer.
pub type RedisLayer<R> = limiter_stack::Layer<R, String>;

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
            prefix: super::DEFAULT_PREFIX.to_owned(),
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
    layers: Vec<LayerParts<R, String>>,
    /// `None`: by each layer's key on a cluster, by the stack on one server.
    tag: Option<Tag<R>>,
    on_failure: OnFailure,
    fleet: u64,
}

impl<R: 'static> RedisStackBuilder<R> {
    /// Adds a layer; a call is admitted only if every layer admits it.
    pub fn layer(mut self, layer: RedisLayer<R>) -> Self {
        self.layers.push(layer.into_parts());
        self
    }

    /// Adds `layers` in order: the same definition an in-process
    /// [`StackBuilder::layers`](limiter_stack::StackBuilder::layers) takes.
    pub fn layers(self, layers: impl IntoIterator<Item = RedisLayer<R>>) -> Self {
        layers.into_iter().fold(self, Self::layer)
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
            return Err(BuildError::NoLayers);
        }
        if self.layers.len() > MAX_LAYERS {
            return Err(BuildError::TooManyLayers {
                layers: self.layers.len(),
                max: MAX_LAYERS,
            });
        }
        let mut seen = std::collections::HashSet::new();
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in self.layers {
            check_name("layer", &layer.name, false)?;
            if !seen.insert(layer.name.clone()) {
                return Err(BuildError::DuplicateLayer { layer: layer.name });
            }
            layers.push(layer_spec(layer)?);
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
            OnFailure::Fallback => {
                Some(local_stack(&self.name, &layers, &self.backend, self.fleet)?)
            }
            OnFailure::Open | OnFailure::Closed => None,
        };
        Ok(RedisStack {
            backend: self.backend,
            name: self.name,
            prefix: self.prefix,
            layers,
            tag,
            on_failure: self.on_failure,
            fallback,
            token: Arc::new(()),
            refunds_failed: limiter_core::Paced::new(std::time::Duration::from_secs(10)),
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

/// A layer as Redis decides it: each plan's limits checked for Redis, every plan the same
/// size, the layer not open to plans added later.
fn layer_spec<R>(layer: LayerParts<R, String>) -> Result<LayerSpec<R>, BuildError> {
    let name = layer.name;
    if layer.open {
        return Err(BuildError::OpenPlans { layer: name });
    }
    let mut plans = Vec::with_capacity(layer.plans.len());
    for plan in &layer.plans {
        let mut limits = Vec::with_capacity(plan.limits.len());
        for &(kind, limit) in &plan.limits {
            let Some(kind) = kind else {
                return Err(BuildError::Limit {
                    owner: format!("layer `{name}`"),
                    source: limiter_core::LimitError::Unsupported {
                        algorithm: "an algorithm named by type",
                        reason: format!(
                            "{limit} is decided by an algorithm named by type (`limit_with`) or built by hand (`algorithm`), which runs in process only; on Redis name a built-in one with `limit(Kind::..., limit)`"
                        ),
                    },
                });
            };
            let limit = RedisLimit::new(kind, limit).map_err(|source| BuildError::Limit {
                owner: format!("layer `{name}`"),
                source,
            })?;
            limits.push(limit);
        }
        plans.push((plan.name.clone(), limits));
    }
    let Some((_, first)) = plans.first() else {
        return Err(BuildError::NoLimits { layer: name });
    };
    let expected = first.len();
    for (plan, limits) in &plans {
        if limits.is_empty() {
            return Err(BuildError::NoLimits { layer: name });
        }
        if limits.len() > MAX_LIMITS_PER_LAYER {
            return Err(BuildError::TooManyLimits {
                layer: name,
                limits: limits.len(),
                max: MAX_LIMITS_PER_LAYER,
            });
        }
        if limits.len() != expected {
            return Err(BuildError::PlanShape {
                layer: name,
                plan: plan.clone(),
                limits: limits.len(),
                expected,
            });
        }
    }
    Ok(LayerSpec {
        name,
        keyer: layer.keyer,
        plans: plans.into_iter().map(|(_, limits)| limits).collect(),
        choose: layer.choose,
    })
}

/// Whether `name` (a `what`: "stack", "prefix", "layer", "permits", "quota") can be part of a
/// Redis key as this crate lays keys out: not empty, no hash-tag braces, and (unless `colons`)
/// no `:`.
pub(crate) fn check_name(what: &'static str, name: &str, colons: bool) -> Result<(), BuildError> {
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
