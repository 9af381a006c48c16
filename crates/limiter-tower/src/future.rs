//! [`ResponseFuture`], the future of a [`RateLimit`](crate::RateLimit) call: the inner
//! service's, whose response gets the rate limit headers; the middleware's own answer; or a
//! boxed future that decides remotely and then calls the inner service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use crate::headers::RateHeaders;

/// A boxed future that decides and then calls the inner service.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pin_project! {
    /// The future of a [`RateLimit`] call: the inner service's, whose response gets the rate
    /// limit headers; the middleware's own answer (429, 503, 400, 500); or, for a limiter that
    /// decides remotely, a boxed future that decides and then calls the inner service.
    pub struct ResponseFuture<F, RB, E> {
        #[pin]
        state: State<F, RB, E>,
        // Beside the state, not in its `Inner` variant: a variant holding them beside the
        // inner future had that future copied once more on its way out of `call` (callgrind,
        // an axum route: 102 instructions a request, with headers or without).
        headers: RateHeaders,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, RB, E> {
        // The inner service's future, whose response gets `headers`.
        Inner {
            #[pin]
            future: F,
        },
        // The inner service's future alone: no headers to add (headers off, no layer
        // applied), so none are taken, applied or dropped when it is done (45 instructions
        // a request fewer than `Inner` with none).
        Plain {
            #[pin]
            future: F,
        },
        Answered {
            response: Option<Response<RB>>,
        },
        Waiting {
            future: BoxFuture<Result<Response<RB>, E>>,
        },
    }
}

impl<F, RB, E> ResponseFuture<F, RB, E> {
    /// The inner service's future, whose response gets `headers` (none: polled alone).
    pub(crate) fn inner(future: F, headers: RateHeaders) -> Self {
        if headers.is_none() {
            return Self {
                state: State::Plain { future },
                headers,
            };
        }
        Self {
            state: State::Inner { future },
            headers,
        }
    }

    pub(crate) fn answered(response: Response<RB>) -> Self {
        Self {
            state: State::Answered {
                response: Some(response),
            },
            headers: RateHeaders::None,
        }
    }

    pub(crate) fn waiting(future: BoxFuture<Result<Response<RB>, E>>) -> Self {
        Self {
            state: State::Waiting { future },
            headers: RateHeaders::None,
        }
    }
}

impl<F, RB, E> fmt::Debug for ResponseFuture<F, RB, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Inner { .. } | State::Plain { .. } => "inner",
            State::Answered { .. } => "answered",
            State::Waiting { .. } => "waiting",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, RB, E> Future for ResponseFuture<F, RB, E>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<RB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Inner { future } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                std::mem::take(this.headers).apply(response.headers_mut());
                Poll::Ready(Ok(response))
            }
            StateProj::Plain { future } => future.poll(cx),
            StateProj::Answered { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending,
            },
            StateProj::Waiting { future } => future.as_mut().poll(cx),
        }
    }
}
