//! `kairos-lazyfs mount --mountpoint DIR --control SOCKET [--seed N]
//! [--size-mb N]`: runs the lazy filesystem in the foreground until SIGTERM
//! or SIGINT. A mount that cannot be made exits 1 with the reason.

use clap::{Parser, Subcommand};
use kairos_lazyfs::daemon;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "kairos-lazyfs",
    about = "A FUSE filesystem that forgets what no fsync covered"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount an empty lazy filesystem and serve its control socket.
    Mount {
        #[arg(long)]
        mountpoint: PathBuf,
        /// Unix socket for the control commands (power, disk-full, ...).
        #[arg(long)]
        control: PathBuf,
        /// Seeds the torn-write lengths.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Capacity statfs reports and writes are held to.
        #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
        size_mb: u64,
    },
}

fn main() {
    let Cmd::Mount {
        mountpoint,
        control,
        seed,
        size_mb,
    } = Cli::parse().cmd;
    let cfg = daemon::Config {
        mountpoint,
        control,
        seed,
        size_mb,
    };
    if let Err(e) = daemon::run(&cfg) {
        eprintln!("kairos-lazyfs: {e}");
        std::process::exit(1);
    }
}
