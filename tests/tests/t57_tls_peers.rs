//! Issue #10: with `--tls-dir` both listeners speak TLS and the peer listener
//! is mutual TLS. A cluster with TLS and tokens fires and fails over; a plain
//! client, or one without a token, gets nowhere; on the peer port a client without a certificate, or with one
//! from another CA, fails the handshake; the cluster's own client
//! certificate is not a node's; and node 3's certificate cannot send Raft
//! messages as node 2 (refused, term unchanged).

use std::path::Path;
use std::time::Duration;

use kairos_client::{pb, Client};
use kairos_proto::peer::{peer_client::PeerClient, Blob, LocalStatusRequest};
use kairos_server::core::codec::encode;
use kairos_server::raft::TypeConfig;
use kairos_tests::{certs_init, create, every_job, wait_for, Cluster};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::Vote;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

/// A channel to a peer listener, presenting `identity` (or no certificate).
fn peer_channel(addr: &str, ca: &Path, identity: Option<(&Path, &Path)>, target: u64) -> Channel {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
        .domain_name(format!("node-{target}.kairos-peer"));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(cert).unwrap(),
            std::fs::read(key).unwrap(),
        ));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .connect_lazy()
}

fn as_sender<T>(msg: T, node: u64) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("x-kairos-node", node.to_string().parse().unwrap());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_with_tokens_fires_and_fails_over_and_plain_clients_get_nowhere() {
    let mut cluster = Cluster::start_secure(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    create(&c, every_job("tick", "g", 200)).await.unwrap();
    let fired = |c: Client| async move {
        c.list_runs("tick", 1000)
            .await
            .map(|r| r.len())
            .unwrap_or(0)
    };
    wait_for("fires over TLS", Duration::from_secs(30), || {
        let c = c.clone();
        async move { (fired(c).await >= 5).then_some(()) }
    })
    .await;

    let plain = Client::new(cluster.endpoints()).with_retry_for(Duration::from_millis(500));
    assert!(
        plain.status().await.is_err(),
        "a plain-TCP client was served"
    );

    cluster.kill(leader);
    let new_leader = wait_for("a new leader", Duration::from_secs(60), || async {
        let s = cluster.client().status().await.ok()?;
        s.nodes
            .iter()
            .find(|n| n.role == "leader" && n.id != leader)
            .map(|n| n.id)
    })
    .await;
    let before = fired(c.clone()).await;
    wait_for("fires after the failover", Duration::from_secs(30), || {
        let c = c.clone();
        async move { (fired(c).await >= before + 5).then_some(()) }
    })
    .await;
    let runs = c.list_runs("tick", 10_000).await.unwrap();
    kairos_tests::assert_no_gap_no_double(&runs, 200);
    assert_ne!(new_leader, leader);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_admits_only_cluster_nodes_speaking_as_themselves() {
    let cluster = Cluster::start_tls(3, &[]);
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let term = cluster.wait_converged(leader, &[1, 2, 3]).await[0].term;
    let certs = cluster.tls_dir.clone().unwrap();
    let ca = certs.join("ca.crt");
    let target = cluster.node(follower).peer.clone();

    // No client certificate: the handshake fails. (With TLS 1.3 the client
    // learns it when the server closes the connection: a transport error,
    // never an answer from the service.)
    let mut anon = PeerClient::new(peer_channel(&target, &ca, None, follower));
    let e = anon
        .local_status(as_sender(LocalStatusRequest::default(), 2))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        ),
        "without a certificate: {e:?}"
    );

    // A certificate from another CA: refused too.
    let other = tempfile::tempdir().unwrap();
    certs_init(other.path(), 3);
    let foreign = (
        other.path().join("node-2.crt"),
        other.path().join("node-2.key"),
    );
    let mut stranger = PeerClient::new(peer_channel(
        &target,
        &ca,
        Some((&foreign.0, &foreign.1)),
        follower,
    ));
    let e = stranger
        .local_status(as_sender(LocalStatusRequest::default(), 2))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        ),
        "another CA's certificate: {e:?}"
    );

    // The cluster's client certificate is not a node's.
    let client_id = (certs.join("client.crt"), certs.join("client.key"));
    let mut client_cert = PeerClient::new(peer_channel(
        &target,
        &ca,
        Some((&client_id.0, &client_id.1)),
        follower,
    ));
    let e = client_cert
        .local_status(as_sender(LocalStatusRequest::default(), 2))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // Node 3's certificate (or any node's but 2's) speaking as node 2.
    let imposter_id = (1..=3).find(|id| *id != 2 && *id != follower).unwrap();
    let imposter = (
        certs.join(format!("node-{imposter_id}.crt")),
        certs.join(format!("node-{imposter_id}.key")),
    );
    let mut imposter_rpc = PeerClient::new(peer_channel(
        &target,
        &ca,
        Some((&imposter.0, &imposter.1)),
        follower,
    ));
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term + 50, 2),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let vote = VoteRequest::<u64> {
        vote: Vote::new(term + 50, 2),
        last_log_id: None,
    };
    for claimed_header in [2, imposter_id] {
        let e = imposter_rpc
            .append_entries(as_sender(
                Blob {
                    data: encode(&append),
                },
                claimed_header,
            ))
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Code::PermissionDenied,
            "header {claimed_header}: {e:?}"
        );
        let e = imposter_rpc
            .vote(as_sender(
                Blob {
                    data: encode(&vote),
                },
                claimed_header,
            ))
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Code::PermissionDenied,
            "header {claimed_header}: {e:?}"
        );
    }
    // The same certificate speaking as itself is a node of the cluster.
    let own = imposter_rpc
        .local_status(as_sender(LocalStatusRequest::default(), imposter_id))
        .await
        .expect("a node's own certificate is admitted");
    assert_eq!(own.get_ref().id, follower);

    // Had a forged message been taken, the term would be at least term + 50
    // (a loaded box may still hold an ordinary election meanwhile).
    let after = cluster.wait_converged(leader, &[1, 2, 3]).await;
    assert!(
        after.iter().all(|n| n.term < term + 50),
        "forged term taken: {after:?}"
    );
    let s: pb::StatusResponse = cluster.client().status().await.unwrap();
    assert_ne!(s.leader, 0);
}
