//! What the streams of an HTTP/2 connection may hold, as tower layers
//! around the gate's service:
//!
//! * [`StreamLayer`]: every stream takes a place in its address's stream
//!   budget (`server.max_streams_per_ip`, shared by all the address's
//!   connections) and holds it until its response body is dropped, not
//!   only until the response head is ready, since a stalled body is what
//!   holds an origin connection. It also tells the connection's
//!   [`Activity`] whether the response waits on the client (it has data
//!   the client has not taken) or on the origin.
//! * tower's `LoadShed` above it: a stream that finds the budget spent is
//!   answered at once (429, `Retry-After: 1`) instead of waiting, and
//!   [`shed`] turns that refusal into the response.
//!
//! Per connection, HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS`
//! (`server.max_streams_per_connection`) caps the streams; an HTTP/1
//! connection carries one request at a time and its address's connections
//! are capped, so these layers serve HTTP/2 only.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::PollSemaphore;
use tower::{Layer, Service};

use super::conn::{Activity, InFlight};
use crate::body::{Body, BoxError};
use crate::queue_page::Msg;

/// Makes [`Streams`] for one connection.
pub(crate) struct StreamLayer {
    budget: Arc<Semaphore>,
    activity: Activity,
}

impl StreamLayer {
    /// Streams of a connection watched by `activity`, from an address
    /// whose budget is `budget`.
    pub(crate) fn new(budget: Arc<Semaphore>, activity: Activity) -> Self {
        Self { budget, activity }
    }
}

impl<S> Layer<S> for StreamLayer {
    type Service = Streams<S>;

    fn layer(&self, inner: S) -> Streams<S> {
        Streams {
            inner,
            budget: PollSemaphore::new(self.budget.clone()),
            permit: None,
            activity: self.activity.clone(),
        }
    }
}

/// The gate's service with each stream's place in the budget (see the
/// module docs).
pub(crate) struct Streams<S> {
    inner: S,
    budget: PollSemaphore,
    /// Taken by `poll_ready`, handed to the next call's response body.
    permit: Option<OwnedSemaphorePermit>,
    activity: Activity,
}

impl<S: Clone> Clone for Streams<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            budget: self.budget.clone(),
            // A clone has not been made ready.
            permit: None,
            activity: self.activity.clone(),
        }
    }
}

impl<S, R> Service<R> for Streams<S>
where
    S: Service<R, Response = Response<Body>>,
    S::Future: 'static,
    S::Error: 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if self.permit.is_none() {
            match self.budget.poll_acquire(cx) {
                Poll::Ready(Some(permit)) => self.permit = Some(permit),
                // The budget's semaphore is never closed; if it were, no
                // stream could be served: every one is shed.
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let permit = self.permit.take();
        let flight = self.activity.request();
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            flight.waits_on_client();
            Ok(response.map(|body| {
                Body::new(Tracked {
                    body,
                    flight,
                    _permit: permit,
                })
            }))
        })
    }
}

/// A response body that holds its stream's place in the budget and tells
/// the connection's watch whom it waits on.
struct Tracked {
    body: Body,
    flight: InFlight,
    _permit: Option<OwnedSemaphorePermit>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            // Handed to the connection: hyper asks for more only once the
            // client's window lets this out.
            Poll::Ready(Some(Ok(_))) => self.flight.waits_on_client(),
            Poll::Pending => self.flight.waits_on_origin(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The answer to a stream that found its address's budget spent (tower's
/// `LoadShed` refused it): 429 at once, with `Retry-After: 1`.
pub(crate) fn shed(result: Result<Response<Body>, BoxError>) -> Result<Response<Body>, BoxError> {
    Ok(result.unwrap_or_else(|e| {
        tracing::debug!(error = %e, "stream refused: the address's stream budget is spent");
        let chosen = crate::i18n::Language::Auto.choose(&HeaderMap::new());
        let mut resp =
            crate::respond::message(StatusCode::TOO_MANY_REQUESTS, Msg::SlowDown, chosen, 0);
        crate::respond::retry_after(&mut resp, 1);
        resp
    }))
}
