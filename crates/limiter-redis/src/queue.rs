//! A master's coalescing queue: the decisions waiting for a script call, and how many calls
//! are in flight (the protocol that fills and sends it is `coalesce.rs`).

use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::error::BackendError;
use crate::script::call::Call;
use crate::script::reply::GroupAnswer;

/// What a coalesced decision gets back: the script's time (µs) and its group's answer.
pub(crate) type Answered = Result<(u64, GroupAnswer), BackendError>;

/// A decision waiting for a script call.
pub(crate) struct Queued {
    pub(crate) keys: Vec<String>,
    /// Its group, written on its own: its `KEYS` indexes count from 1 within its own keys.
    pub(crate) group: Call,
    pub(crate) limits: usize,
    pub(crate) reply: oneshot::Sender<Answered>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) in_flight: usize,
    pub(crate) queue: Vec<Queued>,
}

/// One master's queue and the count of its script calls in flight.
pub(crate) struct Coalescer {
    state: Mutex<State>,
    pub(crate) max_in_flight: usize,
}

impl Coalescer {
    /// At most `max_in_flight` script calls at once (0 turns coalescing off).
    pub(crate) fn new(max_in_flight: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            max_in_flight,
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is valid after any panic: each change is one assignment or push.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many script calls are in flight now (for stats).
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().in_flight
    }
}
