//! The engine's data model: address families, pod identity, and the per-node resource
//! (IPAMNode in DESIGN.md) split by writer — the operator's fields and the node side's.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use crate::addrs::{AddrMap, AddrSet};
use crate::vocab::{ConditionReason, ConditionType};

pub use crate::used::UsedMap;

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    /// The families `keep` holds, in [`Family::ALL`]'s order, as a static slice: a set of
    /// families kept behind a lock is lent out without the lock.
    pub fn subset(keep: impl Fn(Family) -> bool) -> &'static [Family] {
        match (keep(Family::V4), keep(Family::V6)) {
            (false, false) => &[],
            (true, false) => &[Family::V4],
            (false, true) => &[Family::V6],
            (true, true) => &Family::ALL,
        }
    }

    pub fn of(addr: &IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

/// The metrics' `family` label.
impl From<Family> for tidepool_metrics::Family {
    fn from(f: Family) -> Self {
        match f {
            Family::V4 => tidepool_metrics::Family::Ipv4,
            Family::V6 => tidepool_metrics::Family::Ipv6,
        }
    }
}

/// One value per family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerFamily<T> {
    pub v4: T,
    pub v6: T,
}

impl<T> PerFamily<T> {
    pub fn get(&self, f: Family) -> &T {
        match f {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    pub fn get_mut(&mut self, f: Family) -> &mut T {
        match f {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }
}

/// A pod's UID. Kubernetes UIDs are 128-bit UUIDs; holding them as a number keeps
/// per-address records small and comparisons cheap. Aligned to 8 bytes, not a `u128`'s
/// 16, so records that hold one pad less (a UID beside its pod's two addresses takes 40
/// bytes, not 48; a [`crate::PodInfo`] 56, not 64). Being packed, its number is read by
/// value (`uid.0`), never borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(C, packed(8))]
pub struct PodUid(pub u128);

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_uuid(f, self.0)
    }
}

/// A Node's UID (`spec.nodeUID` of an IPAMNode and of an IPAMBlock), held as a number like
/// [`PodUid`]. [`NodeUid::UNKNOWN`] stands where none could be read: an IPAMNode whose
/// `spec.nodeUID` is not a UUID (and the orphan taken from it), a node the cluster-pool
/// source has not seen. No Node has it, so such an IPAMNode is adopted by its Node's next
/// write. Written out, it is the nil UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeUid(pub u128);

impl NodeUid {
    /// No UID could be read (the nil UUID, which no API server gives a Node).
    pub const UNKNOWN: NodeUid = NodeUid(0);
}

// Held per IPAMNode, IPAMBlock and node: no larger than the `u128` it names.
const _: () = assert!(size_of::<NodeUid>() == size_of::<u128>());

impl Default for NodeUid {
    /// Unknown until the Node is seen.
    fn default() -> Self {
        Self::UNKNOWN
    }
}

impl fmt::Display for NodeUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_uuid(f, self.0)
    }
}

/// A UID in the form the API server gives: a UUID, `8-4-4-4-12` lowercase hex digits (the
/// inverse of `tidepool_api::convert::parse_uid`).
fn write_uuid(f: &mut fmt::Formatter<'_>, v: u128) -> fmt::Result {
    write!(
        f,
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (v >> 96) as u32,
        (v >> 80) as u16,
        (v >> 64) as u16,
        (v >> 48) as u16,
        v & 0xffff_ffff_ffff
    )
}

/// An object's resourceVersion. Compared for equality, and ordered only as Kubernetes 1.35
/// allows (KEP-5504, [`ResourceVersion::compare`]); never counted with. An in-memory store makes one from its write counter, a
/// Kubernetes store keeps the string the server gave (no copy of a counter as a string per
/// write in the simulator's hot path). `None` where one is optional: never written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceVersion(Repr);

/// 16 bytes: the server's string behind a thin pointer (an `Arc<str>` would make every
/// IPAMNode, block and node memory 8 bytes larger again).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Repr {
    Counter(u64),
    Server(Arc<String>),
}

impl ResourceVersion {
    /// A version an in-memory store makes from its own write counter.
    pub fn counter(n: u64) -> Self {
        ResourceVersion(Repr::Counter(n))
    }

    /// A version as the API server gave it.
    pub fn server(s: &str) -> Self {
        ResourceVersion(Repr::Server(Arc::new(s.to_owned())))
    }

    /// Which of two versions of objects of one resource is newer, as
    /// `k8s.io/apimachinery/pkg/util/resourceversion.CompareResourceVersion` says since
    /// Kubernetes 1.35 (KEP-5504, stable): each a positive integer in decimal without
    /// leading zeros, of any length. None when either is not one (a server that does not
    /// promise the order): then only equality tells.
    pub fn compare(&self, other: &ResourceVersion) -> Option<std::cmp::Ordering> {
        match (&self.0, &other.0) {
            (Repr::Counter(a), Repr::Counter(b)) => Some(a.cmp(b)),
            (Repr::Server(a), Repr::Server(b)) if comparable(a) && comparable(b) => {
                Some(a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
            }
            _ => None,
        }
    }

    /// 64 bits that tell versions apart (the counter itself, or FNV-1a of the server's
    /// string), for a lock-free hint such as "this event is my own write": a collision
    /// between two server strings (chance 2^-64) would only cost one skipped wake-up, which
    /// the next resync repairs.
    pub fn fingerprint(&self) -> u64 {
        match &self.0 {
            Repr::Counter(n) => *n,
            Repr::Server(s) => s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            }),
        }
    }
}

/// A version [`ResourceVersion::compare`] can order: a positive decimal integer without
/// leading zeros.
fn comparable(s: &str) -> bool {
    !s.is_empty() && !s.starts_with('0') && s.bytes().all(|b| b.is_ascii_digit())
}

impl fmt::Display for ResourceVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Counter(n) => write!(f, "{n}"),
            Repr::Server(s) => f.write_str(s),
        }
    }
}

/// Node names are shared, immutable strings.
pub type NodeName = Arc<str>;

/// One CNI allocation: a 64-bit hash of its key (containerID, ifname). `status.used`
/// carries the full strings; the engine keeps only this, so its memory per address does not
/// grow with the runtime's 64-character container IDs. Tombstones and reclaim answers name
/// the allocation, so a later sandbox of the same pod that got the same address back is
/// never freed by a tombstone meant for an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllocationId(pub u64);

impl AllocationId {
    /// FNV-1a over `container_id`, a NUL and `ifname`. Written out rather than taken from
    /// std's hasher, whose output may change between Rust releases: the operator and the
    /// agent (different builds, different machines) must agree on it.
    pub fn new(container_id: &str, ifname: &str) -> Self {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let bytes = container_id.bytes().chain([0]).chain(ifname.bytes());
        AllocationId(bytes.fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME)))
    }
}

/// A wall-clock instant as whole nanoseconds since the Unix epoch: 8 bytes where a
/// `SystemTime` takes 16, so a [`UsedEntry`] is 40 (with [`PodName`]: a node's entries of
/// 110 pods take a 5 KiB allocation, where 80-byte entries took 10). Exact from 1677 to
/// 2262; an instant outside saturates to the nearest end (order kept; no API server writes
/// such a `since`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixNanos(i64);

impl From<SystemTime> for UnixNanos {
    fn from(t: SystemTime) -> Self {
        let nanos = match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
            Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
        };
        UnixNanos(nanos)
    }
}

impl From<UnixNanos> for SystemTime {
    fn from(t: UnixNanos) -> Self {
        let d = std::time::Duration::from_nanos(t.0.unsigned_abs());
        match t.0 >= 0 {
            true => SystemTime::UNIX_EPOCH + d,
            false => SystemTime::UNIX_EPOCH - d,
        }
    }
}

/// A pod's namespace and name as one shared string, `namespace/name` (neither may hold a
/// `/`), behind one pointer: `arcstr`'s `ArcStr` keeps its count and length with the text,
/// so a [`UsedEntry`] names its pod in 8 bytes, where two `Arc<str>` took 32.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodName(arcstr::ArcStr);

impl PodName {
    pub fn new(namespace: &str, name: &str) -> Self {
        PodName(arcstr::format!("{namespace}/{name}"))
    }

    pub fn namespace(&self) -> &str {
        self.parts().0
    }

    pub fn name(&self) -> &str {
        self.parts().1
    }

    fn parts(&self) -> (&str, &str) {
        self.0.split_once('/').expect("made with a slash")
    }
}

/// `namespace/name`, as kubectl names a pod.
impl fmt::Display for PodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for PodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// `status.used[address]`: which pod holds the address (written by the node side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsedEntry {
    pub pod_uid: PodUid,
    pub pod: PodName,
    /// The allocation (containerID, ifname): the node side's key for ADD and DEL, and what
    /// tombstones name; the pod's identity is its UID.
    pub allocation: AllocationId,
    pub since: UnixNanos,
}

// 40 bytes: see [`UnixNanos`] and [`PodName`]
const _: () = assert!(size_of::<UsedEntry>() == 40);

/// `spec.release[address]` (operator): the release handshake's operator half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseState {
    MarkedForRelease,
    /// The source has taken the address back; the entry goes once the node side dropped its ack.
    Released,
}

/// `status.releaseAck[address]` (node side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAck {
    ReadyForRelease,
    DoNotRelease,
}

/// Why an address is reclaimed; also the `reason` label of the reclaim metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReclaimReason {
    PodDeleted,
    PodTerminal,
    SandboxReplaced,
    NodeDeleted,
}

impl ReclaimReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ReclaimReason::PodDeleted => "pod-deleted",
            ReclaimReason::PodTerminal => "pod-terminal",
            ReclaimReason::SandboxReplaced => "sandbox-replaced",
            ReclaimReason::NodeDeleted => "node-deleted",
        }
    }
}

/// The reclaim metrics' `reason` label.
impl From<ReclaimReason> for tidepool_metrics::ReclaimReason {
    fn from(r: ReclaimReason) -> Self {
        use tidepool_metrics::ReclaimReason as L;
        match r {
            ReclaimReason::PodDeleted => L::PodDeleted,
            ReclaimReason::PodTerminal => L::PodTerminal,
            ReclaimReason::SandboxReplaced => L::SandboxReplaced,
            ReclaimReason::NodeDeleted => L::NodeDeleted,
        }
    }
}

/// `spec.reclaim[address]` (operator): take the address back from this allocation of this
/// pod (the exact `used` entry the operator saw).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tombstone {
    pub pod_uid: PodUid,
    pub allocation: AllocationId,
    pub reason: ReclaimReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimOutcome {
    /// The entry was still the tombstone's allocation: removed, cooldown started.
    Reclaimed,
    /// The entry was another allocation (or gone): nothing was removed.
    Stale,
    /// The entry was that allocation, but its pod runs on the node (not Succeeded or
    /// Failed) and the entry is the pod's newest allocation in its family: nothing was
    /// removed ([`crate::node::NodeSide::tombstone_outcome`]).
    Live,
}

/// `status.reclaimAck[address]` (node side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimAck {
    pub pod_uid: PodUid,
    pub allocation: AllocationId,
    pub outcome: ReclaimOutcome,
}

impl ReclaimAck {
    /// Whether this answers `t` (the same allocation of the same pod).
    pub fn answers(&self, t: &Tombstone) -> bool {
        self.pod_uid == t.pod_uid && self.allocation == t.allocation
    }
}

/// Per-node watermark overrides from `spec.watermarks` (users). Unset fields fall back to
/// the operator's flags. They apply to each family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatermarkOverrides {
    pub pre_allocate: Option<u32>,
    pub min_allocate: Option<u32>,
    pub max_allocate: Option<u32>,
    pub max_above_watermark: Option<u32>,
}

impl WatermarkOverrides {
    pub const NONE: WatermarkOverrides = WatermarkOverrides {
        pre_allocate: None,
        min_allocate: None,
        max_allocate: None,
        max_above_watermark: None,
    };

    /// These overrides where `over` sets none (a pool's under its node's).
    pub fn under(&self, over: &WatermarkOverrides) -> WatermarkOverrides {
        let keep = |mine: Option<u32>, theirs: Option<u32>| theirs.map_or(mine, |_| None);
        WatermarkOverrides {
            pre_allocate: keep(self.pre_allocate, over.pre_allocate),
            min_allocate: keep(self.min_allocate, over.min_allocate),
            max_allocate: keep(self.max_allocate, over.max_allocate),
            max_above_watermark: keep(self.max_above_watermark, over.max_above_watermark),
        }
    }
}

/// A status condition (operator): `type` is the list-map key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub type_: ConditionType,
    pub status: bool,
    pub reason: ConditionReason,
    pub message: String,
    pub last_transition: SystemTime,
}

/// The fields the operator writes (one server-side apply of the operator's field manager).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorFields {
    /// The node's addresses as the source reports them (`spec.addresses`). Shared: a
    /// source's kept holdings and each pass's fields read one copy (change it through
    /// `Arc::make_mut`).
    pub addresses: Arc<AddrSet>,
    /// Release marks (`spec.release`), per address or per run of them.
    pub release: AddrMap<ReleaseState>,
    pub reclaim: BTreeMap<IpAddr, Tombstone>,
    pub conditions: Vec<Condition>,
    /// The pools the node's pods wait for and get no address of (`status.poolUsage[]
    /// .blocked`), sorted, each once.
    pub blocked_pools: Vec<BlockedPool>,
}

/// A pool of one family the node's pods wait for and cannot get addresses of: it has none
/// left, or a pod's annotation names it and the pod may not use it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockedPool {
    pub pool: Arc<str>,
    pub family: Family,
}

impl OperatorFields {
    /// Whether writing `self` changes the spec part (`spec.addresses`, `.release`,
    /// `.reclaim`), a request apart from the status part (`status.conditions`).
    pub fn spec_differs(&self, old: &OperatorFields) -> bool {
        self.addresses != old.addresses
            || self.release != old.release
            || self.reclaim != old.reclaim
    }
}

/// A node's few entries by address (its cooldowns, its reclaim answers), in address order:
/// a sorted `Vec`, 40-56 bytes an entry. A `BTreeMap` keeps its 376-552-byte leaf once it
/// held an entry, so every cached IPAMNode the churn had reached kept two (BENCHMARKS.md,
/// "What grew from minute 2").
pub type FewByAddr<V> = litemap::LiteMap<IpAddr, V>;

/// The fields the node side writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSideFields {
    pub used: UsedMap,
    /// Address → end of its reuse cooldown.
    pub cooldown: FewByAddr<SystemTime>,
    pub release_ack: AddrMap<ReleaseAck>,
    pub reclaim_ack: FewByAddr<ReclaimAck>,
}

impl NodeSideFields {
    /// The addresses cooling down at `now`. The node side drops an ended cooldown only
    /// with a write it makes for another change, so `cooldown` may still list it: it is
    /// over all the same.
    pub fn cooling(&self, now: SystemTime) -> impl Iterator<Item = &IpAddr> {
        (self.cooldown.iter())
            .filter(move |(_, until)| **until > now)
            .map(|(a, _)| a)
    }

    /// The earliest cooldown end after `now`.
    pub fn next_cooldown_end(&self, now: SystemTime) -> Option<SystemTime> {
        next_cooldown_end(self.cooldown.values(), now)
    }
}

/// The earliest end after `now` among a node's cooldown `ends` (the published fields' and
/// the node side's record share it).
pub(crate) fn next_cooldown_end<'a>(
    ends: impl Iterator<Item = &'a SystemTime>,
    now: SystemTime,
) -> Option<SystemTime> {
    ends.filter(|u| **u > now).min().copied()
}

/// One IPAMNode: same name as its Node, carrying the Node's UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamNode {
    pub name: NodeName,
    pub node_uid: NodeUid,
    /// None until the store has written it.
    pub resource_version: Option<ResourceVersion>,
    /// `spec.watermarks` (users).
    pub watermarks: WatermarkOverrides,
    pub operator: OperatorFields,
    pub node: NodeSideFields,
    /// The operator's finalizer is present.
    pub finalizer: bool,
    /// Someone deleted it (its `deletionTimestamp` is set; the finalizer holds it).
    pub deleting: bool,
}

impl IpamNode {
    pub fn new(name: NodeName, node_uid: NodeUid) -> Self {
        Self {
            name,
            node_uid,
            resource_version: None,
            watermarks: WatermarkOverrides::default(),
            operator: OperatorFields::default(),
            node: NodeSideFields::default(),
            finalizer: true,
            deleting: false,
        }
    }
}

/// One IPAMBlock (cluster-pool): a block granted to a node. Creating it is the claim; the
/// release mark and the node side's answer live on it; deleting it with a resourceVersion
/// precondition is the release (DESIGN.md "Resources").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamBlock {
    /// The canonical name derived from the CIDR (`v4-10-0-1-16-28`).
    pub name: Arc<str>,
    pub cidr: ipnet::IpNet,
    /// `spec.pool`.
    pub pool: Arc<str>,
    /// `spec.node` and `spec.nodeUID`.
    pub node: NodeName,
    pub node_uid: NodeUid,
    /// `spec.release` (operator): marked for release.
    pub release: bool,
    /// `status.releaseAck` (node side).
    pub ack: Option<ReleaseAck>,
    /// None until the store has written it.
    pub resource_version: Option<ResourceVersion>,
    /// Someone deleted it (its `deletionTimestamp` is set; the operator's finalizer holds
    /// it): it drains like a block of a removed CIDR, and goes once the node side let go.
    pub deleting: bool,
}

impl IpamBlock {
    /// The resourceVersion the store gave the block (a delete's precondition); `NotFound`
    /// for a block that was never stored.
    pub fn stored_version(&self) -> Result<&ResourceVersion, crate::error::IpamError> {
        self.resource_version
            .as_ref()
            .ok_or_else(|| crate::error::IpamError::NotFound {
                name: self.name.to_string(),
            })
    }
}

/// What the engine knows of a Node object (from the Node informer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: NodeName,
    pub uid: NodeUid,
    /// The Node's allocatable pods; caps the pool (rounded up to a whole block).
    pub allocatable_pods: u32,
    pub cordoned: bool,
    pub terminating: bool,
}

impl NodeInfo {
    /// Allocatable pods when a Node reports none (or a quantity that is not a plain count,
    /// or no Node is there at all): the kubelet's default `maxPods`.
    pub const DEFAULT_ALLOCATABLE_PODS: u32 = 110;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod's namespace and name come back as given, the empty ones too, and it reads
    /// as kubectl names it.
    #[test]
    fn pod_names_keep_their_namespace_and_name() {
        for (ns, name) in [
            ("default", "web-0"),
            ("kube-system", "a.b-c"),
            ("", ""),
            ("ns", ""),
        ] {
            let p = PodName::new(ns, name);
            assert_eq!((p.namespace(), p.name()), (ns, name));
            assert_eq!(p.to_string(), format!("{ns}/{name}"));
        }
        assert_ne!(PodName::new("a", "bc"), PodName::new("ab", "c"));
        assert_eq!(size_of::<PodName>(), 8);
    }

    /// Exact both ways within its range, in order, and saturating past it.
    #[test]
    fn unix_nanos_round_trip_exactly_and_saturate_in_order() {
        use std::time::Duration;
        let epoch = SystemTime::UNIX_EPOCH;
        let times = [
            epoch - Duration::new(1_000, 7),
            epoch - Duration::from_nanos(1),
            epoch,
            epoch + Duration::from_nanos(1),
            epoch + Duration::new(1_764_374_400, 123_456_789),
        ];
        for t in times {
            assert_eq!(SystemTime::from(UnixNanos::from(t)), t);
        }
        let n: Vec<UnixNanos> = times.iter().map(|t| UnixNanos::from(*t)).collect();
        assert!(n.windows(2).all(|w| w[0] < w[1]), "{n:?}");
        let far = Duration::from_secs(300 * 365 * 86_400);
        assert_eq!(UnixNanos::from(epoch + far), UnixNanos(i64::MAX));
        assert_eq!(UnixNanos::from(epoch - far), UnixNanos(i64::MIN));
        assert!(UnixNanos::from(epoch - far) < n[0] && n[4] < UnixNanos::from(epoch + far));
    }

    /// The cases of `CompareResourceVersion`'s own table (apimachinery
    /// pkg/util/resourceversion): by length first, then digit by digit; zero, leading zeros
    /// and non-digits are not comparable.
    #[test]
    fn versions_compare_as_kubernetes_compares_them() {
        use std::cmp::Ordering::*;
        let rv = ResourceVersion::server;
        assert_eq!(rv("9").compare(&rv("10")), Some(Less));
        assert_eq!(rv("123").compare(&rv("122")), Some(Greater));
        assert_eq!(
            rv("99999999999999999999").compare(&rv("99999999999999999999")),
            Some(Equal)
        );
        for bad in ["0", "012", "12a", "", "-1"] {
            assert_eq!(rv(bad).compare(&rv("5")), None, "{bad:?}");
            assert_eq!(rv("5").compare(&rv(bad)), None, "{bad:?}");
        }
        let n = ResourceVersion::counter;
        assert_eq!(n(3).compare(&n(2)), Some(Greater));
        assert_eq!(n(3).compare(&rv("3")), None, "two kinds of store");
    }

    /// A pool's overrides count where its node's set nothing.
    #[test]
    fn overrides_under_others_keep_what_the_others_leave_unset() {
        let pool = WatermarkOverrides {
            pre_allocate: Some(40),
            max_allocate: Some(64),
            ..WatermarkOverrides::NONE
        };
        let node = WatermarkOverrides {
            pre_allocate: Some(8),
            min_allocate: Some(2),
            ..WatermarkOverrides::NONE
        };
        let want = WatermarkOverrides {
            max_allocate: Some(64),
            ..WatermarkOverrides::NONE
        };
        assert_eq!(pool.under(&node), want);
        assert_eq!(pool.under(&WatermarkOverrides::NONE), pool);
    }

    /// The metrics' labels of a family and a reclaim reason are the strings the engine
    /// recorded before it recorded through their enums.
    #[test]
    fn metric_labels_spell_as_the_engine_does() {
        for f in Family::ALL {
            assert_eq!(tidepool_metrics::Family::from(f).as_str(), f.as_str());
        }
        use ReclaimReason::*;
        for r in [PodDeleted, PodTerminal, SandboxReplaced, NodeDeleted] {
            assert_eq!(
                tidepool_metrics::ReclaimReason::from(r).as_str(),
                r.as_str()
            );
        }
    }

    /// resourceVersions are compared for equality only: a store's counter and a server's
    /// string are different versions even when they spell the same.
    #[test]
    fn resource_versions_are_opaque() {
        let c = ResourceVersion::counter(42);
        assert_eq!(c, ResourceVersion::counter(42));
        assert_ne!(c, ResourceVersion::counter(43));
        let s = ResourceVersion::server("42");
        assert_eq!(s, ResourceVersion::server("42"));
        assert_ne!(s, c);
        assert_eq!((c.to_string(), s.to_string()), ("42".into(), "42".into()));
        assert_ne!(s.fingerprint(), ResourceVersion::server("43").fingerprint());
        assert_eq!(c.fingerprint(), 42);
        // every IPAMNode, block and node memory holds one (BENCHMARKS.md: idle node)
        assert_eq!(std::mem::size_of::<Option<ResourceVersion>>(), 16);
    }
}
