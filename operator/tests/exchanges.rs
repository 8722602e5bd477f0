//! Scripted API exchanges (issue 13): the kube-backed store ([`KubeStore`]) against a
//! tower-test mock standing in for the API server. Each test plays the server's side of one
//! exchange: it asserts the exact method, path, query parameters, content type and the body
//! fields that matter of every request, answers it as the API server would, and finally
//! proves that no further request was made (the store dropped, the mock sees none).
//!
//! The kube-rs controller-rs pattern (`src/fixtures.rs`, `ApiServerVerifier`), written out
//! per exchange. Real time, a short timeout on every wait: a missing request fails, it
//! never hangs.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use http::{Method, Request, Response, header};
use kube::client::Body;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};
use tidepool_api as api;
use tidepool_api::names::{FINALIZER, OPERATOR_MANAGER};
use tidepool_ipam::{
    AddrSet, BlockStore, Blocked, Condition, ConditionReason, ConditionType, ErrorClass, Gate,
    IpamBlock, IpamError, NodeName, NodeStore, NodeUid, OperatorFields, ReleaseMark, ReleaseState,
    ResourceVersion, Ungated,
};
use tidepool_operator::index::parse_uid;
use tidepool_operator::store::{Events, KubeStore};

const BLOCKS: &str = "/apis/ipam.tidepool.dev/v1alpha1/ipamblocks";
const NODES: &str = "/apis/ipam.tidepool.dev/v1alpha1/ipamnodes";
const API_VERSION: &str = "ipam.tidepool.dev/v1alpha1";
/// The canonical name of 10.0.1.16/28 (DESIGN.md "Resources").
const BLOCK: &str = "v4-10-0-1-16-28";
const CIDR: &str = "10.0.1.16/28";
const UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
/// Someone else's finalizer, which a release must leave in place.
const OTHER_FINALIZER: &str = "example.com/audit";
const JSON: &str = "application/json";
const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";
/// The query of the operator's applies: forced, since it sends only the fields it owns
/// (the server-side apply docs' advice for controllers).
/// The `metadata.uid` of the cached IPAMNode and IPAMBlock: every apply names the object it
/// means, so a deleted one is not brought back.
const NODE_OBJECT_UID: &str = "99999999-8888-4777-8666-555555555555";
const BLOCK_OBJECT_UID: &str = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee";
const FORCED: &[(&str, &str)] = &[("force", "true"), ("fieldManager", OPERATOR_MANAGER)];
/// How long the server waits for a request the store should make.
const WAIT: Duration = Duration::from_secs(5);

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Reply = tower_test::mock::SendResponse<Response<Body>>;

/// The API server's side of the exchanges.
struct ApiServer(Handle);

/// One request as the server saw it.
#[derive(Debug)]
struct Seen {
    method: Method,
    path: String,
    /// Non-empty `key=value` pairs in order (kube writes `path?&fieldManager=…`).
    query: Vec<(String, String)>,
    content_type: Option<String>,
    /// The JSON body; `Null` when empty.
    body: Value,
}

impl Seen {
    /// Asserts method, path, exact query parameters and content type.
    fn expect(&self, method: Method, path: &str, query: &[(&str, &str)], content_type: &str) {
        assert_eq!(self.method, method, "method of {self:?}");
        assert_eq!(self.path, path, "path of {self:?}");
        let want: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(self.query, want, "query of {self:?}");
        assert_eq!(
            self.content_type.as_deref(),
            Some(content_type),
            "content type of {self:?}"
        );
    }

    /// Asserts a bodiless read.
    fn expect_get(&self, path: &str) {
        assert_eq!(self.method, Method::GET, "method of {self:?}");
        assert_eq!(self.path, path, "path of {self:?}");
        assert!(self.query.is_empty(), "query of {self:?}");
        assert_eq!(self.body, Value::Null, "a GET has no body");
    }
}

impl ApiServer {
    /// The next request, which must come within [`WAIT`].
    async fn next(&mut self) -> (Seen, Reply) {
        let (req, reply) = tokio::time::timeout(WAIT, self.0.next_request())
            .await
            .expect("the store made no request in time")
            .expect("the client is gone");
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.expect("a request body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON request body")
        };
        let query = parts
            .uri
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_string(), v.to_string())
            })
            .collect();
        let seen = Seen {
            method: parts.method,
            path: parts.uri.path().to_string(),
            query,
            content_type: parts
                .headers
                .get(header::CONTENT_TYPE)
                .map(|v| v.to_str().expect("an ASCII content type").to_string()),
            body,
        };
        (seen, reply)
    }

    /// Drops the store (and with it the client) and asserts that it made no request
    /// beyond those already answered.
    async fn expect_no_more(mut self, store: KubeStore) {
        drop(store);
        let more = tokio::time::timeout(WAIT, self.0.next_request())
            .await
            .expect("the client did not shut down");
        if let Some((req, _)) = more {
            panic!("an unexpected request: {} {}", req.method(), req.uri());
        }
    }
}

/// A gate that counts its admissions: the kube budget's view of a store call. The server's
/// script reads it at each request it receives, proving the admission came first.
#[derive(Clone, Default)]
struct Admissions(Arc<AtomicUsize>);

impl Admissions {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Gate for Admissions {
    async fn request(&mut self) -> Result<(), IpamError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Runs a store call against the server's script of the exchange; a request the script
/// does not answer (the store waiting for ever) fails the test instead of hanging it.
async fn exchange<T>(call: impl Future<Output = T>, script: impl Future<Output = ()>) -> T {
    let both = async { tokio::join!(call, script) };
    let (r, ()) = tokio::time::timeout(2 * WAIT, both)
        .await
        .expect("the exchange did not finish: the store awaits an answer the script never gives");
    r
}

/// Answers with `code` and a JSON body.
fn answer(reply: Reply, code: u16, body: Value) {
    let res = Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, JSON)
        .body(Body::from(serde_json::to_vec(&body).expect("JSON")))
        .expect("a response");
    reply.send_response(res);
}

/// A `Status` failure as the API server sends it.
fn failure(code: u16, reason: &str, message: &str, details: Value) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason,
        "details": details, "code": code,
    })
}

fn store() -> (KubeStore, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    (KubeStore::new(client, Events::none()), ApiServer(handle))
}

fn node_uid() -> NodeUid {
    NodeUid(parse_uid(UID).expect("a UID"))
}

fn addr(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

/// The block the engine claims for node n1.
fn block() -> IpamBlock {
    let cidr: ipnet::IpNet = CIDR.parse().expect("a CIDR");
    IpamBlock {
        name: tidepool_ipam::pool::block_name(&cidr).into(),
        cidr,
        pool: "default".into(),
        node: "n1".into(),
        node_uid: node_uid(),
        release: false,
        ack: None,
        resource_version: None,
        deleting: false,
    }
}

/// The block as the server holds it at `rv`.
fn block_object(rv: &str) -> Value {
    json!({
        "apiVersion": API_VERSION, "kind": "IPAMBlock",
        "metadata": {
            "name": BLOCK, "resourceVersion": rv, "generation": 1,
            "uid": BLOCK_OBJECT_UID,
            "creationTimestamp": "2026-11-24T10:00:00Z",
            "finalizers": [FINALIZER],
        },
        "spec": { "pool": "default", "cidr": CIDR, "node": "n1", "nodeUID": UID },
    })
}

/// A store whose cache holds the block at resourceVersion 17 (from the watch).
fn store_with_block() -> (KubeStore, ApiServer) {
    let (store, server) = store();
    let obj: api::IPAMBlock = serde_json::from_value(block_object("17")).expect("a block");
    store.apply_block_event(&Event::Apply(obj));
    assert_eq!(store.blocks_of("n1").len(), 1);
    (store, server)
}

/// IPAMNode n1 as the server holds it at `rv`: two addresses, one operator condition, the
/// count written.
fn node_object(rv: &str) -> Value {
    json!({
        "apiVersion": API_VERSION, "kind": "IPAMNode",
        "metadata": {
            "name": "n1", "resourceVersion": rv, "generation": 1,
            "uid": NODE_OBJECT_UID,
            "creationTimestamp": "2026-11-24T10:00:00Z",
            "finalizers": [FINALIZER],
        },
        "spec": { "nodeUID": UID, "addresses": ["10.0.0.1", "10.0.0.2"] },
        "status": {
            "allocated": 2,
            "ipv4": { "allocated": "2" }, "ipv6": { "allocated": "0" },
            "conditions": [{
                "type": "PoolReady", "status": "True", "reason": "AtTarget",
                "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z",
            }],
        },
    })
}

/// A store whose cache holds IPAMNode n1 at resourceVersion 10 (from the watch).
fn store_with_node() -> (KubeStore, ApiServer) {
    let (store, server) = store();
    let obj: api::IPAMNode = serde_json::from_value(node_object("10")).expect("an IPAMNode");
    store.apply_node_event(&Event::Apply(obj));
    assert!(store.cached("n1").is_some());
    (store, server)
}

/// The operator's fields of the cached n1, unchanged.
fn cached_fields(store: &KubeStore) -> OperatorFields {
    store.cached("n1").expect("n1 cached").operator.clone()
}

/// The node's name, as the engine passes it.
static N1: LazyLock<NodeName> = LazyLock::new(|| NodeName::from("n1"));

/// The spec apply body the operator sends for n1 with `spec`.
fn spec_apply(spec: Value) -> Value {
    json!({
        "apiVersion": API_VERSION, "kind": "IPAMNode",
        "metadata": { "name": "n1", "finalizers": [FINALIZER], "uid": NODE_OBJECT_UID },
        "spec": spec,
    })
}

fn pool_ready() -> Value {
    json!({
        "type": "PoolReady", "status": "True", "reason": "AtTarget",
        "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z",
    })
}

fn blocked() -> Value {
    json!({
        "type": "Blocked", "status": "True", "reason": "Exhausted",
        "message": "no ipv4 address left", "lastTransitionTime": "2026-11-24T10:00:00Z",
    })
}

/// The `Blocked` condition as the engine holds it.
fn blocked_condition() -> Condition {
    let at: k8s_openapi::jiff::Timestamp = "2026-11-24T10:00:00Z".parse().expect("a time");
    Condition {
        type_: ConditionType::Blocked,
        status: true,
        reason: ConditionReason::Blocked(Blocked::Exhausted),
        message: "no ipv4 address left".into(),
        last_transition: SystemTime::from(at),
    }
}

// ---------------------------------------------------------------------------------------
// 1. A claim

/// A claim is one POST of the block under its canonical name, with its spec and the
/// operator's finalizer; the 201 lands in the cache at once.
#[tokio::test]
async fn a_claim_is_one_post_of_the_block_with_its_finalizer() {
    let (store, mut server) = store();
    let created = exchange(store.create_block(block(), &mut Ungated), async {
        let (req, reply) = server.next().await;
        req.expect(
            Method::POST,
            BLOCKS,
            &[("fieldManager", OPERATOR_MANAGER)],
            JSON,
        );
        assert_eq!(req.body["apiVersion"], API_VERSION);
        assert_eq!(req.body["kind"], "IPAMBlock");
        assert_eq!(req.body["metadata"]["name"], BLOCK);
        assert_eq!(req.body["metadata"]["finalizers"], json!([FINALIZER]));
        assert!(
            req.body["metadata"].get("resourceVersion").is_none(),
            "a create names no version"
        );
        assert_eq!(
            req.body["spec"],
            json!({ "pool": "default", "cidr": CIDR, "node": "n1", "nodeUID": UID }),
            "the spec, and no release mark"
        );
        assert!(req.body.get("status").is_none(), "a claim writes no status");
        answer(reply, 201, block_object("5"));
    })
    .await;
    let created = created.expect("the claim");
    assert_eq!(created.resource_version, Some(ResourceVersion::server("5")));
    let held = store.blocks_of("n1");
    assert_eq!(held.len(), 1, "in the cache before any watch event");
    assert_eq!(&*held[0].name, BLOCK);
    assert_eq!(held[0].resource_version, Some(ResourceVersion::server("5")));
    server.expect_no_more(store).await;
}

/// A claim of a taken name: 409 AlreadyExists is `AlreadyExists`, and nothing is cached.
#[tokio::test]
async fn a_claim_of_a_taken_name_is_already_exists() {
    let (store, mut server) = store();
    let r = exchange(store.create_block(block(), &mut Ungated), async {
        let (req, reply) = server.next().await;
        req.expect(
            Method::POST,
            BLOCKS,
            &[("fieldManager", OPERATOR_MANAGER)],
            JSON,
        );
        let details = json!({ "name": BLOCK, "group": "ipam.tidepool.dev", "kind": "ipamblocks" });
        let msg = format!("ipamblocks.ipam.tidepool.dev \"{BLOCK}\" already exists");
        answer(reply, 409, failure(409, "AlreadyExists", &msg, details));
    })
    .await;
    assert_eq!(r, Err(IpamError::AlreadyExists { name: BLOCK.into() }));
    assert!(store.blocks_of("n1").is_empty());
    server.expect_no_more(store).await;
}

// ---------------------------------------------------------------------------------------
// 2. A release

/// A release is a DELETE whose body is DeleteOptions with the resourceVersion
/// precondition; answered with the object still Terminating (our finalizer holds it), it
/// is followed by one merge patch that removes only our finalizer, at the version the
/// DELETE answered. The block leaves the cache at once.
#[tokio::test]
async fn a_release_deletes_with_its_precondition_then_drops_only_our_finalizer() {
    let (store, mut server) = store_with_block();
    let path = format!("{BLOCKS}/{BLOCK}");
    let seventeen = ResourceVersion::server("17");
    let mut gate = Admissions::default();
    let admitted = gate.clone();
    let call = store.delete_block(BLOCK, &seventeen, &mut gate);
    let r = exchange(call, async {
        let (req, reply) = server.next().await;
        assert_eq!(admitted.count(), 1, "the DELETE was admitted first");
        req.expect(Method::DELETE, &path, &[], JSON);
        assert_eq!(
            req.body,
            json!({ "preconditions": { "resourceVersion": "17" } }),
            "DeleteOptions with the precondition, nothing else"
        );
        let mut terminating = block_object("18");
        terminating["metadata"]["deletionTimestamp"] = json!("2026-11-24T10:01:00Z");
        terminating["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        terminating["metadata"]["finalizers"] = json!([FINALIZER, OTHER_FINALIZER]);
        answer(reply, 200, terminating.clone());

        let (req, reply) = server.next().await;
        assert_eq!(admitted.count(), 2, "and the finalizer's removal");
        req.expect(Method::PATCH, &path, &[], MERGE);
        assert_eq!(
            req.body,
            json!({ "metadata": {
                    "finalizers": [OTHER_FINALIZER],
                    "resourceVersion": "18",
                } }),
            "only our finalizer off, at the version the DELETE answered"
        );
        let mut left = terminating;
        left["metadata"]["resourceVersion"] = json!("19");
        left["metadata"]["finalizers"] = json!([OTHER_FINALIZER]);
        answer(reply, 200, left);
    })
    .await;
    r.expect("the release");
    assert!(
        store.blocks_of("n1").is_empty(),
        "gone from the cache at once"
    );
    server.expect_no_more(store).await;
}

/// A DELETE answered with a success `Status` (the object is gone): nothing follows.
#[tokio::test]
async fn a_release_of_a_block_already_gone_makes_no_patch() {
    let (store, mut server) = store_with_block();
    let path = format!("{BLOCKS}/{BLOCK}");
    let seventeen = ResourceVersion::server("17");
    let r = exchange(store.delete_block(BLOCK, &seventeen, &mut Ungated), async {
        let (req, reply) = server.next().await;
        req.expect(Method::DELETE, &path, &[], JSON);
        assert_eq!(req.body["preconditions"]["resourceVersion"], "17");
        let gone = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": { "name": BLOCK, "group": "ipam.tidepool.dev", "kind": "ipamblocks",
                         "uid": BLOCK_OBJECT_UID },
        });
        answer(reply, 200, gone);
    })
    .await;
    r.expect("the release");
    assert!(store.blocks_of("n1").is_empty());
    server.expect_no_more(store).await;
}

/// A 409 on the DELETE (the block changed since version 17: the node side withdrew its
/// answer, another leader marked it) is `Conflict` naming 17; no finalizer patch follows
/// and the block stays in the cache.
#[tokio::test]
async fn a_release_that_lost_the_race_is_a_conflict() {
    let (store, mut server) = store_with_block();
    let path = format!("{BLOCKS}/{BLOCK}");
    let seventeen = ResourceVersion::server("17");
    let r = exchange(store.delete_block(BLOCK, &seventeen, &mut Ungated), async {
        let (req, reply) = server.next().await;
        req.expect(Method::DELETE, &path, &[], JSON);
        assert_eq!(req.body["preconditions"]["resourceVersion"], "17");
        let msg = format!(
            "Operation cannot be fulfilled on ipamblocks.ipam.tidepool.dev \"{BLOCK}\": \
                 Precondition failed: ResourceVersion in precondition: 17, \
                 ResourceVersion in object meta: 18"
        );
        let details = json!({ "name": BLOCK, "group": "ipam.tidepool.dev", "kind": "ipamblocks" });
        answer(reply, 409, failure(409, "Conflict", &msg, details));
    })
    .await;
    assert_eq!(
        r,
        Err(IpamError::Conflict {
            name: BLOCK.into(),
            expected: ResourceVersion::server("17"),
        })
    );
    assert_eq!(store.blocks_of("n1").len(), 1, "still held");
    server.expect_no_more(store).await;
}

/// The finalizer patch carries the version the DELETE answered: a 409 on it (someone
/// changed the finalizer list meanwhile) is a `Conflict` naming that version, never a
/// silent loss of the other finalizer.
#[tokio::test]
async fn a_finalizer_patch_that_lost_the_race_is_a_conflict() {
    let (store, mut server) = store_with_block();
    let path = format!("{BLOCKS}/{BLOCK}");
    let seventeen = ResourceVersion::server("17");
    let r = exchange(store.delete_block(BLOCK, &seventeen, &mut Ungated), async {
        let (req, reply) = server.next().await;
        req.expect(Method::DELETE, &path, &[], JSON);
        let mut terminating = block_object("18");
        terminating["metadata"]["deletionTimestamp"] = json!("2026-11-24T10:01:00Z");
        answer(reply, 200, terminating);
        let (req, reply) = server.next().await;
        req.expect(Method::PATCH, &path, &[], MERGE);
        assert_eq!(req.body["metadata"]["resourceVersion"], "18");
        assert_eq!(req.body["metadata"]["finalizers"], json!([]));
        let msg = "the object has been modified; please apply your changes to the latest version and try again";
        answer(
            reply,
            409,
            failure(409, "Conflict", msg, json!({ "name": BLOCK })),
        );
    }).await;
    assert_eq!(
        r,
        Err(IpamError::Conflict {
            name: BLOCK.into(),
            expected: ResourceVersion::server("18"),
        })
    );
    server.expect_no_more(store).await;
}

// ---------------------------------------------------------------------------------------
// 3. The IPAMNode: create by POST, spec and status applies

/// A node the cache does not hold is created by POST (never by an apply that happens to
/// create), with the operator's finalizer and the Node's UID; the answer is cached.
#[tokio::test]
async fn an_ipamnode_the_cache_lacks_is_created_by_post() {
    let (store, mut server) = store();
    let r = exchange(
        store.apply_operator(&N1, node_uid(), OperatorFields::default(), &mut Ungated),
        async {
            let (req, reply) = server.next().await;
            req.expect(
                Method::POST,
                NODES,
                &[("fieldManager", OPERATOR_MANAGER)],
                JSON,
            );
            assert_eq!(
                req.body,
                json!({
                    "apiVersion": API_VERSION, "kind": "IPAMNode",
                    "metadata": { "name": "n1", "finalizers": [FINALIZER] },
                    "spec": { "nodeUID": UID },
                })
            );
            let mut created = node_object("1");
            created["spec"] = json!({ "nodeUID": UID });
            created.as_object_mut().expect("an object").remove("status");
            answer(reply, 201, created.clone());
            // a create drops status: the count (and any conditions) follow at once
            let (req, reply) = server.next().await;
            let path = format!("{NODES}/n1/status");
            req.expect(Method::PATCH, &path, FORCED, APPLY);
            assert_eq!(
                req.body["status"],
                json!({ "allocated": 0, "ipv4": { "allocated": "0" }, "ipv6": { "allocated": "0" } }),
                "no conditions yet: none sent (an empty list would own nothing anyway)"
            );
            created["metadata"]["resourceVersion"] = json!("2");
            created["status"] = json!({ "allocated": 0, "ipv4": { "allocated": "0" }, "ipv6": { "allocated": "0" } });
            answer(reply, 200, created);
        },
    )
    .await;
    let node = r.expect("the create");
    assert_eq!(node.resource_version, Some(ResourceVersion::server("2")));
    let cached = store.cached("n1").expect("cached at once");
    assert_eq!(cached.resource_version, Some(ResourceVersion::server("2")));
    assert!(cached.finalizer);
    server.expect_no_more(store).await;
}

/// The trait's contract: `apply_operator` writes the operator's fields, creating the object
/// if missing. A POST cannot set `status` (an object with a status subresource drops it on
/// create), so a node created with conditions needs its status apply in the same call;
/// otherwise the engine believes them written (its own write's echo wakes nobody), and
/// the count refresh (`NodeStore::refresh_count`) later writes only the count, with the cached,
/// empty conditions.
#[tokio::test]
async fn an_ipamnode_created_with_conditions_gets_its_status_applied() {
    let (store, mut server) = store();
    let fields = OperatorFields {
        addresses: Arc::new([addr("10.0.0.1"), addr("10.0.0.2")].into_iter().collect()),
        conditions: vec![blocked_condition()],
        ..OperatorFields::default()
    };
    let mut gate = Admissions::default();
    let admitted = gate.clone();
    let call = store.apply_operator(&N1, node_uid(), fields, &mut gate);
    let r = exchange(call, async {
        let (req, reply) = server.next().await;
        assert_eq!(admitted.count(), 1, "the POST was admitted first");
        req.expect(
            Method::POST,
            NODES,
            &[("fieldManager", OPERATOR_MANAGER)],
            JSON,
        );
        assert_eq!(
            req.body["spec"],
            json!({ "nodeUID": UID, "addresses": ["10.0.0.1", "10.0.0.2"] })
        );
        let mut created = node_object("1");
        created.as_object_mut().expect("an object").remove("status");
        answer(reply, 201, created.clone());

        let (req, reply) = server.next().await;
        assert_eq!(admitted.count(), 2, "and the status apply");
        let path = format!("{NODES}/n1/status");
        req.expect(Method::PATCH, &path, FORCED, APPLY);
        assert_eq!(
            req.body["status"],
            json!({ "conditions": [blocked()], "allocated": 2, "ipv4": { "allocated": "2" }, "ipv6": { "allocated": "0" } })
        );
        created["metadata"]["resourceVersion"] = json!("2");
        created["status"] = json!({ "conditions": [blocked()], "allocated": 2, "ipv4": { "allocated": "2" }, "ipv6": { "allocated": "0" } });
        answer(reply, 200, created);
    })
    .await;
    r.expect("the create");
    server.expect_no_more(store).await;
}

/// A cached node whose spec changed (a release mark) but whose status did not: one server-
/// side apply of the spec under `tidepool-operator`, not forced, and nothing else.
#[tokio::test]
async fn a_spec_change_is_one_apply_of_the_spec() {
    let (store, mut server) = store_with_node();
    let mut fields = cached_fields(&store);
    fields
        .release
        .insert(addr("10.0.0.2"), ReleaseState::MarkedForRelease);
    let path = format!("{NODES}/n1");
    let r = exchange(
        store.apply_operator(&N1, node_uid(), fields, &mut Ungated),
        async {
            let (req, reply) = server.next().await;
            req.expect(Method::PATCH, &path, FORCED, APPLY);
            let spec = json!({
                "nodeUID": UID,
                "addresses": ["10.0.0.1", "10.0.0.2"],
                "release": { "10.0.0.2": "marked-for-release" },
            });
            assert_eq!(
                req.body,
                spec_apply(spec.clone()),
                "a partial body: no status"
            );
            let mut obj = node_object("11");
            obj["spec"] = spec;
            answer(reply, 200, obj);
        },
    )
    .await;
    let node = r.expect("the apply");
    assert_eq!(node.resource_version, Some(ResourceVersion::server("11")));
    assert_eq!(
        store.cached("n1").expect("cached").resource_version,
        Some(ResourceVersion::server("11"))
    );
    server.expect_no_more(store).await;
}

/// A spec change that also changes the count (a third address): the spec apply, then one
/// apply of `status` through its subresource with the conditions and the new count.
#[tokio::test]
async fn a_spec_and_count_change_is_a_spec_apply_then_a_status_apply() {
    let (store, mut server) = store_with_node();
    let mut fields = cached_fields(&store);
    let three: AddrSet = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        .into_iter()
        .map(addr)
        .collect();
    fields.addresses = Arc::new(three);
    let r = exchange(
        store.apply_operator(&N1, node_uid(), fields, &mut Ungated),
        async {
            let (req, reply) = server.next().await;
            req.expect(Method::PATCH, &format!("{NODES}/n1"), FORCED, APPLY);
            let spec = json!({ "nodeUID": UID, "addresses": ["10.0.0.1", "10.0.0.2", "10.0.0.3"] });
            assert_eq!(req.body, spec_apply(spec.clone()));
            let mut obj = node_object("11");
            obj["spec"] = spec;
            answer(reply, 200, obj.clone());

            let (req, reply) = server.next().await;
            req.expect(Method::PATCH, &format!("{NODES}/n1/status"), FORCED, APPLY);
            assert_eq!(
                req.body,
                json!({
                    "apiVersion": API_VERSION, "kind": "IPAMNode",
                    "metadata": { "name": "n1", "uid": NODE_OBJECT_UID },
                    "status": { "conditions": [pool_ready()], "allocated": 3, "ipv4": { "allocated": "3" }, "ipv6": { "allocated": "0" } },
                }),
                "the operator's status fields only: no spec, no finalizers"
            );
            obj["metadata"]["resourceVersion"] = json!("12");
            obj["status"]["allocated"] = json!(3);
            obj["status"]["ipv4"] = json!({ "allocated": "3" });
            answer(reply, 200, obj);
        },
    )
    .await;
    let node = r.expect("the applies");
    assert_eq!(node.resource_version, Some(ResourceVersion::server("12")));
    server.expect_no_more(store).await;
}

/// A condition change alone: one status apply, no spec apply.
#[tokio::test]
async fn a_condition_change_is_one_apply_of_the_status() {
    let (store, mut server) = store_with_node();
    let mut fields = cached_fields(&store);
    fields.conditions.push(blocked_condition());
    let r = exchange(
        store.apply_operator(&N1, node_uid(), fields, &mut Ungated),
        async {
            let (req, reply) = server.next().await;
            req.expect(Method::PATCH, &format!("{NODES}/n1/status"), FORCED, APPLY);
            let status = json!({ "conditions": [pool_ready(), blocked()], "allocated": 2, "ipv4": { "allocated": "2" }, "ipv6": { "allocated": "0" } });
            assert_eq!(req.body["status"], status);
            assert!(req.body.get("spec").is_none());
            let mut obj = node_object("11");
            obj["status"] = status;
            answer(reply, 200, obj);
        },
    )
    .await;
    r.expect("the apply");
    server.expect_no_more(store).await;
}

/// Nothing changed: no request at all.
#[tokio::test]
async fn an_unchanged_ipamnode_makes_no_request() {
    let (store, server) = store_with_node();
    let fields = cached_fields(&store);
    let node = tokio::time::timeout(
        WAIT,
        store.apply_operator(&N1, node_uid(), fields, &mut Ungated),
    )
    .await
    .expect("no request to wait for")
    .expect("nothing to write");
    assert_eq!(node.resource_version, Some(ResourceVersion::server("10")));
    server.expect_no_more(store).await;
}

// ---------------------------------------------------------------------------------------
// 4. Conflicts, throttling and the retry

/// A 409 with a FieldManagerConflict cause on the spec apply (forced, so only a conflict the
/// force could not settle) is an ownership problem: a Permanent store error that says so
/// (reported, not retried, not re-read at once), and no status apply follows the failed
/// spec apply.
#[tokio::test]
async fn a_field_manager_conflict_on_the_spec_apply_is_reported_as_such() {
    let (store, mut server) = store_with_node();
    let mut fields = cached_fields(&store);
    fields
        .release
        .insert(addr("10.0.0.2"), ReleaseState::MarkedForRelease);
    let r = exchange(
        store.apply_operator(&N1, node_uid(), fields, &mut Ungated),
        async {
            let (req, reply) = server.next().await;
            req.expect(Method::PATCH, &format!("{NODES}/n1"), FORCED, APPLY);
            let msg = "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using \
                   ipam.tidepool.dev/v1alpha1: .spec.release";
            let details = json!({
                "name": "n1", "group": "ipam.tidepool.dev", "kind": "ipamnodes",
                "causes": [{
                    "reason": "FieldManagerConflict",
                    "message": "conflict with \"kubectl-edit\" using ipam.tidepool.dev/v1alpha1",
                    "field": ".spec.release",
                }],
            });
            answer(reply, 409, failure(409, "Conflict", msg, details));
        },
    )
    .await;
    let e = r.expect_err("a conflict");
    assert!(
        matches!(&e, IpamError::Store { op: "apply", name, .. } if name == "n1"),
        "{e:?}"
    );
    assert!(e.to_string().contains("field-manager conflict"), "{e}");
    assert!(e.to_string().contains(".spec.release"), "{e}");
    assert_eq!(
        e.class(),
        ErrorClass::Permanent,
        "reported, never looped on"
    );
    assert_eq!(
        store.cached("n1").expect("cached").resource_version,
        Some(ResourceVersion::server("10")),
        "the cache keeps what the server holds"
    );
    server.expect_no_more(store).await;
}

/// A 429 honours the server's Retry-After (`details.retryAfterSeconds`).
#[tokio::test]
async fn a_throttled_apply_carries_its_retry_after() {
    let (store, mut server) = store_with_node();
    let mut fields = cached_fields(&store);
    fields
        .release
        .insert(addr("10.0.0.2"), ReleaseState::MarkedForRelease);
    let r = exchange(
        store.apply_operator(&N1, node_uid(), fields, &mut Ungated),
        async {
            let (req, reply) = server.next().await;
            req.expect(Method::PATCH, &format!("{NODES}/n1"), FORCED, APPLY);
            let details = json!({ "retryAfterSeconds": 7 });
            let res = Response::builder()
                .status(429)
                .header(header::CONTENT_TYPE, JSON)
                .header(header::RETRY_AFTER, "7")
                .body(Body::from(
                    serde_json::to_vec(&failure(
                        429,
                        "TooManyRequests",
                        "too many requests, please try again later",
                        details,
                    ))
                    .expect("JSON"),
                ))
                .expect("a response");
            reply.send_response(res);
        },
    )
    .await;
    let e = r.expect_err("throttled");
    assert_eq!(
        e.class(),
        ErrorClass::Throttled {
            retry_after: Some(Duration::from_secs(7))
        }
    );
    server.expect_no_more(store).await;
}

/// The store's side of the engine's retry on a lost race. The engine (ipam/src/maintainer/mod.rs,
/// `pass`) retries a pass that returned `Conflict` up to `conflict_retries` (3) times, each
/// time re-reading the IPAMNode from the server (`NodeStore::get`, a GET, not the cache)
/// and re-planning; a fresh look at a block is `get_block`, also a GET. Here: the DELETE at
/// 17 loses, the re-reads are GETs, and the retried DELETE names the version read (18).
#[tokio::test]
async fn a_conflict_is_reread_by_get_and_retried_with_the_fresh_version() {
    let (store, mut server) = store_with_block();
    let block_path = format!("{BLOCKS}/{BLOCK}");
    let node_path = format!("{NODES}/n1");
    let script = async {
        let (req, reply) = server.next().await;
        req.expect(Method::DELETE, &block_path, &[], JSON);
        assert_eq!(req.body["preconditions"]["resourceVersion"], "17");
        let details = json!({ "name": BLOCK, "group": "ipam.tidepool.dev", "kind": "ipamblocks" });
        answer(
            reply,
            409,
            failure(409, "Conflict", "Precondition failed", details),
        );

        let (req, reply) = server.next().await;
        req.expect_get(&node_path);
        answer(reply, 200, node_object("20"));

        let (req, reply) = server.next().await;
        req.expect_get(&block_path);
        let mut acked = block_object("18");
        acked["spec"]["release"] = json!("marked-for-release");
        acked["status"] = json!({ "releaseAck": "ready-for-release" });
        answer(reply, 200, acked);

        let (req, reply) = server.next().await;
        req.expect(Method::DELETE, &block_path, &[], JSON);
        assert_eq!(
            req.body,
            json!({ "preconditions": { "resourceVersion": "18" } })
        );
        let gone =
            json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success" });
        answer(reply, 200, gone);
    };
    let engine = async {
        let first = store
            .delete_block(BLOCK, &ResourceVersion::server("17"), &mut Ungated)
            .await;
        assert_eq!(
            first,
            Err(IpamError::Conflict {
                name: BLOCK.into(),
                expected: ResourceVersion::server("17"),
            })
        );
        let node = NodeStore::get(&store, "n1")
            .await
            .expect("the re-read")
            .expect("n1 exists");
        assert_eq!(node.resource_version, Some(ResourceVersion::server("20")));
        let b = store
            .get_block(BLOCK)
            .await
            .expect("the re-read")
            .expect("the block exists");
        assert!(b.release);
        let rv = b.stored_version().expect("a stored version").clone();
        store.delete_block(BLOCK, &rv, &mut Ungated).await
    };
    let r = exchange(engine, script).await;
    r.expect("the retried release");
    assert!(store.blocks_of("n1").is_empty());
    server.expect_no_more(store).await;
}

// ---------------------------------------------------------------------------------------
// 5. A mark

/// A release mark is a server-side apply of the block's spec with `release:
/// marked-for-release` under `tidepool-operator`; withdrawing it applies the spec without
/// the field (the operator's apply owns it, so it goes).
#[tokio::test]
async fn a_mark_is_an_apply_of_the_blocks_spec() {
    let (store, mut server) = store_with_block();
    let path = format!("{BLOCKS}/{BLOCK}");
    let spec = json!({ "pool": "default", "cidr": CIDR, "node": "n1", "nodeUID": UID });
    let body = |spec: &Value| {
        json!({
            "apiVersion": API_VERSION, "kind": "IPAMBlock",
            "metadata": { "name": BLOCK, "finalizers": [FINALIZER], "uid": BLOCK_OBJECT_UID },
            "spec": spec,
        })
    };
    let mut marked_spec = spec.clone();
    marked_spec["release"] = json!("marked-for-release");

    let r = exchange(
        store.mark_block(BLOCK, ReleaseMark::Set, &mut Ungated),
        async {
            let (req, reply) = server.next().await;
            req.expect(Method::PATCH, &path, FORCED, APPLY);
            assert_eq!(req.body, body(&marked_spec));
            let mut obj = block_object("18");
            obj["spec"] = marked_spec.clone();
            answer(reply, 200, obj);
        },
    )
    .await;
    let b = r.expect("the mark");
    assert!(b.release);
    assert_eq!(b.resource_version, Some(ResourceVersion::server("18")));
    assert!(store.blocks_of("n1")[0].release, "cached at once");

    let r = exchange(
        store.mark_block(BLOCK, ReleaseMark::Withdraw, &mut Ungated),
        async {
            let (req, reply) = server.next().await;
            req.expect(Method::PATCH, &path, FORCED, APPLY);
            assert_eq!(
                req.body,
                body(&spec),
                "the mark withdrawn: no release field"
            );
            answer(reply, 200, block_object("19"));
        },
    )
    .await;
    assert!(!r.expect("the withdrawal").release);
    server.expect_no_more(store).await;
}
