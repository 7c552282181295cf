//! `Jobs.Watch`: streams this node's watch ring (`crate::watch`) to a
//! client. Each stream is a task that pulls from the ring at its own
//! position into a bounded queue, so a watcher that does not read holds
//! only its queue and its position: apply never waits for it, and once the
//! ring has moved past its position the stream ends with the compacted error.

use std::sync::Arc;

use kairos_proto::v1 as pb;
use tokio::sync::mpsc;
use tonic::{Response, Status};

use super::convert::watch_event_out;
use super::error;
use crate::core::{limits, validate};
use crate::watch::{
    Compacted, Filter, Hub, Position, WatcherSlot, FILTER_MAX, WATCHER_BUFFER_EVENTS,
};

use kairos_client::{OLDEST_INDEX_HEADER, WATCH_FROM_INDEX_HEADER};

pub type WatchStream = tokio_stream::wrappers::ReceiverStream<Result<pb::WatchEvent, Status>>;

/// Checks the request, takes a watcher slot and starts the stream's task.
pub fn start(hub: &Arc<Hub>, req: pb::WatchRequest) -> Result<Response<WatchStream>, Status> {
    let filter = filter_in(req.jobs, req.groups)?;
    if hub.is_closed() {
        return Err(Status::unavailable(
            "watch: this node is stopping; watch another node",
        ));
    }
    let slot = hub.admit().ok_or_else(|| {
        Status::resource_exhausted(format!(
            "watch: this node serves at most {} watch streams; retry later or watch another node",
            crate::watch::WATCHERS_MAX
        ))
    })?;
    let from = Position {
        index: req.from_index.unwrap_or_else(|| hub.bounds().1),
        seq: req.from_seq,
    };
    // Checked now, so a position already gone fails the call itself.
    hub.read(from, &filter, 0).map_err(compacted)?;
    let (tx, rx) = mpsc::channel(WATCHER_BUFFER_EVENTS);
    tokio::spawn(pump(hub.clone(), slot, from, filter, tx));
    let mut res = Response::new(WatchStream::new(rx));
    let index = from.index.to_string().parse().expect("digits");
    res.metadata_mut().insert(WATCH_FROM_INDEX_HEADER, index);
    Ok(res)
}

fn filter_in(jobs: Vec<String>, groups: Vec<String>) -> Result<Filter, Status> {
    for (field, values, max) in [
        ("jobs", &jobs, limits::ID_MAX_BYTES),
        ("groups", &groups, limits::GROUP_MAX_BYTES),
    ] {
        if values.len() > FILTER_MAX {
            return Err(Status::invalid_argument(format!(
                "{field}: at most {FILTER_MAX} per watch, got {}",
                values.len()
            )));
        }
        for (i, v) in values.iter().enumerate() {
            validate::name(&format!("{field}[{i}]"), v, max).map_err(error::command)?;
        }
    }
    Ok(Filter { jobs, groups })
}

pub fn compacted(c: Compacted) -> Status {
    let mut s = Status::out_of_range(format!(
        "compacted — re-list: this node holds events from log index {} on; \
         list the current state, then watch from that index",
        c.oldest
    ));
    s.metadata_mut().insert(
        OLDEST_INDEX_HEADER,
        c.oldest.to_string().parse().expect("digits"),
    );
    s
}

/// Sends the events from `at` on as the ring receives them, until the
/// client goes or the ring no longer holds `at`.
async fn pump(
    hub: Arc<Hub>,
    _slot: WatcherSlot,
    mut at: Position,
    filter: Filter,
    tx: mpsc::Sender<Result<pb::WatchEvent, Status>>,
) {
    let mut pushed = hub.subscribe();
    loop {
        // Marks what is in the ring now as seen: a push after the read wakes us.
        pushed.borrow_and_update();
        let room = tokio::select! {
            permits = tx.reserve_many(WATCHER_BUFFER_EVENTS.min(tx.capacity().max(1))) => permits,
            _ = tx.closed() => return,
        };
        let Ok(permits) = room else { return };
        if hub.is_closed() {
            let msg = format!(
                "watch: this node is stopping; resume on another node from index {} seq {}",
                at.index, at.seq
            );
            let _ = tx.send(Err(Status::unavailable(msg))).await;
            return;
        }
        let read = match hub.read(at, &filter, permits.len()) {
            Ok(read) => read,
            Err(c) => {
                let _ = tx.send(Err(compacted(c))).await;
                return;
            }
        };
        let idle = read.events.is_empty();
        for (permit, e) in permits.zip(read.events.iter()) {
            permit.send(Ok(watch_event_out(e)));
        }
        at = read.next;
        if idle {
            tokio::select! {
                changed = pushed.changed() => if changed.is_err() { return },
                _ = tx.closed() => return,
            }
        }
    }
}
