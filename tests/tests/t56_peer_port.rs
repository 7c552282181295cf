//! Issue #10: the internal peer service lives on its own listener. On the
//! public port a Raft message is `UNIMPLEMENTED` and changes nothing (before,
//! one 12-byte Vote there forced an election). On the peer port a blob that
//! announces a huge allocation is refused as undecodable and the node lives on.

use std::time::Duration;

use kairos_client::channel;
use kairos_proto::peer::{peer_client::PeerClient, Blob};
use kairos_tests::Cluster;
use tonic::Code;

/// A bincode varint announcing a length of u64::MAX, and nothing after it.
fn length_bomb() -> Vec<u8> {
    let mut b = vec![0xFF];
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_rpc_is_not_served_on_the_public_port_and_bad_blobs_are_refused() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    cluster.wait_converged(leader, &[1, 2, 3]).await;

    for n in &cluster.nodes {
        let mut public = PeerClient::new(channel(&n.addr).unwrap());
        let blob = || Blob { data: vec![0; 12] };
        let vote = public.vote(blob()).await.unwrap_err();
        assert_eq!(
            vote.code(),
            Code::Unimplemented,
            "node {} vote: {vote:?}",
            n.id
        );
        let append = public.append_entries(blob()).await.unwrap_err();
        assert_eq!(
            append.code(),
            Code::Unimplemented,
            "node {}: {append:?}",
            n.id
        );
        let snap = public.install_snapshot(blob()).await.unwrap_err();
        assert_eq!(snap.code(), Code::Unimplemented, "node {}: {snap:?}", n.id);
    }

    // The peer port decodes with a limit: an error, not an abort.
    let target = cluster.node(leader).peer.clone();
    let mut peer = PeerClient::new(channel(&target).unwrap());
    for _ in 0..3 {
        let err = peer
            .append_entries(Blob {
                data: length_bomb(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        let err = peer
            .vote(Blob {
                data: length_bomb(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    }

    // Every node still serves and agrees.
    cluster.wait_converged(leader, &[1, 2, 3]).await;
    let s = cluster.client().status().await.unwrap();
    assert_ne!(s.leader, 0);
    for n in &s.nodes {
        assert_eq!(
            n.addr,
            cluster.node(n.id).addr,
            "public address learned for {}",
            n.id
        );
        assert_eq!(n.peer_addr, cluster.node(n.id).peer);
    }
    tokio::time::timeout(Duration::from_secs(10), cluster.client_of(leader).status())
        .await
        .expect("the leader answers")
        .expect("status");
}
