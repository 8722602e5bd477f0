use proptest::prelude::*;

use super::*;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sel(pairs: &[(&str, &str)]) -> Selector {
    Selector {
        match_labels: labels(pairs),
        ..Selector::default()
    }
}

fn pool(name: &str, v4: bool, v6: bool) -> PoolTerms {
    PoolTerms {
        name: name.into(),
        valid: true,
        v4,
        v6,
        ..PoolTerms::default()
    }
}

/// default (both families), tenant-a (v4, namespaces team=a), tenant-b (v4, team=b),
/// web-v6 (v6, pods app=web), gpu (v4, nodes gpu=yes), oldest first.
fn pools() -> Vec<PoolTerms> {
    vec![
        pool("default", true, true),
        PoolTerms {
            namespace_selector: sel(&[("team", "a")]),
            ..pool("tenant-a", true, false)
        },
        PoolTerms {
            namespace_selector: sel(&[("team", "b")]),
            ..pool("tenant-b", true, false)
        },
        PoolTerms {
            pod_selector: sel(&[("app", "web")]),
            ..pool("web-v6", false, true)
        },
        PoolTerms {
            node_selector: sel(&[("gpu", "yes")]),
            ..pool("gpu", true, false)
        },
    ]
}

fn pick(family: Family, s: &Subject) -> Result<String, ChoiceError> {
    choose(family, &pools(), s, Some("default"))
}

#[test]
fn selectors_follow_apimachinery() {
    let l = labels(&[("team", "a"), ("tier", "1")]);
    assert!(Selector::default().matches(&l), "empty selects everything");
    assert!(sel(&[("team", "a")]).matches(&l));
    assert!(!sel(&[("team", "a"), ("x", "y")]).matches(&l));
    let expr = |k: &str, op| Selector {
        match_expressions: vec![(k.to_string(), op)],
        ..Selector::default()
    };
    let vs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(expr("team", Operator::In(vs(&["a", "b"]))).matches(&l));
    assert!(!expr("gone", Operator::In(vs(&["a"]))).matches(&l));
    assert!(
        expr("gone", Operator::NotIn(vs(&["a"]))).matches(&l),
        "NotIn holds for a missing key"
    );
    assert!(!expr("team", Operator::NotIn(vs(&["a"]))).matches(&l));
    assert!(expr("tier", Operator::Exists).matches(&l));
    assert!(expr("gone", Operator::DoesNotExist).matches(&l));
    assert!(!expr("tier", Operator::DoesNotExist).matches(&l));
}

#[test]
fn the_precedence_per_family() {
    // nothing chooses: the node's default
    let plain = Subject::default();
    assert_eq!(pick(Family::V4, &plain).unwrap(), "default");
    // rule 3: the namespace's selector, for IPv4 only; IPv6 stays on the default
    let team_a = Subject {
        namespace_labels: labels(&[("team", "a")]),
        ..Subject::default()
    };
    assert_eq!(pick(Family::V4, &team_a).unwrap(), "tenant-a");
    assert_eq!(pick(Family::V6, &team_a).unwrap(), "default");
    // a pod selector picks IPv6 while the namespace picks IPv4: two pools, one pod
    let web = Subject {
        pod_labels: labels(&[("app", "web")]),
        ..team_a.clone()
    };
    assert_eq!(pick(Family::V4, &web).unwrap(), "tenant-a");
    assert_eq!(pick(Family::V6, &web).unwrap(), "web-v6");
    // rule 2 over rule 3: the namespace's annotation names the default pool
    let annotated_ns = Subject {
        namespace_pools: Some("default".into()),
        ..web.clone()
    };
    assert_eq!(pick(Family::V4, &annotated_ns).unwrap(), "default");
    assert_eq!(pick(Family::V6, &annotated_ns).unwrap(), "default");
    // rule 1 over rule 2: the pod names its own, IPv4 only; IPv6 follows the namespace's
    let annotated_pod = Subject {
        pod_pools: Some("tenant-a".into()),
        ..annotated_ns
    };
    assert_eq!(pick(Family::V4, &annotated_pod).unwrap(), "tenant-a");
    assert_eq!(pick(Family::V6, &annotated_pod).unwrap(), "default");
    // a node selector alone is not rule 3: a gpu node's pods take the node's default
    let on_gpu = Subject {
        node_labels: labels(&[("gpu", "yes")]),
        ..Subject::default()
    };
    assert_eq!(pick(Family::V4, &on_gpu).unwrap(), "default");
    let ok = choose(Family::V4, &pools(), &on_gpu, Some("gpu"));
    assert_eq!(ok.unwrap(), "gpu");
}

#[test]
fn rule_three_takes_the_oldest_eligible_pool() {
    let mut ps = pools();
    ps.insert(
        1,
        PoolTerms {
            namespace_selector: sel(&[("team", "a")]),
            ..pool("tenant-a-old", true, false)
        },
    );
    let team_a = Subject {
        namespace_labels: labels(&[("team", "a")]),
        ..Subject::default()
    };
    let chosen = choose(Family::V4, &ps, &team_a, Some("default"));
    assert_eq!(chosen.unwrap(), "tenant-a-old");
    // an invalid one is skipped
    ps[1].valid = false;
    let chosen = choose(Family::V4, &ps, &team_a, Some("default"));
    assert_eq!(chosen.unwrap(), "tenant-a");
}

#[test]
fn an_annotation_that_names_a_pool_the_pod_may_not_use_is_an_error() {
    // team b's pod names team a's pool: refused, never the next rule
    let stolen = Subject {
        namespace_labels: labels(&[("team", "b")]),
        pod_pools: Some("tenant-a".into()),
        ..Subject::default()
    };
    let e = pick(Family::V4, &stolen).unwrap_err();
    assert_eq!(
        e,
        ChoiceError::NotEligible {
            by: By::Pod,
            name: "tenant-a".into(),
            why: Why::Namespace
        }
    );
    assert!(e.to_string().contains("namespaceSelector"), "{e}");
    // its IPv6 is unaffected: the annotation names no IPv6 pool
    assert_eq!(pick(Family::V6, &stolen).unwrap(), "default");
    // a typo is an error in every family
    let typo = Subject {
        namespace_pools: Some("tennant-a".into()),
        ..Subject::default()
    };
    for f in Family::ALL {
        assert!(
            matches!(
                pick(f, &typo),
                Err(ChoiceError::NoSuchPool {
                    by: By::Namespace,
                    ..
                })
            ),
            "{f:?}"
        );
    }
    // two pools of one family
    let two = Subject {
        namespace_labels: labels(&[("team", "a")]),
        pod_pools: Some("tenant-a, default".into()),
        ..Subject::default()
    };
    assert!(matches!(
        pick(Family::V4, &two),
        Err(ChoiceError::TwoForFamily { .. })
    ));
    // a node the pool does not select, unless the IPAMNode names it
    let off_node = Subject {
        pod_pools: Some("gpu".into()),
        ..Subject::default()
    };
    let e = pick(Family::V4, &off_node).unwrap_err();
    assert!(
        matches!(e, ChoiceError::NotEligible { why: Why::Node, .. }),
        "{e}"
    );
    let named_by_node = Subject {
        node_pools: vec!["gpu".into()],
        ..off_node
    };
    assert_eq!(pick(Family::V4, &named_by_node).unwrap(), "gpu");
}

#[test]
fn a_default_pool_the_namespace_may_not_use_is_no_pool() {
    let mut ps = pools();
    ps[0].namespace_selector = sel(&[("tier", "shared")]);
    let e = choose(Family::V6, &ps, &Subject::default(), Some("default")).unwrap_err();
    assert_eq!(
        e,
        ChoiceError::NoEligiblePool {
            family: Family::V6,
            default: Some("default".into()),
            why: Why::Namespace
        }
    );
    let e = choose(Family::V6, &ps, &Subject::default(), None).unwrap_err();
    assert!(
        matches!(
            e,
            ChoiceError::NoEligiblePool {
                why: Why::Missing,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn the_node_default_is_spec_pools_then_the_oldest_matching_node_selector_then_default() {
    let (gpu, rack) = (labels(&[("gpu", "yes")]), labels(&[("rack", "r1")]));
    let none = Labels::new();
    let candidates = [("any", &none), ("gpu", &gpu), ("rack", &rack)];
    let node = labels(&[("gpu", "yes"), ("rack", "r1")]);
    assert_eq!(default_pool(Some("mine"), candidates, &node), "mine");
    assert_eq!(
        default_pool(None, candidates, &node),
        "gpu",
        "the oldest whose non-empty selector matches; an empty selector chooses nothing"
    );
    assert_eq!(
        default_pool(None, candidates[2..].iter().copied(), &node),
        "rack"
    );
    assert_eq!(default_pool(None, candidates, &none), "default");
}

fn arb_labels() -> impl Strategy<Value = Labels> {
    proptest::collection::btree_map("[ab]", "[xy]", 0..3)
}

fn arb_selector() -> impl Strategy<Value = Selector> {
    arb_labels().prop_map(|match_labels| Selector {
        match_labels,
        ..Selector::default()
    })
}

fn arb_pools() -> impl Strategy<Value = Vec<PoolTerms>> {
    let one = (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        arb_selector(),
        arb_selector(),
        arb_selector(),
    );
    proptest::collection::vec(one, 1..6).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (valid, v4, v6, node, ns, pod))| PoolTerms {
                name: format!("p{i}"),
                valid,
                v4,
                v6,
                node_selector: node,
                namespace_selector: ns,
                pod_selector: pod,
            })
            .collect()
    })
}

fn arb_subject() -> impl Strategy<Value = Subject> {
    let name = proptest::option::of("p[0-6]");
    (arb_labels(), name.clone(), arb_labels(), name, arb_labels()).prop_map(
        |(pod_labels, pod_pools, namespace_labels, namespace_pools, node_labels)| Subject {
            pod_labels,
            pod_pools,
            namespace_labels,
            namespace_pools,
            node_labels,
            node_pools: Vec::new(),
        },
    )
}

proptest! {
    /// Whatever the inputs, a chosen pool is eligible: valid, of the family, on the node,
    /// and — the access control — selected by its namespace selector.
    #[test]
    fn a_chosen_pool_is_always_eligible(
        pools in arb_pools(),
        s in arb_subject(),
        default in proptest::option::of("p[0-6]"),
        v6 in any::<bool>(),
    ) {
        let family = if v6 { Family::V6 } else { Family::V4 };
        if let Ok(name) = choose(family, &pools, &s, default.as_deref()) {
            let p = pools.iter().find(|p| p.name == name).expect("a pool of the list");
            prop_assert_eq!(eligible(p, family, &s), Ok(()));
            prop_assert!(p.namespace_selector.matches(&s.namespace_labels));
        }
    }

    /// A pod annotation naming a pool of the family that is not eligible is an error,
    /// whatever else would choose.
    #[test]
    fn a_bad_pod_annotation_never_falls_through(
        pools in arb_pools(),
        s in arb_subject(),
        v6 in any::<bool>(),
    ) {
        let family = if v6 { Family::V6 } else { Family::V4 };
        let bad = pools
            .iter()
            .find(|p| p.serves(family) && eligible(p, family, &s).is_err());
        if let Some(bad) = bad {
            let s = Subject { pod_pools: Some(bad.name.clone()), ..s };
            let chosen = choose(family, &pools, &s, Some("p0"));
            prop_assert!(
                matches!(chosen, Err(ChoiceError::NotEligible { by: By::Pod, .. })),
                "{:?}",
                chosen
            );
        }
    }
}
