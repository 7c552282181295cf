//! Signals from the harness, delivered only by syscall and only to a process
//! that is provably the one meant. Never through a spawned `kill` program
//! (procps turns `kill -SIG -PGID` into `kill(-1)`: every process), never
//! to pid ≤ 1, never to a process group.
//!
//! A child of ours is signalled only while it is unreaped (its pid cannot
//! have been reused). A stale node of an earlier run is signalled through a
//! pidfd, after checking that the pid still has the start time it had when
//! it was identified as ours.

use std::process::Child;

pub use rustix::process::Signal;
use rustix::process::{kill_process, pidfd_open, pidfd_send_signal, Pid, PidfdFlags};

/// Signals our own child if it has not been reaped; false otherwise.
pub fn child(c: &mut Child, sig: Signal) -> bool {
    if !matches!(c.try_wait(), Ok(None)) {
        return false; // exited and reaped: the pid may belong to someone else now
    }
    kill_process(Pid::from_child(c), sig).is_ok()
}

/// The kernel's start time of `pid` (clock ticks since boot), which with the
/// pid names one process for good.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces; starttime is field 22.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// SIGCONT then SIGKILL to `pid`, if it is still the process that started at `start`.
pub fn kill_identified(pid: u32, start: u64) -> bool {
    let Some(p) = i32::try_from(pid)
        .ok()
        .filter(|p| *p > 1)
        .and_then(Pid::from_raw)
    else {
        return false;
    };
    let Ok(fd) = pidfd_open(p, PidfdFlags::empty()) else {
        return false;
    };
    // The pidfd pins whatever process holds the pid now; make sure it is ours.
    if start_time(pid) != Some(start) {
        return false;
    }
    let _ = pidfd_send_signal(&fd, Signal::CONT);
    pidfd_send_signal(&fd, Signal::KILL).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_that_mean_everyone_or_init_are_never_signalled() {
        for pid in [0, 1] {
            assert!(!kill_identified(pid, start_time(1).unwrap_or(0)));
        }
    }

    #[test]
    fn a_process_with_another_start_time_is_left_alone() {
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let start = start_time(c.id()).unwrap();
        assert!(!kill_identified(c.id(), start + 1));
        assert!(
            matches!(c.try_wait(), Ok(None)),
            "signalled the wrong process"
        );
        assert!(kill_identified(c.id(), start));
        assert!(!c.wait().unwrap().success());
    }

    #[test]
    fn a_reaped_child_is_not_signalled() {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        c.wait().unwrap();
        assert!(!child(&mut c, Signal::CONT));
    }
}
