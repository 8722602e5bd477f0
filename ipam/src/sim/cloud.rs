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

use crate::budget::{TokioGovernorClock, TokioInstant};
use crate::error::{ErrorClass, IpamError};
use crate::source::{IpSource, Quota, SourceHook};
use crate::types::{Family, NodeName, PerFamily};

/// The `source` metric label of the simulated cloud.
pub const SOURCE_NAME: &str = "sim-cloud";
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
    latency: Duration,
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
    Proceed { lost_reply: bool },
    Refused(IpamError),
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
                base: (base + i * step) as u32,
                prefix: subnet_size,
                capacity: step - RESERVED_LOW - RESERVED_HIGH,
                next: 0,
                returned: BTreeSet::new(),
            })
            .collect();
        Ok(Self {
            latency: Duration::ZERO,
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
        let released: Vec<IpAddr> = {
            let mut s = self.state.lock();
            let Some(inst) = s.instances.remove(node) else {
                return false;
            };
            let mut out = Vec::new();
            for ifc in &inst.interfaces {
                for a in &ifc.secondaries {
                    s.owner.remove(a);
                    s.subnets[inst.subnet].give_back(*a);
                    out.push(IpAddr::V4(*a));
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
            return Admit::Proceed { lost_reply: false };
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
            Admit::Proceed { lost_reply: true }
        } else {
            Admit::Proceed { lost_reply: false }
        }
    }

    /// The end of a call whose effect happened: a lost reply keeps the caller waiting for
    /// its timeout, then fails transient.
    async fn reply(&self, op: &'static str, node: &NodeName, lost: bool) -> Result<(), IpamError> {
        if !lost {
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
    fn name(&self) -> &'static str {
        SOURCE_NAME
    }

    fn families(&self) -> &[Family] {
        &[Family::V4]
    }

    fn grant_size(&self, _family: Family) -> u64 {
        1
    }

    fn prepare_allocation(&self, node: &NodeName, family: Family, want: u64, limit: u64) -> u64 {
        if family != Family::V4 {
            return 0;
        }
        want.min(limit).min(self.state.lock().one_call(node))
    }

    async fn allocate(
        &self,
        node: &NodeName,
        family: Family,
        count: u64,
    ) -> Result<Vec<IpAddr>, IpamError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        tokio::time::sleep(self.latency).await;
        let (addrs, lost) = {
            let mut s = self.state.lock();
            let lost = match self.admit(&mut s, "allocate", node) {
                Admit::Refused(e) => return Err(e),
                Admit::Proceed { lost_reply } => lost_reply,
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
            (Self::assign(&mut s, node, count)?, lost)
        };
        if let Some(h) = &self.hook {
            h.granted(node, &addrs);
        }
        self.reply("allocate", node, lost).await?;
        Ok(addrs)
    }

    fn prepare_release(&self, node: &NodeName, free: &[IpAddr], max: u64) -> Vec<IpAddr> {
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
        for a in free {
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
            return Vec::new();
        };
        let mut seen = BTreeSet::new();
        free.iter()
            .filter(|a| on(a) == Some(pos) && seen.insert(**a))
            .take(max.min(usize::MAX as u64) as usize)
            .copied()
            .collect()
    }

    async fn release(&self, node: &NodeName, addrs: &[IpAddr]) -> Result<(), IpamError> {
        if addrs.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(self.latency).await;
        let (released, lost) = {
            let mut s = self.state.lock();
            let lost = match self.admit(&mut s, "release", node) {
                Admit::Refused(e) => return Err(e),
                Admit::Proceed { lost_reply } => lost_reply,
            };
            let mut done = Vec::with_capacity(addrs.len());
            for a in addrs {
                let IpAddr::V4(v4) = a else { continue };
                let pos = match s.owner.get(v4) {
                    Some((n, pos)) if n == node => *pos,
                    _ => continue, // primaries, other nodes' and gone addresses
                };
                s.owner.remove(v4);
                let inst = s.instances.get_mut(node).expect("owner implies instance");
                inst.interfaces[pos].secondaries.remove(v4);
                let subnet = inst.subnet;
                s.subnets[subnet].give_back(*v4);
                done.push(*a);
            }
            (done, lost)
        };
        if let Some(h) = &self.hook
            && !released.is_empty()
        {
            h.released(node, &released);
        }
        self.reply("release", node, lost).await
    }

    async fn describe(&self, node: &NodeName) -> Result<BTreeSet<IpAddr>, IpamError> {
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
