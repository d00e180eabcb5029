//! The one response/request body type the daemon speaks, and small builders.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

/// Any error a body can fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A streaming body: the origin's bodies pass through it unbuffered, the
/// daemon's own pages are one chunk.
pub type Body = BoxBody<Bytes, BoxError>;

/// A body of one chunk.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A body with no bytes.
pub fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// Boxes any body whose error converts into `BoxError` (e.g. `Incoming`).
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}
