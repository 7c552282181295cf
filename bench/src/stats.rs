//! Percentile summaries and the scenario report: an ordered list of named
//! values printed as a two-column table or as one flat JSON object
//! (`{"scenario": ..., "fires_per_s": ..., "lateness_ms_p99": ..., "notes": [...]}`).

use serde_json::{json, Map, Value};

/// Percentiles of a set of integer samples (nearest-rank).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub min: i64,
    pub p50: i64,
    pub p90: i64,
    pub p99: i64,
    pub p999: i64,
    pub max: i64,
    pub mean: f64,
}

/// Nearest-rank percentile `p` (0..=100) of sorted samples.
pub fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Sorts `v` and summarizes it; None when empty.
pub fn summarize(v: &mut [i64]) -> Option<Summary> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let sum: i128 = v.iter().map(|&x| x as i128).sum();
    Some(Summary {
        n: v.len(),
        min: v[0],
        p50: percentile(v, 50.0),
        p90: percentile(v, 90.0),
        p99: percentile(v, 99.0),
        p999: percentile(v, 99.9),
        max: v[v.len() - 1],
        mean: sum as f64 / v.len() as f64,
    })
}

/// Seconds with fewer samples than this are left out of [`per_second_p99`]
/// (a p99 of a handful of fires is their maximum).
pub const PER_SECOND_MIN: usize = 100;

/// The p99 of the values of each second, from `(time_ms, value)` samples,
/// in time order; seconds with fewer than [`PER_SECOND_MIN`] samples are
/// skipped. The run's p99 mixes a transient of a few seconds
/// with the steady state; the median of these is the steady state, their
/// maximum the worst second.
pub fn per_second_p99(samples: &[(i64, i64)]) -> Vec<i64> {
    let mut by_second: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
    for &(at_ms, v) in samples {
        by_second.entry(at_ms.div_euclid(1000)).or_default().push(v);
    }
    by_second
        .into_values()
        .filter(|v| v.len() >= PER_SECOND_MIN)
        .map(|mut v| {
            v.sort_unstable();
            percentile(&v, 99.0)
        })
        .collect()
}

/// Median of a few values (for "median of N runs").
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// Rounds to 2 decimals for printing.
pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[derive(Debug, Clone)]
pub struct Report {
    pub scenario: String,
    fields: Vec<(String, Value)>,
    notes: Vec<String>,
    /// Correctness violations (not performance misses): make the run fail.
    pub failures: Vec<String>,
}

impl Report {
    pub fn new(scenario: &str) -> Self {
        Report {
            scenario: scenario.to_string(),
            fields: Vec::new(),
            notes: Vec::new(),
            failures: Vec::new(),
        }
    }

    pub fn set(&mut self, key: &str, v: impl Into<Value>) {
        let v = match v.into() {
            Value::Number(n) if n.is_f64() => json!(round2(n.as_f64().unwrap_or(0.0))),
            other => other,
        };
        match self.fields.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = v,
            None => self.fields.push((key.to_string(), v)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `{prefix}_count`, `_p50`, `_p90`, `_p99`, `_p999`, `_max`, `_mean` (null when no samples).
    pub fn summary(&mut self, prefix: &str, s: Option<Summary>) {
        let get = |f: fn(&Summary) -> Value| s.as_ref().map(f).unwrap_or(Value::Null);
        self.set(&format!("{prefix}_count"), s.map(|s| s.n).unwrap_or(0));
        self.set(&format!("{prefix}_p50"), get(|s| json!(s.p50)));
        self.set(&format!("{prefix}_p90"), get(|s| json!(s.p90)));
        self.set(&format!("{prefix}_p99"), get(|s| json!(s.p99)));
        self.set(&format!("{prefix}_p999"), get(|s| json!(s.p999)));
        self.set(&format!("{prefix}_max"), get(|s| json!(s.max)));
        self.set(&format!("{prefix}_mean"), get(|s| json!(round2(s.mean))));
    }

    pub fn note(&mut self, n: impl Into<String>) {
        self.notes.push(n.into());
    }

    pub fn fail(&mut self, f: impl Into<String>) {
        let f = f.into();
        self.notes.push(format!("FAILED: {f}"));
        self.failures.push(f);
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("scenario".into(), json!(self.scenario));
        for (k, v) in &self.fields {
            m.insert(k.clone(), v.clone());
        }
        m.insert("notes".into(), json!(self.notes));
        m.insert("ok".into(), json!(self.failures.is_empty()));
        Value::Object(m)
    }

    pub fn print_table(&self) {
        let w = self.fields.iter().map(|(k, _)| k.len()).max().unwrap_or(8);
        println!("== {} ==", self.scenario);
        for (k, v) in &self.fields {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            println!("  {k:<w$}  {v}");
        }
        for n in &self.notes {
            println!("  note: {n}");
        }
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let mut v: Vec<i64> = (1..=100).rev().collect();
        let s = summarize(&mut v).unwrap();
        assert_eq!((s.min, s.p50, s.p99, s.max), (1, 50, 99, 100));
        assert_eq!(percentile(&[7], 99.9), 7);
        assert!(summarize(&mut []).is_none());
    }

    #[test]
    fn per_second_p99_keeps_each_second_apart_and_skips_thin_ones() {
        // Second 5: 100 fires, one of them 50 ms late, the rest 1-3 ms.
        let mut v: Vec<(i64, i64)> = (0..99).map(|i| (5_000 + i, 1 + i % 3)).collect();
        v.push((5_999, 50));
        // Second 6: 200 fires at 9 ms. Second 7: 10 fires, too few.
        v.extend((0..200).map(|i| (6_000 + i, 9)));
        v.extend((0..10).map(|i| (7_000 + i, 400)));
        assert_eq!(per_second_p99(&v), vec![3, 9]);
        assert!(per_second_p99(&[]).is_empty());
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }
}
