//! The live history recorder: tasks send events over a bounded channel to one
//! writer thread that appends them to `history.jsonl`, so lines are never
//! interleaved and a slow disk applies back-pressure instead of growing memory.
//! It also hands out operation and nemesis event ids, and the harness clock.

use crate::clock::Clock;
use crate::event::Event;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Events buffered between producers and the writer.
pub const QUEUE_LEN: usize = 4_096;

enum Msg {
    Event(Box<Event>),
    /// Answered once every earlier event is written and flushed.
    Sync(oneshot::Sender<()>),
}

#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Msg>,
    next_op: Arc<AtomicU64>,
    next_nemesis: Arc<AtomicU64>,
    pub clock: Clock,
}

impl Recorder {
    /// Creates (truncates) `path` and starts the writer thread.
    pub fn create(path: &Path, clock: Clock) -> Result<Recorder> {
        let file =
            std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
        let (tx, mut rx) = mpsc::channel::<Msg>(QUEUE_LEN);
        std::thread::Builder::new()
            .name("history-writer".into())
            .spawn(move || {
                let mut w = std::io::BufWriter::new(file);
                while let Some(m) = rx.blocking_recv() {
                    match m {
                        Msg::Event(e) => {
                            let _ = serde_json::to_writer(&mut w, &e);
                            let _ = w.write_all(b"\n");
                            if rx.is_empty() {
                                let _ = w.flush();
                            }
                        }
                        Msg::Sync(done) => {
                            let _ = w.flush();
                            let _ = done.send(());
                        }
                    }
                }
                let _ = w.flush();
            })?;
        Ok(Recorder {
            tx,
            next_op: Arc::new(AtomicU64::new(1)),
            next_nemesis: Arc::new(AtomicU64::new(1)),
            clock,
        })
    }

    pub async fn record(&self, e: Event) {
        // The writer only stops when every sender is gone.
        let _ = self.tx.send(Msg::Event(Box::new(e))).await;
    }

    pub fn next_op_id(&self) -> u64 {
        self.next_op.fetch_add(1, Ordering::Relaxed)
    }

    /// Id shared by a nemesis action's `start`, `info` and `stop` events.
    pub fn next_nemesis_id(&self) -> u64 {
        self.next_nemesis.fetch_add(1, Ordering::Relaxed)
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Waits until everything recorded so far is on disk.
    pub async fn sync(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Msg::Sync(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}
