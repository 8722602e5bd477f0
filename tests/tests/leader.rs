//! The leader elector (`tidepool_operator::leader`) against the in-process API server with
//! RBAC on and the operator's role: every replica is the operator's service account on its
//! own node. Real time with short durations (lease 2 s, renew deadline 1 s, retry 250 ms);
//! every wait polls until a deadline.
//!
//! Bounds are checked against the server's log of accepted writes where they can be exact
//! (a follower's first Lease write comes a full lease duration after the last accepted write
//! of the old leader; a leader's step-down instant is at most its last accepted renewal +
//! the renew deadline). Bounds on takeover time allow [`SLACK`] for requests and scheduling.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tidepool_operator::Error;
use tidepool_operator::leader::{
    DEFAULT_LEASE_NAME, LeaderConfig, Leadership, lease::lease_client, run_elector,
};
use tidepool_tests::{AcceptedWrite, ApiServer, Faults, TargetedFault};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_millis(250);
/// Time allowed on top of a nominal bound for the requests themselves and for scheduling on
/// a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(300);
const NS: &str = "tidepool";
const LEASES: &str = "leases.coordination.k8s.io";

fn config(name: &str) -> LeaderConfig {
    LeaderConfig {
        lease_duration: LEASE,
        renew_deadline: RENEW,
        retry_period: RETRY,
        name: DEFAULT_LEASE_NAME.into(),
        namespace: NS.into(),
        identity: name.into(),
    }
}

/// One elector with its handle; dropping `stop` (or sending on it) shuts it down.
struct Replica {
    name: String,
    leadership: Leadership,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), Error>>,
}

impl Replica {
    async fn start(server: &ApiServer, name: &str) -> Replica {
        Replica::start_with(server, config(name)).await
    }

    async fn start_with(server: &ApiServer, cfg: LeaderConfig) -> Replica {
        let name = cfg.identity.clone();
        let leadership = Leadership::new(&cfg);
        let kube_config = server
            .kube_config(&operator_on(&name))
            .await
            .expect("kube config");
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(run_elector(cfg, kube_config, leadership.clone(), shutdown));
        Replica {
            name,
            leadership,
            stop: Some(stop),
            task,
        }
    }

    fn leads(&self) -> bool {
        self.leadership.is_leading()
    }

    /// Asks it to stop (SIGTERM) and returns how its elector ended.
    async fn shut_down(mut self) -> Result<(), Error> {
        drop(self.stop.take());
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the elector stops")
            .expect("the elector task")
    }
}

async fn start_all(server: &ApiServer, names: &[&str]) -> Vec<Replica> {
    let mut out = Vec::new();
    for n in names {
        out.push(Replica::start(server, n).await);
    }
    out
}

/// The index of the one replica that leads, once exactly one does.
async fn leader_among(replicas: &[Replica], within: Duration) -> usize {
    eventually(within, "exactly one replica leads", || async {
        let leading: Vec<usize> = (0..replicas.len())
            .filter(|i| replicas[*i].leads())
            .collect();
        (leading.len() == 1).then(|| leading[0])
    })
    .await
}

fn leases(client: &kube::Client) -> Api<Lease> {
    Api::namespaced(client.clone(), NS)
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    let l = leases
        .get_opt(DEFAULT_LEASE_NAME)
        .await
        .expect("get the Lease")?;
    l.spec.and_then(|s| s.holder_identity)
}

/// The Lease writes the server accepted from replica `name`.
fn lease_writes_of(server: &ApiServer, name: &str) -> Vec<AcceptedWrite> {
    let who = operator_on(name);
    server
        .accepted_writes()
        .into_iter()
        .filter(|w| w.resource == LEASES && w.identity == who)
        .collect()
}

/// With two and with three replicas exactly one leads at every sampled moment, always the
/// same one, the Lease names it, the others' watches say they follow, and no follower's
/// Lease write is ever accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_and_one_of_three_lead_at_every_sampled_moment() {
    for names in [&["a", "b"][..], &["a", "b", "c"][..]] {
        let (server, admin) = operator_cluster().await;
        let replicas = start_all(&server, names).await;
        let first = leader_among(&replicas, Duration::from_secs(5)).await;
        let watches: Vec<_> = replicas.iter().map(|r| r.leadership.subscribe()).collect();
        let lease = leases(&admin);
        let end = Instant::now() + LEASE * 2;
        let mut samples = 0;
        while Instant::now() < end {
            let leading: Vec<&str> = replicas
                .iter()
                .filter(|r| r.leads())
                .map(|r| r.name.as_str())
                .collect();
            assert_eq!(leading, [replicas[first].name.as_str()], "{names:?}");
            for (i, w) in watches.iter().enumerate() {
                assert_eq!(*w.borrow(), i == first, "{names:?}: replica {i}'s watch");
            }
            assert_eq!(holder(&lease).await.as_deref(), Some(leading[0]));
            samples += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(samples > 20, "{samples} samples");
        for (i, r) in replicas.iter().enumerate() {
            let writes = lease_writes_of(&server, &r.name);
            if i == first {
                // created, then renewed about every retry period
                assert!(writes.len() >= 8, "{}", writes.len());
            } else {
                assert!(writes.is_empty(), "follower {} wrote {writes:?}", r.name);
            }
        }
        let l = lease.get(DEFAULT_LEASE_NAME).await.unwrap().spec.unwrap();
        assert_eq!(l.lease_transitions, Some(0), "created by its first holder");
        assert_eq!(l.lease_duration_seconds, Some(2));
        for r in replicas {
            r.shut_down().await.unwrap();
        }
    }
}

/// The leader's task is aborted (the process killed): it stops leading at once, and another
/// replica takes over within lease duration + retry period, but never less than a full lease
/// duration after the old leader's last accepted renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_within_lease_duration_plus_retry_period() {
    let (server, admin) = operator_cluster().await;
    let mut replicas = start_all(&server, &["a", "b", "c"]).await;
    let old = leader_among(&replicas, Duration::from_secs(5)).await;
    tokio::time::sleep(LEASE).await;
    let old = replicas.remove(old);
    old.task.abort();
    let killed = Instant::now();
    assert!(old.task.await.unwrap_err().is_cancelled());
    assert!(
        !old.leadership.is_leading(),
        "an aborted elector's handle stops leading"
    );
    let new = leader_among(&replicas, LEASE + RETRY + SLACK + Duration::from_secs(1)).await;
    let took = killed.elapsed();
    eprintln!("a killed leader was replaced after {took:?}");
    assert!(took <= LEASE + RETRY + SLACK, "took over after {took:?}");
    let last_old = lease_writes_of(&server, &old.name).last().unwrap().at;
    let first_new = lease_writes_of(&server, &replicas[new].name)[0].at;
    assert!(
        first_new - last_old >= LEASE,
        "took over {:?} after the last renewal",
        first_new - last_old
    );
    let l = leases(&admin)
        .get(DEFAULT_LEASE_NAME)
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(
        l.holder_identity.as_deref(),
        Some(replicas[new].name.as_str())
    );
    assert_eq!(l.lease_transitions, Some(1));
    // the survivors settle: one leads, the other follows
    tokio::time::sleep(RETRY * 2).await;
    assert_eq!(replicas.iter().filter(|r| r.leads()).count(), 1);
    for r in replicas {
        r.shut_down().await.unwrap();
    }
}

/// SIGTERM on the leader: it stops leading at once, clears the holder (the Lease's history
/// shows it released by no one holding it) and exits Ok; a follower takes over within about
/// one retry period instead of a lease duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_is_taken_over_within_about_one_retry_period() {
    let (server, admin) = operator_cluster().await;
    let history = lease_history(&admin);
    let mut replicas = start_all(&server, &["a", "b"]).await;
    let old = leader_among(&replicas, Duration::from_secs(5)).await;
    tokio::time::sleep(LEASE).await;
    let old = replicas.remove(old);
    let name = old.name.clone();
    let leadership = old.leadership.clone();
    let asked = Instant::now();
    old.shut_down()
        .await
        .expect("a released Lease ends the elector with Ok");
    assert!(!leadership.is_leading());
    leader_among(&replicas, Duration::from_secs(2)).await;
    let took = asked.elapsed();
    eprintln!("a released Lease was taken over after {took:?}");
    assert!(took <= RETRY + SLACK, "handed over after {took:?}");
    let new = replicas[0].name.clone();
    let holders = eventually(
        Duration::from_secs(2),
        "the watch sees the new holder",
        || {
            let h = history.lock().unwrap().clone();
            let done = h.last() == Some(&new);
            async move { done.then_some(h) }
        },
    )
    .await;
    let released = holders
        .iter()
        .position(|h| h.is_empty())
        .unwrap_or_else(|| panic!("never released: {holders:?}"));
    assert_eq!(holders[released - 1], name, "{holders:?}");
    assert_eq!(holders[released + 1], replicas[0].name, "{holders:?}");
    let l = leases(&admin)
        .get(DEFAULT_LEASE_NAME)
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(l.lease_transitions, Some(1));
    replicas.pop().unwrap().shut_down().await.unwrap();
}

/// A renewal whose answer the leader never read (the stop cancelled it after the server
/// stored it) leaves the leader a stale resourceVersion. The release on stop still clears the
/// holder: it reads the Lease first and releases what it finds if it still holds it, as the
/// client-go maintainers propose for the same race (the kubernetes/kubernetes issue
/// "Leadership election should retry lock release on conflict": "call a Get() in the release()
/// function in order to ensure that the resource version is up to date before we release").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_the_leader_never_saw_answered_does_not_keep_the_lease_held() {
    let (server, admin) = operator_cluster().await;
    // a retry period long enough that no renewal of its own refreshes what it saw
    let slow = LeaderConfig {
        lease_duration: Duration::from_secs(60),
        renew_deadline: Duration::from_secs(40),
        retry_period: Duration::from_secs(30),
        ..config("a")
    };
    let a = Replica::start_with(&server, slow).await;
    leader_among(std::slice::from_ref(&a), Duration::from_secs(5)).await;
    // the renewal that landed: the same holder, a new resourceVersion
    let api = leases(&admin);
    let mut l = api.get(DEFAULT_LEASE_NAME).await.expect("the Lease");
    let spec = l.spec.as_mut().expect("a spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    api.replace(DEFAULT_LEASE_NAME, &PostParams::default(), &l)
        .await
        .expect("the renewal lands");
    a.shut_down().await.expect("the elector ends Ok");
    assert_eq!(
        holder(&api).await.as_deref(),
        Some(""),
        "the Lease is released"
    );
}

/// The holders of the Lease, each time it changes (a watch from the admin).
fn lease_history(admin: &kube::Client) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let cfg = watcher::Config::default().fields(&format!("metadata.name={DEFAULT_LEASE_NAME}"));
    let mut events = watcher(leases(admin), cfg).applied_objects().boxed();
    let sink = out.clone();
    tokio::spawn(async move {
        while let Some(Ok(l)) = events.next().await {
            let h = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            let mut v = sink.lock().unwrap();
            if v.last() != Some(&h) {
                v.push(h);
            }
        }
    });
    out
}

/// Only the leader's Lease updates fail (503, its reads still pass): it stops leading no
/// later than its last accepted renewal + the renew deadline, its elector ends with "leader
/// election lost", and the follower's first Lease write comes a full lease duration after the
/// old leader's last accepted one, after the old leader stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_renewals_end_leadership_by_the_renew_deadline() {
    deposed_without_knowing(TargetedFault {
        error_code: Some(503),
        ..TargetedFault::default()
    })
    .await;
}

/// The same with the leader's Lease updates hanging for 3 s (served late, if at all): each
/// attempt gives up at the Lease client's timeout and leadership ends by the renew deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_renewals_end_leadership_by_the_renew_deadline() {
    deposed_without_knowing(TargetedFault {
        latency: Duration::from_secs(3),
        ..TargetedFault::default()
    })
    .await;
}

async fn deposed_without_knowing(fault: TargetedFault) {
    let (server, _admin) = operator_cluster().await;
    let mut replicas = start_all(&server, &["a", "b"]).await;
    let old = leader_among(&replicas, Duration::from_secs(5)).await;
    tokio::time::sleep(LEASE).await;
    let old = replicas.remove(old);
    let follower = replicas.pop().unwrap();
    let watch = old.leadership.subscribe();
    server.set_faults(Faults {
        targeted: vec![TargetedFault {
            identity: operator_on(&old.name),
            resource: LEASES.into(),
            verbs: ["update".to_string()].into(),
            ..fault
        }],
        ..Faults::default()
    });
    // poll the old leader's handle; remember its last step-down instant
    let mut step_down_at = None;
    let stopped = eventually(RENEW + SLACK + RETRY, "the old leader stops", || {
        if let Some(d) = old.leadership.step_down_instant() {
            step_down_at = Some(d);
        }
        let leads = old.leads();
        async move { (!leads).then(Instant::now) }
    })
    .await;
    let step_down_at = step_down_at.expect("it led").into_std();
    let last_renewal = lease_writes_of(&server, &old.name).last().unwrap().at;
    assert!(step_down_at <= last_renewal + RENEW);
    assert!(
        stopped.saturating_duration_since(step_down_at) < Duration::from_millis(50),
        "stopped {:?} after its step-down instant",
        stopped.saturating_duration_since(step_down_at)
    );
    let ended = tokio::time::timeout(Duration::from_secs(2), old.task)
        .await
        .expect("the elector ends")
        .unwrap();
    let e = ended.expect_err("leadership was lost");
    assert!(e.to_string().starts_with("leader election lost"), "{e}");
    assert!(!*watch.borrow());

    eventually(
        Duration::from_secs(8),
        "the follower takes over",
        || async { follower.leads().then_some(()) },
    )
    .await;
    let first_new = lease_writes_of(&server, &follower.name)[0].at;
    let last_old = lease_writes_of(&server, &old.name).last().unwrap().at;
    eprintln!(
        "deposed: stopped {:?} after its last accepted renewal; the follower's first write {:?} after it",
        stopped - last_renewal,
        first_new - last_old
    );
    assert!(
        first_new - last_old >= LEASE,
        "took over {:?} after the old leader's last accepted write",
        first_new - last_old
    );
    assert!(
        stopped < first_new,
        "the old leader stopped before the follower acted"
    );
    server.set_faults(Faults::default());
    follower.shut_down().await.unwrap();
}

/// The Lease's own client sends each request once (kube's default client retries the same
/// 503 again and again) and gives up on a hung one at its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_client_does_not_retry_and_times_out() {
    let (server, admin) = operator_cluster().await;
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": DEFAULT_LEASE_NAME, "namespace": NS},
        "spec": {"holderIdentity": "x", "leaseDurationSeconds": 2},
    }))
    .unwrap();
    leases(&admin)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    let fault = |latency, error_code| Faults {
        targeted: vec![TargetedFault {
            identity: operator_on("a"),
            resource: LEASES.into(),
            latency,
            error_code,
            ..TargetedFault::default()
        }],
        ..Faults::default()
    };
    let timeout = Duration::from_millis(500);
    let config = server.kube_config(&operator_on("a")).await.unwrap();
    let ours = leases(&lease_client(config, timeout).unwrap());
    let current = ours.get(DEFAULT_LEASE_NAME).await.unwrap();

    server.set_faults(fault(Duration::ZERO, Some(503)));
    server.reset_counters();
    let e = ours
        .replace(DEFAULT_LEASE_NAME, &PostParams::default(), &current)
        .await
        .unwrap_err();
    assert_eq!(code(&e), 503);
    assert_eq!(server.request_count("update", LEASES), 1);
    // kube's default client, same identity, same fault: retried
    let default = leases(&server.client(&operator_on("a")).await.unwrap());
    let retried = tokio::spawn(async move {
        default
            .replace(DEFAULT_LEASE_NAME, &PostParams::default(), &current)
            .await
    });
    eventually(Duration::from_secs(3), "kube's client retries", || async {
        (server.request_count("update", LEASES) >= 4).then_some(())
    })
    .await;
    retried.abort();

    server.set_faults(fault(Duration::from_secs(3), None));
    let t = Instant::now();
    assert!(ours.get(DEFAULT_LEASE_NAME).await.is_err());
    let waited = t.elapsed();
    assert!(
        waited >= timeout && waited < timeout + SLACK,
        "gave up after {waited:?}"
    );
}

/// A kube-lease-manager instance (2 s lease, renewing 1 s before expiry) on the same Lease.
async fn lease_manager(admin: &kube::Client, id: &str) -> kube_lease_manager::LeaseManager {
    kube_lease_manager::LeaseManagerBuilder::new(admin.clone(), DEFAULT_LEASE_NAME)
        .with_namespace(NS)
        .with_identity(id)
        .with_duration(2)
        .with_grace(1)
        .build()
        .await
        .expect("lease manager")
}

/// kube-lease-manager as an independent peer judging the same Lease by its own rules (wall
/// clock, server-side apply): while it holds the Lease ours follow and write nothing; once it
/// releases, one of ours takes over within about a retry period; a second instance then
/// never claims the Lease while ours renews. At every sample at most one party leads and the
/// Lease names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_lease_manager_as_a_peer_agrees_on_the_holder() {
    let (server, admin) = operator_cluster().await;
    let lease = leases(&admin);
    let (peer, peer_task) = lease_manager(&admin, "klm-1").await.watch().await;
    eventually(Duration::from_secs(5), "the peer leads", || async {
        (*peer.borrow()).then_some(())
    })
    .await;
    let replicas = start_all(&server, &["a", "b"]).await;
    let end = Instant::now() + LEASE * 2;
    while Instant::now() < end {
        assert!(*peer.borrow());
        assert!(replicas.iter().all(|r| !r.leads()));
        assert_eq!(holder(&lease).await.as_deref(), Some("klm-1"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for r in &replicas {
        assert!(lease_writes_of(&server, &r.name).is_empty(), "{}", r.name);
    }

    // the peer lets go (its watch closed): ours take the released Lease at once
    drop(peer);
    peer_task
        .await
        .unwrap()
        .expect("the peer released the Lease");
    let released = Instant::now();
    let ours = leader_among(&replicas, Duration::from_secs(2)).await;
    let took = released.elapsed();
    assert!(
        took <= RETRY + SLACK,
        "took the released Lease after {took:?}"
    );
    let (peer, peer_task) = lease_manager(&admin, "klm-2").await.watch().await;
    let end = Instant::now() + LEASE * 2;
    while Instant::now() < end {
        let before = holder(&lease).await;
        let leading: Vec<&str> = replicas
            .iter()
            .filter(|r| r.leads())
            .map(|r| r.name.as_str())
            .collect();
        let peer_leads = *peer.borrow();
        let after = holder(&lease).await;
        assert_eq!(leading, [replicas[ours].name.as_str()]);
        assert!(!peer_leads, "the peer claims a Lease ours holds");
        assert_eq!(before.as_deref(), Some(leading[0]));
        assert_eq!(after, before);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spec = lease.get(DEFAULT_LEASE_NAME).await.unwrap().spec.unwrap();
    assert!(spec.lease_transitions.unwrap_or(0) >= 2, "{spec:?}");
    for r in replicas {
        r.shut_down().await.unwrap();
    }
    drop(peer);
    peer_task.abort();
}
