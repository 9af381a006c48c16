//! Groups: the keyed layers of a stack that share a key (one keyer, or keyers reading one
//! named key) keep their state in one table entry. The first of them leads the group: its
//! keyer derives the key, its place in the entry comes first, and its entry lock guards the
//! whole entry (see `crate::cells`).

use std::hash::Hash;

use limiter_core::Clock;

use super::Stack;
use crate::layer::Layer;

/// Where a layer's state lives in its group's entry: the group's lead (its first layer, whose
/// keyer derives the key and whose lock guards the entry) and its position there. A global
/// layer, and a keyed one sharing no keyer, leads a group of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) lead: usize,
    pub(crate) position: usize,
}

/// Each layer's group: a keyed layer joins the first earlier lead that shares its key
/// ([`Layer::shares_key_with`]); any other layer leads its own.
pub(super) fn group_members<R, K>(layers: &[Layer<R, K>]) -> Box<[Member]> {
    let mut members: Vec<Member> = Vec::with_capacity(layers.len());
    for (index, layer) in layers.iter().enumerate() {
        let lead = (0..index).find(|&j| members[j].lead == j && layer.shares_key_with(&layers[j]));
        members.push(match lead {
            Some(lead) => Member {
                lead,
                position: members.iter().filter(|m| m.lead == lead).count(),
            },
            None => Member {
                lead: index,
                position: 0,
            },
        });
    }
    members.into_boxed_slice()
}

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// The layers of the group `lead` leads, in position order.
    pub(super) fn group(&self, lead: usize) -> impl Iterator<Item = usize> + '_ {
        (lead..self.layers.len()).filter(move |&layer| self.members[layer].lead == lead)
    }

    /// Whether the layer in `slot` holds its own lock (it leads its group) rather than being
    /// held through its lead's.
    #[inline]
    pub(super) fn leads(&self, slot: usize) -> bool {
        self.members.get(slot).is_none_or(|m| m.lead == slot)
    }
}
