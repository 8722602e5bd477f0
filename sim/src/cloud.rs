//! sim-cloud: an ENI-like simulated cloud implementing [`IpSource`] (DESIGN.md "IP sources",
//! modelled on Cilium's EC2 mock, research/cilium-operator-ipam.md §1.1, §1.5, §8.2).
//!
//! # Model
//!
//! - **Instances** (one per node, [`SimCloud::add_instance`]) have an [`InstanceType`]: a
//!   maximum number of network interfaces and of IPv4 addresses per interface. Each interface
//!   has one *primary* address that is not for pods, so a type gives
//!   `max_interfaces × (addresses_per_interface − 1)` pod addresses (m5.large: 3 × 9 = 27).
//!   An instance starts with its primary interface `eth0` (its primary address taken from the
//!   subnet, no secondary addresses). Interfaces are never detached: an interface emptied by
//!   releases keeps its slot (Cilium never deletes ENIs either).
//! - **Subnets** are IPv4 CIDRs of `subnet_size` (prefix length 8..=28), laid out one after
//!   another from 10.0.0.0 (10.0.0.0/16, 10.1.0.0/16, … — DESIGN.md: /16 per 1,000 nodes, see
//!   [`subnets_for_nodes`]). As in AWS the first four and the last address of a subnet are
//!   reserved. Every address of an instance (primaries too) comes from the instance's subnet,
//!   chosen at registration (the one with most free addresses; ties: the lowest). Free
//!   addresses are tracked lazily (a next offset plus a set of returned addresses, reused
//!   lowest first), so memory follows what is granted, not the subnet's size.
//! - **Calls.** Every engine call to [`IpSource::allocate`] or [`IpSource::release`] is one
//!   cloud call (one mutating request, counted, rate limited, delayed, subject to faults):
//!   - `allocate(count)` assigns `count` secondary addresses to the first interface (lowest
//!     index) that has room (AssignPrivateIpAddresses) or, only when every attached interface
//!     is full and an interface slot is free, creates and attaches a new interface *with* its
//!     `count` secondary addresses in the same call (CreateNetworkInterface with
//!     SecondaryPrivateIpAddressCount; Cilium's new-ENI size `min(count, perInterface − 1)`).
//!     A new interface takes `count + 1` subnet addresses (its primary). A call never spans
//!     interfaces: asking more than the chosen interface can take fails (transient,
//!     `PrivateIpAddressLimitExceeded`); asking more than the subnet has fails as exhausted.
//!   - [`IpSource::prepare_allocation`] answers what *one* call can give now:
//!     `min(want, limit, room of that interface, subnet free)` (a new interface also needs its
//!     primary from the subnet); 0 when the instance is full or the subnet cannot serve it, so
//!     the engine sees the node exhausted / at capacity. Filling a node may take several passes:
//!     38 addresses on a fresh m5.4xlarge (29 per interface) are 29, then 9.
//!   - `release(addrs)` unassigns (unconditionally) every listed secondary address the node
//!     holds, on any of its interfaces, in one call; other addresses (primaries, addresses of
//!     other nodes, addresses already gone) are ignored, so a repeated release is harmless.
//!     [`IpSource::prepare_release`] proposes addresses of *one* interface only (the one with
//!     the most releasable addresses; ties: the lowest index), never a primary.
//!   - `describe(node)` is the cloud's truth: every secondary address of the node. Reads are
//!     free (not counted, not rate limited, no latency — as in Cilium's mock) but fail during a
//!     brown-out.
//! - **Latency** ([`SimCloud::with_latency`]): every mutating call sleeps it (tokio time, so
//!   virtual under paused time) and then takes effect at once.
//! - **The cloud's own rate limit** ([`SimCloud::with_rate_limit`]): a governor bucket (qps,
//!   burst) on [`TokioGovernorClock`]. A mutating call over the limit is answered "throttled"
//!   ([`ErrorClass::Throttled`]) with a Retry-After of the bucket's next token; it takes no
//!   token and has no effect.
//! - **Faults** ([`CloudFaults`], [`SimCloud::set_faults`]), drawn per mutating call from a
//!   seeded RNG after the rate limit: a brown-out window `[from, to)` in which every call
//!   (describe too) fails transient; `error_rate` (transient, before effect); `throttle_rate`
//!   (throttled with `retry_after`, before effect); `lost_reply_rate` (the call takes effect,
//!   then the caller waits `timeout` more and gets a transient error — `describe` shows the
//!   change).
//! - **Counters** ([`SimCloud::calls`], [`SimCloud::calls_for`], [`SimCloud::counters`]):
//!   mutating calls received (throttled and failed ones included), throttled answers (rate
//!   limit and injected), per-node calls.
//! - A [`SourceHook`] hears every grant and release of secondary addresses (primaries are
//!   not pod addresses and are never reported), also for calls whose reply is lost.
//!
//! # Oracle
//!
//! [`minimum_calls`] is DESIGN.md's `source_calls_minimum` for one node: the fewest mutating
//! calls that take it from its current secondary addresses per interface to `target`, and
//! [`longest_chain`] the most calls one node must make in sequence (a node's calls never
//! overlap, so it is the largest per-node minimum).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::Clock as _;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota as GovQuota, RateLimiter};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use tidepool_ipam::plan::NodePools;
use tidepool_ipam::pool::choice::Subject;
use tidepool_ipam::{AddrSet, Gate, IpSource, Quota, SourceHook};
use tidepool_ipam::{ErrorClass, IpamError};
use tidepool_ipam::{Family, NodeName, PerFamily, PodUid};
use tidepool_ipam::{TokioGovernorClock, TokioInstant};

/// Nodes per subnet by default (DESIGN.md: a /16 per 1,000 nodes).
pub const NODES_PER_SUBNET: u64 = 1_000;
/// Default subnet prefix length.
pub const DEFAULT_SUBNET_SIZE: u8 = 16;
/// Smallest accepted subnet prefix length.
pub const MIN_SUBNET_SIZE: u8 = 8;
/// Largest accepted subnet prefix length (AWS's smallest subnet, /28).
pub const MAX_SUBNET_SIZE: u8 = 28;
/// First address of the first subnet.
pub const SUBNET_BASE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 0);
/// Addresses reserved at the start of each subnet (network, router, DNS, future use).
const RESERVED_LOW: u64 = 4;
/// Addresses reserved at the end of each subnet (broadcast).
const RESERVED_HIGH: u64 = 1;

/// Subnets needed for `nodes` nodes at [`NODES_PER_SUBNET`] each (at least one).
pub fn subnets_for_nodes(nodes: u64) -> u32 {
    nodes.div_ceil(NODES_PER_SUBNET).max(1) as u32
}

/// Errors of the simulated cloud's set-up (not of its calls, which return [`IpamError`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CloudError {
    #[error("unknown instance type {name:?} (known: {known})")]
    UnknownInstanceType { name: String, known: String },
    #[error(
        "invalid subnet size /{prefix}: must be a prefix length from /{MIN_SUBNET_SIZE} to /{MAX_SUBNET_SIZE}"
    )]
    InvalidSubnetSize { prefix: u8 },
    #[error("{subnets} subnets of /{prefix} do not fit above {SUBNET_BASE}")]
    TooManySubnets { subnets: u32, prefix: u8 },
    #[error("invalid cloud rate limit {name} = {value}: {reason}")]
    InvalidRateLimit {
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error("instance {node} is already registered")]
    DuplicateInstance { node: String },
    #[error("no subnet {index} (there are {subnets})")]
    NoSuchSubnet { index: usize, subnets: usize },
    #[error("subnet {cidr} has no free address for the primary interface of {node}")]
    SubnetExhausted { cidr: String, node: String },
}

impl From<CloudError> for IpamError {
    /// As a bad setting naming the `simulate` flag it comes from.
    fn from(e: CloudError) -> IpamError {
        let (name, value) = match &e {
            CloudError::UnknownInstanceType { name, .. } => ("instance-type", name.clone()),
            CloudError::InvalidSubnetSize { prefix }
            | CloudError::TooManySubnets { prefix, .. } => ("subnet-size", prefix.to_string()),
            CloudError::InvalidRateLimit { name, value, .. } => (*name, value.clone()),
            CloudError::DuplicateInstance { node } | CloudError::SubnetExhausted { node, .. } => {
                ("nodes", node.clone())
            }
            CloudError::NoSuchSubnet { index, .. } => ("subnet", index.to_string()),
        };
        IpamError::InvalidSetting {
            name,
            value,
            reason: e.to_string(),
        }
    }
}

/// An instance type's interface limits (Cilium's EC2 mock, research §8.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InstanceType {
    pub name: &'static str,
    /// Network interfaces that can be attached (eth0 included).
    pub max_interfaces: u32,
    /// IPv4 addresses per interface, its primary included.
    pub addresses_per_interface: u32,
}

impl InstanceType {
    /// The built-in types.
    pub const ALL: [InstanceType; 6] = [
        InstanceType::new("m5.large", 3, 10),
        InstanceType::new("m5.4xlarge", 8, 30),
        InstanceType::new("m4.xlarge", 4, 15),
        InstanceType::new("t2.xlarge", 3, 15),
        InstanceType::new("c3.xlarge", 4, 15),
        InstanceType::new("m4.large", 2, 10),
    ];

    pub const fn new(
        name: &'static str,
        max_interfaces: u32,
        addresses_per_interface: u32,
    ) -> Self {
        Self {
            name,
            max_interfaces,
            addresses_per_interface,
        }
    }

    /// A built-in type by name; the error names the unknown type and the known ones.
    pub fn by_name(name: &str) -> Result<InstanceType, CloudError> {
        Self::ALL
            .iter()
            .find(|t| t.name == name)
            .copied()
            .ok_or_else(|| CloudError::UnknownInstanceType {
                name: name.to_string(),
                known: Self::ALL.map(|t| t.name).join(", "),
            })
    }

    /// Pod (secondary) addresses one interface can hold: its addresses minus the primary.
    pub fn pod_addresses_per_interface(&self) -> u64 {
        u64::from(self.addresses_per_interface.saturating_sub(1))
    }

    /// Pod addresses of a whole instance (Cilium's `GetMaximumAllocatableIPv4` with
    /// first-interface-index 0): interfaces × (addresses per interface − 1).
    pub fn max_pod_addresses(&self) -> u64 {
        u64::from(self.max_interfaces) * self.pod_addresses_per_interface()
    }
}

impl fmt::Display for InstanceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// The fewest mutating calls that take a node of type `itype`, whose attached interfaces
/// hold `current[i]` secondary addresses each, to `target` pod addresses (DESIGN.md's
/// `source_calls_minimum`, per node).
///
/// - Up: one call serves one interface (an assignment up to its room, or the creation of a
///   new interface with up to `perInterface − 1` addresses), and two calls to one interface
///   could be merged; so the minimum is the number of largest rooms (free slots count
///   `perInterface − 1` each) that together cover the deficit. A target above what the type
///   can hold counts the calls to fill the node (it then settles at capacity).
/// - Down: one call, since one unassign may name any of the node's addresses.
pub fn minimum_calls(itype: &InstanceType, current: &[u64], target: u64) -> u64 {
    let per = itype.pod_addresses_per_interface();
    let have: u64 = current.iter().sum();
    let target = target.min(have.max(itype.max_pod_addresses()));
    if target < have {
        return 1;
    }
    let mut need = target - have;
    if need == 0 {
        return 0;
    }
    let slots = (itype.max_interfaces as usize).saturating_sub(current.len());
    let mut rooms: Vec<u64> = current
        .iter()
        .map(|&c| per.saturating_sub(c))
        .filter(|&r| r > 0)
        .chain(std::iter::repeat_n(per, slots))
        .collect();
    rooms.sort_unstable_by(|a, b| b.cmp(a));
    let mut calls = 0;
    for r in rooms {
        calls += 1;
        if r >= need {
            return calls;
        }
        need -= r;
    }
    calls // unreachable with target capped; kept total
}

/// The most calls one node must make in sequence, over `nodes` (type, current secondary
/// addresses per interface, target): a node's calls never overlap, so it is the largest
/// per-node [`minimum_calls`].
pub fn longest_chain<'a>(
    nodes: impl IntoIterator<Item = (&'a InstanceType, &'a [u64], u64)>,
) -> u64 {
    nodes
        .into_iter()
        .map(|(t, c, target)| minimum_calls(t, c, target))
        .max()
        .unwrap_or(0)
}

/// Injectable faults of the simulated cloud.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CloudFaults {
    /// Share of mutating calls that fail transient before taking effect.
    pub error_rate: f64,
    /// Share of mutating calls answered "throttled" with `retry_after`, before effect.
    pub throttle_rate: f64,
    pub retry_after: Duration,
    /// Share of mutating calls that take effect and whose reply is then lost.
    pub lost_reply_rate: f64,
    /// How much longer than the latency a lost reply keeps the caller waiting (its timeout).
    pub timeout: Duration,
    /// Every call in `[from, to)` fails transient (describe included).
    pub brown_out: Option<(Instant, Instant)>,
}

/// One interface as the cloud knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceState {
    /// Device index (0 = eth0).
    pub index: u32,
    /// Not for pods; never granted or released.
    pub primary: Ipv4Addr,
    pub secondaries: BTreeSet<Ipv4Addr>,
}

/// One instance as the cloud knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceState {
    pub instance_type: InstanceType,
    /// Index of its subnet.
    pub subnet: usize,
    pub interfaces: Vec<InterfaceState>,
}

impl InstanceState {
    /// Secondary addresses per attached interface (the oracle's `current`).
    pub fn secondary_counts(&self) -> Vec<u64> {
        self.interfaces
            .iter()
            .map(|i| i.secondaries.len() as u64)
            .collect()
    }

    /// Pod addresses the instance holds.
    pub fn pod_addresses(&self) -> u64 {
        self.interfaces
            .iter()
            .map(|i| i.secondaries.len() as u64)
            .sum()
    }
}

/// Counters of the simulated cloud.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CloudCounters {
    /// Mutating calls received (throttled and failed ones included).
    pub calls: u64,
    /// Answers "throttled" (the cloud's rate limit and injected throttling).
    pub throttled: u64,
    /// Mutating calls that failed for any other reason (injected errors, brown-out, lost
    /// replies, refused requests).
    pub failed: u64,
    /// Interfaces created by allocate calls.
    pub interfaces_created: u64,
    /// describe calls (reads; not in `calls`).
    pub describes: u64,
}

struct Subnet {
    /// Its name (`subnet-<index>`): the pool its nodes' addresses count under (scarcity's
    /// pressure, the metrics' `pool` label).
    name: Arc<str>,
    /// First address of the CIDR.
    base: u32,
    prefix: u8,
    /// Usable addresses (the CIDR minus the reserved ones).
    capacity: u64,
    /// Next never-used usable offset (0-based from the first usable address).
    next: u64,
    returned: BTreeSet<Ipv4Addr>,
}

impl Subnet {
    fn free(&self) -> u64 {
        self.capacity - self.next + self.returned.len() as u64
    }

    fn take(&mut self) -> Option<Ipv4Addr> {
        if let Some(a) = self.returned.pop_first() {
            return Some(a);
        }
        if self.next >= self.capacity {
            return None;
        }
        let a = Ipv4Addr::from(self.base + (RESERVED_LOW + self.next) as u32);
        self.next += 1;
        Some(a)
    }

    fn give_back(&mut self, a: Ipv4Addr) {
        self.returned.insert(a);
    }

    fn cidr(&self) -> String {
        format!("{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

/// Where one allocate call would put its addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// An attached interface (position in the instance's list) with this much room.
    Existing(usize, u64),
    /// A new interface holding up to this many secondaries.
    New(u64),
}

struct State {
    subnets: Vec<Subnet>,
    instances: BTreeMap<NodeName, InstanceState>,
    /// Secondary address → (node, interface position).
    owner: BTreeMap<Ipv4Addr, (NodeName, usize)>,
    faults: CloudFaults,
    rng: SmallRng,
    counters: CloudCounters,
    per_node: BTreeMap<NodeName, u64>,
}

impl State {
    /// The addresses of subnet `subnet` pods can have: its free ones and those its
    /// instances' pods hold (not the interfaces' primaries).
    fn pod_capacity(&self, subnet: usize) -> Option<u64> {
        let held: u64 = (self.instances.values())
            .filter(|i| i.subnet == subnet)
            .map(InstanceState::pod_addresses)
            .sum();
        Some(self.subnets.get(subnet)?.free() + held)
    }

    fn target(&self, inst: &InstanceState) -> Option<Target> {
        let per = inst.instance_type.pod_addresses_per_interface();
        for (i, ifc) in inst.interfaces.iter().enumerate() {
            let room = per.saturating_sub(ifc.secondaries.len() as u64);
            if room > 0 {
                return Some(Target::Existing(i, room));
            }
        }
        if (inst.interfaces.len() as u64) < u64::from(inst.instance_type.max_interfaces) && per > 0
        {
            return Some(Target::New(per));
        }
        None
    }

    /// What one allocate call can give `node` now.
    fn one_call(&self, node: &NodeName) -> u64 {
        let Some(inst) = self.instances.get(node) else {
            return 0;
        };
        let free = self.subnets[inst.subnet].free();
        match self.target(inst) {
            Some(Target::Existing(_, room)) => room.min(free),
            Some(Target::New(room)) => room.min(free.saturating_sub(1)),
            None => 0,
        }
    }
}

type Limiter =
    RateLimiter<NotKeyed, InMemoryState, TokioGovernorClock, NoOpMiddleware<TokioInstant>>;

/// The simulated cloud. Cheap to clone (shared state).
#[derive(Clone)]
pub struct SimCloud {
    /// The type of instances registered when the simulator adds a machine.
    default_type: InstanceType,
    latency: Duration,
    /// (qps, burst) of the cloud's own limit.
    rate_limit: Option<(f64, u32)>,
    limiter: Option<Arc<Limiter>>,
    state: Arc<Mutex<State>>,
    hook: Option<Arc<dyn SourceHook>>,
}

impl fmt::Debug for SimCloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.lock();
        f.debug_struct("SimCloud")
            .field("latency", &self.latency)
            .field("rate_limited", &self.limiter.is_some())
            .field("subnets", &s.subnets.len())
            .field("instances", &s.instances.len())
            .field("counters", &s.counters)
            .finish()
    }
}

fn err(op: &'static str, node: &NodeName, class: ErrorClass, message: String) -> IpamError {
    IpamError::Source {
        op,
        node: node.to_string(),
        class,
        message,
    }
}

/// How a mutating call's preamble (rate limit, brown-out, fault draws) ended.
enum Admit {
    /// The call takes effect; its reply as drawn.
    Proceed(Reply),
    Refused(IpamError),
}

/// Whether the caller hears of a call that took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    Sent,
    /// The caller waits for its timeout, then sees a transient failure.
    Lost,
}

impl SimCloud {
    /// A cloud of `subnets` IPv4 subnets of prefix length `subnet_size`, laid out from
    /// 10.0.0.0, no latency, no rate limit, no faults; `seed` drives the fault draws.
    pub fn new(subnets: u32, subnet_size: u8, seed: u64) -> Result<Self, CloudError> {
        if !(MIN_SUBNET_SIZE..=MAX_SUBNET_SIZE).contains(&subnet_size) {
            return Err(CloudError::InvalidSubnetSize {
                prefix: subnet_size,
            });
        }
        let step = 1u64 << (32 - subnet_size);
        let base = u64::from(u32::from(SUBNET_BASE));
        if subnets == 0 || base + u64::from(subnets) * step > 1 << 32 {
            return Err(CloudError::TooManySubnets {
                subnets,
                prefix: subnet_size,
            });
        }
        let subnets = (0..u64::from(subnets))
            .map(|i| Subnet {
                name: Arc::from(format!("subnet-{i}")),
                base: (base + i * step) as u32,
                prefix: subnet_size,
                capacity: step - RESERVED_LOW - RESERVED_HIGH,
                next: 0,
                returned: BTreeSet::new(),
            })
            .collect();
        Ok(Self {
            default_type: InstanceType::by_name("m5.4xlarge").expect("a built-in type"),
            latency: Duration::ZERO,
            rate_limit: None,
            limiter: None,
            state: Arc::new(Mutex::new(State {
                subnets,
                instances: BTreeMap::new(),
                owner: BTreeMap::new(),
                faults: CloudFaults::default(),
                rng: SmallRng::seed_from_u64(seed),
                counters: CloudCounters::default(),
                per_node: BTreeMap::new(),
            })),
            hook: None,
        })
    }

    /// DESIGN.md's default layout for `nodes` nodes: one subnet per 1,000 nodes.
    pub fn for_nodes(nodes: u64, subnet_size: u8, seed: u64) -> Result<Self, CloudError> {
        Self::new(subnets_for_nodes(nodes), subnet_size, seed)
    }

    /// The type of the instances the simulator registers for new machines.
    pub fn with_instance_type(mut self, itype: InstanceType) -> Self {
        self.default_type = itype;
        self
    }

    /// Every mutating call takes this long (tokio time).
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// The cloud's own rate limit on mutating calls: `qps` calls per second, bursts of
    /// `burst`. Rejects a qps that is not finite or below 0.001, and a burst of 0.
    pub fn with_rate_limit(mut self, qps: f64, burst: u32) -> Result<Self, CloudError> {
        if !qps.is_finite() || qps < 0.001 {
            return Err(CloudError::InvalidRateLimit {
                name: "cloud-qps",
                value: qps.to_string(),
                reason: "must be a finite number of calls per second, at least 0.001".into(),
            });
        }
        let Some(burst) = NonZeroU32::new(burst) else {
            return Err(CloudError::InvalidRateLimit {
                name: "cloud-burst",
                value: burst.to_string(),
                reason: "must be at least 1".into(),
            });
        };
        let period = Duration::from_secs_f64(1.0 / qps).max(Duration::from_nanos(1));
        let quota = GovQuota::with_period(period)
            .expect("period is at least 1 ns")
            .allow_burst(burst);
        self.rate_limit = Some((qps, burst.get()));
        self.limiter = Some(Arc::new(RateLimiter::direct_with_clock(
            quota,
            TokioGovernorClock,
        )));
        Ok(self)
    }

    pub fn with_hook(mut self, hook: Arc<dyn SourceHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Changes the injected faults (at any time).
    pub fn set_faults(&self, faults: CloudFaults) {
        self.state.lock().faults = faults;
    }

    /// The call latency.
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// The cloud's own limit as (qps, burst); None = unlimited (for the lower bound).
    pub fn rate_limit(&self) -> Option<(f64, u32)> {
        self.rate_limit
    }

    /// Registers `node`'s instance of type `itype` in the subnet with the most free
    /// addresses (ties: the lowest index), with its primary interface eth0 (its primary
    /// address from the subnet, no secondary addresses). Not a counted call.
    pub fn add_instance(&self, node: &NodeName, itype: InstanceType) -> Result<(), CloudError> {
        let subnet = {
            let s = self.state.lock();
            let mut best = 0;
            for (i, sn) in s.subnets.iter().enumerate() {
                if sn.free() > s.subnets[best].free() {
                    best = i;
                }
            }
            best
        };
        self.add_instance_in(node, itype, subnet)
    }

    /// Registers `node`'s instance in subnet `subnet` (see [`SimCloud::add_instance`]).
    pub fn add_instance_in(
        &self,
        node: &NodeName,
        itype: InstanceType,
        subnet: usize,
    ) -> Result<(), CloudError> {
        let mut s = self.state.lock();
        if s.instances.contains_key(node) {
            return Err(CloudError::DuplicateInstance {
                node: node.to_string(),
            });
        }
        let subnets = s.subnets.len();
        let Some(sn) = s.subnets.get_mut(subnet) else {
            return Err(CloudError::NoSuchSubnet {
                index: subnet,
                subnets,
            });
        };
        let Some(primary) = sn.take() else {
            return Err(CloudError::SubnetExhausted {
                cidr: sn.cidr(),
                node: node.to_string(),
            });
        };
        s.instances.insert(
            node.clone(),
            InstanceState {
                instance_type: itype,
                subnet,
                interfaces: vec![InterfaceState {
                    index: 0,
                    primary,
                    secondaries: BTreeSet::new(),
                }],
            },
        );
        Ok(())
    }

    /// The instance is terminated (the machine is gone): all its addresses go back to the
    /// subnet (the hook hears the secondaries released) and `describe` answers empty.
    /// Returns whether the instance existed. Not a counted call.
    pub fn terminate_instance(&self, node: &NodeName) -> bool {
        let released: AddrSet = {
            let mut s = self.state.lock();
            let Some(inst) = s.instances.remove(node) else {
                return false;
            };
            let mut out = AddrSet::new();
            for ifc in &inst.interfaces {
                for a in &ifc.secondaries {
                    s.owner.remove(a);
                    s.subnets[inst.subnet].give_back(*a);
                    out.insert(IpAddr::V4(*a));
                }
                s.subnets[inst.subnet].give_back(ifc.primary);
            }
            out
        };
        if let Some(h) = &self.hook
            && !released.is_empty()
        {
            h.released(node, &released);
        }
        true
    }

    /// The cloud's record of `node`'s instance.
    pub fn instance(&self, node: &NodeName) -> Option<InstanceState> {
        self.state.lock().instances.get(node).cloned()
    }

    /// Whether `node`'s instance exists.
    pub fn has_instance(&self, node: &NodeName) -> bool {
        self.state.lock().instances.contains_key(node)
    }

    /// [`minimum_calls`] from `node`'s current state to `target` (None: no such instance).
    pub fn minimum_calls_to(&self, node: &NodeName, target: u64) -> Option<u64> {
        let s = self.state.lock();
        let inst = s.instances.get(node)?;
        Some(minimum_calls(
            &inst.instance_type,
            &inst.secondary_counts(),
            target,
        ))
    }

    /// Who holds secondary address `addr`.
    pub fn owner(&self, addr: &IpAddr) -> Option<NodeName> {
        let IpAddr::V4(a) = addr else { return None };
        self.state.lock().owner.get(a).map(|(n, _)| n.clone())
    }

    /// Every (secondary address, node) the cloud has assigned.
    pub fn granted(&self) -> Vec<(IpAddr, NodeName)> {
        let s = self.state.lock();
        s.owner
            .iter()
            .map(|(a, (n, _))| (IpAddr::V4(*a), n.clone()))
            .collect()
    }

    /// Mutating calls received, and how many were answered "throttled" (as
    /// `MemorySource::calls`).
    pub fn calls(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.counters.calls, s.counters.throttled)
    }

    /// Mutating calls received for `node`.
    pub fn calls_for(&self, node: &NodeName) -> u64 {
        self.state.lock().per_node.get(node).copied().unwrap_or(0)
    }

    /// All counters.
    pub fn counters(&self) -> CloudCounters {
        self.state.lock().counters
    }

    /// Free addresses of each subnet, by index.
    pub fn subnet_free(&self) -> Vec<u64> {
        self.state.lock().subnets.iter().map(Subnet::free).collect()
    }

    /// The preamble of a mutating call, after its latency: counters, the rate limit, the
    /// brown-out, the injected faults.
    fn admit(&self, s: &mut State, op: &'static str, node: &NodeName) -> Admit {
        s.counters.calls += 1;
        *s.per_node.entry(node.clone()).or_default() += 1;
        if let Some(l) = &self.limiter
            && let Err(not_until) = l.check()
        {
            s.counters.throttled += 1;
            let retry_after = not_until.wait_time_from(TokioGovernorClock.now());
            return Admit::Refused(err(
                op,
                node,
                ErrorClass::Throttled {
                    retry_after: Some(retry_after),
                },
                format!("RequestLimitExceeded: retry after {retry_after:?}"),
            ));
        }
        let f = s.faults;
        let now = Instant::now();
        if let Some((from, to)) = f.brown_out
            && from <= now
            && now < to
        {
            s.counters.failed += 1;
            return Admit::Refused(err(
                op,
                node,
                ErrorClass::Transient,
                "ServiceUnavailable: brown-out".into(),
            ));
        }
        if f.error_rate + f.throttle_rate + f.lost_reply_rate <= 0.0 {
            return Admit::Proceed(Reply::Sent);
        }
        let x: f64 = s.rng.random();
        if x < f.error_rate {
            s.counters.failed += 1;
            Admit::Refused(err(
                op,
                node,
                ErrorClass::Transient,
                "InternalError: injected error".into(),
            ))
        } else if x < f.error_rate + f.throttle_rate {
            s.counters.throttled += 1;
            Admit::Refused(err(
                op,
                node,
                ErrorClass::Throttled {
                    retry_after: Some(f.retry_after),
                },
                "RequestLimitExceeded: injected throttling".into(),
            ))
        } else if x < f.error_rate + f.throttle_rate + f.lost_reply_rate {
            Admit::Proceed(Reply::Lost)
        } else {
            Admit::Proceed(Reply::Sent)
        }
    }

    /// The end of a call whose effect happened: a lost reply keeps the caller waiting for
    /// its timeout, then fails transient.
    async fn reply(&self, op: &'static str, node: &NodeName, r: Reply) -> Result<(), IpamError> {
        if r == Reply::Sent {
            return Ok(());
        }
        let timeout = {
            let mut s = self.state.lock();
            s.counters.failed += 1;
            s.faults.timeout
        };
        tokio::time::sleep(timeout).await;
        Err(err(
            op,
            node,
            ErrorClass::Transient,
            "RequestTimeout: no reply (the call took effect)".into(),
        ))
    }

    /// The effect of one allocate call, under the lock.
    fn assign(s: &mut State, node: &NodeName, count: u64) -> Result<Vec<IpAddr>, IpamError> {
        let refuse = |s: &mut State, class, message: String| {
            s.counters.failed += 1;
            Err(err("allocate", node, class, message))
        };
        let Some(inst) = s.instances.get(node) else {
            return refuse(
                s,
                ErrorClass::Permanent,
                format!("InvalidInstanceID.NotFound: no instance {node}"),
            );
        };
        let subnet = inst.subnet;
        let itype = inst.instance_type;
        let free = s.subnets[subnet].free();
        let target = s.target(inst);
        let (room, needs) = match target {
            None => {
                return refuse(
                    s,
                    ErrorClass::Exhausted,
                    format!(
                        "AttachmentLimitExceeded: {itype} has {} interfaces, all full",
                        itype.max_interfaces
                    ),
                );
            }
            Some(Target::Existing(_, room)) => (room, count),
            Some(Target::New(room)) => (room, count + 1),
        };
        if count > room {
            return refuse(
                s,
                ErrorClass::Transient,
                format!("PrivateIpAddressLimitExceeded: {count} asked, room for {room}"),
            );
        }
        if needs > free {
            let cidr = s.subnets[subnet].cidr();
            return refuse(
                s,
                ErrorClass::Exhausted,
                format!("InsufficientFreeAddressesInSubnet: {cidr} has {free}, {needs} needed"),
            );
        }
        let pos = match target {
            Some(Target::Existing(i, _)) => i,
            _ => {
                let primary = s.subnets[subnet].take().expect("checked free");
                let inst = s.instances.get_mut(node).expect("checked");
                let index = inst.interfaces.len() as u32;
                inst.interfaces.push(InterfaceState {
                    index,
                    primary,
                    secondaries: BTreeSet::new(),
                });
                s.counters.interfaces_created += 1;
                index as usize
            }
        };
        let mut out = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let a = s.subnets[subnet].take().expect("checked free");
            s.owner.insert(a, (node.clone(), pos));
            out.push(a);
        }
        let inst = s.instances.get_mut(node).expect("checked");
        inst.interfaces[pos].secondaries.extend(out.iter().copied());
        Ok(out.into_iter().map(IpAddr::V4).collect())
    }
}

impl IpSource for SimCloud {
    fn name(&self) -> tidepool_metrics::Source {
        tidepool_metrics::Source::SimCloud
    }

    fn families(&self) -> &[Family] {
        &[Family::V4]
    }

    fn grant_size(&self, _family: Family) -> u128 {
        1
    }

    fn prepare_allocation(&self, node: &NodeName, family: Family, want: u64, limit: u64) -> u64 {
        if family != Family::V4 {
            return 0;
        }
        want.min(limit).min(self.state.lock().one_call(node))
    }

    async fn allocate<G: Gate>(
        &self,
        node: &NodeName,
        family: Family,
        count: u64,
        gate: &mut G,
    ) -> Result<AddrSet, IpamError> {
        gate.request().await?;
        if count == 0 {
            return Ok(AddrSet::new());
        }
        tokio::time::sleep(self.latency).await;
        let (addrs, reply) = {
            let mut s = self.state.lock();
            let reply = match self.admit(&mut s, "allocate", node) {
                Admit::Refused(e) => return Err(e),
                Admit::Proceed(reply) => reply,
            };
            if family != Family::V4 {
                s.counters.failed += 1;
                return Err(err(
                    "allocate",
                    node,
                    ErrorClass::Permanent,
                    "sim-cloud serves IPv4 only".into(),
                ));
            }
            let addrs: AddrSet = Self::assign(&mut s, node, count)?.into_iter().collect();
            (addrs, reply)
        };
        if let Some(h) = &self.hook {
            h.granted(node, &addrs);
        }
        self.reply("allocate", node, reply).await?;
        Ok(addrs)
    }

    fn prepare_release(&self, node: &NodeName, free: &AddrSet, max: u64) -> AddrSet {
        // the highest first (a node's free addresses: a few hundred at most)
        let mut free: Vec<IpAddr> = free.iter().collect();
        free.reverse();
        let s = self.state.lock();
        let on = |a: &IpAddr| match a {
            IpAddr::V4(v4) => s
                .owner
                .get(v4)
                .filter(|(n, _)| n == node)
                .map(|(_, pos)| *pos),
            IpAddr::V6(_) => None,
        };
        let mut per_iface: BTreeMap<usize, u64> = BTreeMap::new();
        for a in &free {
            if let Some(pos) = on(a) {
                *per_iface.entry(pos).or_default() += 1;
            }
        }
        // The most releasable; ties go to the lowest position (iteration order, strict >).
        let mut best: Option<(usize, u64)> = None;
        for (&pos, &n) in &per_iface {
            if best.is_none_or(|(_, m)| n > m) {
                best = Some((pos, n));
            }
        }
        let Some((pos, _)) = best else {
            return AddrSet::new();
        };
        free.iter()
            .filter(|a| on(a) == Some(pos))
            .take(max.min(usize::MAX as u64) as usize)
            .copied()
            .collect()
    }

    async fn release<G: Gate>(
        &self,
        node: &NodeName,
        addrs: &AddrSet,
        gate: &mut G,
    ) -> Result<(), IpamError> {
        gate.request().await?;
        if addrs.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(self.latency).await;
        let (released, reply) = {
            let mut s = self.state.lock();
            let reply = match self.admit(&mut s, "release", node) {
                Admit::Refused(e) => return Err(e),
                Admit::Proceed(reply) => reply,
            };
            let mut done = AddrSet::new();
            for a in addrs.iter() {
                let IpAddr::V4(v4) = a else { continue };
                let pos = match s.owner.get(&v4) {
                    Some((n, pos)) if n == node => *pos,
                    _ => continue, // primaries, other nodes' and gone addresses
                };
                s.owner.remove(&v4);
                let inst = s.instances.get_mut(node).expect("owner implies instance");
                inst.interfaces[pos].secondaries.remove(&v4);
                let subnet = inst.subnet;
                s.subnets[subnet].give_back(v4);
                done.insert(a);
            }
            (done, reply)
        };
        if let Some(h) = &self.hook
            && !released.is_empty()
        {
            h.released(node, &released);
        }
        self.reply("release", node, reply).await
    }

    async fn describe(&self, node: &NodeName) -> Result<AddrSet, IpamError> {
        let mut s = self.state.lock();
        s.counters.describes += 1;
        let now = Instant::now();
        if let Some((from, to)) = s.faults.brown_out
            && from <= now
            && now < to
        {
            return Err(err(
                "describe",
                node,
                ErrorClass::Transient,
                "ServiceUnavailable: brown-out".into(),
            ));
        }
        Ok(s.instances
            .get(node)
            .map(|inst| {
                inst.interfaces
                    .iter()
                    .flat_map(|i| i.secondaries.iter().map(|a| IpAddr::V4(*a)))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// An instance the cloud no longer has is gone.
    fn machine_gone(&self, node: &NodeName) -> bool {
        !self.has_instance(node)
    }

    /// A node's pool is its instance's subnet.
    fn node_pools(&self, node: &NodeName, _pending: &[(PodUid, Option<Subject>)]) -> NodePools {
        let s = self.state.lock();
        let subnet = (s.instances.get(node)).map(|inst| s.subnets[inst.subnet].name.clone());
        NodePools {
            defaults: PerFamily {
                v4: subnet,
                v6: None,
            },
            ..NodePools::default()
        }
    }

    /// A subnet's addresses for pods: its free ones and those its instances' pods hold
    /// (the interfaces' primary addresses are for no pod).
    fn pool_capacity(&self, pool: &str, family: Family) -> Option<u128> {
        let s = self.state.lock();
        let subnet = s.subnets.iter().position(|sn| &*sn.name == pool)?;
        (family == Family::V4).then_some(u128::from(s.pod_capacity(subnet)?))
    }

    fn quota(&self) -> PerFamily<Quota> {
        let s = self.state.lock();
        PerFamily {
            v4: Quota {
                capacity: s.subnets.iter().map(|sn| sn.capacity).sum(),
                free: s.subnets.iter().map(Subnet::free).sum(),
            },
            v6: Quota::default(),
        }
    }
}

impl crate::world::SimSource for SimCloud {
    fn grants(&self) -> Vec<crate::observer::Grant> {
        crate::observer::Grant::of_addresses(SimCloud::granted(self))
    }

    fn calls(&self) -> (u64, u64) {
        SimCloud::calls(self)
    }

    /// A machine joins as an instance of the cloud's default type (a name already
    /// registered keeps its instance).
    fn machine_added(&self, node: &NodeName) {
        if !self.has_instance(node) {
            // the only other failure is a subnet without room for the primary address: the
            // node then gets nothing and shows as exhausted
            let _ = self.add_instance(node, self.default_type);
        }
    }

    fn vanish(&self, node: &NodeName) {
        self.terminate_instance(node);
    }

    fn snapshot(&self, node: &NodeName) -> Vec<u64> {
        self.instance(node)
            .map(|i| i.secondary_counts())
            .unwrap_or_default()
    }

    /// IPv4 only (sim-cloud serves no IPv6).
    fn minimum_calls(&self, from: &[u64], target: PerFamily<u64>) -> u64 {
        let fresh = [0];
        let from = if from.is_empty() { &fresh[..] } else { from };
        minimum_calls(&self.default_type, from, target.v4)
    }

    fn call_latency(&self) -> Duration {
        self.latency
    }

    fn rate_limit(&self) -> Option<(f64, u32)> {
        self.rate_limit
    }

    /// One interface's pod addresses: a call assigns to one interface, or creates one with
    /// them (every machine the world adds is of the default type).
    fn most_per_call(&self) -> Option<u64> {
        Some(self.default_type.pod_addresses_per_interface())
    }

    /// The node's subnet, `subnet-<index>`.
    fn scarcity_pool(
        &self,
        node: &NodeName,
        _family: Family,
        _subject: Option<&tidepool_ipam::pool::choice::Subject>,
    ) -> Option<Arc<str>> {
        let subnet = self.state.lock().instances.get(node)?.subnet;
        Some(Arc::from(format!("subnet-{subnet}")))
    }

    /// The addresses pods can have of a subnet: its free ones and the secondaries its
    /// instances hold; one address per unit.
    fn scarcity_capacity(&self, pool: &str, _family: Family) -> Option<(u128, u64)> {
        let subnet: usize = pool.strip_prefix("subnet-")?.parse().ok()?;
        Some((u128::from(self.state.lock().pod_capacity(subnet)?), 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidepool_ipam::NodeUid;
    use tidepool_ipam::Ungated;

    fn node(n: &str) -> NodeName {
        n.into()
    }

    fn t(name: &str) -> InstanceType {
        InstanceType::by_name(name).unwrap()
    }

    /// One subnet of /16, `n` registered as `itype`.
    fn cloud_with(n: &str, itype: &str) -> SimCloud {
        let c = SimCloud::new(1, 16, 1).unwrap();
        c.add_instance(&node(n), t(itype)).unwrap();
        c
    }

    /// The engine's way of filling a node: prepare, then allocate what one call gives,
    /// until `target` or until prepare says 0. Returns the calls made.
    async fn fill(c: &SimCloud, n: &NodeName, target: u64) -> u64 {
        let mut calls = 0;
        loop {
            let have = c.describe(n).await.unwrap().total() as u64;
            if have >= target {
                return calls;
            }
            let k = c.prepare_allocation(n, Family::V4, target - have, u64::MAX);
            if k == 0 {
                return calls;
            }
            let got = c.allocate(n, Family::V4, k, &mut Ungated).await.unwrap();
            assert_eq!(got.total(), u128::from(k));
            calls += 1;
        }
    }

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(bool, NodeName, Vec<IpAddr>)>>);

    impl SourceHook for Recorder {
        fn granted(&self, node: &NodeName, addrs: &AddrSet) {
            self.0.lock().push((true, node.clone(), v(addrs)));
        }
        fn released(&self, node: &NodeName, addrs: &AddrSet) {
            self.0.lock().push((false, node.clone(), v(addrs)));
        }
    }

    /// A set's addresses in order.
    fn v(s: &AddrSet) -> Vec<IpAddr> {
        s.iter().collect()
    }

    fn set(addrs: &[IpAddr]) -> AddrSet {
        addrs.iter().copied().collect()
    }

    #[test]
    fn instance_type_limits() {
        let expect = [
            ("m5.large", 3, 10, 27),
            ("m5.4xlarge", 8, 30, 232),
            ("m4.xlarge", 4, 15, 56),
            ("t2.xlarge", 3, 15, 42),
            ("c3.xlarge", 4, 15, 56),
            ("m4.large", 2, 10, 18),
        ];
        for (name, ifaces, per, pods) in expect {
            let it = t(name);
            assert_eq!(it.name, name);
            assert_eq!(it.max_interfaces, ifaces, "{name}");
            assert_eq!(it.addresses_per_interface, per, "{name}");
            assert_eq!(
                it.pod_addresses_per_interface(),
                u64::from(per) - 1,
                "{name}"
            );
            assert_eq!(it.max_pod_addresses(), pods, "{name}");
        }
        let e = InstanceType::by_name("x9.huge").unwrap_err();
        assert!(matches!(&e, CloudError::UnknownInstanceType { name, .. } if name == "x9.huge"));
        let msg = e.to_string();
        assert!(msg.contains("x9.huge") && msg.contains("m5.large"), "{msg}");
        let ipam: IpamError = e.into();
        assert!(
            matches!(&ipam, IpamError::InvalidSetting { name: "instance-type", value, .. } if value == "x9.huge")
        );
        assert_eq!(ipam.class(), ErrorClass::Permanent);
    }

    #[test]
    fn bad_settings_are_refused() {
        assert_eq!(
            SimCloud::new(1, 29, 1).unwrap_err(),
            CloudError::InvalidSubnetSize { prefix: 29 }
        );
        assert_eq!(
            SimCloud::new(1, 7, 1).unwrap_err(),
            CloudError::InvalidSubnetSize { prefix: 7 }
        );
        assert!(matches!(
            SimCloud::new(247, 8, 1).unwrap_err(),
            CloudError::TooManySubnets { .. }
        ));
        assert!(SimCloud::new(246, 8, 1).is_ok());
        let c = SimCloud::new(1, 16, 1).unwrap();
        assert!(matches!(
            c.clone().with_rate_limit(0.0, 1).unwrap_err(),
            CloudError::InvalidRateLimit {
                name: "cloud-qps",
                ..
            }
        ));
        assert!(matches!(
            c.clone().with_rate_limit(1.0, 0).unwrap_err(),
            CloudError::InvalidRateLimit {
                name: "cloud-burst",
                ..
            }
        ));
        c.add_instance(&node("a"), t("m5.large")).unwrap();
        assert!(matches!(
            c.add_instance(&node("a"), t("m5.large")).unwrap_err(),
            CloudError::DuplicateInstance { .. }
        ));
        assert!(matches!(
            c.add_instance_in(&node("b"), t("m5.large"), 1).unwrap_err(),
            CloudError::NoSuchSubnet { index: 1, .. }
        ));
    }

    #[test]
    fn subnets_follow_design_layout() {
        assert_eq!(subnets_for_nodes(0), 1);
        assert_eq!(subnets_for_nodes(1_000), 1);
        assert_eq!(subnets_for_nodes(1_001), 2);
        let c = SimCloud::for_nodes(2_500, DEFAULT_SUBNET_SIZE, 1).unwrap();
        assert_eq!(c.subnet_free(), vec![65_531; 3]);
        assert_eq!(c.quota().v4.capacity, 3 * 65_531);
        assert_eq!(c.quota().v6, Quota::default());
        // registration balances subnets: most free first, ties to the lowest index
        for i in 0..4 {
            c.add_instance(&node(&format!("n{i}")), t("m5.large"))
                .unwrap();
        }
        let subnets: Vec<usize> = (0..4)
            .map(|i| c.instance(&node(&format!("n{i}"))).unwrap().subnet)
            .collect();
        assert_eq!(subnets, vec![0, 1, 2, 0]);
        let primary = c.instance(&node("n1")).unwrap().interfaces[0].primary;
        assert_eq!(primary, Ipv4Addr::new(10, 1, 0, 4)); // first four reserved
        assert_eq!(c.quota().v4.free, 3 * 65_531 - 4);
    }

    #[tokio::test(start_paused = true)]
    async fn fills_each_type_to_its_limit_then_exhausted() {
        for it in InstanceType::ALL {
            let n = node("a");
            let c = cloud_with("a", it.name);
            let calls = fill(&c, &n, u64::MAX).await;
            let have = c.describe(&n).await.unwrap().total() as u64;
            assert_eq!(have, it.max_pod_addresses(), "{it}");
            // one call per interface: eth0 filled, then each new interface with its addresses
            assert_eq!(calls, u64::from(it.max_interfaces), "{it}");
            assert_eq!(
                calls,
                minimum_calls(&it, &[0], it.max_pod_addresses()),
                "{it}"
            );
            assert_eq!(c.calls_for(&n), calls, "{it}");
            let inst = c.instance(&n).unwrap();
            assert_eq!(inst.interfaces.len() as u32, it.max_interfaces, "{it}");
            assert!(
                inst.secondary_counts()
                    .iter()
                    .all(|&k| k == it.pod_addresses_per_interface())
            );
            assert_eq!(c.prepare_allocation(&n, Family::V4, 1, u64::MAX), 0, "{it}");
            let e = c
                .allocate(&n, Family::V4, 1, &mut Ungated)
                .await
                .unwrap_err();
            assert_eq!(e.class(), ErrorClass::Exhausted, "{it}");
            assert_eq!(c.describe(&n).await.unwrap().total() as u64, have);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn m5_4xlarge_needing_38_gets_29_then_9() {
        let n = node("a");
        let c = cloud_with("a", "m5.4xlarge");
        assert_eq!(c.prepare_allocation(&n, Family::V4, 38, u64::MAX), 29);
        c.allocate(&n, Family::V4, 29, &mut Ungated).await.unwrap();
        assert_eq!(c.prepare_allocation(&n, Family::V4, 9, u64::MAX), 9);
        // the limit (max_allocate headroom) caps it too
        assert_eq!(c.prepare_allocation(&n, Family::V4, 9, 4), 4);
        c.allocate(&n, Family::V4, 9, &mut Ungated).await.unwrap();
        assert_eq!(c.instance(&n).unwrap().secondary_counts(), vec![29, 9]);
        assert_eq!(c.calls(), (2, 0));
        assert_eq!(c.counters().interfaces_created, 1);
        assert_eq!(c.prepare_allocation(&n, Family::V6, 9, u64::MAX), 0);
        assert_eq!(
            c.allocate(&n, Family::V4, 30, &mut Ungated)
                .await
                .unwrap_err()
                .class(),
            ErrorClass::Transient // more than interface eth1 has room for
        );
    }

    #[tokio::test(start_paused = true)]
    async fn interface_created_only_when_existing_ones_are_full() {
        let n = node("a");
        let c = cloud_with("a", "m5.large");
        c.allocate(&n, Family::V4, 5, &mut Ungated).await.unwrap();
        assert_eq!(c.instance(&n).unwrap().interfaces.len(), 1);
        // eth0 has room for 4: one call gives 4 there, not a new interface of 9
        assert_eq!(c.prepare_allocation(&n, Family::V4, 20, u64::MAX), 4);
        assert_eq!(
            c.allocate(&n, Family::V4, 5, &mut Ungated)
                .await
                .unwrap_err()
                .class(),
            ErrorClass::Transient
        );
        assert_eq!(c.instance(&n).unwrap().secondary_counts(), vec![5]);
        c.allocate(&n, Family::V4, 4, &mut Ungated).await.unwrap();
        assert_eq!(c.instance(&n).unwrap().secondary_counts(), vec![9]);
        assert_eq!(c.prepare_allocation(&n, Family::V4, 20, u64::MAX), 9);
        c.allocate(&n, Family::V4, 3, &mut Ungated).await.unwrap();
        assert_eq!(c.instance(&n).unwrap().secondary_counts(), vec![9, 3]);
        // a freed address on eth0 is filled before eth1
        let eth0: Vec<IpAddr> = c.instance(&n).unwrap().interfaces[0]
            .secondaries
            .iter()
            .take(2)
            .map(|a| IpAddr::V4(*a))
            .collect();
        c.release(&n, &set(&eth0), &mut Ungated).await.unwrap();
        assert_eq!(c.prepare_allocation(&n, Family::V4, 20, u64::MAX), 2);
        let again = c.allocate(&n, Family::V4, 2, &mut Ungated).await.unwrap();
        let inst = c.instance(&n).unwrap();
        assert_eq!(inst.secondary_counts(), vec![9, 3]);
        assert!(
            again
                .iter()
                .all(|a| matches!(a, IpAddr::V4(v) if inst.interfaces[0].secondaries.contains(&v)))
        );
        assert_eq!(c.counters().interfaces_created, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn primary_addresses_never_granted_or_released() {
        let n = node("a");
        let c = cloud_with("a", "m5.large");
        let granted = {
            let mut all = Vec::new();
            for _ in 0..3 {
                let k = c.prepare_allocation(&n, Family::V4, 100, u64::MAX);
                all.extend(v(&c
                    .allocate(&n, Family::V4, k, &mut Ungated)
                    .await
                    .unwrap()));
            }
            all
        };
        let inst = c.instance(&n).unwrap();
        let primaries: Vec<IpAddr> = inst
            .interfaces
            .iter()
            .map(|i| IpAddr::V4(i.primary))
            .collect();
        assert_eq!(primaries.len(), 3);
        let truth = c.describe(&n).await.unwrap();
        assert_eq!(truth.total(), 27);
        for p in &primaries {
            assert!(!granted.contains(p) && !truth.contains(p), "{p} granted");
            assert_eq!(c.owner(p), None);
        }
        // prepare_release never proposes a primary, even when offered only primaries
        assert!(c.prepare_release(&n, &set(&primaries), 10).is_empty());
        let free_before = c.quota().v4.free;
        c.release(&n, &set(&primaries), &mut Ungated).await.unwrap();
        assert_eq!(c.instance(&n).unwrap(), inst);
        assert_eq!(c.quota().v4.free, free_before);
        // releasing everything leaves the primaries
        c.release(&n, &truth, &mut Ungated).await.unwrap();
        let after = c.instance(&n).unwrap();
        assert_eq!(after.secondary_counts(), vec![0, 0, 0]);
        assert_eq!(
            after
                .interfaces
                .iter()
                .map(|i| i.primary)
                .collect::<Vec<_>>(),
            inst.interfaces
                .iter()
                .map(|i| i.primary)
                .collect::<Vec<_>>()
        );
        assert_eq!(c.quota().v4.free, free_before + 27);
    }

    #[tokio::test(start_paused = true)]
    async fn prepare_release_takes_one_interface_with_most_releasable() {
        let n = node("a");
        let other = node("b");
        let c = cloud_with("a", "m5.large");
        c.add_instance(&other, t("m5.large")).unwrap();
        let eth0 = v(&c.allocate(&n, Family::V4, 9, &mut Ungated).await.unwrap());
        let eth1 = v(&c.allocate(&n, Family::V4, 6, &mut Ungated).await.unwrap());
        let theirs = c
            .allocate(&other, Family::V4, 3, &mut Ungated)
            .await
            .unwrap();
        // free: 3 of eth0, 5 of eth1, an address of another node
        let mut free = set(&[eth0[0], eth1[0], eth0[1], eth1[1], eth0[2]]);
        free.extend(eth1[2..5].iter().copied());
        free.union_with(&theirs);
        assert_eq!(v(&c.prepare_release(&n, &free, 10)), eth1[..5].to_vec());
        // at most `max`, the highest first
        assert_eq!(v(&c.prepare_release(&n, &free, 2)), eth1[3..5].to_vec());
        // ties: the lower interface
        assert_eq!(
            v(&c.prepare_release(&n, &set(&[eth1[0], eth0[0]]), 10)),
            vec![eth0[0]]
        );
        assert!(c.prepare_release(&n, &theirs, 10).is_empty());
        // release ignores another node's addresses
        c.release(&n, &theirs, &mut Ungated).await.unwrap();
        assert_eq!(c.describe(&other).await.unwrap().total(), 3);
        c.release(&n, &c.prepare_release(&n, &free, 10), &mut Ungated)
            .await
            .unwrap();
        assert_eq!(c.instance(&n).unwrap().secondary_counts(), vec![9, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn subnet_exhaustion() {
        // a /28: 16 − 5 reserved = 11 usable addresses
        let c = SimCloud::new(1, 28, 1).unwrap();
        let a = node("a");
        c.add_instance(&a, t("m5.4xlarge")).unwrap();
        assert_eq!(
            c.quota().v4,
            Quota {
                capacity: 11,
                free: 10
            }
        );
        assert_eq!(c.prepare_allocation(&a, Family::V4, 29, u64::MAX), 10);
        let got = c.allocate(&a, Family::V4, 10, &mut Ungated).await.unwrap();
        assert_eq!(c.quota().v4.free, 0);
        assert_eq!(c.prepare_allocation(&a, Family::V4, 1, u64::MAX), 0);
        let e = c
            .allocate(&a, Family::V4, 1, &mut Ungated)
            .await
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Exhausted);
        assert!(
            e.to_string().contains("InsufficientFreeAddressesInSubnet"),
            "{e}"
        );
        assert!(matches!(
            c.add_instance(&node("b"), t("m5.large")).unwrap_err(),
            CloudError::SubnetExhausted { .. }
        ));
        c.release(&a, &set(&v(&got)[..3]), &mut Ungated)
            .await
            .unwrap();
        assert_eq!(c.quota().v4.free, 3);
        assert_eq!(c.prepare_allocation(&a, Family::V4, 29, u64::MAX), 3);

        // a new interface needs its primary from the subnet too
        let c = SimCloud::new(1, 28, 1).unwrap();
        c.add_instance(&a, t("m5.large")).unwrap();
        c.allocate(&a, Family::V4, 9, &mut Ungated).await.unwrap();
        assert_eq!(c.quota().v4.free, 1);
        assert_eq!(c.prepare_allocation(&a, Family::V4, 1, u64::MAX), 0);
        assert_eq!(
            c.allocate(&a, Family::V4, 1, &mut Ungated)
                .await
                .unwrap_err()
                .class(),
            ErrorClass::Exhausted
        );
        assert_eq!(c.instance(&a).unwrap().interfaces.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn injected_error_changes_nothing() {
        let n = node("a");
        let rec = Arc::new(Recorder::default());
        let c = cloud_with("a", "m5.large").with_hook(rec.clone());
        let held = c.allocate(&n, Family::V4, 4, &mut Ungated).await.unwrap();
        c.set_faults(CloudFaults {
            error_rate: 1.0,
            ..Default::default()
        });
        let free = c.quota().v4.free;
        let e = c
            .allocate(&n, Family::V4, 3, &mut Ungated)
            .await
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Transient);
        let e = c.release(&n, &held, &mut Ungated).await.unwrap_err();
        assert_eq!(e.class(), ErrorClass::Transient);
        assert_eq!(c.describe(&n).await.unwrap().total(), 4);
        assert_eq!(c.quota().v4.free, free);
        assert_eq!(rec.0.lock().len(), 1); // only the first grant
        assert_eq!(c.counters().failed, 2);
        assert_eq!(c.calls(), (3, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn injected_throttling_has_retry_after_and_changes_nothing() {
        let n = node("a");
        let c = cloud_with("a", "m5.large");
        let held = c.allocate(&n, Family::V4, 4, &mut Ungated).await.unwrap();
        c.set_faults(CloudFaults {
            throttle_rate: 1.0,
            retry_after: Duration::from_secs(7),
            ..Default::default()
        });
        for r in [
            c.allocate(&n, Family::V4, 3, &mut Ungated)
                .await
                .map(|_| ()),
            c.release(&n, &held, &mut Ungated).await,
        ] {
            assert_eq!(
                r.unwrap_err().class(),
                ErrorClass::Throttled {
                    retry_after: Some(Duration::from_secs(7))
                }
            );
        }
        assert_eq!(c.describe(&n).await.unwrap().total(), 4);
        assert_eq!(c.calls(), (3, 2));
        assert_eq!(c.calls_for(&n), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn brown_out_window_fails_every_call_inside_it_only() {
        let n = node("a");
        let c = cloud_with("a", "m5.large").with_latency(Duration::from_millis(100));
        let start = Instant::now();
        c.set_faults(CloudFaults {
            brown_out: Some((
                start + Duration::from_secs(10),
                start + Duration::from_secs(20),
            )),
            ..Default::default()
        });
        let held = c.allocate(&n, Family::V4, 2, &mut Ungated).await.unwrap();
        tokio::time::sleep_until(start + Duration::from_secs(10)).await;
        let e = c
            .allocate(&n, Family::V4, 2, &mut Ungated)
            .await
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Transient);
        assert!(e.to_string().contains("brown-out"), "{e}");
        assert_eq!(
            c.release(&n, &held, &mut Ungated)
                .await
                .unwrap_err()
                .class(),
            ErrorClass::Transient
        );
        assert_eq!(
            c.describe(&n).await.unwrap_err().class(),
            ErrorClass::Transient
        );
        // a call sent just before the end arrives (after its latency) when it is over
        tokio::time::sleep_until(start + Duration::from_millis(19_900)).await;
        c.allocate(&n, Family::V4, 2, &mut Ungated).await.unwrap();
        assert_eq!(c.describe(&n).await.unwrap().total(), 4);
        assert_eq!(c.counters().failed, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn lost_reply_takes_effect_and_describe_repairs() {
        let n = node("a");
        let rec = Arc::new(Recorder::default());
        let c = cloud_with("a", "m5.large")
            .with_latency(Duration::from_millis(50))
            .with_hook(rec.clone());
        c.set_faults(CloudFaults {
            lost_reply_rate: 1.0,
            timeout: Duration::from_secs(5),
            ..Default::default()
        });
        let start = Instant::now();
        let e = c
            .allocate(&n, Family::V4, 3, &mut Ungated)
            .await
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Transient);
        assert_eq!(start.elapsed(), Duration::from_millis(5_050));
        // the engine's repair: what the cloud says the node holds
        let truth = c.describe(&n).await.unwrap();
        assert_eq!(truth.total(), 3);
        assert_eq!(rec.0.lock()[0], (true, n.clone(), v(&truth)));
        let addrs = v(&truth);
        assert!(
            c.release(&n, &set(&addrs[..1]), &mut Ungated)
                .await
                .is_err()
        );
        assert_eq!(c.describe(&n).await.unwrap().total(), 2);
        assert_eq!(rec.0.lock()[1], (false, n.clone(), addrs[..1].to_vec()));
        // retrying the lost release is harmless
        c.set_faults(CloudFaults::default());
        c.release(&n, &set(&addrs[..1]), &mut Ungated)
            .await
            .unwrap();
        assert_eq!(c.describe(&n).await.unwrap().total(), 2);
        assert_eq!(rec.0.lock().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn fault_rates_mix_deterministically() {
        async fn run(seed: u64) -> Vec<Option<ErrorClass>> {
            let c = SimCloud::new(1, 16, seed).unwrap();
            let n = node("a");
            c.add_instance(&n, t("m5.4xlarge")).unwrap();
            c.set_faults(CloudFaults {
                error_rate: 0.2,
                throttle_rate: 0.2,
                lost_reply_rate: 0.2,
                ..Default::default()
            });
            let mut out = Vec::new();
            for _ in 0..50 {
                out.push(
                    c.allocate(&n, Family::V4, 1, &mut Ungated)
                        .await
                        .err()
                        .map(|e| e.class()),
                );
            }
            out
        }
        let a = run(3).await;
        assert_eq!(a, run(3).await);
        for class in [
            None,
            Some(ErrorClass::Transient),
            Some(ErrorClass::Throttled {
                retry_after: Some(Duration::ZERO),
            }),
        ] {
            assert!(a.contains(&class), "{class:?} never drawn");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limit_throttles_past_burst() {
        let n = node("a");
        let c = cloud_with("a", "m5.4xlarge")
            .with_rate_limit(2.0, 3)
            .unwrap();
        assert_eq!(c.rate_limit(), Some((2.0, 3)));
        for _ in 0..3 {
            c.allocate(&n, Family::V4, 1, &mut Ungated).await.unwrap();
        }
        let e = c
            .allocate(&n, Family::V4, 1, &mut Ungated)
            .await
            .unwrap_err();
        let ErrorClass::Throttled {
            retry_after: Some(ra),
        } = e.class()
        else {
            panic!("not throttled: {e}");
        };
        assert_eq!(ra, Duration::from_millis(500));
        assert!(c.release(&n, &AddrSet::new(), &mut Ungated).await.is_ok()); // empty: no call
        assert_eq!(c.describe(&n).await.unwrap().total(), 3); // reads are not limited
        assert_eq!(c.calls(), (4, 1));
        tokio::time::sleep(ra).await;
        c.allocate(&n, Family::V4, 1, &mut Ungated).await.unwrap();
        assert!(c.allocate(&n, Family::V4, 1, &mut Ungated).await.is_err());
        assert_eq!(c.calls(), (6, 2));
        assert_eq!(c.calls_for(&n), 6);
        assert_eq!(c.calls_for(&node("b")), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn latency_applies_to_mutating_calls_only() {
        let n = node("a");
        let c = cloud_with("a", "m5.large").with_latency(Duration::from_millis(250));
        let start = Instant::now();
        let got = c.allocate(&n, Family::V4, 2, &mut Ungated).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        c.describe(&n).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        c.release(&n, &got, &mut Ungated).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn terminated_instance_gives_everything_back() {
        let n = node("a");
        let rec = Arc::new(Recorder::default());
        let c = cloud_with("a", "m5.large").with_hook(rec.clone());
        let free = c.quota().v4.free;
        c.allocate(&n, Family::V4, 9, &mut Ungated).await.unwrap();
        c.allocate(&n, Family::V4, 2, &mut Ungated).await.unwrap();
        assert_eq!(c.quota().v4.free, free - 12);
        assert!(c.terminate_instance(&n));
        assert!(!c.terminate_instance(&n));
        assert!(!c.has_instance(&n));
        assert_eq!(c.quota().v4.free, free + 1); // eth0's primary too
        assert!(c.describe(&n).await.unwrap().is_empty());
        assert!(c.granted().is_empty());
        assert_eq!(rec.0.lock().last().unwrap().2.len(), 11);
        assert_eq!(c.prepare_allocation(&n, Family::V4, 1, u64::MAX), 0);
        assert_eq!(
            c.allocate(&n, Family::V4, 1, &mut Ungated)
                .await
                .unwrap_err()
                .class(),
            ErrorClass::Permanent
        );
    }

    #[test]
    fn oracle_hand_computed() {
        let m5l = t("m5.large");
        let m54 = t("m5.4xlarge");
        assert_eq!(minimum_calls(&m54, &[0], 38), 2);
        assert_eq!(minimum_calls(&m54, &[0], 29), 1);
        assert_eq!(minimum_calls(&m54, &[0], 30), 2);
        assert_eq!(minimum_calls(&m5l, &[0], 27), 3);
        assert_eq!(minimum_calls(&m5l, &[0], 0), 0);
        assert_eq!(minimum_calls(&m5l, &[5], 5), 0);
        assert_eq!(minimum_calls(&m5l, &[5], 9), 1); // eth0's room
        assert_eq!(minimum_calls(&m5l, &[8], 17), 1); // one new interface of 9
        assert_eq!(minimum_calls(&m5l, &[8], 18), 2);
        assert_eq!(minimum_calls(&m5l, &[8, 1], 26), 2); // two rooms of 8: 1 + 8 left over
        assert_eq!(minimum_calls(&m5l, &[8, 1], 27), 3);
        assert_eq!(minimum_calls(&m5l, &[0], 100), 3); // capped at the type's 27
        assert_eq!(minimum_calls(&m5l, &[9, 9, 9], 100), 0);
        assert_eq!(minimum_calls(&m5l, &[9, 9], 5), 1); // one unassign
        assert_eq!(minimum_calls(&t("m4.large"), &[0], 18), 2);
        assert_eq!(minimum_calls(&t("t2.xlarge"), &[0], 40), 3);
        let c0: &[u64] = &[0];
        let c1: &[u64] = &[9, 9];
        assert_eq!(
            longest_chain([(&m54, c0, 100), (&m5l, c0, 27), (&m5l, c1, 27)]),
            4
        );
        assert_eq!(longest_chain(std::iter::empty()), 0);
    }

    /// From random partial states, the engine-like loop never beats the oracle, and from an
    /// empty node (eth0 only) it meets it exactly.
    #[tokio::test(start_paused = true)]
    async fn oracle_is_a_lower_bound_of_the_fill_loop() {
        let mut rng = SmallRng::seed_from_u64(42);
        for round in 0..300 {
            let it = InstanceType::ALL[round % InstanceType::ALL.len()];
            let n = node("a");
            let c = cloud_with("a", it.name);
            // a random history of grants and releases
            for _ in 0..rng.random_range(0..6) {
                let k = c.prepare_allocation(&n, Family::V4, rng.random_range(1..20), u64::MAX);
                if k > 0 {
                    c.allocate(&n, Family::V4, k, &mut Ungated).await.unwrap();
                }
                let held = c.describe(&n).await.unwrap();
                let drop: AddrSet = held.iter().filter(|_| rng.random_bool(0.2)).collect();
                c.release(&n, &drop, &mut Ungated).await.unwrap();
            }
            let fresh = c.instance(&n).unwrap().pod_addresses() == 0
                && c.instance(&n).unwrap().interfaces.len() == 1;
            let target = rng.random_range(0..=it.max_pod_addresses());
            let oracle = c.minimum_calls_to(&n, target).unwrap();
            let have = c.instance(&n).unwrap().pod_addresses();
            let calls = fill(&c, &n, target).await;
            if target > have {
                assert!(calls >= oracle, "{it} round {round}: {calls} < {oracle}");
                if fresh {
                    assert_eq!(calls, oracle, "{it} round {round}");
                }
                assert_eq!(c.instance(&n).unwrap().pod_addresses(), target);
            }
        }
    }

    // ---- the real engine on the simulated cloud ----

    use tidepool_ipam::Blocked;
    use tidepool_ipam::MemoryNodeStore;
    use tidepool_ipam::MemoryPodView;
    use tidepool_ipam::TokioClock;
    use tidepool_ipam::{Api, Budget};
    use tidepool_ipam::{EngineConfig, EngineDeps, NodeManager};
    use tidepool_ipam::{NodeInfo, PodUid};

    type Engine = NodeManager<SimCloud, MemoryNodeStore, MemoryPodView>;

    /// The engine (leading, default watermarks: pre-allocate 8) over `cloud`, with `pods`
    /// pods waiting on node `a`, whose allocatable pods are `allocatable`.
    fn engine(cloud: &SimCloud, pods: u128, allocatable: u32) -> (Engine, MemoryNodeStore) {
        let store = MemoryNodeStore::new();
        let view = MemoryPodView::new(Duration::ZERO);
        for uid in 1..=pods {
            view.add(PodUid(uid), node("a"));
        }
        let (tx, rx) = tokio::sync::watch::channel(true);
        std::mem::forget(tx); // leads for the whole test
        let mgr = NodeManager::new(
            EngineDeps {
                source: cloud.clone(),
                store: store.clone(),
                pods: view,
                clock: Arc::new(TokioClock::anchored(std::time::SystemTime::UNIX_EPOCH)),
                source_budget: Budget::unlimited(Api::Source),
                kube_budget: Budget::unlimited(Api::Kube),
                leader: rx,
            },
            EngineConfig::default(),
        )
        .unwrap();
        mgr.upsert_node(NodeInfo {
            name: node("a"),
            uid: NodeUid(1),
            allocatable_pods: allocatable,
            cordoned: false,
            terminating: false,
        });
        (mgr, store)
    }

    fn pool_of(store: &MemoryNodeStore) -> AddrSet {
        store
            .list()
            .iter()
            .find(|n| &*n.name == "a")
            .map(|n| (*n.operator.addresses).clone())
            .unwrap_or_default()
    }

    #[tokio::test(start_paused = true)]
    async fn engine_fills_m5_4xlarge_in_two_calls() {
        let n = node("a");
        let c = cloud_with("a", "m5.4xlarge").with_latency(Duration::from_millis(100));
        // 30 pods waiting + pre-allocate 8 = 38: one call of 29 (eth0), one of 9 (new eth1)
        let (mgr, store) = engine(&c, 30, 232);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let truth = c.describe(&n).await.unwrap();
        assert_eq!(truth.total(), 38);
        assert_eq!(pool_of(&store), truth);
        assert_eq!(c.instance(&n).unwrap().secondary_counts(), vec![29, 9]);
        assert_eq!(c.calls_for(&n), 2);
        assert_eq!(c.calls_for(&n), minimum_calls(&t("m5.4xlarge"), &[0], 38));
        assert_eq!(mgr.summary("a").unwrap().blocked, None);
        mgr.shutdown();
    }

    #[tokio::test(start_paused = true)]
    async fn engine_sees_full_instance_as_exhausted() {
        let n = node("a");
        let c = cloud_with("a", "m5.large");
        // 40 waiting + 8 on a type that holds 27; the Node claims more allocatable pods
        let (mgr, store) = engine(&c, 40, 110);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(pool_of(&store).total(), 27);
        assert_eq!(c.calls_for(&n), 3); // eth0, eth1, eth2; no call once prepare says 0
        assert_eq!(mgr.summary("a").unwrap().blocked, Some(Blocked::Exhausted));
        mgr.shutdown();
    }

    #[tokio::test(start_paused = true)]
    async fn engine_repairs_lost_replies_through_describe() {
        let n = node("a");
        let c = cloud_with("a", "m5.4xlarge").with_latency(Duration::from_millis(100));
        c.set_faults(CloudFaults {
            lost_reply_rate: 1.0,
            timeout: Duration::from_secs(2),
            ..Default::default()
        });
        let (mgr, store) = engine(&c, 30, 232);
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        // the first call took effect, its reply was lost: the engine does not show it yet
        assert_eq!(c.describe(&n).await.unwrap().total(), 29);
        assert!(pool_of(&store).is_empty());
        c.set_faults(CloudFaults::default());
        tokio::time::sleep(Duration::from_secs(60)).await;
        let truth = c.describe(&n).await.unwrap();
        assert_eq!(
            truth.total(),
            38,
            "repaired, then topped up, not granted twice"
        );
        assert_eq!(pool_of(&store), truth);
        assert!(c.counters().describes > 0);
        mgr.shutdown();
    }
}
