//! The control socket's language: one command a line, one JSON object a
//! reply line, `{"ok":true,...}` or `{"ok":false,"error":"..."}`.

use serde::{Deserialize, Serialize};

/// What the control socket understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Power { tear: bool },
    DiskFull(bool),
    DiskError,
    SlowDisk { ms: u64 },
    Heal,
    Status,
}

/// The longest `slow-disk` delay accepted, so a typo cannot wedge a node.
pub const SLOW_DISK_MS_MAX: u64 = 60_000;

const USAGE: &str =
    "expected one of: power [tear], disk-full on|off, disk-error, slow-disk MS, heal, status";

impl Command {
    pub fn parse(line: &str) -> Result<Command, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        Ok(match words.as_slice() {
            ["power"] => Command::Power { tear: false },
            ["power", "tear"] => Command::Power { tear: true },
            ["disk-full", "on"] => Command::DiskFull(true),
            ["disk-full", "off"] => Command::DiskFull(false),
            ["disk-error"] => Command::DiskError,
            ["slow-disk", ms] => {
                let ms: u64 = ms
                    .parse()
                    .map_err(|_| format!("slow-disk: {ms:?} is not a number of milliseconds"))?;
                if ms > SLOW_DISK_MS_MAX {
                    return Err(format!(
                        "slow-disk: {ms} ms is over the {SLOW_DISK_MS_MAX} ms limit"
                    ));
                }
                Command::SlowDisk { ms }
            }
            ["heal"] => Command::Heal,
            ["status"] => Command::Status,
            [] => return Err(format!("empty command; {USAGE}")),
            _ => return Err(format!("unknown command {:?}; {USAGE}", line.trim())),
        })
    }

    /// The line the client sends (without its newline).
    pub fn to_line(self) -> String {
        match self {
            Command::Power { tear: false } => "power".into(),
            Command::Power { tear: true } => "power tear".into(),
            Command::DiskFull(on) => format!("disk-full {}", if on { "on" } else { "off" }),
            Command::DiskError => "disk-error".into(),
            Command::SlowDisk { ms } => format!("slow-disk {ms}"),
            Command::Heal => "heal".into(),
            Command::Status => "status".into(),
        }
    }
}

/// The reply to `power`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerReport {
    /// Files that lost data (reverted to their durable data, or dropped).
    pub files: u64,
    /// Bytes lost (unsynced bytes, less what a tear kept; dropped files whole).
    pub bytes: u64,
    /// Directory changes no fsyncdir had covered.
    pub namespace_ops: u64,
    pub inodes_dropped: u64,
    pub torn_files: u64,
    pub torn_bytes: u64,
}

/// The reply to `status` (and to the fault commands: the state they left).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// Bytes written or truncated since their file's last fsync.
    pub unsynced_bytes: u64,
    /// Files whose data or size differs from their durable state.
    pub unsynced_files: u64,
    /// Directory changes since their directory's last fsyncdir.
    pub unsynced_namespace_ops: u64,
    pub used_bytes: u64,
    pub capacity_bytes: u64,
    pub inodes: u64,
    /// 4 KiB pages held in memory.
    pub pages: u64,
    /// Power cuts so far.
    pub powers: u64,
    pub disk_full: bool,
    pub disk_error_pending: bool,
    pub slow_disk_ms: u64,
    /// fsyncs waiting out their slow-disk delay right now.
    pub fsyncs_sleeping: u64,
}

/// `{"ok":true, <fields of body>}`.
pub fn ok_line<T: Serialize>(body: &T) -> String {
    let mut v = serde_json::to_value(body).unwrap_or_else(|_| serde_json::json!({}));
    if !v.is_object() {
        v = serde_json::json!({});
    }
    v.as_object_mut()
        .expect("an object")
        .insert("ok".into(), true.into());
    v.to_string()
}

pub fn error_line(error: &str) -> String {
    serde_json::json!({ "ok": false, "error": error }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_round_trips_and_bad_ones_say_why() {
        for c in [
            Command::Power { tear: false },
            Command::Power { tear: true },
            Command::DiskFull(true),
            Command::DiskFull(false),
            Command::DiskError,
            Command::SlowDisk { ms: 250 },
            Command::Heal,
            Command::Status,
        ] {
            assert_eq!(Command::parse(&c.to_line()), Ok(c));
        }
        let e = Command::parse("reboot now").unwrap_err();
        assert!(
            e.contains("unknown command \"reboot now\"") && e.contains("power [tear]"),
            "{e}"
        );
        assert!(Command::parse("slow-disk fast")
            .unwrap_err()
            .contains("not a number"));
        assert!(Command::parse("slow-disk 999999")
            .unwrap_err()
            .contains("limit"));
        assert!(Command::parse("disk-full maybe").is_err());
        assert!(Command::parse("  ").unwrap_err().contains("empty"));
    }

    #[test]
    fn replies_are_one_json_object_with_ok() {
        let line = ok_line(&PowerReport {
            files: 2,
            ..PowerReport::default()
        });
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ok"], true);
        assert_eq!(v["files"], 2);
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&error_line("no \"x\"")).unwrap();
        assert_eq!(
            (v["ok"].clone(), v["error"].clone()),
            (false.into(), "no \"x\"".into())
        );
    }
}
