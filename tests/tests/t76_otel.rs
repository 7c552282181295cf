//! Spans exported over OTLP (`--otlp-endpoint`): a collector in this test
//! process (the OTLP TraceService over real gRPC) receives the fire,
//! dispatch and finish spans of one run, with its fields and the node that
//! led, flushed by the graceful stop; with no collector listening the
//! cluster runs on and counts the spans it drops; an endpoint it cannot
//! use is refused at start.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_client::pb;
use kairos_client::worker::{Outcome, Task, Worker};
use kairos_tests::{
    create, every_job, free_port, kairos_bin, once_job, outcome, wait_for, Cluster,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use tonic::{Request, Response, Status};

/// One received span: its name, attributes and its resource's attributes.
#[derive(Clone, Debug)]
struct Got {
    name: String,
    attrs: BTreeMap<String, String>,
    resource: BTreeMap<String, String>,
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    let text = |kv: &KeyValue| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        other => format!("{other:?}"),
    };
    kvs.iter().map(|kv| (kv.key.clone(), text(kv))).collect()
}

#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Got>>>);

impl Collector {
    fn spans(&self) -> Vec<Got> {
        self.0.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut got = self.0.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let resource = attributes(&rs.resource.unwrap_or_default().attributes);
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                got.push(Got {
                    name: span.name,
                    attrs: attributes(&span.attributes),
                    resource: resource.clone(),
                });
            }
        }
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A collector serving on a loopback port: its `http://` URL.
async fn start_collector() -> (String, Collector) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", free_port()))
        .await
        .expect("bind the collector");
    let url = format!("http://{}", listener.local_addr().unwrap());
    let collector = Collector::default();
    let serve = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(collector.clone()))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(serve);
    (url, collector)
}

fn start_worker(cluster: &Cluster, group: &str, id: &str) -> tokio::task::JoinHandle<()> {
    let worker = Worker::connect(cluster.endpoints(), group).id(id);
    tokio::spawn(async move {
        let _ = worker
            .run(|_: Task| async { Outcome::Success(b"ok".to_vec()) })
            .await;
    })
}

fn succeeded(runs: &[pb::Run]) -> usize {
    let ok = pb::RunState::Succeeded as i32;
    runs.iter().filter(|r| r.state == ok).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_spans_reach_the_collector_with_its_fields_flushed_at_shutdown() {
    let (url, collector) = start_collector().await;
    // Spans go out every hour or per 512: what arrives was flushed by the
    // graceful stop. Node 3 learns the endpoint from the standard variable.
    let mut cluster = Cluster::start_each(3, &["--otlp-service-name", "kairos-t76"], &|n| {
        n.env
            .push(("OTEL_BSP_SCHEDULE_DELAY".into(), "3600000".into()));
        match n.id {
            3 => n
                .env
                .push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), url.clone())),
            _ => n.args.extend(["--otlp-endpoint".into(), url.clone()]),
        }
    });
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    let worker = start_worker(&cluster, "otel", "w-otel");
    create(&c, once_job("traced", "otel")).await.unwrap();
    let run = wait_for("the run to succeed", Duration::from_secs(60), || async {
        let runs = c.list_runs("traced", 1).await.ok()?;
        (succeeded(&runs) == 1).then(|| runs[0].clone())
    })
    .await;
    worker.abort();
    assert!(collector.spans().is_empty(), "{:#?}", collector.spans());

    let ids: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();
    for id in ids {
        let status = cluster.terminate(id, Duration::from_secs(30));
        assert!(status.is_some_and(|s| s.success()), "node {id}: {status:?}");
    }

    let spans = collector.spans();
    let of_run: Vec<&Got> = spans
        .iter()
        .filter(|s| s.attrs.get("run") == Some(&run.run_id))
        .collect();
    let mut names: Vec<&str> = of_run.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["run.dispatch", "run.finish", "run.fire"],
        "{of_run:#?}"
    );
    for s in &of_run {
        let worker = if s.name == "run.fire" { "" } else { "w-otel" };
        let want = [
            ("attempt", "1"),
            ("job", "traced"),
            ("group", "otel"),
            ("worker", worker),
        ];
        for (k, v) in want {
            assert_eq!(s.attrs.get(k).map(String::as_str), Some(v), "{k}: {s:#?}");
        }
        let node = leader.to_string();
        let resource = [
            ("service.name", "kairos-t76"),
            ("kairos.node.id", node.as_str()),
            ("service.instance.id", node.as_str()),
        ];
        for (k, v) in resource {
            assert_eq!(
                s.resource.get(k).map(String::as_str),
                Some(v),
                "{k}: {s:#?}"
            );
        }
    }
    // The client write that created the job, on the leader.
    let write = spans
        .iter()
        .find(|s| s.name == "client_write" && s.attrs.get("rpc").is_some_and(|r| r == "create_job"))
        .unwrap_or_else(|| panic!("no create_job write span: {spans:#?}"));
    assert_eq!(write.resource["kairos.node.id"], leader.to_string());

    let log = std::fs::read_to_string(cluster.node(3).data.with_extension("log")).unwrap();
    assert!(
        log.contains("exporting spans over OTLP") && log.contains(&url),
        "node 3 took the endpoint from OTEL_EXPORTER_OTLP_ENDPOINT: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_collector_runs_go_on_and_the_dropped_spans_are_counted() {
    // Nothing listens there.
    let url = format!("http://127.0.0.1:{}", free_port());
    let cluster = Cluster::start_each(3, &["--otlp-endpoint", &url], &|n| {
        n.env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()));
    });
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    let _worker = start_worker(&cluster, "otel", "w-otel");
    create(&c, every_job("tick", "otel", 300)).await.unwrap();
    wait_for("three runs to succeed", Duration::from_secs(60), || async {
        let runs = c.list_runs("tick", 20).await.ok()?;
        (succeeded(&runs) >= 3).then_some(())
    })
    .await;
    // Fire, dispatch and finish of three runs at least, none sent.
    let dropped = "kairos_otel_spans_dropped_total";
    wait_for(
        "the dropped spans counted",
        Duration::from_secs(30),
        || async { (cluster.metric(leader, dropped)? >= 9.0).then_some(()) },
    )
    .await;
    // Said once in the log, not once per batch.
    let log = std::fs::read_to_string(cluster.node(leader).data.with_extension("log")).unwrap();
    assert_eq!(log.matches("span export failed").count(), 1, "{log}");
}

#[test]
fn an_endpoint_other_than_plain_http_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(kairos_bin())
        .args([
            "serve",
            "--otlp-endpoint",
            "https://collector:4317",
            "--data-dir",
        ])
        .arg(dir.path().join("d"))
        .output()
        .expect("run kairos");
    let (ok, text) = outcome(&out);
    assert!(
        !ok && text
            .contains("--otlp-endpoint \"https://collector:4317\": must be http://HOST:PORT"),
        "{text}"
    );
    assert!(
        !dir.path().join("d").exists(),
        "nothing was created: {text}"
    );
}
