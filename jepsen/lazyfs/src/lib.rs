//! kairos-lazyfs: a filesystem that forgets what no fsync covered, for the
//! fault harness. It keeps everything in memory: writes, truncates and
//! namespace changes take effect at once in the live view, and a `power`
//! command cuts the live view back to what fsync (file data) and fsyncdir
//! (directory entries) made durable, optionally tearing the last page each
//! file wrote. It also fills up (`disk-full`), fails an fsync (`disk-error`)
//! and slows fsync down (`slow-disk`).
//!
//! `model` is the whole semantics as plain logic; `protocol` the control
//! socket's commands and replies; `control` the synchronous client the
//! harness uses. With the `fs` feature (default), `fuse` serves the model
//! through FUSE and `daemon` runs the mount and the control socket.

pub mod control;
pub mod model;
pub mod protocol;

#[cfg(feature = "fs")]
pub mod daemon;
#[cfg(feature = "fs")]
pub mod fuse;
