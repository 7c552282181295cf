//! Where log lines go: a bounded queue that one thread of its own drains
//! to stderr, so logging never stalls the node. A leader writes three
//! lines per run (`runlog`); writing each with its own `write(2)` on an
//! async worker cost the leader a few percent of its CPU, and a stderr
//! that stops draining (a full pipe, a stuck log shipper) would have
//! stopped the scheduler with it. Now a line is handed over in memory; the
//! writer thread writes whatever has queued in one call, then rests a few
//! milliseconds, so a busy node makes a few hundred writes a second
//! whatever its line rate, and a line is written within milliseconds.
//!
//! Limits: at most [`QUEUE_LINES`] lines wait. When the queue is full a
//! line is dropped, counted (`kairos_log_lines_dropped_total`), and the
//! writer says how many it lost in a line of its own once it catches up.
//! Order is kept. [`Flush`] (held by `main`) writes what is queued before
//! the process exits; lines still queued when a process is killed are lost.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::Duration;

/// Lines that may wait for the writer; more are dropped and counted.
pub const QUEUE_LINES: usize = 16_384;
/// Bytes the writer gathers before one write.
const WRITE_BYTES: usize = 64 << 10;
/// After a write the writer rests this long before it looks for more, so a
/// busy node wakes it a few hundred times a second, not once per line
/// (on two shared cores a wake-up per line cost more than the write it saved).
const LINGER: Duration = Duration::from_millis(5);
/// How long [`Flush`] waits for the writer at exit.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Log lines dropped since this process started because the writer fell behind.
pub fn dropped_total() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

enum Msg {
    Line(Vec<u8>),
    Flush(mpsc::Sender<()>),
}

/// The sending side, given to `tracing_subscriber::fmt` as its writer.
#[derive(Clone)]
pub struct Sink {
    tx: SyncSender<Msg>,
}

/// Writes what is queued when dropped (bounded by a short wait).
pub struct Flush {
    tx: SyncSender<Msg>,
}

/// Starts the writer thread over `out` (stderr in the binary).
pub fn start<W: Write + Send + 'static>(out: W) -> (Sink, Flush) {
    start_with(out, QUEUE_LINES)
}

fn start_with<W: Write + Send + 'static>(out: W, queue: usize) -> (Sink, Flush) {
    let (tx, rx) = mpsc::sync_channel(queue);
    std::thread::Builder::new()
        .name("kairos-log".into())
        .spawn(move || write_lines(rx, out, queue))
        .expect("spawning the log writer thread");
    (Sink { tx: tx.clone() }, Flush { tx })
}

/// The writer: blocks for a line, takes every line queued behind it (up
/// to [`WRITE_BYTES`]), writes them in one call. Ends when every sender is gone.
fn write_lines<W: Write>(rx: Receiver<Msg>, mut out: W, queue: usize) {
    let mut buf = Vec::with_capacity(WRITE_BYTES);
    let mut reported = 0u64;
    let mut waiting = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(m) = next {
            match m {
                Msg::Line(l) => buf.extend_from_slice(&l),
                Msg::Flush(done) => waiting.push(done),
            }
            next = if buf.len() < WRITE_BYTES {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        let dropped = DROPPED.load(Ordering::Relaxed);
        if dropped > reported {
            let lost = dropped - reported;
            reported = dropped;
            let note = format!(
                "kairos: {lost} log line(s) dropped: the log writer fell behind \
                 (queue of {queue} lines full)\n"
            );
            buf.extend_from_slice(note.as_bytes());
        }
        // Nowhere to report a failing stderr: the lines are lost either way.
        let _ = out.write_all(&buf).and_then(|()| out.flush());
        buf.clear();
        let flushed = !waiting.is_empty();
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
        if !flushed {
            std::thread::sleep(LINGER);
        }
    }
}

impl Sink {
    fn send(&self, line: Vec<u8>) {
        match self.tx.try_send(Msg::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

impl Flush {
    /// Waits (at most [`FLUSH_WAIT`] in all) until every line queued so far
    /// is written. `SyncSender` has no timed send: a full queue is retried.
    pub fn flush(&self) {
        let deadline = std::time::Instant::now() + FLUSH_WAIT;
        let (done, wait) = mpsc::channel();
        let mut m = Msg::Flush(done);
        loop {
            match self.tx.try_send(m) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return,
                Err(TrySendError::Full(back)) if std::time::Instant::now() < deadline => {
                    m = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(TrySendError::Full(_)) => return,
            }
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let _ = wait.recv_timeout(left);
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        self.flush();
    }
}

/// One line being formatted; handed to the writer when dropped.
pub struct Line {
    sink: Sink,
    buf: Vec<u8>,
}

impl Write for Line {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.sink.send(std::mem::take(&mut self.buf));
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line {
            sink: self.clone(),
            buf: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// An output the test reads back; `gate` holds the writer inside a write.
    #[derive(Clone, Default)]
    struct Out {
        bytes: Arc<Mutex<Vec<u8>>>,
        /// Writes begun (counted before the gate).
        entered: Arc<AtomicU64>,
        writes: Arc<AtomicU64>,
        gate: Arc<Mutex<()>>,
    }

    impl Write for Out {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.entered.fetch_add(1, Ordering::Relaxed);
            let _g = self.gate.lock().unwrap();
            self.writes.fetch_add(1, Ordering::Relaxed);
            self.bytes.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line(sink: &Sink, text: &str) {
        use tracing_subscriber::fmt::MakeWriter;
        let mut l = sink.make_writer();
        l.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn lines_are_written_whole_and_in_order_and_a_flush_waits_for_them() {
        let out = Out::default();
        let (sink, flush) = start_with(out.clone(), 1024);
        let want: String = (0..500).map(|i| format!("line {i}\n")).collect();
        for i in 0..500 {
            line(&sink, &format!("line {i}\n"));
        }
        flush.flush();
        let got = String::from_utf8(out.bytes.lock().unwrap().clone()).unwrap();
        assert_eq!(got, want);
        assert!(out.writes.load(Ordering::Relaxed) >= 1);
    }

    #[test]
    fn a_stalled_output_drops_lines_instead_of_blocking_and_says_how_many() {
        let out = Out::default();
        let gate = out.gate.lock().unwrap();
        let (sink, flush) = start_with(out.clone(), 4);
        let before = dropped_total();
        // The writer takes the first line and blocks in its write: four more
        // fill the queue, and the rest are dropped at once, without waiting.
        line(&sink, "first\n");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while out.entered.load(Ordering::Relaxed) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer never wrote"
            );
            std::thread::yield_now();
        }
        for i in 0..50 {
            line(&sink, &format!("more {i}\n"));
        }
        assert_eq!(dropped_total() - before, 46);
        drop(gate);
        flush.flush();
        let got = String::from_utf8(out.bytes.lock().unwrap().clone()).unwrap();
        let kept: String = (0..4).map(|i| format!("more {i}\n")).collect();
        assert!(got.starts_with(&format!("first\n{kept}")), "{got}");
        assert!(got.contains("46 log line(s) dropped"), "{got}");
    }
}
