//! The membership nemesis. It runs beside the fault plan, so its changes
//! meet partitions, kills, pauses and clock faults. Each step resumes the
//! change in progress or, when there is none, starts the next one drawn by
//! `generator::member_change`:
//!
//! - replace: remove a voter (the leader or a random slot's node), stop it,
//!   wipe its data, start a fresh node with the slot's next id and `--join`,
//!   add it as a learner, wait until it has caught up, promote it;
//! - shrink: remove a voter and leave its slot vacant (only when every slot
//!   holds a voter);
//! - grow: start a fresh node in the vacant slot, add it, promote it.
//!
//! A third of the changes have the leader SIGKILLed (and restarted 2 s
//! later) late in the call that changes the voters, where openraft writes
//! the joint and then the final configuration (aimed by how long the last
//! such call took), so some changes are cut between their two steps and the
//! next leader must finish them.
//!
//! Every call is recorded as an `info` event inside the step's `start`/`stop`
//! period, with its outcome. Refusals (FAILED_PRECONDITION) and timeouts are
//! outcomes, not harness errors: the change stays pending and a later step
//! resumes it from what the leader reports (each call is idempotent there).
//! A node is stopped only after the cluster confirmed its removal. After the
//! time limit, `restore` finishes the pending change and refills the vacant
//! slot, so the run ends with one voter per slot; `final-membership` checks it.

use crate::client::{self, code_name, leader_view, Node};
use crate::cluster::Cluster;
use crate::event::{Event, NemesisEvent, Phase};
use crate::generator::{member_change, ChangeKind, MemberChange, Target, MEMBERSHIP};
use crate::nemesis::{stopped_during, until_stopped};
use kairos_proto::v1::{MembershipResponse, StatusResponse};
use rand::rngs::StdRng;
use rand::Rng;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Deadline of one membership call: a promote or remove waits up to 1.5 s
/// for the voters to answer, then commits two log entries.
const CALL_TIMEOUT: Duration = Duration::from_secs(8);
/// How long a step waits for a new learner to catch up before leaving the
/// promotion to a later step.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(20);
/// A learner at most this many entries behind the leader may be promoted
/// (as `kairosctl cluster replace` does).
const PROMOTE_LAG_MAX: u64 = 100;
/// A leader killed mid-change stays down this long.
const KILLED_FOR: Duration = Duration::from_secs(2);
/// Pause between polls of the leader's view, and between restore attempts.
const POLL: Duration = Duration::from_millis(500);
/// Redirects a call follows (the leader removing itself answers with one).
const REDIRECTS_MAX: usize = 2;
/// Assumed length of a call that changes the voters until one was timed.
const CALL_MS_GUESS: u64 = 200;
/// How long a call waits for a leader (e.g. the election after the leader
/// removed itself) before it is sent to a random slot instead.
const LEADER_WAIT: Duration = Duration::from_secs(5);

/// A change started and not finished yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// Remove node `old` living in `slot`, then start a fresh node there
    /// (`refill`) or leave the slot vacant.
    Remove { slot: usize, old: u64, refill: bool },
    /// Start a fresh node in vacant `slot`, then add it.
    Fill { slot: usize },
    /// The fresh node `id` living in `slot`: add it as a learner, wait until
    /// it has caught up, promote it.
    Add { slot: usize, id: u64 },
}

impl Pending {
    fn nodes(&self) -> Vec<u64> {
        match self {
            Pending::Remove { old, .. } => vec![*old],
            Pending::Fill { .. } => vec![],
            Pending::Add { id, .. } => vec![*id],
        }
    }
}

/// The membership calls; promote and remove change the voters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    AddLearner,
    Promote,
    Remove,
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::AddLearner => "add-learner",
            Call::Promote => "promote",
            Call::Remove => "remove-node",
        }
    }
}

/// How a membership call ended, as recorded.
enum Answer {
    Ok,
    /// FAILED_PRECONDITION: the leader refused, naming why.
    Refused(String),
    /// Anything else: it may or may not have taken effect.
    Unknown,
    /// UNAVAILABLE naming the leader's address (the slot here): try there.
    Redirect(usize),
}

pub struct Membership {
    cluster: Arc<Cluster>,
    nodes: Arc<Vec<Node>>,
    rec: crate::recorder::Recorder,
    rng: StdRng,
    pending: Option<Pending>,
    /// Event id of the step being run.
    step: u64,
    /// Its `start` was recorded and its `stop` not yet.
    open: bool,
    /// How long the last successful call that changed the voters took.
    change_call_ms: u64,
}

impl Membership {
    pub fn new(
        cluster: Arc<Cluster>,
        nodes: Arc<Vec<Node>>,
        rec: crate::recorder::Recorder,
        rng: StdRng,
    ) -> Membership {
        Membership {
            cluster,
            nodes,
            rec,
            rng,
            pending: None,
            step: 0,
            open: false,
            change_call_ms: CALL_MS_GUESS,
        }
    }

    /// Runs steps until `stop` is set. A step cut short by `stop` leaves
    /// its change pending for [`Membership::restore`].
    pub async fn run(&mut self, mut stop: watch::Receiver<bool>) {
        loop {
            let change = member_change(&mut self.rng, self.nodes.len());
            let at = Instant::now() + Duration::from_millis(change.gap_ms);
            if stopped_during(&mut stop, at).await {
                return;
            }
            let done = tokio::select! {
                d = self.step(change) => d,
                _ = until_stopped(stop.clone()) => false,
            };
            self.stop_event(done).await;
        }
    }

    /// One step: resumes the pending change or starts `change`. Records the
    /// `start` event; true when no change is left pending.
    async fn step(&mut self, change: MemberChange) -> bool {
        self.step = self.rec.next_nemesis_id();
        let kind = match self.pending {
            Some(_) => "resume",
            None => match self.begin(change).await {
                Ok(kind) => kind,
                Err(why) => {
                    self.step_event(Phase::Info, "skipped", vec![], why).await;
                    return true;
                }
            },
        };
        let nodes = self.pending.map(|p| p.nodes()).unwrap_or_default();
        let detail = format!("{:?}", self.pending);
        self.step_event(Phase::Start, kind, nodes, detail).await;
        self.open = true;
        self.advance(change.kill_leader_at).await
    }

    /// Picks the concrete change for the cluster as it is (it acts on
    /// nothing yet); its name.
    async fn begin(&mut self, c: MemberChange) -> Result<&'static str, String> {
        if let Some(slot) = self.vacant_slot() {
            self.pending = Some(Pending::Fill { slot });
            return Ok("grow");
        }
        let slot = match c.target {
            Target::Node(i) => i % self.nodes.len(),
            _ => self.leader_slot().await.ok_or("no leader to remove")?,
        };
        let old = self.cluster.id(slot).ok_or("slot is vacant")?;
        if self.cluster.next_id(slot).is_none() {
            return Err(format!("slot {slot} has no fresh id left"));
        }
        let refill = c.kind == ChangeKind::Replace;
        self.pending = Some(Pending::Remove { slot, old, refill });
        Ok(if refill { "replace" } else { "shrink" })
    }

    fn vacant_slot(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|i| self.cluster.id(*i).is_none())
    }

    /// Carries the pending change as far as the cluster lets it; true when
    /// it is done. `kill_at` applies to the first call that changes the
    /// voters.
    async fn advance(&mut self, mut kill_at: Option<f64>) -> bool {
        loop {
            match self.pending {
                None => return true,
                Some(Pending::Remove { slot, old, refill }) => {
                    if !self.remove(old, kill_at.take()).await {
                        return false;
                    }
                    if let Err(e) = self.cluster.retire(slot) {
                        self.info(vec![old], format!("retire slot {slot}: {e:#}"))
                            .await;
                        return false;
                    }
                    self.info(vec![old], format!("stopped node {old}, wiped its data"))
                        .await;
                    self.pending = refill.then_some(Pending::Fill { slot });
                }
                Some(Pending::Fill { slot }) => match self.cluster.start_fresh(slot) {
                    Ok(id) => {
                        self.nodes[slot].set_id(id);
                        self.info(vec![id], format!("started fresh node {id} in slot {slot}"))
                            .await;
                        self.pending = Some(Pending::Add { slot, id });
                    }
                    Err(e) => {
                        // Only a slot out of ids fails here: it stays vacant.
                        self.info(vec![], format!("slot {slot} left vacant: {e:#}"))
                            .await;
                        self.pending = None;
                        return false;
                    }
                },
                Some(Pending::Add { slot, id }) => {
                    // An earlier promote whose answer was lost may have made it.
                    if self.settled_voter(id).await {
                        self.info(vec![id], format!("node {id} is a voter already"))
                            .await;
                        self.pending = None;
                        continue;
                    }
                    let peer = self.cluster.nodes[slot].peer.clone();
                    let added = self
                        .call(Call::AddLearner, id, None, |ch| {
                            let peer = peer.clone();
                            async move { client::add_learner(&ch, id, &peer, CALL_TIMEOUT).await }
                        })
                        .await;
                    if !matches!(added, Answer::Ok) || !self.caught_up(id).await {
                        return false;
                    }
                    let promoted = self
                        .call(Call::Promote, id, kill_at.take(), |ch| async move {
                            client::promote(&ch, id, CALL_TIMEOUT).await
                        })
                        .await;
                    if !matches!(promoted, Answer::Ok) {
                        return false;
                    }
                    self.pending = None;
                }
            }
        }
    }

    /// Removes `old`; true once the cluster confirmed it is no member.
    async fn remove(&mut self, old: u64, kill_at: Option<f64>) -> bool {
        let out = self
            .call(Call::Remove, old, kill_at, |ch| async move {
                client::remove_node(&ch, old, CALL_TIMEOUT).await
            })
            .await;
        match out {
            Answer::Ok => true,
            // Already removed by an earlier call whose answer was lost: the
            // leader's committed membership says so; make sure it is the leader's.
            Answer::Refused(why) if why.contains("not a member") => {
                let gone = leader_view(&self.nodes)
                    .await
                    .is_some_and(|(_, s)| settled_without(&s, old));
                self.info(vec![old], format!("leader's view confirms removal: {gone}"))
                    .await;
                gone
            }
            _ => false,
        }
    }

    /// Sends one membership call to the leader (any node when it is not
    /// known: they forward), following up to [`REDIRECTS_MAX`] redirects (a
    /// leader asked to remove itself hands over and redirects). Calls that
    /// change the voters are timed; with `kill_at` the leader is SIGKILLed
    /// that fraction of the last such call's length into the first try, if
    /// it has not answered yet, and restarted [`KILLED_FOR`] later. Records
    /// every answer.
    async fn call<F, Fut>(&mut self, what: Call, id: u64, kill_at: Option<f64>, f: F) -> Answer
    where
        F: Fn(client::NodeChannel) -> Fut,
        Fut: std::future::Future<Output = Result<MembershipResponse, tonic::Status>>,
    {
        let (mut via, leads) = match self.leader_slot().await {
            Some(slot) => (slot, true),
            None => (self.rng.gen_range(0..self.nodes.len()), false),
        };
        let kill_after_ms = kill_at
            .filter(|_| leads)
            .map(|f| (f * self.change_call_ms as f64) as u64);
        let mut killed = None;
        let mut hops = 0;
        let out = loop {
            let via_id = self.nodes[via].id();
            let sent = Instant::now();
            let rpc = f(self.nodes[via].channel.clone());
            let answer = match kill_after_ms.filter(|_| hops == 0) {
                Some(ms) => self.kill_during(via, ms, rpc, &mut killed).await,
                None => rpc.await,
            };
            let took_ms = sent.elapsed().as_millis() as u64;
            let (out, text) = match answer {
                Ok(m) => {
                    if what != Call::AddLearner {
                        self.change_call_ms = took_ms;
                    }
                    let text = format!("ok: voters {:?} learners {:?}", m.voters, m.learners);
                    (Answer::Ok, text)
                }
                Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                    let text = format!("refused: {}", s.message());
                    (Answer::Refused(s.message().to_string()), text)
                }
                Err(s) => {
                    let text = format!("unknown: {} {}", code_name(s.code()), s.message());
                    let to = client::redirect(&s, &self.nodes).filter(|_| hops < REDIRECTS_MAX);
                    (to.map_or(Answer::Unknown, Answer::Redirect), text)
                }
            };
            let note = format!(
                "{} {id} via node {via_id}: {text} ({took_ms} ms)",
                what.name()
            );
            self.info(vec![id], note).await;
            match out {
                Answer::Redirect(slot) => {
                    via = slot;
                    hops += 1;
                }
                out => break out,
            }
        };
        if let Some((slot, slot_id, ms)) = killed {
            let note = format!(
                "SIGKILL node {slot_id} (leader) {ms} ms into {} {id}",
                what.name()
            );
            self.info(vec![slot_id], note).await;
            tokio::time::sleep(KILLED_FOR).await;
            if let Err(e) = self.cluster.restart_if_down(slot) {
                self.info(vec![slot_id], format!("restart: {e:#}")).await;
            }
        }
        out
    }

    /// Awaits `rpc`, SIGKILLing slot `via`'s node after `ms` if it has not
    /// answered by then (noted in `killed`: slot, node id, ms).
    async fn kill_during<Fut: std::future::Future>(
        &self,
        via: usize,
        ms: u64,
        rpc: Fut,
        killed: &mut Option<(usize, u64, u64)>,
    ) -> Fut::Output {
        let mut rpc = std::pin::pin!(rpc);
        tokio::select! {
            a = &mut rpc => return a,
            _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
        }
        *killed = Some((via, self.nodes[via].id(), ms));
        self.cluster.kill(via);
        rpc.await
    }

    /// Does the leader report `id` as a voter, with no change in progress?
    async fn settled_voter(&self, id: u64) -> bool {
        leader_view(&self.nodes).await.is_some_and(|(_, s)| {
            !s.membership_changing && s.nodes.iter().any(|n| n.id == id && n.voter)
        })
    }

    /// The leader's slot, waiting up to [`LEADER_WAIT`] for one.
    async fn leader_slot(&self) -> Option<usize> {
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            if let Some((slot, _)) = leader_view(&self.nodes).await {
                return Some(slot);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits (bounded) until learner `id` answers and is close behind the leader.
    async fn caught_up(&self, id: u64) -> bool {
        let deadline = Instant::now() + CATCH_UP_LIMIT;
        let mut last = String::from("leader unknown");
        while Instant::now() < deadline {
            if let Some((_, s)) = leader_view(&self.nodes).await {
                match s.nodes.iter().find(|n| n.id == id) {
                    Some(n)
                        if n.role != "unreachable"
                            && n.applied_index > 0
                            && n.lag <= PROMOTE_LAG_MAX =>
                    {
                        let note = format!(
                            "node {id} caught up: applied {}, lag {}",
                            n.applied_index, n.lag
                        );
                        self.info(vec![id], note).await;
                        return true;
                    }
                    Some(n) => {
                        last = format!("{} applied {} lag {}", n.role, n.applied_index, n.lag)
                    }
                    None => last = "not a member".into(),
                }
            }
            tokio::time::sleep(POLL).await;
        }
        let note = format!("node {id} not caught up after {CATCH_UP_LIMIT:?}: {last}");
        self.info(vec![id], note).await;
        false
    }

    /// After the faults (healed): finishes the pending change and refills
    /// every vacant slot until the leader reports one voter per slot, no
    /// learner and no change in progress, or `limit` passes. Recorded as one
    /// `restore` step; true when the membership is whole.
    pub async fn restore(&mut self, limit: Duration) -> bool {
        self.step = self.rec.next_nemesis_id();
        let detail = format!("{:?}", self.pending);
        self.step_event(Phase::Start, "restore", vec![], detail)
            .await;
        self.open = true;
        let deadline = Instant::now() + limit;
        let whole = loop {
            if self.pending.is_none() {
                match self.vacant_slot() {
                    Some(slot) if self.cluster.next_id(slot).is_some() => {
                        self.pending = Some(Pending::Fill { slot })
                    }
                    Some(slot) => {
                        let note = format!("slot {slot} is vacant and has no fresh id left");
                        self.info(vec![], note).await;
                        break false;
                    }
                    None if self.whole().await => break true,
                    None => {}
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break false;
            }
            if tokio::time::timeout(left, self.advance(None))
                .await
                .is_err()
            {
                break false;
            }
            tokio::time::sleep(POLL).await;
        };
        self.stop_event(whole).await;
        whole
    }

    /// Does the leader report exactly the slots' nodes as voters, settled?
    async fn whole(&self) -> bool {
        let ids: BTreeSet<u64> = self.nodes.iter().map(|n| n.id()).collect();
        leader_view(&self.nodes).await.is_some_and(|(_, s)| {
            let voters: BTreeSet<u64> = s.nodes.iter().filter(|n| n.voter).map(|n| n.id).collect();
            voters == ids && s.nodes.len() == ids.len() && !s.membership_changing
        })
    }

    /// Records the `stop` of the step whose `start` was recorded.
    async fn stop_event(&mut self, done: bool) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let nodes = self.pending.map(|p| p.nodes()).unwrap_or_default();
        let detail = match self.pending {
            None if done => "done".to_string(),
            p => format!("pending {p:?}"),
        };
        self.step_event(Phase::Stop, "", nodes, detail).await;
    }

    async fn info(&self, nodes: Vec<u64>, detail: String) {
        self.step_event(Phase::Info, "", nodes, detail).await;
    }

    async fn step_event(&self, phase: Phase, kind: &str, nodes: Vec<u64>, detail: String) {
        let ev = NemesisEvent {
            id: self.step,
            time_ms: self.rec.now_ms(),
            phase,
            fault: MEMBERSHIP.into(),
            kind: kind.to_string(),
            nodes,
            detail,
        };
        self.rec.record(Event::Nemesis(ev)).await;
    }
}

/// Does this (leader's) status show a settled membership without `id`?
fn settled_without(s: &StatusResponse, id: u64) -> bool {
    !s.membership_changing && s.nodes.iter().all(|n| n.id != id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_proto::v1::NodeStatus;

    fn view(ids: &[u64], changing: bool) -> StatusResponse {
        StatusResponse {
            leader: ids[0],
            nodes: ids
                .iter()
                .map(|id| NodeStatus {
                    id: *id,
                    voter: true,
                    ..Default::default()
                })
                .collect(),
            membership_changing: changing,
            ..Default::default()
        }
    }

    #[test]
    fn removal_is_confirmed_only_by_a_settled_membership_without_the_node() {
        assert!(settled_without(&view(&[1, 3], false), 2));
        assert!(!settled_without(&view(&[1, 2, 3], false), 2));
        assert!(!settled_without(&view(&[1, 3], true), 2));
    }
}
