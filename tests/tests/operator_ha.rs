//! `tidepool-operator run` with leader election (issue 14): two replicas of the operator's
//! runtime against the in-process API server with RBAC on, each the operator's service
//! account on its own node. Real time with short durations (lease 2 s, renew deadline 1 s,
//! retry 250 ms: a write timeout of 0.8 s); every wait polls until a deadline.
//!
//! Who wrote what and when comes from the server's log of accepted writes, so the rules are
//! checked where the API server sees them: only the leader writes; a leader whose renewals
//! fail stops at its renew deadline and none of its writes lands after the new leader's
//! first; a killed leader is replaced and the work goes on; SIGTERM hands over at once.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use serde_json::json;
use tidepool_api as api;
use tidepool_ipam::AddrSet;
use tidepool_operator::Error;
use tidepool_operator::leader::{DEFAULT_LEASE_NAME, LeaderConfig};
use tidepool_operator::runtime::{self, Election, Settings};
use tidepool_tests::{AcceptedWrite, ApiServer, Faults, TargetedFault};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_millis(250);
const NS: &str = "tidepool";
const LEASES: &str = "leases.coordination.k8s.io";
/// How long a new leader may take from acquiring the Lease to serving a new node (its
/// relist, the engine's start, a pass) on a loaded 2-core machine.
const SERVE: Duration = Duration::from_secs(10);

/// One operator replica; sending on (or dropping) `stop` is its SIGTERM. It runs on a
/// runtime of its own, as a process would: [`Replica::kill`] ends every task it started
/// at once (the elector, the watches, the maintainers, the kube client's workers). Aborting
/// only `run`'s task would leave its spawned tasks running until their own aborts were
/// processed: on busy cores a "killed" leader's watch then saw a new Node and its maintainer
/// granted the block before its fence closed, so the new leader had nothing to write.
struct Replica {
    name: String,
    /// Where its `/healthz` and `/readyz` answer.
    health: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), Error>>,
    /// The replica's own runtime (None once killed).
    runtime: Option<tokio::runtime::Runtime>,
}

impl Replica {
    async fn start(server: &ApiServer, name: &str) -> Replica {
        let kube_config = server
            .kube_config(&operator_on(name))
            .await
            .expect("kube config");
        let health = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let s = Settings {
            health_addr: Some(health),
            seed: name.bytes().map(u64::from).sum(),
            election: Some(Election {
                config: LeaderConfig {
                    lease_duration: LEASE,
                    renew_deadline: RENEW,
                    retry_period: RETRY,
                    name: DEFAULT_LEASE_NAME.into(),
                    namespace: NS.into(),
                    identity: name.into(),
                },
                kube_config,
            }),
            ..operator_settings()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("replica-{name}"))
            .enable_all()
            .build()
            .expect("the replica's runtime");
        // the client is made on the replica's runtime: its workers are the replica's tasks
        let config = s
            .election
            .as_ref()
            .expect("an election")
            .kube_config
            .clone();
        let task = rt.spawn(async move {
            let client = kube::Client::try_from(config).expect("client");
            runtime::run(client, s, async move {
                let _ = stopped.await;
            })
            .await
        });
        Replica {
            name: name.into(),
            health,
            stop: Some(stop),
            task,
            runtime: Some(rt),
        }
    }

    /// kill -9: every task of the replica ends now; what it already sent may still land.
    async fn kill(mut self) {
        let rt = self.runtime.take().expect("not killed yet");
        tokio::task::spawn_blocking(move || rt.shutdown_timeout(Duration::from_secs(5)))
            .await
            .expect("the replica's runtime shut down");
    }

    /// The status `/readyz` answers with (None: no answer).
    async fn readyz(&self) -> Option<u16> {
        let addr = self.health;
        tokio::task::spawn_blocking(move || {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            write!(s, "GET /readyz HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
            let mut text = String::new();
            s.read_to_string(&mut text).ok()?;
            text.split_whitespace().nth(1)?.parse().ok()
        })
        .await
        .ok()?
    }

    /// SIGTERM; returns how `run` ended.
    async fn shut_down(mut self) -> Result<(), Error> {
        drop(self.stop.take());
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("run stops")
            .expect("run's task")
    }
}

impl Drop for Replica {
    /// A test that failed leaves no replica running (a runtime may not be dropped on a
    /// runtime's thread, so its tasks are dropped in the background).
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// A cluster with an IPv4 pool of /28 blocks.
async fn cluster() -> (ApiServer, kube::Client) {
    let (server, admin) = operator_cluster().await;
    create_object(
        &admin,
        json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": "default"},
            "spec": {"cidrs": ["10.140.0.0/16"], "blockSize": {"ipv4": 28}},
        }),
    )
    .await;
    (server, admin)
}

/// A Node with one pod waiting on it.
async fn node_with_a_pod(admin: &kube::Client, name: &str) {
    create_object(
        admin,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
    )
    .await;
    create_object(
        admin,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{name}-p"), "namespace": "default"},
            "spec": {"nodeName": name, "containers": [{"name": "c", "image": "pause"}]},
        }),
    )
    .await;
}

/// Replicas "a" and "b", started once `node` (with a pod) exists; returns them and the
/// leader's name once `node` is served.
async fn two_replicas(
    server: &ApiServer,
    admin: &kube::Client,
    node: &str,
) -> (Vec<Replica>, String) {
    let replicas = vec![
        Replica::start(server, "a").await,
        Replica::start(server, "b").await,
    ];
    eventually(SERVE, "the first node served", || served(admin, node)).await;
    let leader = leader(admin, None, Duration::from_secs(1)).await;
    (replicas, leader)
}

/// Every block on the server: (node, its addresses); panics if an address is in two.
async fn blocks(admin: &kube::Client) -> Vec<(String, AddrSet)> {
    let api: Api<api::IPAMBlock> = Api::all(admin.clone());
    let list = api.list(&ListParams::default()).await.expect("list blocks");
    let mut all = AddrSet::new();
    let mut out = Vec::new();
    for b in list.items {
        let mut a = AddrSet::new();
        a.insert_net(&b.spec.cidr.0.parse().expect("a CIDR"));
        assert!(
            all.intersection(&a).is_empty(),
            "{} granted twice",
            b.spec.cidr.0
        );
        all.union_with(&a);
        out.push((b.spec.node, a));
    }
    out
}

/// Some(()) once the node has a block.
async fn served(admin: &kube::Client, node: &str) -> Option<()> {
    blocks(admin)
        .await
        .iter()
        .any(|(n, _)| n == node)
        .then_some(())
}

async fn holder(admin: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let l = leases.get_opt(DEFAULT_LEASE_NAME).await.ok()??;
    l.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// The replica that holds the Lease, once one does (and, if given, not `old`).
async fn leader(admin: &kube::Client, old: Option<&str>, within: Duration) -> String {
    eventually(within, "a leader", || async {
        holder(admin).await.filter(|h| Some(h.as_str()) != old)
    })
    .await
}

/// Writes the server accepted from the operator replicas, Lease writes apart.
fn data_writes(server: &ApiServer) -> Vec<AcceptedWrite> {
    server
        .accepted_writes()
        .into_iter()
        .filter(|w| w.identity.starts_with(OPERATOR) && w.resource != LEASES)
        .collect()
}

fn writers(writes: &[AcceptedWrite]) -> BTreeSet<String> {
    writes.iter().map(|w| w.identity.clone()).collect()
}

/// Only the leader writes, while both replicas are ready (a synced standby is); its task
/// aborted (the process killed), the other replica takes over within lease duration + retry
/// period (+ its relist and a pass) and serves the node that came meanwhile; no address is
/// granted twice, and the old leader's writes all came before the new one's first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_writes_and_a_killed_leader_is_replaced() {
    let (server, admin) = cluster().await;
    node_with_a_pod(&admin, "n1").await;
    let (mut replicas, first) = two_replicas(&server, &admin, "n1").await;
    tokio::time::sleep(RETRY * 4).await; // the follower had every chance to write
    let written = data_writes(&server);
    assert!(written.len() >= 3, "{written:?}");
    assert_eq!(writers(&written), BTreeSet::from([operator_on(&first)]));
    for r in &replicas {
        assert_eq!(r.readyz().await, Some(200), "{} ready", r.name);
    }

    let i = replicas.iter().position(|r| r.name == first).unwrap();
    replicas.remove(i).kill().await;
    let killed = Instant::now();
    node_with_a_pod(&admin, "n2").await;
    let new = leader(&admin, Some(&first), LEASE + RETRY + Duration::from_secs(1)).await;
    let took = killed.elapsed();
    eprintln!("a killed leader was replaced after {took:?}");
    assert!(
        took <= LEASE + RETRY + Duration::from_millis(500),
        "{took:?}"
    );
    eventually(SERVE, "n2 served by the new leader", || {
        served(&admin, "n2")
    })
    .await;

    let written = data_writes(&server);
    let first_new = written
        .iter()
        .find(|w| w.identity == operator_on(&new))
        .unwrap()
        .at;
    let last_old = written
        .iter()
        .rfind(|w| w.identity == operator_on(&first))
        .unwrap()
        .at;
    assert!(
        last_old < first_new,
        "an old leader's write landed after the new one's first"
    );
    assert_eq!(
        writers(&written),
        BTreeSet::from([operator_on(&first), operator_on(&new)])
    );
    assert_eq!(blocks(&admin).await.len(), 2, "one block a node");
    replicas.pop().unwrap().shut_down().await.unwrap();
}

/// The leader is deposed without knowing it: only its Lease updates fail (503) while its
/// other writes reach the server, and nodes keep coming, so it has writes to make up to the
/// end. It stops writing at its renew deadline, its `run` ends with "leader election lost",
/// the follower takes over a lease duration after the last renewal, and no write of the old
/// leader is accepted after the new leader's first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_writes_nothing_after_the_new_leader_acts() {
    deposed(Duration::ZERO).await;
}

/// The same with a slow server: the old leader's IPAM writes take 0.6 s each, close to the
/// 0.8 s write timeout, so some are in flight when it steps down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_on_a_slow_server_writes_nothing_after_the_new_leader_acts() {
    deposed(Duration::from_millis(600)).await;
}

async fn deposed(latency: Duration) {
    let (server, admin) = cluster().await;
    node_with_a_pod(&admin, "n0").await;
    let (mut replicas, old) = two_replicas(&server, &admin, "n0").await;
    // nodes keep coming: the old leader has writes to make until it stops
    let load = {
        let admin = admin.clone();
        tokio::spawn(async move {
            for i in 1.. {
                node_with_a_pod(&admin, &format!("n{i}")).await;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let slow = |resource: &str| TargetedFault {
        identity: operator_on(&old),
        resource: resource.into(),
        latency,
        ..TargetedFault::default()
    };
    server.set_faults(Faults {
        targeted: vec![
            TargetedFault {
                identity: operator_on(&old),
                resource: LEASES.into(),
                verbs: ["update".to_string()].into(),
                error_code: Some(503),
                ..TargetedFault::default()
            },
            slow("ipamblocks.ipam.tidepool.dev"),
            slow("ipamnodes.ipam.tidepool.dev"),
            slow("ipamnodes.ipam.tidepool.dev/status"),
        ],
        ..Faults::default()
    });
    let new = leader(&admin, Some(&old), LEASE * 3).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    load.abort();
    let i = replicas.iter().position(|r| r.name == old).unwrap();
    let mut deposed = replicas.remove(i);
    let ended = tokio::time::timeout(Duration::from_secs(5), &mut deposed.task)
        .await
        .expect("the deposed leader's run ends")
        .expect("its task");
    assert!(
        matches!(ended, Err(Error::LeadershipLost { .. })),
        "{ended:?}"
    );
    server.set_faults(Faults::default());

    let all = server.accepted_writes();
    let by = |who: &str| -> Vec<&AcceptedWrite> {
        all.iter()
            .filter(|w| w.identity == operator_on(who))
            .collect()
    };
    let last_renewal = by(&old)
        .into_iter()
        .rfind(|w| w.resource == LEASES)
        .unwrap()
        .at;
    let old_data: Vec<&AcceptedWrite> = by(&old)
        .into_iter()
        .filter(|w| w.resource != LEASES)
        .collect();
    let new_first = by(&new)[0].at;
    let last_old = old_data.last().unwrap().at;
    eprintln!(
        "latency {latency:?}: the old leader's last write {:?} after its last renewal; the new \
         leader's first {:?} after it",
        last_old.saturating_duration_since(last_renewal),
        new_first - last_renewal
    );
    assert!(
        last_old < new_first,
        "an old leader's write landed after the new one's first"
    );
    // sent before the renew deadline (counted from the renewal's start, which precedes the
    // server's acceptance), answered within the write timeout
    let write_timeout = LEASE - RENEW - Duration::from_millis(200);
    assert!(
        last_old <= last_renewal + RENEW + latency.min(write_timeout) + Duration::from_millis(100),
        "the old leader wrote {:?} after its last renewal",
        last_old - last_renewal
    );
    assert!(new_first - last_renewal >= LEASE, "took over too early");
    assert!(
        old_data.len() >= 3,
        "the old leader wrote before: {old_data:?}"
    );
    // the new leader serves every node that came
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    let names: Vec<String> = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for n in &names {
        eventually(SERVE, "every node served", || served(&admin, n)).await;
    }
    replicas.pop().unwrap().shut_down().await.unwrap();
}

/// SIGTERM on the leader: `run` ends Ok with the Lease holder cleared, and the follower
/// leads within about a retry period and serves a new node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_over_at_once() {
    let (server, admin) = cluster().await;
    node_with_a_pod(&admin, "n1").await;
    let (mut replicas, old) = two_replicas(&server, &admin, "n1").await;
    let i = replicas.iter().position(|r| r.name == old).unwrap();
    let asked = Instant::now();
    replicas
        .remove(i)
        .shut_down()
        .await
        .expect("a leader's SIGTERM ends Ok");
    let stopped = asked.elapsed();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let l = leases.get(DEFAULT_LEASE_NAME).await.unwrap().spec.unwrap();
    let taken = l.holder_identity.as_deref().is_some_and(|h| !h.is_empty());
    assert!(
        !taken || l.holder_identity.as_deref() != Some(old.as_str()),
        "released: {l:?}"
    );
    let new = leader(&admin, Some(&old), Duration::from_secs(3)).await;
    let took = asked.elapsed();
    eprintln!("SIGTERM: the old leader stopped after {stopped:?}, the new one led after {took:?}");
    assert!(took <= RETRY + Duration::from_secs(1), "{took:?}");
    node_with_a_pod(&admin, "n2").await;
    eventually(SERVE, "n2 served by the new leader", || {
        served(&admin, "n2")
    })
    .await;
    assert_eq!(
        writers(&data_writes(&server)),
        BTreeSet::from([operator_on(&old), operator_on(&new)])
    );
    replicas.pop().unwrap().shut_down().await.unwrap();
}
