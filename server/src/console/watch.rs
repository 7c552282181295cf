//! `GET /api/watch`: the node's watch stream (`Jobs.Watch`) as Server-Sent
//! Events. Each event's id is `index.seq`, so a browser that reconnects
//! (EventSource sends `Last-Event-ID`) resumes with no gap and no repeat.
//! The bridge holds at most `SSE_BUFFER` events for a browser; one that
//! does not keep up is disconnected (and may reconnect), never buffered
//! without bound.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use kairos_proto::v1::{self as pb, jobs_server::Jobs};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{json as j, service, ApiError, Caller, Params};
use crate::node::Node;

/// Events held for one browser before it is dropped as too slow.
pub const SSE_BUFFER: usize = 256;

pub async fn watch(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref())?;
    let mut req = pb::WatchRequest::default();
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    if let Some((index, seq)) = resume.and_then(|v| v.split_once('.')) {
        let index = index
            .parse()
            .map_err(|_| ApiError::field("last-event-id", "expected index.seq"))?;
        let seq: u32 = seq
            .parse()
            .map_err(|_| ApiError::field("last-event-id", "expected index.seq"))?;
        req.from_index = Some(index);
        req.from_seq = seq.saturating_add(1);
    } else if !p.text("from_index").is_empty() {
        req.from_index = Some(p.number("from_index", 0, i64::MAX, 0)? as u64);
    }
    for (field, list) in [("job", &mut req.jobs), ("group", &mut req.groups)] {
        let v = p.text(field);
        if !v.is_empty() {
            list.push(v.to_string());
        }
    }
    let caller = Caller::from_headers(&headers);
    let events = service(&node)
        .watch(caller.request(req)?)
        .await?
        .into_inner();
    let rx = bridge(events, SSE_BUFFER);
    Ok(Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Forwards watch events into a channel of `capacity` SSE events, ending
/// (which closes the browser's stream) when the channel is full, when the
/// browser has gone, or after a stream error (sent as a `watch_error` event).
fn bridge<S>(mut events: S, capacity: usize) -> mpsc::Receiver<Result<Event, Infallible>>
where
    S: futures::Stream<Item = Result<pb::WatchEvent, tonic::Status>> + Send + Unpin + 'static,
{
    let (tx, rx) = mpsc::channel(capacity);
    tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                _ = tx.closed() => return,
                item = events.next() => item,
            };
            let (event, last) = match item {
                Some(Ok(e)) => {
                    let data = j::watch_event(&e).to_string();
                    (
                        Event::default()
                            .id(format!("{}.{}", e.index, e.seq))
                            .data(data),
                        false,
                    )
                }
                Some(Err(s)) => {
                    let data = j::obj([("error", s.message().into())]).to_string();
                    (Event::default().event("watch_error").data(data), true)
                }
                None => return,
            };
            if tx.try_send(Ok(event)).is_err() || last {
                return;
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(n: u64) -> impl futures::Stream<Item = Result<pb::WatchEvent, tonic::Status>> {
        futures::stream::iter((1..=n).map(|index| {
            Ok(pb::WatchEvent {
                index,
                ..Default::default()
            })
        }))
    }

    async fn drain(mut rx: mpsc::Receiver<Result<Event, Infallible>>) -> usize {
        let mut n = 0;
        while rx.recv().await.is_some() {
            n += 1;
        }
        n
    }

    #[tokio::test]
    async fn a_browser_that_does_not_read_is_dropped_at_the_buffer_bound() {
        let rx = bridge(events(1000), 4);
        // The bridge runs ahead of a reader that has not read yet, until it gives up.
        while !rx.is_closed() {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            drain(rx).await,
            4,
            "the buffer's worth, then the stream ends"
        );
    }

    #[tokio::test]
    async fn a_stream_error_is_sent_and_ends_the_stream() {
        let failing = events(2).chain(futures::stream::iter([Err(tonic::Status::out_of_range(
            "compacted — re-list",
        ))]));
        let rx = bridge(Box::pin(failing.chain(events(5))), 16);
        assert_eq!(drain(rx).await, 3, "two events and the error");
    }
}
