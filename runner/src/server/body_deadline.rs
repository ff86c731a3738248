//! A request body with a deadline for the whole of it. A timeout between frames (tower-http's
//! `RequestBodyTimeoutLayer`) is reset by every byte, so a client sending one byte every few
//! seconds would hold its request open for as long as it likes; this one is not.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};

/// The error a body reports once its deadline has passed.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTooSlow(pub Duration);

/// `inner`, failing with [`BodyTooSlow`] once its deadline passes before its end.
pub struct DeadlineBody<B> {
    inner: B,
    deadline: Pin<Box<tokio::time::Sleep>>,
    allowed: Duration,
}

impl<B> DeadlineBody<B> {
    /// `inner`, which must end within `allowed` from now.
    pub fn new(inner: B, allowed: Duration) -> DeadlineBody<B> {
        DeadlineBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(allowed)),
            allowed,
        }
    }
}

impl<B> Body for DeadlineBody<B>
where
    B: Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTooSlow(this.allowed))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;

    #[tokio::test]
    async fn a_body_still_arriving_at_its_deadline_fails_however_steadily_it_trickles() {
        // A byte every 10 ms, forever: each frame comes well within any per-frame timeout.
        let trickle = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Some((Ok::<_, std::io::Error>(Bytes::from_static(b"x")), ()))
        });
        let body = axum::body::Body::from_stream(trickle);
        let mut timed = DeadlineBody::new(body, Duration::from_millis(200));
        let mut frames = 0;
        let error = loop {
            match std::future::poll_fn(|cx| Pin::new(&mut timed).poll_frame(cx)).await {
                Some(Ok(_)) => frames += 1,
                Some(Err(e)) => break e,
                None => panic!("the trickle never ends"),
            }
        };
        assert!(
            error.to_string().contains("did not arrive within"),
            "{error}"
        );
        assert!(frames > 0, "the trickle arrived until the deadline");
    }

    #[tokio::test]
    async fn a_body_that_ends_in_time_is_passed_through() {
        let body = axum::body::Body::from("hello");
        let timed = axum::body::Body::new(DeadlineBody::new(body, Duration::from_secs(1)));
        let bytes = axum::body::to_bytes(timed, 1024).await.unwrap();
        assert_eq!(&bytes[..], b"hello");
    }
}
