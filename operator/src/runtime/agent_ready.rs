//! The `AgentNotReady` event (issue 16, "Bad input"): a node whose agent never starts has
//! pods that wait for ever, and nothing in the IPAM objects says why — the operator grants
//! its pool as for any node, the CNI ADDs fail on the node without reaching anyone. So an
//! IPAMNode whose node has pods waiting for an address (bound, not terminal, no pod IP,
//! not on the host's network) while its agent is not ready, continuously for longer than
//! `--agent-ready-grace`, gets a Warning event that names the node, the waiting pods, since
//! when, and what to check. "Not ready" by either signal: its `AgentReady` condition is not
//! True, or its agent pod (`--agent-pod-selector`, bound to the node) exists and is not
//! Ready. A crashed agent writes nothing, so its last `AgentReady=True` stays; its pod's
//! Ready condition (the kubelet probes the agent's `/readyz`) comes through the pod watch
//! the operator runs anyway, at no IPAMNode write. During a rolling update the agent pod is
//! not Ready for a few seconds: the event waits for the grace.
//!
//! The decision ([`Tracker`]) is pure: it is told what each IPAMNode looks like now and
//! answers which events are due. The task ([`keep`]) feeds it each second from the store's
//! cache and the pod index and emits through [`Events`] (fenced: only the leader sends).
//! A finding is repeated every [`repeat_interval`] while it lasts, and kube's `Recorder`
//! folds the repeats into one event's series. "Since" is since this replica (the leader)
//! first saw the node stuck: a new leader starts its grace afresh, so a hand-over delays
//! the event by at most one grace and never sends it early.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use tidepool_api::convert::AgentReady;
use tidepool_ipam::{EventReason, EventType, NodeName, PodView};

use crate::index::{LabelSelector, PodIndex};
use crate::store::{Events, KubeStore};

/// What one IPAMNode looks like now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    pub node: NodeName,
    /// Pods bound to the node, not terminal, without a pod IP.
    pub waiting: usize,
    /// Its agent's `AgentReady` condition (None: never written).
    pub agent: Option<AgentReady>,
    /// Whether its agent pod is Ready (None: no agent pod bound to the node).
    pub agent_pod: Option<bool>,
}

impl Seen {
    /// Pods wait and the agent does not say it serves, or its pod is not Ready.
    fn stuck(&self) -> bool {
        let says_ready = self.agent.as_ref().is_some_and(|a| a.ready);
        self.waiting > 0 && (!says_ready || self.agent_pod == Some(false))
    }

    /// Why the agent counts as not ready, in words.
    fn why(&self) -> String {
        let condition = match &self.agent {
            None => Some("its agent has never reported (no AgentReady condition)".to_string()),
            Some(a) if !a.ready => Some(format!(
                "its agent is not ready (AgentReady=False, reason {}: {})",
                a.reason, a.message
            )),
            Some(_) => None,
        };
        let pod = (self.agent_pod == Some(false)).then_some(
            "its agent pod is not Ready (crashed, restarting or failing its /readyz probe)",
        );
        match (condition, pod) {
            (Some(c), Some(p)) => format!("{c}, and {p}"),
            (Some(c), None) => c,
            (None, Some(p)) => format!("{p}; its AgentReady=True is stale"),
            (None, None) => "its agent is ready".into(),
        }
    }
}

/// An event due on an IPAMNode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Finding {
    pub seen: Seen,
    /// Since when the node has been stuck without a break.
    pub since: SystemTime,
}

impl Finding {
    /// The event's message: the node, the waiting pods, since when, why, what to check
    /// (`agent_pods`: the agent pods' label selector, for the hint).
    pub fn message(&self, agent_pods: &LabelSelector) -> String {
        let node = &self.seen.node;
        format!(
            "{} pod(s) on node {node} have waited for an address since {} and {}; \
             check the tidepool-agent DaemonSet pod on node {node} \
             (kubectl get pods -A -l {agent_pods} --field-selector spec.nodeName={node}) \
             and its log",
            self.seen.waiting,
            humantime::format_rfc3339_seconds(self.since),
            self.seen.why(),
        )
    }
}

/// How often a finding that lasts is sent again: every grace, at least a minute apart
/// (the `Recorder` patches the event's series each time: one write per node and minute).
pub(super) fn repeat_interval(grace: Duration) -> Duration {
    grace.max(Duration::from_secs(60))
}

#[derive(Debug, Clone, Copy)]
struct Stuck {
    since: SystemTime,
    last_sent: Option<SystemTime>,
}

/// Which nodes have been stuck since when, and when each was last reported.
#[derive(Debug, Default)]
pub(super) struct Tracker {
    stuck: HashMap<NodeName, Stuck>,
}

impl Tracker {
    /// Takes in every IPAMNode as it is at `now` (a node not among `seen` is forgotten)
    /// and returns the events due: nodes stuck for longer than `grace`, first reported or
    /// not reported for [`repeat_interval`].
    pub fn observe(
        &mut self,
        now: SystemTime,
        grace: Duration,
        seen: impl IntoIterator<Item = Seen>,
    ) -> Vec<Finding> {
        let mut next = HashMap::new();
        let mut due = Vec::new();
        for s in seen {
            if !s.stuck() {
                continue;
            }
            let mut st = self.stuck.get(&s.node).copied().unwrap_or(Stuck {
                since: now,
                last_sent: None,
            });
            let elapsed = |t: SystemTime| now.duration_since(t).unwrap_or_default();
            let sent_long_ago = st
                .last_sent
                .is_none_or(|t| elapsed(t) >= repeat_interval(grace));
            if elapsed(st.since) > grace && sent_long_ago {
                st.last_sent = Some(now);
                due.push(Finding {
                    seen: s.clone(),
                    since: st.since,
                });
            }
            next.insert(s.node, st);
        }
        self.stuck = next;
        due
    }
}

/// Each second: the IPAMNodes the store holds, with their waiting pods and their agent
/// pods' readiness, through the [`Tracker`]; each finding becomes a Warning
/// `AgentNotReady` event on the IPAMNode.
pub(super) async fn keep(
    store: KubeStore,
    pods: PodIndex,
    events: Events,
    grace: Duration,
    agent_pods: LabelSelector,
) {
    let mut tracker = Tracker::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let seen = store
            .agent_readiness()
            .into_iter()
            .map(|(node, agent)| Seen {
                waiting: pods.pending_pods(&node).len(),
                agent_pod: pods.agent_pod_ready(&node),
                node,
                agent,
            });
        for f in tracker.observe(SystemTime::now(), grace, seen) {
            let message = f.message(&agent_pods);
            tracing::warn!(node = %f.seen.node, waiting = f.seen.waiting, %message, "pods wait on a node whose agent is not ready");
            events.emit(
                "IPAMNode",
                &f.seen.node,
                EventType::Warning,
                EventReason::AgentNotReady,
                message,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(60);

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn seen(node: &str, waiting: usize, agent: Option<(bool, &str)>) -> Seen {
        Seen {
            node: NodeName::from(node),
            waiting,
            agent: agent.map(|(ready, reason)| AgentReady {
                ready,
                reason: reason.into(),
                message: format!("{reason} message"),
            }),
            agent_pod: None,
        }
    }

    /// [`seen`] with an agent pod, Ready or not.
    fn with_pod(node: &str, waiting: usize, agent: Option<(bool, &str)>, ready: bool) -> Seen {
        Seen {
            agent_pod: Some(ready),
            ..seen(node, waiting, agent)
        }
    }

    fn selector() -> LabelSelector {
        "app.kubernetes.io/name=tidepool-agent".parse().unwrap()
    }

    /// Issue 27, defect 7: a crashed agent leaves `AgentReady=True` behind; its pod is not
    /// Ready, so its node counts as stuck and is reported after the grace (a rolling
    /// update's restart, shorter than the grace, is not); with its pod Ready, never.
    #[test]
    fn an_agent_pod_not_ready_is_stuck_whatever_its_stale_condition_says() {
        let serving = Some((true, "Serving"));
        let mut tr = Tracker::default();
        let reports = run(&mut tr, 0..=61, |_| vec![with_pod("n1", 2, serving, false)]);
        assert_eq!(reports, vec![(61, vec!["n1".to_string()])]);
        let mut tr = Tracker::default();
        let reports = run(&mut tr, 0..=200, |s| {
            vec![
                with_pod("ready", 2, serving, true),
                // a rollout: its pod not Ready from 10 to 40, less than the grace
                with_pod("rolling", 2, serving, !(10..40).contains(&s)),
            ]
        });
        assert_eq!(reports, vec![]);
        let f = Finding {
            seen: with_pod("n1", 2, serving, false),
            since: t(0),
        };
        let m = f.message(&selector());
        assert!(m.contains("its agent pod is not Ready"), "{m}");
        assert!(m.contains("its AgentReady=True is stale"), "{m}");
        assert!(
            m.contains("-l app.kubernetes.io/name=tidepool-agent"),
            "{m}"
        );
    }

    /// The nodes reported at each of `times`, everything else as `at` says.
    fn run(
        tracker: &mut Tracker,
        times: impl IntoIterator<Item = u64>,
        at: impl Fn(u64) -> Vec<Seen>,
    ) -> Vec<(u64, Vec<String>)> {
        times
            .into_iter()
            .map(|s| {
                let due = tracker.observe(t(s), GRACE, at(s));
                (
                    s,
                    due.into_iter().map(|f| f.seen.node.to_string()).collect(),
                )
            })
            .filter(|(_, d): &(u64, Vec<String>)| !d.is_empty())
            .collect()
    }

    #[test]
    fn a_node_without_agent_is_reported_once_the_grace_has_passed_then_every_minute() {
        let mut tr = Tracker::default();
        let reports = run(&mut tr, 0..=200, |_| vec![seen("n1", 3, None)]);
        // stuck from 0: not at 60 (longer than the grace), at 61, then a minute apart
        let at: Vec<u64> = reports.iter().map(|(s, _)| *s).collect();
        assert_eq!(at, vec![61, 121, 181]);
    }

    #[test]
    fn the_message_names_the_node_the_pods_since_when_and_what_to_check() {
        let mut tr = Tracker::default();
        tr.observe(t(0), GRACE, [seen("n1", 3, None)]);
        let f = tr.observe(t(61), GRACE, [seen("n1", 4, None)]).remove(0);
        assert_eq!(f.since, t(0));
        let m = f.message(&selector());
        for words in [
            "4 pod(s) on node n1",
            "since 2027-01-15T08:00:00Z",
            "no AgentReady condition",
            "tidepool-agent DaemonSet pod on node n1",
            "--field-selector spec.nodeName=n1",
        ] {
            assert!(m.contains(words), "{words:?} not in {m:?}");
        }
        // an agent that says why it is not ready: its reason is in the message
        let f = Finding {
            seen: seen("n2", 1, Some((false, "NodeWait"))),
            since: t(0),
        };
        let m = f.message(&selector());
        assert!(
            m.contains("AgentReady=False, reason NodeWait: NodeWait message"),
            "{m}"
        );
    }

    #[test]
    fn no_event_without_waiting_pods_or_once_the_agent_is_ready() {
        let mut tr = Tracker::default();
        let reports = run(&mut tr, 0..=200, |s| {
            vec![
                seen("idle", 0, None),
                seen("serving", 5, Some((true, "Serving"))),
                // ready at 30, before its grace ended: never reported
                seen("late", 2, (s >= 30).then_some((true, "Serving"))),
            ]
        });
        assert_eq!(reports, vec![]);
    }

    #[test]
    fn a_not_ready_agent_counts_as_stuck() {
        let mut tr = Tracker::default();
        let reports = run(&mut tr, 0..=61, |_| {
            vec![seen("n1", 1, Some((false, "NodeWait")))]
        });
        assert_eq!(reports, vec![(61, vec!["n1".to_string()])]);
    }

    #[test]
    fn a_break_starts_the_grace_again() {
        let mut tr = Tracker::default();
        // pods get addresses at 50 (nothing waits for a second), then wait again from 51
        let reports = run(&mut tr, 0..=120, |s| {
            vec![seen("n1", usize::from(s != 50), None)]
        });
        assert_eq!(reports, vec![(112, vec!["n1".to_string()])]);
        // a node that left (its IPAMNode gone) is forgotten: back, it starts afresh
        let mut tr = Tracker::default();
        let reports = run(&mut tr, 0..=130, |s| {
            if (60..=65).contains(&s) {
                vec![]
            } else {
                vec![seen("n1", 1, None)]
            }
        });
        assert_eq!(reports, vec![(127, vec!["n1".to_string()])]);
    }

    #[test]
    fn the_repeat_is_at_least_a_minute_and_at_least_the_grace() {
        assert_eq!(
            repeat_interval(Duration::from_secs(2)),
            Duration::from_secs(60)
        );
        assert_eq!(
            repeat_interval(Duration::from_secs(300)),
            Duration::from_secs(300)
        );
    }
}
