//! [`AdHocShapes`]: the ad-hoc shapes an engine has seen (a `limit` per `duration_ms` counted
//! by an algorithm) and where each is decided, found by a request without writing a cache line
//! another core's requests write: the map read by the calling thread's shard
//! ([`shards`](crate::shards)). One `RwLock` around one map had every ad-hoc request on every
//! core write its lock word, and clone the stack's `Arc`s besides.
//!
//! An add takes one lock, checks the map it guards (the whole truth, what a reload carries
//! over), and replaces every shard's copy with the map and the new shape before it lets go: a
//! request that misses in its shard's copy looks there before it adds, so a shape is never
//! added twice.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::{AdHocHome, AdHocStack, FastHash, PolicyStack, Shape};
use crate::shards::PerThread;

/// Every shape's stack and plan: what a request finds, by its thread's shard.
type Shapes = HashMap<Shape, AdHocStack, FastHash>;

/// The ad-hoc shapes seen, and where each is decided.
#[derive(Debug)]
pub(super) struct AdHocShapes {
    /// Every shape, under the lock an add takes.
    all: Mutex<Shapes>,
    /// The same, as requests read it: replaced whole at each add.
    seen: PerThread<Shapes>,
}

/// A shape's stack (borrowed where it is the engine's in-process home, which every shape is a
/// plan of: no reference count bumped) and its plan in it.
pub(super) type Found<'a> = (Cow<'a, PolicyStack>, usize);

impl AdHocShapes {
    /// `shapes` (a reload's carried shapes; empty for a new engine).
    pub(super) fn new(shapes: Shapes) -> Self {
        Self {
            seen: PerThread::new(shapes.clone()),
            all: Mutex::new(shapes),
        }
    }

    /// Every shape seen (what a reload on the same store carries over).
    pub(super) fn all(&self) -> Shapes {
        self.all
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `shape`'s stack and plan, by the calling thread's shard; `None` if it was not added.
    #[inline]
    pub(super) fn find<'a>(&self, shape: &Shape, home: Option<&'a AdHocHome>) -> Option<Found<'a>> {
        self.seen
            .read()
            .get(shape)
            .map(|found| located(found, home))
    }

    /// `shape`'s stack and plan, added by `add` (which makes them, or refuses) if it was not
    /// added yet. Adds are one at a time; every shard reads the shape before this returns.
    pub(super) fn find_or_add<'a, E>(
        &self,
        shape: Shape,
        home: Option<&'a AdHocHome>,
        add: impl FnOnce(usize) -> Result<AdHocStack, E>,
    ) -> Result<Found<'a>, E> {
        let mut all = self.all.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = all.get(&shape) {
            return Ok(located(found, home));
        }
        let added = add(all.len())?;
        let found = located(&added, home);
        all.insert(shape, added);
        self.seen.replace(all.clone());
        Ok(found)
    }
}

/// `found` as a request takes it: the home's stack borrowed in process, a Redis shape's own
/// stack cloned (its round trip dwarfs the reference counts).
fn located<'a>((stack, plan): &AdHocStack, home: Option<&'a AdHocHome>) -> Found<'a> {
    match home {
        Some(home) => (Cow::Borrowed(home.stack()), *plan),
        None => (Cow::Owned(stack.clone()), *plan),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::engine::tests::engine;
    use crate::engine::{Item, Target, decided_at_once};
    use crate::shards::SHARDS;
    use limiter_stack::Kind;

    /// A take on the ad-hoc shape `limit` a minute, for an identifier of that shape's own (a
    /// key's entry in the home stack follows the plan of its last call).
    fn ad_hoc(limit: u64) -> Item {
        Item {
            target: Target::AdHoc {
                kind: Kind::TokenBucket,
                limit,
                duration_ms: 60_000,
                namespace: "n".into(),
            },
            identifier: format!("u{limit}").into(),
            cost: 1,
            shadow: false,
            charge: crate::engine::Charge::Take,
        }
    }

    /// Threads on every shard, adding the same shapes at once, each find one plan per shape
    /// (the one home stack's, never a second plan for a shape), and share its counts.
    #[test]
    fn a_shape_added_from_every_shard_at_once_is_one_plan() {
        let (engine, _clock) = engine(
            "[policies.api]\nlimits = [{ algorithm = \"token_bucket\", count = 1, period = \"1s\" }]\n",
        );
        let engine = Arc::new(engine);
        let start = Arc::new(std::sync::Barrier::new(2 * SHARDS));
        let threads: Vec<_> = (0..2 * SHARDS)
            .map(|_| {
                let engine = Arc::clone(&engine);
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    start.wait();
                    (1..=8)
                        .map(|limit| {
                            let answered =
                                decided_at_once(engine.decide_one(&ad_hoc(limit * 100), None));
                            answered.expect("decided").0.decision.is_allowed()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for thread in threads {
            assert!(thread.join().expect("no panic").iter().all(|a| *a));
        }
        assert_eq!(engine.ad_hoc.all().len(), 8, "one entry per shape");
        // Each shape added once: the home stack's plans, given out in turn, have no gap a
        // shape's second plan (added and then dropped from the map) would leave.
        let mut plans: Vec<usize> = engine.ad_hoc.all().values().map(|(_, p)| *p).collect();
        plans.sort_unstable();
        assert_eq!(
            plans.last().map(|last| last - plans[0]),
            Some(7),
            "{plans:?}"
        );
        // Every thread's call counted on its shape's one plan: 2 * SHARDS taken of 100.
        let answered = decided_at_once(engine.decide_one(&ad_hoc(100), None));
        let remaining = answered.expect("decided").0.decision.remaining();
        assert_eq!(remaining, 100 - 2 * SHARDS as u64 - 1);
    }
}
