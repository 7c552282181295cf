//! `kairosctl job graph ID`: a job's upstreams (above) and downstreams
//! (below) as text trees, each job with the state of its last run and, for
//! a job of a workflow, what its cycle waits for.

use std::collections::BTreeSet;

use kairos_client::{pb, Client};

use crate::run_state;

/// Jobs one graph looks up at most (two calls each).
const GRAPH_JOBS_MAX: usize = 64;

struct Walk<'a> {
    c: &'a Client,
    looked: usize,
    lines: Vec<String>,
}

impl Walk<'_> {
    async fn job(&mut self, id: &str) -> anyhow::Result<Option<pb::Job>> {
        if self.looked >= GRAPH_JOBS_MAX {
            return Ok(None);
        }
        self.looked += 1;
        let req = pb::JobRef { id: id.to_string() };
        Ok(Some(
            self.c
                .jobs(|mut j| {
                    let r = req.clone();
                    async move { j.get_job(r).await }
                })
                .await?,
        ))
    }

    async fn label(&self, j: &pb::Job) -> String {
        let id = j.spec.as_ref().map(|s| s.id.clone()).unwrap_or_default();
        let req = pb::JobRef { id: id.clone() };
        let last = self
            .c
            .jobs(|mut c| {
                let r = req.clone();
                async move { c.job_stats(r).await }
            })
            .await
            .ok()
            .and_then(|s| s.last_run)
            .map_or("no run".to_string(), |r| {
                format!("last run {}", run_state(r.state))
            });
        let mut text = format!("{id} [{}, {last}]", j.state);
        if !j.workflow_state.is_empty() {
            text.push_str(&format!(" {}", j.workflow_state));
        }
        text
    }

    /// Lines for `ids` and, recursively, their neighbours (`up`: upstreams).
    async fn tree(
        &mut self,
        ids: Vec<String>,
        up: bool,
        indent: &str,
        seen: &mut BTreeSet<String>,
    ) -> anyhow::Result<()> {
        let n = ids.len();
        for (i, id) in ids.into_iter().enumerate() {
            let (branch, next) = if i + 1 == n {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            if !seen.insert(id.clone()) {
                self.lines
                    .push(format!("{indent}{branch}{id} (shown above)"));
                continue;
            }
            let Some(j) = self.job(&id).await? else {
                self.lines.push(format!(
                    "{indent}{branch}… (more than {GRAPH_JOBS_MAX} jobs)"
                ));
                return Ok(());
            };
            let label = self.label(&j).await;
            self.lines.push(format!("{indent}{branch}{label}"));
            let more = if up {
                j.spec.map(|s| s.upstream).unwrap_or_default()
            } else {
                j.downstream
            };
            Box::pin(self.tree(more, up, &format!("{indent}{next}"), seen)).await?;
        }
        Ok(())
    }
}

pub async fn print(c: &Client, id: &str) -> anyhow::Result<()> {
    let mut w = Walk {
        c,
        looked: 0,
        lines: Vec::new(),
    };
    let Some(job) = w.job(id).await? else {
        return Ok(());
    };
    let label = w.label(&job).await;
    let ups = job
        .spec
        .as_ref()
        .map(|s| s.upstream.clone())
        .unwrap_or_default();
    w.lines.push(label.to_string());
    w.lines.push("upstream:".into());
    if ups.is_empty() {
        w.lines.push("   (none)".into());
    }
    w.tree(ups, true, "   ", &mut BTreeSet::from([id.to_string()]))
        .await?;
    w.lines.push("downstream:".into());
    if job.downstream.is_empty() {
        w.lines.push("   (none)".into());
    }
    w.tree(
        job.downstream.clone(),
        false,
        "   ",
        &mut BTreeSet::from([id.to_string()]),
    )
    .await?;
    println!("{}", w.lines.join("\n"));
    Ok(())
}
