//! A run's processes: one process group per run, signalled only through the
//! `kill(2)` syscall and only while the group is provably ours.
//!
//! The command is started as the leader of a new process group (pgid = its
//! pid). Its exit is observed with `waitid(WNOWAIT)`, which leaves it a
//! zombie: while it is unreaped its pid, and therefore the group id, cannot be
//! reused by the kernel, so signalling the group can never reach a stranger.
//! Only after the whole group has been dealt with is the leader reaped.
//! No external program is ever spawned to deliver a signal (procps `kill`
//! parses `-KILL -PGID` as "every process": issue #9).

use std::io;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rustix::process::{
    kill_process_group, waitid, Pid, Signal, WaitId, WaitIdOptions, WaitOptions,
};

/// How often a running group's leader is checked for exit.
const POLL: Duration = Duration::from_millis(20);

/// How a group was stopped by [`ProcessGroup::stop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The leader had already exited before any signal.
    AlreadyExited,
    /// The leader exited within the grace after SIGTERM.
    Terminated,
    /// The leader outlived the grace and the group got SIGKILL.
    Killed,
}

/// A spawned command that leads its own process group.
pub struct ProcessGroup {
    child: Child,
    pgid: Pid,
    reaped: bool,
}

/// Sends `sig` to the process group `pgid`, refusing the ids that mean
/// "every process" or "my own group" to the kernel (≤ 1).
pub fn signal_group(pgid: i32, sig: Signal) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal process group {pgid}: must be above 1"),
        ));
    }
    let pid = Pid::from_raw(pgid).ok_or_else(|| io::Error::other("pid 0"))?;
    kill_process_group(pid, sig).map_err(io::Error::from)
}

impl ProcessGroup {
    /// Spawns `cmd` as the leader of a new process group.
    pub fn spawn(mut cmd: Command) -> io::Result<ProcessGroup> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0).stdin(Stdio::null());
        let child = cmd.spawn()?;
        let pgid = Pid::from_child(&child);
        if pgid.as_raw_nonzero().get() <= 1 {
            // Cannot happen for a child; refuse rather than ever signal it.
            return Err(io::Error::other("spawned child has pid ≤ 1"));
        }
        Ok(ProcessGroup {
            child,
            pgid,
            reaped: false,
        })
    }

    pub fn pgid(&self) -> i32 {
        self.pgid.as_raw_nonzero().get()
    }

    /// Takes the child's piped stdout/stderr handles.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Whether the leader has exited (it stays unreaped, so the group id stays ours).
    pub fn has_exited(&self) -> io::Result<bool> {
        if self.reaped {
            return Ok(true);
        }
        let opts = WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG;
        Ok(waitid(WaitId::Pid(self.pgid), opts)?.is_some())
    }

    /// Waits until the leader exits, without reaping it.
    pub async fn exited(&self) -> io::Result<()> {
        while !self.has_exited()? {
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// Signals every process of the group. Refused once the leader is reaped,
    /// because from then on the id may belong to someone else.
    pub fn signal(&self, sig: Signal) -> io::Result<()> {
        if self.reaped {
            return Err(io::Error::other("process group already reaped"));
        }
        match signal_group(self.pgid(), sig) {
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => Ok(()),
            r => r,
        }
    }

    /// SIGTERM to the group, up to `grace` for the leader to exit, then
    /// SIGKILL to the group. Stragglers left by an exited leader get SIGKILL too.
    pub async fn stop(&mut self, grace: Duration) -> io::Result<Stopped> {
        if self.has_exited()? {
            self.finish()?;
            return Ok(Stopped::AlreadyExited);
        }
        self.signal(Signal::TERM)?;
        let how = match tokio::time::timeout(grace, self.exited()).await {
            Ok(r) => {
                r?;
                Stopped::Terminated
            }
            Err(_) => Stopped::Killed,
        };
        self.finish()?;
        Ok(how)
    }

    /// Leader exited (or is to die now): SIGKILL whatever is left of the
    /// group, then reap the leader. Returns its exit code (None if signalled).
    pub fn finish(&mut self) -> io::Result<Option<i32>> {
        if self.reaped {
            return Ok(None);
        }
        // Reap even if the signal failed, or the leader stays a zombie forever.
        let killed = self.signal(Signal::KILL);
        let status = rustix::process::waitpid(Some(self.pgid), WaitOptions::empty());
        self.reaped = true;
        killed?;
        Ok(status?.and_then(|(_, s)| s.exit_status()))
    }
}

impl Drop for ProcessGroup {
    /// A run abandoned mid-way (cancelled, its task aborted) still takes its
    /// processes with it: SIGKILL to the group while it is known to be ours.
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// SIGINT and SIGTERM, each delivery counted: what a process of ours
/// treats as "stop" (a second one as "stop now").
pub struct StopSignals {
    term: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    pub fn new() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        StopSignals {
            term: signal(SignalKind::terminate()).ok(),
        }
    }

    /// Resolves at the next SIGINT or SIGTERM.
    pub async fn next(&mut self) {
        let term = async {
            match self.term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
    }
}

impl Default for StopSignals {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ids_that_mean_everyone_are_refused() {
        for pgid in [-1, 0, 1] {
            let e = signal_group(pgid, Signal::CONT).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "pgid {pgid}");
        }
    }

    #[tokio::test]
    async fn stop_kills_the_command_and_its_children_and_nobody_else() {
        // A sentinel in a group of its own, not the run's.
        let mut sentinel = Command::new("sleep");
        sentinel.arg("300");
        let mut sentinel = ProcessGroup::spawn(sentinel).unwrap();

        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 60 & sleep 60"]);
        let mut g = ProcessGroup::spawn(cmd).unwrap();
        let pgid = g.pgid();
        // sh and both sleeps.
        wait_until(|| members(pgid) == 3).await;
        assert_eq!(
            g.stop(Duration::from_secs(5)).await.unwrap(),
            Stopped::Terminated
        );
        wait_until(|| members(pgid) == 0).await;
        assert!(
            !sentinel.has_exited().unwrap(),
            "the sentinel was signalled"
        );
        sentinel.finish().unwrap();
    }

    #[tokio::test]
    async fn a_group_that_ignores_term_is_killed_after_the_grace() {
        let mut cmd = Command::new("sh");
        // An ignored signal stays ignored across fork and exec: all three ignore TERM.
        cmd.args(["-c", "trap '' TERM; sleep 60 & sleep 60"]);
        let mut g = ProcessGroup::spawn(cmd).unwrap();
        let pgid = g.pgid();
        wait_until(|| members(pgid) == 3).await;
        assert_eq!(
            g.stop(Duration::from_millis(300)).await.unwrap(),
            Stopped::Killed
        );
        wait_until(|| members(pgid) == 0).await;
    }

    #[tokio::test]
    async fn dropping_a_group_kills_it() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 60 & sleep 60"]);
        let g = ProcessGroup::spawn(cmd).unwrap();
        let pgid = g.pgid();
        wait_until(|| members(pgid) == 3).await;
        drop(g);
        wait_until(|| members(pgid) == 0).await;
    }

    #[tokio::test]
    async fn a_reaped_group_is_never_signalled_again() {
        let mut g = ProcessGroup::spawn(Command::new("true")).unwrap();
        g.exited().await.unwrap();
        assert_eq!(g.finish().unwrap(), Some(0));
        assert!(g.signal(Signal::CONT).is_err());
    }

    async fn wait_until(mut f: impl FnMut() -> bool) {
        for _ in 0..1000 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached within 10 s");
    }

    /// Live (non-zombie) processes whose process group is `pgid`.
    fn members(pgid: i32) -> usize {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter(|stat| {
                let Some((_, rest)) = stat.rsplit_once(')') else {
                    return false;
                };
                // After comm: state ppid pgrp ...
                let f: Vec<&str> = rest.split_whitespace().collect();
                f.len() > 2 && f[0] != "Z" && f[2] == pgid.to_string()
            })
            .count()
    }
}
