//! The seam's wider calls: what one request asks of a backend ([`Ask`]: take, record, give
//! back, at a reading), a take that can be undone ([`Taken`]), and batches decided all or
//! nothing ([`decide_all`]).
//!
//! # The all-or-nothing protocol ([`decide_all`])
//!
//! Items are asked in order, each enforced take keeping its [`Undo`] (the limiter's own
//! grant, refunded by its own code: nothing is read back by type); records and unit refunds are
//! applied as they come and never deny. If any enforced item is denied (a shadow item never
//! denies), or its store fails closed, every take is undone and each refunded item
//! reports what it holds after the refund, so a denied batch leaves what it took behind. A call
//! that can never be decided ([`CallError`]) refunds the same way and ends the batch with that
//! error. Between a take and its refund the units are held, so a racing call may be denied a
//! moment early; none is ever admitted past a limit. A store that can decide a batch in one
//! atomic step offers it where its limiters are known by type (limiter-redis's
//! `decide_batch`, which limiterd calls when every item's policy is on Redis): the seam never
//! looks behind a limiter to find its store.

use std::fmt;

use super::{Charges, Outcome, Pending};
use crate::CallError;

/// What a request does to its limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Charge {
    /// Takes `cost` units: admitted, or denied with nothing taken. Cost 0 only reports. (A
    /// take whose units may be given back with a grant is a [`Refunds`](super::Refunds)
    /// backend's `take_with_grant`.)
    #[default]
    Take,
    /// Records `cost` units of usage that already happened: counted whatever the limits hold
    /// (a limit may be left in debt), never refused.
    Record,
    /// Gives `cost` units back without a grant (a caller's own account of units it did not
    /// use): no limit goes above full; the answer is what the request holds after it.
    Refund,
}

/// One request's ask of a limiter ([`Charges::ask`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// Units.
    pub cost: u64,
    /// What the units do.
    pub charge: Charge,
    /// A reading of the limiter's clock to decide at; `None`: now. A remote store decides by
    /// its own clock and ignores it.
    pub at: Option<u64>,
}

impl Ask {
    /// Takes `cost` units now.
    pub const fn take(cost: u64) -> Self {
        Self {
            cost,
            charge: Charge::Take,
            at: None,
        }
    }

    /// `cost` units charged as `charge`, now.
    pub const fn new(cost: u64, charge: Charge) -> Self {
        Self {
            cost,
            charge,
            at: None,
        }
    }

    /// The same ask, decided at the clock's reading `at`.
    pub const fn at(self, at: Option<u64>) -> Self {
        Self { at, ..self }
    }
}

/// Gives back what a take took and answers what the request holds after it: the limiter's
/// own grant, kept inside by the limiter's own code (the seam never reads it back by type).
pub type Undo<'a> = Box<dyn FnOnce() -> Pending<'a, Result<Outcome, CallError>> + Send + 'a>;

/// A take that can be undone ([`Charges::take_undoable`]): what was decided and, for an
/// admitted take that took units, how to give them back.
pub struct Taken<'a> {
    /// What was decided.
    pub outcome: Outcome,
    /// Gives the units back (never more than was taken, never above full); `None` when
    /// nothing was taken.
    pub undo: Option<Undo<'a>>,
}

impl fmt::Debug for Taken<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Taken")
            .field("outcome", &self.outcome)
            .field("undo", &self.undo.is_some())
            .finish()
    }
}

/// One item of a batch: a limiter, the request it decides, and what the request asks.
pub struct BatchItem<'a, R: ?Sized> {
    /// The limiter (any backend; a batch's items may use different limiters of one store).
    pub limiter: &'a dyn Charges<R>,
    /// Whose state.
    pub request: &'a R,
    /// Units.
    pub cost: u64,
    /// What the units do.
    pub charge: Charge,
    /// Decided and reported, but a denial does not deny the batch.
    pub shadow: bool,
}

impl<R: ?Sized> BatchItem<'_, R> {
    /// Whether the item can deny its batch: an enforced take.
    pub fn enforced(&self) -> bool {
        !self.shadow && self.charge == Charge::Take
    }
}

impl<R: ?Sized> fmt::Debug for BatchItem<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchItem")
            .field("cost", &self.cost)
            .field("charge", &self.charge)
            .field("shadow", &self.shadow)
            .finish_non_exhaustive()
    }
}

/// A batch's answer: whether every enforced item was admitted (and so took its units), and
/// each item's outcome in order. When refused, nothing was taken: admitted items report what
/// they hold after the batch.
#[derive(Debug)]
pub struct BatchAnswer {
    /// Every enforced item admitted.
    pub admitted: bool,
    /// Each item's outcome, in order.
    pub outcomes: Vec<Outcome>,
}

/// Decides `items` all or nothing, at the clock reading `at` (`None`: now), by takes and
/// refunds through each item's limiter (see the module docs): one item is one
/// [`ask`](Charges::ask).
///
/// ```
/// use limiter_core::{Limit, ManualClock};
/// use limiter_stack::{BatchItem, Charge, Kind, Layer, Stack, decide_all};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let stack: Stack<&str, String, ManualClock> = Stack::builder()
///     .layer(Layer::keyed("user", |u: &&str| Some(u.to_string())).limit(Kind::TokenBucket, Limit::per_minute(3)))
///     .clock(ManualClock::new())
///     .build()?;
/// let (ann, bob) = ("ann", "bob");
/// let item = |request, cost| BatchItem { limiter: &stack, request, cost, charge: Charge::Take, shadow: false };
/// assert!(poll(decide_all(&[item(&bob, 2)], None))?.admitted);
/// // Ann's 2 and Bob's 2 more: Bob's is denied, so the batch takes nothing from Ann either.
/// let answer = poll(decide_all(&[item(&ann, 2), item(&bob, 2)], None))?;
/// assert!(!answer.admitted);
/// assert!(poll(decide_all(&[item(&ann, 3)], None))?.admitted);
/// # Ok(()) }
/// # fn poll<T>(f: impl std::future::Future<Output = T>) -> T {
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     match std::pin::pin!(f).poll(&mut cx) { std::task::Poll::Ready(v) => v, _ => unreachable!() }
/// # }
/// ```
pub async fn decide_all<'a, R: ?Sized + Sync>(
    items: &[BatchItem<'a, R>],
    at: Option<u64>,
) -> Result<BatchAnswer, CallError> {
    let mut outcomes = Vec::with_capacity(items.len());
    let mut undos: Vec<(usize, Undo<'a>)> = Vec::new();
    let mut admitted = true;
    for (i, item) in items.iter().enumerate() {
        let taken = if item.charge == Charge::Take && items.len() > 1 {
            item.limiter
                .take_undoable(item.request, item.cost, at)
                .await
        } else {
            let ask = Ask {
                cost: item.cost,
                charge: item.charge,
                at,
            };
            let asked = item.limiter.ask(item.request, ask).await;
            asked.map(|outcome| Taken {
                outcome,
                undo: None,
            })
        };
        let taken = match taken {
            Ok(taken) => taken,
            Err(e) => {
                undo_all(undos, &mut outcomes).await;
                return Err(e);
            }
        };
        if let Some(undo) = taken.undo {
            undos.push((i, undo));
        }
        let denied = match &taken.outcome {
            Outcome::Decided { decision, .. } => !decision.is_allowed(),
            Outcome::FailedOpen(_) => false,
            Outcome::FailedClosed(_) => true,
        };
        let closed = matches!(taken.outcome, Outcome::FailedClosed(_));
        admitted &= !(denied && (item.enforced() || closed));
        outcomes.push(taken.outcome);
        if closed {
            // The store cannot decide: the rest are answered with its failure, unasked.
            let failed = outcomes[i].clone();
            outcomes.resize(items.len(), failed);
            break;
        }
    }
    if !admitted {
        undo_all(undos, &mut outcomes).await;
    }
    Ok(BatchAnswer { admitted, outcomes })
}

/// Undoes every take; an undone item reports what it holds after it (a refund its store did
/// not take keeps the item's first answer, its units counted: never admitted twice).
async fn undo_all(undos: Vec<(usize, Undo<'_>)>, outcomes: &mut [Outcome]) {
    for (i, undo) in undos {
        if let Ok(after @ Outcome::Decided { .. }) = undo().await
            && let Some(slot) = outcomes.get_mut(i)
        {
            *slot = after;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use limiter_core::{Limit, ManualClock};

    use super::*;
    use crate::{AsyncLimiter, Decide, Kind, Layer, LayerInfo, Stack};

    type Users = Stack<&'static str, &'static str, ManualClock>;

    fn users(per_minute: u64) -> Users {
        Stack::builder()
            .layer(
                Layer::keyed("user", |u: &&'static str| Some(*u))
                    .limit(Kind::TokenBucket, Limit::per_minute(per_minute)),
            )
            .clock(ManualClock::new())
            .build()
            .expect("valid")
    }

    fn now<T>(f: impl std::future::Future<Output = T>) -> T {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::pin!(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("in process answers at once"),
        }
    }

    fn remaining(stack: &Users, user: &'static str) -> u64 {
        stack.peek(&user).expect("valid").decision().remaining()
    }

    fn item<'a>(
        limiter: &'a dyn Charges<&'static str>,
        request: &'a &'static str,
        cost: u64,
        charge: Charge,
    ) -> BatchItem<'a, &'static str> {
        BatchItem {
            limiter,
            request,
            cost,
            charge,
            shadow: false,
        }
    }

    /// A store that is down and whose policy refuses: every ask fails closed.
    struct Down;

    impl AsyncLimiter<&'static str> for Down {
        fn decide_request<'a>(&'a self, _: &'a &'static str, _: u64) -> Decide<'a> {
            Decide::Now(Ok(Outcome::FailedClosed(Arc::new(std::io::Error::other(
                "down",
            )))))
        }

        fn layers(&self) -> Vec<LayerInfo> {
            Vec::new()
        }
    }

    impl Charges<&'static str> for Down {
        fn ask<'a>(&'a self, r: &'a &'static str, ask: Ask) -> Decide<'a> {
            self.decide_request(r, ask.cost)
        }

        fn take_undoable<'a>(
            &'a self,
            r: &'a &'static str,
            cost: u64,
            _: Option<u64>,
        ) -> Decide<'a, Result<Taken<'a>, CallError>> {
            // Failed closed: nothing taken, nothing to undo.
            self.decide_request(r, cost).map(|answer| {
                answer.map(|outcome| Taken {
                    outcome,
                    undo: None,
                })
            })
        }
    }

    #[test]
    fn a_denied_batch_across_stacks_gives_every_take_back_and_reports_after_it() {
        let (per_user, per_team) = (users(5), users(3));
        let (ann, team) = ("ann", "red");
        let items = [
            item(&per_user, &ann, 4, Charge::Take),
            item(&per_team, &team, 2, Charge::Take),
            item(&per_team, &team, 2, Charge::Take), // 1 left: denied
        ];
        let answer = now(decide_all(&items, None)).expect("decidable");
        assert!(!answer.admitted);
        assert_eq!(remaining(&per_user, "ann"), 5);
        assert_eq!(remaining(&per_team, "red"), 3);
        // The admitted items report what they hold after the refund, not before it.
        let Outcome::Decided { decision, .. } = &answer.outcomes[0] else {
            panic!("decided");
        };
        assert!(decision.is_allowed());
        assert_eq!(decision.decision().remaining(), 5);
        // Admitted, every item keeps its units.
        let answer = now(decide_all(&items[..2], None)).expect("decidable");
        assert!(answer.admitted);
        assert_eq!(
            (remaining(&per_user, "ann"), remaining(&per_team, "red")),
            (1, 1)
        );
    }

    #[test]
    fn shadow_items_and_records_never_deny_and_records_stay_written() {
        let stack = users(2);
        let (ann, bob) = ("ann", "bob");
        let mut shadow = item(&stack, &bob, 2, Charge::Take);
        shadow.shadow = true;
        now(stack.ask(&bob, Ask::take(2))).expect("valid");
        let items = [
            item(&stack, &ann, 1, Charge::Record),
            shadow, // bob has nothing left: denied, but only reported
        ];
        let answer = now(decide_all(&items, None)).expect("decidable");
        assert!(answer.admitted);
        assert_eq!(remaining(&stack, "ann"), 1);
        // Denied by another item, a record is still written.
        let items = [
            item(&stack, &ann, 1, Charge::Record),
            item(&stack, &bob, 1, Charge::Take),
        ];
        assert!(!now(decide_all(&items, None)).expect("decidable").admitted);
        assert_eq!(remaining(&stack, "ann"), 0);
    }

    #[test]
    fn an_undecidable_item_or_a_store_failing_closed_leaves_nothing_taken() {
        let stack = users(3);
        let ann = "ann";
        let items = [
            item(&stack, &ann, 2, Charge::Take),
            item(&stack, &ann, 9, Charge::Take), // above the burst: an error
        ];
        assert!(matches!(
            now(decide_all(&items, None)),
            Err(CallError::Decision { .. })
        ));
        assert_eq!(remaining(&stack, "ann"), 3);
        let items = [
            item(&stack, &ann, 2, Charge::Take),
            item(&Down, &ann, 1, Charge::Take),
            item(&stack, &ann, 1, Charge::Take),
        ];
        let answer = now(decide_all(&items, None)).expect("decidable");
        assert!(!answer.admitted);
        assert!(matches!(answer.outcomes[1], Outcome::FailedClosed(_)));
        assert!(matches!(answer.outcomes[2], Outcome::FailedClosed(_)));
        assert_eq!(remaining(&stack, "ann"), 3, "the first take was given back");
    }

    #[test]
    fn a_grant_refunds_once_and_only_to_the_stack_that_took_it() {
        use crate::Refunds;
        let stack = users(4);
        let ann = "ann";
        let (_, grant) = now(stack.take_with_grant(&ann, 3, None)).expect("valid");
        let grant = grant.expect("admitted with a grant");
        assert_eq!((grant.left(), remaining(&stack, "ann")), (3, 1));
        now(Refunds::refund(&stack, &ann, grant)).expect("refunded");
        assert_eq!(remaining(&stack, "ann"), 4);
        // A denial holds no grant; another stack's grant (of the same type: a grant of
        // another kind of limiter does not compile) is refused, nothing given back.
        let (_, all) = now(stack.take_with_grant(&ann, 4, None)).expect("valid");
        let (_, none) = now(stack.take_with_grant(&ann, 1, None)).expect("valid");
        assert!(none.is_none());
        now(Refunds::refund(&stack, &ann, all.expect("a grant"))).expect("refunded");
        let other = users(4);
        let (_, foreign) = now(other.take_with_grant(&ann, 1, None)).expect("valid");
        assert!(matches!(
            now(Refunds::refund(&stack, &ann, foreign.expect("a grant"))),
            Err(CallError::Refund { .. })
        ));
        assert_eq!(remaining(&stack, "ann"), 4);
    }
}
