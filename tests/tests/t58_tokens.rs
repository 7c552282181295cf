//! Issue #10: tokens and roles on a TLS cluster started with
//! `--auth-token-file`. No token is `UNAUTHENTICATED`; a reader may read but
//! not create (`PERMISSION_DENIED` naming the role); a worker token for group
//! `a` cannot open a session for `b`; a revoked token is refused by every
//! node; a finish from a second worker session for an attempt leased to the
//! first is refused; the dashboard needs a reader token while `/metrics`
//! stays open.

use std::time::{Duration, Instant};

use kairos_client::pb::{self, cluster_client::ClusterClient, worker_message::Msg as Out};
use kairos_client::{Client, Security};
use kairos_server::core::command::LOG_FORMAT;
use kairos_tests::{create, every_job, job_history, wait_for, Cluster};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

async fn new_token(c: &Client, name: &str, role: &str, groups: &[&str]) -> String {
    let req = pb::CreateTokenRequest {
        name: name.into(),
        role: role.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    };
    let r = c
        .call(|ch| {
            let req = req.clone();
            async move { ClusterClient::new(ch).create_token(req).await }
        })
        .await
        .expect("admin creates a token");
    assert!(r.secret.starts_with("kairos_"), "{r:?}");
    r.secret
}

fn as_token(cluster: &Cluster, endpoints: Vec<String>, token: Option<&str>) -> Client {
    let sec = Security {
        ca_pem: cluster.security.ca_pem.clone(),
        token: token.map(str::to_string),
    };
    Client::new(endpoints)
        .with_retry_for(Duration::from_secs(2))
        .with_security(sec)
}

/// Opens a worker session presenting `token`; the stream stays open while `tx` lives.
async fn session(
    cluster: &Cluster,
    token: &str,
    id: &str,
    groups: &[&str],
) -> Result<
    (
        mpsc::Sender<pb::WorkerMessage>,
        tonic::Streaming<pb::ServerMessage>,
    ),
    tonic::Status,
> {
    let leader = cluster.wait_leader().await;
    let sec = Security {
        ca_pem: cluster.security.ca_pem.clone(),
        token: Some(token.to_string()),
    };
    let ch = kairos_client::channel_with(&cluster.node(leader).addr, &sec)?;
    let mut client = pb::workers_client::WorkersClient::with_interceptor(ch, sec.auth()?);
    let (tx, rx) = mpsc::channel(16);
    let hello = pb::Hello {
        worker_id: id.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        capacity: 1,
        ..Default::default()
    };
    tx.send(pb::WorkerMessage {
        msg: Some(Out::Hello(hello)),
    })
    .await
    .unwrap();
    let inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
    Ok((tx, inbound))
}

async fn next(inbound: &mut tonic::Streaming<pb::ServerMessage>) -> pb::server_message::Msg {
    tokio::time::timeout(Duration::from_secs(30), inbound.message())
        .await
        .expect("a message within 30 s")
        .expect("stream healthy")
        .expect("stream open")
        .msg
        .expect("a message body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_are_enforced_and_a_revoke_holds_on_every_node() {
    let cluster = Cluster::start_secure(3, &[]);
    cluster.wait_leader().await;
    let admin = cluster.client();

    let anonymous = as_token(&cluster, cluster.endpoints(), None);
    let e = anonymous.status().await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("missing token"), "{e:?}");
    let forged = as_token(
        &cluster,
        cluster.endpoints(),
        Some("kairos_not-a-real-token"),
    );
    assert_eq!(
        forged.status().await.unwrap_err().code(),
        Code::Unauthenticated
    );

    let reader_secret = new_token(&admin, "dash", "reader", &[]).await;
    let operator_secret = new_token(&admin, "ops", "operator", &[]).await;
    let reader = as_token(&cluster, cluster.endpoints(), Some(&reader_secret));
    let operator = as_token(&cluster, cluster.endpoints(), Some(&operator_secret));

    let e = create(&reader, every_job("nope", "g", 1000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("role reader"), "{e:?}");
    create(&operator, every_job("yes", "g", 1000))
        .await
        .unwrap();
    let jobs = reader
        .jobs(|mut j| async move { j.list_jobs(pb::ListJobsRequest::default()).await })
        .await
        .expect("a reader lists jobs");
    assert_eq!(
        jobs.jobs.len(),
        1,
        "only the operator's job exists: {jobs:?}"
    );
    // An operator cannot manage tokens.
    let e = operator
        .call(|ch| async move {
            ClusterClient::new(ch)
                .list_tokens(pb::ListTokensRequest {})
                .await
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // Revoke: every node refuses the token soon after the leader commits it.
    admin
        .call(|ch| async move {
            ClusterClient::new(ch)
                .revoke_token(pb::RevokeTokenRequest {
                    name: "dash".into(),
                })
                .await
        })
        .await
        .unwrap();
    let start = Instant::now();
    for n in &cluster.nodes {
        let at_node = as_token(&cluster, vec![n.addr.clone()], Some(&reader_secret));
        wait_for(
            &format!("node {} to refuse the revoked token", n.id),
            Duration::from_secs(2),
            || {
                // Status is answered by the node itself, with its own replica's tokens.
                let c = at_node.clone();
                async move {
                    let r = c.status().await;
                    matches!(r, Err(e) if e.code() == Code::Unauthenticated).then_some(())
                }
            },
        )
        .await;
    }
    eprintln!("revoke refused on all nodes after {:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_tokens_are_limited_to_their_groups_and_finishes_to_the_lease_holder() {
    let cluster = Cluster::start_secure(1, &[]);
    cluster.wait_leader().await;
    let admin = cluster.client();
    let worker_secret = new_token(&admin, "w-a", "worker", &["a"]).await;

    let e = session(&cluster, &worker_secret, "w1", &["b"])
        .await
        .expect_err("a worker token for a cannot serve b");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("not \"b\""), "{e:?}");

    let (tx1, mut in1) = session(&cluster, &worker_secret, "w1", &["a"])
        .await
        .unwrap();
    assert!(matches!(
        next(&mut in1).await,
        pb::server_message::Msg::Welcome(_)
    ));
    let spec = pb::JobSpec {
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::AfterMs(100)),
        }),
        ..every_job("once", "a", 1)
    };
    create(&admin, spec).await.unwrap();
    let pb::server_message::Msg::Assignment(a) = next(&mut in1).await else {
        panic!("expected an assignment");
    };

    // A second session (same token, another worker id) claims the finish.
    let (tx2, mut in2) = session(&cluster, &worker_secret, "w2", &["a"])
        .await
        .unwrap();
    assert!(matches!(
        next(&mut in2).await,
        pb::server_message::Msg::Welcome(_)
    ));
    let finish = pb::Finish {
        run_id: a.run_id.clone(),
        attempt: a.attempt,
        success: true,
        result: b"forged".to_vec(),
        ..Default::default()
    };
    tx2.send(pb::WorkerMessage {
        msg: Some(Out::Finish(finish.clone())),
    })
    .await
    .unwrap();
    let pb::server_message::Msg::FinishAck(ack) = next(&mut in2).await else {
        panic!("expected a finish ack");
    };
    assert!(!ack.accepted, "{ack:?}");
    assert!(
        ack.error.contains("leased to another worker session"),
        "{ack:?}"
    );

    // The lease holder's own finish is taken.
    tx1.send(pb::WorkerMessage {
        msg: Some(Out::Finish(pb::Finish {
            result: b"real".to_vec(),
            ..finish
        })),
    })
    .await
    .unwrap();
    let pb::server_message::Msg::FinishAck(ack) = next(&mut in1).await else {
        panic!("expected a finish ack");
    };
    assert!(ack.accepted, "{ack:?}");
    let run = admin.list_runs("once", 1).await.unwrap().remove(0);
    assert_eq!(run.result, b"real");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_api_needs_a_reader_token_and_metrics_stay_open() {
    use std::io::{Read, Write};
    let cluster = Cluster::start_secure(1, &[]);
    cluster.wait_leader().await;
    let reader = new_token(&cluster.client(), "dash", "reader", &[]).await;
    let get = |path: &str, auth: Option<&str>| {
        let mut s = std::net::TcpStream::connect(&cluster.node(1).http).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let auth = auth
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n{auth}\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
    };
    // The console page is static (no data in it); its API needs the token.
    assert!(get("/", None).starts_with("HTTP/1.0 200"));
    let refused = get("/api/cluster", None);
    assert!(refused.starts_with("HTTP/1.0 401"), "{refused}");
    assert!(refused.contains("missing token"), "{refused}");
    assert!(get("/api/cluster", Some("kairos_wrong")).starts_with("HTTP/1.0 401"));
    let page = get("/api/cluster", Some(&reader));
    assert!(page.starts_with("HTTP/1.0 200"), "{page}");
    assert!(get("/metrics", None).starts_with("HTTP/1.0 200"));
    assert!(get("/healthz", None).starts_with("HTTP/1.0 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_history_names_the_token_behind_each_change() {
    let cluster = Cluster::start_secure(1, &[]);
    let leader = cluster.wait_leader().await;
    // From log format 5 the job holds its create's record until it changes.
    cluster.wait_log_format(leader, LOG_FORMAT).await;
    let admin = cluster.client();
    let ops = as_token(
        &cluster,
        cluster.endpoints(),
        Some(&new_token(&admin, "ops", "operator", &[]).await),
    );
    create(&ops, every_job("nightly", "g", 60_000))
        .await
        .unwrap();
    assert_eq!(
        job_history(&ops, "nightly").await,
        vec![(1, "create".into(), "ops".into())]
    );
    let paused = admin
        .jobs(|mut j| async move {
            j.pause_job(pb::PauseJobRequest {
                id: "nightly".into(),
                note: "freeze".into(),
            })
            .await
        })
        .await
        .unwrap();
    assert_eq!(
        (paused.pause_note.as_str(), paused.paused_by.as_str()),
        ("freeze", "admin")
    );
    // The cluster-wide firing switch is the admin's, and names who set it.
    let e = pause_firing(&ops).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let f = pause_firing(&admin).await.unwrap();
    assert_eq!((f.paused, f.by.as_str()), (true, "admin"));
    assert_eq!(
        job_history(&ops, "nightly").await,
        vec![
            (1, "create".into(), "ops".into()),
            (2, "pause".into(), "admin".into())
        ]
    );
}

async fn pause_firing(c: &Client) -> Result<pb::FiringStatus, tonic::Status> {
    let req = pb::PauseFiringRequest {
        note: "incident".into(),
    };
    c.call(|ch| {
        let req = req.clone();
        async move { ClusterClient::new(ch).pause_firing(req).await }
    })
    .await
}
