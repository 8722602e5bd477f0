//! Crashes at every step (issue 15). The real `tidepool-agent` binary, armed with one named
//! failpoint (`TIDEPOOL_FAILPOINTS`, see `tidepool_agent::failpoint`), is driven by the real
//! `tidepool-cni` binary (run as a runtime runs it) and by the operator's writes on the
//! in-process API server; where the point stops it, it is killed with SIGKILL and restarted
//! without failpoints on the same state directory. After the restart:
//! - no address is lost: the node's held, cooling and free addresses make up its whole
//!   pool, and every free one is handed out again (as many fresh ADDs as there are free
//!   addresses all succeed);
//! - none is given twice: the fresh ADDs never get a held or cooling address; the
//!   interrupted ADD, retried, gets the same address if it was saved, a free one if not;
//! - every address the plugin reported is still held by the same key;
//! - `status` on the server is the checkpoint again (republished before serving);
//! - the operator's tombstones and release marks are answered as the rules say (the
//!   tombstone's `reclaimAck` appears; a mark frees no live allocation).
//!
//! Before each kill the test also checks where the point stopped: the change is in the
//! checkpoint exactly for the after-persist points, and never yet on the server.
//!
//! A kill -9 never loses the page cache, so kills cannot show that a save would survive a
//! power loss: [`replies_come_after_the_directory_fsync`] checks the order write → fsync →
//! rename → directory fsync → reply through the agent's filesystem trait (the state tests
//! check the save itself, and the publish's place after it).
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::*;
use ipnet::IpNet;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tidepool_agent::failpoint::{self, Failpoint};
use tidepool_agent::serve::{
    Agent, Config, CountingPublish, MemoryNodeSource, PodNetworks, Server,
};
use tidepool_agent::state::{CHECKPOINT_FILE, Fs, FsFile, Op, RecordingFs, StateDir, TEMP_FILE};
use tidepool_api as api;
use tidepool_api::names::OPERATOR_MANAGER;
use tidepool_tests::ApiServer;

const AGENT_BIN: &str = env!("CARGO_BIN_EXE_tidepool-agent");
const POD_NETWORK: &str = "10.250.0.0/16";
/// The longest any one wait of the test may take.
const PATIENCE: Duration = Duration::from_secs(20);

fn uid(n: u32) -> String {
    format!("0badc0de-0000-4000-8000-{n:012x}")
}

/// What the crashing step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The plugin's ADD of c1.
    Add,
    /// The plugin's DEL of c1 (which holds an address).
    Del,
    /// The operator's tombstone on c1's address, naming c1.
    Tombstone,
    /// The operator's release mark on the block that holds c0's and c1's addresses.
    BlockMark,
}

/// One failpoint and the step that reaches it.
struct Case {
    /// `TIDEPOOL_FAILPOINTS` for the first agent.
    failpoints: &'static str,
    /// The point that stops it (its line is awaited).
    point: Failpoint,
    step: Step,
    /// Whether the step's change is in the checkpoint when the point stops the agent.
    persisted: bool,
    /// Whether the agent answered the plugin before the point stopped it.
    replied: bool,
}

impl Case {
    fn name(&self) -> String {
        format!("{} during {:?}", self.failpoints, self.step)
    }
}

/// Every point, on every step that reaches it. `@N` counts the point's hits: the first
/// ADD (c0) passes the ADD points. `before-publish` is armed by a file (`@{arm}`, which
/// `Trial::before_the_step` creates once c0 and c1 are seen published): how many status
/// writes a start-up makes depends on the order its watches' lists arrive in, so the hits
/// before the crashing step cannot be counted.
#[rustfmt::skip]
const CASES: &[Case] = &[
    // (failpoints, the point that stops, the step, persisted, replied)
    case("add-before-persist@2", Failpoint::AddBeforePersist, Step::Add, false, false),
    case("add-after-persist@2", Failpoint::AddAfterPersist, Step::Add, true, false),
    case("before-publish@{arm}", Failpoint::BeforePublish, Step::Add, true, true),
    case("del-before-persist", Failpoint::DelBeforePersist, Step::Del, false, false),
    case("del-after-persist", Failpoint::DelAfterPersist, Step::Del, true, false),
    case("before-publish@{arm}", Failpoint::BeforePublish, Step::Del, true, true),
    case("ack-before-persist", Failpoint::AckBeforePersist, Step::Tombstone, false, false),
    case("ack-after-persist", Failpoint::AckAfterPersist, Step::Tombstone, true, false),
    case("before-publish@{arm}", Failpoint::BeforePublish, Step::Tombstone, true, true),
    case("ack-before-persist", Failpoint::AckBeforePersist, Step::BlockMark, false, false),
    case("ack-after-persist", Failpoint::AckAfterPersist, Step::BlockMark, true, false),
];

const fn case(
    failpoints: &'static str,
    point: Failpoint,
    step: Step,
    persisted: bool,
    replied: bool,
) -> Case {
    Case {
        failpoints,
        point,
        step,
        persisted,
        replied,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_at_every_failpoint_loses_no_address_and_gives_none_twice() {
    let (server, admin) = empty_cluster().await;
    let all = Instant::now();
    for (i, case) in CASES.iter().enumerate() {
        let took = Instant::now();
        let n = u32::try_from(i).expect("few cases") + 1;
        run_case(&server, &admin, n, case).await;
        eprintln!("{}: passed in {:?}", case.name(), took.elapsed());
    }
    eprintln!("{} crash cases in {:?}", CASES.len(), all.elapsed());
}

/// One case on its own node `crash-<n>` (its IPAMNode and two /28 blocks).
async fn run_case(server: &ApiServer, admin: &kube::Client, n: u32, case: &Case) {
    let mut t = Trial {
        case,
        ctx: case.name(),
        node: Node::create(server, admin, n).await,
        nodes: Api::all(admin.clone()),
        blocks: Api::all(admin.clone()),
        reported: BTreeMap::new(),
        x: None,
    };
    let arm = t.node.path("arm").display().to_string();
    let failpoints = case.failpoints.replace("{arm}", &arm);
    let mut agent = AgentProcess::start(&t.node, Some(&failpoints));
    agent.until_serving(&t.node, &t.ctx).await;
    t.before_the_step(&mut agent).await;
    let plugin_run = t.crashing_step(server, admin).await;
    agent.until_reached(&t.ctx, case.point).await;
    let plugin_run = t.check_where_it_stopped(plugin_run).await;
    agent.kill();
    let plugin_out = match plugin_run {
        PluginRun::Done(r) => Some(r),
        PluginRun::Running(h) => Some(h.await.expect("join")),
        PluginRun::None => None,
    };
    t.check_the_plugin(plugin_out);

    // the restart, without failpoints, on the same state directory
    std::fs::remove_file(t.node.marker()).expect("remove the restore marker");
    let mut agent = AgentProcess::start(&t.node, None);
    agent.until_serving(&t.node, &t.ctx).await;
    t.check_after_restart().await;
    t.hand_out_every_free_address(&mut agent).await;
    agent.kill();
}

/// The plugin run of the crashing step, if it has one.
enum PluginRun {
    None,
    Running(tokio::task::JoinHandle<Run>),
    Done(Run),
}

/// One case's run.
struct Trial<'a> {
    case: &'a Case,
    /// Names the case in every failure.
    ctx: String,
    node: Node,
    nodes: Api<api::IPAMNode>,
    blocks: Api<api::IPAMBlock>,
    /// What the plugin was told, by container: still held by it at the end unless freed.
    reported: BTreeMap<String, IpAddr>,
    /// c1's address, once known.
    x: Option<IpAddr>,
}

impl Trial<'_> {
    /// The node side's fields on the server now.
    async fn shown(&self) -> Recorded {
        self.node.status(&self.nodes, &self.blocks).await
    }

    /// ADD c0 (and c1, unless the step is c1's ADD), each seen published: the pods the
    /// crash must not lose.
    async fn before_the_step(&mut self, agent: &mut AgentProcess) {
        let ctx = &self.ctx;
        let first = if self.case.step == Step::Add { 1 } else { 2 };
        for k in 0..first {
            let c = format!("c{k}");
            let a = self.node.cni("ADD", &c, k).await.addr_ok(ctx);
            self.reported.insert(c.clone(), a);
            let t = &*self;
            agent
                .until(ctx, &format!("{c} published"), || async move {
                    t.shown().await.held.contains_key(&a)
                })
                .await;
            if k == 1 {
                self.x = Some(a);
            }
        }
        assert_eq!(
            agent.reached(self.case.point),
            0,
            "{ctx}: the point stopped the agent before the crashing step\n{}",
            agent.tail()
        );
        std::fs::write(self.node.path("arm"), "").expect("arm the file-armed points");
    }

    /// Starts the step the point is to stop.
    async fn crashing_step(&self, server: &ApiServer, admin: &kube::Client) -> PluginRun {
        let x = self.x;
        match self.case.step {
            Step::Add => PluginRun::Running(self.node.cni_in_background("ADD", "c1", 1)),
            Step::Del => PluginRun::Running(self.node.cni_in_background("DEL", "c1", 1)),
            Step::Tombstone => {
                let x = x.expect("c1's address");
                self.node.tombstone(server, x, "c1", 1).await;
                PluginRun::None
            }
            Step::BlockMark => {
                let block = self.node.block_of(x.expect("c1's address"));
                self.node.mark_block(admin, &block).await;
                PluginRun::None
            }
        }
    }

    /// With the agent stopped at the point: the step's change is in the checkpoint exactly
    /// when the point is after the save, and not on the server. An answered ADD's reply is
    /// taken here (and must be the saved address).
    async fn check_where_it_stopped(&mut self, mut plugin_run: PluginRun) -> PluginRun {
        let ctx = &self.ctx;
        if self.case.replied && self.case.step == Step::Add {
            let PluginRun::Running(h) = plugin_run else {
                panic!("{ctx}: no plugin run")
            };
            let run = h.await.expect("join");
            let got = run.addr_ok(ctx);
            self.reported.insert("c1".into(), got);
            self.x = Some(got);
            plugin_run = PluginRun::Done(run);
        }
        let before = self.node.checkpoint();
        if self.case.step == Step::Add && self.case.persisted {
            let (held, _) = before.held_by("c1").unwrap_or_else(|| {
                panic!("{ctx}: after the save, c1 is in the checkpoint: {before:?}")
            });
            assert!(
                self.x.is_none_or(|x| x == held),
                "{ctx}: the reply is the saved address"
            );
            self.x = Some(held);
        }
        assert_eq!(
            changed(self.case.step, &before, &self.node, self.x),
            self.case.persisted,
            "{ctx}: the change is in the checkpoint iff the point is after the save: {before:?}"
        );
        let shown = self.shown().await;
        assert!(
            !changed(self.case.step, &shown, &self.node, self.x),
            "{ctx}: the point stops before the change is published: {shown:?}"
        );
        plugin_run
    }

    /// What the plugin told the runtime about the step the agent died on.
    fn check_the_plugin(&self, out: Option<Run>) {
        let ctx = &self.ctx;
        let spooled = self.node.spooled();
        match (self.case.step, out) {
            (Step::Add, Some(r)) if !self.case.replied => {
                assert_eq!(
                    r.error_code(),
                    11,
                    "{ctx}: an ADD the agent died on is 'try again later': {}",
                    r.stdout
                );
            }
            (Step::Del, Some(r)) => {
                assert_eq!(r.code, 0, "{ctx}: DEL succeeds: {}", r.stdout);
                // an answered DEL needs no spool; one the agent died on is spooled
                let want = usize::from(!self.case.replied);
                assert_eq!(spooled, want, "{ctx}: spooled DELs");
            }
            _ => {}
        }
    }

    /// After the restart: status is the checkpoint, which is consistent; the step's change
    /// is there (redone from the spool or the operator's objects), unless it was an ADD
    /// never saved; the interrupted ADD, retried, gets the saved address or a free one;
    /// every address the plugin reported is held by its container.
    async fn check_after_restart(&mut self) {
        let ctx = &self.ctx;
        let shown = self.shown().await;
        let after = self.node.checkpoint();
        assert_eq!(
            shown, after,
            "{ctx}: status as published before serving is the checkpoint"
        );
        after.check_consistent(ctx, &self.node);
        assert_eq!(self.node.spooled(), 0, "{ctx}: the spool was replayed");
        let redone = self.case.step != Step::Add || self.case.persisted;
        assert_eq!(
            changed(self.case.step, &after, &self.node, self.x),
            redone,
            "{ctx}: the change after the restart: {after:?}"
        );
        match self.case.step {
            Step::Add => {
                // the runtime retries the ADD that got no answer (or repeats an answered one)
                let again = self.node.cni("ADD", "c1", 1).await.addr_ok(ctx);
                if let Some(x) = self.x {
                    assert_eq!(again, x, "{ctx}: a saved ADD keeps its address");
                } else {
                    assert!(
                        !after.held.contains_key(&again) && !after.cooling.contains(&again),
                        "{ctx}: a retried ADD gets a free address, got {again}: {after:?}"
                    );
                }
                self.reported.insert("c1".into(), again);
            }
            Step::Del | Step::Tombstone => {
                self.reported.remove("c1");
                let x = self.x.expect("c1's address");
                assert!(after.cooling.contains(&x), "{ctx}: {x} cools down");
            }
            Step::BlockMark => {}
        }
        if self.case.step == Step::Tombstone {
            let x = self.x.expect("c1's address");
            assert_eq!(
                after.reclaim_acks.get(&x),
                Some(&(uid(1), "c1".to_owned(), "reclaimed".to_owned())),
                "{ctx}: the tombstone is answered 'reclaimed' (the same answer again)"
            );
        }
        if self.case.step == Step::BlockMark {
            let b = self.node.block_of(self.x.expect("c1's address"));
            assert_eq!(
                after.block_acks.get(&b).map(String::as_str),
                Some("do-not-release"),
                "{ctx}: a block holding pods is not released"
            );
        }
        let now = self.node.checkpoint();
        for (c, a) in &self.reported {
            let k = c.trim_start_matches('c').parse().expect("container number");
            assert_eq!(
                now.held.get(a),
                Some(&(c.clone(), uid(k))),
                "{ctx}: {a}, reported to {c}, is still held by it"
            );
        }
    }

    /// Every free address is handed out once more to fresh ADDs, and nothing else is; then
    /// the server shows the checkpoint.
    async fn hand_out_every_free_address(&self, agent: &mut AgentProcess) {
        let ctx = &self.ctx;
        let now = self.node.checkpoint();
        let free: BTreeSet<IpAddr> = self.node.allocatable(&now).into_iter().collect();
        let mut given = BTreeSet::new();
        for k in 0..free.len() {
            let k = u32::try_from(k).expect("few") + 100;
            let a = self.node.cni("ADD", &format!("c{k}"), k).await.addr_ok(ctx);
            assert!(
                free.contains(&a) && given.insert(a),
                "{ctx}: fresh ADD {k} got {a}, not one of the free {free:?} not yet given"
            );
        }
        assert_eq!(given, free, "{ctx}: every free address was handed out");
        let end = self.node.checkpoint();
        end.check_consistent(ctx, &self.node);
        let (t, end) = (self, &end);
        agent
            .until(ctx, "status the checkpoint again", || async move {
                t.shown().await == *end
            })
            .await;
    }
}

/// Whether `rec` shows the step's change: c1 held (ADD), c1 freed (DEL, tombstone; the
/// tombstone's answer given), the block's answer given (block mark).
fn changed(step: Step, rec: &Recorded, node: &Node, x: Option<IpAddr>) -> bool {
    match step {
        Step::Add => rec.held_by("c1").is_some(),
        Step::Del => rec.held_by("c1").is_none(),
        Step::Tombstone => {
            let x = x.expect("c1's address");
            rec.held_by("c1").is_none() && rec.reclaim_acks.contains_key(&x)
        }
        Step::BlockMark => rec
            .block_acks
            .contains_key(&node.block_of(x.expect("address"))),
    }
}

/// The node side as one record says it: the checkpoint on disk or the status on the server.
#[derive(Debug, PartialEq, Eq)]
struct Recorded {
    /// Address → (containerID, pod UID).
    held: BTreeMap<IpAddr, (String, String)>,
    cooling: BTreeSet<IpAddr>,
    /// Address → (pod UID, containerID, outcome).
    reclaim_acks: BTreeMap<IpAddr, (String, String, String)>,
    /// Block name → answer.
    block_acks: BTreeMap<String, String>,
}

impl Recorded {
    fn held_by(&self, container: &str) -> Option<(IpAddr, String)> {
        self.held
            .iter()
            .find(|(_, (c, _))| c == container)
            .map(|(a, (_, u))| (*a, u.clone()))
    }

    /// No address held twice (by construction of the map: checked against the list in
    /// [`Node::checkpoint`]) or both held and cooling, and all in the node's pool.
    fn check_consistent(&self, ctx: &str, node: &Node) {
        for a in self.held.keys() {
            assert!(!self.cooling.contains(a), "{ctx}: {a} held and cooling");
        }
        for a in self.held.keys().chain(&self.cooling) {
            assert!(node.in_pool(a), "{ctx}: {a} is not in the node's pool");
        }
    }
}

/// A test node: its IPAMNode, two blocks, and the agent's files.
struct Node {
    name: String,
    uid: String,
    blocks: Vec<(String, IpNet)>,
    dir: tempfile::TempDir,
}

impl Node {
    /// IPAMNode `crash-<n>` (created as the operator does) with blocks 10.250.<n>.16/28 and
    /// 10.250.<n>.32/28, and the agent's kubeconfig.
    async fn create(server: &ApiServer, admin: &kube::Client, n: u32) -> Node {
        let name = format!("crash-{n}");
        let uid = format!("0d0d0d0d-0000-4000-8000-{n:012x}");
        let operator = server.client(OPERATOR).await.expect("operator client");
        let obj: api::IPAMNode = serde_json::from_value(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": { "name": name }, "spec": { "nodeUID": uid },
        }))
        .expect("IPAMNode");
        Api::<api::IPAMNode>::all(operator)
            .create(&PostParams::default(), &obj)
            .await
            .expect("create the IPAMNode");
        let mut blocks = Vec::new();
        for low in [16, 32] {
            let cidr = format!("10.250.{n}.{low}/28");
            create_block(admin, &cidr, &name, &uid, false).await;
            let block = format!("v4-{}", cidr.replace(['.', '/'], "-"));
            blocks.push((block, cidr.parse().expect("cidr")));
        }
        let dir = tempfile::tempdir().expect("temp dir");
        server
            .write_kubeconfig(&agent_on(&name), &dir.path().join("kubeconfig"))
            .expect("kubeconfig");
        Node {
            name,
            uid,
            blocks,
            dir,
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    fn socket(&self) -> PathBuf {
        self.path("run/agent.sock")
    }
    fn marker(&self) -> PathBuf {
        self.path("run/restored")
    }
    fn spool(&self) -> PathBuf {
        self.path("spool")
    }

    fn config(&self) -> String {
        format!(
            r#"{{"cniVersion":"1.1.0","name":"pods","type":"ptp","ipam":{{"type":"tidepool-cni","socket":"{}","spoolDir":"{}","restoredMarker":"{}","connectTimeout":3000,"requestTimeout":15000}}}}"#,
            self.socket().display(),
            self.spool().display(),
            self.marker().display()
        )
    }

    /// The plugin's `cmd` for container `c` (interface eth0) of pod `uid(k)`, off the
    /// runtime's threads (the API server runs there).
    async fn cni(&self, cmd: &str, c: &str, k: u32) -> Run {
        let (cmd, c, config) = (cmd.to_owned(), c.to_owned(), self.config());
        blocking(move || plugin(&cmd, &c, &uid(k), &config)).await
    }

    /// The same, on a thread: the test waits for the failpoint meanwhile.
    fn cni_in_background(
        &self,
        cmd: &'static str,
        c: &'static str,
        k: u32,
    ) -> tokio::task::JoinHandle<Run> {
        let config = self.config();
        tokio::task::spawn_blocking(move || plugin(cmd, c, &uid(k), &config))
    }

    /// DELs the plugin spooled (files in the spool directory).
    fn spooled(&self) -> usize {
        std::fs::read_dir(self.spool()).map_or(0, |d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().is_file())
                .count()
        })
    }

    fn in_pool(&self, a: &IpAddr) -> bool {
        self.blocks.iter().any(|(_, net)| net.contains(a))
    }

    fn block_of(&self, a: IpAddr) -> String {
        let (name, _) = self
            .blocks
            .iter()
            .find(|(_, net)| net.contains(&a))
            .expect("an address of the node's blocks");
        name.clone()
    }

    /// The addresses a fresh ADD may get in `rec`: those of blocks not marked (no answer
    /// to a mark given), neither held nor cooling.
    fn allocatable(&self, rec: &Recorded) -> Vec<IpAddr> {
        self.blocks
            .iter()
            .filter(|(b, _)| !rec.block_acks.contains_key(b))
            .flat_map(|(_, net)| net.hosts_and_ends())
            .filter(|a| !rec.held.contains_key(a) && !rec.cooling.contains(a))
            .collect()
    }

    /// The operator's tombstone on `addr` for container `c` of pod `uid(k)`.
    async fn tombstone(&self, server: &ApiServer, addr: IpAddr, c: &str, k: u32) {
        let operator = server.client(OPERATOR).await.expect("operator client");
        let body = json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": { "name": self.name },
            "spec": { "nodeUID": self.uid, "reclaim": { addr.to_string(): {
                "podUID": uid(k), "containerID": c, "ifname": "eth0", "reason": "pod-deleted" } } },
        });
        Api::<api::IPAMNode>::all(operator)
            .patch(
                &self.name,
                &PatchParams::apply(OPERATOR_MANAGER),
                &Patch::Apply(&body),
            )
            .await
            .expect("write the tombstone");
    }

    /// The operator's release mark on block `name`.
    async fn mark_block(&self, admin: &kube::Client, name: &str) {
        let patch = Patch::Merge(json!({ "spec": { "release": "marked-for-release" } }));
        Api::<api::IPAMBlock>::all(admin.clone())
            .patch(name, &PatchParams::default(), &patch)
            .await
            .expect("mark the block");
    }

    /// The checkpoint on disk.
    fn checkpoint(&self) -> Recorded {
        let path = self.path("state").join(CHECKPOINT_FILE);
        let cp: Value = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).expect("checkpoint json"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({}),
            Err(e) => panic!("read {}: {e}", path.display()),
        };
        let mut held = BTreeMap::new();
        for a in cp["allocations"].as_array().into_iter().flatten() {
            for addr in a["addresses"].as_array().expect("addresses") {
                let addr: IpAddr = addr.as_str().expect("addr").parse().expect("ip");
                let owner = (text(&a["containerID"]), text(&a["podUID"]));
                let twice = held.insert(addr, owner);
                assert!(twice.is_none(), "{addr} held twice in the checkpoint");
            }
        }
        let cooling = keys(&cp["cooldown"]).map(|a| a.parse().expect("ip"));
        let reclaim_acks = object(&cp["reclaimAck"])
            .map(|(a, v)| {
                let ack = (
                    text(&v["podUID"]),
                    text(&v["containerID"]),
                    text(&v["outcome"]),
                );
                (a.parse().expect("ip"), ack)
            })
            .collect();
        let block_acks = object(&cp["blockReleaseAck"])
            .map(|(b, v)| (b.clone(), text(v)))
            .collect();
        Recorded {
            held,
            cooling: cooling.collect(),
            reclaim_acks,
            block_acks,
        }
    }

    /// The node side's fields on the server.
    async fn status(&self, nodes: &Api<api::IPAMNode>, blocks: &Api<api::IPAMBlock>) -> Recorded {
        let obj = nodes.get(&self.name).await.expect("the IPAMNode");
        let st = obj.status.unwrap_or_default();
        let ip = |a: &String| -> IpAddr { a.parse().expect("ip") };
        let held = st
            .used
            .iter()
            .map(|(a, u)| (ip(a), (u.container_id.clone(), u.pod_uid.clone())))
            .collect();
        let reclaim_acks = st
            .reclaim_ack
            .iter()
            .map(|(a, r)| {
                let outcome = serde_json::to_value(r.outcome).expect("outcome");
                let ack = (r.pod_uid.clone(), r.container_id.clone(), text(&outcome));
                (ip(a), ack)
            })
            .collect();
        let mut block_acks = BTreeMap::new();
        for (b, _) in &self.blocks {
            let ack = blocks.get(b).await.expect("block").status;
            if let Some(a) = ack.and_then(|s| s.release_ack) {
                block_acks.insert(b.clone(), text(&serde_json::to_value(a).expect("ack")));
            }
        }
        Recorded {
            held,
            cooling: st.cooldown.keys().map(ip).collect(),
            reclaim_acks,
            block_acks,
        }
    }
}

fn text(v: &Value) -> String {
    v.as_str()
        .unwrap_or_else(|| panic!("a string: {v}"))
        .to_owned()
}

fn object(v: &Value) -> impl Iterator<Item = (&String, &Value)> {
    v.as_object().into_iter().flatten()
}

fn keys(v: &Value) -> impl Iterator<Item = &String> {
    object(v).map(|(k, _)| k)
}

/// Every address of a network, its ends included (a block's addresses are all usable).
trait AllAddresses {
    fn hosts_and_ends(&self) -> Vec<IpAddr>;
}

impl AllAddresses for IpNet {
    fn hosts_and_ends(&self) -> Vec<IpAddr> {
        let IpNet::V4(n) = self else {
            panic!("the test's blocks are IPv4")
        };
        let (first, last) = (u32::from(n.network()), u32::from(n.broadcast()));
        (first..=last)
            .map(|a| IpAddr::from(std::net::Ipv4Addr::from(a)))
            .collect()
    }
}

trait AddrOk {
    fn addr_ok(&self, ctx: &str) -> IpAddr;
}

impl AddrOk for Run {
    /// An ADD result's address, or a failure naming the case.
    fn addr_ok(&self, ctx: &str) -> IpAddr {
        assert_eq!(self.code, 0, "{ctx}: ADD failed: {}", self.stdout);
        self.addr().parse().expect("an address")
    }
}

/// The `tidepool-agent` binary, killed (SIGKILL) when dropped; its stderr kept by a thread.
struct AgentProcess {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl AgentProcess {
    fn start(node: &Node, failpoints: Option<&str>) -> AgentProcess {
        let mut cmd = Command::new(AGENT_BIN);
        cmd.env_clear()
            .args(["--node-name", &node.name, "--pod-network", POD_NETWORK])
            .args(["--reuse-cooldown", "1h", "--node-wait", "20s"])
            // any free port: the default (127.0.0.1:9692) collides with any other agent on
            // this machine, another test's or another test run's
            .args(["--metrics-addr", "127.0.0.1:0"])
            .arg("--kubeconfig")
            .arg(node.path("kubeconfig"))
            .arg("--socket")
            .arg(node.socket())
            .arg("--state-dir")
            .arg(node.path("state"))
            .arg("--spool-dir")
            .arg(node.spool())
            .arg("--restored-marker")
            .arg(node.marker())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(f) = failpoints {
            cmd.env(failpoint::ENV, f);
        }
        let mut child = cmd.spawn().expect("start tidepool-agent");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let keep = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                keep.lock().expect("log").push(line);
            }
        });
        AgentProcess { child, log }
    }

    /// How many times `point`'s line was printed.
    fn reached(&self, point: Failpoint) -> usize {
        let line = point.reached_line();
        let log = self.log.lock().expect("log");
        log.iter().filter(|l| l.trim() == line).count()
    }

    fn tail(&self) -> String {
        let log = self.log.lock().expect("log");
        let from = log.len().saturating_sub(30);
        log[from..].join("\n")
    }

    /// Polls `f` until true; fails naming `ctx` and `what`, with the agent's log, when the
    /// agent exits or [`PATIENCE`] runs out.
    async fn until<F: std::future::Future<Output = bool>>(
        &mut self,
        ctx: &str,
        what: &str,
        mut f: impl FnMut() -> F,
    ) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if f().await {
                return;
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!(
                    "{ctx}: the agent exited ({status}) while waiting for {what}\n{}",
                    self.tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{ctx}: timed out waiting for {what}\n{}",
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Until the agent printed `point`'s line.
    async fn until_reached(&mut self, ctx: &str, point: Failpoint) {
        let deadline = Instant::now() + PATIENCE;
        while self.reached(point) == 0 {
            assert!(
                Instant::now() < deadline,
                "{ctx}: timed out waiting for '{}'\n{}",
                point.reached_line(),
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Until the agent has restored, published and serves.
    async fn until_serving(&mut self, node: &Node, ctx: &str) {
        let marker = &node.marker();
        self.until(ctx, "the restore marker", || async move { marker.exists() })
            .await;
    }

    /// SIGKILL (what `Child::kill` sends), then reaped: the state-dir lock goes with it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The filesystem the reply-order test gives the agent: the [`RecordingFs`] log, with each
/// directory fsync held back until a reply arrives or [`REPLY_GRACE`] passes. An agent
/// that answered without waiting for the fsync would have its reply logged before it.
struct GatedFs {
    fs: RecordingFs,
    replied: Arc<(Mutex<bool>, Condvar)>,
}

/// How long a directory fsync waits for a reply that must not come before it.
const REPLY_GRACE: Duration = Duration::from_millis(300);

impl Fs for GatedFs {
    fn create(&self, path: &Path) -> std::io::Result<Box<dyn FsFile + '_>> {
        self.fs.create(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.fs.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        let (flag, cv) = &*self.replied;
        let g = flag.lock().expect("gate");
        let _ = cv
            .wait_timeout_while(g, REPLY_GRACE, |replied| !*replied)
            .expect("gate");
        self.fs.sync_dir(dir)
    }
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        self.fs.read(path)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        self.fs.remove(path)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        self.fs.list(dir)
    }
}

/// Durable before the reply, seen from the runtime's side: the plugin's ADD and DEL return
/// only after the checkpoint's temp file was written and fsynced, renamed over the
/// checkpoint, and the directory fsynced — the reply is logged in the same log as the
/// filesystem calls, after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_come_after_the_directory_fsync() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let state = tmp.path().join("state");
    let fs = RecordingFs::new();
    let replied = Arc::new((Mutex::new(false), Condvar::new()));
    let gated = GatedFs {
        fs: fs.clone(),
        replied: replied.clone(),
    };
    let dir = StateDir::open_with(&state, Arc::new(gated)).expect("lock the state dir");
    let loaded = dir
        .load("boot-1", SystemTime::now(), Duration::from_secs(60))
        .expect("load");
    let source = MemoryNodeSource::with_pool(
        "node-a",
        tidepool_ipam::AddrSet::of_net(&"10.250.0.16/28".parse().expect("net")),
    );
    let config = Config {
        pod_networks: Some(std::sync::Arc::new(
            PodNetworks::new([POD_NETWORK.parse().expect("net")]).expect("networks"),
        )),
        empty_pool_wait: Duration::from_secs(1),
    };
    let agent = Agent::new(
        loaded.state,
        dir,
        Arc::new(source),
        Arc::new(CountingPublish::default()),
        config,
    );
    let sock = tmp.path().join("run/agent.sock");
    let stop = tokio_util::sync::CancellationToken::new();
    let server = Server::bind(&sock)
        .expect("bind")
        .spawn(agent, stop.clone());
    let conf = format!(
        r#"{{"cniVersion":"1.1.0","name":"pods","type":"ptp","ipam":{{"type":"tidepool-cni","socket":"{}","spoolDir":"{}","restoredMarker":"{}"}}}}"#,
        sock.display(),
        tmp.path().join("spool").display(),
        tmp.path().join("restored").display()
    );
    fs.take_ops();
    let (tmp_file, checkpoint) = (state.join(TEMP_FILE), state.join(CHECKPOINT_FILE));
    for verb in ["ADD", "DEL"] {
        *replied.0.lock().expect("gate") = false;
        let run = blocking({
            let conf = conf.clone();
            move || plugin(verb, "c1", &uid(1), &conf)
        })
        .await;
        fs.mark(format!("{verb} replied"));
        *replied.0.lock().expect("gate") = true;
        replied.1.notify_all();
        assert_eq!(run.code, 0, "{verb}: {}", run.stdout);
        assert_eq!(
            fs.take_ops(),
            [
                Op::Create(tmp_file.clone()),
                Op::Write(tmp_file.clone()),
                Op::SyncFile(tmp_file.clone()),
                Op::Rename(tmp_file.clone(), checkpoint.clone()),
                Op::SyncDir(state.clone()),
                Op::Mark(format!("{verb} replied")),
            ],
            "{verb}: write, fsync, rename, fsync of the directory, then the reply"
        );
    }
    stop.cancel();
    server.await.expect("the server stops");
}
