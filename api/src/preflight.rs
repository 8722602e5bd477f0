//! What a cluster must offer tidepool, checked by both binaries before they start
//! (docs/operations.md, "Install" and "Preflight"): Kubernetes 1.31 or later, CRD field selectors that work, and, for the
//! agent, a token bound to its node. The checks of the answers are pure; with the feature
//! `client`, [`check_cluster`] and [`check_agent_token`] make the requests. Each shortfall is
//! an [`Unmet`] whose text names its cause and its fix.

use std::collections::BTreeMap;
use std::fmt;

/// The oldest Kubernetes (major, minor) tidepool runs on: CRD field selectors
/// (CustomResourceFieldSelectors) are on by default from 1.31, and the agent's blocks watch
/// selects on `spec.node`.
pub const MIN_KUBERNETES: (u64, u64) = (1, 31);

/// The extra a service-account token bound to a pod carries with its node's name
/// (ServiceAccountTokenPodNodeInfo, on by default from 1.30); the agent's admission policy
/// reads it.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The field selector the agent's IPAMBlock watch uses (the CRD's `selectableFields`).
pub const BLOCK_NODE_SELECTOR: &str = "spec.node=";

/// A Kubernetes release, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeVersion {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// `/version`'s `gitVersion` read as semver with any pre-release or build suffix ignored:
/// `v1.31.4-eks-1234567`, `v1.31.4-gke.1200`, `v1.31.0+k3s1` are all 1.31.x. (Its `minor`
/// field is no use: managed clusters report `31+`.)
pub fn parse_git_version(git_version: &str) -> Option<KubeVersion> {
    let core = git_version
        .trim()
        .strip_prefix('v')
        .unwrap_or(git_version.trim());
    let core = core.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| {
        let digits = !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        digits.then(|| p.parse::<u64>().ok()).flatten()
    });
    let v = KubeVersion {
        major: parts.next()??,
        minor: parts.next()??,
        patch: parts.next()??,
    };
    parts.next().is_none().then_some(v)
}

/// What the cluster lacks, with its cause and fix (the `Display` text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmet {
    /// `gitVersion` is not `vMAJOR.MINOR.PATCH[suffix]`.
    UnreadableVersion { git_version: String },
    /// The server is older than [`MIN_KUBERNETES`].
    OldServer { version: KubeVersion },
    /// The server refused `spec.node=` on ipamblocks.
    FieldSelectorsOff { answer: String },
    /// The IPAMBlock CRD is not installed (the probe's LIST answered 404).
    CrdsMissing,
    /// The credentials carry no [`NODE_NAME_EXTRA`].
    TokenWithoutNode { username: String },
    /// The credentials are bound to another node than the agent's.
    TokenOfAnotherNode { token_node: String, node: String },
    /// A check's request failed otherwise (the check proves nothing then).
    Unanswered { what: &'static str, error: String },
}

impl fmt::Display for Unmet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = MIN_KUBERNETES;
        match self {
            Unmet::UnreadableVersion { git_version } => write!(
                f,
                "the API server's version {git_version:?} (/version gitVersion) is not \
                 vMAJOR.MINOR.PATCH: tidepool needs Kubernetes {major}.{minor} or later; check \
                 that --kubeconfig points at a Kubernetes API server"
            ),
            Unmet::OldServer { version } => write!(
                f,
                "the API server is Kubernetes {version}: tidepool needs {major}.{minor} or \
                 later (CRD field selectors, which the agent's IPAMBlock watch uses, are on by \
                 default from {major}.{minor}); upgrade the cluster's control plane"
            ),
            Unmet::FieldSelectorsOff { answer } => write!(
                f,
                "the API server refuses the field selector {BLOCK_NODE_SELECTOR} on ipamblocks \
                 ({answer}): CRD field selectors are off (the CustomResourceFieldSelectors \
                 feature gate is disabled) or the IPAMBlock CRD lacks its selectableFields; \
                 enable the gate (on by default from {major}.{minor}) and apply deploy/crds \
                 again"
            ),
            Unmet::CrdsMissing => write!(
                f,
                "the IPAMBlock CRD (ipamblocks.ipam.tidepool.dev) is not installed: apply \
                 deploy/crds (kubectl apply -k deploy/crds) before starting tidepool"
            ),
            Unmet::TokenWithoutNode { username } => write!(
                f,
                "the agent's credentials ({username}) carry no {NODE_NAME_EXTRA} extra: the \
                 token is not a pod's projected service-account token, or the API server \
                 minted it with the ServiceAccountTokenPodNodeInfo feature gate off; the \
                 tidepool-agent-own-node admission policy would deny every write of the \
                 agent. Run the agent as deploy/agent does (its DaemonSet's projected token) \
                 on Kubernetes {major}.{minor} or later with that gate on"
            ),
            Unmet::TokenOfAnotherNode { token_node, node } => write!(
                f,
                "the agent's token is bound to node {token_node}, not to --node-name {node}: \
                 the tidepool-agent-own-node admission policy would deny every write of the \
                 agent; set --node-name (TIDEPOOL_NODE_NAME) from the pod's spec.nodeName, as \
                 deploy/agent does"
            ),
            Unmet::Unanswered { what, error } => write!(f, "{what}: {error}"),
        }
    }
}

impl std::error::Error for Unmet {}

/// The server's version from its `gitVersion`, when it is new enough.
pub fn check_version(git_version: &str) -> Result<KubeVersion, Unmet> {
    let version = parse_git_version(git_version).ok_or_else(|| Unmet::UnreadableVersion {
        git_version: git_version.to_string(),
    })?;
    if (version.major, version.minor) < MIN_KUBERNETES {
        return Err(Unmet::OldServer { version });
    }
    Ok(version)
}

/// What a refusal (`code`, `message`) of the probe LIST of ipamblocks with
/// [`BLOCK_NODE_SELECTOR`] means.
pub fn field_selector_refusal(code: u16, message: &str) -> Unmet {
    match code {
        400 => Unmet::FieldSelectorsOff {
            answer: format!("400: {message}"),
        },
        404 => Unmet::CrdsMissing,
        _ => Unmet::Unanswered {
            what: PROBE,
            error: format!("{code}: {message}"),
        },
    }
}

const PROBE: &str = "probing the spec.node field selector on ipamblocks";

/// The server's version, when the cluster meets what both binaries need: [`check_version`],
/// and a LIST of ipamblocks (at most one) with [`BLOCK_NODE_SELECTOR`] is served.
#[cfg(feature = "client")]
pub async fn check_cluster(client: &kube::Client) -> Result<KubeVersion, Unmet> {
    let unanswered = |what, e: kube::Error| Unmet::Unanswered {
        what,
        error: e.to_string(),
    };
    let info = client
        .apiserver_version()
        .await
        .map_err(|e| unanswered("reading the API server's /version", e))?;
    let version = check_version(&info.git_version)?;
    let blocks: kube::Api<crate::IPAMBlock> = kube::Api::all(client.clone());
    let probe = kube::api::ListParams::default()
        .fields(BLOCK_NODE_SELECTOR)
        .limit(1);
    match blocks.list_metadata(&probe).await {
        Ok(_) => Ok(version),
        Err(kube::Error::Api(s)) => Err(field_selector_refusal(s.code, &s.message)),
        Err(e) => Err(unanswered(PROBE, e)),
    }
}

/// The agent's credentials carry `node`'s name ([`check_node_extra`]), as a SelfSubjectReview
/// (authentication.k8s.io/v1) reports them.
#[cfg(feature = "client")]
pub async fn check_agent_token(client: &kube::Client, node: &str) -> Result<(), Unmet> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let reviews: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
    let review = reviews
        .create(
            &kube::api::PostParams::default(),
            &SelfSubjectReview::default(),
        )
        .await
        .map_err(|e| Unmet::Unanswered {
            what: "asking the API server who the agent is (SelfSubjectReview)",
            error: e.to_string(),
        })?;
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    check_node_extra(
        user.username.as_deref().unwrap_or_default(),
        &user.extra.unwrap_or_default(),
        node,
    )
}

/// The agent's credentials as a SelfSubjectReview reports them must carry its node's name.
pub fn check_node_extra(
    username: &str,
    extra: &BTreeMap<String, Vec<String>>,
    node: &str,
) -> Result<(), Unmet> {
    match extra.get(NODE_NAME_EXTRA).and_then(|v| v.first()) {
        None => Err(Unmet::TokenWithoutNode {
            username: username.to_string(),
        }),
        Some(n) if n != node => Err(Unmet::TokenOfAnotherNode {
            token_node: n.clone(),
            node: node.to_string(),
        }),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u64, minor: u64, patch: u64) -> KubeVersion {
        KubeVersion {
            major,
            minor,
            patch,
        }
    }

    #[test]
    fn git_versions_are_read_as_semver_with_the_suffix_ignored() {
        for (text, want) in [
            ("v1.31.0", v(1, 31, 0)),
            ("v1.31.4-eks-1234abc", v(1, 31, 4)),
            ("v1.31.4-gke.1200", v(1, 31, 4)),
            ("v1.32.1+k3s1", v(1, 32, 1)),
            ("v1.33.0-tidepool", v(1, 33, 0)),
            ("1.30.2", v(1, 30, 2)),
            ("v1.100.0", v(1, 100, 0)),
        ] {
            assert_eq!(parse_git_version(text), Some(want), "{text}");
        }
        for bad in [
            "",
            "v1.31",
            "v1.31.x",
            "v1..0",
            "v1.31.0.1",
            "31+",
            "vx.y.z",
            "v-1.3.0",
        ] {
            assert_eq!(parse_git_version(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_version_check_names_the_minimum() {
        assert_eq!(check_version("v1.31.4-eks-1234abc"), Ok(v(1, 31, 4)));
        assert_eq!(check_version("v2.0.0"), Ok(v(2, 0, 0)));
        let old = check_version("v1.30.9-gke.100").unwrap_err();
        assert_eq!(
            old,
            Unmet::OldServer {
                version: v(1, 30, 9)
            }
        );
        let text = old.to_string();
        assert!(
            text.contains("Kubernetes 1.30.9") && text.contains("1.31 or later"),
            "{text}"
        );
        assert!(text.contains("upgrade"), "{text}");
        assert!(matches!(
            check_version("31+"),
            Err(Unmet::UnreadableVersion { .. })
        ));
    }

    #[test]
    fn probe_answers() {
        let off = field_selector_refusal(400, "field label not supported: spec.node");
        let text = off.to_string();
        assert!(
            text.contains("field label not supported: spec.node")
                && text.contains("CustomResourceFieldSelectors"),
            "{text}"
        );
        assert_eq!(field_selector_refusal(404, "x"), Unmet::CrdsMissing);
        let other = field_selector_refusal(503, "busy").to_string();
        assert_eq!(
            other,
            "probing the spec.node field selector on ipamblocks: 503: busy"
        );
    }

    #[test]
    fn the_agent_token_must_name_its_node() {
        let mut extra = BTreeMap::new();
        let none = check_node_extra("u", &extra, "n1").unwrap_err();
        assert!(none.to_string().contains(NODE_NAME_EXTRA), "{none}");
        assert!(
            none.to_string().contains("ServiceAccountTokenPodNodeInfo"),
            "{none}"
        );
        extra.insert(NODE_NAME_EXTRA.to_string(), vec!["n2".to_string()]);
        let other = check_node_extra("u", &extra, "n1").unwrap_err();
        assert!(other.to_string().contains("bound to node n2"), "{other}");
        assert_eq!(check_node_extra("u", &extra, "n2"), Ok(()));
    }
}
