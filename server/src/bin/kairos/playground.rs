//! `kairos playground --nodes N`: a local cluster of child processes with
//! temporary data directories, a demo job and a built-in worker that prints
//! every fire, until Ctrl-C. It runs the way production should: certificates
//! from `certs init` on both listeners and an admin token, and it prints the
//! environment that points `kairosctl` at it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use clap::Args;
use kairos_client::worker::{now_ms, Outcome, Task, Worker};
use kairos_client::{pb, Client, Security};

#[derive(Args)]
pub struct PlaygroundArgs {
    /// Number of nodes (1, 3 or 5).
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// First gRPC port; node i listens on base+i, its HTTP port on
    /// base+100+i and its peer port on base+200+i.
    #[arg(long, default_value_t = 7170)]
    base_port: u16,
    /// Interval of the demo job.
    #[arg(long, default_value_t = 2000)]
    every_ms: u64,
}

struct Children(Vec<tokio::process::Child>, PathBuf);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

pub async fn run(a: PlaygroundArgs) -> anyhow::Result<()> {
    anyhow::ensure!(matches!(a.nodes, 1 | 3 | 5), "--nodes: 1, 3 or 5");
    let dir = std::env::temp_dir().join(format!("kairos-playground-{}", std::process::id()));
    let addrs: Vec<String> = (1..=a.nodes)
        .map(|i| format!("127.0.0.1:{}", a.base_port + i as u16))
        .collect();
    let peer_addr = |id: u64| format!("127.0.0.1:{}", a.base_port + 200 + id as u16);
    let peers: Vec<String> = (1..=a.nodes)
        .map(|id| format!("{id}={}", peer_addr(id)))
        .collect();
    let exe = std::env::current_exe()?;
    let mut children = Children(Vec::new(), dir.clone());
    let certs = dir.join("certs");
    kairos_server::tls::init(&certs, a.nodes, &[])?;
    let token = {
        use rand::RngCore;
        let mut b = [0u8; 24];
        rand::rngs::OsRng.fill_bytes(&mut b);
        format!(
            "playground-{}",
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        )
    };
    let token_file = dir.join("admin.token");
    std::fs::write(&token_file, format!("{token}\n"))?;
    let security = Security {
        ca_pem: Some(std::fs::read(certs.join(kairos_server::tls::CA_CERT))?),
        token: Some(token.clone()),
    };
    for (i, addr) in addrs.iter().enumerate() {
        let id = i + 1;
        let log = std::fs::File::create({
            std::fs::create_dir_all(&dir)?;
            dir.join(format!("node{id}.log"))
        })?;
        let child = tokio::process::Command::new(&exe)
            .args(["serve", "--id", &id.to_string(), "--listen", addr])
            .args(["--peer-listen", &peer_addr(id as u64)])
            .args([
                "--http",
                &format!("127.0.0.1:{}", a.base_port + 100 + id as u16),
            ])
            .arg("--data-dir")
            .arg(dir.join(format!("node{id}")))
            .args(["--peers", &peers.join(",")])
            .arg("--tls-dir")
            .arg(&certs)
            .arg("--auth-token-file")
            .arg(&token_file)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        children.0.push(child);
    }
    println!(
        "started {} nodes: {} (logs in {})",
        a.nodes,
        addrs.join(", "),
        dir.display()
    );
    let client = Client::new(addrs.clone())
        .with_retry_for(Duration::from_secs(30))
        .with_security(security.clone());
    // Until the first admin token is committed, calls are refused: keep asking.
    let leader = loop {
        match client.status().await {
            Ok(s) if s.leader != 0 => break s.leader,
            Ok(_) => {}
            Err(e) if e.code() == tonic::Code::Unauthenticated => {}
            Err(e) => return Err(e.into()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("leader: node {leader}");
    let spec = pb::JobSpec {
        id: "demo".into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::EveryMs(a.every_ms)),
        }),
        group: "demo".into(),
        payload: b"hello from kairos".to_vec(),
        ..Default::default()
    };
    let req = pb::CreateJobRequest { spec: Some(spec) };
    client
        .jobs(|mut j| {
            let r = req.clone();
            async move { j.create_job(r).await }
        })
        .await?;
    println!(
        "created job \"demo\" firing every {} ms in group \"demo\"",
        a.every_ms
    );
    println!("TLS and tokens are on. To use kairosctl against this cluster:");
    println!("  export KAIROS_ENDPOINTS={}", addrs.join(","));
    println!(
        "  export KAIROS_CA={}",
        certs.join(kairos_server::tls::CA_CERT).display()
    );
    println!("  export KAIROS_TOKEN={token}");
    println!("  kairosctl runs list --job demo");
    println!("kill a node (see `kairosctl cluster status`) and watch the fires go on. Ctrl-C stops everything.");
    let worker = Worker::connect(addrs, "demo")
        .capacity(4)
        .id("playground-worker")
        .security(security);
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    worker
        .run_until(
            |t: Task| async move {
                let sched = chrono::DateTime::from_timestamp_millis(t.scheduled_at_ms)
                    .map(|d| d.format("%H:%M:%S%.3f").to_string());
                println!(
                    "fired {} scheduled {} attempt {} received {:+} ms after schedule",
                    t.run_id,
                    sched.unwrap_or_default(),
                    t.attempt,
                    t.received_at_ms - t.scheduled_at_ms
                );
                Outcome::Success(format!("done at {}", now_ms()).into_bytes())
            },
            shutdown,
        )
        .await?;
    println!("stopping");
    drop(children);
    Ok(())
}
