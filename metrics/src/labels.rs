//! Labels and their values. Each enumerated label is spelled once, in a `label!` below,
//! which makes two things of it:
//!
//! - a module of strings (`family::KEY`, `family::IPV4`, `family::ALL`), which the table
//!   ([`crate::OPERATOR`], [`crate::AGENT`]) and its registration at zero read;
//! - an enum of its values (`Family::Ipv4`), which the [`crate::record`] functions take, so a
//!   caller names neither a label nor a value by its string. `as_str` is the module's
//!   constant.
//!
//! Labels whose values are not enumerable (`pool`, `node`) have only a module with a `KEY`.

/// Defines one enumerated label: `module, Enum = "key" { CONST, Variant = "value"; ... }`,
/// then any further items of the module.
macro_rules! label {
    (
        $(#[$doc:meta])*
        $module:ident, $Enum:ident = $key:literal {
            $( $(#[$vdoc:meta])* $CONST:ident, $Variant:ident = $value:literal; )+
        }
        $($extra:item)*
    ) => {
        $(#[$doc])*
        pub mod $module {
            pub const KEY: &str = $key;
            $( $(#[$vdoc])* pub const $CONST: &str = $value; )+
            pub const ALL: &[&str] = &[$($CONST),+];
            $($extra)*
        }

        $(#[$doc])*
        #[doc = ""]
        #[doc = concat!("A value of label `", $key, "`; its string is [`", stringify!($module), "`]'s.")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $Enum {
            $( $(#[$vdoc])* $Variant, )+
        }

        impl $Enum {
            #[doc = concat!("Every value, in the order of [`", stringify!($module), "::ALL`].")]
            pub const ALL: &'static [$Enum] = &[$($Enum::$Variant),+];

            /// The label value.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $Enum::$Variant => $module::$CONST, )+
                }
            }
        }
    };
}

label! {
    /// Label `family`.
    family, Family = "family" {
        IPV4, Ipv4 = "ipv4";
        IPV6, Ipv6 = "ipv6";
    }
}

label! {
    /// Label `state` of [`crate::IPS`] and [`crate::NODE_IPS`].
    ips_state, IpsState = "state" {
        ALLOCATED, Allocated = "allocated";
        USED, Used = "used";
        FREE, Free = "free";
        COOLDOWN, Cooldown = "cooldown";
        NEEDED, Needed = "needed";
        EXCESS, Excess = "excess";
    }
}

label! {
    /// Label `category` of [`crate::NODES`].
    node_category, NodeCategory = "category" {
        TOTAL, Total = "total";
        IN_DEFICIT, InDeficit = "in-deficit";
        AT_CAPACITY, AtCapacity = "at-capacity";
        RELEASING, Releasing = "releasing";
        BLOCKED, Blocked = "blocked";
    }
}

label! {
    /// Label `state` of [`crate::POOL_IPS`].
    pool_state, PoolState = "state" {
        /// The pool's usable addresses.
        CAPACITY, Capacity = "capacity";
        /// In blocks claimed by nodes.
        ALLOCATED, Allocated = "allocated";
        /// In no block: left to grant.
        FREE, Free = "free";
        /// Allocated, in blocks with no used and no cooling address (whole free blocks, which
        /// a release gives back at once). `free` + `idle` is what the pool could still grant.
        IDLE, Idle = "idle";
    }
}

label! {
    /// Label `state` of [`crate::POOL_BLOCKS`]: a claimed block by how many of its usable
    /// addresses have a `used` entry of the node holding it.
    block_state, BlockState = "state" {
        /// Every usable address used.
        FULL, Full = "full";
        /// Some used, some not.
        PARTIAL, Partial = "partial";
        /// None used (releasable once none of its addresses cools down either and the
        /// block is past the node's watermarks; [`crate::PoolState::Idle`] counts the
        /// addresses of the empty blocks with none cooling).
        EMPTY, Empty = "empty";
    }
}

/// Label `pool` (an IPPool's name; not enumerable).
pub mod pool {
    pub const KEY: &str = "pool";
}

/// Label `version` of [`crate::BUILD_INFO`] (the binary's Cargo version; not enumerable).
pub mod version {
    pub const KEY: &str = "version";
}

/// Label `commit` of [`crate::BUILD_INFO`] (the abbreviated commit the binary was built
/// from, or `unknown`; not enumerable).
pub mod commit {
    pub const KEY: &str = "commit";
}

/// Label `node` (a node's name; not enumerable).
pub mod node {
    pub const KEY: &str = "node";
}

label! {
    /// Label `source` of the allocation and release op counters: the IP source implementation.
    source, Source = "source" {
        CLUSTER_POOL, ClusterPool = "cluster-pool";
        SIM_CLOUD, SimCloud = "sim-cloud";
        /// `simulate`'s default source: an in-memory address range.
        MEMORY, Memory = "memory";
    }
}

label! {
    /// Label `outcome` of the op counters, the allocation duration and the trigger runs.
    outcome, Outcome = "outcome" {
        SUCCESS, Success = "success";
        FAILURE, Failure = "failure";
    }
}

impl Outcome {
    /// The outcome of a call by its result.
    pub fn of<T, E>(result: &Result<T, E>) -> Self {
        if result.is_ok() {
            Outcome::Success
        } else {
            Outcome::Failure
        }
    }
}

label! {
    /// Label `op` of [`crate::ALLOCATION_DURATION_SECONDS`] and of
    /// [`crate::API_REQUESTS_TOTAL`] with `api="source"`: the source's mutating
    /// calls.
    source_op, SourceOp = "op" {
        ALLOCATE, Allocate = "allocate";
        RELEASE, Release = "release";
    }
}

label! {
    /// Label `op` of [`crate::API_REQUESTS_TOTAL`] with `api="kube"`: API
    /// server writes (cluster-pool block claims are `create`, block releases `delete`, IPAMNode
    /// server-side applies `apply`).
    kube_op, KubeOp = "op" {
        CREATE, Create = "create";
        DELETE, Delete = "delete";
        APPLY, Apply = "apply";
    }

    /// A cluster-pool source's release marks written to its blocks ([`crate::ApiOp::KubeMark`]).
    /// Not in [`ALL`]: the table does not list it, so its series are not registered at zero
    /// and appear with the first mark.
    pub const MARK: &str = "mark";
}

label! {
    /// Label `outcome` of [`crate::API_REQUESTS_TOTAL`]: finer than
    /// [`crate::outcome`] so conflicts (409) and throttling (429) can be alerted on.
    api_outcome, ApiOutcome = "outcome" {
        SUCCESS, Success = "success";
        CONFLICT, Conflict = "conflict";
        THROTTLED, Throttled = "throttled";
        FAILURE, Failure = "failure";
    }
}

impl From<Outcome> for ApiOutcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Success => ApiOutcome::Success,
            Outcome::Failure => ApiOutcome::Failure,
        }
    }
}

label! {
    /// Label `api`: the budget a call draws on.
    api, Api = "api" {
        SOURCE, Source = "source";
        KUBE, Kube = "kube";
    }

    /// Label `op` of [`crate::API_REQUESTS_TOTAL`]: its values depend on `api` ([`ops`]).
    pub const OP_KEY: &str = "op";

    /// The `op` values of one API.
    pub fn ops(api: &str) -> &'static [&'static str] {
        match api {
            SOURCE => super::source_op::ALL,
            KUBE => super::kube_op::ALL,
            _ => &[],
        }
    }
}

/// Labels `api` and `op` of [`crate::API_REQUESTS_TOTAL`] together: an op of its API, as
/// [`api::ops`] pairs them (and the kube op `mark`, which it does not list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApiOp {
    Source(SourceOp),
    Kube(KubeOp),
    /// `api="kube"`, `op="mark"`: not one of [`api::ops`], so not registered at zero
    /// ([`kube_op::MARK`]).
    KubeMark,
}

impl ApiOp {
    /// The API the op is of.
    pub const fn api(self) -> Api {
        match self {
            ApiOp::Source(_) => Api::Source,
            ApiOp::Kube(_) | ApiOp::KubeMark => Api::Kube,
        }
    }

    /// The `op` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            ApiOp::Source(op) => op.as_str(),
            ApiOp::Kube(op) => op.as_str(),
            ApiOp::KubeMark => kube_op::MARK,
        }
    }
}

label! {
    /// Label `reason` of [`crate::RECLAIMS_TOTAL`].
    reclaim_reason, ReclaimReason = "reason" {
        POD_DELETED, PodDeleted = "pod-deleted";
        POD_TERMINAL, PodTerminal = "pod-terminal";
        SANDBOX_REPLACED, SandboxReplaced = "sandbox-replaced";
        NODE_DELETED, NodeDeleted = "node-deleted";
    }
}

label! {
    /// Label `outcome` of [`crate::RECLAIMS_TOTAL`]: `refused` when the node side answered a
    /// tombstone `live` (the pod runs there with the address; nothing freed).
    reclaim_outcome, ReclaimOutcome = "outcome" {
        RECLAIMED, Reclaimed = "reclaimed";
        FAILED, Failed = "failed";
        REFUSED, Refused = "refused";
    }
}

label! {
    /// Label `kind` of [`crate::REPAIR_ISSUES_TOTAL`].
    repair_kind, RepairKind = "kind" {
        DUPLICATE, Duplicate = "duplicate";
        OUT_OF_RANGE, OutOfRange = "out-of-range";
        UNKNOWN_POOL, UnknownPool = "unknown-pool";
        ORPHAN_BLOCK, OrphanBlock = "orphan-block";
        LEAKED, Leaked = "leaked";
    }
}

label! {
    /// Label `trigger` of the trigger metrics: the trigger's name (one per kind, not per node, so
    /// the cardinality stays fixed).
    trigger, Trigger = "trigger" {
        POOL_MAINTAINER, PoolMaintainer = "pool-maintainer";
        RESYNC, Resync = "resync";
    }
}

label! {
    /// Label `verb` of the agent's CNI metrics: the CNI command the plugin forwarded.
    cni_verb, CniVerb = "verb" {
        ADD, Add = "add";
        DEL, Del = "del";
        CHECK, Check = "check";
        GC, Gc = "gc";
        STATUS, Status = "status";
    }
}

label! {
    /// Label `outcome` of [`crate::AGENT_CNI_REQUESTS_TOTAL`]: `ok` and `error` for every verb; a
    /// DEL that succeeded without freeing is `stale` (the key is another pod's) or `unknown` (no
    /// allocation has the key).
    cni_outcome, CniOutcome = "outcome" {
        OK, Ok = "ok";
        ERROR, Error = "error";
        STALE, Stale = "stale";
        UNKNOWN, Unknown = "unknown";
    }

    /// The outcomes one verb can have (only DEL is stale or unknown).
    pub fn of_verb(verb: &str) -> &'static [&'static str] {
        match verb {
            super::cni_verb::DEL => ALL,
            _ => &[OK, ERROR],
        }
    }
}

label! {
    /// Label `state` of [`crate::AGENT_IPS`].
    agent_ips_state, AgentIpsState = "state" {
        /// In the node's pool (its blocks' or its source's addresses).
        POOL, Pool = "pool";
        /// Held by a pod.
        USED, Used = "used";
        /// Freed, not yet reusable.
        COOLDOWN, Cooldown = "cooldown";
        /// Marked for release by the operator.
        MARKED, Marked = "marked";
    }
}

label! {
    /// Label `outcome` of [`crate::AGENT_STATUS_WRITES_TOTAL`]: what the API server answered.
    status_write_outcome, StatusWriteOutcome = "outcome" {
        OK, Ok = "ok";
        /// 409: a conflict (the applies are forced, so only a stale object or a hand edit).
        CONFLICT, Conflict = "conflict";
        /// 404: the object is gone (a released block, a deleted IPAMNode).
        GONE, Gone = "gone";
        /// Anything else: refused, throttled, unreachable.
        ERROR, Error = "error";
    }
}

label! {
    /// Label `op` of [`crate::AGENT_NODE_ROUTE_OPS_TOTAL`].
    route_op, RouteOp = "op" {
        ADD, Add = "add";
        DELETE, Delete = "delete";
    }
}

label! {
    /// Label `outcome` of [`crate::AGENT_NODE_ROUTE_OPS_TOTAL`]: what the kernel answered.
    route_outcome, RouteOutcome = "outcome" {
        OK, Ok = "ok";
        ERROR, Error = "error";
    }
}
