//! The visitor's request body on its way to the origin, with a time
//! allowance: it must end within `request_body_timeout` plus one second
//! for every `request_body_min_rate` bytes received (Apache's
//! `mod_reqtimeout` rule). A body that trickles (a byte every few seconds,
//! on HTTP/1 or on each of a hundred HTTP/2 streams) fails once its
//! allowance runs out, and its origin connection is closed; a large upload
//! at any reasonable speed never meets it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::body::BoxError;

/// How a request body's allowance is measured.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Allowance {
    /// The time every body gets.
    pub timeout: Duration,
    /// Each this many bytes received adds a second.
    pub min_rate: u64,
}

/// The error of a body whose allowance ran out.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not sent within its allowance")]
pub(crate) struct TooSlow;

/// A request body with its allowance (see the module docs). A body that is
/// empty from the start (most requests) carries nothing more than itself.
pub(crate) enum Upload {
    Empty(Incoming),
    Timed(Box<Timed>),
}

pub(crate) struct Timed {
    body: Incoming,
    allowance: Allowance,
    /// Made when the body is first found waiting; its deadline moves out
    /// as bytes arrive.
    timer: Option<Pin<Box<Sleep>>>,
    /// When the body was first read.
    started: Instant,
    received: u64,
}

impl Upload {
    pub(crate) fn new(body: Incoming, allowance: Allowance) -> Self {
        if body.is_end_stream() {
            return Upload::Empty(body);
        }
        Upload::Timed(Box::new(Timed {
            body,
            allowance,
            timer: None,
            started: Instant::now(),
            received: 0,
        }))
    }
}

impl Timed {
    fn deadline(&self) -> Instant {
        let earned = Duration::from_secs_f64(self.received as f64 / self.allowance.min_rate as f64);
        self.started + self.allowance.timeout + earned
    }
}

impl HttpBody for Upload {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = match &mut *self {
            Upload::Empty(body) => {
                return Pin::new(body)
                    .poll_frame(cx)
                    .map(|f| f.map(|r| r.map_err(Into::into)))
            }
            Upload::Timed(timed) => &mut **timed,
        };
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    let deadline = this.deadline();
                    if let Some(timer) = &mut this.timer {
                        timer.as_mut().reset(deadline);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => Poll::Ready(other.map(|r| r.map_err(Into::into))),
            Poll::Pending => {
                let deadline = this.deadline();
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(TooSlow)))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Upload::Empty(body) => body.is_end_stream(),
            Upload::Timed(timed) => timed.body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Upload::Empty(body) => body.size_hint(),
            Upload::Timed(timed) => timed.body.size_hint(),
        }
    }
}
