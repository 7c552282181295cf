//! `job apply -f FILE` and `job export`: a file of job definitions, each the
//! flags of `job create` ([`SpecArgs`]), as TOML (`[[jobs]]`), JSON or
//! YAML (`{"jobs": [...]}`). Apply creates the missing jobs (in one
//! `CreateJobs` call), updates the changed ones (compare-and-set on the
//! revision it read) and leaves the equal ones; export writes what apply reads back as "unchanged".

use std::path::Path;

use anyhow::{bail, ensure, Context};
use clap::{Args, ValueEnum};
use kairos_client::{pb, Client};
use serde::{Deserialize, Serialize};

use crate::spec::{args_of, spec, with_defaults, SpecArgs};

/// Largest file `job apply` reads.
pub const FILE_MAX_BYTES: u64 = 4 << 20;
/// Most jobs one file may hold: as many as one `CreateJobs` call creates.
pub const JOBS_MAX: usize = kairos_client::CREATE_BATCH_MAX;

#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    pub jobs: Vec<SpecArgs>,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Debug)]
pub enum Format {
    Toml,
    Json,
    Yaml,
}

impl Format {
    fn of(path: &Path) -> anyhow::Result<Format> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => Ok(Format::Toml),
            Some("json") => Ok(Format::Json),
            Some("yaml" | "yml") => Ok(Format::Yaml),
            _ => bail!(
                "{}: unknown format (name it .toml, .json, .yaml or .yml)",
                path.display()
            ),
        }
    }
}

#[derive(Args)]
pub struct ApplyArgs {
    /// The file of jobs (.toml, .json, .yaml; at most 4 MiB and 1000 jobs).
    #[arg(short, long)]
    file: std::path::PathBuf,
    /// Print what would change, change nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args)]
pub struct ExportArgs {
    /// Only the jobs of this worker group.
    #[arg(long)]
    group: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Toml)]
    format: Format,
}

pub fn parse(text: &str, format: Format) -> anyhow::Result<JobFile> {
    Ok(match format {
        Format::Toml => toml::from_str(text)?,
        Format::Json => serde_json::from_str(text)?,
        Format::Yaml => serde_saphyr::from_str(text)?,
    })
}

pub fn render(file: &JobFile, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Toml => toml::to_string(file)?,
        Format::Json => serde_json::to_string_pretty(file)? + "\n",
        Format::Yaml => serde_saphyr::to_string(file)?,
    })
}

/// Each entry as an API spec, or the first invalid entry named with its
/// field and rule; nothing has been sent yet.
fn checked(file: &JobFile) -> anyhow::Result<Vec<pb::JobSpec>> {
    ensure!(
        file.jobs.len() <= JOBS_MAX,
        "jobs: at most {JOBS_MAX} per file, got {}",
        file.jobs.len()
    );
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, a) in file.jobs.iter().enumerate() {
        let at = format!("jobs[{i}] ({})", a.id);
        ensure!(!a.id.is_empty(), "jobs[{i}]: id: required");
        ensure!(seen.insert(&a.id), "{at}: id: appears twice in the file");
        ensure!(a.group.is_some(), "{at}: group: required");
        ensure!(
            a.after.is_none(),
            "{at}: after: not allowed in a file (it would move on every apply; use at)"
        );
        let s = spec(a).with_context(|| at.clone())?;
        if let Some(p) = a.priority {
            ensure!((1..=10).contains(&p), "{at}: priority: 1 to 10, got {p}");
        }
        out.push(s);
    }
    Ok(out)
}

pub async fn apply(c: &Client, a: ApplyArgs) -> anyhow::Result<()> {
    let len = std::fs::metadata(&a.file)
        .with_context(|| a.file.display().to_string())?
        .len();
    ensure!(
        len <= FILE_MAX_BYTES,
        "{}: at most {FILE_MAX_BYTES} bytes, got {len}",
        a.file.display()
    );
    let text = std::fs::read_to_string(&a.file).with_context(|| a.file.display().to_string())?;
    let file = parse(&text, Format::of(&a.file)?).with_context(|| a.file.display().to_string())?;
    let specs = checked(&file)?;
    // The server checks each schedule (cron syntax, time zone) before anything changes.
    for s in &specs {
        let req = pb::NextFiresRequest {
            id: String::new(),
            schedule: s.schedule.clone(),
            count: 1,
        };
        c.jobs(|mut j| {
            let r = req.clone();
            async move { j.next_fires(r).await }
        })
        .await
        .map_err(|e| anyhow::anyhow!("job {}: schedule: {}", s.id, e.message()))?;
    }
    let suffix = if a.dry_run { " (dry run)" } else { "" };
    let mut plan = Vec::with_capacity(specs.len());
    for s in specs {
        let current = get(c, &s.id).await?;
        plan.push((s, current));
    }
    // The missing jobs in one `CreateJobs` call (a file holds no more than
    // one call takes); each is created or fails on its own.
    let missing: Vec<pb::JobSpec> = (plan.iter())
        .filter(|(_, current)| current.is_none())
        .map(|(s, _)| s.clone())
        .collect();
    let mut failed = std::collections::HashMap::new();
    if !a.dry_run && !missing.is_empty() {
        let ids: Vec<String> = missing.iter().map(|s| s.id.clone()).collect();
        let results = c.create_job_batch(missing).await?;
        for (id, r) in ids.into_iter().zip(results) {
            if let Err(e) = r {
                failed.insert(id, e.message().to_string());
            }
        }
    }
    for (s, current) in &plan {
        let verb = match current {
            None if failed.contains_key(&s.id) => continue,
            None => "created",
            Some(j)
                if with_defaults(j.spec.clone().unwrap_or_default())
                    == with_defaults(s.clone()) =>
            {
                "unchanged"
            }
            Some(j) => {
                if !a.dry_run {
                    let req = pb::UpdateJobRequest {
                        spec: Some(s.clone()),
                        expected_revision: j.revision,
                    };
                    c.jobs(|mut j| {
                        let r = req.clone();
                        async move { j.update_job(r).await }
                    })
                    .await?;
                }
                "updated"
            }
        };
        println!("{verb} {}{suffix}", s.id);
    }
    let mut why: Vec<String> = (plan.iter())
        .filter_map(|(s, _)| Some(format!("job {}: {}", s.id, failed.get(&s.id)?)))
        .collect();
    match why.len() {
        0 => Ok(()),
        1 => bail!("{}", why.remove(0)),
        n => bail!("{n} jobs not created: {}", why.join("; ")),
    }
}

/// The job, or `None` if there is none by that id.
async fn get(c: &Client, id: &str) -> anyhow::Result<Option<pb::Job>> {
    let req = pb::JobRef { id: id.to_string() };
    let got = c
        .jobs(|mut j| {
            let r = req.clone();
            async move { j.get_job(r).await }
        })
        .await;
    match got {
        Ok(j) => Ok(Some(j)),
        Err(e) if e.code() == tonic::Code::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub async fn export(c: &Client, a: ExportArgs) -> anyhow::Result<()> {
    let filter = pb::ListJobsRequest {
        page_size: 1000,
        group: a.group.unwrap_or_default(),
        ..Default::default()
    };
    let jobs = crate::list_jobs(c, usize::MAX, filter).await?;
    let file = JobFile {
        jobs: (jobs.iter().filter_map(|j| j.spec.as_ref()))
            .map(args_of)
            .collect(),
    };
    print!("{}", render(&file, a.format)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> JobFile {
        let a = SpecArgs {
            id: "j".into(),
            every: Some("30s".into()),
            group: Some("g".into()),
            route: Some("label".into()),
            route_labels: vec![("zone".into(), "eu".into())],
            ..Default::default()
        };
        JobFile { jobs: vec![a] }
    }

    #[test]
    fn every_format_reads_back_what_it_writes() {
        for f in [Format::Toml, Format::Json, Format::Yaml] {
            let text = render(&sample(), f).unwrap();
            let back = parse(&text, f).unwrap();
            assert_eq!(back.jobs, sample().jobs, "{f:?}: {text}");
        }
    }

    #[test]
    fn a_bad_entry_is_named_with_its_field() {
        let text = "[[jobs]]\nid = \"a\"\ngroup = \"g\"\nevery = \"1s\"\n\n\
                    [[jobs]]\nid = \"b\"\ngroup = \"g\"\nevery = \"1x\"\n";
        let err = format!(
            "{:#}",
            checked(&parse(text, Format::Toml).unwrap()).unwrap_err()
        );
        assert!(
            err.contains("jobs[1] (b)") && err.contains("every"),
            "{err}"
        );
        let err = parse("[[jobs]]\nid = \"a\"\nprio = 3\n", Format::Toml)
            .err()
            .unwrap();
        assert!(err.to_string().contains("prio"), "{err}");
        let mut f = sample();
        f.jobs.push(f.jobs[0].clone());
        let err = checked(&f).unwrap_err().to_string();
        assert!(err.contains("jobs[1] (j): id: appears twice"), "{err}");
    }
}
