//! The synchronous client of a lazyfs daemon's control socket, for the
//! harness: one Unix-socket connection, one command line out and one JSON
//! line back per call, each bounded by a timeout so a wedged daemon fails
//! the call instead of the run hanging.

use crate::protocol::{Command, PowerReport, Status};
use serde::de::DeserializeOwned;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// How long one command may take (a `power` of a big disk, a slow fsync
/// holding the lock) before the call fails.
pub const REPLY_TIMEOUT_MS: u64 = 30_000;
/// Pause between connection attempts while a daemon starts.
const RETRY_MS: u64 = 20;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("lazyfs control {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("lazyfs control {path}: {command:?} refused: {error}")]
    Refused {
        path: PathBuf,
        command: String,
        error: String,
    },
    #[error("lazyfs control {path}: bad reply to {command:?}: {reply:?}")]
    BadReply {
        path: PathBuf,
        command: String,
        reply: String,
    },
    #[error("lazyfs daemon for {path} did not answer within {waited_ms} ms: {last}")]
    NotReady {
        path: PathBuf,
        waited_ms: u64,
        last: String,
    },
    #[error("lazyfs daemon for {path} exited before answering ({status})")]
    Exited { path: PathBuf, status: String },
}

pub type Result<T> = std::result::Result<T, ControlError>;

/// How to start a daemon: `BIN mount --mountpoint .. --control .. --seed ..
/// --size-mb ..`, its stdout and stderr appended to `log`.
pub struct Mount<'a> {
    pub bin: &'a Path,
    pub mountpoint: &'a Path,
    pub control: &'a Path,
    pub seed: u64,
    pub size_mb: u64,
    pub log: &'a Path,
}

impl Mount<'_> {
    /// Starts the daemon with `env` added and waits up to `ready` until it
    /// answers. On failure the daemon is killed and the error carries what
    /// it said in its log (a mount that cannot be made says why there).
    pub fn start(
        &self,
        env: &[(&str, String)],
        ready: Duration,
    ) -> std::result::Result<(Child, Control), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log)
            .map_err(|e| format!("open {}: {e}", self.log.display()))?;
        let err_log = log
            .try_clone()
            .map_err(|e| format!("open {}: {e}", self.log.display()))?;
        let mut child = std::process::Command::new(self.bin)
            .args(["mount", "--mountpoint"])
            .arg(self.mountpoint)
            .arg("--control")
            .arg(self.control)
            .args(["--seed", &self.seed.to_string()])
            .args(["--size-mb", &self.size_mb.to_string()])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.bin.display()))?;
        match Control::wait_ready(self.control, ready, Some(&mut child)) {
            Ok(ctl) => Ok((child, ctl)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let said = std::fs::read_to_string(self.log).unwrap_or_default();
                Err(format!(
                    "lazyfs at {}: {e}\n{}",
                    self.mountpoint.display(),
                    said.trim_end()
                ))
            }
        }
    }
}

pub struct Control {
    path: PathBuf,
    reader: BufReader<UnixStream>,
}

impl Control {
    pub fn connect(path: &Path) -> Result<Control> {
        let io = |source| ControlError::Io {
            path: path.to_owned(),
            source,
        };
        let stream = UnixStream::connect(path).map_err(io)?;
        let timeout = Some(Duration::from_millis(REPLY_TIMEOUT_MS));
        stream.set_read_timeout(timeout).map_err(io)?;
        stream.set_write_timeout(timeout).map_err(io)?;
        Ok(Control {
            path: path.to_owned(),
            reader: BufReader::new(stream),
        })
    }

    /// Waits until a freshly started daemon answers `status` on `path`, for
    /// at most `timeout`. With `child` (the daemon's process), fails at once
    /// when it exits first: a mount that failed says so on its stderr.
    pub fn wait_ready(
        path: &Path,
        timeout: Duration,
        mut child: Option<&mut Child>,
    ) -> Result<Control> {
        let start = Instant::now();
        loop {
            let last = match Control::connect(path).and_then(|mut c| c.status().map(|_| c)) {
                Ok(c) => return Ok(c),
                Err(e) => e.to_string(),
            };
            if let Some(c) = child.as_deref_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    return Err(ControlError::Exited {
                        path: path.to_owned(),
                        status: status.to_string(),
                    });
                }
            }
            if start.elapsed() >= timeout {
                return Err(ControlError::NotReady {
                    path: path.to_owned(),
                    waited_ms: start.elapsed().as_millis() as u64,
                    last,
                });
            }
            std::thread::sleep(Duration::from_millis(RETRY_MS));
        }
    }

    /// Cuts the power: everything no fsync covered is gone.
    pub fn power(&mut self, tear: bool) -> Result<PowerReport> {
        self.call(Command::Power { tear })
    }

    pub fn disk_full(&mut self, on: bool) -> Result<Status> {
        self.call(Command::DiskFull(on))
    }

    /// The next fsync or fdatasync fails with EIO.
    pub fn disk_error(&mut self) -> Result<Status> {
        self.call(Command::DiskError)
    }

    /// Every fsync waits `ms` first (0: off).
    pub fn slow_disk(&mut self, ms: u64) -> Result<Status> {
        self.call(Command::SlowDisk { ms })
    }

    /// Every fault off.
    pub fn heal(&mut self) -> Result<Status> {
        self.call(Command::Heal)
    }

    pub fn status(&mut self) -> Result<Status> {
        self.call(Command::Status)
    }

    fn call<T: DeserializeOwned>(&mut self, command: Command) -> Result<T> {
        let line = command.to_line();
        let reply = self.round_trip(&line).map_err(|source| ControlError::Io {
            path: self.path.clone(),
            source,
        })?;
        let bad = || ControlError::BadReply {
            path: self.path.clone(),
            command: line.clone(),
            reply: reply.clone(),
        };
        let v: serde_json::Value = serde_json::from_str(&reply).map_err(|_| bad())?;
        match v.get("ok").and_then(|ok| ok.as_bool()) {
            Some(true) => serde_json::from_value(v).map_err(|_| bad()),
            Some(false) => Err(ControlError::Refused {
                path: self.path.clone(),
                command: line.clone(),
                error: v["error"]
                    .as_str()
                    .unwrap_or("(no reason given)")
                    .to_string(),
            }),
            None => Err(bad()),
        }
    }

    fn round_trip(&mut self, line: &str) -> std::io::Result<String> {
        let stream = self.reader.get_mut();
        stream.write_all(format!("{line}\n").as_bytes())?;
        stream.flush()?;
        let mut reply = String::new();
        if self.reader.read_line(&mut reply)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the daemon closed the connection",
            ));
        }
        Ok(reply.trim_end().to_string())
    }
}
