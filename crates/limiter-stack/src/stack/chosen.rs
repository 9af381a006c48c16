//! The fixed-plan path's plan functions: a stack of at most four layers, some of whose plans are
//! chosen per call by a plan function, takes the fixed-plan path (`fixed_plans.rs`) through arms
//! of its own, so the usual stack's arms stay as they were (sharing them cost the usual stacks
//! 2–8% more instructions a call, callgrind). Such a layer's words are read under
//! its sequence lock, so they and their plan are of one commit; an entry in another plan than
//! the call's goes to the general path, which changes it; a commit checks the plan under its
//! lock with the words.

use std::hash::Hash;

use limiter_core::Clock;

use super::Stack;
use crate::cells::{Cells, MAX_LIMITS_PER_LAYER};
use crate::decision::Answer;
use crate::error::CallError;
use crate::layer::Layer;

/// The layers among `layers` whose plan function chooses a plan per call, a bit each by
/// position (the first eight: the fixed-plan path takes four).
pub(super) fn chosen_plans<R, K>(layers: &[Layer<R, K>]) -> u8 {
    layers
        .iter()
        .take(8)
        .enumerate()
        .filter(|(_, layer)| layer.choose.is_some())
        .fold(0, |mask, (slot, _)| mask | 1 << slot)
}

/// Which arm of [`Stack::decide_chosen`] a stack of `layers` layers (one to four) takes: its
/// depth less one, plus 4 unless every plan has one limit (`lean`), plus 8 on several keys.
pub(super) fn chosen_arm(layers: usize, lean: bool, several_keys: bool) -> u8 {
    let depth = u8::try_from(layers.clamp(1, 4) - 1).unwrap_or(3);
    depth + if lean { 0 } else { 4 } + if several_keys { 8 } else { 0 }
}

/// `plans` where a layer's plan function chooses (`CHOSEN`), else no array at all: the plans
/// are then all the first, and the commit never reads them.
#[inline(always)]
pub(super) fn chosen_only<const N: usize, const CHOSEN: bool>(plans: &[usize; N]) -> &[usize; N] {
    if CHOSEN { plans } else { &[0; N] }
}

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Decides a call of a fixed-plan stack with a layer whose plan function chooses per call,
    /// into `out` (new); on the general path, from the start, when the fixed-plan path cannot
    /// finish it. Out of line, with arms of its own, so the usual stack's arms stay as they
    /// were.
    #[inline(never)]
    pub(super) fn decide_chosen(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<(), CallError> {
        const MAX: usize = MAX_LIMITS_PER_LAYER;
        let done = match self.chosen_arm {
            0 => self.one_key_path::<1, 1, true>(request, cost, now, out)?,
            1 => self.one_key_path::<2, 1, true>(request, cost, now, out)?,
            2 => self.one_key_path::<3, 1, true>(request, cost, now, out)?,
            3 => self.one_key_path::<4, 1, true>(request, cost, now, out)?,
            4 => self.one_key_path::<1, MAX, true>(request, cost, now, out)?,
            5 => self.one_key_path::<2, MAX, true>(request, cost, now, out)?,
            6 => self.one_key_path::<3, MAX, true>(request, cost, now, out)?,
            7 => self.one_key_path::<4, MAX, true>(request, cost, now, out)?,
            // Several keys: at least two layers.
            9 => self.fixed_path_on_keys::<2, 1, true>(request, cost, now, out)?,
            10 => self.fixed_path_on_keys::<3, 1, true>(request, cost, now, out)?,
            11 => self.fixed_path_on_keys::<4, 1, true>(request, cost, now, out)?,
            13 => self.fixed_path_on_keys::<2, MAX, true>(request, cost, now, out)?,
            14 => self.fixed_path_on_keys::<3, MAX, true>(request, cost, now, out)?,
            15 => self.fixed_path_on_keys::<4, MAX, true>(request, cost, now, out)?,
            _ => false,
        };
        if done {
            return Ok(());
        }
        self.decide_from_scratch(request, cost, now, false, out)
    }

    /// The plan layer `slot`'s plan function chooses for `request`, with the layer's words
    /// read into `seen` under the sequence lock (so they and their plan are of one commit);
    /// `None` for the general path: the entry's words are in another plan (the general path
    /// changes it), or the layer holds no such plan (the general path refuses it, naming it).
    #[inline(always)]
    pub(super) fn read_chosen<const W: usize>(
        &self,
        slot: usize,
        cell: &Cells,
        request: &R,
        seen: &mut [u64; W],
    ) -> Option<usize> {
        let plan = self.layers[slot].plan_for(request).ok()?;
        let (held, words) = cell.read_words::<W>();
        *seen = words;
        (held == plan).then_some(plan)
    }

    /// Whether layer `slot`'s plan function chooses its plan per call (so an entry's plan can
    /// change: read under the sequence lock, checked under the commit's lock).
    #[inline(always)]
    pub(super) fn plan_changes(&self, slot: usize) -> bool {
        self.chosen_plans & (1 << slot) != 0
    }
}
