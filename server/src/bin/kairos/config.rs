//! `kairos serve --config FILE` and `kairos config check FILE`.
//!
//! The file is TOML with one key per `serve` flag: its long name with `_`
//! for `-` (`peer_listen = "10.0.0.1:7170"`, `peers = ["1=10.0.0.1:7170"]`,
//! `insecure = false`). Precedence: flags > `KAIROS_*` environment > file >
//! defaults. An unknown key, or a value of the wrong shape, is an error
//! naming the key; nothing starts.

use std::ffi::OsString;
use std::path::Path;

use anyhow::Context;
use clap::{Args, FromArgMatches};

use crate::ServeArgs;

/// The `serve` command alone, later occurrences of a flag overriding earlier ones.
fn serve_command() -> clap::Command {
    ServeArgs::augment_args(clap::Command::new("kairos serve")).args_override_self(true)
}

/// The file's settings as `serve` arguments, leaving out what the
/// environment sets (the environment wins over the file).
fn file_args(path: &Path, cmd: &clap::Command) -> anyhow::Result<Vec<OsString>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--config {}", path.display()))?;
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("--config {}: not valid TOML", path.display()))?;
    let mut args = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && long != "config")
            .with_context(|| {
                format!(
                    "--config {}: unknown key {key:?} (keys are the serve flags with _ for -, see README)",
                    path.display()
                )
            })?;
        if arg.get_env().is_some_and(|e| std::env::var_os(e).is_some()) {
            continue;
        }
        let flag = OsString::from(format!("--{long}"));
        let takes_value = arg.get_action().takes_values();
        let bad =
            |want: &str| anyhow::anyhow!("--config {}: key {key:?} must be {want}", path.display());
        match value {
            toml::Value::Boolean(b) if !takes_value => {
                if *b {
                    args.push(flag);
                }
            }
            toml::Value::Boolean(_) => return Err(bad("a string or number")),
            _ if !takes_value => return Err(bad("true or false")),
            toml::Value::String(s) => args.extend([flag, s.into()]),
            toml::Value::Integer(n) => args.extend([flag, n.to_string().into()]),
            toml::Value::Array(items) => {
                let parts: Option<Vec<String>> = items
                    .iter()
                    .map(|v| match v {
                        toml::Value::String(s) => Some(s.clone()),
                        toml::Value::Integer(n) => Some(n.to_string()),
                        _ => None,
                    })
                    .collect();
                let parts = parts.ok_or_else(|| bad("a list of strings"))?;
                args.extend([flag, parts.join(",").into()]);
            }
            _ => return Err(bad("a string, number, list or boolean")),
        }
    }
    Ok(args)
}

/// `serve` arguments with the file under the command line: `cli` is what
/// followed `serve` on the command line.
pub fn with_file(path: &Path, cli: Vec<OsString>) -> anyhow::Result<ServeArgs> {
    let cmd = serve_command();
    let mut argv = vec![OsString::from("kairos serve")];
    argv.extend(file_args(path, &cmd)?);
    argv.extend(cli);
    let matches = cmd.try_get_matches_from(argv)?;
    Ok(ServeArgs::from_arg_matches(&matches)?)
}

/// The command-line arguments after `serve`.
pub fn serve_cli_args() -> Vec<OsString> {
    let all: Vec<OsString> = std::env::args_os().collect();
    let at = all
        .iter()
        .position(|a| a == "serve")
        .map_or(all.len(), |i| i + 1);
    all[at..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        use std::io::Write;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn every_flag_has_a_key_and_flags_beat_the_file() {
        let f = file(
            "id = 3\nlisten = \"127.0.0.1:9070\"\npeers = [\"1=127.0.0.1:9170\", \"3=127.0.0.1:9173\"]\n\
             insecure = true\nheartbeat_ms = 50\nelection_min_ms = 200\nadmit_max_commands = 7\n\
             admit_max_kb = 64\nadmit_max_backlog = 9\nadmit_max_backlog_ms = 700\n\
             admit_max_wait_ms = 250\nadmit_max_fire_lag_ms = 1500\nadmit_write_target_ms = 0\nlog_format = \"json\"\n",
        );
        let a = with_file(f.path(), vec!["--heartbeat-ms".into(), "60".into()]).unwrap();
        assert_eq!(a.id, 3);
        assert_eq!(a.listen.to_string(), "127.0.0.1:9070");
        assert_eq!(a.peers, vec!["1=127.0.0.1:9170", "3=127.0.0.1:9173"]);
        assert!(a.insecure);
        assert_eq!(a.heartbeat_ms, 60, "the flag wins over the file");
        assert_eq!(a.election_min_ms, 200);
        assert_eq!(a.log_format, crate::LogFormat::Json);
        assert_eq!(a.election_max_ms, 500, "the default when neither sets it");
        assert_eq!(
            (a.admit_max_fire_lag_ms, a.admit_write_target_ms),
            (1500, 0)
        );
        assert_eq!(
            (
                a.admit_max_commands,
                a.admit_max_kb,
                a.admit_max_backlog,
                a.admit_max_backlog_ms,
                a.admit_max_wait_ms
            ),
            (7, 64, 9, 700, 250)
        );
    }

    #[test]
    fn unknown_keys_and_wrong_shapes_are_errors_naming_the_key() {
        for (text, want) in [
            ("listn = \"x\"", "unknown key \"listn\""),
            (
                "insecure = \"yes\"",
                "key \"insecure\" must be true or false",
            ),
            ("id = true", "key \"id\" must be a string or number"),
            ("peers = [1.5]", "key \"peers\" must be a list of strings"),
            ("id = ", "not valid TOML"),
        ] {
            let e = with_file(file(text).path(), vec![]).unwrap_err();
            assert!(format!("{e:#}").contains(want), "{text}: {e:#}");
        }
        let e = with_file(file("id = \"x\"").path(), vec![]).unwrap_err();
        assert!(format!("{e:#}").contains("id"), "{e:#}");
    }
}
