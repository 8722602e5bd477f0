//! Labels and their enumerated values: one module per label (`family::KEY`,
//! `family::IPV4`, `family::ALL`).

/// Label `family`.
pub mod family {
    pub const KEY: &str = "family";
    pub const IPV4: &str = "ipv4";
    pub const IPV6: &str = "ipv6";
    pub const ALL: &[&str] = &[IPV4, IPV6];
}

/// Label `state` of [`crate::IPS`] and [`crate::NODE_IPS`].
pub mod ips_state {
    pub const KEY: &str = "state";
    pub const ALLOCATED: &str = "allocated";
    pub const USED: &str = "used";
    pub const FREE: &str = "free";
    pub const COOLDOWN: &str = "cooldown";
    pub const NEEDED: &str = "needed";
    pub const EXCESS: &str = "excess";
    pub const ALL: &[&str] = &[ALLOCATED, USED, FREE, COOLDOWN, NEEDED, EXCESS];
}

/// Label `category` of [`crate::NODES`].
pub mod node_category {
    pub const KEY: &str = "category";
    pub const TOTAL: &str = "total";
    pub const IN_DEFICIT: &str = "in-deficit";
    pub const AT_CAPACITY: &str = "at-capacity";
    pub const RELEASING: &str = "releasing";
    pub const BLOCKED: &str = "blocked";
    pub const ALL: &[&str] = &[TOTAL, IN_DEFICIT, AT_CAPACITY, RELEASING, BLOCKED];
}

/// Label `state` of [`crate::POOL_IPS`].
pub mod pool_state {
    pub const KEY: &str = "state";
    pub const CAPACITY: &str = "capacity";
    pub const ALLOCATED: &str = "allocated";
    pub const FREE: &str = "free";
    pub const ALL: &[&str] = &[CAPACITY, ALLOCATED, FREE];
}

/// Label `state` of [`crate::POOL_BLOCKS`]: a claimed block by how many of its usable
/// addresses have a `used` entry of the node holding it.
pub mod block_state {
    pub const KEY: &str = "state";
    /// Every usable address used.
    pub const FULL: &str = "full";
    /// Some used, some not.
    pub const PARTIAL: &str = "partial";
    /// None used (releasable once past the node's watermarks).
    pub const EMPTY: &str = "empty";
    pub const ALL: &[&str] = &[FULL, PARTIAL, EMPTY];
}

/// Label `pool` (an IPPool's name; not enumerable).
pub mod pool {
    pub const KEY: &str = "pool";
}

/// Label `node` (a node's name; not enumerable).
pub mod node {
    pub const KEY: &str = "node";
}

/// Label `source` of the allocation and release op counters: the IP source implementation.
pub mod source {
    pub const KEY: &str = "source";
    pub const CLUSTER_POOL: &str = "cluster-pool";
    pub const SIM_CLOUD: &str = "sim-cloud";
    /// `simulate`'s default source: an in-memory address range.
    pub const MEMORY: &str = "memory";
    pub const ALL: &[&str] = &[CLUSTER_POOL, SIM_CLOUD, MEMORY];
}

/// Label `outcome` of the op counters, the allocation duration and the trigger runs.
pub mod outcome {
    pub const KEY: &str = "outcome";
    pub const SUCCESS: &str = "success";
    pub const FAILURE: &str = "failure";
    pub const ALL: &[&str] = &[SUCCESS, FAILURE];
}

/// Label `op` of [`crate::ALLOCATION_DURATION_SECONDS`] and of
/// [`crate::API_REQUESTS_TOTAL`] with `api="source"`: the source's mutating
/// calls.
pub mod source_op {
    pub const KEY: &str = "op";
    pub const ALLOCATE: &str = "allocate";
    pub const RELEASE: &str = "release";
    pub const ALL: &[&str] = &[ALLOCATE, RELEASE];
}

/// Label `op` of [`crate::API_REQUESTS_TOTAL`] with `api="kube"`: API
/// server writes (cluster-pool block claims are `create`, block releases `delete`, IPAMNode
/// server-side applies `apply`).
pub mod kube_op {
    pub const KEY: &str = "op";
    pub const CREATE: &str = "create";
    pub const DELETE: &str = "delete";
    pub const APPLY: &str = "apply";
    pub const ALL: &[&str] = &[CREATE, DELETE, APPLY];
}

/// Label `outcome` of [`crate::API_REQUESTS_TOTAL`]: finer than
/// [`crate::outcome`] so conflicts (409) and throttling (429) can be alerted on.
pub mod api_outcome {
    pub const KEY: &str = "outcome";
    pub const SUCCESS: &str = "success";
    pub const CONFLICT: &str = "conflict";
    pub const THROTTLED: &str = "throttled";
    pub const FAILURE: &str = "failure";
    pub const ALL: &[&str] = &[SUCCESS, CONFLICT, THROTTLED, FAILURE];
}

/// Label `api`: the budget a call draws on.
pub mod api {
    pub const KEY: &str = "api";
    pub const SOURCE: &str = "source";
    pub const KUBE: &str = "kube";
    pub const ALL: &[&str] = &[SOURCE, KUBE];

    /// The `op` values of one API.
    pub fn ops(api: &str) -> &'static [&'static str] {
        match api {
            SOURCE => super::source_op::ALL,
            KUBE => super::kube_op::ALL,
            _ => &[],
        }
    }
}

/// Label `reason` of [`crate::RECLAIMS_TOTAL`].
pub mod reclaim_reason {
    pub const KEY: &str = "reason";
    pub const POD_DELETED: &str = "pod-deleted";
    pub const POD_TERMINAL: &str = "pod-terminal";
    pub const SANDBOX_REPLACED: &str = "sandbox-replaced";
    pub const NODE_DELETED: &str = "node-deleted";
    pub const ALL: &[&str] = &[POD_DELETED, POD_TERMINAL, SANDBOX_REPLACED, NODE_DELETED];
}

/// Label `outcome` of [`crate::RECLAIMS_TOTAL`]: `refused` when the node side answered a
/// tombstone `live` (the pod runs there with the address; nothing freed).
pub mod reclaim_outcome {
    pub const KEY: &str = "outcome";
    pub const RECLAIMED: &str = "reclaimed";
    pub const FAILED: &str = "failed";
    pub const REFUSED: &str = "refused";
    pub const ALL: &[&str] = &[RECLAIMED, FAILED, REFUSED];
}

/// Label `kind` of [`crate::REPAIR_ISSUES_TOTAL`].
pub mod repair_kind {
    pub const KEY: &str = "kind";
    pub const DUPLICATE: &str = "duplicate";
    pub const OUT_OF_RANGE: &str = "out-of-range";
    pub const UNKNOWN_POOL: &str = "unknown-pool";
    pub const ORPHAN_BLOCK: &str = "orphan-block";
    pub const LEAKED: &str = "leaked";
    pub const ALL: &[&str] = &[DUPLICATE, OUT_OF_RANGE, UNKNOWN_POOL, ORPHAN_BLOCK, LEAKED];
}

/// Label `trigger` of the trigger metrics: the trigger's name (one per kind, not per node, so
/// the cardinality stays fixed).
pub mod trigger {
    pub const KEY: &str = "trigger";
    pub const POOL_MAINTAINER: &str = "pool-maintainer";
    pub const RESYNC: &str = "resync";
    pub const ALL: &[&str] = &[POOL_MAINTAINER, RESYNC];
}

/// Label `verb` of the agent's CNI metrics: the CNI command the plugin forwarded.
pub mod cni_verb {
    pub const KEY: &str = "verb";
    pub const ADD: &str = "add";
    pub const DEL: &str = "del";
    pub const CHECK: &str = "check";
    pub const GC: &str = "gc";
    pub const STATUS: &str = "status";
    pub const ALL: &[&str] = &[ADD, DEL, CHECK, GC, STATUS];
}

/// Label `outcome` of [`crate::AGENT_CNI_REQUESTS_TOTAL`]: `ok` and `error` for every verb; a
/// DEL that succeeded without freeing is `stale` (the key is another pod's) or `unknown` (no
/// allocation has the key).
pub mod cni_outcome {
    pub const KEY: &str = "outcome";
    pub const OK: &str = "ok";
    pub const ERROR: &str = "error";
    pub const STALE: &str = "stale";
    pub const UNKNOWN: &str = "unknown";
    pub const ALL: &[&str] = &[OK, ERROR, STALE, UNKNOWN];

    /// The outcomes one verb can have (only DEL is stale or unknown).
    pub fn of_verb(verb: &str) -> &'static [&'static str] {
        match verb {
            super::cni_verb::DEL => ALL,
            _ => &[OK, ERROR],
        }
    }
}

/// Label `state` of [`crate::AGENT_IPS`].
pub mod agent_ips_state {
    pub const KEY: &str = "state";
    /// In the node's pool (its blocks' or its source's addresses).
    pub const POOL: &str = "pool";
    /// Held by a pod.
    pub const USED: &str = "used";
    /// Freed, not yet reusable.
    pub const COOLDOWN: &str = "cooldown";
    /// Marked for release by the operator.
    pub const MARKED: &str = "marked";
    pub const ALL: &[&str] = &[POOL, USED, COOLDOWN, MARKED];
}

/// Label `outcome` of [`crate::AGENT_STATUS_WRITES_TOTAL`]: what the API server answered.
pub mod status_write_outcome {
    pub const KEY: &str = "outcome";
    pub const OK: &str = "ok";
    /// 409: a conflict (the applies are forced, so only a stale object or a hand edit).
    pub const CONFLICT: &str = "conflict";
    /// 404: the object is gone (a released block, a deleted IPAMNode).
    pub const GONE: &str = "gone";
    /// Anything else: refused, throttled, unreachable.
    pub const ERROR: &str = "error";
    pub const ALL: &[&str] = &[OK, CONFLICT, GONE, ERROR];
}

/// Label `op` of [`crate::AGENT_NODE_ROUTE_OPS_TOTAL`].
pub mod route_op {
    pub const KEY: &str = "op";
    pub const ADD: &str = "add";
    pub const DELETE: &str = "delete";
    pub const ALL: &[&str] = &[ADD, DELETE];
}

/// Label `outcome` of [`crate::AGENT_NODE_ROUTE_OPS_TOTAL`]: what the kernel answered.
pub mod route_outcome {
    pub const KEY: &str = "outcome";
    pub const OK: &str = "ok";
    pub const ERROR: &str = "error";
    pub const ALL: &[&str] = &[OK, ERROR];
}
